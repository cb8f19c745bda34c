"""The CSR arrays and kernel arguments shared by the CSR kernels (row_ptr, col_idx,
values)."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from ..codegen import BLOCK_ARGS, PRODUCT_ARGS, matrix, scalar
from ..host_arrays import cast
from . import params as P
from .base import SpMVFormat
from .lanes import LANE_COLUMNS, LANE_ORDER, LANE_SPLIT, LanesBlocks
from .sorting import sort_permutation

#: row_ptr, col_idx, values as the CSR kernels declare them (values in value_t: the
#: operator's type, or fewer bits with ``value_bits``, read through LOADV).
CSR_ARRAYS = (matrix("row_ptr", "index_t"), matrix("col_idx", "index_t"),
              matrix("values", "value_t"))
#: Widths of a stored column index (csr-vector's col_bits; the other CSR kernels read 32).
COL_BITS = (16, 32)
#: The arguments of a kernel with one row (or group of work-items) per row.
CSR_ROW_ARGS = (scalar("n_rows", "long"), *CSR_ARRAYS, *PRODUCT_ARGS)
#: The same for a block kernel (KB vectors at once).
CSR_ROW_BLOCK_ARGS = (scalar("n_rows", "long"), *CSR_ARRAYS, *BLOCK_ARGS)


#: How the CSR kernels' block products (k vectors) map work-items: "items" (the
#: format's own block kernel: a row per work-item or per group of them, its k sums in
#: one OpenCL vector; the CPU default) or "lanes" (csr_lanes_block.mako: k work-items per
#: row, one per vector, coalesced reads of x's rows; the GPU default).
BLOCK_MAPPINGS = ("items", "lanes")
BLOCK_MAPPING = P.Param("block_mapping", P.one_of(*BLOCK_MAPPINGS),
                        "block products: 'items' (k sums per work-item) or 'lanes' (a "
                        "work-item per vector of a row)")


#: The block parameters both CSR formats declare.
BLOCK_PARAMS = (BLOCK_MAPPING, LANE_COLUMNS, LANE_SPLIT, LANE_ORDER)


def default_block_mapping(profile) -> str:
    return "lanes" if profile.is_gpu else "items"


class CSRFormatBase(LanesBlocks, SpMVFormat):
    """Uploads CSR as it is: row_ptr, col_idx, values (indices in the chosen type); a
    matrix already on the device is copied and cast there.  Block products run the
    subclass's own block kernel (``block_mapping="items"``) or the lanes kernel shared
    by the CSR formats (``"lanes"``)."""

    converts_on_device = True
    host_conversion_is_cast = True
    #: csr-vector's col_bits=16 with row blocks too wide for it (their columns in col_wide)
    col_escape = False

    # -- block products: the lanes kernel (formats/lanes.py) when block_mapping="lanes"
    lanes_template = "csr_lanes_block.mako"
    lanes_kernel = "csr_lanes_block"
    lanes_split = True

    @property
    def _lanes(self) -> bool:
        return self.params.get("block_mapping") == "lanes"

    def lanes_matrix_args(self):
        return (scalar("n_rows", "long"), *CSR_ARRAYS, *self._row_order_arg())

    def _row_order_arg(self):
        return (matrix("row_order", "index_t"),) if self._ordered else ()

    @property
    def _ordered(self) -> bool:
        """Whether the lanes kernel takes the rows in ``row_order`` (``lane_order``)."""
        return self._lanes and bool(self.params.get("lane_order")) and self.shape[0] > 1

    def block_template_params(self, kb):
        return {**super().block_template_params(kb), "row_order": self._ordered}

    def block_arrays(self, csr, on_device):
        if not self._ordered:
            return {}
        lengths = np.diff(np.asarray(csr.indptr, dtype=np.int64))
        order = sort_permutation(lengths, self.params["lane_order"]).astype(self.index_dtype)
        return {"row_order": cla.to_device(self.device.queue, order) if on_device else order}

    def template_params(self):
        return {"value_bits": self.params.get("value_bits"),
                "col_bits": self.params.get("col_bits", 32), "col_escape": self.col_escape}

    def convert(self, csr):
        return {
            "row_ptr": cast(csr.indptr, self.index_dtype),
            "col_idx": cast(csr.indices, self.index_dtype),
            "values": self.stored_values(csr.data),
        }

    def read_csr(self, queue, wait_for=None, staging=None):
        """The CSR arrays themselves, read without blocking (through ``staging``, a
        blocking read in pieces, when given); values stored in fewer bits
        (``value_bits``) are read as they are stored and widened once read."""
        nnz = self.value_array_sizes["values"]
        arrays, events = self.read_arrays(
            queue, (("row_ptr", self.index_dtype, self.shape[0] + 1),
                    ("col_idx", self.index_dtype, nnz),
                    ("values", self.value_dtype, nnz)), wait_for, staging)
        if self.value_dtype != self.dtype:
            if events:
                cl.wait_for_events(events)
            arrays[2], events = arrays[2].astype(self.dtype), []
        return arrays, events

    def read_arrays(self, queue, wanted, wait_for=None, staging=None):
        """``(arrays, events)``: the first ``size`` elements of each ``(name, dtype,
        size)`` of ``wanted`` read into new host arrays, without blocking (the arrays are
        filled once ``events`` complete), or through ``staging``, blocking, in pieces."""
        arrays, events = [], []
        if staging is not None and wait_for:
            cl.wait_for_events(wait_for)
        for name, dtype, size in wanted:
            host = np.empty(size, dtype)
            if size and staging is not None:
                staging.read(self.buffers[name], host)
            elif size:
                events.append(cl.enqueue_copy(queue, host, self.buffers[name],
                                              wait_for=wait_for, is_blocking=False))
            arrays.append(host)
        return arrays, events

    def convert_device(self, csr):
        queue = self.device.queue
        arrays = {"row_ptr": csr.as_type("indptr", self.index_dtype, queue, copy=True),
                  "col_idx": csr.as_type("indices", self.index_dtype, queue, copy=True),
                  "values": self.device_values(csr, queue, copy=True)}
        queue.finish()   # ordered before any product, whatever the queue's order
        return arrays
