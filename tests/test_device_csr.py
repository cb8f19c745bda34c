"""A CSR matrix given as pyopencl arrays: every format gives the products of the same
matrix given on the host, the CSR kernels take it without reading it back, the
operator keeps its own copies, bad structure is refused before any kernel runs, and
update_values and format="auto" (online tuning) work on it."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import (
    DEVICES,
    assert_close,
    make_operator,
    poisoned,
    reference,
    skip_without_fp64,
)
from device_conversion import assert_same_as_host, check_product, on_device, refuse_read_back
from matrix_cases import CASES, banded_with_holes

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


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64,
                                                             marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("fmt", psc.formats())
def test_new_values_for_a_device_matrix(fmt, dtype, device, rng):
    """update_values on an operator made from a device CSR, in every format (those
    converting it on the device find their map there, from position codes; the CSR
    kernels copy the values straight in): products into poisoned outputs, host and
    device, against scipy before and after each of two updates (the second reuses the
    map)."""
    skip_without_fp64(device, dtype)
    A = banded_with_holes(rng)   # every format takes it (dia too)
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format=fmt, dtype=dtype,
                  device=device, **({"max_padding": None} if fmt in ("ell", "ellr-t") else {}))
    impl = op._impl
    x = rng.standard_normal(A.shape[1])
    x_dev = cla.to_device(op.queue, x.astype(dtype))

    def check(B):
        out = poisoned(A.shape[0], dtype)
        op.matvec(x, out=out)
        assert_close(out, reference(B, x), B, x, dtype)
        out_dev = cla.to_device(op.queue, poisoned(A.shape[0], dtype))
        op.matvec(x_dev, out=out_dev)
        assert_close(out_dev.get(), reference(B, x), B, x, dtype)

    check(A)
    for _ in range(2):
        B = A.copy()
        B.data = rng.standard_normal(A.nnz)
        op.update_values(B.data)
        assert op._impl is impl
        if impl.converting_on_device and not type(impl).host_conversion_is_cast:
            assert op._updater.codes is not None, "no map found on the device"
        check(B)


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


#: The CSR kernels' layouts: (format, parameters, profile).  csr-vector under a GPU
#: profile defaults to the adaptive mapping with col_bits="auto" (16-bit columns here).
CSR_LAYOUTS = [
    ("csr-scalar", {}, "native"),
    ("csr-scalar", {"value_bits": 16}, "native"),
    ("csr-vector", {}, "native"),   # the rows mapping (a CPU's default)
    ("csr-vector", {}, "gpu"),
    ("csr-vector", {"col_bits": 32}, "gpu"),
    ("csr-vector", {"mapping": "adaptive", "work_group_size": 16, "items_per_thread": 3,
                    "block_rows": 4}, "native"),
    ("csr-vector", {"mapping": "merge"}, "native"),
    ("csr-vector", {"mapping": "merge", "work_group_size": 16, "items_per_thread": 3}, "gpu"),
    ("csr-vector", {"value_bits": 16, "work_group_size": 16, "items_per_thread": 3}, "gpu"),
]


def _layout_id(layout):
    fmt, params, profile = layout
    return "-".join([fmt, profile, *(f"{k}={v}" for k, v in params.items())])


def _csr_kernel_arrays_match_the_host_conversion(fmt, params, profile, A, dtype, device,
                                                 rng, monkeypatch, index_dtype=np.int32):
    """A device CSR (float64 values, ``index_dtype`` indices: cast on the device) made
    into ``fmt``: no read-back, every array bit for bit the host conversion's (row
    pointers, columns or their 16-bit offsets and bases, values, row blocks, merge
    groups), then a poisoned product against scipy.  Returns the operator."""
    dev = device.override(device_type="gpu") if profile == "gpu" else device
    triple = on_device(dev.queue, A, index_dtype)
    with monkeypatch.context() as patch:
        refuse_read_back(patch)
        op = psc.SpMV(triple, shape=A.shape, format=fmt, dtype=dtype, device=dev, **params)
    assert all(op.params[k] == v for k, v in params.items()), op.params
    host = assert_same_as_host(op, A)
    # Values in fewer bits (value_bits): the product of those, as stored (rounded to
    # the operator's type first, then to the stored one: as the host conversion does).
    stored = A.copy()
    stored.data = A.data.astype(op.dtype).astype(op._impl.value_dtype).astype(A.dtype)
    check_product(op, stored, rng)
    return op, host


@pytest.mark.parametrize("case", ["power_law", "empty_rows", "0x0",
                                  pytest.param("duplicates_csr", marks=pytest.mark.exhaustive),
                                  pytest.param("unsorted_indices", marks=pytest.mark.exhaustive),
                                  pytest.param("row_length_sweep", marks=pytest.mark.exhaustive),
                                  pytest.param("one_long_row", marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("layout", CSR_LAYOUTS, ids=_layout_id)
def test_csr_kernels_convert_a_device_matrix_to_the_host_conversion_s_arrays(
        layout, case, device, rng, monkeypatch):
    """csr-scalar and csr-vector (rows, adaptive with 16- and 32-bit columns, merge, values
    in fewer bits) made from a CSR already on the device hold exactly the arrays of
    their host conversion with the same parameters (issue #15), not only products
    within tolerance."""
    fmt, params, profile = layout
    if "value_bits" in params and case == "0x0":
        # (no values: the device rounding's array is a one-element placeholder, the
        # host's empty)
        pytest.skip("value_bits without values")
    A = sp.csr_matrix(CASES[case](rng) if callable(CASES[case]) else CASES[case])
    op, host = _csr_kernel_arrays_match_the_host_conversion(
        fmt, params, profile, A, np.float32, device, rng, monkeypatch,
        np.int64 if case == "power_law" else np.int32)
    mapping = op.params.get("mapping")
    expected = {"row_ptr", "values"}
    if mapping == "adaptive":
        expected.add("row_blocks")
    if mapping == "merge":
        expected |= {"group_rows", "fix_groups"}
    if op.params.get("col_bits") == 16:
        expected |= {"col_base", "row_base", "col_off"}
    else:
        expected.add("col_idx")
    assert set(host) == expected
    if fmt == "csr-vector" and profile == "gpu" and not params and A.nnz:
        assert mapping == "adaptive" and op.params["col_bits"] == 16   # the GPU default


def far_columns(rng, far_rows):
    """2000 x 140,000: row i's 0-5 entries among columns 30 i .. 30 i + 29 (every row
    block spans far less than 16 bits of columns), and each row of ``far_rows`` given
    one more entry in the last column, over 65,535 columns away (its block then spans
    more than 16 bits)."""
    m, n = 2000, 140_000
    rows = np.repeat(np.arange(m), rng.integers(0, 6, m))
    cols = 30 * rows + rng.integers(0, 30, rows.size)
    far = np.asarray(far_rows)
    rows = np.concatenate([rows, far])
    cols = np.concatenate([cols, np.full(far.size, n - 1)])
    A = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(m, n))
    A.sum_duplicates()
    return A


@pytest.mark.exhaustive
@pytest.mark.parametrize("far, params, dtype, col_bits, escape", [
    # a few wide blocks: escaped to col_wide
    ("few", {}, np.float32, 16, True),
    # most entries in wide blocks: "auto" takes 32 bits
    ("all", {}, np.float32, 32, False),
    # 16 bits asked for: every block escapes (complex values)
    ("all", {"col_bits": 16}, np.complex64, 16, True),
], ids=["few-wide", "all-wide-auto", "all-wide-16-complex64"])
def test_csr_vector_s_wide_blocks_convert_on_the_device_to_the_host_arrays(
        far, params, dtype, col_bits, escape, device, rng, monkeypatch):
    """The adaptive mapping's 16-bit columns with row blocks wider than 16 bits (their
    escape to ``col_wide``, and col_bits="auto" falling back to 32 bits) from a device
    CSR: the host conversion's arrays, bit for bit; complex values too."""
    A = far_columns(rng, [0, 1, 777, 1999] if far == "few" else np.arange(2000))
    if np.dtype(dtype).kind == "c":
        A = sp.csr_matrix(A + 1j * sp.csr_matrix(
            (rng.standard_normal(A.nnz), A.indices, A.indptr), shape=A.shape))
    op, host = _csr_kernel_arrays_match_the_host_conversion(
        "csr-vector", params, "gpu", A, dtype, device, rng, monkeypatch)
    assert op.params["mapping"] == "adaptive" and op.params["col_bits"] == col_bits
    assert op._impl.col_escape == escape and ("col_wide" in host) == escape
