"""A host CSR uploaded by threads of its own while the caller goes on converting.

A GPU converts a host matrix on the device (``formats.base.instantiate``): the CSR goes
up first.  At 20M non-zeros on an H100's host the copies from pageable memory took
17-27 ms, and the values' cast to the operator's type 8 ms before them; the
conversion's own host work (its analysis of the row pointers, csr-vector's row blocks:
8-14 ms) waited for both.  Here one thread casts the values while another copies
(pyopencl lets the GIL go during a blocking copy), and the conversion's host work runs
meanwhile; each array is waited for where first used.  One copying thread: the driver
serialises copies (on one queue or several), so splitting an array over threads gained
nothing (a probe, 2-16 threads: 17-21 ms against 17 ms on one queue).

A blocking copy has finished when its thread hands the array over, so kernels the
caller enqueues afterwards, on any queue of the context, read it complete.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pyopencl.array as cla

from .device_inputs import DeviceCSR
from .host_arrays import cast


class BackgroundUpload(DeviceCSR):
    """:class:`DeviceCSR` of a validated host CSR whose device arrays (``data`` in
    ``dtype``, ``indices`` and ``indptr_device`` in ``index_dtype``) are uploaded in the
    background on ``queue``; reading one waits for it (and raises what its upload
    raised).  Owned: the operator may keep the arrays.

    The values' cast starts at once, the copies at ``start()`` (or the first read of an
    array): NVIDIA's driver holds the creation of kernel objects up behind a copy from
    pageable memory (an H100: 1 ms of kernel objects took 27-38 ms during the copies),
    so a conversion builds its kernels first.  ``indptr`` and ``indices`` go first,
    what a conversion's first kernels read.  ``wait`` joins the uploads, ``abandon``
    stops them after the copy in flight."""

    def __init__(self, csr, queue, index_dtype, dtype):
        # (DeviceCSR.__init__ is not called: its array attributes are properties here)
        self.owned = True
        self.indptr = np.asarray(csr.indptr, dtype=np.int64)
        self.shape = tuple(int(s) for s in csr.shape)
        self.nnz = int(csr.indices.size)
        self.dtype = np.dtype(dtype)
        self._context = queue.context
        self._go, self._stop = threading.Event(), threading.Event()
        self._arrays = {name: Future() for name in ("indptr", "indices", "data")}
        self._host_values = Future()
        structure = (("indptr", csr.indptr, index_dtype), ("indices", csr.indices, index_dtype))
        self._threads = [
            threading.Thread(target=self._cast, args=(csr.data,), name="pyspmv_cl-upload",
                             daemon=True),
            threading.Thread(target=self._copy, args=(queue, structure),
                             name="pyspmv_cl-upload", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _cast(self, values):
        try:
            self._host_values.set_result(cast(values, self.dtype))
        except BaseException as exc:   # handed to the reader of ``data``
            self._host_values.set_exception(exc)

    def _copy(self, queue, structure):
        self._go.wait()
        for name, array, dtype in structure:
            self._copy_one(queue, name, lambda array=array, dtype=dtype: cast(array, dtype))
        self._copy_one(queue, "data", self._host_values.result)

    def _copy_one(self, queue, name, host):
        future = self._arrays[name]
        if self._stop.is_set():
            future.cancel()
            return
        try:
            future.set_result(cla.to_device(queue, host()))
        except BaseException as exc:   # handed to the reader, raised there
            future.set_exception(exc)

    def start(self) -> None:
        self._go.set()

    def _array(self, name):
        self.start()   # read now: copy now
        return self._arrays[name].result()

    @property
    def data(self):
        return self._array("data")

    @property
    def indices(self):
        return self._array("indices")

    @property
    def indptr_device(self):
        return self._array("indptr")

    @property
    def context(self):
        return self._context

    def wait(self) -> None:
        """Return once every upload has ended (none is left running on the queue);
        raise what an upload raised (an array nobody read too)."""
        self.start()
        for thread in self._threads:
            thread.join()
        for future in self._arrays.values():
            if not future.cancelled() and future.exception() is not None:
                raise future.exception()

    def abandon(self) -> None:
        """Upload nothing more; return once the copy in flight, if any, has ended."""
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join()
