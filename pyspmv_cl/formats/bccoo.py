"""``bccoo``: yaSpMV's blocked compressed COO (Yan et al., PPoPP'14), and BCCOO+ when
``slices > 1``.

Non-zero blocks of ``block_height x block_width`` in row-major order; the row index is
replaced by a bit-flag array (0 = row stop) in uchar/ushort/uint words; one value array
per block row; block-column indices as ushort while the matrix is narrower than 65535
(else int), optionally delta-compressed per thread tile into short with a -1 escape.
BCCOO+ cuts the matrix into ``slices`` vertical slices stacked top-down (original column
indices kept); a second kernel adds the slices' partial results.

The product is the paper's matrix-based segmented sum (see templates/bccoo.mako) with
strategy 1 (per-thread intermediate sums) or 2 (per-group result cache in local
memory).  Carries across work-groups go through a second kernel rather than the paper's
adjacent synchronisation (a spin on the previous group, GPU-only: not built).
"""

import numpy as np
import pyopencl as cl

from .. import codegen
from .base import Launch, SpMVFormat, pow2_floor
from .bccoo_convert import (
    FLAG_TYPES,
    USHORT_COLS_LIMIT,
    build_blocks,
    count_blocks,
    footprint_bytes,
    layout,
    tile_geometry,
)

BLOCK_HEIGHTS = (1, 2, 3, 4)
BLOCK_WIDTHS = (1, 2, 4)
FLAG_BITS = (8, 16, 32)
MAX_SLICES = 32
MAX_TILE = 256
MAX_CACHE = 4   # result cache, in multiples of the work-group size (paper: 1..4)
SCANS = ("tree", "serial")
AUX_WORK_GROUP_SIZE = 64
FLAG_C_TYPES = {8: "uchar", 16: "ushort", 32: "uint"}
# Candidates the tuner times: the block shapes of the smallest footprints (paper, sec. 4).
N_SHAPE_CANDIDATES = 4
# Block shapes are ranked on a sample of about this many non-zeros (whole row bands
# spread over the matrix): counting blocks of 12 shapes on all of a 5M-nnz matrix took
# 40 s, and the ranking only needs the relative sizes.
SHAPE_SAMPLE_NNZ = 1 << 18
SHAPE_SAMPLE_BANDS = 8


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _col_dtype(n_cols, index_dtype, col_compress):
    if n_cols < USHORT_COLS_LIMIT and not col_compress:
        return np.dtype(np.uint16)
    return np.dtype(index_dtype)


class BCCOO(SpMVFormat):
    name = "bccoo"
    template = "bccoo.mako"
    param_names = ("block_height", "block_width", "flag_bits", "slices", "strategy",
                   "tile_size", "work_group_size", "transpose", "col_compress",
                   "result_cache", "scan")

    # -- parameters -------------------------------------------------------------
    @classmethod
    def default_params(cls, features, profile, dtype):
        """GPUs: groups of 256, tiles of 16 blocks (8 in float64) read transposed
        (coalesced), one ushort of flags per thread, tree scan.  CPUs (PoCL runs a
        group as a loop; barriers split it): small groups, long contiguous tiles, uint
        flags, one serial scan.  Strategy 2 (result cache) for long rows, and always on
        CPUs."""
        if profile.is_gpu:
            wg = min(256, profile.max_work_group_size)
            tile = 8 if np.dtype(dtype) == np.float64 else 16
            params = {"work_group_size": wg, "tile_size": tile, "flag_bits": 16,
                      "transpose": True, "scan": "tree"}
        else:
            wg = min(16, profile.max_work_group_size)
            params = {"work_group_size": wg, "tile_size": 64, "flag_bits": 32,
                      "transpose": False, "scan": "serial"}
        # CPUs: strategy 1's per-thread sums, live across the barrier, are kept by PoCL
        # in per-work-item context arrays (measured 2-3x slower than strategy 2).
        long_rows = features.mean_row_length >= params["tile_size"]
        strategy = 2 if long_rows or not profile.is_gpu else 1
        params.update(block_height=1, block_width=1, slices=1, strategy=strategy,
                      col_compress=False, result_cache=1)
        return params

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """The paper's pruning: the ``N_SHAPE_CANDIDATES`` block shapes with the smallest
        footprint, other parameters at their defaults.  Needs the matrix (``csr=``) to
        count blocks; without it only the defaults are offered."""
        if csr is None or features.nnz == 0:
            return [{}]
        defaults = cls.default_params(features, profile, dtype)
        sizes = cls.block_footprints(_row_band_sample(csr), dtype, tile_size=defaults["tile_size"],
                                     work_group_size=defaults["work_group_size"],
                                     flag_bits=defaults["flag_bits"])
        best = sorted(sizes, key=lambda shape: (sizes[shape], shape))[:N_SHAPE_CANDIDATES]
        out = [{"block_height": h, "block_width": w} for h, w in best]
        if profile.is_gpu:
            # The other tile size of the smallest shape, second (the tuner times the
            # first few alternatives only): on an H200, astro-ph x32 ran in 43.6 us with
            # tiles of 8 against 50.7 us with the float32 default of 16.
            other = 8 if defaults["tile_size"] == 16 else 16
            out.insert(1, dict(out[0], tile_size=other))
        return out

    @staticmethod
    def footprint(csr, block_height=1, block_width=1, dtype=np.float32, *, slices=1,
                  tile_size=16, work_group_size=256, flag_bits=16, col_compress=False,
                  index_bits=32):
        """Bytes of the format's arrays (what ``nbytes`` reports) for this block shape,
        without building anything on a device: the paper's footprint (Table 3)."""
        n_blocks, n_dummies = count_blocks(csr, block_height, block_width, slices)
        index_dtype = np.dtype(np.int64 if index_bits == 64 else np.int32)
        col_bytes = _col_dtype(csr.shape[1], index_dtype, col_compress).itemsize
        nb_pad = tile_geometry(n_blocks + n_dummies, tile_size, work_group_size)[0]
        pos_bytes = _pos_dtype(csr.shape[0], nb_pad, block_height, block_width, slices,
                               index_dtype).itemsize
        return footprint_bytes(n_blocks + n_dummies, block_height, block_width,
                               itemsize=np.dtype(dtype).itemsize, tile_size=tile_size,
                               work_group_size=work_group_size, flag_bits=flag_bits,
                               col_bytes=col_bytes, col_compress=col_compress,
                               pos_bytes=pos_bytes)

    @classmethod
    def block_footprints(cls, csr, dtype=np.float32, **kw):
        """``{(block_height, block_width): bytes}`` over every shape the paper tunes."""
        return {(h, w): cls.footprint(csr, h, w, dtype, **kw)
                for h in BLOCK_HEIGHTS for w in BLOCK_WIDTHS}

    @classmethod
    def check_params(cls, params):
        def choice(key, allowed):
            if params.get(key) not in allowed or isinstance(params.get(key), bool):
                raise ValueError(f"bccoo: {key} must be one of {allowed}, not "
                                 f"{params.get(key)!r}")

        choice("block_height", BLOCK_HEIGHTS)
        choice("block_width", BLOCK_WIDTHS)
        choice("flag_bits", FLAG_BITS)
        choice("strategy", (1, 2))
        choice("scan", SCANS)
        for key, hi in (("slices", MAX_SLICES), ("tile_size", MAX_TILE),
                        ("result_cache", MAX_CACHE)):
            v = params.get(key)
            if not _is_int(v) or not 1 <= v <= hi:
                raise ValueError(f"bccoo: {key} must be an integer in 1..{hi}, not {v!r}")
            params[key] = int(v)
        for key in ("transpose", "col_compress"):
            v = params.get(key)
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"bccoo: {key} must be True or False, not {v!r}")
            params[key] = bool(v)

    # -- construction ------------------------------------------------------------
    def __init__(self, csr, device, dtype, params):
        self.check_params(params)
        super().__init__(csr, device, dtype, params)
        self._allocate_scratch()

    def _local_bytes(self, work_group_size):
        p = self.params
        rows = work_group_size * (1 + (p["result_cache"] if p["strategy"] == 2 else 0))
        return rows * p["block_height"] * self.dtype.itemsize + work_group_size

    def _convert(self, csr):
        p = self.params
        h, w, S = p["block_height"], p["block_width"], p["slices"]
        self.blocks = build_blocks(csr, h, w, S, self.dtype)
        nb_upper = tile_geometry(self.blocks.n_blocks, p["tile_size"],
                                 p["work_group_size"])[0]
        self.pos_dtype = _pos_dtype(csr.shape[0], nb_upper, h, w, S, self.index_dtype)
        self.col_dtype = _col_dtype(csr.shape[1], self.index_dtype, p["col_compress"])
        self._build()   # may shrink the work-group size, which the layout depends on
        arrays, self.geometry = layout(
            self.blocks, tile_size=p["tile_size"], work_group_size=p["work_group_size"],
            flag_bits=p["flag_bits"], transpose=p["transpose"],
            col_compress=p["col_compress"], col_dtype=self.col_dtype,
            pos_dtype=self.pos_dtype, dtype=self.dtype)
        del self.blocks
        return arrays

    def _build(self):
        p = self.params
        kernels = ["bccoo_tiles", "bccoo_carries"] + (["bccoo_combine"] if p["slices"] > 1
                                                      else [])
        self._bccoo_kernels, wg = self.build_kernels(
            self.template, kernels, p["work_group_size"],
            pos_t=codegen.c_type(self.pos_dtype), flag_t=FLAG_C_TYPES[p["flag_bits"]],
            col_t="ushort" if self.col_dtype == np.uint16 else codegen.c_type(self.col_dtype),
            tile_size=p["tile_size"], block_height=p["block_height"],
            block_width=p["block_width"], flag_bits=p["flag_bits"],
            n_words=-(-p["tile_size"] // p["flag_bits"]), strategy=p["strategy"],
            cache_rows=p["result_cache"] * p["work_group_size"], scan=p["scan"],
            transpose=p["transpose"], col_compress=p["col_compress"],
            sliced=p["slices"] > 1, slices=p["slices"])
        if wg != p["work_group_size"]:
            p["work_group_size"] = wg
            self._build()   # the cache size is a multiple of the group size: re-render

    def _allocate_scratch(self):
        """Per-group head/tail sums and, for BCCOO+, the slices' partial results."""
        ctx, rw = self.device.context, cl.mem_flags.READ_WRITE
        h, real = self.params["block_height"], self.dtype.itemsize
        n_groups = self.geometry["n_groups"]
        self.head_vals = cl.Buffer(ctx, rw, max(1, n_groups * h) * real)
        self.tail_vals = cl.Buffer(ctx, rw, max(1, n_groups * h) * real)
        self.slice_stride = -(-self.shape[0] // h) * h
        self.partial = None
        if self.params["slices"] > 1:
            n = self.params["slices"] * self.slice_stride
            self.partial = cl.Buffer(ctx, rw, max(1, n) * real)
        self.scratch_nbytes = 2 * n_groups * h * real + (
            self.params["slices"] * self.slice_stride * real if self.partial else 0)

    def kernel(self):
        return self._bccoo_kernels

    def launches(self, x_buf, y_buf, alpha, beta):
        p, g = self.params, self.geometry
        m = self.shape[0]
        if g["n_groups"] == 0:   # m == 0: nothing to do
            return []
        sliced = p["slices"] > 1
        out = self.partial if sliced else y_buf
        pos = self.pos_dtype.type
        b = self.buffers
        args = [pos(m), pos(g["n_blocks_padded"] * p["block_width"]), b["flags"]]
        if p["col_compress"]:
            args.append(b["col_delta"])
        args += [b["cols"], b["values"], b["first_entry"], b["group_full"], x_buf, out,
                 self.head_vals, self.tail_vals, alpha, beta]
        wg = p["work_group_size"]
        aux = min(AUX_WORK_GROUP_SIZE, pow2_floor(self.profile.max_work_group_size))
        kernels = self._bccoo_kernels
        plan = [Launch(kernels["bccoo_tiles"], tuple(args), g["n_groups"] * wg, wg),
                Launch(kernels["bccoo_carries"], (
                    pos(g["n_groups"]), pos(m), b["first_entry"], self.head_vals,
                    self.tail_vals, out, alpha, beta), _round_up(g["n_groups"], aux), aux)]
        if sliced:
            plan.append(Launch(kernels["bccoo_combine"], (
                pos(m), pos(self.slice_stride), self.partial, y_buf, alpha, beta),
                _round_up(m, aux), aux))
        return plan


def _round_up(n, k):
    return max(1, -(-int(n) // k)) * k


def _pos_dtype(n_rows, nb_pad, h, w, slices, index_dtype):
    """Block positions, value offsets and (rearranged) rows in 32 bits while they fit."""
    biggest = max(nb_pad * h * w, slices * (-(-n_rows // h) + 1) * h, nb_pad + 1)
    if np.dtype(index_dtype) == np.int64 or biggest > 2**31 - 1 - 65536:
        return np.dtype(np.int64)
    return np.dtype(np.int32)


assert set(FLAG_BITS) == set(FLAG_TYPES)


def _row_band_sample(csr):
    """``csr`` itself when small, else SHAPE_SAMPLE_BANDS evenly spread bands of rows
    (starting at multiples of 12, so every block height tiles them as in the matrix)
    holding about SHAPE_SAMPLE_NNZ non-zeros in all."""
    m = csr.shape[0]
    if csr.nnz <= SHAPE_SAMPLE_NNZ:
        return csr
    band = max(12, m * SHAPE_SAMPLE_NNZ // csr.nnz // SHAPE_SAMPLE_BANDS // 12 * 12)
    if band * SHAPE_SAMPLE_BANDS >= m:
        return csr
    starts = np.linspace(0, m - band, SHAPE_SAMPLE_BANDS).astype(np.int64) // 12 * 12
    rows = (starts[:, None] + np.arange(band)[None, :]).ravel()
    return csr[rows]
