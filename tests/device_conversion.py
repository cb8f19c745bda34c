"""Helpers of the device-conversion tests (tests/test_*_device.py): a scipy matrix as
device arrays, a guard that fails on any read-back of the matrix, the comparison of an
operator's device arrays with the host conversion's, a product against scipy, and a
host matrix's route under GPU and CPU profiles."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy.sparse as sp
from conftest import assert_cclose, assert_close, poisoned, reference

import pyspmv_cl as psc
from pyspmv_cl.device_inputs import DeviceCSR
from pyspmv_cl.formats import base, get_format, values


def on_device(queue, A, index_dtype=np.int32):
    """``(data, indices, indptr)`` of ``A`` as pyopencl arrays (indices cast)."""
    return (cla.to_device(queue, A.data), cla.to_device(queue, A.indices.astype(index_dtype)),
            cla.to_device(queue, A.indptr.astype(index_dtype)))


def refuse_read_back(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("read the matrix back to the host")
    monkeypatch.setattr(DeviceCSR, "to_host", refuse)


def assert_same_as_host(op, A, *, on_device=True):
    """Every device array of ``op`` equals, bit for bit (-0.0 against +0.0 too), the host
    conversion's with the same parameters (``formats/values.host_arrays``: the format's
    own analyse + convert on the host; values stored as the operator stores them, in
    fewer bits with ``value_bits``), the same names; ``nbytes`` counts them and the
    scratch buffers.  Returns the host arrays."""
    impl = op._impl
    assert impl.converting_on_device == on_device
    host = values.host_arrays(impl, sp.csr_matrix(A, copy=True), impl.dtype, impl.value_dtype)
    assert set(impl.buffers) == set(host)
    for name, expected in host.items():
        buf = impl.buffers[name]
        assert buf.size == max(1, expected.nbytes), name
        if expected.size:
            got = np.empty_like(expected)
            cl.enqueue_copy(op.queue, got, buf)
            np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8),
                                          err_msg=name)
    assert impl.nbytes == sum(a.nbytes for a in host.values()) + sum(
        int(v) for v in impl.scratch_sizes().values())
    return host


def check_product(op, A, rng):
    """``op.matvec`` into a poisoned output against scipy's float64 (complex128)."""
    dtype = op.dtype
    x = rng.standard_normal(A.shape[1])
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], dtype)
    op.matvec(x, out=out)
    if dtype.kind == "c":
        ref = sp.csr_matrix(A, dtype=np.complex128, copy=True) @ x
        assert_cclose(out, ref, A, x, dtype)
    else:
        assert_close(out, reference(A, x), A, x, dtype)


def host_input_on_a_gpu(device, fmt, A, rng, gpu=None, **params):
    """A host CSR ``A`` goes up and converts on the device under a GPU profile (``gpu``:
    the override's settings), to the host conversion's arrays, with products matching
    scipy before and after update_values; under a CPU profile it converts on the host.
    Returns the GPU operator and profile."""
    gpu = device.override(device_type="gpu", **(gpu or {}))
    cpu = device.override(device_type="cpu")
    cls = get_format(fmt)
    assert base.converts_on_the_device(cls, A, gpu)
    assert not base.converts_on_the_device(cls, A, cpu)
    op = psc.SpMV(A, format=fmt, dtype=np.float32, device=gpu, **params)
    assert_same_as_host(op, A)
    check_product(op, A, rng)
    assert not psc.SpMV(A, format=fmt, dtype=np.float32, device=cpu,
                        **op.params)._impl.converting_on_device
    B = A.copy()
    B.data = rng.standard_normal(A.nnz)
    op.update_values(B.data)
    check_product(op, B, rng)
    return op, gpu
