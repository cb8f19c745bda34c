"""``csr-vector``: CSR read by groups of work-items.

``mapping="rows"`` (the default on CPUs, and on GPUs for rows too long for the
adaptive windows): Bell & Garland's vector kernel, generalised from one warp to
``vector_size`` = 2...64 work-items per row.

``mapping="adaptive"`` (the default on GPUs otherwise): after Greathouse & Daga's
CSR-Adaptive (SC14).  The host cuts
the rows into blocks (``row_blocks``), one work-group each:

- the group reads the block's entries consecutively (coalesced ``values``/``col_idx``,
  and neighbouring entries gather neighbouring ``x``), ``work_group_size *
  items_per_thread`` products at a time, into local memory;
- each row is then added up from there by as many work-items as the group holds per
  row (a power of two: one each for a block of ``work_group_size`` short rows, all of
  them for a row longer than a block may hold, which is a block of its own), and their
  partial sums are combined (``reduction``).

Blocks are filled greedily (``adaptive_row_blocks``): consecutive rows while they hold
at most one window of ``work_group_size * items_per_thread`` entries (two for 8-byte
values and longer rows, ``adaptive_capacity``) and at most ``block_rows`` rows: the
group's size (one work-item per row), or half of it where that many rows of the mean
length fill a block anyway (``default_block_rows``: two work-items per short row).  One
launch; no scratch.

``col_bits=16`` (adaptive mapping only) stores each column as a 16-bit offset
(``col_off``) from its row block's smallest column (``col_base``, one index per block;
``row_base``, the same per row, for the lanes block kernel): 2 bytes an entry instead of
4, for blocks spanning at most 65535 columns (banded, finite-element and reordered
matrices, and any matrix of at most 65536 columns).  A wider block escapes: its columns
stay 32-bit in ``col_wide`` (its base is ``-1 -`` their position there, and its rows'
likewise; its offsets are 0, never read), and the kernels, built with ``col_escape``,
run a second window loop over ``col_wide`` that only wide blocks enter (the first,
only narrow ones).  ``col_bits="auto"`` (the GPU default of the adaptive mapping)
takes 16 bits unless the wide blocks hold more than ``AUTO_MAX_WIDE_SHARE`` of the
entries, then 32: the conversion finds out (on the device, ``csr_vector_compress``: one
flag read back, and the bases when a block is wide) and builds the kernels again.  On
an H100 (20M non-zeros) 16-bit columns ran 3-11% faster on every matrix that fits
(BENCHMARKS.md, #18).

``mapping="merge"``: after Merrill & Garland's merge-based SpMV (SC16), on the plain CSR
arrays.  The ``m`` row ends and the ``nnz`` entries form one merged sequence of
``m + nnz`` items (row ``i``'s entries, then its end); each work-item takes
``items_per_thread`` consecutive items, each work-group ``work_group_size`` times that:

- the host finds each group's first row with one ``np.searchsorted`` over the row ends'
  merge positions (``merge_groups``: the group's first item is its diagonal of the
  merge path); each work-item then finds its own start by a binary search along its
  diagonal between its group's first and last rows;
- a work-item adds its entries' products in registers and writes each row whose end it
  reaches directly to ``y`` (empty rows included: their end is an item too), except its
  first, which earlier work-items may have begun;
- the one partial sum it leaves (the row it ends in, a "carry") is the only value per
  work-item that goes through local memory: a segmented scan of the group's carries
  (``reduction``: "tree", log2(work_group_size) steps, or "serial", each work-item
  walking back over the carries of its row) completes the work-items' first rows;
- a row begun in an earlier group is completed by a second kernel, one work-item per
  such group, which adds the group's part (``head``) and the carries the earlier groups
  left for that row (``carry``), in a fixed order: deterministic, no atomics.  Launched
  only when a group needs it.
"""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from .. import host_arrays
from ..codegen import (
    ALPHA_ARG,
    BETA_ARG,
    PRODUCT_ARGS,
    X_ARG,
    Y_ARG,
    KernelSpec,
    matrix,
    scalar,
    scratch,
)
from ..errors import InvalidParameterError
from . import params as P
from .base import BLOCK_WIDTHS, csr_bytes, fits_int32, launch_rows, pow2_floor, round_up
from .csr_common import (
    BLOCK_PARAMS,
    COL_BITS,
    CSR_ARRAYS,
    CSR_ROW_ARGS,
    CSR_ROW_BLOCK_ARGS,
    CSRFormatBase,
    default_block_mapping,
)
from .narrow_columns import offsets_from, segment_bounds
from .registry import register
from .storage import VALUE_BITS, full_bits

VECTOR_SIZES = (2, 4, 8, 16, 32, 64)
MAPPINGS = ("rows", "adaptive", "merge")
MAX_ITEMS_PER_THREAD = 32
ADAPTIVE_MAX_WINDOWS = 8
# The adaptive mapping's default shape (work-group size, entries per work-item; see
# adaptive_shape for values wider than 4 bytes).
ADAPTIVE_DEFAULT = {"work_group_size": 128, "items_per_thread": 8}
# The merge mapping's default shapes (work-group size, merge items per work-item).  GPUs:
# CUB's 128 x 7 rounded to a power of two; nothing is staged per item, so wide values
# keep it.  CPUs: longer work-items (fewer searches and groups, PoCL runs a group as a
# loop): on PoCL (2 cores, float32, 2M non-zeros) 64 x 32 ran astro-ph, cage10 and
# rajat01 in 6.2, 5.9 and 7.0 ms against 11.4, 12.4 and 15.8 with 128 x 8.
MERGE_DEFAULT = {"work_group_size": 128, "items_per_thread": 8}
MERGE_DEFAULT_CPU = {"work_group_size": 64, "items_per_thread": 32}
#: col_bits=16: the widest span of columns a row block may have (offsets 0..65535).
MAX_BLOCK_SPAN = 0xFFFF
#: col_bits="auto": 16-bit columns unless the blocks wider than ``MAX_BLOCK_SPAN``, kept
#: in 32 bits, hold more than this share of the entries (then 32 bits throughout).  On
#: an H100 (cage10, astro-ph and Groebner_id2003_aug at 20M non-zeros, some copies given
#: far entries, float32 and float64) the escape ran 0.6-4.5% faster than 32 bits at
#: shares up to 0.13, within 2.3% either way from 0.18 to 0.26, and 1.2-4.7% slower in 9
#: of 10 cases from 0.34; the crossings lay between 0.2 and 0.45 (BENCHMARKS.md, #18).
AUTO_MAX_WIDE_SHARE = 0.3


def adaptive_shape(dtype):
    """The adaptive mapping's default shape for values of ``dtype``: 8 entries per
    work-item for 4-byte values, 4 for wider ones.  Each entry's product is staged in
    local memory, so 8 entries of complex128 take 4x float32's; on an H200 (astro-ph and
    Groebner_id2003_aug x83-x116) 4 entries ran complex128 in 142-164 us against 211-
    305 us with 8, and float64 within 3% (astro-ph 113 against 118 us), while float32
    kept 8 (70-92 against 81-97 us with 4)."""
    items = ADAPTIVE_DEFAULT["items_per_thread"]
    return {**ADAPTIVE_DEFAULT, "items_per_thread": items if np.dtype(dtype).itemsize <= 4
            else items // 2}


def vector_size_for(mean_row_length, simd_lanes):
    """Smallest power of two covering the mean row length, between 2 and the device's
    SIMD width (64 at most): short rows do not leave most of a group idle, long rows
    use a whole warp/wavefront."""
    upper = max(2, min(64, pow2_floor(max(2, simd_lanes))))
    size = 2
    while size < mean_row_length and size < upper:
        size *= 2
    return size


def adaptive_capacity(indptr, work_group_size, items_per_thread, dtype):
    """How many entries the adaptive mapping's row blocks may hold: one window
    (``work_group_size * items_per_thread``), two for values of 8 bytes or more unless
    the rows are so short that ``work_group_size`` of them fill less than two windows.

    On an H100 (ten matrices at 20M non-zeros, BENCHMARKS.md, #18) float32 ran 1-14%
    slower with blocks of two of its 1024-entry windows than of one; float64, whose
    windows hold 512, ran faster with two on 6 of 9 matrices (Groebner_id2003_aug 92.2
    -> 87.7 us, 3% slower on astro-ph), but 18% slower on rajat01, whose 6.3 entries a
    row fill only 806 of the 1024 a block of 128 rows could hold."""
    window = work_group_size * items_per_thread
    indptr = np.asarray(indptr)
    m = indptr.size - 1
    if np.dtype(dtype).itemsize < 8 or m <= 0:
        return window
    mean_row = int(indptr[-1]) / m
    return 2 * window if mean_row * work_group_size >= 2 * window else window


def row_unroll(dtype):
    """Products the adaptive kernel adds per turn of a row's loop over local memory: 2
    for 4-byte sums, else 1.  On an H100 (seven matrices at 20M non-zeros, BENCHMARKS.md,
    #18) two a turn ran float32 0.5-12% faster on six (astro-ph 84.9 -> 81.2 us, against
    cuSPARSE's 81.4; rajat01 95.9 -> 84.2) and 1% slower on wing; float64 moved -2.6% to
    +1.9%, and four a turn lost up to 8% there."""
    return 2 if np.dtype(dtype).itemsize <= 4 else 1


def default_block_rows(indptr, work_group_size, capacity):
    """``block_rows="auto"``: half the group where that many rows of the mean length
    hold ``capacity`` entries, else the whole group.

    A block of more rows than half the group gives each row one work-item to add it up,
    and a warp then waits for its longest row; at most half the group's rows, each row
    gets two.  Where the mean row is long enough, the cap seldom cuts a block short.  On
    an H100 (ten matrices at 20M non-zeros, BENCHMARKS.md, #18) half the rows ran
    Groebner_id2003_aug (35 entries a row on average) in 61.8 against 65.2 us in float32
    and 83.5 against 88.1 in float64, and szdMat (18.9) 1% faster; the eight matrices
    whose half-group blocks would hold less than a window (mean rows of 3.9-15.4) were
    0-35% slower with it (their blocks 1.3-2x as many), and a quarter of the group was
    slower still."""
    indptr = np.asarray(indptr)
    m = indptr.size - 1
    half = max(1, work_group_size // 2)
    if m <= 0:
        return work_group_size
    return half if half * (int(indptr[-1]) / m) >= capacity else work_group_size


def adaptive_row_blocks(indptr, rows_per_block, capacity, steps=32):
    """First row of each block, then the number of rows (CSR-Adaptive's row blocks).

    Filled greedily: a block takes the next rows while they hold at most ``capacity``
    entries and number at most ``rows_per_block``; a row longer than ``capacity`` is a
    block of its own.  So no block of several rows spills into a second window of the
    kernel, and the windows are nearly full: on an H100 (20M non-zeros) the blocks used
    to be cut where a row's first entry entered another aligned window and every
    ``rows_per_block`` rows, which left 44-58% of the window slots empty, and
    csr-vector's adaptive kernel ran 5-21% faster with greedy blocks on 8 of 10
    matrices (astro-ph float32 90.6 -> 82.8 us, rajat01 119.9 -> 96.7; BENCHMARKS.md).

    Where ``rows_per_block`` rows from a multiple of it hold at most ``capacity``
    entries (short rows), that group is the greedy walk's block from its first row, and
    is taken as it is.  The rest goes to :func:`greedy_walk` in pieces of about
    ``steps`` blocks (cut at those groups and at equal shares of the rows and of the
    entries); a piece's last block may be short: a few per cent more blocks than one
    walk over all the rows (wing x83: 41,474 against 40,224, before the groups were
    taken as they are)."""
    indptr = np.asarray(indptr)
    m = indptr.size - 1
    if m <= 0:
        return np.zeros(1, dtype=np.int64)
    groups = np.arange(0, m, rows_per_block, dtype=np.int64)
    group_ends = np.minimum(groups + rows_per_block, m)
    fits = indptr[group_ends] - indptr[groups] <= capacity
    if fits.all():
        return np.append(groups, m)
    nnz = int(indptr[-1])
    pieces = max(1, max(nnz // capacity, m // rows_per_block) // steps)
    cuts = np.unique(np.concatenate([
        [0, m], groups[1:][fits[1:] != fits[:-1]],   # where a run of fitting groups ends
        np.linspace(0, m, pieces + 1).astype(np.int64),
        np.searchsorted(indptr, np.linspace(0, nnz, pieces + 1)[1:-1])]))
    first, end = cuts[:-1], cuts[1:]
    walk = ~fits[first // rows_per_block]   # pieces in runs of groups that do not fit
    walked = greedy_walk(indptr, rows_per_block, capacity, first[walk], end[walk])
    return np.append(np.sort(np.concatenate([groups[fits], walked])), m)


def greedy_walk(indptr, rows_per_block, capacity, first, end):
    """The first rows of the greedy blocks of each piece of rows ``first[i]:end[i]``
    (see :func:`adaptive_row_blocks`), the pieces' walks advanced in lock step (numpy
    arrays of one element a piece), each step a binary search over the next
    ``rows_per_block`` rows of each piece."""
    indptr = np.asarray(indptr)
    m = indptr.size - 1
    found = [first]
    top = 1 << (int(rows_per_block).bit_length() - 1)
    while first.size:
        # The most rows k (at least 1) the block at `first` can take: bit by bit.
        limit = np.minimum(first + rows_per_block, end) - first
        reach = indptr[first].astype(np.int64) + capacity   # (no int32 overflow)
        k = np.zeros_like(first)
        bit = top
        while bit:
            more = k + bit
            fits = (more <= limit) & (indptr[np.minimum(first + more, m)] <= reach)
            k = np.where(fits, more, k)
            bit >>= 1
        first = first + np.maximum(k, 1)
        going = first < end
        first, end = first[going], end[going]
        found.append(first)
    return np.concatenate(found)


def compress_block_columns(indices, indptr, row_blocks):
    """col_bits=16 on the host: ``(col_base, row_base, col_off, col_wide)``.  For a row
    block spanning at most ``MAX_BLOCK_SPAN`` columns: its smallest column (also each of
    its rows'), and its entries' uint16 offsets from it.  For a wider one: ``-1 - w``,
    where ``w`` is the position in ``col_wide`` (its entries' 32-bit columns, the wide
    blocks' one after another) of its first entry (a row's: of the row's first entry),
    and offsets 0.  Vectorised: ``segment_bounds``, ``offsets_from``, repeats and masks."""
    blocks = np.asarray(row_blocks, dtype=np.int64)
    indptr = np.asarray(indptr)
    ptr = indptr[blocks].astype(np.int64)
    low, high, counts = segment_bounds(indices, ptr)
    indices = np.asarray(indices)[:int(ptr[-1])]
    rows = np.diff(blocks)
    wide = high - low > MAX_BLOCK_SPAN
    offsets = offsets_from(indices, low, counts)
    if not wide.any():
        return (low, host_arrays.repeat(low, rows), offsets, np.zeros(0, dtype=indices.dtype))
    wide_counts = np.where(wide, counts, 0)
    at = np.cumsum(wide_counts) - wide_counts   # each wide block's first entry in col_wide
    entry_wide = host_arrays.repeat(wide, counts)
    offsets[entry_wide] = 0   # (never read: the escape reads col_wide)
    block_of_row = host_arrays.repeat(np.arange(low.size), rows)
    row_wide = wide[block_of_row]
    row_at = at[block_of_row] + indptr[:-1] - ptr[block_of_row]
    row_base = np.where(row_wide, -1 - row_at, low[block_of_row])
    return np.where(wide, -1 - at, low), row_base, offsets, indices[entry_wide]


def merge_groups(indptr, group_items):
    """``(group_rows, fix_groups)`` of the merge mapping with ``group_items`` merge items
    per work-group.

    The merged sequence holds row ``i``'s entries then its end, so row ``i``'s end is
    item ``indptr[i + 1] + i``, and the rows ended before item ``d`` (the row a merge
    path's diagonal ``d`` starts in) are the ``k`` with ``indptr[k + 1] + k + 1 <= d``:
    ``group_rows[g]`` is that count for ``d = g * group_items`` (the last entry: ``m``),
    one ``searchsorted`` for every group.  ``fix_groups`` lists the groups that end a row
    begun in an earlier group (their first row, whose first entry lies before the
    group's first item): the fix-up kernel completes those rows."""
    indptr = np.asarray(indptr)
    if indptr.dtype.kind not in "iu":
        indptr = indptr.astype(np.int64)
    m = indptr.size - 1
    n_items = m + (int(indptr[-1]) if m > 0 else 0)
    n_groups = -(-n_items // group_items)
    if n_groups == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    diagonals = np.minimum(np.arange(n_groups + 1, dtype=np.int64) * group_items, n_items)
    ends = indptr[1:] + np.arange(1, m + 1, dtype=np.int64)
    rows = np.searchsorted(ends, diagonals, side="right")
    first = rows[:-1]
    began = diagonals[:-1] - first   # the group's first entry
    opened = (first < m) & (began > indptr[np.minimum(first, m - 1)])
    return rows, np.flatnonzero(opened & (rows[1:] > first))


@register
class CSRVector(CSRFormatBase):
    name = "csr-vector"
    complex_values = True
    order = 1
    template = "csr_vector.mako"
    params = (
        P.Param("vector_size", P.optional(P.one_of(*VECTOR_SIZES)),
                "work-items per row (mapping='rows')"),
        P.work_group_size(),
        P.Param("reduction", P.one_of("tree", "serial"), "how a row's partial sums combine"),
        P.Param("mapping", P.one_of(*MAPPINGS),
                "'rows', CSR-Adaptive's row blocks or 'merge' (merge-path items)"),
        P.Param("items_per_thread", P.optional(P.integer(1, MAX_ITEMS_PER_THREAD)),
                "entries each work-item reads per window (mapping='adaptive'), merge "
                "items per work-item (mapping='merge')"),
        P.Param("block_rows", P.or_words(P.positive_int(), "auto", None),
                "most rows of a row block (mapping='adaptive'), at most work_group_size: "
                "'auto' = half the group where that many rows of the mean length fill "
                "a block, else the group"),
        *BLOCK_PARAMS,
        P.Param("col_bits", P.or_words(P.one_of(*COL_BITS), "auto"),
                "bits of a stored column (mapping='adaptive'): 16 = an offset from the row "
                "block's smallest column (a block spanning more than 65535 columns keeps "
                "32), 'auto' = 16 unless such blocks hold over 30% of the entries"),
        VALUE_BITS,
    )
    _col_bits_fallback = False    # col_bits="auto" resolved to 16 (analyse)
    ROW_UNROLL = None             # adaptive mapping: row-sum entries a turn (None: rule)
    n_wide = 0                    # col_escape: the entries in col_wide
    # GPUs: a host matrix goes up as CSR and its 16-bit columns are made there (numpy's
    # per-block reductions took 0.14 s at 20M non-zeros, twice the upload).
    host_input_on_device = True

    # Block kernels for mapping="rows" (the adaptive and merge mappings multiply column by
    # column, unless block_mapping="lanes").
    block_widths = BLOCK_WIDTHS
    block_template = "csr_vector_block.mako"

    @classmethod
    def default_params(cls, features, profile, dtype):
        """The adaptive mapping on GPUs where its windows suit the longest row (see
        ``adaptive_suits``), the row mapping elsewhere."""
        rows = cls._rows_defaults(features, profile, dtype)
        if cls.adaptive_suits(features, profile, adaptive_shape(dtype)):
            return cls._adaptive_defaults(rows, profile, dtype)
        return rows

    @classmethod
    def _rows_defaults(cls, features, profile, dtype):
        vector_size = vector_size_for(features.mean_row_length, profile.lanes(dtype))
        wg = 128 if profile.is_gpu else 64
        wg = max(vector_size, min(wg, profile.max_work_group_size))
        # Barriers are cheap on GPUs (tree) and costly on CPUs (one barrier, serial sum).
        reduction = "serial" if profile.is_cpu else "tree"
        return {"vector_size": vector_size, "work_group_size": wg, "reduction": reduction,
                "mapping": "rows", "items_per_thread": None, "block_rows": None,
                "block_mapping": default_block_mapping(profile), "col_bits": 32,
                "value_bits": full_bits(dtype)}

    @staticmethod
    def _adaptive_defaults(rows, profile, dtype):
        """Adaptive: a group of 128 (at most the device's), 8 entries per work-item (4
        for values wider than 4 bytes: ``adaptive_shape``), no vector size: the best of
        four shapes on an H200 for astro-ph, Groebner_id2003_aug and cage10 (x32).
        ``col_bits="auto"`` on GPUs (16-bit columns, wide blocks escaped: 3-11% faster on
        an H100 without wide blocks, 0-4% with a few), 32 on CPUs (not measured there)."""
        shape = adaptive_shape(dtype)
        return {**rows, "mapping": "adaptive", "vector_size": None,
                "col_bits": "auto" if profile.is_gpu else 32,
                "items_per_thread": shape["items_per_thread"], "block_rows": "auto",
                "work_group_size": pow2_floor(min(shape["work_group_size"],
                                                  profile.max_work_group_size))}

    @staticmethod
    def _merge_defaults(rows, profile):
        """Merge: groups of 128 (at most the device's) and 8 merge items per work-item
        (``MERGE_DEFAULT``), 64 and 32 on CPUs (``MERGE_DEFAULT_CPU``); no vector
        size."""
        shape = MERGE_DEFAULT_CPU if profile.is_cpu else MERGE_DEFAULT
        return {**rows, "mapping": "merge", "vector_size": None,
                "items_per_thread": shape["items_per_thread"],
                "work_group_size": pow2_floor(min(shape["work_group_size"],
                                                  profile.max_work_group_size))}

    @staticmethod
    def adaptive_suits(features, profile, shape):
        """Whether the adaptive mapping of ``shape`` is a GPU default: the longest row
        takes at most ``ADAPTIVE_MAX_WINDOWS`` windows of one group (a power-law graph's
        hub rows: 1.2-3.7 ms against csr5's 0.13 on an H200).  On an H200 it beat the
        row mapping on 4 of 5 irregular matrices, and halved the time of a product
        waited for on cage10 x133 (86 against 178 us)."""
        if not profile.is_gpu or shape["work_group_size"] > profile.max_work_group_size:
            return False
        window = shape["work_group_size"] * shape["items_per_thread"]
        return features.max_row_length <= ADAPTIVE_MAX_WINDOWS * window

    @classmethod
    def resolve_params(cls, features, profile, dtype, given):
        """The defaults of the mapping asked for: ``mapping="rows"`` or a
        ``vector_size`` asks for the row mapping, ``mapping="adaptive"`` for the
        adaptive one, ``mapping="merge"`` for the merge one, neither for
        :meth:`default_params`' choice."""
        rows = cls._rows_defaults(features, profile, dtype)
        mapping = given.get("mapping")
        if mapping is None and given.get("vector_size") is not None:
            mapping = "rows"
        if mapping == "adaptive":
            defaults = cls._adaptive_defaults(rows, profile, dtype)
        elif mapping == "merge":
            defaults = cls._merge_defaults(rows, profile)
        elif mapping is None:
            defaults = cls.default_params(features, profile, dtype)
        else:
            defaults = rows
        params = P.resolve(cls.name, cls.params, defaults, given)
        cls.check_params(params, profile)
        return params

    @classmethod
    def check_params(cls, params, profile):
        wg = params["work_group_size"]
        if params.get("col_bits") not in (32, None) and params["mapping"] != "adaptive":
            raise InvalidParameterError(
                f"csr-vector: col_bits={params['col_bits']!r} needs mapping='adaptive' (the "
                f"16-bit offsets are per row block); mapping={params['mapping']!r} reads "
                "32-bit columns")
        rows = params.get("block_rows")
        if params["mapping"] != "adaptive" and rows is not None:
            raise InvalidParameterError(
                f"csr-vector: block_rows={rows!r} needs mapping='adaptive' (the rows of "
                f"a row block); mapping={params['mapping']!r} has no row blocks")
        if isinstance(rows, int) and rows > wg:
            raise InvalidParameterError(
                f"csr-vector: block_rows={rows} exceeds work_group_size={wg} (a block's "
                "rows are added up by the group's work-items, one row each at least)")
        if params["mapping"] == "rows":
            vs = params["vector_size"]
            if vs is None:
                raise InvalidParameterError(
                    f"csr-vector: vector_size must be one of {VECTOR_SIZES}, not None")
            P.check_multiple(cls.name, params, "vector_size", vs)
            if params["items_per_thread"] is not None:
                raise InvalidParameterError(
                    "csr-vector: items_per_thread belongs to mapping='adaptive' or "
                    "mapping='merge'")
        else:
            mapping = params["mapping"]
            if params["vector_size"] is not None:
                why = ("the whole work-group reads each block" if mapping == "adaptive"
                       else "each work-item takes items_per_thread merge items")
                raise InvalidParameterError(
                    f"csr-vector: mapping={mapping!r} takes no vector_size ({why})")
            if params["items_per_thread"] is None:
                raise InvalidParameterError(
                    f"csr-vector: items_per_thread must be an integer in 1.."
                    f"{MAX_ITEMS_PER_THREAD}, not None")
            if wg & (wg - 1):
                raise InvalidParameterError(
                    f"csr-vector: mapping={mapping!r} needs a power-of-two "
                    f"work_group_size, not {wg}")

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        """CSR's bytes over an efficiency.  The adaptive mapping (the GPU default where
        it suits) is ranked as a format near the bandwidth: on an H100 it was within a
        few per cent of the best format on ten matrices (BENCHMARKS.md, #18), while the
        row mapping's 0.45 ranked it below eight others, so the tuner's first pass never
        timed it (fe_4elt2 x305 float32: 70.3 us, against the chosen sell's 75.9)."""
        if profile.is_gpu and cls.adaptive_suits(features, profile, adaptive_shape(dtype)):
            efficiency = 0.85
        else:
            efficiency = (0.6 if features.mean_row_length >= 32 else
                          0.25 if profile.is_cpu else 0.45)
        return csr_bytes(features, dtype) / efficiency, None

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """The default vector size, half and a quarter of it (at least 2): on an H200,
        rows of 14.5 entries on average (astro-ph) ran in 55 us with 4 work-items per
        row against 73 us with the default 16, the longer rows then taking a few turns.

        GPUs also get the adaptive mapping, in its default shape, with half its entries
        per work-item (float32: 4), and with groups of 256 and 4 entries per work-item
        (rajat01 x32: 31 against 40 us), unless the longest
        row would take one group more than ``ADAPTIVE_MAX_WINDOWS`` windows (a power-law
        graph's hub rows: 1.2-3.7 ms against csr5's 0.13).  The adaptive default then
        comes first: the tuner's first pass times each format's first candidate only,
        and on an H200 it beat the row mapping on 4 of 5 irregular matrices.

        The merge mapping is no candidate: on an H100 (astro-ph, Groebner_id2003_aug,
        rajat01, cage10, wing, replicated to 20M non-zeros, float32 and float64, five
        shapes) it lost to the adaptive mapping in 9 of 10 cases (astro-ph float32:
        129-277 us against 101; wing float64: 248-1000 against 198); only rajat01
        float32 ran faster (110 against 126 us), where bccoo is the measured pick
        anyway.  Each work-item reads its own run of entries, so a warp's loads are not
        coalesced.  On CPUs sell is the format to tune (3-5x faster than any csr-vector
        mapping on PoCL)."""
        vs = cls._rows_defaults(features, profile, dtype)["vector_size"]
        rows = [{"mapping": "rows"}] + [{"mapping": "rows", "vector_size": v}
                                        for v in (vs // 2, vs // 4) if v >= 2]
        items = adaptive_shape(dtype)["items_per_thread"]
        # Half the default's entries a work-item where that leaves 4 (4-byte values):
        # on an H100 rajat01 x463 float32 (rows of 6.3 on average, up to 1442) ran in
        # 79.4 against 95.4 us (cuSPARSE 99.0), while the nine other matrices lost
        # 0-7%; 2 entries lost 5-10% in float64 (BENCHMARKS.md, #18).
        half = [{"items_per_thread": items // 2}] if items // 2 >= 4 else []

        def suiting(shapes):
            return [{"mapping": "adaptive", **shape} for shape in shapes
                    if cls.adaptive_suits(features, profile, {**adaptive_shape(dtype), **shape})]
        first = suiting([{}] + half)
        if not first:
            return rows
        # Adaptive default, its half window, the row default, the other adaptive shape,
        # narrower vectors (the tuner's second pass times the first three after the
        # default).
        return first + rows[:1] + suiting([{"work_group_size": 256, "items_per_thread": 4}]) \
            + rows[1:]

    @property
    def _adaptive(self):
        return self.params["mapping"] == "adaptive"

    @property
    def _merge(self):
        return self.params["mapping"] == "merge"

    @property
    def _narrow(self):
        return self.params.get("col_bits") == 16

    def analyse(self, csr):
        """The merge mapping's position type: merge items (``m + nnz``, plus a group's
        worth past the end) in 32 bits where they fit, else 64.  ``col_bits="auto"``:
        16, unless the conversion finds too many entries in blocks too wide (then 32 and
        the kernels built again); no entries, nothing to narrow."""
        self.nnz = int(csr.indptr[-1]) if self.shape[0] else 0
        if self.params.get("col_bits") in ("auto", None):
            self.params["col_bits"] = 16 if self.nnz and self._adaptive else 32
            self._col_bits_fallback = self._narrow
        group = self.params["work_group_size"] * (self.params["items_per_thread"] or 1)
        self.pos_dtype = np.dtype(np.int32 if fits_int32(self.shape[0] + self.nnz + group)
                                  else np.int64)

    def type_names(self):
        return {"pos_t": self.pos_dtype}

    def template_params(self):
        return {**super().template_params(),
                "vector_size": self.params["vector_size"], "reduction": self.params["reduction"],
                "mapping": self.params["mapping"],
                "items_per_thread": self.params["items_per_thread"],
                "pos_t": "int" if self.pos_dtype == np.int32 else "long",
                "col_bits": self.params["col_bits"],
                "row_unroll": self.ROW_UNROLL or row_unroll(self.dtype),
                "device_conversion": self.converting_on_device,
                "streamed_loads": self._streamed_loads()}

    def _streamed_loads(self):
        """The adaptive mapping reads values and columns through ``STREAMV``/``STREAMI``
        (common.mako) where ``streamed_loads_ok``.  On an H100 (20M non-zeros, same
        process): Groebner_id2003_aug float64 106.0 -> 93.0 us, cage10 float32 75.2 ->
        66.3, Groebner float32 77.8 -> 72.2, astro-ph 2-3% faster, rajat01 float32 2%
        slower, the rest within 1% (BENCHMARKS.md, #18)."""
        return self._adaptive and self.streamed_loads_ok()

    def kernel_specs(self):
        if self._merge:
            group_rows = matrix("group_rows", "index_t")
            return [
                KernelSpec("csr_vector_merge", (
                    scalar("n_rows", "index_t"), scalar("nnz", "index_t"), group_rows,
                    *CSR_ARRAYS, X_ARG, Y_ARG, scratch("head"), scratch("carry"),
                    ALPHA_ARG, BETA_ARG), fixed_group=True),
                KernelSpec("csr_vector_merge_fixup", (
                    scalar("n_fix", "index_t"), matrix("fix_groups", "index_t"), group_rows,
                    Y_ARG, scratch("head", read_only=True), scratch("carry", read_only=True),
                    ALPHA_ARG, BETA_ARG)),
            ]
        if not self._adaptive:
            return [KernelSpec("csr_vector", CSR_ROW_ARGS, fixed_group=True)]
        specs = [KernelSpec("csr_vector", (matrix("row_blocks", "index_t"),
                                           *self._csr_arrays("col_base"), *PRODUCT_ARGS),
                            fixed_group=True)]
        if self._narrow and self.converting_on_device:
            specs.append(KernelSpec("csr_vector_compress", (
                scratch("blocks_in", "index_t", read_only=True),
                matrix("csr_row_ptr", "index_t"), matrix("csr_col_idx", "index_t"),
                scratch("col_base_out", "index_t"), scratch("row_base_out", "index_t"),
                scratch("col_off_out", "ushort"), scratch("bad", "int")),
                fixed_group=True))
            if self.col_escape:
                specs.append(KernelSpec("csr_vector_widen", (
                    scratch("widen_blocks", "index_t", read_only=True),
                    scratch("widen_at", "index_t", read_only=True),
                    scratch("blocks_in", "index_t", read_only=True),
                    matrix("csr_row_ptr", "index_t"), matrix("csr_col_idx", "index_t"),
                    scratch("col_base_out", "index_t"), scratch("row_base_out", "index_t"),
                    scratch("col_wide_out", "index_t")), fixed_group=True))
        return specs

    def _csr_arrays(self, base):
        """row_ptr, the columns, values: ``col_idx``, or with col_bits=16 the bases
        ``base`` (``col_base`` per block, ``row_base`` per row), ``col_off`` and, when
        some block escapes, ``col_wide``."""
        if not self._narrow:
            return CSR_ARRAYS
        wide = (matrix("col_wide", "index_t"),) if self.col_escape else ()
        return (CSR_ARRAYS[0], matrix(base, "index_t"), matrix("col_off", "ushort"), *wide,
                CSR_ARRAYS[2])

    def lanes_matrix_args(self):
        return (scalar("n_rows", "long"), *self._csr_arrays("row_base"), *self._row_order_arg())

    def local_bytes(self, work_group_size):
        if self._merge:   # one carry (row and partial sum) per work-item
            return work_group_size * (self.dtype.itemsize + self.index_dtype.itemsize)
        items = self.params["items_per_thread"] if self._adaptive else 1
        return work_group_size * items * self.dtype.itemsize

    def min_work_group_size(self):
        return 1 if self.params["mapping"] != "rows" else self.params["vector_size"]

    def convert(self, csr):
        blocks = self._row_blocks(csr.indptr)
        if not self._narrow:
            return {**super().convert(csr), **blocks}
        base, row_base, offsets, col_wide = compress_block_columns(
            csr.indices, csr.indptr, blocks["row_blocks"])
        if col_wide.size and not self._escape(col_wide.size):
            return {**super().convert(csr), **blocks}   # 32 bits after all
        # (no 32-bit col_idx: the CSR arrays but the columns)
        arrays = {"row_ptr": host_arrays.cast(csr.indptr, self.index_dtype),
                  "values": self.stored_values(csr.data), **blocks}
        wide = {"col_wide": col_wide.astype(self.index_dtype)} if col_wide.size else {}
        return {**arrays, "col_base": base.astype(self.index_dtype),
                "row_base": row_base.astype(self.index_dtype), "col_off": offsets, **wide}

    def convert_device(self, csr):
        host_blocks = self._row_blocks(csr.indptr)   # from indptr, which is on the host too
        blocks = {name: cla.to_device(self.device.queue, array)
                  for name, array in host_blocks.items()}
        columns = self._compress_device(csr, host_blocks["row_blocks"],
                                        blocks["row_blocks"]) if self._narrow else None
        if columns is None:   # 32-bit columns: the CSR arrays as they are
            return {**super().convert_device(csr), **blocks}
        queue = self.device.queue
        arrays = {"row_ptr": csr.as_type("indptr", self.index_dtype, queue, copy=True),
                  **columns, "values": self.device_values(csr, queue, copy=True), **blocks}
        queue.finish()   # ordered before any product, whatever the queue's order
        return arrays

    def _compress_device(self, csr, host_blocks, row_blocks):
        """col_bits=16 on the device: the column arrays (``col_base``, ``row_base``,
        ``col_off``), made by ``csr_vector_compress`` (a group per row block), which
        finds each block's smallest column, writes the bases and the offsets, and flags
        a block too wide (its base -1); the flag, one int, is read back.  With a wide
        block, the bases are read back too, and ``csr_vector_widen`` (a group per wide
        block) writes their escapes and ``col_wide`` (``compress_block_columns``).  None
        after falling back to 32-bit columns (col_bits="auto" and too many entries in
        wide blocks)."""
        queue = self.device.queue
        idx, m, nnz = self.index_dtype, self.shape[0], self.nnz
        if not nnz:   # (col_bits=16 asked for) no entries: every base 0, as on the host
            return {"col_base": cla.zeros(queue, self.n_blocks, idx),
                    "row_base": cla.zeros(queue, m, idx),
                    "col_off": cla.empty(queue, 0, np.uint16)}
        columns = {"col_base": cla.empty(queue, self.n_blocks, idx),
                   "row_base": cla.empty(queue, m, idx),
                   "col_off": cla.empty(queue, nnz, np.uint16)}
        csr_arrays = {"blocks_in": row_blocks.base_data,
                      "csr_row_ptr": csr.as_type("indptr", idx, queue).base_data,
                      "csr_col_idx": csr.as_type("indices", idx, queue).base_data,
                      "col_base_out": columns["col_base"].base_data,
                      "row_base_out": columns["row_base"].base_data}
        wg = self.params["work_group_size"]
        if not self.run_check(queue, "csr_vector_compress", self.n_blocks * wg, wg,
                              col_off_out=columns["col_off"].base_data, **csr_arrays):
            return columns
        # Which blocks are wide, and where their columns go (on the host: a few bytes a
        # block; the row pointers are on the host too).
        wide_blocks = np.flatnonzero(columns["col_base"].get(queue) < 0)
        blocks = host_blocks.astype(np.int64)
        indptr = np.asarray(csr.indptr)
        counts = (indptr[blocks[wide_blocks + 1]] - indptr[blocks[wide_blocks]]).astype(np.int64)
        if not self._escape(int(counts.sum())):
            return None
        at = np.cumsum(counts) - counts
        columns["col_wide"] = cla.empty(queue, self.n_wide, idx)
        self.run_now(queue, [self.step(
            "csr_vector_widen", wide_blocks.size * wg, wg,
            widen_blocks=cla.to_device(queue, wide_blocks.astype(idx)).base_data,
            widen_at=cla.to_device(queue, at.astype(idx)).base_data,
            col_wide_out=columns["col_wide"].base_data, **csr_arrays)], finish=True)
        return columns

    def _escape(self, n_wide):
        """Some row blocks span more than 16 bits of columns, ``n_wide`` entries in all:
        with col_bits="auto" and more than ``AUTO_MAX_WIDE_SHARE`` of the entries, 32-bit
        columns (False); otherwise those blocks keep theirs in ``col_wide`` (True).
        Either way the kernels are built again."""
        if self._col_bits_fallback and n_wide > AUTO_MAX_WIDE_SHARE * self.nnz:
            self.params["col_bits"] = 32
        else:
            self.col_escape, self.n_wide = True, n_wide
        self._col_bits_fallback = False
        self._rebuild()
        return self.col_escape

    def read_csr(self, queue, wait_for=None, staging=None):
        """The CSR arrays; with col_bits=16 the columns put back together on the host
        (each row's base repeated over its entries, plus the offsets; the escaped
        blocks' entries from ``col_wide``)."""
        if not self._narrow:
            return super().read_csr(queue, wait_for, staging)
        nnz = self.value_array_sizes["values"]
        wide = (("col_wide", self.index_dtype, self.n_wide),) if self.col_escape else ()
        (indptr, row_base, offsets, values, *col_wide), events = self.read_arrays(
            queue, (("row_ptr", self.index_dtype, self.shape[0] + 1),
                    ("row_base", self.index_dtype, self.shape[0]),
                    ("col_off", np.uint16, nnz), ("values", self.value_dtype, nnz), *wide),
            wait_for, staging)
        if events:
            cl.wait_for_events(events)
        lengths = np.diff(indptr.astype(np.int64))
        cols = host_arrays.repeat(row_base, lengths)
        host_arrays.add_in_pieces(cols, offsets)   # (the GIL let go: a thread's)
        if col_wide:
            cols[host_arrays.repeat(row_base < 0, lengths)] = col_wide[0]
        return [indptr, cols.astype(self.index_dtype, copy=False),
                values.astype(self.dtype, copy=False)], []

    def _row_blocks(self, indptr):
        """The adaptive mapping's row blocks (each holds at most one row per work-item
        of the group as built), the merge mapping's groups (``merge_groups``), nothing
        for the rows mapping."""
        wg = self.params["work_group_size"]
        if self._merge:
            rows, fix = merge_groups(indptr, wg * self.params["items_per_thread"])
            self.n_groups, self.n_fix = rows.size - 1, fix.size
            return {"group_rows": rows.astype(self.index_dtype),
                    "fix_groups": fix.astype(self.index_dtype)}
        if not self._adaptive:
            return {}
        capacity = adaptive_capacity(indptr, wg, self.params["items_per_thread"], self.dtype)
        if self.params.get("block_rows") in ("auto", None):
            self.params["block_rows"] = default_block_rows(indptr, wg, capacity)
        blocks = adaptive_row_blocks(indptr, self.params["block_rows"], capacity)
        self.n_blocks = blocks.size - 1
        return {"row_blocks": blocks.astype(self.index_dtype)}

    def scratch_sizes(self):
        """The merge mapping's per-group sums: of a row begun in an earlier group
        (``head``) and of the row the group ends in (``carry``)."""
        if not self._merge:
            return {}
        size = self.n_groups * self.dtype.itemsize
        return {"head": size, "carry": size}

    def launches(self, beta):
        wg = self.params["work_group_size"]
        if self._merge:
            if self.n_groups == 0:   # no rows: nothing to launch
                return []
            steps = [self.step("csr_vector_merge", self.n_groups * wg, wg,
                               n_rows=self.shape[0], nnz=self.nnz)]
            if self.n_fix:
                steps.append(self.step("csr_vector_merge_fixup", round_up(self.n_fix, wg), wg,
                                       n_fix=self.n_fix))
            return steps
        if not self._adaptive:
            return [self.step("csr_vector", *launch_rows(
                self.shape[0], wg // self.params["vector_size"], wg), n_rows=self.shape[0])]
        if self.n_blocks == 0:   # no rows: nothing to launch
            return []
        return [self.step("csr_vector", self.n_blocks * wg, wg)]

    # -- block kernels (block_mapping="items" needs mapping="rows"; "lanes": any) ------
    def supported_block_widths(self):
        if self.params["mapping"] != "rows" and not self._lanes:
            return ()
        return super().supported_block_widths()

    def items_block_kernel_specs(self, kb):
        return [KernelSpec("csr_vector_block", CSR_ROW_BLOCK_ARGS, fixed_group=True)]

    def items_block_local_bytes(self, kb, work_group_size):
        return work_group_size * kb * self.dtype.itemsize

    def items_block_launches(self, kb, work_group_size, beta):
        wg = work_group_size
        return [self.step("csr_vector_block", *launch_rows(
            self.shape[0], wg // self.params["vector_size"], wg), n_rows=self.shape[0])]
