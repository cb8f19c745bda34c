"""How scattered a matrix's numbering leaves a product's reads of x (a hint to the
caller, never a choice of the library's).

A GPU kernel reads x at the columns of the entries its warp holds at once; 32 rows'
k-th entries that lie in 32 different cache lines cost a line each.  A mesh numbered
without regard to its graph does that (wing: 30 of 32 lines), and renumbering it once
by reverse Cuthill-McKee made its products 2.4x faster on an H100; renumbering inside
every product did not pay (BENCHMARKS.md, #18).  So the operator only says so
(``SpMV.explanation``), and the README shows how to renumber in the caller's code.
"""

from __future__ import annotations

import numpy as np

#: Rows read together, lines per load counted: a warp's worth.
GROUP_ROWS = 32
#: Entries per row looked at (the first ones: rows shorter than that count less).
ENTRIES = 4
#: Groups of rows sampled (fixed seed: the same matrix always gives the same number).
SAMPLES = 256
#: Bytes of a cache line.
LINE_BYTES = 128
#: Lines (of 32 at most) from which the explanation suggests renumbering: wing has 30.2
#: (2.4x faster renumbered, float32 sell on an H100); the other shared matrices 2.2-14.4
#: (astro-ph 14.4: 1.1-1.2x; the rest within a few per cent, or slower).
HINT_LINES = 20.0


def scattered_lines(indptr, indices, itemsize) -> float | None:
    """Mean number of distinct ``LINE_BYTES`` lines of x (values of ``itemsize`` bytes)
    that the k-th entries (k < ``ENTRIES``) of ``GROUP_ROWS`` consecutive rows touch, over
    ``SAMPLES`` groups of rows drawn with a fixed seed; None for fewer rows than a group
    or no entries.  Vectorised over the sampled groups (with 512 of them: 0.9-1.8 ms at
    20M entries on an H100's host, random reads of indptr and indices; 256 now).  Shared
    matrices: wing 30.2 (float32), astro-ph 14.4, the other eight 2.2-7.3; given a
    random numbering, 18-31."""
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    m = indptr.size - 1
    groups = m // GROUP_ROWS
    if groups == 0 or indptr[-1] == 0:
        return None
    # (with replacement: choice without it permutes every group, 2 ms at 5M rows)
    picked = np.random.default_rng(0).integers(0, groups, size=min(SAMPLES, groups))
    rows = picked[:, None] * GROUP_ROWS + np.arange(GROUP_ROWS)     # (s, 32)
    starts, lengths = indptr[rows], indptr[rows + 1] - indptr[rows]
    per_value = max(1, LINE_BYTES // int(itemsize))
    total = loads = 0
    for k in range(ENTRIES):
        present = lengths > k
        if not present.any():
            break
        lines = np.where(present, indices[np.where(present, starts + k, 0)] // per_value, -1)
        lines.sort(axis=1)
        distinct = (np.diff(lines, axis=1) != 0).sum(axis=1) + (lines[:, 0] >= 0)
        used = present.any(axis=1)
        total += int(distinct[used].sum())
        loads += int(used.sum())
    return total / loads if loads else None


def hint(csr, itemsize) -> str:
    """A sentence for the operator's explanation when ``csr`` (a square host matrix) is
    numbered so that x's reads scatter, else ''."""
    if csr.shape[0] != csr.shape[1] or not isinstance(csr.indices, np.ndarray):
        return ""
    lines = scattered_lines(csr.indptr, csr.indices, itemsize)
    if lines is None or lines < HINT_LINES:
        return ""
    return (f"; its numbering scatters the reads of x ({lines:.0f} cache lines of "
            f"{GROUP_ROWS} per load of {GROUP_ROWS} rows' entries): renumbered once, e.g. "
            "by reverse Cuthill-McKee, and solved in that numbering, its products may run "
            "about twice as fast (wing: 2.4x on an H100; README, 'Matrices numbered "
            "without regard to their graph').")
