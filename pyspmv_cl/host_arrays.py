"""Host array work on millions of rows: ``np.repeat`` in pieces that let other Python
threads run, reductions over consecutive groups without padded copies, and casts and
bounds of large arrays split over threads (``cast``, ``min_max``).

Online tuning converts and ranks candidates in a background thread while the caller
multiplies.  The caller needs the GIL after every product it waits for, and some numpy
operations keep the GIL for their whole run: ``np.repeat`` over 20M entries holds it
for 30-70 ms on an H200's host.  Measured there (astro-ph, cage10, Groebner_id2003_aug
and wing replicated to 20M non-zeros), the caller's products stalled 0.07-0.3 s per
online measurement behind such calls, most of it ``np.repeat``.  Done in pieces of
``PIECE`` entries, with a short sleep between pieces off the main thread, no stall
exceeds one piece's time.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

#: Output entries per piece: about 2-4 ms of np.repeat on the hosts measured.
PIECE = 1 << 20
#: Seconds a background thread sleeps between pieces: long enough for a thread waiting
#: for the GIL to take it (a zero sleep may re-take it first).
YIELD_SECONDS = 1e-4


def yield_gil() -> None:
    """Let a thread waiting for the GIL run (no-op on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        time.sleep(YIELD_SECONDS)


def repeat(values, counts, dtype=None) -> np.ndarray:
    """``np.repeat(values, counts)`` (1-D) as ``dtype`` (default: ``values``'), in
    pieces of about ``PIECE`` entries."""
    values = np.asarray(values)
    counts = np.asarray(counts, dtype=np.int64)
    dtype = values.dtype if dtype is None else np.dtype(dtype)
    if values.shape != counts.shape or values.ndim != 1:
        raise ValueError("repeat: values and counts must be 1-D arrays of one length")
    ends = np.cumsum(counts)
    total = int(ends[-1]) if ends.size else 0
    if total <= PIECE:
        return np.repeat(values, counts).astype(dtype, copy=False)
    out = np.empty(total, dtype=dtype)
    for lo, hi in _pieces(ends):
        start = int(ends[lo - 1]) if lo else 0
        out[start:int(ends[hi - 1])] = np.repeat(values[lo:hi], counts[lo:hi])
    return out


def add_in_pieces(out, addend) -> np.ndarray:
    """``out += addend`` (1-D, one length) in pieces of ``PIECE`` entries, letting
    waiting threads run between them; returns ``out``."""
    for start in range(0, out.size, PIECE):
        out[start:start + PIECE] += addend[start:start + PIECE]
        yield_gil()
    return out


def _pieces(ends):
    """``(lo, hi)``: consecutive ranges of groups (group i's entries end at ``ends[i]``,
    cumulative) of about ``PIECE`` entries each (a longer group alone), letting waiting
    threads run after each piece is handled."""
    total = int(ends[-1]) if len(ends) else 0
    # Piece boundaries: the first group whose entries end past k * PIECE.
    cuts = np.searchsorted(ends, np.arange(PIECE, total, PIECE, dtype=np.int64),
                           side="right")
    lo = 0
    for hi in [*np.unique(cuts).tolist(), len(ends)]:
        if hi <= lo:
            continue
        yield lo, hi
        lo = hi
        yield_gil()


def entry_rows(indptr, dtype=np.int64) -> np.ndarray:
    """The row of every stored entry of a CSR with row pointers ``indptr``.  Far fewer
    entries than rows (hypersparse: 1 entry in 20M rows) are found by a binary search
    each, not a pass over every row: bccoo's ranking asks this for 12 block shapes, 3 s
    of a 1 s tuning budget on that matrix (a 2-core VM)."""
    indptr = np.asarray(indptr)
    n_rows = indptr.size - 1
    nnz = int(indptr[-1]) if n_rows > 0 else 0
    if n_rows > 16 * nnz * max(1, n_rows.bit_length()):
        return (np.searchsorted(indptr, np.arange(nnz), side="right") - 1).astype(
            dtype, copy=False)
    return repeat(np.arange(n_rows, dtype=dtype), np.diff(indptr), dtype)


def bare_csr(shape, data, indices, indptr) -> sp.csr_matrix:
    """A scipy ``csr_matrix`` on these arrays as they are: no checks and no copies (the
    caller checks them), of any value type (scipy's constructors refuse float16, which
    its arrays hold: its dtype is the data's)."""
    csr = sp.csr_matrix(tuple(shape), dtype=np.float64)
    csr.data, csr.indices, csr.indptr = data, indices, indptr
    return csr


def has_canonical_format(csr) -> bool:
    """Whether every row's columns strictly increase (no duplicates, sorted), checked
    on the arrays: scipy caches its own flag, which an edit of ``indices`` in place
    after it was read leaves stale (dia and bccoo then dropped a duplicate)."""
    indices, indptr = csr.indices, csr.indptr
    if indices.size < 2:
        return True
    ok = indices[1:] > indices[:-1]
    starts = np.asarray(indptr[1:-1], dtype=np.int64)   # a row's first entry: any column
    starts = starts[(starts > 0) & (starts < indices.size)]
    ok[starts - 1] = True
    return bool(ok.all())


def entry_offsets(indptr, indices):
    """Yield ``column - row`` (int64) of the stored entries of a CSR, whole rows at a
    time in non-empty pieces of about ``PIECE`` entries, letting waiting threads run between
    them (a pass over every entry at once kept the GIL: ``np.bincount`` of 20M offsets
    for 27 ms, a 2-core Xeon)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    for lo, hi in _pieces(indptr[1:]):
        a, b = int(indptr[lo]), int(indptr[hi])
        if b > a:   # never an empty piece
            rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr[lo:hi + 1]))
            yield np.asarray(indices[a:b]).astype(np.int64) - rows


def reduce_groups(values, group: int, ufunc) -> np.ndarray:
    """``ufunc`` (``np.maximum``, ``np.add``) over consecutive groups of ``group`` values
    of a 1-D array, the last group possibly short, as if padded with zeros (the values
    here are non-negative).  No padded copy of the array is made, and a power-of-two
    group is reduced by halving: numpy is slow over the short rows of a reshape (5M
    rows in pairs: 54 -> 7 ms on a 2-core Xeon)."""
    values = np.asarray(values)
    if group == 1:
        return values
    full = values.size // group * group
    if group & (group - 1) == 0:
        out = values[:full]
        while out.size > full // group:
            out = ufunc(out[0::2], out[1::2])
    else:
        out = ufunc.reduce(values[:full].reshape(-1, group), axis=1)
    if full < values.size:
        out = np.append(out, ufunc.reduce(values[full:]))
    return out


#: Entries from which ``cast`` and ``min_max`` split an array over threads: numpy lets
#: the GIL go inside a cast or a reduction of plain numbers, so the pieces run at once.
#: A scipy matrix's float64 values cast to float32 at 20M non-zeros took 58 ms of a
#: 131 ms setup on the lent H100's host, and the column bounds of the input check 17.
PARALLEL_MIN = 1 << 21
#: Most threads used (memory bandwidth, not cores, bounds a cast beyond a few).
MAX_THREADS = 8

_pool = None
_pool_lock = threading.Lock()


def _threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def _split(size: int):
    """``(start, stop)`` pieces of ``range(size)``, one per thread, or None when the
    array is too small to be worth the threads (or there is one core)."""
    threads = _threads()
    if size < PARALLEL_MIN or threads == 1:
        return None
    cuts = np.linspace(0, size, threads + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def _run(fn, pieces):
    """``[fn(a, b) for a, b in pieces]`` on the module's pool of threads (made once)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_THREADS,
                                       thread_name_prefix="pyspmv_cl-host")
    return list(_pool.map(lambda piece: fn(*piece), pieces))


def map_pieces(fn, size: int) -> list:
    """``[fn(start, stop), ...]`` over consecutive pieces covering ``range(size)``: one
    piece per thread from ``PARALLEL_MIN`` entries (``fn`` should spend its time in
    numpy calls that let the GIL go), else the whole range at once."""
    pieces = _split(size)
    if pieces is None:
        return [fn(0, size)]
    return _run(fn, pieces)


def cast(values, dtype) -> np.ndarray:
    """``values`` (1-D) as a C-contiguous array of ``dtype``: itself when it already
    is one, else a new array, filled piece by piece on several threads when large."""
    values = np.asarray(values)
    dtype = np.dtype(dtype)
    if values.dtype == dtype and values.flags.c_contiguous:
        return values
    return _filled(values, dtype)


def copy(values) -> np.ndarray:
    """A new C-contiguous copy of ``values`` (1-D), filled piece by piece on several
    threads when large: the operator's own copy of a pattern (``matrix._kept_pattern``)
    took 15-25 ms of a 20M-non-zero setup in one thread on an H100's host."""
    values = np.asarray(values)
    return _filled(values, values.dtype)


def _filled(values, dtype) -> np.ndarray:
    """A new C-contiguous array of ``dtype`` holding ``values``, in pieces on several
    threads when large (1-D)."""
    pieces = _split(values.size) if values.ndim == 1 else None
    if pieces is None:
        return np.array(values, dtype=dtype, order="C", copy=True)
    out = np.empty(values.shape, dtype)
    _run(lambda a, b: np.copyto(out[a:b], values[a:b], casting="unsafe"), pieces)
    return out


def min_max(values):
    """``(values.min(), values.max())`` of a non-empty array, the pieces of a large one
    on several threads."""
    values = np.asarray(values).reshape(-1)   # (a view of a 1-D array)
    bounds = map_pieces(lambda a, b: (values[a:b].min(), values[a:b].max()), values.size)
    return min(lo for lo, _ in bounds), max(hi for _, hi in bounds)
