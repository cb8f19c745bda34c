"""Row blocks of large benchmark matrices, generated where they are used.

A distributed run at hundreds of millions of non-zeros should not build the global
matrix on one rank and scatter it: each rank generates its own rows (global column
indices), and the rows do not depend on how the matrix is split, so 1, 2 or 4 ranks
multiply the same matrix (strong scaling compares like with like).

- ``poisson3d_rows``: rows of the 7-point Laplacian (``generators.poisson3d``).
- ``power_law_rows``: a Chung-Lu-style graph: row lengths and column popularity both
  follow a power law (rank-ordered weights ``(r + 1) ** -(1 / (exponent - 1))``),
  scrambled over the index range by affine bijections so that hubs are spread over the
  ranks.  Every random number is a hash of (row, slot), never a stream position, which
  is what makes a row the same whichever rank draws it.  Repeated columns in a row are
  kept (every product sums them, as scipy does).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from ..distributed.model import power_law_weights
from .generators import _grid_laplacian

__all__ = ["poisson3d_rows", "power_law_lengths", "power_law_rows", "power_law_weights"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def poisson3d_rows(n: int, start: int, stop: int) -> sp.csr_matrix:
    """Rows ``start:stop`` of ``generators.poisson3d(n)`` (global columns)."""
    return _grid_laplacian(int(n), 3, int(start), int(stop))


def _uniform(keys: np.ndarray, stream: int) -> np.ndarray:
    """Uniform [0, 1) doubles, one per uint64 key: splitmix64's finaliser of
    ``key + (stream + 1) * golden``, a counter-based generator (uint64 arithmetic wraps)."""
    z = keys.astype(np.uint64, copy=True)
    z += np.uint64(((stream + 1) * int(_GOLDEN)) % 2**64)
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _coprime_multiplier(n: int, salt: int) -> int:
    """A multiplier ``a`` with gcd(a, n) == 1, so that ``(a * i + b) % n`` is a bijection."""
    a = (0x9E3779B1 + 2 * salt) % n if n > 1 else 1
    a = max(a, 1)
    while math.gcd(a, n) != 1:
        a += 1
    return a


def _scramble(i: np.ndarray, n: int, salt: int) -> np.ndarray:
    a = _coprime_multiplier(n, salt)
    b = (0x632BE5AB * (salt + 1)) % n if n else 0
    return (i.astype(np.int64) * a + b) % n   # a < 2^32 and i < 2^31: no int64 overflow


def power_law_lengths(n: int, rows: np.ndarray, avg_degree: float, exponent: float,
                      max_degree: int) -> np.ndarray:
    """Lengths of the given global rows: ``avg_degree * n * p_r`` for the row's rank r
    (its scrambled index), rounded, between 1 and ``max_degree``."""
    beta = 1.0 / (exponent - 1.0)
    # The normalising sum of (r + 1)^-beta over r < n, by Euler-Maclaurin (exact enough
    # for a length rounded to an integer; no pass over all n weights per rank).
    total = ((n + 0.5) ** (1 - beta) - 0.5 ** (1 - beta)) / (1 - beta)
    r = _scramble(rows, n, salt=1)
    lengths = np.rint(avg_degree * n * (r + 1.0) ** -beta / total)
    return np.clip(lengths, 1, max_degree).astype(np.int64)


def power_law_rows(n: int, start: int, stop: int, avg_degree: float = 16.0,
                   exponent: float = 2.2, max_degree: int = 65536,
                   seed: int = 0) -> sp.csr_matrix:
    """Rows ``start:stop`` of an n x n power-law graph matrix (see the module's text).

    Row lengths: ``power_law_lengths`` (mean close to ``avg_degree`` unless the cap
    bites).  Columns: drawn with probability ∝ the same power-law weights, by the
    continuous inverse CDF of (x + 1) ** -beta on [0, n), then scrambled.  Values:
    uniform in [-1, 1).  Needs 2 < exponent (a finite mean degree).
    """
    n, start, stop = int(n), int(start), int(stop)
    if n < 1 or not 0 <= start <= stop <= n:
        raise ValueError(f"need n >= 1 and 0 <= start <= stop <= n (got {n}, {start}:{stop})")
    if exponent <= 2 or avg_degree <= 0 or max_degree < 1:
        raise ValueError("need exponent > 2, avg_degree > 0, max_degree >= 1")
    rows = np.arange(start, stop, dtype=np.int64)
    lengths = power_law_lengths(n, rows, avg_degree, exponent, max_degree)
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    nnz = int(indptr[-1])
    idx = np.int32 if n < 2**31 else np.int64
    cols = np.empty(nnz, dtype=idx)
    data = np.empty(nnz, dtype=np.float64)
    # Chunks of rows of ~4M entries, filled by threads (numpy releases the GIL).
    bounds = np.unique(np.searchsorted(indptr, np.arange(0, nnz, 1 << 22), side="right") - 1)
    bounds = np.concatenate([bounds[bounds > 0], [rows.size]])
    bounds = np.concatenate([[0], bounds])

    def fill(a, b):
        lo, hi = int(indptr[a]), int(indptr[b])
        cols[lo:hi], data[lo:hi] = _entries(n, rows[a:b], lengths[a:b], exponent, seed)
    with ThreadPoolExecutor(min(os.cpu_count() or 1, 16)) as pool:
        list(pool.map(fill, bounds[:-1], bounds[1:]))
    ptr = np.int32 if nnz < 2**31 else np.int64
    return sp.csr_matrix((data, cols, indptr.astype(ptr)), shape=(rows.size, n), copy=False)


def _entries(n, rows, lengths, exponent, seed):
    """Columns and values of the given rows (see ``power_law_rows``)."""
    starts = np.cumsum(lengths) - lengths
    # Entry (row i, slot k) has key i * 2^32 + k: the same numbers on any rank.
    keys = np.repeat(rows.astype(np.uint64) << np.uint64(32), lengths)
    keys += (np.arange(keys.size, dtype=np.int64) - np.repeat(starts, lengths)).astype(np.uint64)
    keys ^= np.uint64((seed * 0xD1B54A32D192ED03) % 2**64)
    beta = 1.0 / (exponent - 1.0)
    top = (n + 1.0) ** (1 - beta) - 1.0
    x = _uniform(keys, stream=0)
    x *= top
    x += 1.0
    np.power(x, 1.0 / (1 - beta), out=x)
    x -= 1.0
    r = np.minimum(x.astype(np.int64), n - 1)
    del x
    cols = _scramble(r, n, salt=2)
    data = _uniform(keys, stream=1)
    data *= 2.0
    data -= 1.0
    return cols, data
