"""``sell``: sliced ELLPACK, SELL-C-σ (Kreutzer et al. 2014).

Rows are cut into slices of C consecutive rows; each slice is padded to its own
longest row and stored column-major, so the C rows of a slice read C consecutive
addresses per step.  Inside windows of σ rows, rows may first be sorted by length
(longest first) so that rows of similar length share a slice and padding shrinks; the
kernel writes ``y[perm[row]]`` directly, so the permutation costs no extra pass.

Padding slots hold column -1 and are skipped, never multiplied with x (0 * Inf would
be NaN where scipy gives a number).

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

from ..errors import IndexOverflowError
from .base import INT32_LIMIT as _INT32_LIMIT
from .base import SpMVFormat, pow2_floor

SLICE_HEIGHTS = (1, 2, 4, 8, 16, 32, 64)
THREADS_PER_ROW = (1, 2, 4, 8, 16, 32, 64)
MAPPINGS = ("rows", "slices")

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


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _window(sigma, n_rows):
    """Rows per sorting window: ``n_rows`` for the whole matrix."""
    return max(1, n_rows) if sigma == "all" or sigma >= n_rows else int(sigma)


def sort_permutation(row_lengths, sigma):
    """``perm[p]`` = the original row stored at position p: rows sorted by decreasing
    length inside each window of σ rows, equal lengths keeping their order (stable)."""
    m = row_lengths.size
    window = _window(sigma, m)
    if window == 1 or m == 0:
        return np.arange(m, dtype=np.int64)
    longest = int(row_lengths.max())
    key = (np.arange(m, dtype=np.int64) // window) * (longest + 1) + (longest - row_lengths)
    return np.argsort(key, kind="stable")


def padded_size(row_lengths, slice_height, sigma):
    """Slots (entries + padding) SELL-C-σ needs, without building the permutation."""
    m, C = row_lengths.size, slice_height
    n_slices = -(-m // C)
    window = _window(sigma, m)
    lengths = row_lengths.astype(np.int64)
    if window > 1 and m:
        n_windows = -(-m // window)
        grid = np.full(n_windows * window, -1, dtype=np.int64)  # -1: rows past m sort last
        grid[:m] = lengths
        lengths = np.sort(grid.reshape(n_windows, window), axis=1)[:, ::-1].ravel()
    padded = np.zeros(n_slices * C, dtype=np.int64)
    count = min(lengths.size, padded.size)
    padded[:count] = np.maximum(lengths[:count], 0)
    return int(padded.reshape(n_slices, C).max(axis=1, initial=0).sum()) * C


def auto_sigma(row_lengths, slice_height):
    """σ for ``sigma="auto"``: see AUTO_SIGMA_SLACK."""
    m, C = row_lengths.size, slice_height
    if m <= C:
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


class SELL(SpMVFormat):
    name = "sell"
    template = "sell.mako"
    kernel_name = "sell"
    param_names = ("slice_height", "sigma", "mapping", "threads_per_row", "work_group_size")

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
                    "threads_per_row": 1,
                    "work_group_size": min(64, profile.max_work_group_size)}
        T = default_threads_per_row(features, profile, C)
        wg = max(128, C * T)  # a few warps per group, at least one slice
        if wg > profile.max_work_group_size:
            wg = C * T
        return {"slice_height": C, "sigma": "auto", "mapping": "rows",
                "threads_per_row": T, "work_group_size": wg}

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """GPUs: also 2, 4 and 8 work-items per row where the rows average at least 3
        entries per work-item (more loads in flight, neighbouring columns read together):
        on an H200, astro-ph x32 (534k rows of 14.5 entries on average) ran in 47.5 us
        with 4 against 72.9 us with the default of 1 for that many rows."""
        if not profile.is_gpu:
            return [{}]
        T = cls.default_params(features, profile, dtype)["threads_per_row"]
        return [{}] + [{"threads_per_row": t} for t in (2, 4, 8)
                       if t != T and features.mean_row_length >= 3 * t]

    @classmethod
    def resolve_params(cls, features, profile, dtype, user_params):
        """Defaults of T and the work-group size follow the caller's C and mapping, so
        that setting one parameter never makes the others inconsistent."""
        params = super().resolve_params(features, profile, dtype, user_params)
        given = {k for k, v in user_params.items() if v is not None}
        T = params["threads_per_row"]
        if ("slice_height" not in given and "threads_per_row" in given and _is_int(T)
                and params["mapping"] == "rows"):
            while params["slice_height"] > 1 and params["slice_height"] * T > MAX_DEFAULT_GROUP:
                params["slice_height"] //= 2  # a slice's C * T work-items must fit a group
        C, mapping = params["slice_height"], params["mapping"]
        if "threads_per_row" not in given and C in SLICE_HEIGHTS:
            T = 1 if mapping == "slices" else default_threads_per_row(features, profile, C)
            wg = params["work_group_size"]
            if "work_group_size" in given and _is_int(wg):
                while T > 1 and wg % (C * T):  # whole rows of T work-items per group
                    T //= 2
            params["threads_per_row"] = T
        T = params["threads_per_row"]
        if ("work_group_size" not in given and mapping == "rows" and C in SLICE_HEIGHTS
                and T in THREADS_PER_ROW):
            wg = -(-params["work_group_size"] // (C * T)) * C * T  # whole slices
            params["work_group_size"] = wg if wg <= profile.max_work_group_size else C * T
        return params

    def __init__(self, csr, device, dtype, params):
        C = params.get("slice_height")
        if C not in SLICE_HEIGHTS or not _is_int(C):
            raise ValueError(f"sell: slice_height must be one of {SLICE_HEIGHTS}, not {C!r}")
        mapping = params.get("mapping")
        if mapping not in MAPPINGS:
            raise ValueError(f"sell: mapping must be 'rows' or 'slices', not {mapping!r}")
        T = params.get("threads_per_row")
        if T not in THREADS_PER_ROW or not _is_int(T):
            raise ValueError(f"sell: threads_per_row must be one of {THREADS_PER_ROW}, "
                             f"not {T!r}")
        if mapping == "slices" and T != 1:
            raise ValueError("sell: threads_per_row > 1 needs mapping='rows' (with "
                             "mapping='slices' one work-item walks a whole slice)")
        wg = params.get("work_group_size")
        if mapping == "rows" and _is_int(wg) and wg % (C * T):
            raise ValueError(f"sell: with mapping='rows' work_group_size must be a multiple "
                             f"of slice_height * threads_per_row ({C * T}), not {wg!r}")
        sigma = params.get("sigma")
        m = csr.shape[0]
        if sigma not in ("auto", "all") and not (
                _is_int(sigma) and sigma >= 1 and (sigma == 1 or sigma % C == 0 or sigma >= m)):
            raise ValueError(f"sell: sigma must be 1, a multiple of slice_height ({C}), at "
                             f"least the row count ({m}), 'all' or 'auto', not {sigma!r}")
        self._index_bits_asked = params.get("index_bits")
        super().__init__(csr, device, dtype, params)

    # -- conversion --------------------------------------------------------------------
    def _convert(self, csr):
        m = csr.shape[0]
        C = self.params["slice_height"]
        indptr = csr.indptr.astype(np.int64)
        row_lengths = np.diff(indptr)
        if self.params["sigma"] == "auto":
            self.params["sigma"] = auto_sigma(row_lengths, C)
        elif _is_int(self.params["sigma"]):
            self.params["sigma"] = int(self.params["sigma"])
        perm = sort_permutation(row_lengths, self.params["sigma"])
        self._has_perm = not np.array_equal(perm, np.arange(m))

        # Slice widths from the sorted lengths; rows past m (last slice) have length 0.
        self.n_slices = -(-m // C)
        sorted_lengths = np.zeros(self.n_slices * C, dtype=np.int64)
        sorted_lengths[:m] = row_lengths[perm]
        slice_widths = sorted_lengths.reshape(self.n_slices, C).max(axis=1, initial=0)
        slice_ptr = np.zeros(self.n_slices + 1, dtype=np.int64)
        np.cumsum(slice_widths * C, out=slice_ptr[1:])
        self._check_index_width(int(slice_ptr[-1]))

        # Entry j of CSR (the k-th of row r) goes to slot slice_ptr[s] + k*C + lane, where
        # position[r] = s*C + lane is where the sort put r; with k = j - indptr[r] that
        # is a per-row base plus j*C.
        position = np.arange(m, dtype=np.int64)
        if self._has_perm:
            position[perm] = position.copy()
        row_base = slice_ptr[position // C] + position % C - indptr[:-1] * C
        slot = np.arange(0, csr.nnz * C, C, dtype=np.int64)
        slot += np.repeat(row_base, row_lengths)
        col_idx = np.full(int(slice_ptr[-1]), -1, dtype=self.index_dtype)
        values = np.zeros(int(slice_ptr[-1]), dtype=self.dtype)
        col_idx[slot] = csr.indices
        values[slot] = csr.data
        arrays = {"slice_ptr": slice_ptr.astype(self.index_dtype),
                  "col_idx": col_idx, "values": values}
        if self._has_perm:
            arrays["perm"] = perm.astype(self.index_dtype)
        return arrays

    def _check_index_width(self, n_slots):
        """Padding can push the slot count past 32 bits where nnz alone fits."""
        if self.index_dtype == np.int64 or n_slots <= _INT32_LIMIT:
            return
        if self._index_bits_asked == 32:
            raise IndexOverflowError(
                f"sell: the padded slices hold {n_slots} slots, more than 32-bit indices "
                f"address ({_INT32_LIMIT}): use index_bits=64, a larger sigma or a smaller "
                f"slice_height")
        self.index_dtype = np.dtype(np.int64)
        self.params["index_bits"] = 64

    # -- kernel ---------------------------------------------------------------------------
    def _template_params(self):
        p = self.params
        return {"slice_height": p["slice_height"], "mapping": p["mapping"],
                "threads_per_row": p["threads_per_row"], "has_perm": self._has_perm}

    def _local_bytes(self, work_group_size):
        if self.params["mapping"] == "rows" and self.params["threads_per_row"] > 1:
            return work_group_size * self.dtype.itemsize
        return 0

    def _min_work_group_size(self):
        if self.params["mapping"] == "rows":
            return self.params["slice_height"] * self.params["threads_per_row"]
        return 1

    def _kernel_args(self, x_buf, y_buf, alpha, beta):
        b = self.buffers
        args = [np.int64(self.shape[0]), np.int64(self.n_slices),
                b["slice_ptr"], b["col_idx"], b["values"]]
        if self._has_perm:
            args.append(b["perm"])
        return (*args, x_buf, y_buf, alpha, beta)

    def _launch_geometry(self):
        wg = self.params["work_group_size"]
        if self.params["mapping"] == "rows":
            slices_per_group = wg // (self.params["slice_height"]
                                      * self.params["threads_per_row"])
        else:
            slices_per_group = wg
        return max(1, -(-self.n_slices // slices_per_group)) * wg, wg
