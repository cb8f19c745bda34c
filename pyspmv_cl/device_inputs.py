"""A CSR matrix already on the device: ``SpMV((data, indices, indptr), shape=...)`` with
pyopencl arrays.  The structure is checked on the device (reductions: no copy of the
matrix to the host); only ``indptr`` (one index per row) comes to the host, for the row
statistics the format choice reads.  The operator keeps copies made on the device, cast
to its types there, so later changes to the caller's arrays do not reach it."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy.sparse as sp
from pyopencl.reduction import ReductionKernel

from .errors import InvalidInputError, InvalidTypeError, UnsupportedDtypeError
from .host_arrays import cast
from .inputs import check_triple, check_value_range, overflow_error


def is_device_triple(A) -> bool:
    """Whether ``A`` is a CSR triple of pyopencl arrays; a triple mixing them with host
    arrays is refused (numpy would make object arrays of the device ones)."""
    if not (isinstance(A, tuple) and len(A) == 3):
        return False
    on_device = [isinstance(a, cla.Array) for a in A]
    if any(on_device) and not all(on_device):
        where = ", ".join(f"{name} {'on the device' if d else 'on the host'}" for name, d
                          in zip(("data", "indices", "indptr"), on_device))
        raise InvalidTypeError(f"a CSR triple's arrays must all be pyopencl arrays or all "
                               f"host arrays, not a mix ({where})")
    return all(on_device)


class DeviceCSR:
    """The validated device arrays of a CSR matrix, plus its ``indptr`` on the host."""

    def __init__(self, data, indices, indptr_device, indptr_host, shape, owned=False):
        self.data, self.indices, self.indptr_device = data, indices, indptr_device
        #: Whether the arrays are this object's alone (uploaded for one conversion): an
        #: operator may then keep them rather than a copy.
        self.owned = owned
        self.indptr = indptr_host
        self.shape = shape
        self.nnz = int(indices.size)
        self.dtype = data.dtype

    @property
    def context(self):
        return self.data.context

    def as_type(self, name: str, dtype, queue, copy: bool = False) -> cla.Array:
        """One of the arrays in ``dtype``, starting at its buffer's beginning: itself
        when it is so and has the type, and ``copy`` is false (to read it only) or the
        arrays are ``owned`` (nobody else changes them); else a copy cast on the device
        (to keep it).  A view at an offset in a larger buffer is always copied: the
        kernels take buffers and read them from element 0 (coo's conversion read the
        buffer's head instead of the view, and crashed PoCL)."""
        # (only the array named is read: an upload in flight is waited for one by one)
        arr = getattr(self, {"data": "data", "indices": "indices", "indptr": "indptr_device"}[name])
        if arr.dtype == np.dtype(dtype) and (not copy or self.owned) and not arr.offset:
            return arr
        return arr.astype(np.dtype(dtype), queue=queue)   # astype always copies

    @classmethod
    def upload(cls, csr, queue, index_dtype, dtype, owned=False, staging=None) -> DeviceCSR:
        """A validated host CSR uploaded in the given types (to convert on the device;
        ``owned``: handed to one operator only, which may keep the arrays), through
        ``staging`` (``pinned_staging.PinnedStaging`` on ``queue``) when given."""
        arrays = [cla.to_device(queue, cast(a, t)) if staging is None
                  else staging.to_device(cast(a, t)) for a, t in
                  ((csr.data, dtype), (csr.indices, index_dtype), (csr.indptr, index_dtype))]
        return cls(*arrays, np.asarray(csr.indptr, dtype=np.int64), tuple(csr.shape), owned)

    def start(self) -> None:
        """Begin the copies still to come (``background_upload.BackgroundUpload``'s,
        once a conversion has built its kernels); arrays on the device: nothing to do."""

    def to_host(self, queue):
        """The matrix as a scipy CSR on the host (one read back: for the conversions
        that run on the host)."""

        csr = sp.csr_matrix(self.shape, dtype=self.dtype)
        csr.data = self.data.get(queue)
        csr.indices = self.indices.get(queue)
        csr.indptr = self.indptr
        return csr


def check_contiguous(arr, name):
    """A device array the kernels read whole: contiguous (C or F order), or empty."""
    if arr.size and not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise InvalidInputError(f"{name} must be contiguous on the device")


def as_device_csr(triple, shape, queue) -> DeviceCSR:
    """Validate ``(data, indices, indptr)`` pyopencl arrays as a CSR matrix of
    ``shape`` on ``queue``'s context; refuse anything a kernel could index out of."""
    data, indices, indptr = triple
    rows, cols = check_triple(data, indices, indptr, shape)
    for name, arr in (("data", data), ("indices", indices), ("indptr", indptr)):
        if arr.context != queue.context:
            raise InvalidInputError(f"{name} lives on another OpenCL context than the "
                                    "operator's device; pass device= its queue")
        check_contiguous(arr, name)
    # Arrays on another queue of the context: the writes pyopencl recorded on them
    # (their events) are waited for, and they are read on this queue from now on
    # (pyopencl's copy of an array ran on the array's queue, unordered with the
    # conversion, whose kernels then read unfilled buffers).  Not the whole queue: the
    # caller's other work there may wait on something set later (a user event).
    pending = [e for a in (data, indices, indptr) if a.queue is not queue for e in a.events]
    if pending:
        cl.wait_for_events(pending)
    data, indices, indptr = (a.with_queue(queue) for a in (data, indices, indptr))
    if data.dtype.kind not in "fiubc":
        raise UnsupportedDtypeError(f"matrix dtype {data.dtype} is not numeric")
    if data.dtype.kind == "b" or data.dtype == np.float16:
        # (pyopencl has no device type for them: its cast to op's dtype cannot run)
        raise UnsupportedDtypeError(
            f"device matrix values of dtype {data.dtype} cannot be cast on the device: "
            "give float32, float64, complex or integer values (or the matrix on the "
            "host, which is cast there)")
    host_indptr = indptr.get(queue).astype(np.int64)
    nnz = indices.size
    if host_indptr[0] != 0 or host_indptr[-1] != nnz:
        raise InvalidInputError(f"indptr must start at 0 and end at nnz={nnz} (got "
                                f"{host_indptr[0]}..{host_indptr[-1]})")
    if rows and np.any(np.diff(host_indptr) < 0):
        raise InvalidInputError("indptr must be non-decreasing")
    if nnz:
        low = int(cla.min(indices, queue=queue).get())
        high = int(cla.max(indices, queue=queue).get())
        if low < 0 or high >= cols:
            raise InvalidInputError(f"column indices must lie in [0, {cols}); found "
                                    f"[{low}, {high}]")
    return DeviceCSR(data, indices, indptr, host_indptr, (rows, cols))


def _overflow_reductions(context, real):
    """Reductions over ``real`` values: how many are finite and round to inf in float
    (OpenCL's conversion rounds to nearest, as numpy's cast does), and the largest
    magnitude among them."""
    c = "double" if np.dtype(real) == np.float64 else "float"
    over = "(isfinite(x[i]) && isinf((float)x[i]))"
    count = ReductionKernel(context, np.int64, neutral="0", reduce_expr="a+b",
                            map_expr=f"{over} ? 1 : 0", arguments=f"const {c} *x")
    largest = ReductionKernel(context, np.dtype(real), neutral="0", reduce_expr="fmax(a, b)",
                              map_expr=f"{over} ? fabs(x[i]) : 0", arguments=f"const {c} *x")
    return count, largest


def check_device_value_range(data, dtype, device, what="the matrix") -> None:
    """``inputs.check_value_range`` for values on ``device``: finite values of ``data``
    past ``dtype``'s range (float64 into a float32 operator) are refused, not stored as
    inf.  Counted by a reduction on the device, no copy to the host (its kernels kept
    per thread in ``device.thread_cached``, as other kernels a thread launches at once);
    a device without doubles (which cannot run it) reads the values back instead."""
    if data.dtype.kind not in "fc" or not data.size or \
            np.finfo(data.dtype).max <= np.finfo(dtype).max:
        return
    queue = device.queue
    if not device.profile.fp64:
        check_value_range(data.get(queue), dtype, what)
        return
    real = np.finfo(data.dtype).dtype
    values = data.view(real) if data.dtype.kind == "c" else data   # (real, imag) pairs
    count, largest = device.thread_cached(
        ("overflow-reductions", real.str), lambda: _overflow_reductions(device.context, real))
    found = int(count(values, queue=queue).get())
    if found:
        raise overflow_error(found, float(largest(values, queue=queue).get()), dtype, what)
