"""The grid of transposed products (issue #16): every format x float32, float64,
complex64, complex128 x every transposed product -- ``op.rmatvec``, ``op.T.matvec``
(``op.T @ x``, ``x @ op``), ``op.H.matvec`` (A^H for complex values, A^T for real),
``op.rmatmat``, ``op.T.matmat``, ``op.H.matmat`` -- with alpha/beta (complex for
complex values), ``out=`` poisoned with NaN, host blocks in C and F order, pyopencl
arrays (C order), and k = 1, 3, 33, 64 (block widths 1, 2 and 16, or 8 for complex
values), against scipy in float64/complex128 with fresh random data.

One operator per (format, dtype) runs every product: compiling dominates on PoCL.  The
default run takes a slice (QUICK); the rest of the grid is ``exhaustive``.  Like the
per-format sweeps (tests/test_format_*.py), it runs on the first device of each type
only (conftest.SWEEP_DEVICES).  tests/test_adjoint.py covers the transposed copy itself
(shapes, memory, update_values, the format it takes) on edge-case matrices."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import (
    DEVICE_IDS,
    DEVICES,
    SWEEP_DEVICES,
    assert_cclose,
    assert_close,
    poisoned,
    reference,
    skip_without_fp64,
)

import pyspmv_cl as psc

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
KS = (1, 3, 33, 64)
# The default run's slice: every dtype once, formats with and without block kernels.
QUICK = {("csr-scalar", np.complex64), ("sell", np.float32), ("coo", np.complex128),
         ("dia", np.float64)}

GRID = [pytest.param(fmt, dtype, id=f"{fmt}-{np.dtype(dtype).name}",
                     marks=() if (fmt, dtype) in QUICK else pytest.mark.exhaustive)
        for fmt in psc.formats() for dtype in DTYPES]
GRID_DEVICES = [pytest.param(d, id=DEVICE_IDS[DEVICES.index(d)]) for d in SWEEP_DEVICES] \
    or [pytest.param(None, id="no-device")]


def test_the_quick_slice_is_in_the_grid():
    assert len(GRID) == 4 * len(psc.formats()) == 44
    assert QUICK <= {(fmt, dtype) for fmt in psc.formats() for dtype in DTYPES}


def draw(rng, shape, dtype):
    """Standard normal values in ``dtype`` (complex: both parts)."""
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def grid_matrix(rng, dtype):
    """A 97 x 71 matrix every format takes, and its transpose too (dia: few diagonals;
    ell: little padding): five diagonals, a few random entries, one long row and one
    long column (hyb's COO part, in A and in A^T), rows and columns left empty (their
    entries of the result are written from nothing: poisoned outputs catch a miss)."""
    m, n = 97, 71
    complex_values = np.dtype(dtype).kind == "c"
    offsets = [-3, -1, 0, 2, 7]
    A = sp.diags([draw(rng, min(m, n), np.complex128 if complex_values else np.float64)
                  for _ in offsets], offsets, shape=(m, n), format="lil")
    for i, j in zip(rng.integers(0, m, 25), rng.integers(0, n, 25)):
        A[i, j] = draw(rng, (), np.complex128 if complex_values else np.float64)
    A[5, ::2] = draw(rng, (n + 1) // 2, np.complex128 if complex_values else np.float64)
    A[::3, 40] = draw(rng, (m + 2) // 3, np.complex128 if complex_values else np.float64)
    A[::11, :] = 0
    A[:, ::13] = 0
    A = sp.csr_matrix(A)
    A.eliminate_zeros()
    return A


def check(y, B, x, dtype, alpha=1.0, beta=0.0, y0=None):
    """y == alpha * B @ x + beta * y0 against scipy in float64/complex128 (conftest's
    bounds: proportional to |B| |x|, NaN only where scipy has one)."""
    x = x.get() if isinstance(x, cla.Array) else x
    if np.dtype(dtype).kind == "c":
        B = sp.csr_matrix(B, dtype=np.complex128)
        x = np.asarray(x, dtype=np.complex128)
        ref = alpha * (B @ x)
        if beta != 0:
            ref = ref + beta * np.asarray(y0, dtype=np.complex128)
        assert_cclose(y, ref, B, x, dtype, y0, beta)
    else:
        assert_close(y, reference(B, x, alpha, beta, y0), B, x, dtype)


def scalars(rng, dtype):
    if np.dtype(dtype).kind == "c":
        return complex(*rng.uniform(-2, 2, 2)), complex(*rng.uniform(-2, 2, 2))
    return float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))


def products(op, A):
    """(name, vector product, block product, the matrix each computes)."""
    AT = sp.csr_matrix(A.T)
    AH = sp.csr_matrix(A.conj().T)   # A^T for real values
    return [("rmatvec", op.rmatvec, op.rmatmat, AH),
            ("T", op.T.matvec, op.T.matmat, AT),
            ("H", op.H.matvec, op.H.matmat, AH)]


def check_vectors(op, A, dtype, rng):
    m, n = A.shape
    q = op.queue
    for name, matvec, _, B in products(op, A):
        alpha, beta = scalars(rng, dtype)
        x, y0 = draw(rng, m, dtype), draw(rng, n, dtype)
        out = poisoned(n, dtype)   # beta == 0 never reads it
        assert matvec(x, out=out, alpha=alpha) is out, name
        check(out, B, x, dtype, alpha)
        out = y0.copy()
        assert matvec(x, out=out, alpha=alpha, beta=beta) is out, name
        check(out, B, x, dtype, alpha, beta, y0)
        x_d = cla.to_device(q, x)
        out_d = cla.to_device(q, poisoned(n, dtype))
        assert matvec(x_d, out=out_d, alpha=alpha) is out_d, name
        check(out_d.get(), B, x, dtype, alpha)
        out_d = cla.to_device(q, y0)
        matvec(x_d, out=out_d, alpha=alpha, beta=beta)
        check(out_d.get(), B, x, dtype, alpha, beta, y0)
        np.testing.assert_array_equal(x_d.get(), x, err_msg=f"{name} changed x")
        # Allocated results: numpy's promotion (a float64/complex128 x), device arrays
        # in op.dtype.
        wide = draw(rng, m, np.complex128 if np.dtype(dtype).kind == "c" else np.float64)
        y = matvec(wide)
        assert y.shape == (n,) and y.dtype == np.result_type(dtype, wide.dtype), name
        check(y, B, wide, dtype)
        y_d = matvec(x_d)
        assert isinstance(y_d, cla.Array) and y_d.dtype == dtype, name
        check(y_d.get(), B, x, dtype)
    AT = sp.csr_matrix(A.T)
    u = draw(rng, m, dtype)
    check(op.T @ u, AT, u, dtype)
    check(u @ op, AT, u, dtype)
    check(op.H @ u, sp.csr_matrix(A.conj().T), u, dtype)


def check_blocks(op, A, dtype, rng):
    m, n = A.shape
    q = op.queue
    for i, k in enumerate(KS):
        # Output orders alternate with k: each product sees C and F outs, each X order.
        order, other = ("F", "C") if i % 2 == 0 else ("C", "F")
        for name, _, matmat, B in products(op, A):
            alpha, beta = scalars(rng, dtype)
            X, Y0 = draw(rng, (m, k), dtype), draw(rng, (n, k), dtype)
            out = np.asarray(poisoned((n, k), dtype), order=order)
            assert matmat(X, out=out, alpha=alpha) is out, (name, k)
            check(out, B, X, dtype, alpha)
            out = np.array(Y0, order=other)
            assert matmat(np.asfortranarray(X), out=out, alpha=alpha, beta=beta) is out
            check(out, B, X, dtype, alpha, beta, Y0)
            X_d = cla.to_device(q, X)
            out_d = cla.to_device(q, poisoned((n, k), dtype))
            assert matmat(X_d, out=out_d, alpha=alpha) is out_d, (name, k)
            check(out_d.get(), B, X, dtype, alpha)
            out_d = cla.to_device(q, Y0)
            matmat(X_d, out=out_d, alpha=alpha, beta=beta)
            check(out_d.get(), B, X, dtype, alpha, beta, Y0)
            np.testing.assert_array_equal(X_d.get(), X, err_msg=f"{name} changed X")
            if k == 3:   # allocated: host F order, device
                Y = matmat(np.asfortranarray(X))
                assert Y.shape == (n, k) and Y.dtype == dtype
                check(Y, B, X, dtype)
                Y_d = matmat(X_d)
                assert isinstance(Y_d, cla.Array) and Y_d.shape == (n, k)
                check(Y_d.get(), B, X, dtype)


@pytest.mark.parametrize("device", GRID_DEVICES, indirect=True)
@pytest.mark.parametrize("fmt, dtype", GRID)
def test_transposed_products(fmt, dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = grid_matrix(rng, dtype)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device)
    assert op.H is op.T if np.dtype(dtype).kind == "f" else op.H is not op.T
    copy = op.build_transposed()
    # The format under test runs the transposed products: it takes A^T as well.
    assert copy.format == fmt and copy.shape == A.shape[::-1], copy.explanation
    check_vectors(op, A, dtype, rng)
    check_blocks(op, A, dtype, rng)
    x = draw(rng, A.shape[1], dtype)   # A itself, after all that
    check(op @ x, A, x, dtype)
