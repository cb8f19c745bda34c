"""Building a format's kernels: render its template with the declared kernel
signatures, get the program from the kernel cache, and shrink the work-group size where
the compiled kernel allows fewer work-items than asked for.

Rendered and built programs are memoised per (context, device, profile, template,
specialisation): a second operator with the same specialisation neither re-renders nor
re-hashes its source.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pyopencl as cl

from .. import cache, codegen
from ..codegen import KernelSpec
from ..kernel_objects import kernel_object


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    """One program of a format: its template, the kernels it defines (in the order
    they are declared), its specialisation values, and the parameter holding the
    work-group size rendered into it (``min_group``: the smallest it may shrink to)."""

    template: str
    kernels: tuple
    params: dict = dataclasses.field(default_factory=dict)
    group_param: str = "work_group_size"
    min_group: int = 1

    def spec(self, name: str) -> KernelSpec:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)


_memo: dict = {}
_lock = threading.Lock()
cache.register_memory(_memo)   # cache.clear_memory() means "as a new process" here too


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 1


def build_program(device, program: ProgramSpec, *, dtype, index_dtype,
                  work_group_size: int) -> tuple[dict, int]:
    """``({kernel name: fresh Kernel}, the largest work-group size every kernel of the
    program accepts)``, for ``program`` rendered with ``work_group_size``.  Kernel
    objects are new on each call (an operator owns their argument state)."""
    ctx, dev = device.context, device.cl_device
    key = (ctx.int_ptr, dev.int_ptr, device.profile, program.template, np.dtype(dtype).str,
           np.dtype(index_dtype).str, int(work_group_size), program.kernels,
           _freeze(program.params))
    with _lock:
        hit = _memo.get(key)
    if hit is None:
        source = codegen.render(program.template, dtype=dtype, index_dtype=index_dtype,
                                profile=device.profile, kernels=program.kernels,
                                work_group_size=int(work_group_size), **program.params)
        built = cache.get_program(ctx, dev, source)
        names = set(built.get_info(cl.program_info.KERNEL_NAMES).split(";"))
        missing = [k.name for k in program.kernels if k.name not in names]
        if missing:
            raise KeyError(f"kernel(s) {missing} not in {program.template} "
                           f"(has {sorted(names)})")
        kernels = {k.name: kernel_object(built, k.name) for k in program.kernels}
        limit = min(k.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev)
                    for k in kernels.values())
        with _lock:
            # Keeping the context referenced keeps its int_ptr from being reused.
            _memo.setdefault(key, (built, int(limit), ctx))
        return kernels, int(limit)   # (the kernels probed serve this first caller)
    built, limit = hit[0], hit[1]
    return {k.name: kernel_object(built, k.name) for k in program.kernels}, limit


def clear_memo() -> None:
    """Forget the memoised programs (``cache.clear_memory`` does this too)."""
    with _lock:
        _memo.clear()
