"""Host conversion CSR -> BCCOO / BCCOO+ (yaSpMV, Yan et al., PPoPP'14, sections 2.2-2.4).

Vectorised numpy only.  Two steps, because the device may shrink the work-group size
after the kernels are built and the tile layout depends on it:

* :func:`build_blocks`: the non-zero h x w blocks of the (vertically sliced and
  top-down aligned) matrix in row-major order, with their row stops;
* :func:`layout`: padding to whole work-group tiles, the bit-flag words, the column
  indices (optionally delta-compressed), the value arrays (one per block row), the
  first-result entry of every thread and the per-group "skip the scan" flag, in
  thread-tile order or transposed (offline transpose).

Every rearranged block row owns at least one block, so that the number of row stops
before a block *is* its block row (the paper's lossless bit-flag compression of the
row index): an empty block row gets one all-fill dummy block.  Fill entries (inside
blocks, dummies, tile padding) are stored as +0.0 and stored zeros as -0.0; the kernel
skips entries whose bits are all zero, so fill never multiplies x (0 * Inf = NaN would
differ from scipy) while stored zeros still do.
"""

import dataclasses

import numpy as np

from .. import host_arrays

FLAG_TYPES = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32)}
# Column indices (block columns) as unsigned short while the matrix is narrower than this.
USHORT_COLS_LIMIT = 65535
DELTA_ESCAPE = -1   # in the short delta array: "read the full index instead"


@dataclasses.dataclass
class Blocks:
    """The blocks of one block shape and slicing, before tile layout."""
    h: int
    w: int
    slices: int
    n_block_rows: int        # per slice
    n_block_cols: int
    block_cols: np.ndarray   # int64, one per block (dummies: 0)
    stops: np.ndarray        # bool, True where the block ends its rearranged row
    values: np.ndarray       # (h, n_blocks, w), fill +0.0, stored zeros -0.0

    @property
    def n_blocks(self):
        return int(self.block_cols.size)

    @property
    def n_rearranged_rows(self):
        return self.slices * self.n_block_rows


def slice_width(n_block_cols, slices):
    """Block columns per vertical slice (slices are aligned to whole blocks)."""
    return max(1, -(-int(n_block_cols) // int(slices)))


def _duplicate_rank(csr, rows, cols):
    """0 for the first copy of each (row, column), 1 for the second, ...: copies go to
    different blocks, since scipy multiplies them one by one (a*Inf + b*Inf with a > 0 >
    b is NaN, (a+b)*Inf is not)."""
    if csr.nnz == 0 or host_arrays.has_canonical_format(csr):   # (not scipy's flag)
        return None
    key = rows * max(1, csr.shape[1]) + cols
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    new_run = np.ones(key.size, dtype=bool)
    new_run[1:] = sorted_key[1:] != sorted_key[:-1]
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(key.size), 0))
    rank = np.empty(key.size, dtype=np.int64)
    rank[order] = np.arange(key.size) - run_start
    return rank if rank.any() else None


def _div(values, divisor):
    """``values // divisor`` for non-negative values: the values themselves for 1 (the
    default 1 x 1 blocks and single slice), a shift for powers of two (numpy's integer
    division costs 60-150 ms per pass over 20M entries)."""
    divisor = int(divisor)
    if divisor == 1:
        return values
    if divisor & (divisor - 1) == 0:
        return values >> (divisor.bit_length() - 1)
    return values // divisor


def _block_keys(csr, h, w, slices):
    """Sort keys of the entries' blocks: (rearranged block row, block column, copy).
    Returns keys, rows, cols, block rows per slice, block columns, copies per column
    (L), the key stride of a rearranged row, and each entry's rearranged block row and
    block column (what the keys are made of)."""
    m, n = csr.shape
    n_block_rows = -(-m // h)
    n_block_cols = -(-n // w)
    rows = host_arrays.entry_rows(csr.indptr)
    cols = csr.indices.astype(np.int64, copy=False)
    rank = _duplicate_rank(csr, rows, cols)
    copies = 1 if rank is None else int(rank.max()) + 1
    block_cols = _div(cols, w)
    rearranged = _div(rows, h)
    if slices > 1:   # one slice holds every block column: its index is 0
        rearranged = (_div(block_cols, slice_width(n_block_cols, slices)) * n_block_rows
                      + rearranged)
    # +1: dummies (block column 0, copy 0) never collide across rows even when n == 0.
    row_stride = (n_block_cols + 1) * copies
    keys = rearranged * row_stride
    keys += block_cols if copies == 1 else block_cols * copies
    if rank is not None:
        keys += rank
    return keys, rows, cols, n_block_rows, copies, row_stride, rearranged, block_cols


def _sorted_unique(keys):
    """np.unique(keys) by a sort: numpy 2.3+ hashes instead, 30x slower on these int64
    keys (262k keys: 118 ms against 4 ms), which made ranking bccoo's block shapes cost
    0.7 s of an online tuning."""
    ordered = np.sort(keys)
    if ordered.size < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def count_blocks(csr, h, w, slices=1):
    """(non-zero blocks, dummy blocks for empty rearranged rows) of this shape."""
    keys, _, _, n_block_rows, _, row_stride, _, _ = _block_keys(csr, h, w, slices)
    unique = _sorted_unique(keys)
    block_rows = unique // row_stride       # sorted: count the changes
    rows_used = int(block_rows.size and 1 + np.count_nonzero(block_rows[1:] != block_rows[:-1]))
    return int(unique.size), int(slices * n_block_rows - rows_used)


def build_blocks(csr, h, w, slices=1, dtype=np.float64):
    keys, rows, cols, n_block_rows, copies, stride, rearranged, block_cols = \
        _block_keys(csr, h, w, slices)
    n_block_cols = -(-csr.shape[1] // w)
    n_rows_total = slices * n_block_rows
    # Keys already in order (1 x 1 blocks of a sorted CSR, the GPU default): every entry
    # is a block of its own, in order, whose rearranged row is the entry's (no unique,
    # no division by the key stride: 20M entries, about 1 s less on a 2-core VM).
    in_order = bool(keys.size) and bool(np.all(keys[1:] > keys[:-1]))
    if in_order:
        unique, inverse, key_rows = keys, np.arange(keys.size), rearranged
    else:
        unique, inverse = np.unique(keys, return_inverse=True)
        key_rows = unique // stride
    used = np.zeros(n_rows_total, dtype=bool)
    used[key_rows] = True
    if in_order and h == w == 1 and used.all():   # no dummies: the entries are the blocks
        stops = np.ones(keys.size, dtype=bool)
        stops[:-1] = rearranged[1:] != rearranged[:-1]
        values = np.asarray(csr.data).astype(dtype)
        values[values == 0] = -0.0   # stored zero: multiplied (see below)
        if np.shares_memory(block_cols, csr.indices):   # the caller's array
            block_cols = block_cols.copy()
        return Blocks(h, w, slices, n_block_rows, n_block_cols, block_cols, stops,
                      values.reshape(1, keys.size, 1))
    dummy_keys = np.flatnonzero(~used).astype(np.int64) * stride
    if dummy_keys.size:
        all_keys = np.concatenate([unique, dummy_keys])
        order = np.argsort(all_keys, kind="stable")
        position = np.empty(all_keys.size, dtype=np.int64)
        position[order] = np.arange(all_keys.size)   # key index -> block position
        sorted_keys = all_keys[order]
    else:
        position, sorted_keys = np.arange(unique.size), unique
    n_blocks = sorted_keys.size
    block_rows = sorted_keys // stride
    stops = np.ones(n_blocks, dtype=bool)
    stops[:-1] = block_rows[1:] != block_rows[:-1]
    # Values laid out as (row in block, block, column in block); every entry has its own
    # slot (copies of one entry are in different blocks).
    flat = ((rows % h) * n_blocks + position[inverse]) * w + cols % w
    size = h * n_blocks * w
    values = np.zeros(size, dtype=dtype)
    values[flat] = csr.data
    values[flat[values[flat] == 0]] = -0.0   # stored zero: multiplied (marker; for
    # complex values the real part's sign bit)
    return Blocks(h, w, slices, n_block_rows, n_block_cols,
                  (sorted_keys % stride) // copies, stops,
                  values.reshape(h, n_blocks, w))


def tile_geometry(n_blocks, tile_size, work_group_size):
    """(padded block count, threads, groups): padded to whole work-group tiles."""
    group_tile = tile_size * work_group_size
    n_groups = -(-int(n_blocks) // group_tile)
    return n_groups * group_tile, n_groups * work_group_size, n_groups


def col_delta(cols_by_thread):
    """The paper's segmented difference of the column indices, one segment per thread
    tile, as short; -1 (and anything out of range) escapes to the full index."""
    delta = np.empty_like(cols_by_thread)
    delta[:, 0] = cols_by_thread[:, 0]
    delta[:, 1:] = np.diff(cols_by_thread, axis=1)
    escape = (delta < -32768) | (delta > 32767) | (delta == DELTA_ESCAPE)
    delta[escape] = DELTA_ESCAPE
    return delta.astype(np.int16)


def layout(blocks, *, tile_size, work_group_size, flag_bits, transpose, col_compress,
           col_dtype, pos_dtype, dtype):
    """The device arrays of the format (ordered dict name -> numpy array)."""
    T, WG = tile_size, work_group_size
    h, w = blocks.h, blocks.w
    nb = blocks.n_blocks
    nb_pad, n_threads, n_groups = tile_geometry(nb, T, WG)
    pad = nb_pad - nb
    # Padding blocks: no stop (flag 1), all fill, same column as the last block (delta 0).
    last_col = blocks.block_cols[-1] if nb else 0
    # In the stored type at once, unless the deltas need the 64-bit differences.
    cols = np.empty(nb_pad, dtype=np.int64 if col_compress else col_dtype)
    cols[:nb] = blocks.block_cols
    cols[nb:] = last_col
    stops = np.concatenate([blocks.stops, np.zeros(pad, dtype=bool)])
    values = np.zeros((h, nb_pad, w), dtype=dtype)
    values[:, :nb, :] = blocks.values

    # First result entry of each thread: row stops before its tile (+ one past the end),
    # from each tile's count (a running sum over every block cost 6x more: 20M blocks,
    # 107 -> 18 ms on a 2-core VM).
    per_tile = host_arrays.reduce_groups(stops.view(np.uint8) if T < 256
                                         else stops.astype(np.int64), T, np.add)
    stop_count = np.zeros(n_threads + 1, dtype=np.int64)
    np.cumsum(per_tile, out=stop_count[1:])
    first_entry = stop_count.astype(pos_dtype)
    # A group may skip the parallel scan when every one of its threads has a row stop.
    thread_has_stop = np.diff(first_entry.astype(np.int64)) > 0
    group_full = thread_has_stop.reshape(n_groups, WG).all(axis=1).astype(np.uint8)

    # Bit flags, 0 = row stop, packed little-endian per thread into words; the bits past
    # the tile in the last word are 1.
    bits = flag_bits
    n_words = -(-T // bits)
    flags = np.ones((n_threads, n_words * bits), dtype=np.uint8)
    flags[:, :T] = ~stops.reshape(n_threads, T)
    packed = np.packbits(flags, axis=1, bitorder="little")
    words = packed.view(FLAG_TYPES[bits].newbyteorder("<")).astype(FLAG_TYPES[bits])
    words = words.reshape(n_threads, n_words)

    cols_by_thread = cols.reshape(n_threads, T)
    arrays = {}

    def tiles(a, per_thread):
        # (group, thread, k, ...) -> (group, k, thread, ...) when transposed.
        a = a.reshape((n_groups, WG, per_thread) + a.shape[2:])
        if transpose:
            a = a.swapaxes(1, 2)
        return np.ascontiguousarray(a).reshape((-1,) + a.shape[3:])

    arrays["flags"] = tiles(words, n_words)
    if col_compress:
        arrays["col_delta"] = tiles(col_delta(cols_by_thread), T)
    arrays["cols"] = tiles(cols_by_thread.astype(col_dtype, copy=False), T)
    arrays["values"] = np.stack([tiles(values[r].reshape(n_threads, T, w), T).ravel()
                                 for r in range(h)]).ravel() if nb_pad else \
        np.zeros(0, dtype=dtype)
    arrays["first_entry"] = first_entry
    arrays["group_full"] = group_full
    return arrays, {"n_blocks_padded": nb_pad, "n_threads": n_threads, "n_groups": n_groups}


def footprint_bytes(n_blocks, h, w, *, itemsize, tile_size, work_group_size, flag_bits,
                    col_bytes, col_compress, pos_bytes):
    """Bytes of the arrays :func:`layout` produces for ``n_blocks`` blocks (dummies
    included): the paper's footprint, every array read once."""
    nb_pad, n_threads, n_groups = tile_geometry(n_blocks, tile_size, work_group_size)
    n_words = -(-tile_size // flag_bits)
    total = nb_pad * h * w * itemsize                 # values
    total += n_threads * n_words * flag_bits // 8     # bit flags
    total += nb_pad * col_bytes                       # column indices
    if col_compress:
        total += nb_pad * 2                           # short deltas
    total += (n_threads + 1) * pos_bytes              # first result entries
    total += n_groups                                 # skip-scan flags
    return int(total)
