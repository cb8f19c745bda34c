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
``ELL(csr, device, dtype, params)``
    The format class; ``params`` as ``ELL.resolve_params(...)`` returns them:
    ``work_group_size`` and ``max_padding`` (``None`` or ``inf``: never refuse for
    padding, for a CSR already cut to ``K`` entries per row; through ``SpMV`` pass
    ``max_padding=float("inf")``, since ``None`` there means the default), plus
    optional ``index_bits``.  ``enqueue(queue, x_buf, y_buf, alpha, beta, wait_for)``
    computes ``y = alpha * A_ell @ x + beta * y``; ``width``, ``stride`` and ``nbytes``
    describe the arrays.
"""

import math

import numpy as np

from ..errors import FormatNotSuitableError
from .base import (
    SpMVFormat,
    format_bytes,
    launch_rows,
    pow2_floor,
    row_per_item_work_group_size,
)

DEFAULT_MAX_PADDING = 20.0
# Arrays this small are always accepted, whatever their padding ratio: tiny or odd
# matrices (one dense row, 1 x 3000) still work, and cost next to nothing.
SMALL_BYTES = 1 << 20


def ell_stride(n_rows, row_align):
    """``n_rows`` rounded up to a multiple of ``row_align``."""
    row_align = max(1, int(row_align))
    return -(-int(n_rows) // row_align) * row_align


def row_slots(csr):
    """(row, position within the row) of every stored entry, vectorised."""
    lengths = np.diff(csr.indptr).astype(np.int64)
    rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), lengths)
    position = np.arange(rows.size, dtype=np.int64) - (csr.indptr[:-1].astype(np.int64)[rows]
                                                       - int(csr.indptr[0]))
    return rows, position, lengths


def ell_arrays(csr, width, row_align, index_dtype, dtype):
    """Column-major ELL arrays of ``csr`` (see the module docstring)."""
    m = csr.shape[0]
    width = int(width)
    stride = ell_stride(m, row_align)
    rows, position, lengths = row_slots(csr)
    if lengths.size and lengths.max() > width:
        raise ValueError(f"a row holds {lengths.max()} entries, more than the ELL width "
                         f"{width}")
    col_idx = np.full(width * stride, -1, dtype=index_dtype)
    values = np.zeros(width * stride, dtype=dtype)
    slot = position * stride + rows
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


def validate_max_padding(name, value):
    if value is None or value == math.inf:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise ValueError(f"{name}: max_padding must be a number >= 1, None or inf "
                         f"(no limit), not {value!r}")
    return float(value)


class ELL(SpMVFormat):
    name = "ell"
    template = "ell.mako"
    kernel_name = "ell"
    param_names = ("work_group_size", "max_padding")
    may_refuse = True

    @classmethod
    def default_params(cls, features, profile, dtype):
        return {"work_group_size": row_per_item_work_group_size(profile),
                "max_padding": DEFAULT_MAX_PADDING}

    def __init__(self, csr, device, dtype, params):
        params = dict(params)
        params["max_padding"] = validate_max_padding(self.name, params.get("max_padding"))
        super().__init__(csr, device, dtype, params)

    def _convert(self, csr):
        m = csr.shape[0]
        self.row_align = pow2_floor(max(1, self.profile.simd_width))
        self.stride = ell_stride(m, self.row_align)
        self.width = int(np.diff(csr.indptr).max(initial=0)) if m else 0
        slots = self.width * self.stride
        check_padding(self.name, slots, csr.nnz,
                      [slots * self.dtype.itemsize, slots * self.index_dtype.itemsize],
                      self.params["max_padding"], "hyb, ellr-t or csr-vector", self.profile,
                      "ELL")
        col_idx, values = ell_arrays(csr, self.width, self.row_align, self.index_dtype,
                                     self.dtype)
        return {"col_idx": col_idx, "values": values}

    def _kernel_args(self, x_buf, y_buf, alpha, beta):
        b = self.buffers
        return (np.int64(self.shape[0]), np.int64(self.stride), np.int64(self.width),
                b["col_idx"], b["values"], x_buf, y_buf, alpha, beta)

    def _launch_geometry(self):
        wg = self.params["work_group_size"]
        return launch_rows(self.shape[0], wg, wg)
