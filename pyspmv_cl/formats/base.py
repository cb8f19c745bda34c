"""The format contract: what every storage format declares, and the one construction
path and launch path they all share.

A format is a subclass of :class:`SpMVFormat` in its own module, decorated with
``@register``, plus its template.  It declares:

- ``name``, ``order`` (its place in ``pyspmv_cl.formats()``), ``template``;
- ``params``: its :class:`~.params.Param` s (validated before anything is converted or
  rendered), ``default_params`` (from the matrix features and device profile),
  ``check_params`` (rules between parameters), ``tuning_candidates`` and
  ``estimate_cost`` (what the tuner reads), ``may_refuse`` (whether it can raise
  ``FormatNotSuitableError`` for a matrix);
- per operator: ``analyse(csr)`` (facts the kernel source depends on), ``programs()``
  (templates, their kernels as :class:`~pyspmv_cl.codegen.KernelSpec` s, their
  specialisation values), ``convert(csr)`` (host arrays, named as the kernels'
  arguments), ``scratch_sizes()`` (device work buffers) and ``launches(beta)`` (the
  kernel launches of one product, each bound by argument name).

Construction runs: resolve and validate the parameters (``resolve_params``), choose the
index type, ``analyse``, check the work-group size against the device, build every
program (shrinking the group size where a compiled kernel allows fewer work-items),
``convert``, check the sizes against the device's limits, upload, allocate the
scratch.  Conversion happens after the build, so a layout that depends on the group
size sees the final one.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Sequence

import numpy as np
import pyopencl as cl

from ..background_upload import BackgroundUpload
from ..codegen import ALPHA, BETA, MATRIX, SCRATCH, KernelSpec, X, Y
from ..device import enqueues_from_threads
from ..device_inputs import DeviceCSR
from ..errors import (
    DeviceCapabilityError,
    DeviceMemoryError,
    IndexOverflowError,
    InvalidParameterError,
    UnsupportedDtypeError,
)
from ..features import MatrixFeatures
from ..launching import enqueue_launch, in_order
from . import params as P
from .builder import ProgramSpec, build_program, pow2_floor
from .registry import registered
from .storage import to_storage, to_storage_device, value_dtype

# Room left below 2**31 so that 32-bit loop counters (j += vector size, ...) never wrap.
INT32_LIMIT = 2**31 - 1 - 65536


def fits_int32(*sizes: int) -> bool:
    """Whether every size fits 32-bit indices (with the margin above)."""
    return max(sizes, default=0) <= INT32_LIMIT


def choose_index_dtype(n_rows: int, n_cols: int, nnz: int, index_bits=None) -> np.dtype:
    """int32 when every size fits (with margin), else int64; ``index_bits`` forces one."""
    fits32 = fits_int32(n_rows, n_cols, nnz)
    if index_bits in (None, "auto"):
        return np.dtype(np.int32 if fits32 else np.int64)
    if index_bits == 64:
        return np.dtype(np.int64)
    if index_bits == 32:
        if not fits32:
            raise IndexOverflowError(
                f"32-bit indices cannot address this matrix ({n_rows}x{n_cols}, nnz={nnz}; "
                f"limit {INT32_LIMIT}): use index_bits=64 or leave it to the default")
        return np.dtype(np.int32)
    raise InvalidParameterError(f"index_bits must be 32, 64 or None, not {index_bits!r}")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    raise AssertionError("unreachable")


def check_allocations(profile, sizes: dict, extra_bytes: int = 0) -> None:
    """Refuse, naming the array and its size, any buffer over the device's maximum
    allocation, or a total (plus ``extra_bytes`` for vectors) over its global memory."""
    for name, size in sizes.items():
        if size > profile.max_alloc_size:
            raise DeviceMemoryError(
                f"array {name!r} needs {format_bytes(size)}, more than the device's maximum "
                f"single allocation of {format_bytes(profile.max_alloc_size)} on {profile.name}")
    total = sum(sizes.values()) + extra_bytes
    if total > profile.global_mem_size:
        raise DeviceMemoryError(
            f"the matrix needs {format_bytes(total)} of device memory, more than the "
            f"{format_bytes(profile.global_mem_size)} of {profile.name}")


def upload_all(queue, arrays: dict, writable=()) -> dict:
    """Read-only device buffers holding ``arrays`` (name -> numpy array), on the device
    when this returns; those named in ``writable`` read-write (value arrays, which
    update_values' kernels write: a kernel writing a read-only buffer is undefined, and
    Oclgrind reports it).  Buffers are created empty and filled by ``enqueue_copy``:
    with ``COPY_HOST_PTR`` NVIDIA's driver stages the data and copies it again at first
    use (2-3x the transfer time).  An empty array gets one element of padding: OpenCL
    has no zero-size buffers."""
    buffers, events = {}, []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        flags = cl.mem_flags.READ_WRITE if name in writable else cl.mem_flags.READ_ONLY
        buf = cl.Buffer(queue.context, flags, max(1, array.nbytes))
        if array.size:   # the event keeps the host array alive until the copy is done
            events.append(cl.enqueue_copy(queue, buf, array, is_blocking=False))
        buffers[name] = buf
    if events:
        cl.wait_for_events(events)
    return buffers


def upload(queue, array: np.ndarray) -> cl.Buffer:
    """One read-only device buffer holding ``array`` (see :func:`upload_all`)."""
    return upload_all(queue, {"array": array})["array"]


def _buffer_of(arr, context) -> cl.Buffer:
    """The buffer of a device array (a one-byte one for an empty array)."""
    if arr.size == 0 or arr.base_data is None:
        return cl.Buffer(context, cl.mem_flags.READ_ONLY, 1)   # as upload_all's
    return arr.base_data


def launch_rows(n_rows: int, rows_per_group: int, work_group_size: int) -> tuple[int, int]:
    """(global, local) size of one launch covering ``n_rows`` rows: one work-group per
    block of ``rows_per_group`` consecutive rows, so each group handles a contiguous
    block (streaming on CPUs, coalesced on GPUs)."""
    groups = max(1, -(-int(n_rows) // rows_per_group))
    return groups * work_group_size, work_group_size


#: The block widths of the formats with multi-vector kernels (vectors per launch).
BLOCK_WIDTHS = (1, 2, 4, 8, 16)


def max_block_width(dtype) -> int:
    """The widest block a kernel can hold in one OpenCL vector (16 lanes at most): 16
    real values, or 8 complex ones (a real and an imaginary lane each, as many
    registers as 16 real sums; see common.mako's block_preamble)."""
    return 8 if np.dtype(dtype).kind == "c" else 16


def plan_blocks(k: int, widths) -> list[tuple[int, int]]:
    """``(first column, width)`` of each block covering ``k`` vectors: the widest of
    ``widths`` (1 among them) that fits, again and again (33 -> 16, 16, 1)."""
    widths = sorted(widths, reverse=True)
    plan, col = [], 0
    while col < k:
        kb = next(w for w in widths if w <= k - col)
        plan.append((col, kb))
        col += kb
    return plan


def round_up(n: int, multiple: int) -> int:
    return -(-int(n) // multiple) * multiple


def row_per_item_work_group_size(profile) -> int:
    """Default group size of the kernels with one work-item per row: a few warps per
    group on GPUs; larger groups on CPUs, where PoCL runs a group as a loop on one
    thread and a bigger one amortises the per-group overhead."""
    return min(128 if profile.is_gpu else 256, profile.max_work_group_size)


class Step(typing.NamedTuple):
    """One launch of a product before its arguments are bound: the kernel's name, its
    sizes, and the values given by argument name (scalars, and any buffer that stands
    in for the default of its role); ``prefix`` is put before the names of matrix
    arrays and scratch buffers (a part of a composite format)."""
    kernel: str
    global_size: int
    local_size: int
    values: dict
    prefix: str = ""


class Launch(typing.NamedTuple):
    """One bound 1-D launch: the kernel object, its arguments, and its sizes."""
    kernel: cl.Kernel
    args: tuple
    global_size: int
    local_size: int
    operands: tuple = ()   # (position, X or Y) of the arguments bound to x and y


class SpMVFormat:
    """Base of the storage formats (see the module docstring for the contract)."""

    name: typing.ClassVar[str] = None
    order: typing.ClassVar[int] = 1000
    template: typing.ClassVar[str] = None
    params: typing.ClassVar[tuple] = ()
    may_refuse: typing.ClassVar[bool] = False
    #: Whether the format's kernels take complex values (complex64/complex128: real_t
    #: is float2/double2 and the templates multiply through ``MUL``, test with
    #: ``NONZERO``; see ``common.mako``).  A format without it refuses a complex dtype
    #: (``UnsupportedDtypeError``) and ``format="auto"`` never considers it for one.
    complex_values: typing.ClassVar[bool] = False
    _plan_key = None   # see enqueue
    #: The spread (std/mean) and mean of the matrix's row lengths where ``instantiate``
    #: was given its features (None: unknown), for rules that depend on them
    #: (``lane_columns``).
    row_spread = mean_row_length = None

    # -- declared parameters (class level: no matrix conversion needed) -------------
    @classmethod
    def parameter_names(cls) -> tuple:
        """Every parameter the format takes, ``index_bits`` included."""
        return tuple(p.name for p in cls.params) + (P.INDEX_BITS.name,)

    @classmethod
    def default_params(cls, features: MatrixFeatures, profile, dtype) -> dict:
        raise NotImplementedError

    @classmethod
    def resolve_params(cls, features: MatrixFeatures, profile, dtype, given: dict) -> dict:
        """Defaults for this matrix and device, overridden by the caller's values, each
        validated by its declaration, then ``check_params``."""
        params = P.resolve(cls.name, cls.params, cls.default_params(features, profile, dtype),
                           given)
        cls.check_params(params, profile)
        return params

    @classmethod
    def check_params(cls, params: dict, profile) -> None:
        """Rules between parameters (each one alone is already valid); may normalise."""

    @classmethod
    def tuning_candidates(cls, features: MatrixFeatures, profile, dtype,
                          csr=None) -> list[dict]:
        """Parameter sets worth measuring for this matrix and device (the tuner times
        them; ``{}`` means the defaults).  Formats with a model or pruning rule (ELLR-T,
        CSR5's sigma, BCCOO's block shapes) return a few alternatives here; an empty
        list says the format is not worth trying on this matrix.  ``csr`` (the matrix,
        when the caller has it) serves rules that need more than the features."""
        return [{}]

    @classmethod
    def estimate_cost(cls, features: MatrixFeatures, profile, dtype):
        """``(relative predicted time, None)``, or ``(None, why it is not worth timing)``:
        the tuner ranks candidates by it.  Default: the CSR bytes at 85% efficiency."""
        return csr_bytes(features, dtype) / 0.85, None

    # -- construction ----------------------------------------------------------------
    def __init__(self, csr, device, dtype, params: dict):
        check_complex_capable(type(self), dtype)
        self.device = device
        self.profile = device.profile
        self.dtype = np.dtype(dtype)
        self.shape = (int(csr.shape[0]), int(csr.shape[1]))
        self.params = dict(params)
        #: The dtype the value arrays are stored in: ``dtype`` unless the format takes
        #: ``value_bits`` and it asks for fewer bits (formats/storage.py).
        self.value_dtype = value_dtype(self.name, self.dtype, self.params.get("value_bits"))
        #: What the caller asked for (None: the default), before the choice below.
        self.index_bits_asked = self.params.pop("index_bits", None)
        self.index_dtype = choose_index_dtype(self.shape[0], self.shape[1], csr.nnz,
                                              self.index_bits_asked)
        self.params["index_bits"] = self.index_dtype.itemsize * 8
        #: Whether the matrix came on the device (convert_device makes the arrays).
        self.converting_on_device = isinstance(csr, DeviceCSR)
        # Filled after convert (bound by name); empty before, when analyse may launch
        # kernels whose arguments are all given by name.
        self.buffers, self.scratch = {}, {}
        start_analyse = time.perf_counter()
        self.analyse(csr)
        analysed = time.perf_counter()
        #: Seconds ``analyse`` took (for a conversion on the device: its kernels too).
        self.analyse_seconds = analysed - start_analyse
        self.kernels = {}
        self._specs = {}
        start = time.perf_counter()
        self._build()
        built = time.perf_counter()
        if self.converting_on_device:
            csr.start()   # an upload's copies, once the kernels exist (background_upload)
        #: Seconds spent getting the compiled kernels (near zero from the kernel cache).
        self.build_seconds = built - start
        on_device = self.converting_on_device
        host_arrays = self.convert_device(csr) if on_device else self.convert(csr)
        host_arrays.update(self.block_arrays(csr, on_device))
        scratch = {k: int(v) for k, v in self.scratch_sizes().items()}
        sizes = {name: arr.nbytes for name, arr in host_arrays.items()}
        sizes.update({name: max(1, n) for name, n in scratch.items()})
        vector_bytes = (self.shape[0] + self.shape[1]) * self.dtype.itemsize
        check_allocations(self.profile, sizes, vector_bytes)
        self.nbytes = int(sum(a.nbytes for a in host_arrays.values()) + sum(scratch.values()))
        #: The arrays holding values (what update_values rewrites): name -> element count.
        self.value_array_sizes = {name: arr.size for name, arr in host_arrays.items()
                                  if arr.dtype == self.value_dtype}
        if on_device:   # device arrays: keep them, their buffers are the matrix
            self._device_arrays = host_arrays
            self.buffers = {name: _buffer_of(arr, device.context)
                            for name, arr in host_arrays.items()}
        else:
            self.buffers = upload_all(device.queue, host_arrays,
                                      writable=self.value_array_sizes)
        self.scratch = {name: cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(1, n))
                        for name, n in scratch.items()}
        #: Seconds spent analysing, converting, checking, uploading and allocating (the
        #: build aside).
        self.conversion_seconds = time.perf_counter() - built + (analysed - start_analyse)

    def analyse(self, csr) -> None:
        """Facts about the matrix that the kernel source or the parameters depend on
        (resolving data-dependent parameters such as ``"auto"``), before the build."""

    def programs(self) -> Sequence[ProgramSpec]:
        """The programs to build: by default the class's ``template`` with
        ``kernel_specs()`` and ``template_params()``."""
        return [ProgramSpec(self.template, tuple(self.kernel_specs()), self.template_params(),
                            min_group=self.min_work_group_size())]

    def kernel_specs(self) -> Sequence[KernelSpec]:
        raise NotImplementedError

    def template_params(self) -> dict:
        return {}

    def streamed_loads_ok(self) -> bool:
        """Whether kernels may read this matrix's arrays through common.mako's
        ``streamed_loads`` (PTX's evict-first L1 policy): an NVIDIA GPU of compute
        capability 7.0 or later whose driver builds those loads
        (``Device.evict_first_loads``), real values stored at full width.  A format opts
        in with a template parameter."""
        if self.dtype.kind != "f" or self.value_dtype != self.dtype:
            return False
        return self.device.evict_first_loads

    def min_work_group_size(self) -> int:
        return 1

    def local_bytes(self, work_group_size: int) -> int:
        """Local memory a work-group of this size uses (0 unless a kernel needs some)."""
        return 0

    def type_names(self) -> dict:
        """The format's own scalar type names used in its kernel arguments (e.g.
        ``{"pos_t": np.int64}``), besides ``real_t`` and ``index_t``."""
        return {}

    def convert(self, csr) -> dict:
        """Host arrays of this format, name -> numpy array (names as the kernels'
        matrix arguments; value arrays in ``self.value_dtype``, which is ``self.dtype``
        unless ``value_bits`` reduces it, no other array in it).
        ``analyse`` and ``convert`` work on the host only: update_values runs them
        again on a shallow copy of the format, with other values.  Host conversion today; a
        device-side conversion would be a second implementation of this step."""
        raise NotImplementedError

    #: Whether ``convert_device`` exists (a matrix given on the device is converted
    #: there; other formats get it read back once and convert on the host).
    converts_on_device: typing.ClassVar[bool] = False
    #: Whether a host matrix is better uploaded as CSR and converted on a GPU (the
    #: host conversion costing more than the upload and a kernel).
    host_input_on_device: typing.ClassVar[bool] = False
    #: Whether the host conversion only casts the CSR arrays (the CSR kernels): as
    #: cheap as an upload, never worth deferring.
    host_conversion_is_cast: typing.ClassVar[bool] = False
    #: How ``values_in_csr_order`` reads the values back: "map" (it cannot: the slot
    #: map of update_values, a host pass), "gather" (positions computed from the row
    #: pointers, then a gather) or "reshape" (a reshape of the arrays read, cheapest).
    value_read: typing.ClassVar[str] = "map"
    #: Whether the kernels skip fill (+0.0) by its bits, so that a stored zero is held
    #: as -0.0 (the real part's sign for complex values) and still multiplies x's
    #: Inf/NaN (dia without its bitmap, bccoo): update_values marks new zeros alike.
    signed_stored_zeros: typing.ClassVar[bool] = False

    @classmethod
    def device_conversion_takes(cls, csr, params: dict, dtype) -> bool:
        """Whether a host matrix ``csr`` with these (resolved) parameters is worth
        uploading as CSR for ``convert_device`` (``host_input_on_device``): a format
        whose device conversion covers some cases only says no to the others, which
        would be read back."""
        return True

    def convert_device(self, csr: DeviceCSR) -> dict:
        """Like ``convert``, for a matrix on the device: pyopencl arrays made on the
        device (the seam for device-side conversions)."""
        raise NotImplementedError

    def block_arrays(self, csr, on_device: bool) -> dict:
        """Arrays only the block kernels read, made beside ``convert``'s (device arrays
        when ``on_device``, else host arrays); none by default."""
        return {}

    def scratch_sizes(self) -> dict:
        """Device work buffers the kernels read and write, name -> bytes."""
        return {}

    def launches(self, beta) -> list[Step]:
        """The launches of one product ``y = alpha*A@x + beta*y`` in order (``beta`` is
        given because some launches are needed only when ``beta != 1``)."""
        raise NotImplementedError

    # -- multi-vector products (optional) -------------------------------------------------
    #: The block widths ``kb`` (vectors per launch, a compile-time constant of the
    #: kernel) this format's block kernels take; 1 must be among them.  Empty: no block
    #: kernels, and the operator multiplies a block of vectors column by column.
    block_widths: typing.ClassVar[tuple] = ()
    #: The template of the block kernels, rendered with ``block_width`` = kb besides
    #: ``block_template_params(kb)`` (each width built on first use).
    block_template: typing.ClassVar[str] = None

    def supported_block_widths(self) -> tuple:
        """The block widths this operator can use: ``block_widths`` less those wider
        than ``max_block_width`` (16; 8 for complex values) and those whose local
        memory (``block_local_bytes``) the device lacks, or () when the
        parameters rule block kernels out (override to say so).  It reads only
        ``params``, ``dtype`` and ``profile``: ``block_widths_for`` asks it before
        anything is built."""
        wg = self.params.get("work_group_size", 1)
        return tuple(kb for kb in self.block_widths
                     if kb <= max_block_width(self.dtype)
                     and self.block_local_bytes(kb, wg) <= self.profile.local_mem_size)

    @property
    def has_block_kernels(self) -> bool:
        return 1 in self.supported_block_widths()

    def block_kernel_specs(self, kb: int) -> Sequence[KernelSpec]:
        """The block kernels of width ``kb``: their arguments end with
        ``codegen.BLOCK_ARGS`` (x, y, alpha, beta, ldx, x_col, ldy, y_col)."""
        raise NotImplementedError

    def block_template_for(self, kb: int) -> str:
        """The template of the width-``kb`` block kernels (``block_template`` unless a
        parameter picks another)."""
        return self.block_template

    def block_template_params(self, kb: int) -> dict:
        return {**self.template_params(), "block_width": int(kb)}

    def block_local_bytes(self, kb: int, work_group_size: int) -> int:
        """Local memory a work-group of the width-``kb`` kernel uses (in
        ``self.dtype.itemsize`` units per value: a complex value's two parts)."""
        return 0

    def block_min_work_group_size(self, kb: int) -> int:
        return self.min_work_group_size()

    def block_launches(self, kb: int, work_group_size: int, beta) -> list[Step]:
        """The launches of one block product of width ``kb`` (the kernels built with
        groups of ``work_group_size``), as ``launches``; ldx, x_col, ldy and y_col are
        added by the driver."""
        raise NotImplementedError

    @classmethod
    def block_widths_for(cls, features: MatrixFeatures, profile, dtype, given: dict) -> tuple:
        """The block widths an operator of this format built with the parameters
        ``given`` (resolved as for building) would use, known before anything is built
        (the tuner's ranking, the rules and online tuning ask it): its
        ``supported_block_widths`` on a bare instance holding only the resolved
        parameters, the value type and the device profile.  () without block kernels,
        and for parameters the build would refuse."""
        if not cls.block_widths:
            return ()
        probe = cls.bare_instance(features, profile, dtype, given)
        return () if probe is None else tuple(probe.supported_block_widths())

    @classmethod
    def bare_instance(cls, features: MatrixFeatures, profile, dtype, given: dict):
        """An instance holding only the parameters ``given`` (resolved as for building),
        the value type and the device profile, for what its methods that read nothing
        else answer before anything is built; None for parameters the build would
        refuse (it will say why)."""
        try:
            params = cls.resolve_params(features, profile, dtype, dict(given or {}))
        except (TypeError, ValueError):
            return None
        probe = object.__new__(cls)
        probe.profile, probe.dtype, probe.params = profile, np.dtype(dtype), params
        return probe

    def block_plan(self, k: int) -> list[tuple[int, int]]:
        """``(first column, width)`` of each block covering ``k`` vectors: the widest
        supported width that fits, again and again (33 -> 16, 16, 1)."""
        return plan_blocks(k, self.supported_block_widths())

    def _block(self, kb: int):
        """(kernels, specs, work-group size) of the width-``kb`` block kernels, built on
        first use; the group size shrinks (to a power of two) where the compiled kernel
        allows fewer work-items, without touching the matrix kernels' parameters."""
        blocks = self.__dict__.setdefault("_blocks", {})
        built = blocks.get(kb)
        if built is not None:
            return built
        wg = int(self.params.get("work_group_size", 1))
        while True:
            program = ProgramSpec(self.block_template_for(kb),
                                  tuple(self.block_kernel_specs(kb)),
                                  self.block_template_params(kb))
            kernels, limit = build_program(self.device, program, dtype=self.dtype,
                                           index_dtype=self.index_dtype, work_group_size=wg)
            if wg <= limit:
                break
            smaller = pow2_floor(limit)
            if smaller < self.block_min_work_group_size(kb):
                raise DeviceCapabilityError(
                    f"{self.name}: the compiled block kernel (kb={kb}) allows work-groups "
                    f"of at most {limit} work-items, fewer than it needs")
            wg = smaller
        built = blocks[kb] = (kernels, {k.name: k for k in program.kernels}, wg)
        return built

    def enqueue_block(self, queue, x_buf, y_buf, k, ldx, ldy, alpha, beta, wait_for=None):
        """Enqueue ``Y = alpha * A @ X + beta * Y`` for ``k`` vectors held as row-major
        blocks: entry (i, j) of X at ``x_buf[i * ldx + j]``, of Y at
        ``y_buf[i * ldy + j]`` (Y not read when beta == 0), in blocks of the widths of
        ``block_plan(k)``: each block reads the matrix once.  Returns the last event (a
        marker when nothing is launched).  Kernel arguments are set only where they
        changed since the kernel's last launch."""
        real = self.dtype.type
        alpha, beta = real(alpha), real(beta)
        ordered = in_order(queue)
        plan = self.block_plan(int(k))
        last_args = self.__dict__.setdefault("_block_args", {})
        # Only this product's widths keep their arguments (and with them the caller's X
        # and Y, which a later product of other widths must not hold on to): the others
        # set theirs all again when next used.
        widths = {f"/{kb}" for _, kb in plan}
        for key in [key for key in last_args if key[key.rindex("/"):] not in widths]:
            del last_args[key]
        event = None
        for col, kb in plan:
            kernels, specs, wg = self._block(kb)
            for step in self.block_launches(kb, wg, beta):
                step = step._replace(values={**step.values, "ldx": ldx, "x_col": col,
                                             "ldy": ldy, "y_col": col})
                launch = self._bind(step, x_buf, y_buf, alpha, beta, specs, kernels)
                kernel, args = launch.kernel, launch.args
                previous = last_args.get(kernel.function_name + f"/{kb}")
                if previous is None:
                    kernel.set_args(*args)
                else:
                    for i, (old, new) in enumerate(zip(previous, args)):
                        if not (old is new or (type(old) is type(new) and old == new)):
                            kernel.set_arg(i, new)
                # Kept referenced while their handles sit in the kernel.
                last_args[kernel.function_name + f"/{kb}"] = args
                if event is not None:
                    wait_for = None if ordered else [event]
                event = enqueue_launch(queue, kernel, (int(launch.global_size),),
                                       (int(launch.local_size),), wait_for=wait_for)
        if event is None:
            return cl.enqueue_marker(queue, wait_for=wait_for)
        return event

    # -- shared helpers for formats ----------------------------------------------------
    @property
    def reduced_values(self) -> bool:
        """Whether ``value_bits`` stores the values in fewer bits than ``dtype``."""
        return self.value_dtype != self.dtype

    def stored_values(self, data) -> np.ndarray:
        """Host values as the value arrays hold them: rounded to ``dtype``, then to
        ``value_dtype`` (overflow refused: formats/storage.py)."""
        return to_storage(self.name, data, self.dtype, self.value_dtype)

    def device_values(self, csr, queue, copy: bool = False):
        """The values of a ``DeviceCSR`` as the value arrays hold them: cast to
        ``dtype`` (itself where it has it, unless ``copy``), then with ``value_bits``
        rounded on the device into a new array (formats/storage.py)."""
        if not self.reduced_values:
            return csr.as_type("data", self.dtype, queue, copy=copy)
        return to_storage_device(self, csr.as_type("data", self.dtype, queue))

    def check_group_size(self, param: str = "work_group_size", local_bytes=None) -> int:
        """Validate ``self.params[param]`` against the device: at most its maximum
        work-group size, and within its local memory (``local_bytes(size)``)."""
        wg = P.Param(param, P.positive_int()).validate(self.name, self.params[param])
        limit = self.profile.max_work_group_size
        if wg > limit:
            raise InvalidParameterError(
                f"{self.name}: {param}={wg} exceeds the device's maximum of {limit} on "
                f"{self.profile.name}")
        needed = (local_bytes or self.local_bytes)(wg)
        if needed > self.profile.local_mem_size:
            raise InvalidParameterError(
                f"{self.name}: {param}={wg} needs {needed} B of local memory, more than the "
                f"device's {self.profile.local_mem_size} B")
        self.params[param] = wg
        return wg

    def step(self, kernel: str, global_size: int, local_size: int, *, prefix: str = "",
             **values) -> Step:
        return Step(kernel, int(global_size), int(local_size), values, prefix)

    # -- building ------------------------------------------------------------------------
    def _rebuild(self) -> None:
        """Build the kernels again after the conversion settled a parameter they are
        rendered with (a 16-bit column format falling back to 32 bits or escaping wide
        blocks); the kernel cache has them after the first time."""
        self.kernels, self._specs = {}, {}
        self._build()

    def _build(self) -> None:
        """Build every program; where a compiled kernel accepts fewer work-items than
        the group size rendered into it (registers, local memory), shrink that size to
        a power of two that fits and render again (``programs()`` is asked anew, as
        specialisation values may depend on the size)."""
        count = len(self.programs())
        if "work_group_size" in self.params:
            self.check_group_size()
        for i in range(count):
            while True:
                program = self.programs()[i]
                wg = self.params[program.group_param]
                kernels, limit = build_program(self.device, program, dtype=self.dtype,
                                               index_dtype=self.index_dtype,
                                               work_group_size=wg)
                if wg <= limit:
                    break
                smaller = pow2_floor(limit)
                if smaller < program.min_group:
                    raise DeviceCapabilityError(
                        f"{self.name}: the compiled kernel allows work-groups of at most "
                        f"{limit} work-items, fewer than the {program.min_group} it needs")
                self.params[program.group_param] = smaller
            self.kernels.update(kernels)
            self._specs.update({k.name: k for k in program.kernels})

    # -- launching ---------------------------------------------------------------------------
    def _bind(self, step: Step, x_buf, y_buf, alpha, beta, specs=None,
              kernels=None) -> Launch:
        """The arguments of ``step`` in declaration order: the values given by name, else
        the default of each role (``specs``/``kernels``: the block kernels' instead of
        the product's)."""
        specs = self._specs if specs is None else specs
        kernels = self.kernels if kernels is None else kernels
        spec = specs[step.kernel]
        operands = {X: x_buf, Y: y_buf, ALPHA: alpha, BETA: beta}
        values = {}
        for arg in spec.args:   # each role's default, unless given by name
            if arg.role == MATRIX:
                values[arg.name] = self.buffers.get(step.prefix + arg.name)
            elif arg.role == SCRATCH:
                values[arg.name] = self.scratch.get(step.prefix + arg.name)
            elif arg.role in operands:
                values[arg.name] = operands[arg.role]
        values = {k: v for k, v in values.items() if v is not None}
        unknown = set(step.values) - {a.name for a in spec.args}
        if unknown:   # before the defaults hide a misspelt name
            raise TypeError(f"{self.name}: kernel {spec.name} has no argument(s) "
                            f"{sorted(unknown)}")
        args = spec.bind({**values, **step.values}, self.scalar_types())
        operands = tuple((i, a.role) for i, a in enumerate(spec.args)
                         if a.role in (X, Y) and a.name not in step.values)
        return Launch(kernels[step.kernel], args, step.global_size, step.local_size,
                      operands)

    def scalar_types(self) -> dict:
        """Type names of this operator's kernel arguments -> numpy dtypes."""
        return {"real_t": self.dtype, "index_t": self.index_dtype, **self.type_names()}

    def run_now(self, queue, steps, *, specs=None, kernels=None, wait_for=None,
                finish: bool = True):
        """Run ``steps`` (conversion kernels, every argument given by name) in order on
        ``queue`` and wait for them: the seam of device-side conversions (``specs``/
        ``kernels``: those of a program of the format's own, built apart; ``wait_for``:
        events the first launch waits for; ``finish=False``: return the last launch's
        event without waiting)."""
        event = None
        for step in steps:
            launch = self._bind(step, None, None, None, None, specs, kernels)
            launch.kernel.set_args(*launch.args)
            event = enqueue_launch(queue, launch.kernel, (launch.global_size,),
                                   (launch.local_size,),
                                   wait_for=wait_for if event is None else [event])
        if finish:
            queue.finish()
        return event

    def run_check(self, queue, kernel: str, global_size: int, local_size: int,
                  **values) -> bool:
        """Run one check kernel on ``queue`` (every argument by name but ``bad``: an int
        it sets to 1 where it finds what it looks for) and return whether it did (one
        int read back, blocking)."""
        # (made from a host zero, not filled: Oclgrind 21.10 leaves a filled buffer's
        # shadow "uninitialised", and the flag's atomic then reads it)
        flag = np.zeros(1, np.int32)
        bad = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=flag)
        self.run_now(queue, [self.step(kernel, global_size, local_size, bad=bad,
                                       **values)], finish=False)
        cl.enqueue_copy(queue, flag, bad, is_blocking=True)
        return bool(flag[0])

    def values_in_csr_order(self, queue, indptr):
        """The values this operator computes with (``value_dtype``), in the CSR order of
        the matrix it was built from (``indptr``: its row pointers, on the host), read
        straight from its arrays where the format keeps them in an order known without
        a slot map; None otherwise.  The transposed
        and block copies read the values this way when they can: the slot map's host
        pass (``formats/values.py``) took most of their 0.6-0.9 s at 20M non-zeros."""
        return None

    def _read_values(self, queue, name, count):
        """The first ``count`` values of the value array ``name`` (blocking)."""
        host = np.empty(count, self.value_dtype)
        if count:
            cl.enqueue_copy(queue, host, self.buffers[name], is_blocking=True)
        return host

    def read_csr(self, queue, wait_for=None, staging=None):
        """``([indptr, indices, data], events)``: the matrix as CSR host arrays read
        from this operator's device arrays (what it computes with, value updates
        included; the caller's later changes to its scipy matrix cannot leak in), the
        arrays filled once ``events`` complete (none: already).  Online tuning's
        snapshot; the formats it starts on have it (the CSR formats, sell).  Arrays
        read as they are may go through ``staging`` (a ``PinnedStaging`` on ``queue``:
        online tuning on GPUs)."""
        raise NotImplementedError(f"{self.name}: no read-back as CSR")

    def bound_launches(self, x_buf, y_buf, alpha, beta) -> list[Launch]:
        """The launches of one product with every argument bound (``alpha`` and ``beta``
        in this operator's real type)."""
        return [self._bind(s, x_buf, y_buf, alpha, beta)
                for s in self.launches_for(alpha, beta)]

    def launches_for(self, alpha, beta) -> list[Step]:
        """The launches of one product with these scalars: ``launches(beta)``, unless a
        format's launches depend on alpha too (coo: rows without entries are written
        when alpha is not finite, alpha * 0 being NaN there)."""
        return self.launches(beta)

    def enqueue(self, queue, x_buf, y_buf, alpha, beta, wait_for=None):
        """Enqueue y = alpha*A@x + beta*y (y not read when beta == 0); returns the event
        of the last launch (a marker when there is nothing to launch).

        Kernel arguments are set only when they change: pyopencl's set_args costs
        20-120 us a kernel on PoCL (its scalars, about 17 us each), more than a small
        matrix's product, while one buffer argument costs well under a microsecond.  So
        a new queue, alpha or beta binds everything again, and new x and y buffers (a
        CPU device multiplies host arrays in place: a new buffer every call) only
        their own arguments.  This object owns its kernel objects, so nothing else
        changes their arguments; it keeps x and y referenced while their handles sit
        in the kernels."""
        if self.__dict__.get("_block_args"):   # a block product's X and Y: let them go
            self._block_args.clear()
        key = (queue.int_ptr, complex(alpha), complex(beta))
        if key != self._plan_key:
            self._plan_key = None
            real = self.dtype.type
            launches = self.bound_launches(x_buf, y_buf, real(alpha), real(beta))
            kernels = [launch.kernel for launch in launches]
            # A kernel launched twice in one product needs its arguments set each time.
            reused = {id(k) for k in kernels if kernels.count(k) > 1}
            plan = []
            for launch in launches:
                args = launch.args if id(launch.kernel) in reused else None
                if args is None:
                    launch.kernel.set_args(*launch.args)
                plan.append([launch.kernel, args, (int(launch.global_size),),
                             (int(launch.local_size),), launch.operands])
            # On an in-order queue each launch waits for the one before it anyway.
            self._plan, self._plan_in_order = plan, in_order(queue)
            self._plan_refs = (x_buf, y_buf)
            self._plan_key = key
        else:
            refs = self._plan_refs
            if not (x_buf is refs[0] and y_buf is refs[1]) and \
                    (x_buf.int_ptr, y_buf.int_ptr) != (refs[0].int_ptr, refs[1].int_ptr):
                self._rebind_operands(x_buf, y_buf)
        if not self._plan:
            return cl.enqueue_marker(queue, wait_for=wait_for)
        event = None
        for kernel, args, global_size, local_size, _ in self._plan:
            if args is not None:
                kernel.set_args(*args)
            if event is not None:
                wait_for = None if self._plan_in_order else [event]
            event = enqueue_launch(queue, kernel, global_size, local_size, wait_for=wait_for)
        return event

    def _rebind_operands(self, x_buf, y_buf) -> None:
        """Point the kept launch plan at new x and y buffers (their arguments only)."""
        self._plan_refs = (x_buf, y_buf)
        for entry in self._plan:
            kernel, args, _, _, operands = entry
            if args is None:
                for position, role in operands:
                    kernel.set_arg(position, x_buf if role == X else y_buf)
            elif operands:
                args = list(args)
                for position, role in operands:
                    args[position] = x_buf if role == X else y_buf
                entry[1] = tuple(args)


def complex_formats(registry) -> list:
    """The names of the formats of ``registry`` (name -> class) that take complex
    values, in its order."""
    return [name for name, cls in registry.items() if cls.complex_values]


def check_complex_capable(cls, dtype) -> None:
    """Refuse a complex ``dtype`` for a format whose kernels are real only."""
    if np.dtype(dtype).kind == "c" and not cls.complex_values:
        raise UnsupportedDtypeError(
            f"format {cls.name!r} does not take complex values ({np.dtype(dtype)}) yet; "
            f"formats that do: {', '.join(complex_formats(registered()))} "
            "(or format='auto', which chooses among them)")


def conversion_is_cheap(cls, csr, device, params=None, dtype=None) -> bool:
    """Whether converting ``csr`` for ``cls`` costs about an upload: a cast of the CSR
    arrays, or a conversion on the device (for these parameters and values, when given:
    ``device_conversion_takes``)."""
    if cls.host_conversion_is_cast:
        return True
    return converts_on_the_device(cls, csr, device) and (
        params is None or isinstance(csr, DeviceCSR)
        or cls.device_conversion_takes(csr, params, dtype))


def converts_on_the_device(cls, csr, device) -> bool:
    """Whether :func:`instantiate` converts ``csr`` for ``cls`` on the device: a device
    matrix for a format that can, a host one where the format prefers it on a GPU."""
    if isinstance(csr, DeviceCSR):
        return cls.converts_on_device
    return cls.converts_on_device and cls.host_input_on_device and device.profile.is_gpu


class SharedUploads:
    """One upload of a host CSR per value and index type, shared by the formats built
    from it with :func:`instantiate` (the tuner's candidates): each copies on the device
    what it keeps, and counts the upload's time in its ``conversion_seconds`` as a build
    of its own would.  On NVIDIA's driver an upload from pageable memory held up the
    products of other threads for its whole length (an H100: 30-40 ms at 20M non-zeros
    per candidate of an online measurement); ``staging`` (a
    ``pinned_staging.PinnedStaging`` on the device's queue) uploads through pinned
    memory instead."""

    def __init__(self, staging=None):
        self.staging = staging
        self._done = {}

    def get(self, csr, queue, index, dtype):
        """``(DeviceCSR, seconds its upload took)``, uploaded on first use."""
        key = (np.dtype(dtype), np.dtype(index))
        if key not in self._done:
            start = time.perf_counter()
            up = DeviceCSR.upload(csr, queue, index, dtype, staging=self.staging)
            self._done[key] = (up, time.perf_counter() - start)
        return self._done[key]

    def clear(self) -> None:
        """Drop the uploads (every format is built)."""
        self._done.clear()


def instantiate(cls, csr, device, dtype, params: dict, uploads=None,
                features=None) -> SpMVFormat:
    """``cls(csr, device, dtype, params)`` with the matrix where its conversion runs: a
    device matrix is read back for a format that converts on the host, and a host matrix
    goes up as CSR for a format that converts faster on a GPU (once for all the calls
    given the same ``uploads``, a :class:`SharedUploads` for this ``csr`` and
    ``device``; without, in the background while the conversion's host work runs).
    ``features`` (the matrix's, where the caller has them) give the instance its
    ``row_spread`` and ``mean_row_length``."""
    start = time.perf_counter()
    moved = 0.0
    if isinstance(csr, DeviceCSR):
        if not cls.converts_on_device:
            csr = csr.to_host(device.queue)
    elif converts_on_the_device(cls, csr, device) and \
            cls.device_conversion_takes(csr, params, dtype):
        index = np.int32 if max(csr.nnz, *csr.shape) < 2**31 - 1 else np.int64
        if uploads is None and enqueues_from_threads(device):
            # the conversion's host work goes on during the upload
            csr = BackgroundUpload(csr, device.queue, index, dtype)
        elif uploads is None:
            csr = DeviceCSR.upload(csr, device.queue, index, dtype, owned=True)
        else:
            csr, moved = uploads.get(csr, device.queue, index, dtype)
            start = time.perf_counter()
    moved += time.perf_counter() - start
    if isinstance(csr, BackgroundUpload):
        try:
            # (its conversion_seconds holds the waits for the arrays)
            impl = cls(csr, device, dtype, params)
        except BaseException:
            csr.abandon()   # no copy left running on the queue
            raise
        csr.wait()   # an array the conversion did not read: uploaded all the same
    else:
        impl = cls(csr, device, dtype, params)
    impl.conversion_seconds += moved   # the read back or the upload is part of it
    if features is not None:
        impl.row_spread, impl.mean_row_length = features.row_spread, features.mean_row_length
    return impl


def csr_bytes(features: MatrixFeatures, dtype) -> float:
    """Bytes of the matrix in CSR with 32-bit indices (the cost estimates' unit)."""
    v, i = np.dtype(dtype).itemsize, 4
    return max(features.nnz, 1) * (v + i) + (features.n_rows + 1) * i


def skewed_rows(features: MatrixFeatures) -> bool:
    """A few rows far longer than the mean (power-law graphs)."""
    return features.max_row_length >= max(4096, 16 * features.mean_row_length)
