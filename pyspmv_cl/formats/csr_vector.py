"""``csr-vector``: CSR read by groups of work-items.

``mapping="rows"`` (default): Bell & Garland's vector kernel, generalised from one warp
to ``vector_size`` = 2...64 work-items per row.

``mapping="adaptive"``: after Greathouse & Daga's CSR-Adaptive (SC14).  The host cuts
the rows into blocks (``row_blocks``), one work-group each:

- the group reads the block's entries consecutively (coalesced ``values``/``col_idx``,
  and neighbouring entries gather neighbouring ``x``), ``work_group_size *
  items_per_thread`` products at a time, into local memory;
- each row is then added up from there by as many work-items as the group holds per
  row (a power of two: one each for a block of ``work_group_size`` short rows, all of
  them for a row longer than a window, which is a block of its own), and their partial
  sums are combined (``reduction``).

Blocks are cut, without a loop over rows, where a row's first entry enters a new window
of ``work_group_size * items_per_thread`` entries, every ``work_group_size`` rows (one
work-item per row), and around long rows.  One launch; no scratch.
"""

import numpy as np

from .base import launch_rows, pow2_floor
from .csr_common import CSRFormatBase

VECTOR_SIZES = (2, 4, 8, 16, 32, 64)
MAPPINGS = ("rows", "adaptive")
MAX_ITEMS_PER_THREAD = 32
ADAPTIVE_MAX_WINDOWS = 8
# The adaptive mapping's default shape (work-group size, entries per work-item).
ADAPTIVE_DEFAULT = {"work_group_size": 128, "items_per_thread": 8}


def vector_size_for(mean_row_length, simd_lanes):
    """Smallest power of two covering the mean row length, between 2 and the device's
    SIMD width (64 at most): short rows do not leave most of a group idle, long rows
    use a whole warp/wavefront."""
    upper = max(2, min(64, pow2_floor(max(2, simd_lanes))))
    size = 2
    while size < mean_row_length and size < upper:
        size *= 2
    return size


def adaptive_row_blocks(indptr, rows_per_block, window):
    """First row of each block, then the number of rows (CSR-Adaptive's row blocks).

    A block starts at row 0, where a row's first entry lies in another ``window`` of
    entries than the previous row's, every ``rows_per_block`` rows, and at a row longer
    than ``window`` and the row after it.  So a block of several rows holds at most
    ``rows_per_block`` rows and fewer than ``2 * window`` entries."""
    indptr = np.asarray(indptr, dtype=np.int64)
    m = indptr.size - 1
    if m <= 0:
        return np.zeros(1, dtype=np.int64)
    starts, lengths = indptr[:-1], np.diff(indptr)
    long = lengths > window
    rows = np.arange(m, dtype=np.int64)
    cut = np.empty(m, dtype=bool)
    cut[0] = True
    cut[1:] = ((starts[1:] // window != starts[:-1] // window)
               | (rows[1:] // rows_per_block != rows[:-1] // rows_per_block)
               | long[1:] | long[:-1])
    return np.append(np.flatnonzero(cut), m)


class CSRVector(CSRFormatBase):
    name = "csr-vector"
    template = "csr_vector.mako"
    kernel_name = "csr_vector"
    param_names = ("vector_size", "work_group_size", "reduction", "mapping",
                   "items_per_thread")

    @classmethod
    def default_params(cls, features, profile, dtype):
        vector_size = vector_size_for(features.mean_row_length, profile.lanes(dtype))
        wg = 128 if profile.is_gpu else 64
        wg = max(vector_size, min(wg, profile.max_work_group_size))
        # Barriers are cheap on GPUs (tree) and costly on CPUs (one barrier, serial sum).
        reduction = "serial" if profile.is_cpu else "tree"
        return {"vector_size": vector_size, "work_group_size": wg, "reduction": reduction,
                "mapping": "rows", "items_per_thread": None}

    @classmethod
    def resolve_params(cls, features, profile, dtype, user_params):
        """With ``mapping="adaptive"`` the defaults become a group of 128 (at most the
        device's), 8 entries per work-item, and no vector size: the best of four
        shapes on an H200 for astro-ph, Groebner_id2003_aug and cage10 (x32)."""
        params = super().resolve_params(features, profile, dtype, user_params)
        if params["mapping"] == "adaptive":
            given = {k for k, v in user_params.items() if v is not None}
            if "vector_size" not in given:
                params["vector_size"] = None
            if "work_group_size" not in given:
                params["work_group_size"] = pow2_floor(
                    min(ADAPTIVE_DEFAULT["work_group_size"], profile.max_work_group_size))
            if "items_per_thread" not in given:
                params["items_per_thread"] = ADAPTIVE_DEFAULT["items_per_thread"]
        return params

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """The default vector size, half and a quarter of it (at least 2): on an H200,
        rows of 14.5 entries on average (astro-ph) ran in 55 us with 4 work-items per
        row against 73 us with the default 16, the longer rows then taking a few turns.

        GPUs also get the adaptive mapping, in its default shape and with groups of 256
        and 4 entries per work-item (rajat01 x32: 31 against 40 us), unless the longest
        row would take one group more than ``ADAPTIVE_MAX_WINDOWS`` windows (a power-law
        graph's hub rows: 1.2-3.7 ms against csr5's 0.13).  The adaptive default then
        comes first: the tuner's first pass times each format's first candidate only,
        and on an H200 it beat the row mapping on 4 of 5 irregular matrices."""
        vs = cls.default_params(features, profile, dtype)["vector_size"]
        rows = [{}] + [{"vector_size": v} for v in (vs // 2, vs // 4) if v >= 2]
        adaptive = []
        if profile.is_gpu:
            for shape in ({}, {"work_group_size": 256, "items_per_thread": 4}):
                full = {**ADAPTIVE_DEFAULT, **shape}
                if full["work_group_size"] > profile.max_work_group_size:
                    continue
                window = full["work_group_size"] * full["items_per_thread"]
                if features.max_row_length <= ADAPTIVE_MAX_WINDOWS * window:
                    adaptive.append({"mapping": "adaptive", **shape})
        if not adaptive:
            return rows
        # Adaptive default, the row default, the other adaptive shape, narrower vectors.
        return adaptive[:1] + rows[:1] + adaptive[1:] + rows[1:]

    def __init__(self, csr, device, dtype, params):
        mapping = params.get("mapping")
        if mapping not in MAPPINGS:
            raise ValueError(f"csr-vector: mapping must be one of {MAPPINGS}, not {mapping!r}")
        if params.get("reduction") not in ("tree", "serial"):
            raise ValueError(f"csr-vector: reduction must be 'tree' or 'serial', not "
                             f"{params.get('reduction')!r}")
        if mapping == "rows":
            self._check_rows_params(params)
        else:
            self._check_adaptive_params(params)
        super().__init__(csr, device, dtype, params)

    @staticmethod
    def _check_rows_params(params):
        vs = params.get("vector_size")
        if vs not in VECTOR_SIZES:
            raise ValueError(f"csr-vector: vector_size must be one of {VECTOR_SIZES}, not {vs!r}")
        wg = params.get("work_group_size")
        if isinstance(wg, int) and (wg < vs or wg % vs):
            raise ValueError(f"csr-vector: work_group_size must be a multiple of vector_size "
                             f"({vs}), not {wg!r}")
        if params.get("items_per_thread") is not None:
            raise ValueError("csr-vector: items_per_thread belongs to mapping='adaptive'")

    @staticmethod
    def _check_adaptive_params(params):
        if params.get("vector_size") is not None:
            raise ValueError("csr-vector: mapping='adaptive' takes no vector_size (the whole "
                             "work-group reads each block)")
        items = params.get("items_per_thread")
        if (isinstance(items, bool) or not isinstance(items, (int, np.integer))
                or not 1 <= items <= MAX_ITEMS_PER_THREAD):
            raise ValueError(f"csr-vector: items_per_thread must be an integer in 1.."
                             f"{MAX_ITEMS_PER_THREAD}, not {items!r}")
        params["items_per_thread"] = int(items)
        wg = params.get("work_group_size")
        if isinstance(wg, (int, np.integer)) and not isinstance(wg, bool) and wg & (wg - 1):
            raise ValueError(f"csr-vector: mapping='adaptive' needs a power-of-two "
                             f"work_group_size, not {wg}")

    @property
    def _adaptive(self):
        return self.params["mapping"] == "adaptive"

    def _template_params(self):
        return {"vector_size": self.params["vector_size"], "reduction": self.params["reduction"],
                "mapping": self.params["mapping"],
                "items_per_thread": self.params["items_per_thread"]}

    def _local_bytes(self, work_group_size):
        items = self.params["items_per_thread"] if self._adaptive else 1
        return work_group_size * items * self.dtype.itemsize

    def _min_work_group_size(self):
        return 1 if self._adaptive else self.params["vector_size"]

    def _convert(self, csr):
        arrays = super()._convert(csr)
        if self._adaptive:
            # Kernels first: the blocks hold at most one row per work-item of the group
            # the device accepts.
            self.kernel()
            wg = self.params["work_group_size"]
            blocks = adaptive_row_blocks(csr.indptr, wg, wg * self.params["items_per_thread"])
            self.n_blocks = blocks.size - 1
            arrays["row_blocks"] = blocks.astype(self.index_dtype)
        return arrays

    def _kernel_args(self, x_buf, y_buf, alpha, beta):
        if not self._adaptive:
            return super()._kernel_args(x_buf, y_buf, alpha, beta)
        b = self.buffers
        return (b["row_blocks"], b["row_ptr"], b["col_idx"], b["values"], x_buf, y_buf,
                alpha, beta)

    def launches(self, x_buf, y_buf, alpha, beta):
        if self._adaptive and self.n_blocks == 0:   # no rows: nothing to launch
            return []
        return super().launches(x_buf, y_buf, alpha, beta)

    def _launch_geometry(self):
        wg = self.params["work_group_size"]
        if self._adaptive:
            return self.n_blocks * wg, wg
        return launch_rows(self.shape[0], wg // self.params["vector_size"], wg)
