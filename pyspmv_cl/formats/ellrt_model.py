"""The analytical ELLR-T tuning model of Vázquez, Fernández and Garzón ("Automatic
tuning of the sparse matrix vector product on GPUs based on the ELLR-T approach",
section 3.3).

ELLR-T time is taken to be proportional to the memory accesses of the busiest
compute unit (SM).  With ``T`` work-items per row and blocks of ``BS`` work-items
assigned cyclically to the ``n`` compute units:

* eq. 3: a warp of ``ws`` work-items costs ``MAX_1 + MAX_2``, the largest per-thread
  access count in each half-warp; a thread of row ``i`` makes ``ceil(rl[i] / T)``
  accesses (the paper's "row length" of a half-warp, read as the iterations of its
  threads -- with ``rl[i]`` itself, ``T = 1`` would always win, against the paper's
  ``T* = 32`` for dense2).  When ``T > ws / 2`` a row spans ``T / (ws / 2)``
  half-warps, each paying its iterations;
* eq. 2: a block costs the sum over its ``ceil(BS / ws)`` warps;
* eq. 1: compute unit ``sm`` costs the sum over blocks ``sm, sm + n, sm + 2n, ...``;
* eq. 4: ``M_ELLR-T(rl, BS, T)`` is the maximum over compute units, and the model
  picks the ``(BS, T)`` minimising it.

``overhead`` adds that many accesses to every half-warp holding a row (0, the
default, is eq. 3 as printed; 1 counts the coalesced read of ``rl[]`` a half-warp
makes before its loop).  Ties (equal ``M``) go to the smallest ``T`` (fewest reduction
steps and barriers), then to the largest ``BS``.

Table 1 of the paper (GTX 285: 30 SMs, ws = 32; the model's block sizes there are
128, 256 and 512, what the GT200 needs for full occupancy with at most 8 resident
blocks of 1024 threads per SM) against this implementation, for the matrices that
can be rebuilt (tests/test_ellrt_model.py):

* dense2 (2000 x 2000 dense): BS* = 128, T* = 32 -- reproduced (either overhead);
* qcd5_4 (49,152 rows of 39): BS* = 128, T* = 1 -- reproduced (either overhead);
* gemat12 (SuiteSparse, the same 4929 rows and 33,111 entries): BS* = 128, T* = 2 --
  reproduced with ``overhead=1`` only; eq. 3 as printed gives T = 8 (M = 108 against
  146 for T = 2), as short rows (mean 6.7) then cost one access per thread whatever
  ``T``.  ``ellr-t`` therefore uses ``overhead=1``.
The other rows need matrices that are not available here (UF collection downloads).
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InvalidParameterError
from ..host_arrays import reduce_groups

DEFAULT_BLOCK_SIZES = (128, 256, 512)
#: Rows from which the candidate T values are evaluated on threads of their own.
PARALLEL_ROWS = 1 << 20


def _positive_ints(name, values):
    values = tuple(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1
                         for v in values):
        raise InvalidParameterError(f"{name} must be positive integers, not {values!r}")
    return tuple(int(v) for v in values)


def _pad_to(array, length):
    out = np.zeros(length, dtype=array.dtype)
    out[:array.size] = array
    return out


def _ceil_div(values, t):
    """``ceil(values / t)`` for non-negative values; a shift when ``t`` is a power of
    two (integer division is several times slower on arrays of millions)."""
    if t & (t - 1) == 0:
        return (values + (t - 1)) >> (t.bit_length() - 1)
    return -(-values // t)


def _unit_costs(row_lengths, t, half_warp, overhead, longest=None):
    """Eq. 3 per scheduling unit for ``T = t``: ``(costs, threads per unit)``.  For
    ``t <= ws/2`` a unit is a half-warp holding ``ws / 2 / t`` consecutive rows and
    paying the largest iteration count among them (``ceil(max(rl) / t)``: the ceiling
    is monotonic, so the rows are reduced first; ``longest`` may hold those maxima);
    otherwise a unit is one row, spanning ``t / (ws/2)`` half-warps that each run the
    row's iterations."""
    if t <= half_warp:
        group = max(1, half_warp // t)
        if longest is None:
            longest = reduce_groups(row_lengths, group, np.maximum)
        return _ceil_div(longest, t) + overhead, group * t
    span = -(-t // half_warp)
    return span * (_ceil_div(row_lengths, t) + overhead), t


def _nested(base, groups, ufunc):
    """``{group: ufunc over consecutive groups of base}`` for each group, each made from
    the largest smaller group that divides it (groups of groups are groups: the short
    group can only be the last)."""
    out = {1: base}
    for group in sorted(set(groups)):
        inner = max(g for g in out if group % g == 0)
        if group != inner:
            out[group] = reduce_groups(out[inner], group // inner, ufunc)
    return out


def _busiest(blocks, compute_units):
    """Eq. 1 and 4: blocks assigned cyclically to the compute units; the largest sum
    over one compute unit."""
    rounds = -(-blocks.size // compute_units)
    return int(_pad_to(blocks, rounds * compute_units).reshape(rounds, compute_units)
               .sum(axis=0).max())


def _busiest_unit_sum(costs, units_per_block, compute_units):
    """Eq. 1, 2 and 4: blocks of ``units_per_block`` consecutive units, assigned
    cyclically to the compute units; the largest sum over one compute unit."""
    blocks = reduce_groups(costs, units_per_block, np.add)
    return _busiest(blocks, compute_units)


def _block_costs(iterations, t, block_size, half_warp, overhead):
    """Eq. 2 and 3 per block, for a block size that is not a whole number of units (a
    half-warp then ends at the block's end: warps never span blocks)."""
    n_rows = iterations.size
    rows_per_block = block_size // t
    n_blocks = -(-n_rows // rows_per_block)
    padded = n_blocks * rows_per_block
    it = _pad_to(iterations, padded).reshape(n_blocks, rows_per_block)
    live = _pad_to(np.ones(n_rows, dtype=np.int64), padded).reshape(n_blocks, rows_per_block)
    if t > half_warp:
        return (-(-t // half_warp) * (it + overhead * live)).sum(axis=1)
    group = max(1, half_warp // t)
    groups = -(-rows_per_block // group)
    shape = (n_blocks, groups, group)
    it_g = np.zeros((n_blocks, groups * group), dtype=np.int64)
    it_g[:, :rows_per_block] = it
    live_g = np.zeros_like(it_g)
    live_g[:, :rows_per_block] = live
    return (it_g.reshape(shape).max(axis=2)
            + overhead * live_g.reshape(shape).max(axis=2)).sum(axis=1)


def _accesses(row_lengths, compute_units, half_warp, block_size, t, overhead, units=None):
    if row_lengths.size == 0:
        return 0
    costs, unit_threads = units or _unit_costs(row_lengths, t, half_warp, overhead)
    if block_size % unit_threads == 0:
        return _busiest_unit_sum(costs, block_size // unit_threads, compute_units)
    blocks = _block_costs(_ceil_div(row_lengths, t), t, block_size, half_warp, overhead)
    return _busiest_unit_sum(blocks, 1, compute_units)


def ellrt_memory_accesses(row_lengths, compute_units, warp_size, block_size, t, overhead=0):
    """``M_ELLR-T(rl, BS, T)`` of eq. 4 (see the module docstring)."""
    rl = np.asarray(row_lengths, dtype=np.int64).ravel()
    return _accesses(rl, int(compute_units), max(1, int(warp_size) // 2),
                     int(block_size), int(t), int(overhead))


def ellrt_model(row_lengths, compute_units, warp_size, block_sizes=DEFAULT_BLOCK_SIZES,
                t_values=None, overhead=0):
    """The ``(block_size, t)`` minimising eq. 4 for rows of lengths ``row_lengths`` on a
    device of ``compute_units`` compute units and SIMD width ``warp_size``.

    ``t_values`` defaults to the powers of two up to ``warp_size`` (64 at most);
    combinations where ``t`` does not divide the block size are skipped.  Ties go to
    the smallest ``t``, then the largest block size.  Vectorised over the rows."""
    compute_units, warp_size = _positive_ints("compute_units and warp_size",
                                              (compute_units, warp_size))
    block_sizes = _positive_ints("block_sizes", block_sizes)
    if t_values is None:
        t_values = [1 << k for k in range(7) if 1 << k <= min(warp_size, 64)]
    t_values = _positive_ints("t_values", t_values)
    if isinstance(overhead, bool) or not isinstance(overhead, (int, np.integer)) \
            or overhead < 0:
        raise InvalidParameterError(f"overhead must be a non-negative integer, not {overhead!r}")
    rl = np.asarray(row_lengths).ravel()
    if rl.size and (not np.issubdtype(rl.dtype, np.integer) or rl.min() < 0):
        raise InvalidParameterError("row_lengths must be non-negative integers")
    # 32-bit counts where no block's sum can overflow them (the compute units' sums
    # are numpy sums, made in 64 bits): half the bytes of every pass.
    small = rl.size and (int(rl.max()) + overhead + 1) * 2 * max(block_sizes) < 2 ** 31
    rl = rl.astype(np.int32 if small else np.int64, copy=False)
    half_warp = max(1, warp_size // 2)
    ts = sorted(set(t_values))
    # The half-warps' longest rows for every t <= ws/2, each from the next finer one:
    # the rows are read once, not once per t (5M rows: 0.66 -> 0.05 s with the rest).
    maxima = _nested(rl, [max(1, half_warp // t) for t in ts if t <= half_warp],
                     np.maximum) if rl.size else {}

    def candidates(t):   # {block size: M} for this t
        sizes = [bs for bs in sorted(set(block_sizes), reverse=True) if bs % t == 0]
        if not rl.size:
            return {bs: 0 for bs in sizes}
        costs, unit_threads = _unit_costs(rl, t, half_warp, overhead,
                                          maxima.get(max(1, half_warp // t)))
        whole = [bs for bs in sizes if bs % unit_threads == 0]
        sums = _nested(costs, [bs // unit_threads for bs in whole], np.add)
        return {bs: _busiest(sums[bs // unit_threads], compute_units) if bs in whole
                else _accesses(rl, compute_units, half_warp, bs, t, overhead,
                               (costs, unit_threads)) for bs in sizes}

    # Each t on a thread of its own for millions of rows: numpy's passes release the
    # GIL (5.1M rows on this repository's 2-core VM: 51 -> 40 ms).
    workers = min(len(ts), os.cpu_count() or 1) if rl.size >= PARALLEL_ROWS else 1
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            tables = list(pool.map(candidates, ts))
    else:
        tables = [candidates(t) for t in ts]
    best = None
    for t, table in zip(ts, tables):
        for bs, m in table.items():
            if best is None or m < best[0]:  # strict: earlier (smaller T, larger BS) wins ties
                best = (m, bs, t)
    if best is None:
        raise InvalidParameterError(f"no t in {t_values} divides a block size in {block_sizes}")
    return best[1], best[2]
