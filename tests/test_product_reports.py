"""Regressions from a user's test drive of the products (#16): complex A^T on an
out-of-order queue, a refused call leaving ``out`` as given, complex Inf kept by
alpha = 1, unsigned 64-bit row pointers, numpy's type rule for a complex alpha, and
``X @ op`` with a 2-D device block.  Every result against scipy in float64."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_cclose, assert_close, poisoned, reference, skip_without_fp64

import pyspmv_cl as psc
from pyspmv_cl.formats import FORMATS


def _complex_matrix(rng, m, n, dtype, density=0.02):
    A = sp.random(m, n, density=density, format="csr", random_state=rng)
    A = A.astype(dtype)
    A.data = A.data + 1j * rng.standard_normal(A.nnz).astype(A.data.real.dtype)
    return A


def _out_of_order_queue(device):
    try:
        return cl.CommandQueue(device.context, device.cl_device,
                               properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    except cl.Error:
        pytest.skip("no out-of-order queues")


@pytest.mark.parametrize("k", [1, 6])
def test_complex_transpose_on_an_out_of_order_queue(device, k, rng):
    """op.T (conj(A^H conj(x))) with device arrays: the conjugations wait for the
    products they read, and the copy into out for the conjugation (pyopencl's own
    conj and copy wait for nothing).  Several products in a row, beta = 0 and 1, on a
    matrix whose product outlasts the conjugation of its result by far."""
    queue = _out_of_order_queue(device)
    A = _complex_matrix(rng, 4000, 3000, np.complex64, density=0.01)
    op = psc.SpMV(A, format="csr-scalar", device=queue)
    op.build_transposed()
    shape, out_shape = ((4000, k), (3000, k)) if k > 1 else ((4000,), (3000,))
    for beta in (0.0, 1.0):
        for _ in range(5):
            U = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
            Y0 = (rng.standard_normal(out_shape) + 1j).astype(np.complex64)
            Z = cla.to_device(queue, Y0 if beta else poisoned(Y0.shape, np.complex64))
            op.T.matvec(cla.to_device(queue, U), out=Z, alpha=1.0, beta=beta)
            ref = A.T.astype(np.complex128) @ U.astype(np.complex128) + beta * Y0
            assert_cclose(Z.get(), ref, A.T, U, np.complex64, y0=Y0, beta=beta)


def test_a_refused_conjugated_product_leaves_out_as_given():
    """op.T of a complex operator conjugates a host out around the product: when the
    product refuses its arguments, out is handed back unchanged."""
    A = _complex_matrix(np.random.default_rng(0), 5, 4, np.complex128)
    op = psc.SpMV(A)
    out = np.array([1 + 2j, 3 + 4j, 5 + 6j, 7 + 8j])
    given = out.copy()
    for bad_x in (np.ones(4), "x", None):   # A^T takes 5 entries
        with pytest.raises(psc.PySpMVError):
            op.T.matvec(bad_x, out=out, beta=1.0)
        np.testing.assert_array_equal(out, given)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_complex_inf_is_kept_by_alpha_one(device, fmt):
    """A complex sum of Inf + 0j times the default alpha (1) stays Inf + 0j, as in
    scipy: the kernels skip the multiplication by 1 (a complex product with 1 + 0j
    would make 0 * Inf = NaN in the imaginary part)."""
    A = sp.csr_matrix(np.array([[3e38, 3e38], [1.0, 0.0]], np.complex64))
    try:
        op = psc.SpMV(A, format=fmt, device=device)
    except psc.FormatNotSuitableError:   # (a format that may refuse a matrix for padding)
        pytest.skip(f"{fmt} refuses this matrix")
    y = op.matvec(np.ones(2, np.complex64), out=poisoned(2, np.complex64))
    ref = A.astype(np.complex128) @ np.ones(2)
    with np.errstate(over="ignore"):   # (6e38 is inf in float32, as it should be)
        np.testing.assert_array_equal(y.real, ref.real.astype(np.float32))
        np.testing.assert_array_equal(y.imag, ref.imag.astype(np.float32))


def test_real_operator_complex_x_keeps_inf(rng):
    """A real operator with a complex host x (two real products): alpha = 1 is not
    multiplied in, so an Inf stays Inf + 0j."""
    A = sp.csr_matrix(np.array([[3e38, 3e38]], np.float32))
    y = psc.SpMV(A) @ np.ones(2, np.complex64)
    assert y[0] == complex(np.inf, 0)


def test_unsigned_64_bit_row_pointers(device, rng):
    """A host triple whose indptr is uint64 (or indices uint64) multiplies right."""
    A = sp.random(60, 50, density=0.1, format="csr", random_state=rng)
    x = rng.standard_normal(50)
    for indices, indptr in ((A.indices, A.indptr.astype(np.uint64)),
                            (A.indices.astype(np.uint64), A.indptr.astype(np.uint64))):
        op = psc.SpMV((A.data, indices, indptr), shape=A.shape, device=device)
        assert_close(op.matvec(x, out=poisoned(60, op.dtype)), reference(A, x), A, x, op.dtype)


def test_a_complex_alpha_gives_a_complex_result(device, rng):
    """numpy's rule goes by type: alpha = 1 + 0j with a real operator and real x
    gives the complex type numpy gives (values as with alpha = 1)."""
    skip_without_fp64(device, np.float64)
    A = sp.random(40, 30, density=0.2, format="csr", random_state=rng)
    x = rng.standard_normal(30)
    op = psc.SpMV(A, device=device)
    y = op.matvec(x, alpha=1 + 0j)
    assert y.dtype == np.result_type(op.dtype, x.dtype, np.complex128)
    assert_close(y.real, reference(A, x), A, x, op.dtype)
    assert not y.imag.any()
    y = op.matvec(x, alpha=np.complex64(2))
    assert y.dtype.kind == "c"
    assert_close(y.real, reference(A, x, 2.0), A, x, op.dtype)
    # README: alpha and beta decide only whether the result is complex, counted as
    # Python scalars even when numpy's (numpy 2 would widen these two)
    op32 = psc.SpMV(A, device=device, dtype=np.float32)
    x32 = x.astype(np.float32)
    assert op32.matvec(x32, alpha=np.float64(2)).dtype == np.float32
    assert op32.matvec(x32, alpha=np.complex128(2j)).dtype == np.complex64


def test_a_device_block_on_the_left(device, rng):
    """X @ op for a 2-D C-contiguous device X (k x m) gives X @ A (a device array)."""
    A = sp.random(70, 50, density=0.1, format="csr", random_state=rng)
    op = psc.SpMV(A, device=device, dtype=np.float32)
    X = rng.standard_normal((3, 70)).astype(np.float32)
    Y = cla.to_device(op.queue, X) @ op
    assert isinstance(Y, cla.Array) and Y.shape == (3, 50)
    assert Y.flags.c_contiguous   # row-major, as block products take it (F-order before)
    ref = (A.T.astype(np.float64) @ X.T.astype(np.float64)).T
    assert_close(Y.get().T, ref.T, A.T, X.T, np.float32)


def test_rmatmat_errors_are_labelled_rmatmat(rng):
    """A wrong block given to rmatmat is refused in rmatmat's name."""
    A = sp.random(30, 20, density=0.2, format="csr", random_state=rng)
    op = psc.SpMV(A)
    with pytest.raises(psc.InvalidInputError, match="^rmatmat: "):
        op.rmatmat(np.ones((20, 3)))   # A^H takes 30 rows
    with pytest.raises(psc.InvalidInputError, match="^rmatvec: "):
        op.rmatvec(np.ones(20))
