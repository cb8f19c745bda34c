"""``csr5``: CSR5 (Liu & Vinter, ICS'15).  The non-zeros are cut into 2-D tiles of
``omega`` columns (one work-item each) by ``sigma`` rows; column ``i`` of a tile holds
the tile's CSR entries ``i*sigma ... i*sigma + sigma - 1``, stored transposed in place
(entry ``j`` of column ``i`` at ``j*omega + i``) so neighbouring work-items read
neighbouring words.  The arrays are the paper's five groups:

* ``row_ptr``, ``col_idx``, ``values``: CSR, with the complete tiles transposed; the
  incomplete last tile stays in CSR order and is handled row by row;
* ``tile_ptr`` (p + 1, unsigned): the row holding each tile's first non-zero, with the
  sign bit set when empty rows lie between it and the next tile's first row;
* ``tile_desc``: per column, ``y_offset`` (segments started in earlier columns),
  ``seg_offset`` (columns to the right without a row start) and ``sigma`` bits of
  ``bit_flag`` (row starts; the tile's first entry always flagged), packed as bit
  fields into ``desc_words`` 32-bit words per column (one when they fit, as in the
  paper), laid out word-major per tile for coalescing;
* ``empty_offset`` (+ ``empty_offset_ptr`` per tile): for tiles with empty rows, the
  row offset of each segment (the row under segment ``s`` is not ``tile_ptr + s``).

SpMV is two kernels (templates/csr5.mako): ``csr5_compute`` runs the tiles (green
segments stored directly, red/blue joined by a segmented sum over the columns in local
memory), leaving for each tile the sums of its first row (``head``) and of a last row
continuing into the next tile (``tail``); ``csr5_calibrate`` adds those up per row in
order (the authors' calibrate kernel, without atomics: deterministic), runs the rows
of the incomplete tile and zeroes the empty rows (listed in ``empty_rows``).  When a
row spans many tiles (power-law graphs, dense rows), ``csr5_run_sums`` first sums each
row's heads over groups of ``run_group`` tiles in parallel, so that calibrating the row
adds one value per group rather than one per tile (a serial chain of thousands of loads
otherwise).
"""

import typing

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from ..codegen import ALPHA_ARG, BETA_ARG, X_ARG, Y_ARG, KernelSpec, matrix, scalar, scratch
from ..device_inputs import DeviceCSR
from ..errors import DeviceCapabilityError, InvalidParameterError
from . import params as P
from .base import SpMVFormat, pow2_floor, round_up
from .builder import ProgramSpec, build_program
from .csr5_model import MAX_SIGMA, bounds_for, sigma_rule
from .registry import register

MAX_OMEGA = 1024
SEGMENTED_SUMS = ("scan", "serial")
# Work-items per group of the calibrate kernel (one per tile or tail row).
CALIBRATE_WORK_GROUP_SIZE = 64
# Rows spanning more tiles than this get the parallel run-sums pass by default: below
# it the calibrate kernel's serial walk over the heads is cheaper than one more launch.
LONG_RUN_TILES = 32
RUN_GROUP = 256
# Work-items per group of the conversion kernels (conversion on the device): the
# per-row one, the scans (a power of two, at most), and the per-tile one (tiles of
# omega work-items, as many as fit).
CONVERT_GROUP = 64
SCAN_GROUP = 256
TILE_CONVERT_GROUP = 128
# Consecutive rows (or tiles) per work-item of the layout passes and scans.
PER_ITEM = 8
# Local memory the transposition may stage a group's tiles in (else it writes them
# from registers, strided by omega).
CONVERT_LOCAL_BYTES = 32 * 1024
# Bit values of a 32-bit word (exact in float64, which np.bincount sums).
_POW2 = np.ldexp(1.0, np.arange(32))


def default_omega(profile, dtype):
    """The tile width: the warp/wavefront on GPUs, the vector lanes of dtype on CPUs."""
    width = profile.simd_width if profile.is_gpu else profile.lanes(dtype)
    return max(1, min(pow2_floor(max(1, width)), MAX_OMEGA, profile.max_work_group_size))


def field_bits(omega, sigma):
    """(y_offset bits, seg_offset bits, 32-bit words per column) of the tile descriptor:
    y_offset < omega*sigma, seg_offset < omega, then sigma bit flags."""
    y_bits = max(1, (omega * sigma - 1).bit_length())
    seg_bits = max(1, (omega - 1).bit_length())
    words = -(-(y_bits + seg_bits + sigma) // 32)
    return y_bits, seg_bits, words


def _pos_type(m, nnz, tile):
    """Positions in 32 bits while they fit (faster integer division)."""
    return np.int32 if nnz + 2 * tile < 2**31 and m < 2**31 - 1 else np.int64


def _tile_ptr_type(index_dtype):
    """``tile_ptr``'s unsigned type: as wide as the indices (its sign bit a flag)."""
    return np.dtype(np.uint32 if np.dtype(index_dtype).itemsize == 4 else np.uint64)


class TileRows(typing.NamedTuple):
    """Where the tiles start among the rows: what the kernel source and the launches
    need before conversion, and what the conversion reuses."""
    first_row: np.ndarray   # (p + 1,) the non-empty row of each tile's first entry; m last
    has_empty: np.ndarray   # (p,) empty rows lie between a tile's first row and the next's
    nonempty: np.ndarray    # the non-empty rows, ascending


def tile_rows(indptr, omega, sigma):
    """Each tile's first row and whether empty rows follow it (vectorised over tiles:
    one search per tile and one pass over the rows)."""
    m = len(indptr) - 1
    nnz = int(indptr[-1]) if m >= 0 else 0
    tile = omega * sigma
    p = -(-nnz // tile)
    pos_t = _pos_type(m, nnz, tile)
    indptr = np.asarray(indptr).astype(pos_t, copy=False)
    bounds = np.minimum(np.arange(p + 1, dtype=np.int64) * tile, nnz).astype(pos_t)
    first_row = np.searchsorted(indptr, bounds, side="right") - 1
    nonempty = np.flatnonzero(indptr[1:] != indptr[:-1]).astype(pos_t, copy=False)
    # Empty rows strictly between a tile's first row and the next tile's: rows there
    # minus the non-empty ones (first_row is always non-empty, m counts as such).
    rank = np.searchsorted(nonempty, first_row)
    has_empty = np.diff(first_row) - 1 > np.diff(rank) - 1
    return TileRows(first_row, has_empty, nonempty)


class TileLayout(typing.NamedTuple):
    """Everything of the CSR5 layout that depends on ``indptr`` alone and costs at most
    a number per row or per tile: computed once by ``analyse`` of a host CSR (vectorised
    numpy, no look at ``indices``/``data``) for the host conversion.  A CSR on the device
    gets the same from kernels there (``CSR5._analyse_device``)."""
    rows: TileRows
    tile_ptr: np.ndarray          # (p + 1,) first_row with the empty-rows sign bit
    empty_offset_ptr: typing.Optional[np.ndarray]  # (p_full + 1,) when a complete tile
    #                               has empty rows: where its segments' offsets start
    tail_row_begin: int           # rows from here on are run row by row
    empty_rows: np.ndarray        # the empty rows before tail_row_begin


def tile_layout(indptr, omega, sigma, index_dtype):
    """The :class:`TileLayout` of a CSR matrix's ``indptr``."""
    index_dtype = np.dtype(index_dtype)
    m = len(indptr) - 1
    nnz = int(indptr[-1]) if m >= 0 else 0
    tile = omega * sigma
    p_full, p = nnz // tile, -(-nnz // tile)
    rows = tile_rows(indptr, omega, sigma)
    first_row, has_empty, nonempty = rows

    # tile_ptr: the (non-empty) row holding each tile's first entry; m past the end.
    ptr_type = _tile_ptr_type(index_dtype).type
    sign = ptr_type(1) << ptr_type(8 * index_dtype.itemsize - 1)
    tile_ptr = first_row.astype(ptr_type)
    tile_ptr[:-1][has_empty] |= sign

    # empty_offset_ptr: a complete tile with empty rows has one offset per segment: its
    # first row, then each row starting strictly inside it (non-empty rows start at
    # distinct positions, so these are counted by searching their starts).
    empty_offset_ptr = None
    if has_empty[:p_full].any():
        starts = np.asarray(indptr)[nonempty]
        bounds = np.arange(p_full + 1, dtype=np.int64) * tile
        inner = (np.searchsorted(starts, bounds[1:], side="left")
                 - np.searchsorted(starts, bounds[:-1], side="right"))
        segments = np.where(has_empty[:p_full], inner + 1, 0)
        empty_offset_ptr = np.zeros(p_full + 1, dtype=index_dtype)
        np.cumsum(segments, out=empty_offset_ptr[1:])

    # Rows after the incomplete tile's first row go row by row (all of them when
    # nnz == 0); with no incomplete tile the last complete tile covers them.
    if p > p_full:
        tail_row_begin = int(first_row[p_full]) + 1
    else:
        tail_row_begin = 0 if nnz == 0 else m
    # Empty rows the tiles cover (the tail rows store their own): the calibrate kernel
    # zeroes them one work-item each.
    head = np.asarray(indptr[:tail_row_begin + 1])
    empty_rows = np.flatnonzero(head[1:] == head[:-1]).astype(index_dtype)
    return TileLayout(rows, tile_ptr, empty_offset_ptr, tail_row_begin, empty_rows)


def tile_arrays(indptr, indices, data, omega, sigma, index_dtype, value_dtype, layout=None):
    """The CSR5 host arrays of a CSR matrix (vectorised: work over rows and tiles, plus
    the transposition of the complete tiles); ``layout``: :func:`tile_layout` of it, when
    already known.  The list of empty rows (``layout.empty_rows``) is not among them."""
    index_dtype, value_dtype = np.dtype(index_dtype), np.dtype(value_dtype)
    m = len(indptr) - 1
    nnz = int(indptr[-1])
    tile = omega * sigma
    p_full = nnz // tile
    y_bits, seg_bits, words = field_bits(omega, sigma)
    flag_shift = y_bits + seg_bits
    pos_t = _pos_type(m, nnz, tile)
    indptr = np.asarray(indptr).astype(pos_t, copy=False)
    if layout is None:
        layout = tile_layout(indptr, omega, sigma, index_dtype)
    first_row, has_empty, nonempty = layout.rows

    # Row starts inside the complete tiles, plus each tile's first entry (always flagged).
    starts = indptr[nonempty]
    inside = int(np.searchsorted(starts, p_full * tile))
    starts, start_rows = starts[:inside], nonempty[:inside]
    start_tile, start_in_tile = np.divmod(starts, pos_t(tile))
    at_head = start_in_tile == 0
    head_is_start = np.zeros(p_full, dtype=bool)
    head_is_start[start_tile[at_head]] = True
    forced = np.flatnonzero(~head_is_start).astype(pos_t) * pos_t(tile)
    flagged = np.concatenate([starts, forced])
    if sigma & (sigma - 1):
        column, step = np.divmod(flagged, pos_t(sigma))  # column: tile * omega + lane
    else:
        column, step = flagged >> (sigma.bit_length() - 1), flagged & (sigma - 1)
    n_columns = p_full * omega
    desc = np.empty((p_full, words, omega), dtype=np.uint32)
    bit = step + flag_shift
    for w in range(words):
        sel = (bit >> 5) == w if words > 1 else slice(None)
        packed = np.bincount(column[sel], weights=_POW2[bit[sel] & 31], minlength=n_columns)
        desc[:, w, :] = packed.astype(np.uint64).astype(np.uint32).reshape(p_full, omega)
    if hasattr(np, "bitwise_count"):  # numpy >= 2: row starts per column from the flags
        count = np.bitwise_count(desc).sum(axis=1, dtype=np.int64)
    else:
        count = np.bincount(column, minlength=n_columns).reshape(p_full, omega)
    y_offset = np.cumsum(count, axis=1) - count
    lane = np.arange(omega)
    next_start = np.where(count > 0, lane, omega)
    next_start = np.minimum.accumulate(next_start[:, ::-1], axis=1)[:, ::-1]
    next_start = np.concatenate([next_start[:, 1:], np.full((p_full, 1), omega)], axis=1)
    seg_offset = next_start - lane - 1
    desc[:, 0, :] |= (y_offset | (seg_offset << y_bits)).astype(np.uint32)

    # empty_offset: for each complete tile with empty rows, the row offset (from the
    # tile's first row) of each of its segments in order: 0 for segment 0, then one per
    # row starting inside the tile.
    empty_offset_ptr = layout.empty_offset_ptr
    arrays = {
        "row_ptr": indptr.astype(index_dtype, copy=False),
        "tile_ptr": layout.tile_ptr,
        "tile_desc": desc.ravel(),
        "col_idx": _transpose_tiles(np.asarray(indices), p_full, omega, sigma, index_dtype),
        "values": _transpose_tiles(np.asarray(data), p_full, omega, sigma, value_dtype),
    }
    if empty_offset_ptr is not None:
        inner = ~at_head & has_empty[start_tile]
        inner_pos, inner_rows = starts[inner], start_rows[inner]
        inner_tile = inner_pos // tile
        per_tile = np.bincount(inner_tile, minlength=p_full)
        inner_before = np.cumsum(per_tile) - per_tile
        slot = (empty_offset_ptr[inner_tile].astype(np.int64) + 1
                + np.arange(inner_pos.size) - inner_before[inner_tile])
        empty_offset = np.zeros(int(empty_offset_ptr[-1]), dtype=index_dtype)
        empty_offset[slot] = inner_rows - first_row[inner_tile]
        arrays["empty_offset_ptr"] = empty_offset_ptr
        arrays["empty_offset"] = empty_offset
    return arrays


def _transpose_tiles(a, p_full, omega, sigma, dtype):
    """Complete tiles transposed and cast in one strided copy; the tail cast."""
    out = np.empty(a.size, dtype=dtype)
    n = p_full * omega * sigma
    out[:n].reshape(p_full, sigma, omega)[...] = a[:n].reshape(p_full, omega, sigma).transpose(
        0, 2, 1)
    out[n:] = a[n:]
    return out


def _pick(d, *names):
    return {name: d[name] for name in names}


def _empty_layout(m, index_dtype):
    """The :class:`TileLayout` of a matrix without entries (all rows are tail rows)."""
    ptr_type = _tile_ptr_type(index_dtype)
    rows = TileRows(np.array([m]), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64))
    return TileLayout(rows, np.array([m], dtype=ptr_type), None, 0,
                      np.zeros(0, dtype=index_dtype))


def untranspose_tiles(a, omega, sigma):
    """CSR order from the CSR5 order of ``col_idx``/``values`` (a copy)."""
    tile = omega * sigma
    p_full = a.size // tile
    out = a.copy()
    n = p_full * tile
    out[:n] = a[:n].reshape(p_full, sigma, omega).transpose(0, 2, 1).ravel()
    return out


@register
class CSR5(SpMVFormat):
    name = "csr5"
    complex_values = True
    order = 9
    template = "csr5.mako"
    converts_on_device = True
    host_input_on_device = True   # GPUs: upload the CSR, lay the tiles out there
    value_read = "reshape"        # values_in_csr_order: the tiles transposed back
    params = (
        P.Param("omega", P.integer(1, MAX_OMEGA, power_of_two=True),
                "tile width: work-items per tile (a power of two)"),
        P.Param("sigma", P.integer(1, MAX_SIGMA), "tile height: entries per tile column"),
        P.work_group_size("work-items per group of the compute kernel (omega per tile)"),
        P.Param("segmented_sum", P.one_of(*SEGMENTED_SUMS),
                "how a tile's columns join their partial rows"),
        P.Param("run_group", P.or_words(P.integer(0), "auto"),
                "tiles per group of the run-sums pass: 0 (off), a power of two, or 'auto' "
                "(on when the longest row spans more than LONG_RUN_TILES tiles)"),
    )

    @classmethod
    def default_params(cls, features, profile, dtype):
        omega = default_omega(profile, dtype)
        sigma = sigma_rule(features.mean_row_length, bounds_for(profile, dtype, omega))
        if profile.is_gpu:
            wg, segmented_sum = 256, "scan"
        else:
            # PoCL runs a group as a loop over its work-items and a barrier splits it:
            # few barriers (one for the serial segmented sum), several tiles per group.
            wg, segmented_sum = 8 * omega, "serial"
        # ... within the local memory the compute kernel needs (a value, and a flag for
        # the scan, per work-item).
        per_item = np.dtype(dtype).itemsize + (4 if segmented_sum == "scan" else 0)
        wg = min(wg, profile.max_work_group_size, profile.local_mem_size // per_item)
        wg = max(omega, wg // omega * omega)
        return {"omega": omega, "sigma": sigma, "work_group_size": wg,
                "segmented_sum": segmented_sum, "run_group": "auto"}

    @classmethod
    def check_params(cls, params, profile):
        P.check_multiple(cls.name, params, "omega", params["omega"])
        run_group = params["run_group"]
        if run_group != "auto":
            limit = profile.max_work_group_size
            if run_group > limit:
                raise InvalidParameterError(
                    f"csr5: run_group must be an integer in [0, {limit}], not {run_group!r}")
            if run_group & (run_group - 1):
                raise InvalidParameterError(
                    f"csr5: run_group must be 0 (off) or a power of two, not {run_group}")

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """The rule's sigma and its neighbours half and twice it (kept within 2..64;
        section 5.4 finds the rule within a few per cent of the best sigma in 4..48)."""
        if features.nnz == 0:
            return [{}]
        sigma = cls.default_params(features, profile, dtype)["sigma"]
        out = [{}]
        for s in (sigma // 2, 2 * sigma):
            if 2 <= s <= 64 and s != sigma:
                out.append({"sigma": s})
        return out

    # -- construction --------------------------------------------------------------------
    def analyse(self, csr):
        """Tile counts, the rows after the incomplete tile, the empty rows the tiles
        cover, whether any complete tile needs ``empty_offset`` (the kernel source
        depends on it) and ``run_group="auto"``: from ``indptr`` alone, kept for the
        conversion.  A host CSR: numpy (:func:`tile_layout`: a pass over the rows and a
        search per tile).  A CSR on the device (a ``DeviceCSR``): kernels on its
        ``indptr`` there (:meth:`_analyse_device`), four scalars read back."""
        omega, sigma = self.params["omega"], self.params["sigma"]
        m = self.shape[0]
        tile = omega * sigma
        on_device = isinstance(csr, DeviceCSR)   # (update_values analyses a host copy)
        self.nnz = nnz = (int(csr.nnz) if on_device else int(csr.indptr[-1])) if m else 0
        self.n_tiles = -(-nnz // tile)
        self.n_full_tiles = nnz // tile
        if on_device and nnz:
            long_row = self._analyse_device(csr)
        else:
            if on_device:   # no entries: nothing to look at
                layout = _empty_layout(m, self.index_dtype)
            else:
                layout = tile_layout(csr.indptr, omega, sigma, self.index_dtype)
            self._layout = layout
            self.has_empty_offset = layout.empty_offset_ptr is not None
            self.tail_row_begin = layout.tail_row_begin
            self.n_empty_rows = layout.empty_rows.size
            long_row = nnz and int(np.diff(csr.indptr).max()) > LONG_RUN_TILES * tile
        self.n_tail_rows = m - self.tail_row_begin
        if self.params["run_group"] == "auto":     # on when the longest row spans many tiles
            # Its local memory: a value and an index (8 bytes at most) per work-item.
            fits = self.profile.local_mem_size // (self.dtype.itemsize + 8)
            self.params["run_group"] = 0 if not long_row else \
                pow2_floor(max(1, min(RUN_GROUP, self.profile.max_work_group_size, fits)))

    # -- conversion on the device ----------------------------------------------------------
    def _conversion_program(self):
        """The conversion kernels of templates/csr5_convert.mako: ``(specs by name,
        kernels by name, scan group size, tiles per group of csr5_tiles_convert)``.
        Built once per specialisation, and the kernel objects kept in the device's
        store for this thread (``Device.thread_store``): they are only used inside a
        conversion (arguments set, then launched at once), and making them anew
        (pyopencl's per-kernel set-up) cost more than a large matrix's conversion
        kernels on a GPU."""
        omega, sigma = self.params["omega"], self.params["sigma"]
        budget = min(CONVERT_LOCAL_BYTES, self.profile.local_mem_size // 2)
        key = ("csr5-convert", self.profile, self.dtype.str, self.index_dtype.str,
               omega, sigma, budget)
        return self.device.thread_cached(key, lambda: self._build_conversion_program(budget))

    def _build_conversion_program(self, budget):
        omega, sigma = self.params["omega"], self.params["sigma"]
        y_bits, seg_bits, words = field_bits(omega, sigma)
        limit = self.profile.max_work_group_size
        entry = self.dtype.itemsize + self.index_dtype.itemsize
        while True:
            scan_group = pow2_floor(max(1, min(SCAN_GROUP, limit)))
            tiles = max(1, min(TILE_CONVERT_GROUP, limit) // omega)
            # Local memory per work-item: sigma entries staged, the descriptor's words,
            # two scan values.
            per_item = sigma * entry + 4 * words + 8
            while tiles > 1 and tiles * omega * per_item > budget:
                tiles //= 2
            local_transpose = tiles * omega * per_item <= budget
            if not local_transpose:
                tiles = max(1, min(TILE_CONVERT_GROUP, limit) // omega)
            specs = self.conversion_kernel_specs(scan_group, tiles * omega)
            program = ProgramSpec("csr5_convert.mako", specs, {
                "omega": omega, "sigma": sigma, "y_bits": y_bits, "seg_bits": seg_bits,
                "desc_words": words, "per_item": PER_ITEM, "tiles_per_group": tiles,
                "local_transpose": local_transpose})
            kernels, allowed = build_program(self.device, program, dtype=self.dtype,
                                             index_dtype=self.index_dtype,
                                             work_group_size=scan_group)
            if allowed >= max(scan_group, tiles * omega):
                return {k.name: k for k in specs}, kernels, scan_group, tiles
            if allowed < omega or allowed >= limit:
                raise DeviceCapabilityError(
                    f"{self.name}: the compiled conversion kernels allow work-groups of at "
                    f"most {allowed} work-items, fewer than omega={omega}")
            limit = allowed

    def conversion_kernel_specs(self, scan_group, tile_group):
        """The conversion kernels (templates/csr5_convert.mako), every argument given by
        name at launch."""
        idx = "index_t"
        row_ptr = matrix("row_ptr", idx)

        def index_scalars(*names):
            return tuple(scalar(n, idx) for n in names)

        def out(name, ctype=idx):
            return scratch(name, ctype)

        def read(name, ctype=idx):
            return scratch(name, ctype, read_only=True)

        def fixed(name, args, size=scan_group):
            return KernelSpec(name, args, fixed_group=True, group_size=size)

        return (
            fixed("csr5_rows_count", (*index_scalars("n_rows", "n_tiles"), row_ptr,
                                      out("first_row"), out("row_sums"))),
            fixed("csr5_scan_rows", (*index_scalars("n_groups"), out("row_sums"))),
            fixed("csr5_rows_scan", (*index_scalars("n_rows"), row_ptr, read("row_sums"),
                                     out("empty_before"), out("nonempty_rows"))),
            fixed("csr5_tiles_count", (
                *index_scalars("n_rows", "n_tiles", "n_full_tiles", "long_row"), row_ptr,
                read("first_row"), read("empty_before"), out("tile_ptr", "tile_ptr_t"),
                out("segments"), out("tile_sums"), out("tile_longs"))),
            fixed("csr5_scan_tiles", (
                *index_scalars("n_groups", "n_rows", "n_tiles", "n_full_tiles"),
                out("tile_sums"), read("tile_longs"), read("first_row"), read("empty_before"),
                out("info"))),
            fixed("csr5_tile_offsets", (*index_scalars("n_full_tiles"), read("segments"),
                                        read("tile_sums"), out("empty_offset_ptr"),
                                        out("empty_offset_out"))),
            KernelSpec("csr5_rows_convert", (
                *index_scalars("n_rows", "tail_row_begin", "n_full_tiles"),
                scalar("with_offsets", "int"), row_ptr, read("empty_before"),
                read("tile_ptr", "tile_ptr_t"), read("empty_offset_ptr"), out("empty_rows"),
                out("empty_offset_out"))),
            fixed("csr5_tiles_convert", (
                *index_scalars("n_rows", "n_full_tiles", "n_tail"), row_ptr,
                read("first_row"), read("empty_before"), read("nonempty_rows"),
                matrix("csr_col_idx", idx),
                matrix("csr_values", "real_t"), out("col_idx_out"),
                out("values_out", "real_t"), out("tile_desc", "uint")), size=tile_group),
        )

    def _run(self, queue, steps, wait_for=None, finish=False):
        program = self._program
        return self.run_now(queue, steps, specs=program[0], kernels=program[1],
                            wait_for=wait_for, finish=finish)

    def _analyse_device(self, csr):
        """:meth:`analyse` on the device: ``tile_ptr``, the first row of each tile, the
        empty rows before each row, the non-empty rows in order, each complete tile's
        segments when it has empty rows, and four scalars read back in one copy
        (``tail_row_begin``, the empty rows before it, ``empty_offset``'s size, whether
        a row spans more than ``LONG_RUN_TILES`` tiles).  Returns the last."""
        queue = self.device.queue
        idx = self.index_dtype
        omega, sigma = self.params["omega"], self.params["sigma"]
        m, p, p_full = self.shape[0], self.n_tiles, self.n_full_tiles
        self._program = self._conversion_program()
        scan_group = self._program[2]
        chunk = scan_group * PER_ITEM
        row_groups, tile_groups = -(-(m + 1) // chunk), -(-(p + 1) // chunk)
        ptr_type = _tile_ptr_type(idx)

        def buffer(size, dtype=idx):   # work buffers: plain buffers (no pyopencl arrays)
            return cl.Buffer(queue.context, cl.mem_flags.READ_WRITE,
                             max(1, size) * np.dtype(dtype).itemsize)

        row_ptr = csr.as_type("indptr", idx, queue, copy=True)
        tile_ptr = cla.empty(queue, p + 1, ptr_type)
        lay = {"row_ptr": row_ptr, "tile_ptr": tile_ptr}
        bufs = {"row_ptr": row_ptr.base_data, "tile_ptr": tile_ptr.base_data,
                "first_row": buffer(p + 1), "empty_before": buffer(m + 1),
                "nonempty_rows": buffer(m), "segments": buffer(p_full),
                "row_sums": buffer(row_groups), "tile_sums": buffer(tile_groups),
                "tile_longs": buffer(tile_groups), "info": buffer(4)}
        sizes = {"n_rows": m, "n_tiles": p, "n_full_tiles": p_full}
        steps = [
            self.step("csr5_rows_count", row_groups * scan_group, scan_group, n_rows=m,
                      n_tiles=p, **_pick(bufs, "row_ptr", "first_row", "row_sums")),
            self.step("csr5_scan_rows", scan_group, scan_group, n_groups=row_groups,
                      row_sums=bufs["row_sums"]),
            self.step("csr5_rows_scan", row_groups * scan_group, scan_group, n_rows=m,
                      **_pick(bufs, "row_ptr", "row_sums", "empty_before",
                              "nonempty_rows")),
            self.step("csr5_tiles_count", tile_groups * scan_group, scan_group, **sizes,
                      long_row=LONG_RUN_TILES * omega * sigma,
                      **_pick(bufs, "row_ptr", "first_row", "empty_before", "tile_ptr",
                              "segments", "tile_sums", "tile_longs")),
            self.step("csr5_scan_tiles", scan_group, scan_group, n_groups=tile_groups,
                      **sizes, **_pick(bufs, "tile_sums", "tile_longs", "first_row",
                                       "empty_before", "info")),
        ]
        event = self._run(queue, steps)
        info = np.empty(4, dtype=idx)
        cl.enqueue_copy(queue, info, bufs["info"], wait_for=[event], is_blocking=True)
        self.tail_row_begin, self.n_empty_rows, n_offsets, long_row = (int(v) for v in info)
        self.has_empty_offset = n_offsets > 0
        self._device_layout = (lay, bufs, n_offsets)
        return bool(long_row)

    def template_params(self):
        omega, sigma = self.params["omega"], self.params["sigma"]
        y_bits, seg_bits, words = field_bits(omega, sigma)
        return {"omega": omega, "sigma": sigma, "y_bits": y_bits, "seg_bits": seg_bits,
                "desc_words": words, "segmented_sum": self.params["segmented_sum"],
                "has_empty_offset": self.has_empty_offset,
                "run_group": self.params["run_group"],
                # Tiles' values and columns through common.mako's STREAMV/STREAMI: on
                # an H100 (20M non-zeros, same process) 0-10% faster in every case
                # measured (cage10 float32 92.0 -> 83.3 us, Groebner_id2003_aug float64
                # 118.1 -> 110.1, astro-ph float32 112.9 -> 107.6).
                "streamed_loads": self.streamed_loads_ok()}

    def kernel_specs(self):
        tile_ptr = matrix("tile_ptr", "tile_ptr_t")
        head, tail = scratch("head"), scratch("tail")
        specs = [
            KernelSpec("csr5_compute", (
                scalar("n_tiles", "index_t"), tile_ptr, matrix("tile_desc", "uint"),
                matrix("empty_offset_ptr", "index_t"), matrix("empty_offset", "index_t"),
                matrix("col_idx", "index_t"), matrix("values", "real_t"), X_ARG, Y_ARG,
                head, tail, ALPHA_ARG, BETA_ARG), fixed_group=True),
            KernelSpec("csr5_calibrate", (
                *(scalar(n, "index_t") for n in ("n_tiles", "n_full_tiles", "tail_row_begin",
                                                 "n_tail_rows", "n_empty_rows")),
                matrix("empty_rows", "index_t"), matrix("row_ptr", "index_t"), tile_ptr,
                matrix("col_idx", "index_t"), matrix("values", "real_t"), X_ARG, Y_ARG,
                scratch("head", read_only=True), scratch("tail", read_only=True), ALPHA_ARG,
                BETA_ARG)),
        ]
        if self.params["run_group"]:
            specs.append(KernelSpec(
                "csr5_run_sums", (scalar("n_full_tiles", "index_t"), tile_ptr, head),
                fixed_group=True, group_size=self.params["run_group"]))
        return specs

    def min_work_group_size(self):
        return self.params["omega"]

    def local_bytes(self, work_group_size):
        flags = 4 if self.params["segmented_sum"] == "scan" else 0
        return work_group_size * (self.dtype.itemsize + flags)

    def _layout_arrays(self):
        """The arrays made from ``indptr`` alone (analyse's :class:`TileLayout`)."""
        layout = self._layout
        del self._layout
        arrays = {"tile_ptr": layout.tile_ptr, "empty_rows": layout.empty_rows}
        if layout.empty_offset_ptr is not None:
            arrays["empty_offset_ptr"] = layout.empty_offset_ptr
        return layout, arrays

    def convert(self, csr):
        omega, sigma = self.params["omega"], self.params["sigma"]
        nnz = self.nnz
        layout, _ = self._layout_arrays()
        arrays = tile_arrays(csr.indptr, csr.indices[:nnz], csr.data[:nnz], omega, sigma,
                             self.index_dtype, self.dtype, layout=layout)
        assert ("empty_offset" in arrays) == self.has_empty_offset
        arrays["empty_rows"] = layout.empty_rows
        return arrays

    def convert_device(self, csr):
        """The arrays of :meth:`convert`, identical, made on the device from a CSR there
        (templates/csr5_convert.mako).  ``analyse`` made ``tile_ptr`` and the descriptors'
        bit_flags there; then ``csr5_tile_offsets`` (tiles with empty rows only) scans
        their segments into ``empty_offset_ptr``, ``csr5_rows_convert`` (a work-item per
        row, when there are empty rows) lists them and writes ``empty_offset``, and
        ``csr5_tiles_convert`` (omega work-items per tile) transposes the complete tiles
        (coalesced reads, and writes through local memory), adds ``y_offset`` and
        ``seg_offset`` to the descriptors and copies the incomplete tile."""
        queue = self.device.queue
        idx = self.index_dtype
        nnz, m = self.nnz, self.shape[0]

        def empty(size, dtype=idx):
            return cla.empty(queue, size, dtype)

        if not nnz:   # nothing on the device to convert: the layout is known
            _, layout_arrays = self._layout_arrays()
            arrays = {name: cla.to_device(queue, arr) for name, arr in layout_arrays.items()}
            arrays["row_ptr"] = csr.as_type("indptr", idx, queue, copy=True)
            return {**arrays, "col_idx": empty(0), "values": empty(0, self.dtype),
                    "tile_desc": empty(0, np.uint32)}
        lay, bufs, n_offsets = self._device_layout
        del self._device_layout
        omega, sigma = self.params["omega"], self.params["sigma"]
        p_full = self.n_full_tiles
        scan_group, tiles_per_group = self._program[2], self._program[3]
        _, _, words = field_bits(omega, sigma)
        out = {"row_ptr": lay["row_ptr"], "tile_ptr": lay["tile_ptr"],
               "tile_desc": empty(p_full * omega * words, np.uint32),
               "empty_rows": empty(self.n_empty_rows),
               "col_idx": empty(nnz), "values": empty(nnz, self.dtype)}
        if self.has_empty_offset:
            out["empty_offset_ptr"] = empty(p_full + 1)
            out["empty_offset"] = empty(n_offsets)
        ob = {name: arr.base_data if arr.base_data is not None else bufs["info"]
              for name, arr in out.items()}
        steps = []
        if self.has_empty_offset:
            steps.append(self.step(
                "csr5_tile_offsets", -(-(p_full + 1) // (scan_group * PER_ITEM)) * scan_group,
                scan_group, n_full_tiles=p_full, segments=bufs["segments"],
                tile_sums=bufs["tile_sums"], empty_offset_ptr=ob["empty_offset_ptr"],
                empty_offset_out=ob["empty_offset"]))
        if self.n_empty_rows or self.has_empty_offset:
            wg = min(CONVERT_GROUP, self.profile.max_work_group_size)
            offsets = ({"empty_offset_ptr": ob["empty_offset_ptr"],
                        "empty_offset_out": ob["empty_offset"]} if self.has_empty_offset else
                       {"empty_offset_ptr": bufs["segments"],   # never read or written
                        "empty_offset_out": bufs["first_row"]})
            steps.append(self.step(
                "csr5_rows_convert", round_up(m, wg), wg, n_rows=m,
                tail_row_begin=self.tail_row_begin, n_full_tiles=p_full,
                with_offsets=int(self.has_empty_offset), row_ptr=bufs["row_ptr"],
                empty_before=bufs["empty_before"], tile_ptr=bufs["tile_ptr"],
                empty_rows=ob["empty_rows"], **offsets))
        tile_group = tiles_per_group * omega
        steps.append(self.step(
            "csr5_tiles_convert", max(1, -(-p_full // tiles_per_group)) * tile_group,
            tile_group, n_rows=m, n_full_tiles=p_full, n_tail=nnz - p_full * omega * sigma,
            **_pick(bufs, "row_ptr", "first_row", "empty_before", "nonempty_rows"),
            csr_col_idx=csr.as_type("indices", idx, queue).base_data,
            csr_values=csr.as_type("data", self.dtype, queue).base_data,
            col_idx_out=ob["col_idx"], values_out=ob["values"], tile_desc=ob["tile_desc"]))
        self._run(queue, steps, finish=True)   # done before any product, whatever the order
        del self._program
        return out

    def scratch_sizes(self):
        """The sums each complete tile leaves for the calibrate kernel: of its first row
        (``head``) and of a last row continuing into the next tile (``tail``)."""
        size = self.n_full_tiles * self.dtype.itemsize
        return {"head": size, "tail": size}

    def values_in_csr_order(self, queue, indptr):
        """The values, tiles transposed back (``untranspose_tiles``)."""
        omega, sigma = self.params["omega"], self.params["sigma"]
        return untranspose_tiles(self._read_values(queue, "values", self.nnz), omega, sigma)

    def to_csr(self):
        """The matrix back in CSR (scipy), read from the device: exactly the CSR it was
        built from, in this operator's value and index types (section 3.6)."""
        import scipy.sparse as sp

        queue = self.device.queue
        host = {}
        for name, dtype in (("row_ptr", self.index_dtype), ("col_idx", self.index_dtype),
                            ("values", self.dtype)):
            n = self.shape[0] + 1 if name == "row_ptr" else None
            buf = self.buffers[name]
            arr = np.empty(buf.size // dtype.itemsize, dtype=dtype)
            cl.enqueue_copy(queue, arr, buf)
            host[name] = arr[:n] if n is not None else arr
        nnz = int(host["row_ptr"][-1])
        omega, sigma = self.params["omega"], self.params["sigma"]
        indices = untranspose_tiles(host["col_idx"][:nnz], omega, sigma)
        data = untranspose_tiles(host["values"][:nnz], omega, sigma)
        A = sp.csr_matrix((data, indices, host["row_ptr"]), shape=self.shape)
        A.has_sorted_indices = False  # as stored: never re-sorted
        return A

    # -- launching ------------------------------------------------------------------------
    def launches(self, beta):
        out = []
        if self.n_full_tiles:
            wg = self.params["work_group_size"]
            tiles_per_group = wg // self.params["omega"]
            groups = -(-self.n_full_tiles // tiles_per_group)
            # Without empty rows empty_offset is never read: row_ptr stands in for it.
            stand_in = {} if self.has_empty_offset else {
                "empty_offset_ptr": self.buffers["row_ptr"],
                "empty_offset": self.buffers["row_ptr"]}
            out.append(self.step("csr5_compute", groups * wg, wg, n_tiles=self.n_full_tiles,
                                 **stand_in))
            run_group = self.params["run_group"]
            if run_group:
                groups = -(-self.n_full_tiles // run_group)
                out.append(self.step("csr5_run_sums", groups * run_group, run_group,
                                     n_full_tiles=self.n_full_tiles))
        work = self.n_tiles + self.n_tail_rows + self.n_empty_rows
        if work:   # m == 0 leaves nothing to launch
            cwg = min(CALIBRATE_WORK_GROUP_SIZE, self.profile.max_work_group_size)
            out.append(self.step(
                "csr5_calibrate", round_up(work, cwg), cwg, n_tiles=self.n_tiles,
                n_full_tiles=self.n_full_tiles, tail_row_begin=self.tail_row_begin,
                n_tail_rows=self.n_tail_rows, n_empty_rows=self.n_empty_rows))
        return out
