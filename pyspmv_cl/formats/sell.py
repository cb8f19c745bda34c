"""``sell``: sliced ELLPACK, SELL-C-σ (Kreutzer et al. 2014).

Rows are cut into slices of C consecutive rows; each slice is padded to its own
longest row and stored column-major, so the C rows of a slice read C consecutive
addresses per step.  Inside windows of σ rows, rows may first be sorted by length
(longest first) so that rows of similar length share a slice and padding shrinks; the
kernel writes ``y[perm[row]]`` directly, so the permutation costs no extra pass.

Padding slots hold column -1 and are skipped, never multiplied with x (0 * Inf would
be NaN where scipy gives a number).

``col_bits=16`` stores each column as a 16-bit offset from its slice's smallest column
(``col_base``, one index per slice; 0xFFFF marks padding), for slices spanning fewer
than 65535 columns (banded, finite-element and reordered matrices): 2 bytes a slot
instead of 4, a quarter of float32's traffic.  A matrix with a wider slice is refused
(``FormatNotSuitableError``).  ``col_bits="auto"`` (the GPU default where rows are
regular) takes 16 bits where every slice fits and 32 otherwise: the conversion finds
out, and builds the 32-bit kernel instead.

``value_bits=16`` (float32 or float64 operators) stores the values as IEEE half and
``value_bits=32`` (float64) as float32, accumulated in the operator's type
(formats/storage.py): opt-in, never chosen by the tuner.

Two work mappings, both rendered into the kernel:

* ``mapping="rows"`` (GPUs): ``threads_per_row`` (T) work-items per row, C*T per
  slice, consecutive work-items on consecutive addresses (coalesced); with T > 1 the
  partial sums of a row meet in local memory behind barriers.
* ``mapping="slices"`` (CPUs): one work-item walks a whole slice, its C rows as an
  inner loop over consecutive addresses that the compiler vectorises; a work-group
  of ``work_group_size`` work-items covers that many consecutive slices, so a CPU
  thread streams one contiguous stretch of the arrays.
"""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from .. import host_arrays
from ..codegen import BLOCK_ARGS, PRODUCT_ARGS, KernelSpec, matrix, scalar, scratch
from ..errors import FormatNotSuitableError, IndexOverflowError, InvalidParameterError
from . import params as P
from .base import (
    BLOCK_WIDTHS,
    INT32_LIMIT,
    SpMVFormat,
    csr_bytes,
    fits_int32,
    pow2_floor,
    round_up,
    skewed_rows,
)
from .lanes import LANE_COLUMNS, LanesBlocks
from .narrow_columns import column_offsets
from .registry import register
from .sorting import sort_permutation, window_rows
from .storage import VALUE_BITS, full_bits

SLICE_HEIGHTS = (1, 2, 4, 8, 16, 32, 64)
THREADS_PER_ROW = (1, 2, 4, 8, 16, 32, 64)
MAPPINGS = ("rows", "slices")
# Work-items per group of the conversion kernel (one per row).
SCATTER_GROUP = 64
COL_BITS = (16, 32)
# Row spread (std/mean of the row lengths) up to which the tuner tries col_bits=16.
REGULAR_SPREAD = 1.0
# ... and up to which GPUs take col_bits="auto" by default: 16-bit columns ran 3-9%
# faster on an H200 at spreads 0.15-0.30 (cage10, szdMat, wathenSmall, fe_4elt2),
# 0.6-1.5% slower at 0.45 (gemat12), as fast at 1.05 (bayer10), 10-30% slower at 1.45
# and 2.78 (astro-ph, Groebner_id2003_aug).
NARROW_DEFAULT_SPREAD = 0.4
# col_bits=16: the offset marking a padding slot, and so one past the widest span.
PAD_OFFSET = 0xFFFF


def compress_columns(col_idx, slice_ptr):
    """``(col_base, col_off)`` of ``col_idx`` (padding -1) in slices ``slice_ptr``: each
    slice's smallest column and the uint16 offsets from it (PAD_OFFSET for padding), or
    None when a slice spans PAD_OFFSET columns or more."""
    return column_offsets(col_idx, slice_ptr, PAD_OFFSET - 1, pad=PAD_OFFSET)

# sigma="auto": the smallest window (1, then LADDER_STEP**k * C rows, then the whole
# matrix) whose padding is within AUTO_SIGMA_SLACK of the whole-matrix sort's.  Small
# windows keep neighbouring rows together (x locality, y written in place); wide ones
# are taken only when they really save padding.  SpMV time follows the padded size: on
# PoCL, powerlaw:200000,8 (float32, C=8) pads 5.8x at sigma=1, 4.5x at 8C, 3.4x at 512,
# 2.2x at 8192 and 1.3x sorted whole, and runs 6.5 / 5.3 / 4.1 / 2.9 / 2.1 ms; on
# poisson2d:1000 nothing pads, and sorting only costs the perm array and its gather
# (3.1 ms at sigma=1, 4.0 at 8C).  A fixed few-times-C window would lose either way.
AUTO_SIGMA_SLACK = 1.10
LADDER_STEP = 8


def padded_size(row_lengths, slice_height, sigma):
    """Slots (entries + padding) SELL-C-σ needs, without building the permutation.

    A slice's width is its first row's length once the window is sorted (windows
    are whole slices: σ is 1, a multiple of C, or every row), so only every C-th
    sorted length is summed: no copy of the sorted lengths (5M rows: 180 -> 60 ms)."""
    m, C = row_lengths.size, slice_height
    window = window_rows(sigma, m)
    if m == 0:
        return 0
    if window == 1:   # unsorted: the longest row of each slice
        return int(host_arrays.reduce_groups(row_lengths, C, np.maximum)
                   .sum(dtype=np.int64)) * C
    n_windows = -(-m // window)
    dtype = np.int32 if int(row_lengths.max(initial=0)) < 2**31 - 1 else np.int64
    grid = np.full(n_windows * window, -1, dtype=dtype)  # -1: rows past m sort last
    grid[:m] = row_lengths
    descending = np.sort(grid.reshape(n_windows, window), axis=1)[:, ::-1]
    return int(np.maximum(descending[:, ::C], 0).sum(dtype=np.int64)) * C


def auto_sigma(row_lengths, slice_height):
    """σ for ``sigma="auto"``: see AUTO_SIGMA_SLACK."""
    m, C = row_lengths.size, slice_height
    if m <= C:
        return 1
    # No sort pads less than the entries themselves: within the slack of those, the
    # unsorted slices win without sorting the whole matrix (5.1M rows on a 2-core VM:
    # 34 -> 15 ms).
    if padded_size(row_lengths, C, 1) <= AUTO_SIGMA_SLACK * int(row_lengths.sum()):
        return 1
    best = padded_size(row_lengths, C, "all")
    limit = AUTO_SIGMA_SLACK * best
    sigma = 1
    while sigma < m:
        if padded_size(row_lengths, C, sigma) <= limit:
            return sigma
        sigma = LADDER_STEP * C if sigma == 1 else LADDER_STEP * sigma
    return "all"


def default_threads_per_row(features, profile, slice_height):
    """GPUs: one work-item per row, unless the rows are too few to fill the device and
    long enough to share: then double T while each work-item still gets >= 4 entries."""
    if profile.is_cpu:
        return 1
    target = profile.compute_units * max(1, profile.simd_width) * 32  # ~32 warps per CU
    threads = 1
    while (threads < THREADS_PER_ROW[-1] and features.n_rows * threads < target
           and features.mean_row_length >= 8 * threads
           and 2 * threads * slice_height <= min(MAX_DEFAULT_GROUP, profile.max_work_group_size)):
        threads *= 2
    return threads


# Default groups stay at or under 256 work-items: NVIDIA's OpenCL compiles these
# kernels for at most 256 (CL_KERNEL_WORK_GROUP_SIZE on an H100).
MAX_DEFAULT_GROUP = 256


@register
class SELL(LanesBlocks, SpMVFormat):
    name = "sell"
    complex_values = True
    order = 6
    template = "sell.mako"
    converts_on_device = True
    host_input_on_device = True   # GPUs: 20M non-zeros, 0.5-0.9 s on the host (H200 host)
    _col_bits_fallback = False    # col_bits="auto" resolved to 16 (analyse)
    block_widths = BLOCK_WIDTHS
    block_template = "sell_block.mako"
    params = (
        P.Param("slice_height", P.one_of(*SLICE_HEIGHTS), "rows per slice (C)"),
        P.Param("sigma", P.or_words(P.positive_int(), "all", "auto"),
                "rows per sorting window (σ): 1, a multiple of slice_height, at least the "
                "row count, 'all' or 'auto' (chosen from the row lengths)"),
        P.Param("mapping", P.one_of(*MAPPINGS),
                "'rows' (work-items per row, GPUs) or 'slices' (a work-item per slice, CPUs)"),
        P.Param("threads_per_row", P.one_of(*THREADS_PER_ROW),
                "work-items per row (mapping='rows')"),
        P.Param("col_bits", P.or_words(P.one_of(*COL_BITS), "auto"),
                "bits of a stored column: 16 = an offset from the slice's smallest column "
                "(slices spanning under 65535 columns), 'auto' = 16 where every slice "
                "fits, else 32"),
        VALUE_BITS,
        P.work_group_size(),
        LANE_COLUMNS,
    )

    @classmethod
    def default_params(cls, features, profile, dtype):
        # C = the SIMD width: a warp/wavefront covers one slice on GPUs, one vector
        # register holds a slice's column on CPUs (lanes of this dtype).
        # ... and no more rows than a work-group holds (the "rows" mapping runs a slice
        # per group at least).
        C = min(SLICE_HEIGHTS[-1], pow2_floor(profile.lanes(dtype)),
                pow2_floor(profile.max_work_group_size))
        if profile.is_cpu:
            # 64 slices per group: PoCL runs a group as one loop on one thread, which
            # then streams 64 * C consecutive rows of the arrays.
            return {"slice_height": C, "sigma": "auto", "mapping": "slices",
                    "threads_per_row": 1, "col_bits": 32, "value_bits": full_bits(dtype),
                    "work_group_size": min(64, profile.max_work_group_size)}
        T = default_threads_per_row(features, profile, C)
        wg = max(128, C * T)  # a few warps per group, at least one slice
        if wg > profile.max_work_group_size:
            wg = C * T
        col_bits = "auto" if features.row_spread <= NARROW_DEFAULT_SPREAD else 32
        return {"slice_height": C, "sigma": "auto", "mapping": "rows",
                "threads_per_row": T, "col_bits": col_bits, "value_bits": full_bits(dtype),
                "work_group_size": wg}

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """GPUs: also 2, 4 and 8 work-items per row where the rows average at least 3
        entries per work-item (more loads in flight, neighbouring columns read together):
        on an H200, astro-ph x32 (534k rows of 14.5 entries on average) ran in 47.5 us
        with 4 against 72.9 us with the default of 1 for that many rows."""
        if not profile.is_gpu:
            return [{}]
        default = cls.default_params(features, profile, dtype)
        T = default["threads_per_row"]
        # 16-bit columns where rows are regular: on an H200 (x83-x305 replicas, 20M
        # non-zeros) they ran 3-8% faster on cage10, szdMat, wathenSmall and fe_4elt2
        # (row spread 0.15-0.30), equal on bayer10 and gemat12, and 10-30% slower on
        # astro-ph and Groebner_id2003_aug (1.45, 2.78), where csr-vector wins anyway.
        # A matrix whose slices span too many columns refuses it (the tuner skips it).
        # Where the default is already "auto" (16 bits where they fit), 32 bits instead.
        if default["col_bits"] == "auto":
            narrow = [{"col_bits": 32}]
        else:
            narrow = [{"col_bits": 16}] if features.row_spread <= REGULAR_SPREAD else []
        return [{}] + narrow + [{"threads_per_row": t} for t in (2, 4, 8)
                                if t != T and features.mean_row_length >= 3 * t]

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        if not profile.is_cpu and skewed_rows(features):
            return None, "skewed rows serialise a slice on a GPU"
        return csr_bytes(features, dtype) * 1.1, None

    @classmethod
    def resolve_params(cls, features, profile, dtype, given):
        """Defaults of T and the work-group size follow the caller's C and mapping, so
        that setting one parameter never makes the others inconsistent."""
        params = P.resolve(cls.name, cls.params, cls.default_params(features, profile, dtype),
                           given)
        given = {k for k, v in given.items() if v is not None}
        C, mapping, T = params["slice_height"], params["mapping"], params["threads_per_row"]
        if "slice_height" not in given and "threads_per_row" in given and mapping == "rows":
            while C > 1 and C * T > MAX_DEFAULT_GROUP:
                C //= 2  # a slice's C * T work-items must fit a group
            params["slice_height"] = C
        if "threads_per_row" not in given:
            T = 1 if mapping == "slices" else default_threads_per_row(features, profile, C)
            if "work_group_size" in given:
                while T > 1 and params["work_group_size"] % (C * T):
                    T //= 2  # whole rows of T work-items per group
            params["threads_per_row"] = T
        if "work_group_size" not in given and mapping == "rows":
            wg = -(-params["work_group_size"] // (C * T)) * C * T  # whole slices
            params["work_group_size"] = wg if wg <= profile.max_work_group_size else C * T
        cls.check_params(params, profile)
        return params

    @classmethod
    def check_params(cls, params, profile):
        C, T = params["slice_height"], params["threads_per_row"]
        if params["mapping"] == "slices" and T != 1:
            raise InvalidParameterError(
                "sell: threads_per_row > 1 needs mapping='rows' (with mapping='slices' one "
                "work-item walks a whole slice)")
        if params["mapping"] == "rows":
            P.check_multiple(cls.name, params, "slice_height * threads_per_row", C * T,
                             context="with mapping='rows' ")

    # -- analysis: σ, the permutation, the slices, the index width -------------------------
    def analyse(self, csr):
        m = self.shape[0]
        C = self.params["slice_height"]
        sigma = self.params["sigma"]
        if sigma not in ("auto", "all") and not (sigma == 1 or sigma % C == 0 or sigma >= m):
            raise InvalidParameterError(
                f"sell: sigma must be 1, a multiple of slice_height ({C}), at least the row "
                f"count ({m}), 'all' or 'auto', not {sigma!r}")
        if self.params["col_bits"] == "auto":
            # 16 bits, unless the conversion finds a slice too wide for them
            # (_fall_back_to_32_bit_columns); no entries, nothing to narrow.
            self.params["col_bits"] = 16 if csr.nnz else 32
            self._col_bits_fallback = bool(csr.nnz)
        indptr = csr.indptr.astype(np.int64)
        row_lengths = np.diff(indptr)
        if sigma == "auto":
            self.params["sigma"] = sigma = auto_sigma(row_lengths, C)
        # Slice widths from the sorted lengths; rows past m (last slice) have length 0.
        # Unsorted (σ = 1), the rows keep their order: no permutation to build, compare
        # and gather (5.1M rows on a 2-core VM: about 50 -> 5 ms).
        self.n_slices = -(-m // C)
        perm = None if window_rows(sigma, m) == 1 else sort_permutation(row_lengths, sigma)
        self._has_perm = perm is not None and not np.array_equal(perm, np.arange(m))
        sorted_lengths = row_lengths[perm] if self._has_perm else row_lengths
        slice_widths = host_arrays.reduce_groups(sorted_lengths, C, np.maximum)
        slice_ptr = np.zeros(self.n_slices + 1, dtype=np.int64)
        np.cumsum(slice_widths * C, out=slice_ptr[1:])
        self._check_index_width(int(slice_ptr[-1]))
        self._layout = (indptr, row_lengths, perm, slice_ptr)

    def _check_index_width(self, n_slots):
        """Padding can push the slot count past 32 bits where nnz alone fits."""
        if self.index_dtype == np.int64 or fits_int32(n_slots):
            return
        if self.index_bits_asked == 32:
            raise IndexOverflowError(
                f"sell: the padded slices hold {n_slots} slots, more than 32-bit indices "
                f"address ({INT32_LIMIT}): use index_bits=64, a larger sigma or a smaller "
                f"slice_height")
        self.index_dtype = np.dtype(np.int64)
        self.params["index_bits"] = 64

    # -- kernel ---------------------------------------------------------------------------
    def template_params(self):
        p = self.params
        return {"slice_height": p["slice_height"], "mapping": p["mapping"],
                "threads_per_row": p["threads_per_row"], "has_perm": self._has_perm,
                "col_bits": p["col_bits"], "value_bits": p["value_bits"],
                "device_conversion": self.converting_on_device,
                "streamed_loads": self._streamed_loads()}

    def _streamed_loads(self):
        """The work-items-per-row mapping's columns and values through common.mako's
        ``streamed_loads`` where ``streamed_loads_ok``, in float32 only.  On an H100
        (20M non-zeros, same process) float32 went 61.4 -> 53.6 us on cage10, 58.2 ->
        50.6 on wathenSmall, 58.5 -> 53.0 on szdMat, within -3%..+1% on the other four
        matrices; float64 lost up to 7% (fe_4elt2 105.0 -> 112.1 us)."""
        return (self.params["mapping"] != "slices" and self.dtype == np.float32
                and self.streamed_loads_ok())

    def _matrix_args(self):
        columns = ((matrix("col_base", "index_t"), matrix("col_off", "ushort"))
                   if self.params["col_bits"] == 16 else (matrix("col_idx", "index_t"),))
        args = (scalar("n_rows", "long"), scalar("n_slices", "long"),
                matrix("slice_ptr", "index_t"), *columns, matrix("values", "value_t"))
        if self._has_perm:
            args += (matrix("perm", "index_t"),)
        return args

    def kernel_specs(self):
        specs = [KernelSpec("sell", (*self._matrix_args(), *PRODUCT_ARGS), fixed_group=True)]
        if self.converting_on_device:
            specs.append(KernelSpec("sell_pad", (
                scalar("n_slots", "long"), scratch("col_idx_out", "index_t"),
                scratch("values_out", "value_t"))))
            if self._has_perm:
                specs.append(KernelSpec("sell_positions", (
                    scalar("n_rows", "long"), scratch("perm_in", "index_t", read_only=True),
                    scratch("position_out", "index_t"))))
            specs.append(KernelSpec("sell_scatter", (
                scalar("n_rows", "long"), matrix("csr_row_ptr", "index_t"),
                matrix("csr_col_idx", "index_t"), matrix("csr_values", "value_t"),
                scratch("slice_ptr_in", "index_t", read_only=True),
                *((scratch("position_in", "index_t", read_only=True),)
                  if self._has_perm else ()),
                scratch("col_idx_out", "index_t"), scratch("values_out", "value_t"))))
            if self.params["col_bits"] == 16:
                specs.append(KernelSpec("sell_compress", (
                    scalar("n_slices", "long"),
                    scratch("slice_ptr_in", "index_t", read_only=True),
                    scratch("col_idx_in", "index_t", read_only=True),
                    scratch("col_base_out", "index_t"), scratch("col_off_out", "ushort"),
                    scratch("too_wide", "int"))))
        return specs

    def local_bytes(self, work_group_size):
        if self.params["mapping"] == "rows" and self.params["threads_per_row"] > 1:
            return work_group_size * self.dtype.itemsize
        return 0

    def min_work_group_size(self):
        if self.params["mapping"] == "rows":
            return self.params["slice_height"] * self.params["threads_per_row"]
        return 1

    # -- conversion --------------------------------------------------------------------
    def _row_base(self):
        """Entry j of CSR (the k-th of row r) goes to slot slice_ptr[s] + k*C + lane,
        where position[r] = s*C + lane is where the sort put r; with k = j - indptr[r]
        that is a per-row base plus j*C.  Returns (row_base, row_lengths, perm,
        slice_ptr), all from the row lengths alone."""
        indptr, row_lengths, perm, slice_ptr = self._layout
        del self._layout
        C = self.params["slice_height"]
        position = np.arange(self.shape[0], dtype=np.int64)
        if self._has_perm:
            position[perm] = position.copy()
        row_base = slice_ptr[position // C] + position % C - indptr[:-1] * C
        return row_base, row_lengths, perm, slice_ptr

    def _layout_arrays(self, perm, slice_ptr):
        arrays = {"slice_ptr": slice_ptr.astype(self.index_dtype)}
        if self._has_perm:
            arrays["perm"] = perm.astype(self.index_dtype)
        return arrays

    def convert(self, csr):
        row_base, row_lengths, perm, slice_ptr = self._row_base()
        C = self.params["slice_height"]
        slot = np.arange(0, csr.nnz * C, C, dtype=np.int64)
        slot += host_arrays.repeat(row_base, row_lengths)
        col_idx = np.full(int(slice_ptr[-1]), -1, dtype=self.index_dtype)
        values = np.zeros(int(slice_ptr[-1]), dtype=self.value_dtype)
        col_idx[slot] = csr.indices
        values[slot] = self.stored_values(csr.data)
        return {**self._layout_arrays(perm, slice_ptr), **self._columns(col_idx, slice_ptr),
                "values": values}

    def _columns(self, col_idx, slice_ptr):
        """The column arrays: ``col_idx`` as it is, or with col_bits=16 its base per
        slice and 16-bit offsets (refused for a slice spanning 65535 columns or more)."""
        if self.params["col_bits"] != 16:
            return {"col_idx": col_idx}
        compressed = compress_columns(col_idx.astype(np.int64), slice_ptr)
        if compressed is None:
            if self._col_bits_fallback:
                self._fall_back_to_32_bit_columns()
                return {"col_idx": col_idx}
            raise self._too_wide()
        base, offsets = compressed
        return {"col_base": base.astype(self.index_dtype), "col_off": offsets}

    def _fall_back_to_32_bit_columns(self):
        """col_bits="auto" and a slice too wide for 16 bits: 32-bit columns, and the
        kernels built again for them (the kernel cache has them after the first time)."""
        self.params["col_bits"] = 32
        self._col_bits_fallback = False
        self._rebuild()

    def _too_wide(self):
        return FormatNotSuitableError(
            f"sell: col_bits=16 needs every slice's columns within {PAD_OFFSET - 1} of its "
            "smallest one, and a slice of this matrix spans more: use col_bits=32 (the "
            "default), or a smaller slice_height or sigma")

    def read_csr(self, queue, wait_for=None, staging=None):
        """Blocking reads of the slices (``staging`` unused: sell starts on CPUs only),
        each slot's row from its slice and lane (slot =
        slice start + k*C + lane, position slice*C + lane, row perm[position] where
        sorted), padding dropped, a stable sort by row keeping each row's entries in
        order (``_row_base``'s map, inverted)."""
        def read(name, dtype, size):
            host = np.empty(size, dtype)
            if size:
                cl.enqueue_copy(queue, host, self.buffers[name], wait_for=wait_for)
            return host

        index, m, C = self.index_dtype, self.shape[0], self.params["slice_height"]
        slice_ptr = read("slice_ptr", index, self.n_slices + 1).astype(np.int64)
        n_slots = int(slice_ptr[-1])
        slice_of = host_arrays.entry_rows(slice_ptr)
        lane = np.arange(n_slots, dtype=np.int64) - slice_ptr[slice_of]
        lane %= C
        if self.params["col_bits"] == 16:
            offsets = read("col_off", np.uint16, n_slots)
            base = read("col_base", index, max(1, self.n_slices)).astype(np.int64)
            cols = np.where(offsets == PAD_OFFSET, -1, base[slice_of] + offsets)
        else:
            cols = read("col_idx", index, n_slots).astype(np.int64)
        values = read("values", self.value_dtype, n_slots)
        keep = cols >= 0
        rows = slice_of[keep] * C + lane[keep]
        if self._has_perm:
            rows = read("perm", index, m).astype(np.int64)[rows]
        order = np.argsort(rows, kind="stable")
        indptr = np.zeros(m + 1, dtype=index)
        np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
        return [indptr, cols[keep][order].astype(index),
                values[keep][order].astype(self.dtype)], []

    def convert_device(self, csr):
        """The same arrays made on the device from a CSR there: the sort and the slice
        layout (one number per slice) on the host, the rest by ``sell_positions`` and
        ``sell_scatter`` (no per-row array made on the host: 5.1M rows cost 0.09 s)."""
        _, _, perm, slice_ptr = self._layout
        del self._layout
        queue = self.device.queue
        n_slots = int(slice_ptr[-1])
        col_idx = cla.empty(queue, n_slots, self.index_dtype)
        values = cla.empty(queue, n_slots, self.value_dtype)
        arrays = {name: cla.to_device(queue, arr)
                  for name, arr in self._layout_arrays(perm, slice_ptr).items()}
        wg = min(SCATTER_GROUP, self.profile.max_work_group_size)
        m = self.shape[0]
        steps = []
        if n_slots:
            steps.append(self.step("sell_pad", round_up(n_slots, wg), wg, n_slots=n_slots,
                                   col_idx_out=col_idx.base_data,
                                   values_out=values.base_data))
        if csr.nnz:
            where = {}
            if self._has_perm:
                position = cla.empty(queue, m, self.index_dtype)
                steps.append(self.step("sell_positions", round_up(m, wg), wg, n_rows=m,
                                       perm_in=arrays["perm"].base_data,
                                       position_out=position.base_data))
                where = {"position_in": position.base_data}
            steps.append(self.step(
                "sell_scatter", round_up(m, wg), wg, n_rows=m,
                csr_row_ptr=csr.as_type("indptr", self.index_dtype, queue).base_data,
                csr_col_idx=csr.as_type("indices", self.index_dtype, queue).base_data,
                csr_values=self.device_values(csr, queue).base_data,
                slice_ptr_in=arrays["slice_ptr"].base_data, **where,
                col_idx_out=col_idx.base_data, values_out=values.base_data))
        if self.params["col_bits"] == 16:
            return {**arrays, **self._compress_device(col_idx, arrays["slice_ptr"], steps),
                    "values": values}
        self.run_now(queue, steps)   # done before any product, whatever the queue's order
        return {**arrays, "col_idx": col_idx, "values": values}

    def _compress_device(self, col_idx, slice_ptr, steps):
        """col_bits=16 on the device: ``sell_compress`` (a work-item per slice) finds
        each slice's smallest column and writes the offsets, flagging a slice too wide;
        the flag, one int, is the only thing read back."""
        queue = self.device.queue
        base = cla.empty(queue, max(1, self.n_slices), self.index_dtype)
        offsets = cla.empty(queue, max(1, col_idx.size), np.uint16)
        too_wide = cla.zeros(queue, 1, np.int32)
        if self.n_slices:
            wg = min(SCATTER_GROUP, self.profile.max_work_group_size)
            steps.append(self.step("sell_compress", round_up(self.n_slices, wg), wg,
                                   n_slices=self.n_slices,
                                   slice_ptr_in=slice_ptr.base_data,
                                   col_idx_in=col_idx.base_data,
                                   col_base_out=base.base_data,
                                   col_off_out=offsets.base_data,
                                   too_wide=too_wide.base_data))
        self.run_now(queue, steps)
        if too_wide.get()[0]:
            if self._col_bits_fallback:
                self._fall_back_to_32_bit_columns()
                return {"col_idx": col_idx}
            raise self._too_wide()
        return {"col_base": base, "col_off": offsets}

    # -- block kernels: sell_block.mako (CPUs), lanes (GPUs) -------------------------------
    lanes_template = "sell_lanes_block.mako"
    lanes_kernel = "sell_lanes_block"
    lanes_slotted = True

    @property
    def _lanes(self) -> bool:
        """The lanes kernel on GPUs, for real values too.  On an H100 (cage10 x133 and
        wing x83, 20M non-zeros, float32 and float64) it ran k = 32 in 0.94-1.74 ms
        against 2.4-3.9 ms with sell_block (as slow as 32 single products there: its
        slices hold k sums per row in local memory), and k = 8 12-28% faster except
        cage10 float32 (11% slower).  CPUs keep sell_block's vectorised rows."""
        return self.profile.is_gpu

    def lanes_matrix_args(self):
        return self._matrix_args()

    def lanes_values(self):
        return {"n_rows": self.shape[0], "n_slices": self.n_slices}

    def items_block_kernel_specs(self, kb):
        return [KernelSpec("sell_block", (*self._matrix_args(), *BLOCK_ARGS),
                           fixed_group=True)]

    def block_template_params(self, kb):
        return {**super().block_template_params(kb), "device_conversion": False}

    def items_block_local_bytes(self, kb, work_group_size):
        return kb * self.local_bytes(work_group_size)

    def items_block_launches(self, kb, work_group_size, beta):
        return self.launches(beta, work_group_size, "sell_block")

    # -- launching ---------------------------------------------------------------------------
    def launches(self, beta, work_group_size=None, kernel="sell"):
        if self.n_slices == 0:   # no rows: nothing to launch
            return []
        wg = work_group_size or self.params["work_group_size"]
        if self.params["mapping"] == "rows":
            slices_per_group = wg // (self.params["slice_height"]
                                      * self.params["threads_per_row"])
        else:
            slices_per_group = wg
        groups = -(-self.n_slices // slices_per_group)
        return [self.step(kernel, groups * wg, wg, n_rows=self.shape[0],
                          n_slices=self.n_slices)]
