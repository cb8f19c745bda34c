"""Cheap structural features of a CSR matrix that the format choice reads."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class MatrixFeatures:
    n_rows: int
    n_cols: int
    nnz: int
    mean_row_length: float
    max_row_length: int
    std_row_length: float
    empty_rows: int

    @classmethod
    def from_csr(cls, csr):
        n_rows, n_cols = csr.shape
        row_lengths = np.diff(csr.indptr)
        if n_rows == 0:
            return cls(0, n_cols, 0, 0.0, 0, 0.0, 0)
        return cls(
            n_rows=n_rows, n_cols=n_cols, nnz=int(csr.nnz),
            mean_row_length=float(csr.nnz) / n_rows,
            max_row_length=int(row_lengths.max()),
            std_row_length=float(row_lengths.std()),
            empty_rows=int(np.count_nonzero(row_lengths == 0)),
        )
