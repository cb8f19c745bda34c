"""Cheap structural features of a CSR matrix that the format choice reads."""

import dataclasses

import numpy as np

# Diagonals are counted only for matrices that could suit DIA (short, even rows):
# one bincount over the non-zeros, skipped for the rest.
_DIAGONAL_SCAN_MAX_ROW = 64


@dataclasses.dataclass(frozen=True)
class MatrixFeatures:
    n_rows: int
    n_cols: int
    nnz: int
    mean_row_length: float
    max_row_length: int
    std_row_length: float
    empty_rows: int
    diagonals: int = -1   # occupied diagonals; -1 when not counted

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
    def from_csr(cls, csr):
        n_rows, n_cols = csr.shape
        row_lengths = np.diff(csr.indptr)
        if n_rows == 0:
            return cls(0, n_cols, 0, 0.0, 0, 0.0, 0)
        max_row = int(row_lengths.max())
        mean = float(csr.nnz) / n_rows
        std = float(row_lengths.std())
        diagonals = -1
        if csr.nnz and max_row <= _DIAGONAL_SCAN_MAX_ROW and std <= 0.5 * mean:
            rows = np.repeat(np.arange(n_rows, dtype=np.int64), row_lengths)
            offsets = csr.indices.astype(np.int64) - rows + (n_rows - 1)
            diagonals = int(np.count_nonzero(np.bincount(offsets, minlength=1)))
        return cls(
            n_rows=n_rows, n_cols=n_cols, nnz=int(csr.nnz), mean_row_length=mean,
            max_row_length=max_row, std_row_length=std,
            empty_rows=int(np.count_nonzero(row_lengths == 0)), diagonals=diagonals,
        )
