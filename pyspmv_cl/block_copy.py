"""Blocks of vectors on a format without block kernels: a CSR copy that has them.

coo, hyb, csr5, bccoo, cmrs, ellr-t and dia have single-vector kernels only, and
multiply a block of k vectors column by column: k products and two transposes
(``formats/columns.py``).  An operator that was not tuned for blocks (no
``block_size``) may well have picked one of them, and then every block product reads
the matrix k times: on an H100 32 vectors cost 32 products, against 5-7 with the CSR
formats' lanes kernels; on PoCL, 2 cores, 8 vectors on ellr-t cost 25 products.

So such an operator can build a second operator on the same device, queue and dtype:
the matrix as CSR (the pattern given at construction and the values the operator
holds, read back through ``update_values``' slot map) in ``csr-scalar``, whose block
kernels read the matrix once per block (the lanes kernels on GPUs, the items kernels
on CPUs).  On an H200 at 20M non-zeros that made blocks of 8 and 32 vectors 1.3-8.5x
faster; but the copy costs the read-back of the values and an upload, and for most
formats a host pass to find where the format keeps each value (``update_values``'
slot map): 0.6-0.9 s there through the slot map; csr5 and coo read their values back
in CSR order without one (``values_in_csr_order``: 0.43 -> 0.03 s and 0.09 -> 0.02 s
at 4M non-zeros on a 2-core VM).

When: the ski-rental rule of online tuning.  Every block product that runs column by
column "rents": it pays what the copy would have saved it, guessed from its bytes
(``saved_seconds``).  The copy is "bought" once the rent paid reaches its cost
(``copy_seconds``): so a caller never pays more than about twice the better choice,
for a handful of block products as for thousands.  ``op.build_block_copy()`` buys it
at once.  Its memory is a CSR of the matrix, which ``op.nbytes_parts["blocks"]``
reports.  Single products stay on the operator's own format; ``update_values``
keeps the copy in step.

Not when the caller tuned for blocks (``block_size`` > 1): the tuner has then timed
each format's block products as they run (column by column for these formats) and
chosen; nor where the copy would have no block kernels either, nor with
``SpMV(..., block_copy=False)``.  If the copy cannot be made (no device memory for a
second matrix, say), blocks go column by column and ``op._block_copy_error`` says why.
Results of a block product on the copy come from csr-scalar: deterministic, and within
rounding of the operator's own single products (another summation order).
"""

from __future__ import annotations

import time

import numpy as np

from .adjoint import current_values
from .features import product_bytes

# A product's time guessed from its bytes, as online tuning guesses it.
from .tuning.online import CPU_BYTES_PER_SECOND, GPU_BYTES_PER_SECOND

#: The format of the copy: block kernels on every device and value type, no conversion
#: beyond the CSR arrays.
BLOCK_FORMAT = "csr-scalar"
#: What building the copy costs, seconds per million non-zeros: 0.031-0.046 on an
#: H200's host (csr5 and coo, 20M non-zeros, through the slot map), 0.023-0.1 on a
#: 2-core VM (coo, csr5); for a format whose values come back by a reshape
#: (``value_read == "reshape"``: csr5, coo), 0.0043-0.011 on the H200's host and
#: 0.005-0.008 on that VM.  A gather (ellr-t) took 0.03 on that VM: the first rate.
COPY_SECONDS_PER_MNNZ = 0.05
COPY_SECONDS_PER_MNNZ_IN_ORDER = 0.006
#: What the copy saves a block product of k vectors, in products: on an H200 (20M
#: non-zeros, csr5 and coo) 0.7-0.97 k on cage10 and astro-ph, 0.32 k (k = 8) and 0.83 k
#: (k = 32) on rajat01, whose long rows slow csr-scalar's lanes kernel.
SAVED_SHARE = 0.75


def wants_copy(op, k: int) -> bool:
    """Whether a product of ``k`` vectors should run on the block copy: the operator's
    format has no block kernels, and the caller did not tune for blocks."""
    if k < 2 or not op._allow_block_copy or op._impl.has_block_kernels \
            or not op._nnz:   # no entries: nothing to read twice
        return False
    tuning = op.tuning
    return tuning is None or (tuning.block_size or 1) == 1


def copy_seconds(op) -> float:
    """What building the copy is guessed to cost the caller."""
    rate = COPY_SECONDS_PER_MNNZ_IN_ORDER if op._impl.value_read == "reshape" \
        else COPY_SECONDS_PER_MNNZ
    return rate * op._nnz / 1e6


def saved_seconds(op, k: int) -> float:
    """What the copy is guessed to save one product of ``k`` vectors."""
    nbytes = product_bytes(op._nnz, *op.shape, op.dtype)
    rate = CPU_BYTES_PER_SECOND if op.device.profile.is_cpu else GPU_BYTES_PER_SECOND
    return SAVED_SHARE * k * nbytes / rate


class BlockCopy:
    """The CSR operator behind an operator's block products (module docstring)."""

    def __init__(self, op, make):
        start = time.perf_counter()
        indices, indptr = op._structure
        values = current_values(op)
        extra = {}
        # The values as the operator stores them (value_bits): rounded alike.
        bits = op.params.get("value_bits")
        if bits is not None:
            extra["value_bits"] = bits
        self.operator = make((values, indices, indptr), BLOCK_FORMAT, dtype=op.dtype,
                             device=op.device, shape=op.shape, **extra)
        #: Seconds the build took (read-back, upload, conversion).
        self.seconds = time.perf_counter() - start
        self.operator._copy_of = "the block copy"
        self.operator.explanation = (
            f"block copy of a {op.shape[0]}x{op.shape[1]} {op.format} operator (whose "
            f"format has no block kernels), built for its block products in "
            f"{self.seconds:.3f} s")

    @property
    def usable(self) -> bool:
        return self.operator.has_block_kernels

    def update_values(self, data) -> None:
        self.operator._update_as_copy(np.asarray(data))
