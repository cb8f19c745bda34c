"""Bad input gets a clear error (the right exception type and a message that says what
is wrong), never a crash, a hang or a silently wrong result."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, poisoned, reference, skip_without_fp64

import pyspmv_cl as psc
import pyspmv_cl.cache
from pyspmv_cl.formats.base import choose_index_dtype, format_bytes


def small_matrix(rng, shape=(40, 30), density=0.2, dtype=np.float64):
    return sp.random(*shape, density=density, format="csr", random_state=rng, dtype=dtype)


@pytest.fixture
def op32(device, rng):
    """A float32 operator (every device supports float32) and its matrix."""
    A = small_matrix(rng, dtype=np.float32)
    return psc.SpMV(A, format="csr-scalar", device=device), A


@pytest.fixture
def cpu_device():
    """One device for the host-side checks that do not depend on the device."""
    devices = psc.devices()
    if not devices:
        pytest.skip("no OpenCL device")
    return devices[0]


# ------------------------------------------------------------------ vector shapes and dtypes


@pytest.mark.parametrize("shape", [(29,), (31,), (30, 2, 1), (), (40,), (1, 30)])
def test_wrong_x_shape(op32, shape):
    op, _ = op32
    with pytest.raises(ValueError, match=r"x has shape .*needs \(30,\)"):
        op @ np.ones(shape, dtype=np.float32)


@pytest.mark.parametrize("shape", [(39,), (41,), (40, 1), (30,)])
def test_wrong_out_shape(op32, shape):
    op, _ = op32
    with pytest.raises(ValueError, match=r"out has shape .*expected \(40,\)"):
        op.matvec(np.ones(30, dtype=np.float32), out=np.empty(shape, dtype=np.float32))


@pytest.mark.parametrize("x", [np.array(["a"] * 30), np.array([object()] * 30, dtype=object),
                               np.array([b"ab"] * 30)], ids=["str", "object", "bytes"])
def test_non_numeric_x(op32, x):
    op, _ = op32
    with pytest.raises(psc.UnsupportedDtypeError, match="non-numeric"):
        op @ x
    assert issubclass(psc.UnsupportedDtypeError, TypeError)


def test_an_operator_as_x_is_refused_by_name(op32):
    """op @ op (and a linear operator, a transposed view) said "non-numeric dtype
    object"; now the error names the operator and how to compose; op * x says to use @."""
    op, _ = op32
    for call in (lambda: op @ op, lambda: op.matmat(op), lambda: op.rmatvec(op),
                 lambda: op @ op.aslinearoperator(), lambda: op.matvec(op.T),
                 lambda: op.T @ op, lambda: op.rmatmat(op)):
        with pytest.raises(psc.InvalidTypeError, match="is an operator .*aslinearoperator"):
            call()
    assert op._transposed is None   # refused before A^T was built for it
    for call in (lambda: op * np.ones(30), lambda: np.ones(40) * op, lambda: 2.0 * op):
        with pytest.raises(psc.InvalidTypeError, match=r"the product is op @ x"):
            call()


def test_complex_matrix_with_a_real_dtype(cpu_device, rng):
    A = small_matrix(rng).astype(np.complex128)
    with pytest.raises(psc.UnsupportedDtypeError, match="imaginary.*complex64"):
        psc.SpMV(A, dtype=np.float32, device=cpu_device)


def test_complex_x(op32):
    """A real operator with a complex host x: numpy's promotion (tests/test_complex.py
    checks the values); a complex device x is refused with what to do."""
    op, _ = op32
    assert (op @ (np.ones(30) + 1j)).dtype == np.complex128
    with pytest.raises(psc.UnsupportedDtypeError, match="dtype=numpy.complex64"):
        op @ cla.to_device(op.queue, np.ones(30, dtype=np.complex64))


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.complex256, "int64", "bogus-type"])
def test_unsupported_dtype_argument(cpu_device, rng, dtype):
    A = small_matrix(rng)
    with pytest.raises(psc.UnsupportedDtypeError, match="float32, float64, complex64"):
        psc.SpMV(A, dtype=dtype, device=cpu_device)


def test_float64_refused_without_fp64_before_compiling(device, rng):
    A = small_matrix(rng)
    no_fp64 = device.override(fp64=False)
    builds = pyspmv_cl.cache.stats["builds"]
    with pytest.raises(psc.DeviceCapabilityError, match=r"fp64|double"):
        psc.SpMV(A, dtype=np.float64, device=no_fp64)
    with pytest.raises(psc.DeviceCapabilityError, match=r"fp64|double"):
        psc.SpMV(A, device=no_fp64)  # a float64 matrix keeps its dtype by default
    assert pyspmv_cl.cache.stats["builds"] == builds, "something was compiled before refusing"


def test_integer_matrix_without_fp64_computes_in_float32(device, rng):
    A = sp.random(30, 20, density=0.3, format="csr", random_state=rng,
                  data_rvs=lambda n: rng.integers(-5, 5, n)).astype(np.int32)
    op = psc.SpMV(A, device=device.override(fp64=False))
    assert op.dtype == np.float32
    x = rng.standard_normal(20)
    assert_close(op @ x, reference(A, x), A, x, np.float32)


# ------------------------------------------------------------------- layouts that must work


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_contiguous_x(device, rng, dtype):
    skip_without_fp64(device, dtype)
    A = small_matrix(rng, dtype=dtype)
    big = rng.standard_normal(60).astype(dtype)
    x = big[::2]
    assert not x.flags.c_contiguous
    op = psc.SpMV(A, device=device)
    assert_close(op @ x, reference(A, x), A, x, dtype)
    x2 = rng.standard_normal((30, 3))[:, 1]  # a column of a C-ordered 2-D array
    assert_close(op @ x2, reference(A, x2), A, x2, dtype)


def test_read_only_x(device, rng):
    A = small_matrix(rng, dtype=np.float32)
    x = rng.standard_normal(30).astype(np.float32)
    x.setflags(write=False)
    op = psc.SpMV(A, device=device)
    assert_close(op @ x, reference(A, x), A, x, np.float32)
    out = poisoned(40, np.float32)
    op.matvec(x, out=out)
    assert_close(out, reference(A, x), A, x, np.float32)


def test_read_only_out(op32, rng):
    op, _ = op32
    out = np.zeros(40, dtype=np.float32)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        op.matvec(np.ones(30, dtype=np.float32), out=out)


@pytest.mark.parametrize("out", [[0.0] * 40, tuple([0.0] * 40), 0.0, "out",
                                 sp.csr_matrix((40, 1)), np.matrix(np.zeros((40, 1)))])
def test_out_of_the_wrong_kind_is_a_type_error(op32, out):
    """An out that is no numpy array is an InvalidTypeError, as such an x is (it was an
    InvalidInputError, a ValueError: a test drive's report)."""
    op, _ = op32
    with pytest.raises(psc.InvalidTypeError, match="out must be a writeable numpy array"):
        op.matvec(np.ones(30, dtype=np.float32), out=out)
    with pytest.raises(psc.InvalidTypeError, match="out must be"):
        op.rmatvec(np.ones(40, dtype=np.float32), out=out)


def test_non_contiguous_out(op32, rng):
    op, A = op32
    x = rng.standard_normal(30).astype(np.float32)
    big = np.full(80, 7.0, dtype=np.float32)
    out = big[1::2]
    assert not out.flags.c_contiguous
    result = op.matvec(x, out=out)
    assert result is out
    assert_close(big[1::2], reference(A, x), A, x, np.float32)
    assert np.all(big[0::2] == 7.0), "entries between the strided view were overwritten"
    # beta != 0 reads the strided out as well.
    y0 = big[1::2].copy()
    op.matvec(x, out=out, alpha=2.0, beta=-0.5)
    assert_close(big[1::2], reference(A, x, 2.0, -0.5, y0), A, x, np.float32)
    assert np.all(big[0::2] == 7.0)


@pytest.mark.parametrize("xdtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_integer_x_is_converted(op32, rng, xdtype):
    op, A = op32
    x = rng.integers(0, 2 if xdtype is np.bool_ else 100, 30).astype(xdtype)
    assert_close(op @ x, reference(A, x), A, x, np.float32)


# ---------------------------------------------------------------------- device arrays


def test_device_array_on_another_context(op32, device):
    op, _ = op32
    other_ctx = cl.Context([device.cl_device])
    other_queue = cl.CommandQueue(other_ctx)
    x = cla.to_device(other_queue, np.ones(30, dtype=np.float32))
    with pytest.raises(ValueError, match="context"):
        op.matvec(x)
    good_x = cla.to_device(op.queue, np.ones(30, dtype=np.float32))
    out = cla.empty(other_queue, 40, np.float32)
    with pytest.raises(ValueError, match="context"):
        op.matvec(good_x, out=out)


def test_device_array_wrong_dtype(op32):
    """Device arrays must be float32 or float64 (the other float type is cast on the
    device: tests/test_adjoint.py); integer ones are refused, naming the fix."""
    op, _ = op32
    x = cla.to_device(op.queue, np.ones(30, dtype=np.int32))
    with pytest.raises(psc.UnsupportedDtypeError, match="int32.*astype.*float32"):
        op.matvec(x)
    x32 = cla.to_device(op.queue, np.ones(30, dtype=np.float32))
    out = cla.empty(op.queue, 40, np.int32)
    with pytest.raises(psc.UnsupportedDtypeError, match="int32"):
        op.matvec(x32, out=out)


def test_device_array_wrong_shape(op32):
    op, _ = op32
    x = cla.to_device(op.queue, np.ones(31, dtype=np.float32))
    with pytest.raises(ValueError, match="x has shape"):
        op.matvec(x)


# ---------------------------------------------------------------------------- alpha/beta


def test_beta_without_out(op32):
    op, _ = op32
    with pytest.raises(ValueError, match="beta"):
        op.matvec(np.ones(30, dtype=np.float32), beta=0.5)


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", [1 + 2j, np.complex64(0.5j), np.complex128(3 - 1j)])
def test_complex_alpha_beta(op32, name, value):
    """A real operator with complex alpha/beta: the result is complex (numpy's rule),
    so a real out is refused."""
    op, _ = op32
    kwargs = {name: value, "out": np.zeros(40, dtype=np.float32)}
    with pytest.raises(psc.UnsupportedDtypeError, match="complex"):
        op.matvec(np.ones(30, dtype=np.float32), **kwargs)


@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_non_numeric_alpha_beta(op32, name):
    op, _ = op32
    kwargs = {name: "two", "out": np.zeros(40, dtype=np.float32)}
    with pytest.raises(psc.InvalidTypeError, match=f"{name} must be a real number"):
        op.matvec(np.ones(30, dtype=np.float32), **kwargs)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value, says", [
    (1e300, "outside float32's range"), (-1e39, "outside float32's range"),
    (np.float64(1e-50), "would round to 0"), (1e300 + 1j, "outside float32's range"),
    (1j * 1e-60, "would round to 0")])
def test_alpha_beta_a_32_bit_operator_cannot_hold(device, rng, dtype, name, value, says):
    """A 32-bit operator computes with alpha and beta in 32 bits: one that would become
    inf or 0 there is refused (1e300 gave inf and 1e-50 gave 0, silently), in single
    and block products alike; inf and subnormals pass."""
    A = small_matrix(rng)
    op = psc.SpMV(A, dtype=dtype, device=device)
    out = np.zeros(A.shape[0], dtype=np.result_type(dtype, value))
    x = rng.standard_normal(A.shape[1])
    if isinstance(value, complex) and dtype == np.float32:
        # a real operator applies complex scalars on the host, in complex128: kept
        y0 = rng.standard_normal(A.shape[0]) + 0j
        got = op.matvec(x, out=y0.copy(), **{name: value})
        want = value * (A @ x) if name == "alpha" else A @ x + value * y0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * abs(want).max())
        return
    with pytest.raises(psc.InvalidInputError, match=f"{name}=.*{says}"):
        op.matvec(np.ones(A.shape[1]), out=out, **{name: value})
    with pytest.raises(psc.InvalidInputError, match=says):
        op.matmat(np.ones((A.shape[1], 3)), **{name: value}, **(
            {"out": np.zeros((A.shape[0], 3), out.dtype)} if name == "beta" else {}))
    op.matvec(x, **{name: 1e-45}, **({"out": out} if name == "beta" else {}))   # passes
    y0 = rng.standard_normal(A.shape[0])
    got = op.matvec(x, out=y0.astype(out.dtype), **{name: np.inf})
    assert np.all(np.isinf(got) | np.isnan(got))


def test_alpha_beta_in_a_64_bit_operator(device, rng):
    if not device.profile.fp64:
        pytest.skip("no fp64")
    A = small_matrix(rng)
    x = rng.standard_normal(A.shape[1])
    got = psc.SpMV(A, dtype=np.float64, device=device).matvec(x, alpha=1e300)
    np.testing.assert_allclose(got, 1e300 * (A @ x), rtol=1e-12)


# --------------------------------------------------------------------- device limits


def test_matrix_over_max_allocation(device, rng):
    A = sp.random(200, 200, density=0.1, format="csr", random_state=rng, dtype=np.float32)
    small = device.override(max_alloc_size=4096)
    with pytest.raises(psc.DeviceMemoryError, match="maximum single allocation") as info:
        psc.SpMV(A, format="csr-scalar", device=small)
    message = str(info.value)
    # The message names the size of the offending array and the limit.
    sizes = [A.nnz * 4]  # col_idx (int32) and values (float32) are both nnz * 4 bytes
    assert any(format_bytes(n) in message or str(n) in message for n in sizes), message
    assert "4.0 KiB" in message or "4096" in message, message
    assert isinstance(info.value, MemoryError)


def test_work_group_size_over_device_maximum(device, rng):
    A = small_matrix(rng, dtype=np.float32)
    limit = device.profile.max_work_group_size
    with pytest.raises(ValueError, match=rf"work_group_size.*{limit}"):
        psc.SpMV(A, format="csr-scalar", device=device, work_group_size=2 * limit)
    pretend = device.override(max_work_group_size=32)
    with pytest.raises(ValueError, match=r"work_group_size=64 exceeds .*32"):
        psc.SpMV(A, format="csr-scalar", device=pretend, work_group_size=64)


@pytest.mark.parametrize("wg", [0, -4, 2.5, "64", True])
def test_work_group_size_not_a_positive_integer(cpu_device, rng, wg):
    A = small_matrix(rng, dtype=np.float32)
    with pytest.raises(ValueError, match="work_group_size"):
        psc.SpMV(A, format="csr-scalar", device=cpu_device, work_group_size=wg)


@pytest.mark.parametrize("vector_size", [3, 6, 12, 0, 1, 128])
def test_csr_vector_size_not_power_of_two(cpu_device, rng, vector_size):
    A = small_matrix(rng, dtype=np.float32)
    with pytest.raises(ValueError, match="vector_size"):
        psc.SpMV(A, format="csr-vector", device=cpu_device, vector_size=vector_size)


@pytest.mark.parametrize("params, match", [
    ({"mapping": "diagonal"}, "mapping"),
    ({"mapping": "adaptive", "vector_size": 4}, "vector_size"),
    ({"mapping": "adaptive", "items_per_thread": 0}, "items_per_thread"),
    ({"mapping": "adaptive", "items_per_thread": 33}, "items_per_thread"),
    ({"mapping": "adaptive", "items_per_thread": 2.5}, "items_per_thread"),
    ({"mapping": "adaptive", "work_group_size": 96}, "power-of-two"),
    # (mapping given: a GPU's default mapping may be the adaptive one)
    ({"mapping": "rows", "items_per_thread": 4}, "adaptive"),
])
def test_csr_vector_mapping_errors(cpu_device, rng, params, match):
    A = small_matrix(rng, dtype=np.float32)
    with pytest.raises(ValueError, match=match):
        psc.SpMV(A, format="csr-vector", device=cpu_device, **params)


# ------------------------------------------------------------------ formats and params


def test_unknown_format(cpu_device, rng):
    A = small_matrix(rng)
    with pytest.raises(ValueError, match=r"unknown format 'csr-bogus'") as info:
        psc.SpMV(A, format="csr-bogus", device=cpu_device)
    for name in psc.formats():
        assert name in str(info.value)


@pytest.mark.parametrize("fmt", ["csr-scalar", "csr-vector"])
def test_unknown_format_parameter(cpu_device, rng, fmt):
    A = small_matrix(rng)
    with pytest.raises(TypeError, match=r"bogus_param.*accepts.*work_group_size"):
        psc.SpMV(A, format=fmt, device=cpu_device, bogus_param=3)


# ---------------------------------------------------------------------------- CSR input


def _triple(A):
    return A.data.copy(), A.indices.copy(), A.indptr.copy()


def test_valid_triple_works(device, rng):
    A = small_matrix(rng, dtype=np.float32)
    op = psc.SpMV(_triple(A), shape=A.shape, device=device)
    x = rng.standard_normal(30)
    assert_close(op @ x, reference(A, x), A, x, np.float32)


def test_triple_indptr_wrong_length(cpu_device, rng):
    data, indices, indptr = _triple(small_matrix(rng))
    with pytest.raises(ValueError, match="indptr has 40 entries.*41"):
        psc.SpMV((data, indices, indptr[:-1]), shape=(40, 30), device=cpu_device)
    with pytest.raises(ValueError, match="indptr"):
        psc.SpMV((data, indices, np.append(indptr, indptr[-1])), shape=(40, 30),
                 device=cpu_device)


def test_triple_decreasing_indptr(cpu_device):
    data = np.ones(4)
    indices = np.array([0, 1, 2, 0])
    indptr = np.array([0, 3, 1, 4])
    with pytest.raises(ValueError, match="non-decreasing"):
        psc.SpMV((data, indices, indptr), shape=(3, 3), device=cpu_device)


def test_triple_indptr_bad_ends(cpu_device):
    data, indices = np.ones(3), np.array([0, 1, 2])
    with pytest.raises(ValueError, match="indptr must start at 0"):
        psc.SpMV((data, indices, np.array([1, 2, 3])), shape=(2, 3), device=cpu_device)
    with pytest.raises(ValueError, match="nnz=3"):
        psc.SpMV((data, indices, np.array([0, 1, 2])), shape=(2, 3), device=cpu_device)


@pytest.mark.parametrize("parallel_min", [1, 1 << 21])
@pytest.mark.parametrize("bad", [3, 100, -1])
def test_triple_column_index_out_of_range(cpu_device, bad, parallel_min, monkeypatch):
    """Refused whether the bounds are taken in one pass or in pieces on threads."""
    from pyspmv_cl import host_arrays

    monkeypatch.setattr(host_arrays, "PARALLEL_MIN", parallel_min)
    data = np.ones(3)
    for where in range(3):   # the bad index in each piece
        indices = np.array([0, 2, 1])
        indices[where] = bad
        indptr = np.array([0, 2, 3])
        with pytest.raises(ValueError, match=r"column indices must lie in \[0, 3\)"):
            psc.SpMV((data, indices, indptr), shape=(2, 3), device=cpu_device)


def test_scipy_matrix_with_corrupt_indices(cpu_device):
    A = sp.csr_matrix(np.eye(3))
    A.indices[1] = 7  # scipy does not re-check; we must, before any kernel reads x[7]
    with pytest.raises(ValueError, match="column indices"):
        psc.SpMV(A, device=cpu_device)


def test_triple_data_indices_length_mismatch(cpu_device):
    with pytest.raises(ValueError, match=r"data \(2\) and indices \(3\)"):
        psc.SpMV((np.ones(2), np.array([0, 1, 2]), np.array([0, 2, 3])), shape=(2, 3),
                 device=cpu_device)


def test_triple_missing_shape(cpu_device):
    with pytest.raises(psc.InvalidTypeError, match="shape"):
        psc.SpMV((np.ones(3), np.array([0, 1, 2]), np.array([0, 2, 3])), device=cpu_device)


def test_triple_wrong_arity_and_kinds(cpu_device):
    with pytest.raises(psc.InvalidTypeError, match=r"\(data, indices, indptr\)"):
        psc.SpMV((np.ones(3), np.array([0, 1, 2])), shape=(2, 3), device=cpu_device)
    with pytest.raises(TypeError, match="indices must hold integers"):
        psc.SpMV((np.ones(3), np.array([0.0, 1.0, 2.0]), np.array([0, 2, 3])), shape=(2, 3),
                 device=cpu_device)
    with pytest.raises(ValueError, match="shape must be a pair of integers"):
        psc.SpMV((np.ones(3), np.array([0, 1, 2]), np.array([0, 2, 3])), shape=(2,),
                 device=cpu_device)
    with pytest.raises(ValueError, match="negative"):
        psc.SpMV((np.ones(0), np.array([], int), np.array([0])), shape=(0, -1),
                 device=cpu_device)


def test_shape_contradicts_sparse_matrix(cpu_device):
    with pytest.raises(ValueError, match="contradicts"):
        psc.SpMV(sp.csr_matrix(np.eye(3)), shape=(3, 4), device=cpu_device)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
@pytest.mark.parametrize("make", [np.eye, lambda n: np.matrix(np.eye(n)),
                                  lambda n: np.eye(n).tolist()],
                         ids=["ndarray", "np.matrix", "list"])
def test_dense_matrix_refused(cpu_device, make):
    with pytest.raises(psc.InvalidTypeError, match="scipy.sparse"):
        psc.SpMV(make(3), device=cpu_device)


def test_a_linear_operator_is_told_to_give_its_matrix(cpu_device):
    """A LinearOperator gets advice of its own (it was told to convert dense data)."""
    import scipy.sparse.linalg as spla
    L = spla.aslinearoperator(sp.eye(3, format="csr"))
    with pytest.raises(psc.InvalidTypeError, match="give the sparse matrix it wraps"):
        psc.SpMV(L, device=cpu_device)


def test_spmv_one_shot_validates_too(cpu_device):
    with pytest.raises(psc.InvalidTypeError, match="scipy.sparse"):
        psc.spmv(np.eye(3), np.ones(3), device=cpu_device)


# ------------------------------------------------------------------------- index types


def test_choose_index_dtype_forced_32_overflows():
    with pytest.raises(psc.IndexOverflowError, match="index_bits=64"):
        choose_index_dtype(2**31, 10, 5, 32)
    with pytest.raises(psc.IndexOverflowError):
        choose_index_dtype(10, 10, 2**31, 32)
    with pytest.raises(psc.IndexOverflowError):
        choose_index_dtype(10, 2**31 - 1, 5, 32)
    assert issubclass(psc.IndexOverflowError, ValueError)


def test_choose_index_dtype_auto():
    assert choose_index_dtype(10, 10, 2**31) == np.int64
    assert choose_index_dtype(10, 10, 2**31, "auto") == np.int64
    assert choose_index_dtype(2**31, 1, 1) == np.int64
    assert choose_index_dtype(10, 10, 100) == np.int32
    assert choose_index_dtype(10, 10, 100, 64) == np.int64
    assert choose_index_dtype(10, 10, 100, 32) == np.int32
    with pytest.raises(ValueError, match="index_bits"):
        choose_index_dtype(10, 10, 100, 16)


def test_index_bits_parameter(device, rng):
    A = small_matrix(rng, dtype=np.float32)
    x = rng.standard_normal(30)
    op = psc.SpMV(A, format="csr-scalar", device=device, index_bits=64)
    assert op.params["index_bits"] == 64
    assert_close(op @ x, reference(A, x), A, x, np.float32)
    with pytest.raises(ValueError, match="index_bits"):
        psc.SpMV(A, format="csr-scalar", device=device, index_bits=8)


# ------------------------------------------------------------------- builds and devices


def test_kernel_build_error_carries_log(device):
    source = "__kernel void f(){ syntax error }"
    with pytest.raises(psc.KernelBuildError) as info:
        pyspmv_cl.cache.get_program(device.context, device.cl_device, source)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.build_log.strip(), "empty build log"
    assert err.source == source
    assert "build log" in str(err)


def test_unknown_device_selection_lists_devices():
    devices = psc.devices()
    with pytest.raises(psc.DeviceNotFoundError, match="no OpenCL device matches") as info:
        psc.get_device("no-such-device-xyz")
    message = str(info.value)
    for dev in devices:
        assert dev.id in message
        assert dev.cl_device.name.strip() in message
    assert isinstance(info.value, LookupError)


@pytest.mark.parametrize("spec", ["9:9", "99", 99])
def test_device_index_out_of_range(spec):
    with pytest.raises(psc.DeviceNotFoundError, match="Available"):
        psc.get_device(spec)


def test_device_selection_of_wrong_type(rng):
    with pytest.raises(psc.InvalidTypeError, match="device must be"):
        psc.get_device(1.5)
    with pytest.raises(psc.InvalidTypeError, match="device must be"):
        psc.SpMV(small_matrix(rng), device=object())


@pytest.mark.parametrize("bad", [None, "abc", "sparse"])
def test_x_must_be_a_dense_vector(bad, cpu_device):
    A = sp.random(30, 20, density=0.2, format="csr", random_state=0)
    op = psc.SpMV(A, format="csr-scalar", device=cpu_device)
    x = sp.eye(20, format="csr") if bad == "sparse" else bad
    with pytest.raises(psc.InvalidTypeError, match="x must be a dense vector .* of 20 numbers"):
        op @ x


def test_auto_names_the_formats_a_parameter_belongs_to(cpu_device):
    A = sp.random(30, 20, density=0.2, format="csr", random_state=0)
    with pytest.raises(psc.UnknownParameterError) as info:
        psc.SpMV(A, device=cpu_device, tune=False, vector_size=8)
    text = str(info.value)
    assert "format='auto' chose" in text and "vector_size belongs to csr-vector" in text
    with pytest.raises(psc.UnknownParameterError, match="belongs to no format"):
        psc.SpMV(A, device=cpu_device, tune=False, no_such_parameter=1)


def test_loose_inputs_are_refused(cpu_device, monkeypatch):
    """A numeric string for alpha, a fractional shape, a blank device selection and a
    negative tuning-budget rate each get a clear error."""
    A = sp.random(30, 20, density=0.2, format="csr", random_state=0)
    op = psc.SpMV(A, format="csr-scalar", device=cpu_device)
    with pytest.raises(psc.InvalidTypeError,
                       match="alpha must be a real number, not the string"):
        op.matvec(np.ones(20), alpha="2")
    with pytest.raises(psc.InvalidInputError, match="pair of integers"):
        psc.SpMV((A.data, A.indices, A.indptr), shape=(29.9, 20), device=cpu_device)
    with pytest.raises(psc.DeviceNotFoundError, match="blank"):
        psc.get_device(" ")
    monkeypatch.setenv("PYSPMV_CL_TUNE_BUDGET", "-1")
    with pytest.raises(psc.InvalidParameterError, match="positive seconds"):
        psc.SpMV(A, device=cpu_device, tune=True)


def test_type_errors_are_pyspmv_errors(cpu_device):
    """Arguments of the wrong kind raise InvalidTypeError: a psc.PySpMVError (as every
    error of the package) and a TypeError (as Python raises for them), with a message
    that says what to pass."""
    assert issubclass(psc.InvalidTypeError, psc.PySpMVError)
    assert issubclass(psc.InvalidTypeError, TypeError)
    A = sp.random(30, 20, density=0.2, format="csr", random_state=0)
    op = psc.SpMV(A, format="csr-scalar", device=cpu_device)
    x_dev = cla.to_device(op.queue, np.ones(20))
    calls = [
        (lambda: psc.SpMV(np.eye(3), device=cpu_device), "scipy.sparse.csr_matrix first"),
        (lambda: psc.SpMV((A.data, A.indices, A.indptr), device=cpu_device),
         r"shape=\(rows, cols\) is required"),
        (lambda: op @ sp.csr_matrix(np.ones((20, 1))), "x must be a dense vector"),
        (lambda: op.matvec(np.ones(20), alpha="2"), "alpha must be a real number"),
        (lambda: op.matvec(x_dev, out=np.zeros(30)), "out must be a pyopencl array"),
    ]
    for call, match in calls:
        with pytest.raises(psc.InvalidTypeError, match=match):
            call()


@pytest.mark.parametrize("fmt, dtype, params", [
    ("csr-scalar", np.float32, {}), ("dia", np.float32, {}), ("auto", np.float32, {}),
    ("sell", np.float32, {"value_bits": 16}), ("csr-vector", np.complex64, {})])
def test_values_past_the_operators_type_are_refused(cpu_device, rng, fmt, dtype, params):
    """float64 values that the operator's float32 (complex64: either part) would hold as
    inf are refused before anything is converted, naming the largest, not stored as inf
    behind a numpy warning; Inf and NaN given, and values up to float32's largest, are
    taken."""
    A = sp.csr_matrix(sp.diags(rng.standard_normal(20)))
    A.data[3] = 1e39 if np.dtype(dtype).kind == "f" else 0
    if np.dtype(dtype).kind == "c":
        A = A.astype(np.complex128)
        A.data[3] = 1 - 2e39j
    with pytest.raises(psc.InvalidInputError, match=r"1 finite value.*overflow .*2?e\+39"):
        psc.SpMV(A, format=fmt, dtype=dtype, device=cpu_device, **params)
    A.data[3] = np.inf
    A.data[4] = np.nan
    A.data[5] = -3.4e38
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=cpu_device)
    x = np.zeros(20)
    x[3:6] = 1
    out = poisoned(20, dtype)
    op.matvec(x, out=out)
    expected = A.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64) @ x
    assert np.array_equal(np.isnan(out), np.isnan(expected))
    assert out[5] == np.dtype(dtype).type(-3.4e38)
    assert np.isinf(out[3]) or np.dtype(dtype).kind == "c"   # (complex: inf * 0 parts)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_values_past_the_operators_type_on_the_device_are_refused(cpu_device, rng, dtype):
    """The same refusal for a CSR given as pyopencl arrays (counted on the device): the
    finite float64 values that round to inf in float32, each part of a complex one,
    ties at the edge included; Inf, NaN and -3.4e38 are taken."""
    q = cpu_device.queue
    real = np.dtype(dtype).kind == "f"
    A = sp.random(40, 30, density=0.3, format="csr", dtype=np.float64,
                  random_state=int(rng.integers(1 << 30)))
    if not real:
        A = A.astype(np.complex128)
    edge = float(np.finfo(np.float32).max)
    half_ulp = (edge - float(np.nextafter(np.float32(edge), np.float32(0)))) / 2
    over = [1e300, -edge - half_ulp, edge + 2 * half_ulp]   # the tie rounds to inf
    kept = [np.inf, np.nan, -3.4e38, edge + half_ulp / 2]    # the last rounds to edge
    with np.errstate(over="ignore"):
        assert all(np.isinf(np.float32(v)) for v in over[1:])
        assert np.float32(kept[3]) == np.float32(edge)
    slots = rng.choice(A.nnz, len(over) + len(kept), replace=False)
    for slot, value in zip(slots, over + kept):
        A.data[slot] = value if real else complex(1, value) if slot % 2 else complex(value, 1)

    def device_triple(M):
        return tuple(cla.to_device(q, a) for a in (M.data, M.indices, M.indptr))

    with pytest.raises(psc.InvalidInputError,
                       match=rf"^{len(over)} finite value.*overflow {np.dtype(dtype)}.*1e\+300"):
        psc.SpMV(device_triple(A), shape=A.shape, dtype=dtype, device=cpu_device)
    with pytest.raises(psc.InvalidInputError, match=rf"^{len(over)} finite value"):
        psc.SpMV(A, dtype=dtype, device=cpu_device)   # the host check agrees
    for slot in slots[:len(over)]:
        A.data[slot] = 2.5
    op = psc.SpMV(device_triple(A), shape=A.shape, dtype=dtype, device=cpu_device)
    x = rng.standard_normal(30)
    out = poisoned(40, dtype)
    op.matvec(x, out=out)
    wide = np.complex128 if not real else np.float64
    expected = A.astype(wide) @ x
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.array_equal(np.isnan(out), np.isnan(expected.astype(dtype)))
    plain = np.abs(expected) < 1e30   # rows without the huge, Inf or NaN values
    assert plain.sum() > 10
    np.testing.assert_allclose(out[plain], expected[plain], rtol=1e-4, atol=1e-4)


def test_copying_or_pickling_an_operator_is_refused(cpu_device, rng):
    """copy.copy shared the operator's buffers (an update_values through the copy
    changed the original); deepcopy and pickle failed on the device object.  All are
    refused with the way to build another, and the original still works."""
    import copy
    import pickle

    A = sp.random(30, 20, density=0.3, format="csr", random_state=int(rng.integers(1 << 30)))
    op = psc.SpMV(A, format="sell", device=cpu_device)
    for call in (lambda: copy.copy(op), lambda: copy.deepcopy(op),
                 lambda: pickle.dumps(op), lambda: pickle.dumps(op.T)):
        with pytest.raises(psc.InvalidTypeError, match="cannot be copied or pickled.*SpMV"):
            call()
    x = rng.standard_normal(20)
    assert_close(op @ x, reference(A, x), A, x, np.float64)
    same = psc.SpMV(A, format=op.format, device=cpu_device, **op.params)
    assert_close(same @ x, reference(A, x), A, x, np.float64)


def test_pickling_the_linear_operator_is_refused(cpu_device, rng):
    """pickle.dumps(op.aslinearoperator()) failed on its class (local to a function)
    with "Can't pickle local object"; now the operator's reason.  copy.copy gives
    another wrapper of the same operator, which works."""
    import copy
    import pickle

    A = sp.random(30, 20, density=0.3, format="csr", random_state=int(rng.integers(1 << 30)))
    L = psc.SpMV(A, format="sell", device=cpu_device).aslinearoperator()
    for call in (lambda: pickle.dumps(L), lambda: copy.deepcopy(L), lambda: pickle.dumps(L.H)):
        with pytest.raises(psc.InvalidTypeError, match="LinearOperator cannot be pickled"):
            call()
    x = rng.standard_normal(20)
    assert_close(copy.copy(L).matvec(x), reference(A, x), A, x, np.float64)


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell"])
def test_memmap_out_is_written(fmt, cpu_device, rng, tmp_path):
    """A writeable np.memmap as out= (numpy's own out= takes one) was refused as "not
    writeable"; it is written like any array.  A masked array is refused (its mask
    would be ignored), and says so."""
    A = sp.random(40, 30, density=0.2, format="csr", random_state=int(rng.integers(1 << 30)))
    op = psc.SpMV(A, format=fmt, device=cpu_device)
    x = rng.standard_normal(30)
    out = np.memmap(tmp_path / "out.dat", dtype=np.float64, mode="w+", shape=(40,))
    out[:] = np.nan
    assert op.matvec(x, out=out) is out
    assert_close(np.asarray(out), reference(A, x), A, x, np.float64)
    y0 = rng.standard_normal(40)
    out[:] = y0
    op.matvec(x, out=out, alpha=2.0, beta=-1.0)
    assert_close(np.asarray(out), 2.0 * reference(A, x) - y0, A, x, np.float64)
    masked = np.ma.masked_array(np.zeros(40), mask=np.zeros(40, bool))
    with pytest.raises(psc.InvalidInputError, match="masked array"):
        op.matvec(x, out=masked)


@pytest.mark.parametrize("fmt", psc.formats())
def test_params_build_the_same_operator(fmt, cpu_device, rng):
    """README: SpMV(A, format=op.format, **op.params) builds the same operator.  hyb
    reported ell_nnz and coo_nnz in params and refused them back ("takes no
    parameter(s)"); they are accepted and ignored now.  A matrix with a few long rows,
    so that hyb has both parts."""
    lengths = np.where(np.arange(300) % 37 == 0, 40, 3)
    rows = np.repeat(np.arange(300), lengths)
    cols = rng.integers(0, 300, rows.size)
    A = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(300, 300))
    try:   # (hyb's rule puts 300 rows in COO alone: K given)
        op = psc.SpMV(A, format=fmt, device=cpu_device,
                      **({"ell_width": 3} if fmt == "hyb" else {}))
    except psc.FormatNotSuitableError:
        pytest.skip(f"{fmt} refuses this matrix")
    again = psc.SpMV(A, format=op.format, device=cpu_device, **op.params)
    assert again.params == op.params
    if fmt == "hyb":
        assert op.params["ell_nnz"] > 0 and op.params["coo_nnz"] > 0
    x = rng.standard_normal(300)
    assert_close(again @ x, reference(A, x), A, x, np.float64)
