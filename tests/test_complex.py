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


def test_solvers(device, rng):
    dtype = np.complex128
    skip_without_fp64(device, dtype)
    n = 80
    R = crandom(rng, n, n, 0.05)
    A = (R + sp.eye(n) * 6).tocsr()              # diagonally dominant, non-Hermitian
    b = cvector(rng, n)
    L = psc.SpMV(A, format="sell", device=device).aslinearoperator()
    for solver in (sla.gmres, sla.bicgstab, sla.bicg):
        x, info = solver(L, b, rtol=1e-10, atol=0)
        assert info == 0 and np.linalg.norm(A @ x - b) < 1e-8 * np.linalg.norm(b), solver
    x, istop = sla.lsqr(L, b, atol=1e-12, btol=1e-12)[:2]
    assert np.linalg.norm(A @ x - b) < 1e-8 * np.linalg.norm(b)
    H = (R @ R.conj().T + sp.eye(n)).tocsr()     # Hermitian positive definite
    x, info = sla.cg(psc.SpMV(H, format="csr-vector", device=device).aslinearoperator(),
                     b, rtol=1e-10, atol=0)
    assert info == 0 and np.linalg.norm(H @ x - b) < 1e-8 * np.linalg.norm(b)


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
