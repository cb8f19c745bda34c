"""``dia``: the diagonal format (Bell & Garland, section 3.1).

Each occupied diagonal (``offset = column - row``) is one column of a dense
``n_diags x stride`` array: entry ``(i, i + offsets[d])`` lives at ``d * stride + i``,
so consecutive rows (work-items) read consecutive addresses.  One work-item per row.

Stored entries and padding.  A diagonal slot with no stored entry must never multiply
x (``0 * inf`` would be NaN where scipy gives nothing), while a stored zero must.  When
no stored value is zero in the device dtype, "a bit of the value is set" tells them
apart exactly (padding is +0.0) and nothing more is stored, and a zero that
update_values stores later is written as -0.0; otherwise a validity bitmap (one bit per
slot, ``d * stride + i``; 1/32 of the data in float32) marks the stored slots and the
kernel tests the bit.
Duplicate ``(row, column)`` entries are not summed (scipy multiplies each): the k-th
repeat goes to a second copy of its diagonal (same offset, "layer" k), so every stored
entry keeps a slot of its own.

DIA refuses (``FormatNotSuitableError``) a matrix spread over more than
``max_diagonals`` diagonals (default 512) or whose slots exceed ``max_fill`` times its
non-zeros (``n_diags * n_rows / nnz``, default 3), unless its arrays are under 1 MiB.
"""

import numpy as np

from .. import host_arrays
from ..codegen import PRODUCT_ARGS, KernelSpec, matrix, scalar
from ..device_inputs import DeviceCSR
from ..errors import FormatNotSuitableError
from . import dia_device
from . import params as P
from .base import (
    SpMVFormat,
    format_bytes,
    launch_rows,
    pow2_floor,
    row_per_item_work_group_size,
)
from .ell import SMALL_BYTES, check_padding, ell_stride
from .registry import register

DEFAULT_MAX_FILL = 3.0
DEFAULT_MAX_DIAGONALS = 512
ADVICE = "ell, hyb or csr-vector"
# The tuner times DIA only for diagonals this well filled (slots per non-zero).
TUNING_MAX_FILL = 3.0


def _duplicate_rank(rows, cols, n_cols):
    """For each entry, how many earlier entries share its (row, column): 0 unless
    duplicated.  Vectorised through a stable sort."""
    key = rows * max(n_cols, 1) + cols
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.ones(key.size, dtype=bool)
    starts[1:] = sorted_key[1:] != sorted_key[:-1]
    if starts.all():
        return None
    index = np.arange(key.size, dtype=np.int64)
    run_start = np.maximum.accumulate(np.where(starts, index, 0))
    rank = np.empty(key.size, dtype=np.int64)
    rank[order] = index - run_start
    return rank


def _diagonals_by_count(offset, m, n):
    """``np.unique(offset, return_inverse=True)`` for offsets in ``(-m, n)``, by a count
    over the ``m + n - 1`` possible diagonals instead of a sort: on a 2-core VM,
    poisson2d:1000 (5M non-zeros) 240 ms -> 60 ms."""
    shifted = offset + (m - 1)
    present = np.bincount(shifted, minlength=m + n - 1) > 0
    index = np.cumsum(present, dtype=np.int64 if m + n > 2**31 - 1 else np.int32)
    return np.flatnonzero(present) - (m - 1), index[shifted] - 1


def dia_diagonals(csr):
    """``(offsets, diagonal of each entry, row of each entry)``: the occupied diagonals
    (sorted by offset, then layer) and where every stored entry goes."""
    m, n = csr.shape
    rows = host_arrays.entry_rows(csr.indptr)
    cols = csr.indices.astype(np.int64)
    offset = cols - rows
    # Sorted rows without duplicates (checked: scipy's flag may be stale) spare the
    # sort that ranks duplicates.
    rank = None if host_arrays.has_canonical_format(csr) else \
        _duplicate_rank(rows, cols, n)
    if rank is None:
        if dia_device.fits(csr.shape, csr.nnz):   # a count over every diagonal is small
            return (*_diagonals_by_count(offset, m, n), rows)
        offsets, diag = np.unique(offset, return_inverse=True)
        return offsets, diag.ravel(), rows
    layers = int(rank.max()) + 1
    key = (offset + max(m, 1)) * layers + rank  # non-negative, ordered by (offset, layer)
    keys, diag = np.unique(key, return_inverse=True)
    return keys // layers - max(m, 1), diag.ravel(), rows


@register
class DIA(SpMVFormat):
    name = "dia"
    complex_values = True
    order = 3
    template = "dia.mako"
    may_refuse = True
    # formats/dia_device.py; rows out of order (duplicates: layers) are read back.
    converts_on_device = True
    host_input_on_device = True
    # Without the bitmap the kernel tests a slot's bits: a zero set by update_values
    # (none was stored at conversion, or there would be a bitmap) is held as -0.0.
    signed_stored_zeros = True
    params = (
        P.work_group_size(),
        P.Param("max_fill", P.limit(),
                "refuse above this many slots per non-zero (inf: no limit)"),
        P.Param("max_diagonals", P.limit("an integer >= 1, or inf (no limit)",
                                         integer=True),
                "refuse above this many diagonals (inf: no limit)"),
    )

    @classmethod
    def default_params(cls, features, profile, dtype):
        return {"work_group_size": row_per_item_work_group_size(profile),
                "max_fill": DEFAULT_MAX_FILL, "max_diagonals": DEFAULT_MAX_DIAGONALS}

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        if features.diagonals < 0:
            return None, "rows too uneven for diagonals"
        if features.diagonal_fill > TUNING_MAX_FILL:
            return None, f"{features.diagonals} diagonals, fill {features.diagonal_fill:.1f}x"
        return features.diagonals * features.n_rows * np.dtype(dtype).itemsize, None

    def analyse(self, csr):
        """The diagonals, the stride, whether a bitmap is needed; refuses an unsuitable
        matrix before anything is built.  A matrix on the device: its diagonals found
        there (``dia_device.analyse``), unless its rows are out of order."""
        m = csr.shape[0]
        if isinstance(csr, DeviceCSR):
            layout = dia_device.analyse(self, csr) if self.converting_on_device and \
                dia_device.fits(csr.shape, csr.nnz) else None
            if layout is not None:
                self._sized(layout.offsets.size, layout.has_mask, csr.nnz, m)
                self._device_layout = layout
                return
            self.converting_on_device = False
            csr = csr.to_host(self.device.queue)
        offsets, diag, rows = dia_diagonals(csr)
        values = csr.data.astype(self.dtype)
        self._sized(offsets.size, bool(np.any(values == 0)), csr.nnz, m)
        # Kept for convert (dropped there).
        self._layout = (offsets, diag * self.stride + rows, values)

    def _sized(self, n_diags, has_mask, nnz, m):
        """The stride and the bitmap's need, and DIA's refusals, for ``n_diags``."""
        self.n_diags = n_diags
        self.stride = ell_stride(m, pow2_floor(max(1, self.profile.simd_width)))
        slots = self.n_diags * self.stride
        self.has_mask = has_mask
        sizes = [slots * self.dtype.itemsize, self.n_diags * self.index_dtype.itemsize]
        if self.has_mask:
            sizes.append(-(-slots // 32) * 4)
        self._check_suits(nnz, m, sum(sizes))
        check_padding(self.name, slots, nnz, sizes, None, ADVICE, self.profile, "DIA")

    @classmethod
    def device_conversion_takes(cls, csr, params, dtype):
        """A host matrix goes up as CSR when scipy says it has no duplicates (they need
        layers, made on the host) and the diagonal flags fit (``dia_device.fits``)."""
        return dia_device.fits(csr.shape, csr.nnz) and \
            bool(getattr(csr, "has_canonical_format", True))

    def convert_device(self, csr):
        layout = self._device_layout
        del self._device_layout
        return dia_device.convert(self, layout)

    def convert(self, csr):
        offsets, slot, values = self._layout
        del self._layout
        slots = self.n_diags * self.stride
        data = np.zeros(slots, dtype=self.dtype)
        data[slot] = values
        arrays = {"offsets": offsets.astype(self.index_dtype), "data": data}
        if self.has_mask:
            # Slots are distinct, so summing their bits is OR-ing them (exact in float64).
            words = np.bincount(slot >> 5, weights=np.left_shift(1, slot & 31).astype(np.float64),
                                minlength=-(-slots // 32))
            arrays["mask"] = words.astype(np.uint32)
        return arrays

    def _check_suits(self, nnz, n_rows, nbytes):
        if nbytes <= SMALL_BYTES:
            return
        max_diags, max_fill = self.params["max_diagonals"], self.params["max_fill"]
        if max_diags is not None and self.n_diags > max_diags:
            raise FormatNotSuitableError(
                f"dia: this matrix does not suit DIA: its {nnz} non-zeros lie on "
                f"{self.n_diags} diagonals (limit max_diagonals={max_diags}); use {ADVICE}")
        fill = self.n_diags * n_rows / max(nnz, 1)
        if max_fill is not None and fill > max_fill:
            raise FormatNotSuitableError(
                f"dia: this matrix does not suit DIA: {self.n_diags} diagonals of {n_rows} "
                f"rows hold {nnz} non-zeros, {fill:.1f} slots per non-zero (limit "
                f"max_fill={max_fill:g}; {format_bytes(nbytes)}); use {ADVICE}")

    def template_params(self):
        return {"has_mask": self.has_mask}

    def kernel_specs(self):
        mask = (matrix("mask", "uint"),) if self.has_mask else ()
        args = (scalar("n_rows", "long"), scalar("stride", "long"), scalar("n_diags", "long"),
                matrix("offsets", "index_t"), matrix("data", "real_t"), *mask, *PRODUCT_ARGS)
        return [KernelSpec("dia", args, fixed_group=True)]

    def launches(self, beta):
        wg = self.params["work_group_size"]
        return [self.step("dia", *launch_rows(self.shape[0], wg, wg), n_rows=self.shape[0],
                          stride=self.stride, n_diags=self.n_diags)]
