"""16-bit column indices on the host (sell's and csr-vector's ``col_bits=16``): each
segment of a column array (a slice of sell, a row block of csr-vector) stored as
offsets from its smallest column."""

import numpy as np

from .. import host_arrays


def segment_bounds(col_idx, seg_ptr, pad=None):
    """``(low, high, counts)``: each segment's smallest and largest column (0 for an
    empty segment) and its entry count, for the segments ``seg_ptr`` (entry boundaries
    from 0) of ``col_idx``.  With ``pad``, entries below 0 are padding, left out of the
    bounds.  Vectorised: a ``reduceat`` per bound."""
    seg_ptr = np.asarray(seg_ptr, dtype=np.int64)
    col_idx = np.asarray(col_idx)[:int(seg_ptr[-1])]
    counts = np.diff(seg_ptr)
    filled = counts > 0   # reduceat needs each segment non-empty: empty ones keep 0
    starts = seg_ptr[:-1][filled]
    low = np.zeros(counts.size, dtype=np.int64)
    high = np.zeros(counts.size, dtype=np.int64)
    if starts.size:   # (a sell slice of width > 0 holds at least one real entry)
        real = col_idx if pad is None else \
            np.where(col_idx >= 0, col_idx, np.iinfo(np.int64).max)
        low[filled] = np.minimum.reduceat(real, starts)
        high[filled] = np.maximum.reduceat(col_idx, starts)
    return low, high, counts


def column_offsets(col_idx, seg_ptr, max_span, pad=None):
    """``(base, offsets)``: each segment's smallest column (0 for an empty segment) and
    every entry's uint16 offset from its segment's, for the segments ``seg_ptr`` of
    ``col_idx`` (``segment_bounds``); None when a segment spans more than ``max_span``
    columns.  With ``pad``, padding entries (below 0) are stored as ``pad``."""
    base, high, counts = segment_bounds(col_idx, seg_ptr, pad)
    if np.any(high - base > max_span):
        return None
    col_idx = np.asarray(col_idx)[:int(np.asarray(seg_ptr)[-1])]
    return base, offsets_from(col_idx, base, counts, pad)


def offsets_from(col_idx, base, counts, pad=None):
    """Every entry's offset from its segment's ``base`` (segments of ``counts`` entries,
    one after another), as uint16 (an offset beyond 16 bits wraps: the caller either
    checked the spans or overwrites those entries).  With ``pad``, padding entries
    (below 0) are stored as ``pad``."""
    offsets = col_idx - host_arrays.repeat(base, counts)
    if pad is not None:
        offsets = np.where(col_idx >= 0, offsets, pad)
    return offsets.astype(np.uint16)
