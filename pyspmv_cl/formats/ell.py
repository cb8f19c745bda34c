"""``ell``: ELLPACK (Bell & Garland, section 3.2).

Every row is padded to the same width ``K`` (the longest row) and the ``n_rows x K``
arrays are stored column-major: slot ``k`` of row ``i`` lives at ``k * stride + i``, so
consecutive work-items (rows) read consecutive addresses (coalesced).  ``stride`` is the
row count rounded up to the device's SIMD width, which aligns every column.  Padding
slots hold the sentinel column ``-1`` and are never multiplied (a stored ``0 * inf``
must give NaN, a padding slot nothing); entries come first in each row, so the kernel
stops at the first sentinel.  One work-item per row.

ELL refuses (``FormatNotSuitableError``) a matrix whose padded arrays would exceed
``max_padding`` times its non-zeros (default 20) -- unless they are small in absolute
terms (under 1 MiB) -- or the device's memory.

Host API reused by ``hyb`` (stable):

``ell_stride(n_rows, row_align) -> int``
    ``n_rows`` rounded up to a multiple of ``row_align`` (the distance between
    columns of the padded arrays).
``ell_arrays(csr, width, row_align, index_dtype, dtype) -> (col_idx, values)``
    The column-major padded arrays (1-D, ``width * ell_stride(m, row_align)`` long)
    of a CSR matrix holding at most ``width`` entries per row (ValueError otherwise);
    entries in their CSR order (duplicates and explicit zeros kept), padding slots
    ``col_idx == -1``, ``values == 0``.
``ell_layout(csr, profile) -> (width, row_align, stride)`` (``ell_geometry`` without the width)
    The longest row, the SIMD alignment of the columns and the stride.
``ELL_KERNEL``
    The ``ell`` kernel's arguments (``templates/ell.mako``): ``n_rows``, ``stride``,
    ``width`` (scalars), ``col_idx``, ``values`` (matrix arrays), x, y, alpha, beta.

Also used by ``dia`` and ``ellr-t``: ``SMALL_BYTES``, ``check_padding``, ``row_slots``,
``DEFAULT_MAX_PADDING``, ``MAX_PADDING`` (the parameter, ellr-t's too).

``ELL(csr, device, dtype, params)`` can be built directly with ``params`` as
``ELL.resolve_params(...)`` returns them, or with ``max_padding=None`` (never refuse for
padding, for a CSR already cut to ``K`` entries per row); through ``SpMV`` pass
``max_padding=float("inf")``, since ``None`` there means the default.  ``width``,
``stride`` and ``nbytes`` describe the arrays.
"""

import numpy as np

from .. import host_arrays
from ..codegen import BLOCK_ARGS, PRODUCT_ARGS, KernelSpec, matrix, scalar
from ..errors import FormatNotSuitableError, InvalidParameterError
from . import ell_device
from . import params as P
from .base import (
    BLOCK_WIDTHS,
    SpMVFormat,
    format_bytes,
    launch_rows,
    pow2_floor,
    row_per_item_work_group_size,
)
from .lanes import LANE_COLUMNS, LanesBlocks
from .registry import register

DEFAULT_MAX_PADDING = 20.0
# The ELL family is worth timing in the tuner up to this many slots per non-zero.
TUNING_MAX_PADDING = 3.0
# Arrays this small are always accepted, whatever their padding ratio: tiny or odd
# matrices (one dense row, 1 x 3000) still work, and cost next to nothing.
SMALL_BYTES = 1 << 20
ADVICE = "hyb or csr-vector (ellr-t pads rows alike)"

#: The ``ell`` kernel of templates/ell.mako.
ELL_KERNEL = KernelSpec("ell", (scalar("n_rows", "long"), scalar("stride", "long"),
                                scalar("width", "long"), matrix("col_idx", "index_t"),
                                matrix("values", "real_t"), *PRODUCT_ARGS), fixed_group=True)
#: Its block version (templates/ell_block.mako): KB vectors at once.
ELL_BLOCK_KERNEL = KernelSpec("ell_block", ELL_KERNEL.args[:5] + BLOCK_ARGS, fixed_group=True)


def ell_stride(n_rows, row_align):
    """``n_rows`` rounded up to a multiple of ``row_align``."""
    row_align = max(1, int(row_align))
    return -(-int(n_rows) // row_align) * row_align


def row_slots(indptr):
    """(row, position within the row, row lengths) of every stored entry of a CSR with
    row pointers ``indptr``, vectorised."""
    lengths = np.diff(indptr).astype(np.int64)
    rows = host_arrays.entry_rows(indptr)
    position = np.arange(rows.size, dtype=np.int64) - (np.asarray(indptr[:-1], np.int64)[rows]
                                                       - int(indptr[0]))
    return rows, position, lengths


def ell_geometry(n_rows, profile):
    """(row_align, stride) of ELL arrays of ``n_rows`` rows on a device with ``profile``:
    the SIMD width (a power of two) and the row count aligned to it."""
    row_align = pow2_floor(max(1, profile.simd_width))
    return row_align, ell_stride(n_rows, row_align)


def ell_layout(csr, profile):
    """(width, row_align, stride) of ``csr``'s ELL arrays on a device with ``profile``:
    the longest row, and :func:`ell_geometry`."""
    m = csr.shape[0]
    width = int(np.diff(csr.indptr).max(initial=0)) if m else 0
    return (width, *ell_geometry(m, profile))


def ell_slots(rows, position, stride):
    """Where the ELL arrays keep entry ``position`` of row ``rows`` (column-major)."""
    return position * stride + rows


def ell_arrays(csr, width, row_align, index_dtype, dtype):
    """Column-major ELL arrays of ``csr`` (see the module docstring)."""
    m = csr.shape[0]
    width = int(width)
    stride = ell_stride(m, row_align)
    rows, position, lengths = row_slots(csr.indptr)
    if lengths.size and lengths.max() > width:
        raise InvalidParameterError(
            f"a row holds {lengths.max()} entries, more than the ELL width {width}")
    col_idx = np.full(width * stride, -1, dtype=index_dtype)
    values = np.zeros(width * stride, dtype=dtype)
    slot = ell_slots(rows, position, stride)
    col_idx[slot] = csr.indices
    values[slot] = csr.data
    return col_idx, values


def check_padding(name, slots, nnz, sizes, max_padding, advice, profile, what):
    """Refuse (FormatNotSuitableError naming ``name``) padded arrays of ``slots`` slots
    holding ``nnz`` entries, with byte sizes ``sizes``, before allocating them: over
    ``max_padding`` times ``nnz`` (unless under SMALL_BYTES in all), or over the device's
    memory.  Shared by ell, ellr-t and dia."""
    nbytes = sum(sizes)
    if max_padding is not None and nbytes > SMALL_BYTES and slots > max_padding * max(nnz, 1):
        raise FormatNotSuitableError(
            f"{name}: this matrix does not suit {what}: padding every row to the longest "
            f"needs {slots} slots for {nnz} non-zeros ({slots / max(nnz, 1):.1f}x, limit "
            f"max_padding={max_padding:g}; {format_bytes(nbytes)}); use {advice}")
    if nbytes > profile.global_mem_size or max(sizes, default=0) > profile.max_alloc_size:
        raise FormatNotSuitableError(
            f"{name}: the padded {what} arrays need {format_bytes(nbytes)}, more than "
            f"{profile.name} can hold; use {advice}")


#: The ``max_padding`` parameter of the ELL family (ell, ellr-t).
MAX_PADDING = P.Param("max_padding", P.limit(),
                      "refuse when the padded arrays exceed this many slots per non-zero "
                      "(inf: never)")


@register
class ELL(LanesBlocks, SpMVFormat):
    name = "ell"
    complex_values = True
    order = 4
    template = "ell.mako"
    params = (P.work_group_size(), MAX_PADDING, LANE_COLUMNS)
    may_refuse = True
    converts_on_device = True
    host_input_on_device = True   # GPUs: 20M non-zeros, 0.47 s on the H200's host
    value_read = "gather"         # values_in_csr_order: slot j * stride + i
    block_widths = BLOCK_WIDTHS
    block_template = "ell_block.mako"

    @classmethod
    def default_params(cls, features, profile, dtype):
        return {"work_group_size": row_per_item_work_group_size(profile),
                "max_padding": DEFAULT_MAX_PADDING}

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        """The padded arrays' bytes at 90% efficiency; not worth timing past the
        tuner's padding limit."""
        v, i = np.dtype(dtype).itemsize, 4
        m, nnz = features.n_rows, max(features.nnz, 1)
        padding = features.max_row_length * m / nnz
        if padding > TUNING_MAX_PADDING:
            return None, f"padding {padding:.1f}x > {TUNING_MAX_PADDING:g}"
        return m * features.max_row_length * (v + i) / 0.9, None

    def analyse(self, csr):
        # Refuse before building anything.
        self.width, self.row_align, self.stride = ell_layout(csr, self.profile)
        slots = self.width * self.stride
        check_padding(self.name, slots, csr.nnz,
                      [slots * self.dtype.itemsize, slots * self.index_dtype.itemsize],
                      self.params.get("max_padding"), ADVICE, self.profile, "ELL")

    def template_params(self):
        """Columns and values through common.mako's ``streamed_loads`` where
        ``streamed_loads_ok``: on an H100 (20M non-zeros, same process) up to 8% faster
        (wathenSmall float64 130.2 -> 120.8 us), at worst 0.6% slower (bayer10
        float64)."""
        return {"streamed_loads": self.streamed_loads_ok()}

    def kernel_specs(self):
        return [ELL_KERNEL]

    def programs(self):
        conversion = [ell_device.program(1)] if self.converting_on_device else []
        return [*super().programs(), *conversion]

    def convert(self, csr):
        col_idx, values = ell_arrays(csr, self.width, self.row_align, self.index_dtype,
                                     self.dtype)
        return {"col_idx": col_idx, "values": values}

    def convert_device(self, csr):
        col_idx, values = ell_device.scatter(self, csr, self.width * self.stride,
                                             self.stride)
        return {"col_idx": col_idx, "values": values}

    def values_in_csr_order(self, queue, indptr):
        """Entry j of row i sits at slot j * stride + i."""
        rows, position, _ = row_slots(indptr)
        stored = self._read_values(queue, "values", self.width * self.stride)
        return stored[ell_slots(rows, position, self.stride)]

    def launches(self, beta):
        wg = self.params["work_group_size"]
        return [self.step("ell", *launch_rows(self.shape[0], wg, wg), n_rows=self.shape[0],
                          stride=self.stride, width=self.width)]

    # -- block kernels: ell_block.mako (CPUs), the lanes kernel (GPUs) ------------------
    lanes_template = "ell_lanes_block.mako"
    lanes_kernel = "ell_lanes_block"
    lanes_slotted = True

    @property
    def _lanes(self) -> bool:
        """The lanes kernel on GPUs, for real values too.  On an H100 (wing x83 and
        cage10 x133, 20M non-zeros, float32 and float64) it ran k = 32 in 1.06-1.50 ms
        against 2.38-3.88 ms with ell_block (whose k sums per row cost as much as 32
        single products), and k = 8 faster in 3 of 4 cases (cage10 float32: 312
        against 239 us).  CPUs keep ell_block's vectorised rows."""
        return self.profile.is_gpu

    def lanes_matrix_args(self):
        return ELL_KERNEL.args[:5]

    def lanes_values(self):
        return {"n_rows": self.shape[0], "stride": self.stride, "width": self.width}

    def items_block_kernel_specs(self, kb):
        return [ELL_BLOCK_KERNEL]

    def items_block_launches(self, kb, work_group_size, beta):
        wg = work_group_size
        return [self.step("ell_block", *launch_rows(self.shape[0], wg, wg),
                          n_rows=self.shape[0], stride=self.stride, width=self.width)]
