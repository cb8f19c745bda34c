"""The off-diagonal block on its non-empty rows only (PETSc's "compressed row" form
of the B block).

A row block of a stencil or banded matrix couples to the other ranks through a few
boundary rows: on a 3-D grid split in slabs, n^2 of n^3 / p rows.  Stored as an
ordinary m-row matrix, the off-diagonal product still sweeps all m rows (row
pointers, and y read and written with beta = 1): measured on an H200, 28.5M rows with
148k non-empty ones took about a third of the product's time on two GPUs.  Here the
block keeps its non-empty rows, multiplies into a short vector and adds that into y
at those rows.
"""

import numpy as np
import pyopencl.array as cla
import scipy.sparse as sp

from .exchange_kernels import ExchangeKernels

#: Compress when at most this fraction of the rows is non-empty.
COMPRESS_BELOW = 0.5


class CompressedRows:
    """An m x g block kept as its k non-empty rows: ``matvec`` adds ``alpha * B @ x``
    into ``out`` (beta = 1 only, how the distributed product uses it), ``rmatvec``
    computes ``alpha * B^T y`` (B^H for complex) from y's k rows."""

    def __init__(self, block, make, queue, dtype):
        counts = np.diff(block.indptr)
        rows = np.flatnonzero(counts)
        indptr = np.zeros(rows.size + 1, dtype=block.indptr.dtype)
        np.cumsum(counts[rows], out=indptr[1:])
        compact = sp.csr_matrix((block.data, block.indices, indptr),
                                shape=(rows.size, block.shape[1]), copy=False)
        self.shape = block.shape
        self.op = make(compact)
        self.queue, self.dtype = queue, np.dtype(dtype)
        self.rows = rows
        self._rows_dev = cla.to_device(queue, rows.astype(np.int64))
        self._short = cla.empty(queue, rows.size, self.dtype)
        self._kernels = ExchangeKernels(queue.context, self.dtype)

    @classmethod
    def or_plain(cls, block, make, queue, dtype):
        """This form when few rows are non-empty, else ``make(block)`` itself."""
        nonempty = np.count_nonzero(np.diff(block.indptr))
        if nonempty <= COMPRESS_BELOW * block.shape[0]:
            return cls(block, make, queue, dtype)
        return make(block)

    @property
    def format(self):
        return self.op.format

    @property
    def nbytes(self):
        return self.op.nbytes + self._rows_dev.nbytes + self._short.nbytes

    def matvec(self, x, out, alpha=1.0, beta=1.0):
        if beta != 1.0:
            raise ValueError("CompressedRows.matvec adds into out (beta=1) only")
        self.op.matvec(x, out=self._short, alpha=alpha)
        self._kernels.scatter_add(self.queue, self._rows_dev, self._short, out)
        return out

    def rmatvec(self, y, out, alpha=1.0):
        self._kernels.gather(self.queue, self._rows_dev, y, self._short)
        return self.op.rmatvec(self._short, out=out, alpha=alpha)
