"""Complex values (complex64, complex128): every format that takes them against scipy
in complex128 with fresh random data, alpha/beta complex, host and device arrays,
poisoned outputs, edge cases, op.T/op.H/rmatvec, scipy's solvers on the linear
operator, update_values; the refusal of the formats that do not take them; numpy's
promotion for a real operator with complex operands."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
from conftest import assert_cclose, skip_without_fp64
from matrix_cases import CASES

import pyspmv_cl as psc
from pyspmv_cl.formats import FORMATS

COMPLEX_FORMATS = [name for name, cls in FORMATS.items() if cls.complex_values]
REAL_ONLY = [name for name, cls in FORMATS.items() if not cls.complex_values]
CDTYPES = [np.complex64, np.complex128]
NAN = complex(np.nan, np.nan)


def crandom(rng, m, n, density):
    A = sp.random(m, n, density=density, format="csr", random_state=rng)
    A.data = rng.standard_normal(A.nnz) + 1j * rng.standard_normal(A.nnz)
    return A


def cvector(rng, n):
    return rng.standard_normal(n) + 1j * rng.standard_normal(n)


def operator(A, fmt, dtype, device, **kw):
    try:
        return psc.SpMV(A, format=fmt, dtype=dtype, device=device, **kw)
    except psc.FormatNotSuitableError:
        assert FORMATS[fmt].may_refuse
        return None


@pytest.mark.parametrize("dtype", CDTYPES, ids=["c64", "c128"])
@pytest.mark.parametrize("fmt", COMPLEX_FORMATS)
def test_format_against_scipy(device, fmt, dtype, rng):
    skip_without_fp64(device, dtype)
    m, n = 157, 131
    # A banded matrix, so that dia and ell do not refuse it for padding.
    A = sp.diags([cvector(rng, m) for _ in range(5)], [-3, -1, 0, 2, 7],
                 shape=(m, n), format="csr")
    A = (A + crandom(rng, m, n, 0.01)).tocsr()
    op = operator(A, fmt, dtype, device)
    assert op is not None and op.dtype == dtype and op.is_complex
    x, y0 = cvector(rng, n), cvector(rng, m)
    alpha, beta = complex(rng.standard_normal(), rng.standard_normal()), 0.5 - 2j
    y = op @ x
    assert y.dtype == np.complex128   # numpy's promotion with a complex128 x
    assert_cclose(y, A @ x, A, x, dtype)
    out = np.full(m, NAN, dtype=dtype)   # poisoned: beta == 0 never reads it
    op.matvec(x, out=out, alpha=alpha)
    assert_cclose(out, alpha * (A @ x), A, x, dtype)
    out = y0.astype(dtype)
    op.matvec(x, out=out, alpha=alpha, beta=beta)
    assert_cclose(out, alpha * (A @ x) + beta * y0.astype(dtype), A, x, dtype, y0, beta)
    # Device arrays, the operator's dtype and a real x (promoted on the device).
    xd = cla.to_device(op.queue, x.astype(dtype))
    od = cla.to_device(op.queue, np.full(m, NAN, dtype=dtype))
    op.matvec(xd, out=od, alpha=alpha)
    assert_cclose(od.get(), alpha * (A @ x.astype(dtype)), A, x, dtype)
    od = cla.to_device(op.queue, y0.astype(dtype))
    op.matvec(xd, out=od, alpha=alpha, beta=beta)
    assert_cclose(od.get(), alpha * (A @ x.astype(dtype)) + beta * y0.astype(dtype),
                  A, x, dtype, y0, beta)
    xr = rng.standard_normal(n).astype(np.float32)
    yd = op @ cla.to_device(op.queue, xr)
    assert yd.dtype == np.result_type(dtype, np.float32)
    assert_cclose(yd.get(), A @ xr, A, xr, dtype)


@pytest.mark.parametrize("fmt", COMPLEX_FORMATS)
def test_blocks(device, fmt, rng):
    """A complex block (k = 5) in every complex-capable format, host and device, complex
    alpha/beta: block kernels where the format has them (csr-scalar, csr-vector's row
    mapping, ell, sell; tests/test_spmm.py sweeps them), else the column loop."""
    dtype = np.complex64
    m, n, k = 83, 61, 5
    A = sp.diags([cvector(rng, m) for _ in range(3)], [-1, 0, 4], shape=(m, n),
                 format="csr")
    A = (A + crandom(rng, m, n, 0.03)).tocsr()
    params = {"csr-vector": {"mapping": "rows"}, "ell": {"max_padding": float("inf")},
              "ellr-t": {"max_padding": float("inf")},
              "dia": {"max_fill": float("inf"), "max_diagonals": 10**9}}.get(fmt, {})
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device, **params)
    assert op.has_block_kernels == bool(FORMATS[fmt].block_widths)
    X = cvector(rng, n * k).reshape(n, k)
    Y0 = cvector(rng, m * k).reshape(m, k).astype(dtype)
    alpha, beta = 1.5 + 0.5j, -0.25 + 1j
    assert_cclose(op @ np.asfortranarray(X), A @ X, A, X, dtype)
    Y = op.matmat(X, out=Y0.copy(), alpha=alpha, beta=beta)
    assert_cclose(Y, alpha * (A @ X) + beta * Y0, A, X, dtype, Y0, beta)
    Xd = cla.to_device(op.queue, X.astype(dtype))
    Yd = cla.to_device(op.queue, np.full((m, k), NAN, dtype=dtype))
    op.matmat(Xd, out=Yd, alpha=alpha)
    assert_cclose(Yd.get(), alpha * (A @ X), A, X, dtype)
    Yd = cla.to_device(op.queue, Y0)
    op.matmat(Xd, out=Yd, alpha=alpha, beta=beta)
    assert_cclose(Yd.get(), alpha * (A @ X) + beta * Y0, A, X, dtype, Y0, beta)


EDGE_CASES = ["0x0", "m_x_0", "0_x_n", "empty_rows", "one_long_row", "duplicates_coo",
              "unsorted_indices"]


@pytest.mark.parametrize("fmt", COMPLEX_FORMATS)
def test_edge_cases(device, fmt, rng):
    dtype = np.complex64
    for case in EDGE_CASES:
        A = sp.csr_matrix(CASES[case](rng))
        A = sp.csr_matrix((A.data * (1 + 0.5j) + 1j * rng.standard_normal(A.nnz),
                           A.indices, A.indptr), shape=A.shape)
        op = operator(A, fmt, dtype, device)
        if op is None:
            continue
        x = cvector(rng, A.shape[1])
        out = np.full(A.shape[0], NAN, dtype=dtype)
        op.matvec(x, out=out, alpha=1j)
        assert_cclose(out, 1j * (A @ x), A, x, dtype)


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell", "coo"])
def test_adjoint_and_transpose(device, fmt, rng):
    dtype = np.complex128
    skip_without_fp64(device, dtype)
    m, n = 90, 70
    A = crandom(rng, m, n, 0.08)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device)
    u, x = cvector(rng, m), cvector(rng, n)
    AH, AT = A.conj().T.tocsr(), A.T.tocsr()
    assert_cclose(op.H @ u, AH @ u, AH, u, dtype)
    assert_cclose(op.rmatvec(u), AH @ u, AH, u, dtype)
    assert_cclose(op.T @ u, AT @ u, AT, u, dtype)
    assert_cclose(u @ op, AT @ u, AT, u, dtype)
    assert op.T.T is op and op.H.H is op and op.H is not op.T
    assert_cclose(op.T.H @ x, A.conj() @ x, A, x, dtype)
    # alpha, beta, out (host, then device) on both views
    o = cvector(rng, n)
    got = op.T.matvec(u, out=o.copy(), alpha=2 - 1j, beta=1j)
    assert_cclose(got, (2 - 1j) * (AT @ u) + 1j * o, AT, u, dtype, o, 1)
    od = cla.to_device(op.queue, o)
    op.H.matvec(cla.to_device(op.queue, u), out=od, alpha=2 - 1j, beta=1j)
    assert_cclose(od.get(), (2 - 1j) * (AH @ u) + 1j * o, AH, u, dtype, o, 1)
    od = cla.to_device(op.queue, o)
    op.T.matvec(cla.to_device(op.queue, u), out=od, alpha=2 - 1j, beta=1j)
    assert_cclose(od.get(), (2 - 1j) * (AT @ u) + 1j * o, AT, u, dtype, o, 1)
    # The linear operator: rmatvec is the adjoint, as scipy expects.
    L = op.aslinearoperator()
    assert L.dtype == dtype
    assert_cclose(L.rmatvec(u), AH @ u, AH, u, dtype)
    assert_cclose(L.H.matvec(u), AH @ u, AH, u, dtype)
    assert_cclose(L.T.matvec(u), AT @ u, AT, u, dtype)
    assert_cclose(L.matmat(np.stack([x, 2 * x], 1))[:, 1], 2 * (A @ x), A, x, dtype)
    # update_values keeps A, A^H and A^T in step.
    new = cvector(rng, A.nnz)
    B = sp.csr_matrix((new, A.indices, A.indptr), shape=A.shape)
    op.update_values(new)
    assert_cclose(op @ x, B @ x, B, x, dtype)
    BH = B.conj().T.tocsr()
    assert_cclose(op.H @ u, BH @ u, BH, u, dtype)
    assert_cclose(op.T @ u, B.T @ u, B.T.tocsr(), u, dtype)


# The default run takes two (format, dtype) pairs, the exhaustive one the rest.
SOLVER_CASES = [pytest.param(fmt, dtype, id=f"{fmt}-{np.dtype(dtype).name}",
                             marks=() if (fmt, dtype) in {("sell", np.complex128),
                                                          ("csr-vector", np.complex64)}
                             else pytest.mark.exhaustive)
                for fmt in ("sell", "csr-vector", "coo", "csr5") for dtype in CDTYPES]


@pytest.mark.parametrize("fmt, dtype", SOLVER_CASES)
def test_solvers(device, fmt, dtype, rng):
    """scipy's solvers on the complex linear operator: gmres, bicgstab, bicg, lsqr, lsmr
    (non-Hermitian), cg, eigsh and lobpcg with a block of 4 (Hermitian positive
    definite); complex64 computes in single precision: looser stops and checks."""
    skip_without_fp64(device, dtype)
    single = dtype == np.complex64
    stop, ok = (1e-5, 1e-4) if single else (1e-10, 1e-8)
    n = 80
    R = crandom(rng, n, n, 0.05)
    A = (R + sp.eye(n) * 6).tocsr()              # diagonally dominant, non-Hermitian
    b = cvector(rng, n)
    L = psc.SpMV(A, format=fmt, dtype=dtype, device=device).aslinearoperator()
    assert L.dtype == dtype
    for solver in (sla.gmres, sla.bicgstab, sla.bicg):
        x, info = solver(L, b, rtol=stop, atol=0)
        assert info == 0 and np.linalg.norm(A @ x - b) < ok * np.linalg.norm(b), solver
    lstol = 1e-6 if single else 1e-12
    for solver in (sla.lsqr, sla.lsmr):
        x = solver(L, b, atol=lstol, btol=lstol)[0]
        assert np.linalg.norm(A @ x - b) < ok * np.linalg.norm(b), solver
    H = (R @ R.conj().T + sp.eye(n)).tocsr()     # Hermitian positive definite
    LH = psc.SpMV(H, format=fmt, dtype=dtype, device=device).aslinearoperator()
    x, info = sla.cg(LH, b, rtol=stop, atol=0)
    assert info == 0 and np.linalg.norm(H @ x - b) < ok * np.linalg.norm(b)
    exact = np.linalg.eigvalsh(H.toarray())      # its largest eigenvalues lie apart
    rtol = 1e-4 if single else 1e-9
    values = sla.eigsh(LH, k=3, which="LA", v0=cvector(rng, n).astype(dtype),
                       tol=rtol / 10, return_eigenvectors=False)
    np.testing.assert_allclose(np.sort(values.real), exact[-3:], rtol=rtol)
    # lobpcg computes in X's precision; in complex64 its own orthogonalisation loses
    # the block now and then (with scipy's complex64 matrix as well), so X is
    # complex128 and the products alone are complex64 (numpy's promotion).
    X = cvector(rng, 4 * n).reshape(n, 4)
    tol = 1e-3 if single else 1e-6   # lobpcg's bound on each residual's norm
    values, vectors = sla.lobpcg(LH, X, largest=True, tol=tol, maxiter=500)
    np.testing.assert_allclose(np.sort(values), exact[-4:], rtol=rtol)
    assert np.linalg.norm(H @ vectors - vectors * values, axis=0).max() <= 2 * tol


def test_every_format_takes_complex_values():
    assert not REAL_ONLY and set(COMPLEX_FORMATS) == set(FORMATS)


def test_refusal_of_a_real_only_format():
    """A format without complex kernels (none of the built-in ones now) is refused with
    the list of those that take complex values."""
    from pyspmv_cl.formats.base import check_complex_capable

    class RealOnly:
        name = "real-only"
        complex_values = False

    with pytest.raises(psc.UnsupportedDtypeError) as exc:
        check_complex_capable(RealOnly, np.complex64)
    assert "real-only" in str(exc.value)
    for name in COMPLEX_FORMATS:
        assert name in str(exc.value)
    check_complex_capable(RealOnly, np.float32)   # real values: fine


def test_auto_chooses_a_complex_format(device, rng):
    A = crandom(rng, 200, 200, 0.05)
    op = psc.SpMV(A, device=device, dtype=np.complex64, tune=False)
    assert op.format in COMPLEX_FORMATS
    x = cvector(rng, 200)
    assert_cclose(op @ x, A @ x, A, x, np.complex64)


def test_dtype_rules(device, rng):
    A = crandom(rng, 30, 20, 0.2)
    with pytest.raises(psc.UnsupportedDtypeError, match="imaginary"):
        psc.SpMV(A, format="csr-scalar", dtype=np.float32, device=device)
    op = psc.SpMV(A, format="csr-scalar", dtype=np.complex64, device=device)
    with pytest.raises(psc.UnsupportedDtypeError, match="complex out"):
        op.matvec(cvector(rng, 20), out=np.zeros(30))
    with pytest.raises(psc.UnsupportedDtypeError):
        op @ cla.zeros(op.queue, 20, np.int32)
    with pytest.raises(psc.UnsupportedDtypeError):
        op.update_values(np.zeros(A.nnz, dtype="U1"))


def test_real_operator_with_complex_operands(device, rng):
    """numpy's promotion: two real products (real and imaginary parts) on the host;
    device arrays are refused with a message telling what to do."""
    A = sp.random(40, 30, density=0.2, format="csr", random_state=rng)
    op = psc.SpMV(A, format="csr-scalar", dtype=np.float32, device=device)
    x = cvector(rng, 30)
    y = op @ x
    assert y.dtype == np.complex128
    assert_cclose(y, A @ x, A, x, np.complex64)
    y = op @ x.astype(np.complex64)
    assert y.dtype == np.complex64
    xr = rng.standard_normal(30)
    y = op.matvec(xr, alpha=1j)
    assert y.dtype == np.complex128   # float32 op, float64 x, complex alpha
    assert_cclose(y, 1j * (A @ xr), A, xr, np.complex64)
    out = cvector(rng, 40)
    expect = 2 * (A @ x) + (1 - 1j) * out
    op.matvec(x, out=out, alpha=2, beta=1 - 1j)
    assert_cclose(out, expect, A, x, np.complex64)
    with pytest.raises(psc.UnsupportedDtypeError, match="complex64"):
        op @ cla.to_device(op.queue, x.astype(np.complex64))
    with pytest.raises(psc.UnsupportedDtypeError, match="complex"):
        op.update_values(np.ones(A.nnz, dtype=np.complex64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fmt", ["csr-scalar", "sell", "coo", "hyb", "dia"])
def test_real_operator_with_complex_blocks_and_transposed_products(device, fmt, dtype, rng):
    """numpy's promotion for blocks and transposed products too: a real operator times
    a complex host block (C and F order, views), op.rmatvec/op.T/op.H/rmatmat with a
    complex x (A^T x: A is real), complex alpha/beta into a complex out (poisoned for
    beta == 0), against scipy in complex128."""
    skip_without_fp64(device, dtype)
    m, n, k = 67, 45, 5
    A = sp.diags([rng.standard_normal(min(m, n)) for _ in range(3)], [-2, 0, 3],
                 shape=(m, n), format="csr")
    A = (A + sp.random(m, n, density=0.02, format="csr", random_state=rng)).tocsr()
    AT = A.T.tocsr()
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device)
    cdtype = np.result_type(dtype, np.complex64)
    alpha, beta = 1.5 - 0.5j, -0.25 + 1j
    wide = cvector(rng, n * 2 * k).reshape(n, 2 * k)
    for X in (wide[:, :k], np.asfortranarray(wide[:, :k]), wide[:, ::2]):   # C, F, view
        Y = op @ X
        assert Y.shape == (m, k) and Y.dtype == np.complex128
        assert_cclose(Y, A @ X, A, X, cdtype)
        X = X.astype(np.complex64)
        assert (op @ X).dtype == cdtype
        out = np.full((m, k), NAN, dtype=cdtype, order="F")
        assert op.matmat(X, out=out, alpha=alpha) is out
        assert_cclose(out, alpha * (A @ X), A, X, cdtype)
        Y0 = cvector(rng, m * k).reshape(m, k).astype(cdtype)
        out = Y0.copy()
        op.matmat(X, out=out, alpha=2.0, beta=beta)
        assert_cclose(out, 2 * (A @ X) + beta * Y0, A, X, cdtype, Y0, beta)
    # Transposed: A^T x for a complex x (the operator is real, so A^H = A^T).
    u = cvector(rng, m)
    for y in (op.rmatvec(u), op.T @ u, op.H @ u, u @ op, op.T.matvec(u)):
        assert y.shape == (n,) and y.dtype == np.complex128
        assert_cclose(y, AT @ u, AT, u, cdtype)
    out = np.full(n, NAN, dtype=cdtype)
    assert op.rmatvec(u.astype(cdtype), out=out, alpha=alpha) is out
    assert_cclose(out, alpha * (AT @ u.astype(cdtype)), AT, u, cdtype)
    y0 = cvector(rng, n).astype(cdtype)
    out = y0.copy()
    op.T.matvec(u, out=out, alpha=alpha, beta=beta)
    assert_cclose(out, alpha * (AT @ u) + beta * y0, AT, u, cdtype, y0, beta)
    U = cvector(rng, m * k).reshape(m, k)
    for Y in (op.rmatmat(U), op.T.matmat(np.asfortranarray(U)), op.H @ U, (U.T @ op).T):
        assert Y.shape == (n, k) and Y.dtype == np.complex128
        assert_cclose(Y, AT @ U, AT, U, cdtype)
    Y0 = cvector(rng, n * k).reshape(n, k).astype(cdtype)
    out = Y0.copy()
    op.rmatmat(U, out=out, alpha=alpha, beta=beta)
    assert_cclose(out, alpha * (AT @ U) + beta * Y0, AT, U, cdtype, Y0, beta)
    # Device arrays stay refused (a complex one for a real operator), transposed alike.
    with pytest.raises(psc.UnsupportedDtypeError, match="complex"):
        op.rmatvec(cla.to_device(op.queue, u.astype(np.complex64)))
    with pytest.raises(psc.UnsupportedDtypeError, match="complex"):
        op.matmat(cla.to_device(op.queue, np.ascontiguousarray(wide[:, :k]).astype(np.complex64)))
