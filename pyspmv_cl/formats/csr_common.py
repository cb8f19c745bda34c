"""The CSR arrays shared by the CSR kernels (row_ptr, col_idx, values)."""

import numpy as np

from .base import SpMVFormat


class CSRFormatBase(SpMVFormat):
    """Uploads CSR as it is: row_ptr, col_idx, values (indices in the chosen type)."""

    def _convert(self, csr):
        return {
            "row_ptr": csr.indptr.astype(self.index_dtype, copy=False),
            "col_idx": csr.indices.astype(self.index_dtype, copy=False),
            "values": csr.data.astype(self.dtype, copy=False),
        }

    def _kernel_args(self, x_buf, y_buf, alpha, beta):
        b = self.buffers
        return (self._n_rows, b["row_ptr"], b["col_idx"], b["values"], x_buf, y_buf, alpha, beta)

    @property
    def _n_rows(self):
        return np.int64(self.shape[0])


