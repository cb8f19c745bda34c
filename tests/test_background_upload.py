"""A host CSR converted on a GPU goes up in background threads (background_upload.py):
the arrays equal the CSR's, the conversion's host work runs while the column indices are
on their way, an upload's failure reaches the caller, and a conversion that fails
leaves no upload running.  (A GPU profile on whatever device the tests run on.)"""

import threading

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DEVICES, assert_close, poisoned, reference

import pyspmv_cl as psc
from pyspmv_cl import background_upload
from pyspmv_cl.background_upload import BackgroundUpload
from pyspmv_cl.errors import FormatNotSuitableError
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats import get_format
from pyspmv_cl.formats.base import instantiate
from pyspmv_cl.formats.csr_vector import CSRVector

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")


def _matrix(rng, m=300, n=250, density=0.05):
    return sp.random(m, n, density=density, format="csr", random_state=rng,
                     data_rvs=rng.standard_normal)


def _uneven():
    """One full row over a diagonal: too much padding for ell at max_padding=2."""
    A = sp.lil_matrix((400, 400))
    A[0, :] = 1.0
    A.setdiag(2.0)
    return A.tocsr()


def _uploads_running():
    return [t for t in threading.enumerate() if t.name == "pyspmv_cl-upload"]


def test_arrays_equal_the_csr(device, rng):
    A = _matrix(rng)
    up = BackgroundUpload(A, device.queue, np.int32, np.float32)
    assert up.shape == A.shape and up.nnz == A.nnz and up.owned
    assert up.dtype == np.float32 and up.context == device.context
    np.testing.assert_array_equal(up.indptr, A.indptr)
    np.testing.assert_array_equal(up.indptr_device.get(), A.indptr.astype(np.int32))
    np.testing.assert_array_equal(up.indices.get(), A.indices.astype(np.int32))
    np.testing.assert_array_equal(up.data.get(), A.data.astype(np.float32))
    up.wait()
    assert up.as_type("indices", np.int32, device.queue) is up.indices


def test_conversion_runs_during_the_upload(device, rng, monkeypatch):
    """The column indices' copy is held until csr-vector's row blocks (host work of the
    conversion) are made: with the upload before the conversion, as it was, the event
    would never be set in time."""
    A = _matrix(rng, 2000, 1500, 0.01)
    blocks_made = threading.Event()
    held = []
    real_to_device = cla.to_device

    def to_device(queue, array, *args, **kwargs):
        if array.size == A.nnz and array.dtype == np.int32:   # the column indices
            held.append(blocks_made.wait(timeout=30))
        return real_to_device(queue, array, *args, **kwargs)

    real_blocks = CSRVector._row_blocks

    def row_blocks(self, indptr):
        out = real_blocks(self, indptr)
        blocks_made.set()
        return out

    monkeypatch.setattr(background_upload.cla, "to_device", to_device)
    monkeypatch.setattr(CSRVector, "_row_blocks", row_blocks)
    gpu = device.override(device_type="gpu")
    op = psc.SpMV(A, format="csr-vector", dtype=np.float32, device=gpu, mapping="adaptive")
    assert held == [True]
    assert op._impl.converting_on_device and not _uploads_running()
    x = rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], np.float32)
    op.matvec(x, out=out)
    assert_close(out, reference(A, x), A, x, np.float32)


def test_an_upload_failure_reaches_the_caller(device, rng, monkeypatch):
    A = _matrix(rng)
    real_to_device = cla.to_device

    def to_device(queue, array, *args, **kwargs):
        if array.dtype == np.float32:
            raise MemoryError("device memory exhausted (injected)")
        return real_to_device(queue, array, *args, **kwargs)

    monkeypatch.setattr(background_upload.cla, "to_device", to_device)
    up = BackgroundUpload(A, device.queue, np.int32, np.float32)
    with pytest.raises(MemoryError, match="injected"):
        up.as_type("data", np.float32, device.queue)
    with pytest.raises(MemoryError, match="injected"):
        up.wait()
    gpu = device.override(device_type="gpu")
    for fmt in ("csr-vector", "sell", "coo"):
        with pytest.raises(MemoryError, match="injected"):
            psc.SpMV(A, format=fmt, dtype=np.float32, device=gpu)
    assert not _uploads_running()


def test_an_unread_array_failure_is_raised(device, rng, monkeypatch):
    """An array the conversion never read still counts: its failed upload is raised
    once the conversion is done, not dropped."""
    A = _matrix(rng)
    real_to_device = cla.to_device

    def to_device(queue, array, *args, **kwargs):
        if array.size == A.shape[0] + 1:   # indptr
            raise RuntimeError("indptr upload failed (injected)")
        return real_to_device(queue, array, *args, **kwargs)

    monkeypatch.setattr(background_upload.cla, "to_device", to_device)
    up = BackgroundUpload(A, device.queue, np.int32, np.float32)
    np.testing.assert_array_equal(up.data.get(), A.data.astype(np.float32))
    with pytest.raises(RuntimeError, match="injected"):
        up.wait()


def test_a_conversion_failing_before_its_kernels_copies_nothing(device, monkeypatch):
    """ell refuses rows of very uneven length in its analysis, before its kernels are
    built and the copies of its own upload start: nothing is copied, no upload is left
    running.  (``instantiate``'s upload; SpMV starts one earlier, test below.)"""
    A = _uneven()
    copied = []
    real_to_device = cla.to_device

    def to_device(queue, array, *args, **kwargs):
        copied.append(array.size)
        return real_to_device(queue, array, *args, **kwargs)

    monkeypatch.setattr(background_upload.cla, "to_device", to_device)
    gpu = device.override(device_type="gpu")
    ell = get_format("ell")
    params = ell.resolve_params(MatrixFeatures.from_csr(A), gpu.profile, np.float32,
                                {"max_padding": 2.0})
    with pytest.raises(FormatNotSuitableError):
        instantiate(ell, A, gpu, np.float32, params)
    assert copied == [] and not _uploads_running()


def test_a_failed_conversion_leaves_no_upload_running(device, rng, monkeypatch):
    """A conversion that fails while a copy is in flight (csr-vector's row blocks,
    host work after its kernels are built): the uploads are stopped and joined before
    the error reaches the caller."""
    A = _matrix(rng)
    started = threading.Event()
    release = threading.Event()
    real_to_device = cla.to_device

    def to_device(queue, array, *args, **kwargs):
        started.set()
        release.wait(timeout=30)   # held until the failure is under way
        return real_to_device(queue, array, *args, **kwargs)

    def row_blocks(self, indptr):
        assert started.wait(timeout=30)   # a copy is in flight
        raise RuntimeError("row blocks failed (injected)")

    real_abandon = BackgroundUpload.abandon
    abandoned = []

    def abandon(self):
        abandoned.append(self)
        release.set()
        real_abandon(self)

    monkeypatch.setattr(background_upload.cla, "to_device", to_device)
    monkeypatch.setattr(CSRVector, "_row_blocks", row_blocks)
    monkeypatch.setattr(BackgroundUpload, "abandon", abandon)
    gpu = device.override(device_type="gpu")
    with pytest.raises(RuntimeError, match="injected"):
        psc.SpMV(A, format="csr-vector", dtype=np.float32, device=gpu, mapping="adaptive")
    assert len(abandoned) == 1 and not _uploads_running()
    assert abandoned[0]._arrays["data"].cancelled()   # stopped after the copy in flight



@pytest.mark.parametrize("kwargs", [{"format": "sell", "tune": True},
                                    {"format": "auto", "tune": "sometimes"},
                                    {"format": "ell", "max_padding": 2.0}])
def test_a_refused_operator_leaves_no_upload_running(device, kwargs):
    A = _uneven()
    with pytest.raises(psc.PySpMVError):
        psc.SpMV(A, dtype=np.float32, device=device.override(device_type="gpu"), **kwargs)
    assert not _uploads_running()


def test_devices_without_threads_upload_in_the_caller(device, rng, monkeypatch):
    """Where the library's threads may not enqueue beside the caller (PoCL's basic
    driver, Oclgrind: ``enqueues_from_threads``), the upload is the caller's own."""
    from pyspmv_cl.formats import base

    made = []

    class Recorded(BackgroundUpload):
        def __init__(self, *args):
            made.append(args)
            super().__init__(*args)

    monkeypatch.setattr(base, "enqueues_from_threads", lambda dev: False)
    monkeypatch.setattr(base, "BackgroundUpload", Recorded)
    A = _matrix(rng)
    op = psc.SpMV(A, format="csr-vector", dtype=np.float32,
                  device=device.override(device_type="gpu"), mapping="adaptive")
    assert made == [] and op._impl.converting_on_device and not _uploads_running()
    x = rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], np.float32)
    op.matvec(x, out=out)
    assert_close(out, reference(A, x), A, x, np.float32)


def test_which_devices_take_threads(device):
    from pyspmv_cl.device import enqueues_from_threads, runs_in_calling_thread

    expected = not runs_in_calling_thread(device) and \
        "oclgrind" not in device.profile.platform_name.lower()
    assert enqueues_from_threads(device) is expected
