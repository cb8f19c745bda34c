"""The CSR arrays and kernel arguments shared by the CSR kernels (row_ptr, col_idx,
values)."""

from ..codegen import BLOCK_ARGS, PRODUCT_ARGS, matrix, scalar
from .base import SpMVFormat

#: row_ptr, col_idx, values as the CSR kernels declare them.
CSR_ARRAYS = (matrix("row_ptr", "index_t"), matrix("col_idx", "index_t"),
              matrix("values", "real_t"))
#: The arguments of a kernel with one row (or group of work-items) per row.
CSR_ROW_ARGS = (scalar("n_rows", "long"), *CSR_ARRAYS, *PRODUCT_ARGS)
#: The same for a block kernel (KB vectors at once).
CSR_ROW_BLOCK_ARGS = (scalar("n_rows", "long"), *CSR_ARRAYS, *BLOCK_ARGS)


class CSRFormatBase(SpMVFormat):
    """Uploads CSR as it is: row_ptr, col_idx, values (indices in the chosen type); a
    matrix already on the device is copied and cast there."""

    converts_on_device = True
    host_conversion_is_cast = True

    def convert(self, csr):
        return {
            "row_ptr": csr.indptr.astype(self.index_dtype, copy=False),
            "col_idx": csr.indices.astype(self.index_dtype, copy=False),
            "values": csr.data.astype(self.dtype, copy=False),
        }

    def convert_device(self, csr):
        queue = self.device.queue
        arrays = {"row_ptr": csr.as_type("indptr", self.index_dtype, queue, copy=True),
                  "col_idx": csr.as_type("indices", self.index_dtype, queue, copy=True),
                  "values": csr.as_type("data", self.dtype, queue, copy=True)}
        queue.finish()   # ordered before any product, whatever the queue's order
        return arrays
