"""Cheap structural features of a CSR matrix that the format choice reads (the
formats' parameter defaults, the rules and the tuner), and the matrix fingerprint of
the tuning database's key.  It sits below the formats, which read MatrixFeatures."""

import dataclasses
import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .host_arrays import entry_offsets, map_pieces

# Diagonals are counted only for matrices that could suit DIA (short, even rows):
# one counting pass over the non-zeros (a sort when m + n dwarfs nnz), skipped for the rest.
_DIAGONAL_SCAN_MAX_ROW = 64
#: ``diagonals`` of features made with ``count_diagonals=False``, until counted.
NOT_COUNTED = -2


@dataclasses.dataclass(frozen=True)
class MatrixFeatures:
    n_rows: int
    n_cols: int
    nnz: int
    mean_row_length: float
    max_row_length: int
    std_row_length: float
    empty_rows: int
    diagonals: int = -1   # occupied diagonals; -1 when not worth counting, NOT_COUNTED

    @property
    def row_spread(self):
        """Coefficient of variation of the row lengths (0 for equal rows)."""
        return self.std_row_length / self.mean_row_length if self.mean_row_length else 0.0

    @property
    def diagonal_fill(self):
        """DIA slots per non-zero (inf when the diagonals were not counted)."""
        if self.diagonals < 0 or not self.nnz:
            return float("inf")
        return self.diagonals * self.n_rows / self.nnz

    @classmethod
    def from_csr(cls, csr, count_diagonals=True):
        """The features of ``csr``; ``count_diagonals=False`` leaves the one pass over
        the non-zeros (the diagonal count, which only the format choice reads) for
        :meth:`with_diagonals` (``diagonals`` is then NOT_COUNTED)."""
        n_rows, n_cols = csr.shape
        if n_rows == 0:
            return cls(0, n_cols, 0, 0.0, 0, 0.0, 0)
        max_row, std, empty = _row_stats(np.asarray(csr.indptr))
        features = cls(
            n_rows=n_rows, n_cols=n_cols, nnz=int(csr.nnz),
            mean_row_length=float(csr.nnz) / n_rows, max_row_length=max_row,
            std_row_length=std, empty_rows=empty, diagonals=NOT_COUNTED)
        return features.with_diagonals(csr) if count_diagonals else features

    def with_diagonals(self, csr):
        """These features with the diagonals counted (itself when already done)."""
        if self.diagonals != NOT_COUNTED:
            return self
        diagonals = -1
        if not isinstance(csr.indices, np.ndarray):   # on the device: not counted
            return dataclasses.replace(self, diagonals=diagonals)
        n_rows, n_cols = csr.shape
        if csr.nnz and self.max_row_length <= _DIAGONAL_SCAN_MAX_ROW \
                and self.std_row_length <= 0.5 * self.mean_row_length:
            pieces = entry_offsets(csr.indptr, csr.indices)
            if n_rows + n_cols <= 4 * csr.nnz:     # a flag per possible diagonal
                seen = np.zeros(n_rows + n_cols, dtype=bool)
                for offsets in pieces:
                    seen[offsets + (n_rows - 1)] = True
                diagonals = int(np.count_nonzero(seen))
            else:                                    # host memory in nnz, not m + n
                diagonals = int(np.unique(np.concatenate(
                    [np.unique(offsets) for offsets in pieces])).size)
        return dataclasses.replace(self, diagonals=diagonals)


def _row_stats(indptr):
    """``(longest row, standard deviation of the row lengths, empty rows)`` of a CSR's
    row pointers (at least one row).  The deviation comes from the lengths' sum and sum
    of squares, in integers (exact; no float temporaries: 5.1M rows 18 -> 6 ms), or from
    numpy's ``std`` where a sum of squares could pass 64 bits.  Pieces of rows run on
    several threads (``host_arrays.map_pieces``: the row pass took 18 ms of wing x83's
    setup on the lent H100's host in one piece)."""
    def piece(lo, hi):
        lengths = np.diff(indptr[lo:hi + 1])
        longest = int(lengths.max())
        total = int(indptr[hi]) - int(indptr[lo])
        squares = None if longest * total >= 1 << 62 else \
            int(np.einsum("i,i->", lengths, lengths, dtype=np.int64))
        return longest, squares, int(np.count_nonzero(lengths == 0))

    m = indptr.size - 1
    parts = map_pieces(piece, m)
    longest = max(p[0] for p in parts)
    empty = sum(p[2] for p in parts)
    if any(p[1] is None for p in parts):
        return longest, float(np.diff(indptr).std()), empty
    total, squares = int(indptr[-1]) - int(indptr[0]), sum(p[1] for p in parts)
    return longest, math.sqrt(m * squares - total * total) / m, empty


# -- what the tuner reads beyond MatrixFeatures, and the tuning database's key ----------

def row_length_histogram(row_lengths):
    """Rows per power-of-two length bucket: [empty, 1, 2-3, 4-7, 8-15, ...]."""
    lengths = np.asarray(row_lengths, dtype=np.int64)
    if lengths.size == 0:
        return [0]
    buckets = np.zeros(lengths.size, dtype=np.int64)
    nonzero = lengths > 0
    buckets[nonzero] = np.floor(np.log2(lengths[nonzero])).astype(np.int64) + 1
    return [int(c) for c in np.bincount(buckets)]


def product_bytes(nnz, n_rows, n_cols, dtype) -> int:
    """Bytes one product moves at least: each value and its 32-bit column index, x read
    and y written once (the tuner's, online tuning's and the operator's time guesses)."""
    item = np.dtype(dtype).itemsize
    return int(nnz) * (item + 4) + (int(n_rows) + int(n_cols)) * item


def bandwidth(csr):
    """Largest |column - row| over the stored entries (0 for an empty matrix)."""
    return max((int(np.abs(offsets).max()) for offsets in
                entry_offsets(csr.indptr, csr.indices)), default=0)


#: Elements per hashed chunk: chunks are hashed in parallel (hashlib releases the GIL).
_DIGEST_CHUNK = 1 << 21


def _chunk_digest(arr, start, wide):
    chunk = arr[start:start + _DIGEST_CHUNK]
    chunk = np.ascontiguousarray(chunk, dtype=np.int64 if wide else np.int32)
    return hashlib.sha256(chunk.data).digest()


def structure_digest(csr):
    """SHA-256 over the SHA-256 of each chunk of indptr and indices (hashed on several
    threads), independent of the integer types the caller used: 32-bit when the shape
    guarantees the values fit (a validated CSR's columns lie in [0, n), its row
    pointers in [0, nnz]), else 64-bit.  No pass over the data besides the hash."""
    rows, cols = csr.shape
    nnz = int(csr.indptr[-1]) if len(csr.indptr) else 0
    limit = np.iinfo(np.int32).max
    parts = [(np.asarray(csr.indptr), nnz > limit), (np.asarray(csr.indices), cols > limit)]
    jobs = [(arr, start, wide) for arr, wide in parts
            for start in range(0, max(arr.size, 1), _DIGEST_CHUNK)]
    workers = min(len(jobs), os.cpu_count() or 1, 8)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(lambda job: _chunk_digest(*job), jobs))
    else:
        digests = [_chunk_digest(*job) for job in jobs]
    h = hashlib.sha256()
    for (_, wide), label in zip(parts, (b"indptr", b"indices")):
        h.update(label + (b"64" if wide else b"32") + b"\x1f")
    for d in digests:
        h.update(d)
    return h.hexdigest()


def shape_fingerprint(features):
    """The fingerprint's cheap part (no pass over the indices): shape, nnz and row-length
    statistics.  The tuning database files entries under it, so a matrix it cannot hold
    is known without hashing (:func:`fingerprint`'s hash is the costly part)."""
    f = features
    return {"shape": [f.n_rows, f.n_cols], "nnz": f.nnz, "max_row": f.max_row_length,
            "mean_row": round(f.mean_row_length, 6), "std_row": round(f.std_row_length, 6),
            "empty_rows": f.empty_rows}


def fingerprint(csr, features=None):
    """A JSON-able identity of the matrix structure: :func:`shape_fingerprint` and a
    hash of indptr/indices (values do not change the best format)."""
    f = features or MatrixFeatures.from_csr(csr)
    return {**shape_fingerprint(f), "structure_sha256": structure_digest(csr)}
