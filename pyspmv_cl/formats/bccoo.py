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
import pyopencl.array as cla

from .. import codegen
from ..codegen import ALPHA_ARG, BETA_ARG, X_ARG, Y_ARG, KernelSpec, matrix, scalar, scratch
from ..device_inputs import DeviceCSR
from . import bccoo_device
from . import params as P
from .base import SpMVFormat, pow2_floor, round_up
from .bccoo_convert import (
    FLAG_TYPES,
    USHORT_COLS_LIMIT,
    build_blocks,
    count_blocks,
    footprint_bytes,
    layout,
    tile_geometry,
)
from .registry import register

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


def _col_dtype(n_cols, index_dtype, col_compress):
    if n_cols < USHORT_COLS_LIMIT and not col_compress:
        return np.dtype(np.uint16)
    return np.dtype(index_dtype)


def scratch_bytes(n_rows, n_groups, block_height, slices, itemsize):
    """Bytes of the device work buffers: each group's head and tail sums (one per block
    row), and for BCCOO+ the slices' partial results."""
    h = block_height
    total = 2 * n_groups * h * itemsize
    if slices > 1:
        total += slices * _slice_stride(n_rows, h) * itemsize
    return int(total)


def _slice_stride(n_rows, block_height):
    """Rows of one slice's partial results (whole block rows)."""
    return -(-int(n_rows) // block_height) * block_height


@register
class BCCOO(SpMVFormat):
    name = "bccoo"
    complex_values = True
    order = 10
    template = "bccoo.mako"
    # The GPU default (1 x 1 blocks, one slice, real values, rows in order) converts on
    # the device (formats/bccoo_device.py); anything else is read back to the host.
    converts_on_device = True
    host_input_on_device = True
    signed_stored_zeros = True   # fill is +0.0 (bccoo_convert.py)
    params = (
        P.Param("block_height", P.one_of(*BLOCK_HEIGHTS), "rows of a block"),
        P.Param("block_width", P.one_of(*BLOCK_WIDTHS), "columns of a block"),
        P.Param("flag_bits", P.one_of(*FLAG_BITS), "bits of a bit-flag word"),
        P.Param("slices", P.integer(1, MAX_SLICES), "vertical slices (BCCOO+ when > 1)"),
        P.Param("strategy", P.one_of(1, 2),
                "1: per-thread intermediate sums; 2: per-group result cache"),
        P.Param("tile_size", P.integer(1, MAX_TILE), "blocks per work-item"),
        P.work_group_size(),
        P.Param("transpose", P.boolean(), "tiles stored transposed (coalesced on GPUs)"),
        P.Param("col_compress", P.boolean(), "block columns delta-compressed into short"),
        P.Param("result_cache", P.integer(1, MAX_CACHE),
                "strategy 2's cache rows, in multiples of the work-group size"),
        P.Param("scan", P.one_of(*SCANS), "the segmented scan of the threads' tails"),
    )

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
        """Bytes of the format's arrays and scratch buffers (what ``nbytes`` reports) for
        this block shape, without building anything on a device: the paper's footprint
        (Table 3), plus the per-group carries and BCCOO+'s partial results."""
        n_blocks, n_dummies = count_blocks(csr, block_height, block_width, slices)
        index_dtype = np.dtype(np.int64 if index_bits == 64 else np.int32)
        col_bytes = _col_dtype(csr.shape[1], index_dtype, col_compress).itemsize
        nb_pad = tile_geometry(n_blocks + n_dummies, tile_size, work_group_size)[0]
        pos_bytes = _pos_dtype(csr.shape[0], nb_pad, block_height, block_width, slices,
                               index_dtype).itemsize
        itemsize = np.dtype(dtype).itemsize
        n_groups = tile_geometry(n_blocks + n_dummies, tile_size, work_group_size)[2]
        return footprint_bytes(n_blocks + n_dummies, block_height, block_width,
                               itemsize=itemsize, tile_size=tile_size,
                               work_group_size=work_group_size, flag_bits=flag_bits,
                               col_bytes=col_bytes, col_compress=col_compress,
                               pos_bytes=pos_bytes) + scratch_bytes(
            csr.shape[0], n_groups, block_height, slices, itemsize)

    @classmethod
    def block_footprints(cls, csr, dtype=np.float32, **kw):
        """``{(block_height, block_width): bytes}`` over every shape the paper tunes."""
        return {(h, w): cls.footprint(csr, h, w, dtype, **kw)
                for h in BLOCK_HEIGHTS for w in BLOCK_WIDTHS}

    # -- construction --------------------------------------------------------------------
    def analyse(self, csr):
        """The blocks (on the device: only how many there are, from ``indptr``), and
        from them the position and column types the kernels are written with (the
        layout waits for the final work-group size)."""
        p = self.params
        h, w, S = p["block_height"], p["block_width"], p["slices"]
        # (update_values analyses a host copy of a device-converted operator.)
        on_device = isinstance(csr, DeviceCSR)
        if on_device and not (csr.nnz and bccoo_device.applies(p, self.dtype)):
            self.converting_on_device = on_device = False
            self._blocks = bccoo_device.host_blocks(self, csr)
        if on_device:
            n_blocks, self._first_block = bccoo_device.first_blocks(csr.indptr)
        else:
            if not isinstance(csr, DeviceCSR):
                self._blocks = build_blocks(csr, h, w, S, self.dtype)
            n_blocks = self._blocks.n_blocks
        self._n_blocks = n_blocks
        # The group size may still shrink in the build: padding to today's is an upper
        # bound of the positions.
        nb_upper = tile_geometry(n_blocks, p["tile_size"], p["work_group_size"])[0]
        self.pos_dtype = _pos_dtype(csr.shape[0], nb_upper, h, w, S, self.index_dtype)
        self.col_dtype = _col_dtype(csr.shape[1], self.index_dtype, p["col_compress"])
        self.slice_stride = _slice_stride(self.shape[0], h)

    @classmethod
    def device_conversion_takes(cls, csr, params, dtype):
        """A host matrix goes up as CSR for the device conversion only when that applies
        (its rows in order: scipy's canonical format)."""
        # (A matrix on the device has its rows checked there.)
        return bccoo_device.applies(params, dtype) and csr.nnz > 0 and \
            bool(getattr(csr, "has_canonical_format", True))

    def programs(self):
        conversion = [bccoo_device.program(self)] if self.converting_on_device else []
        return [*super().programs(), *conversion]

    def template_params(self):
        p = self.params
        return {
            "pos_t": codegen.c_type(self.pos_dtype), "flag_t": FLAG_C_TYPES[p["flag_bits"]],
            "col_t": "ushort" if self.col_dtype == np.uint16 else codegen.c_type(
                self.col_dtype),
            "tile_size": p["tile_size"], "block_height": p["block_height"],
            "block_width": p["block_width"], "flag_bits": p["flag_bits"],
            "n_words": -(-p["tile_size"] // p["flag_bits"]), "strategy": p["strategy"],
            # The cache is a multiple of the group size: rendered again when it shrinks.
            "cache_rows": p["result_cache"] * p["work_group_size"], "scan": p["scan"],
            "transpose": p["transpose"], "col_compress": p["col_compress"],
            "sliced": p["slices"] > 1, "slices": p["slices"],
            # Block values (and full-width columns) through common.mako's
            # STREAMV/STREAMI: on an H100 (20M non-zeros, same process) 1-16% faster in
            # every case measured (cage10 float32 93.9 -> 80.9 us, astro-ph float32
            # 109.2 -> 99.7, rajat01 float32 106.0 -> 96.9).
            "streamed_loads": self.streamed_loads_ok()}

    def type_names(self):
        return {"pos_t": self.pos_dtype}

    def kernel_specs(self):
        p = self.params
        first_entry = matrix("first_entry", "pos_t")
        head, tail = scratch("head_vals"), scratch("tail_vals")
        tiles = (scalar("n_rows", "pos_t"), scalar("value_stride", "pos_t"),
                 matrix("flags", "flag_t"),
                 *((matrix("col_delta", "short"),) if p["col_compress"] else ()),
                 matrix("cols", "col_t"), matrix("values", "real_t"), first_entry,
                 matrix("group_full", "uchar"), X_ARG, Y_ARG, head, tail, ALPHA_ARG, BETA_ARG)
        specs = [KernelSpec("bccoo_tiles", tiles, fixed_group=True),
                 KernelSpec("bccoo_carries", (
                     scalar("n_groups", "pos_t"), scalar("n_rows", "pos_t"), first_entry,
                     scratch("head_vals", read_only=True), scratch("tail_vals", read_only=True),
                     Y_ARG, ALPHA_ARG, BETA_ARG))]
        if p["slices"] > 1:
            specs.append(KernelSpec("bccoo_combine", (
                scalar("n_rows", "pos_t"), scalar("slice_stride", "pos_t"),
                scratch("partial", read_only=True), Y_ARG, ALPHA_ARG, BETA_ARG)))
        return specs

    def local_bytes(self, work_group_size):
        p = self.params
        rows = work_group_size * (1 + (p["result_cache"] if p["strategy"] == 2 else 0))
        return rows * p["block_height"] * self.dtype.itemsize + work_group_size

    def convert(self, csr):
        p = self.params
        arrays, self.geometry = layout(
            self._blocks, tile_size=p["tile_size"], work_group_size=p["work_group_size"],
            flag_bits=p["flag_bits"], transpose=p["transpose"],
            col_compress=p["col_compress"], col_dtype=self.col_dtype,
            pos_dtype=self.pos_dtype, dtype=self.dtype)
        del self._blocks
        return arrays

    def convert_device(self, csr):
        arrays = bccoo_device.convert(self, csr, self._n_blocks, self._first_block)
        del self._first_block
        if arrays is None:   # a row out of order: the host conversion, uploaded
            self._blocks = bccoo_device.host_blocks(self, csr)
            arrays = {name: cla.to_device(self.device.queue, arr)
                      for name, arr in self.convert(csr).items()}
        return arrays

    def scratch_sizes(self):
        """Per-group head/tail sums and, for BCCOO+, the slices' partial results."""
        p, real = self.params, self.dtype.itemsize
        h, n_groups = p["block_height"], self.geometry["n_groups"]
        sizes = {"head_vals": n_groups * h * real, "tail_vals": n_groups * h * real}
        if p["slices"] > 1:
            sizes["partial"] = p["slices"] * self.slice_stride * real
        assert sum(sizes.values()) == scratch_bytes(self.shape[0], n_groups, h, p["slices"],
                                                    real)
        return sizes

    # -- launching ------------------------------------------------------------------------
    def launches(self, beta):
        p, g = self.params, self.geometry
        m = self.shape[0]
        if g["n_groups"] == 0:   # m == 0: nothing to do
            return []
        # BCCOO+: the tiles and carries write the slices' partial results, which the
        # combine kernel adds into y.
        out = {"y": self.scratch["partial"]} if p["slices"] > 1 else {}
        wg = p["work_group_size"]
        aux = min(AUX_WORK_GROUP_SIZE, pow2_floor(self.profile.max_work_group_size))
        plan = [self.step("bccoo_tiles", g["n_groups"] * wg, wg, n_rows=m,
                          value_stride=g["n_blocks_padded"] * p["block_width"], **out),
                self.step("bccoo_carries", round_up(g["n_groups"], aux), aux,
                          n_groups=g["n_groups"], n_rows=m, **out)]
        if p["slices"] > 1:
            plan.append(self.step("bccoo_combine", round_up(m, aux), aux, n_rows=m,
                                  slice_stride=self.slice_stride))
        return plan


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
