"""Reduced-precision value storage (``value_bits``, issue #18), opt-in per operator.

A format declaring :data:`VALUE_BITS` stores its value arrays in ``value_bits`` bits
and its kernels accumulate in the operator's own type (``real_t``):

- float32 operators: ``value_bits=16`` stores IEEE binary16 ("half", 11 significant
  bits, largest finite 65504), read with ``vload_half`` (core OpenCL, no
  ``cl_khr_fp16``); 32 (the default) is full precision;
- float64 operators: ``value_bits=32`` stores float32 values, accumulated in float64;
  16 stores half values, accumulated in float64; 64 (the default) is full precision;
- complex operators: only their own width (reduced storage is refused).

Rounding is to nearest, ties to even, everywhere: on the host numpy's ``astype``, on
the device ``vstore_half_rte``/``convert_float_rte``.  A value is first rounded to the
operator's type (as a full-precision operator holds it), then to the stored one, on
either path, so a matrix converted on the host and the same matrix converted on the
device hold identical bits.  A finite value that overflows the stored type (|v| > 65504
rounds to inf in half) is refused, never stored as inf; values below the type's normal
range (6.1e-5 in half) lose bits progressively as subnormals, and those under half the
smallest subnormal (2^-25, about 3e-8) become 0.

The tuner never picks it: the default is full precision, no tuning candidate sets it,
and ``format="auto"`` refuses a reduced ``value_bits`` (it changes results).
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from ..codegen import KernelSpec, full_bits, scalar, scratch
from ..errors import FormatNotSuitableError, InvalidInputError, InvalidParameterError
from ..host_arrays import cast
from . import params as P
from .builder import ProgramSpec, build_program

#: The declared parameter (formats taking it list it in ``params`` and default it to
#: :func:`full_bits`).
VALUE_BITS = P.Param("value_bits", P.one_of(16, 32, 64),
                     "bits of a stored value: 16 (IEEE half) or 32 (float32, float64 "
                     "operators) store values at reduced precision, accumulated in the "
                     "operator's type; default the type's own width (opt-in only: "
                     "format='auto' never picks it)")

_LARGEST = {np.dtype(np.float16): 65504.0, np.dtype(np.float32): float(np.finfo(np.float32).max)}


def value_dtype(format_name: str, dtype, value_bits) -> np.dtype:
    """The dtype of the stored values of a ``dtype`` operator with ``value_bits`` (None:
    full precision), or InvalidParameterError for a combination that does not exist."""
    dtype = np.dtype(dtype)
    full = full_bits(dtype)
    if value_bits is None or value_bits == full:
        return dtype
    if dtype.kind == "c":
        raise InvalidParameterError(
            f"{format_name}: value_bits={value_bits} is not available for complex values "
            f"({dtype}): complex operators store their values at full precision "
            f"(value_bits={full})")
    if value_bits > full:
        raise InvalidParameterError(
            f"{format_name}: value_bits={value_bits} is wider than the operator's {dtype} "
            f"values: use value_bits={full} (the default) or build the operator with "
            "dtype=numpy.float64")
    return np.dtype(np.float16 if value_bits == 16 else np.float32)


def refuse_reduced_auto(params: dict, dtype) -> None:
    """``format="auto"`` with a ``value_bits`` below the operator's width: refused.
    Reduced storage changes the results, so it is the caller's explicit choice of a
    format, never the tuner's (which would also time and store it as a plain winner)."""
    bits = params.get("value_bits")
    if bits is not None and bits != full_bits(dtype):
        raise InvalidParameterError(
            f"value_bits={bits!r} with format='auto': reduced-precision values change the "
            "results, so format='auto' never uses them; name the format, e.g. "
            f"SpMV(A, format='sell', value_bits={bits!r}) (formats taking it: sell, "
            "csr-vector, csr-scalar)")


def overflow_message(format_name, stored, count, largest=None) -> str:
    stored = np.dtype(stored)
    bits = stored.itemsize * 8
    biggest = f" (largest |value| {largest:.6g})" if largest is not None else ""
    return (f"{format_name}: value_bits={bits} stores values as {stored}, whose largest "
            f"finite value is {_LARGEST[stored]:.6g}: {count} value(s) of the matrix "
            f"overflow it{biggest}. Scale the matrix, or use a wider value_bits (the "
            "default is full precision)")


def to_storage(format_name, data, dtype, stored, *, update=False) -> np.ndarray:
    """``data`` rounded to the operator's ``dtype`` and then to ``stored`` (numpy's
    astype: to nearest even), refusing finite values that overflow ``stored``
    (FormatNotSuitableError; InvalidInputError for ``update``: new values)."""
    data = np.asarray(data)
    if np.dtype(stored) == np.dtype(dtype) or np.dtype(stored).kind != "f":
        return cast(data, stored) if data.ndim == 1 else data.astype(stored, copy=False)
    full = data.astype(dtype, copy=False)
    with np.errstate(over="ignore"):
        out = full.astype(stored)
    bad = np.isinf(out) & ~np.isinf(full)
    if bad.any():
        error = InvalidInputError if update else FormatNotSuitableError
        raise error(overflow_message(format_name, stored, int(bad.sum()),
                                     float(np.abs(full[bad]).max())))
    return out


STORE = ProgramSpec("store_values.mako", (KernelSpec("store_values", (
    scalar("count", "long"), scratch("src", "real_t", read_only=True),
    scratch("dst", "value_t"), scratch("overflow", "int"))),))
STORE_GROUP = 64


def to_storage_device(fmt, src: cla.Array) -> cla.Array:
    """The device array ``src`` (``fmt.dtype``) rounded to ``fmt.value_dtype`` on the
    device (``store_values.mako``: ``vstore_half_rte``/``convert_float_rte``, the same
    bits as :func:`to_storage`), refusing a finite value that overflows it (one int
    read back).  A new array; ``src`` is left as it is."""
    queue = fmt.device.queue
    count = int(src.size)
    if src.offset:   # a view inside a larger buffer: the kernel reads from element 0
        src = src.copy(queue=queue)
    out = cla.empty(queue, max(1, count), fmt.value_dtype)
    if not count:
        return out
    wg = min(STORE_GROUP, fmt.profile.max_work_group_size)
    program = ProgramSpec(STORE.template, STORE.kernels,
                          {"value_bits": fmt.params.get("value_bits")})
    kernels, limit = build_program(fmt.device, program, dtype=fmt.dtype,
                                   index_dtype=fmt.index_dtype, work_group_size=wg)
    wg = min(wg, 1 << (int(limit).bit_length() - 1))
    overflow = cla.zeros(queue, 1, np.int32)
    kernel = kernels["store_values"]
    kernel.set_args(*STORE.kernels[0].bind(
        {"count": count, "src": src.base_data, "dst": out.base_data,
         "overflow": overflow.base_data}, fmt.scalar_types()))
    groups = -(-count // wg)
    cl.enqueue_nd_range_kernel(queue, kernel, (groups * wg,), (wg,)).wait()
    if overflow.get(queue)[0]:
        raise FormatNotSuitableError(overflow_message(fmt.name, fmt.value_dtype, "some"))
    return out
