"""A CSR matrix given as pyopencl arrays: every format gives the products of the same
matrix given on the host, the CSR kernels take it without reading it back, the
operator keeps its own copies, bad structure is refused before any kernel runs, and
update_values and format="auto" (online tuning) work on it."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DEVICES, assert_close, make_operator, poisoned, reference
from device_conversion import on_device
from matrix_cases import CASES

import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.formats import FORMATS
from pyspmv_cl.tuning import database

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["empty_rows", "power_law", "0x0", "duplicates_csr"])
@pytest.mark.parametrize("fmt", psc.formats())
def test_every_format_takes_a_device_matrix(fmt, case, dtype, device, rng):
    if dtype == np.float64 and not device.profile.fp64:
        pytest.skip("no fp64")
    A = sp.csr_matrix(CASES[case](rng) if callable(CASES[case]) else CASES[case])
    triple = on_device(device.queue, A)
    op = make_operator(triple, fmt, shape=A.shape, dtype=dtype, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses {case}")
    x = rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], dtype)
    op.matvec(x, out=out)
    assert_close(out, reference(A, x), A, x, dtype)


@pytest.mark.parametrize("profile", ["native", "gpu"])
@pytest.mark.parametrize("fmt", psc.formats())
def test_every_format_takes_views_at_an_offset(fmt, profile, device, rng):
    """The caller's arrays may be views into larger buffers (their heads poisoned): every
    conversion reads the views, not the buffers' first elements (ell and ellr-t gave
    wrong products, sell and coo crashed PoCL before DeviceCSR.as_type copied them)."""
    dev = device.override(device_type="gpu") if profile == "gpu" else device
    A = sp.csr_matrix(CASES["empty_rows"](rng))
    pad = 5
    poison = {np.dtype(np.float64): np.nan, np.dtype(np.int32): 2**30}
    whole = [cla.to_device(dev.queue, np.concatenate([np.full(pad, poison[a.dtype], a.dtype), a]))
             for a in (A.data.astype(np.float64), A.indices.astype(np.int32),
                       A.indptr.astype(np.int32))]
    op = make_operator(tuple(w[pad:] for w in whole), fmt, shape=A.shape, dtype=np.float32,
                       device=dev)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    assert op._impl.converting_on_device
    x = rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], np.float32)
    op.matvec(x, out=out)
    assert_close(out, reference(A, x), A, x, np.float32)


@pytest.mark.parametrize("fmt, params", [("csr-scalar", {}), ("csr-vector", {}),
                                         ("csr-vector", {"mapping": "adaptive"})])
def test_csr_kernels_never_read_the_matrix_back(fmt, params, device, rng, monkeypatch):
    A = sp.csr_matrix(CASES["power_law"](rng))
    triple = on_device(device.queue, A, np.int64)   # cast to the operator's index type

    def refuse(*args, **kwargs):
        raise AssertionError("read the matrix back to the host")

    monkeypatch.setattr(psc.device_inputs.DeviceCSR, "to_host", refuse)
    op = psc.SpMV(triple, shape=A.shape, format=fmt, device=device, **params)
    assert op.params["index_bits"] == 32
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, np.float64)
    # The operator holds copies: the caller's arrays may change afterwards.
    triple[0].fill(0)
    assert_close(op @ x, reference(A, x), A, x, np.float64)


def test_new_values_for_a_device_matrix(device, rng):
    A = sp.csr_matrix(CASES["power_law"](rng))
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="sell", device=device)
    B = A.copy()
    B.data = rng.standard_normal(A.nnz)
    op.update_values(B.data)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(B, x), B, x, np.float64)


def test_auto_on_a_device_matrix_tunes_online(device, rng, tmp_path, monkeypatch):
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(tmp_path))
    database.clear_memory()
    A = generators.random_uniform(40_000, nnz_per_row=3, seed=5)
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, device=device)
    assert op.tuning.source == "online"
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, np.float64)
    assert op.finish_tuning() == "done", op.tuning.online.error
    assert_close(op @ x, reference(A, x), A, x, np.float64)
    database.clear_memory()


def test_the_arrays_queue_is_the_default_device(rng):
    device = DEVICES[-1]
    A = sp.random(50, 40, density=0.1, format="csr", random_state=3)
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="csr-scalar")
    assert op.device.context == device.context


@pytest.mark.parametrize("fmt", ["csr-scalar", "csr-vector", "csr5", "sell", "coo"])
def test_arrays_on_another_queue_of_the_context(fmt, device, rng):
    """A triple on another queue of the operator's context (a test drive): pyopencl's
    copy of an array ran on the array's queue, unordered with the conversion (csr-scalar,
    csr-vector and csr5 multiplied unfilled buffers: a segfault); a cast asserted the
    queues; a write still pending there (recorded in the array's events) was not
    waited for. Now the writes recorded are waited for and the arrays read on the
    operator's queue; the caller's other work there (gated on a user event, set after
    the operator is built) is not waited for."""
    A = sp.random(300, 250, density=0.05, format="csr", random_state=5)
    A.data[:] = rng.standard_normal(A.nnz)
    other = cl.CommandQueue(device.context)
    x = rng.standard_normal(250)
    for cast in (False, True):   # float64 values and int64 indices cast on the device
        types = (np.float64, np.int64) if cast else (np.float32, np.int32)
        triple = (cla.to_device(other, A.data.astype(types[0])),
                  cla.to_device(other, A.indices.astype(types[1])),
                  cla.to_device(other, A.indptr.astype(types[1])))
        triple[0].fill(0.0)
        triple[0].set(2 * A.data.astype(types[0]))   # (blocking: then one pending write)
        triple[0].__imul__(0.5)                         # recorded in data's events
        gate = cl.UserEvent(device.context)
        cl.enqueue_marker(other, wait_for=[gate])       # the caller's own later work
        op = psc.SpMV(triple, shape=A.shape, format=fmt, dtype=np.float32, device=device)
        y = op.matvec(x, out=poisoned(300, np.float32))
        gate.set_status(cl.command_execution_status.COMPLETE)
        assert_close(y, reference(A, x), A, x, np.float32)


def test_a_triple_mixing_host_and_device_arrays_is_refused(device):
    A = sp.random(30, 20, density=0.2, format="csr", random_state=6)
    dev = on_device(device.queue, A)
    for k, name in enumerate(("data", "indices", "indptr")):
        mixed = tuple((A.data, A.indices, A.indptr)[j] if j == k else dev[j]
                      for j in range(3))
        with pytest.raises(psc.InvalidTypeError, match=f"{name} on the host"):
            psc.SpMV(mixed, shape=A.shape, format="csr-scalar", device=device)


def decreasing(indptr):
    host = indptr.get()
    host[1], host[2] = host[2] + 3, host[2]   # row 1 ends before it starts
    return cla.to_device(indptr.queue, host)


@pytest.mark.parametrize("change, error, match", [
    (lambda t: (t[0], t[1], t[2][:-1]), psc.InvalidInputError, "indptr has"),
    (lambda t: (t[0][:-1], t[1], t[2]), psc.InvalidInputError, "differ in length"),
    (lambda t: (t[0], t[1] + 1000, t[2]), psc.InvalidInputError, "column indices"),
    (lambda t: (t[0], t[1] - 1000, t[2]), psc.InvalidInputError, "column indices"),
    (lambda t: (t[0], t[1], decreasing(t[2])), psc.InvalidInputError, "non-decreasing"),
    (lambda t: (t[0], t[1].astype(np.float32), t[2]), psc.UnsupportedDtypeError, "integers"),
    # (pyopencl cannot cast these on the device: its raw ValueError before)
    (lambda t: (cla.to_device(t[0].queue, t[0].get().astype(np.float16)), t[1], t[2]),
     psc.UnsupportedDtypeError, "float16 cannot be cast on the device"),
    (lambda t: (cla.to_device(t[0].queue, t[0].get() != 0), t[1], t[2]),
     psc.UnsupportedDtypeError, "bool cannot be cast on the device"),
])
def test_bad_device_matrices_are_refused(change, error, match, device):
    A = sp.random(60, 50, density=0.1, format="csr", random_state=4)
    triple = change(on_device(device.queue, A))
    with pytest.raises(error, match=match):
        psc.SpMV(triple, shape=A.shape, format="csr-scalar", device=device)
    with pytest.raises(TypeError, match="shape"):
        psc.SpMV(on_device(device.queue, A), format="csr-scalar", device=device)


def test_complex_device_matrix(device):
    """Complex device values: converted on the device (CSR kernels), or refused with a
    real dtype (the imaginary parts would be lost)."""
    A = sp.random(60, 50, density=0.1, format="csr", random_state=4)
    A = (A + 1j * A).astype(np.complex64)
    triple = on_device(device.queue, A)
    op = psc.SpMV(triple, shape=A.shape, format="csr-scalar", device=device)
    x = np.arange(50) * (1 - 1j)
    assert op.dtype == np.complex64
    assert np.allclose(op @ x, A @ x, rtol=1e-5, atol=1e-5)
    with pytest.raises(psc.UnsupportedDtypeError, match="imaginary"):
        psc.SpMV(triple, shape=A.shape, format="csr-scalar", dtype=np.float32, device=device)


def assert_same_arrays(op, on_host):
    """``op`` converted on the device, ``on_host`` on the host: the same arrays."""
    assert op._impl.converting_on_device and not on_host._impl.converting_on_device
    assert set(op._impl.buffers) == set(on_host._impl.buffers)
    for name in on_host._impl.buffers:
        dtype = {"values": np.float32, "col_off": np.uint16}.get(name,
                                                                  on_host._impl.index_dtype)
        np.testing.assert_array_equal(read_back(op, name, dtype),
                                      read_back(on_host, name, dtype), err_msg=name)


def read_back(op, name, dtype):
    buf = op._impl.buffers[name]
    host = np.empty(buf.size // np.dtype(dtype).itemsize, dtype)
    cl.enqueue_copy(op.queue, host, buf)
    return host


@pytest.mark.parametrize("params", [{}, {"sigma": 1}, {"sigma": "all", "slice_height": 4},
                                    {"mapping": "rows", "threads_per_row": 2,
                                     "slice_height": 8, "work_group_size": 64},
                                    {"col_bits": 16}, {"col_bits": 16, "sigma": "all"},
                                    {"col_bits": 16, "mapping": "rows", "slice_height": 8}])
@pytest.mark.parametrize("case", ["power_law", "empty_rows", "row_length_sweep"])
def test_sell_converts_on_the_device_to_the_host_conversion_s_arrays(case, params, device,
                                                                       rng):
    """sell's device-side conversion (from a device matrix, and from a host one on a
    GPU) gives exactly the arrays of its host conversion."""
    A = sp.csr_matrix(CASES[case](rng))
    host_side = device.override(device_type="cpu") if device.profile.is_gpu else device
    gpu = device.override(device_type="gpu")
    for op in (psc.SpMV(on_device(device.queue, A), shape=A.shape, format="sell",
                        dtype=np.float32, device=device, **params),
               psc.SpMV(A, format="sell", dtype=np.float32, device=gpu,
                        **{"mapping": "slices", **params})
               if params.get("mapping") != "rows" else None):
        if op is None:
            continue
        assert op._impl.converting_on_device
        # The host conversion with the same parameters (see the test below).
        on_host = psc.SpMV(A, format="sell", dtype=np.float32, device=host_side,
                           **op.params)
        assert_same_arrays(op, on_host)
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(A, x), A, x, np.float32)


PADDED = {"max_padding": float("inf")}


@pytest.mark.parametrize("fmt, params", [
    ("ell", PADDED), ("ellr-t", {"T": 1, **PADDED}), ("ellr-t", {"T": 4, **PADDED}),
    ("ellr-t", PADDED), ("coo", {}), ("coo", {"layout": "contiguous"}),
    ("coo", {"layout": "interleaved", "work_group_size": 32, "items_per_thread": 3}),
    ("hyb", {}), ("hyb", {"ell_width": 2}), ("hyb", {"ell_width": 0}),
    ("hyb", {"ell_width": 3, "layout": "interleaved", "coo_work_group_size": 16,
             "items_per_thread": 2})])
@pytest.mark.parametrize("case", ["empty_rows", "row_length_sweep", "duplicates_coo", "0x0",
                                  "m_x_0"])
def test_formats_convert_on_the_device_to_the_host_conversion_s_arrays(
        fmt, params, case, device, rng, monkeypatch):
    """ell, ellr-t, coo and hyb convert a device matrix (and, on a GPU, a host one) on
    the device, to exactly the arrays of their host conversion, without reading it
    back."""
    A = sp.csr_matrix(CASES[case](rng))
    kw = dict(params)

    def refuse(*args, **kwargs):
        raise AssertionError("read the matrix back to the host")

    gpu = device.override(device_type="gpu")
    with monkeypatch.context() as patch:
        patch.setattr(psc.device_inputs.DeviceCSR, "to_host", refuse)
        ops = [psc.SpMV(on_device(device.queue, A), shape=A.shape, format=fmt,
                        dtype=np.float32, device=device, **kw),
               psc.SpMV(A, format=fmt, dtype=np.float32, device=gpu, **kw)]
    for op in ops:
        assert op._impl.converting_on_device
        # The host conversion with the same parameters (a CPU-typed profile: GPUs
        # convert a host matrix on the device too).
        host_side = device.override(device_type="cpu") if device.profile.is_gpu else device
        declared = set(FORMATS[fmt].parameter_names()) | {"index_bits"}
        on_host = psc.SpMV(A, format=fmt, dtype=np.float32, device=host_side,
                           **{**kw, **{k: v for k, v in op.params.items() if k in declared}})
        assert_same_arrays(op, on_host)
        assert op._impl.nbytes == on_host._impl.nbytes
        # (a matrix given on the device: the column indices the operator keeps a copy
        # of, for formats that cannot read their pattern back, count as its own)
        assert op.nbytes_parts["matrix"] - op._impl.nbytes in (0, A.indices.nbytes)
        x = rng.standard_normal(A.shape[1])
        out = poisoned(A.shape[0], np.float32)
        op.matvec(x, out=out)
        assert_close(out, reference(A, x), A, x, np.float32)
