"""Transposed products (``op.T``, ``op.H``, ``rmatvec``, ``rmatmat``, ``x @ op``) in
every format against scipy in float64, the transposed copy's memory and format, its
values after ``update_values``, scipy's solvers on ``aslinearoperator()``, and the
result types of numpy's promotion (README "Result types")."""

import re

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from conftest import assert_close, make_operator, poisoned, reference, skip_without_fp64
from matrix_cases import CASES

import pyspmv_cl as psc

FORMATS = psc.formats()
DTYPES = [np.float32, np.float64]
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)


def rectangular(rng, m, n, density=0.15):
    """Random m x n CSR with a few rows and columns left empty."""
    A = sp.random(m, n, density=density, format="lil", random_state=rng)
    for i in range(0, m, 7):
        A[i, :] = 0
    for j in range(0, n, 5):
        A[:, j] = 0
    return sp.csr_matrix(A)


def with_duplicates(A, rng):
    """A with the rows of matrix_cases' duplicates_csr (repeated columns) appended."""
    D = CASES["duplicates_csr"](rng)
    B = sp.csr_matrix((A.shape[0] + D.shape[0], A.shape[1]))
    B.data = np.concatenate([A.data, D.data])
    B.indices = np.concatenate([A.indices, D.indices]).astype(np.int32)
    B.indptr = np.concatenate([A.indptr, A.nnz + D.indptr[1:]]).astype(np.int32)
    B.has_canonical_format = False
    return B


def matrices(rng):
    """Shapes where A^T differs most from A: tall, wide, one row or column, zero rows
    or columns, duplicates (kept apart in A^T as in A)."""
    return {
        "45x31": rectangular(rng, 45, 31),
        "19x52": rectangular(rng, 19, 52),
        "1x40": sp.csr_matrix(rng.standard_normal((1, 40))),
        "40x1": sp.csr_matrix(rng.standard_normal((40, 1))),
        "1x1": sp.csr_matrix(np.array([[rng.standard_normal()]])),
        "7x0": sp.csr_matrix((7, 0)),
        "0x9": sp.csr_matrix((0, 9)),
        "duplicates": sp.csr_matrix(CASES["duplicates_csr"](rng)),
    }


def transpose_of(A):
    return sp.csr_matrix(A.T)


def check_transposed_products(op, A, dtype, rng):
    m, n = A.shape
    AT = transpose_of(A)
    # op.T @ x allocates the result: numpy's promotion of op.dtype and x's (float64).
    x = rng.standard_normal(m)
    y = op.T @ x
    assert y.shape == (n,) and y.dtype == np.result_type(dtype, x.dtype)
    assert_close(y, reference(AT, x), AT, x, dtype)
    assert_close(op.H @ x, reference(AT, x), AT, x, dtype)
    assert_close(x @ op, reference(AT, x), AT, x, dtype)
    # rmatvec into a poisoned out (beta == 0 never reads it), then beta != 0.
    x = rng.standard_normal(m).astype(dtype)
    out = poisoned(n, dtype)
    assert op.rmatvec(x, out=out, alpha=-1.5) is out
    assert_close(out, reference(AT, x, -1.5), AT, x, dtype)
    y0 = rng.standard_normal(n).astype(dtype)
    out = y0.copy()
    op.T.matvec(x, out=out, alpha=0.5, beta=2.0)
    assert_close(out, reference(AT, x, 0.5, 2.0, y0), AT, x, dtype)
    # Device arrays in and out, alpha/beta as above.
    x_d = cla.to_device(op.queue, x)
    out_d = cla.to_device(op.queue, poisoned(n, dtype))
    assert op.rmatvec(x_d, out=out_d, alpha=2.0) is out_d
    assert_close(out_d.get(), reference(AT, x, 2.0), AT, x, dtype)
    out_d = cla.to_device(op.queue, y0)
    op.rmatvec(x_d, out=out_d, alpha=-1.0, beta=0.25)
    assert_close(out_d.get(), reference(AT, x, -1.0, 0.25, y0), AT, x, dtype)
    np.testing.assert_array_equal(x_d.get(), x)   # x untouched
    y_d = op.T @ x_d
    assert isinstance(y_d, cla.Array) and y_d.dtype == dtype
    assert_close(y_d.get(), reference(AT, x), AT, x, dtype)
    # rmatmat: a block of 3 columns; op.T.T is A again.
    X = rng.standard_normal((m, 3))
    Y = op.rmatmat(X)
    assert Y.shape == (n, 3)
    for j in range(3):
        assert_close(Y[:, j], reference(AT, X[:, j]), AT, X[:, j], dtype)
    x = rng.standard_normal(n)
    assert op.T.T is op and op.H is op.T and op.T.shape == (n, m)
    assert_close(op.T.rmatvec(x), reference(A, x), A, x, dtype)


@with_dtypes
@pytest.mark.parametrize("fmt", FORMATS)
def test_transposed_products(fmt, dtype, device, rng):
    skip_without_fp64(device, dtype)
    tested = 0
    for name, A in matrices(rng).items():
        op = make_operator(A, fmt, dtype=dtype, device=device)
        if op is None:
            continue
        assert op.transposed is None and op.nbytes_parts["transposed"] == 0
        before = op.nbytes
        check_transposed_products(op, A, dtype, rng)
        copy = op.transposed
        assert copy is not None and copy.shape == A.shape[::-1] and copy.dtype == dtype
        # The caller fixed a format: the copy uses it unless A^T does not suit it.
        assert copy.format == fmt or "refuses A^T" in copy.explanation, name
        assert op.nbytes_parts["transposed"] == copy.nbytes > (0 if A.nnz else -1)
        assert op.nbytes == before + copy.nbytes
        assert op.transposed is copy   # built once
        tested += 1
    assert tested >= 4, f"{fmt} refused nearly every matrix"


@pytest.mark.parametrize("fmt", FORMATS)
def test_update_values_reaches_the_transposed_copy(fmt, device, rng):
    """Values updated before the copy exists are read back from the device (not from
    the caller's arrays, changed here on purpose); updates after it go through the
    permutation."""
    dtype = np.float32
    A = with_duplicates(rectangular(rng, 55, 37, density=0.2), rng)
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    data = rng.standard_normal(A.nnz)
    op.update_values(data)
    A.data[:] = 1e6   # the caller's array: must not leak into the copy
    B = A.copy()
    B.data = data
    BT = transpose_of(B)
    x = rng.standard_normal(A.shape[0])
    assert_close(op.T @ x, reference(BT, x), BT, x, dtype)
    for _ in range(2):   # the second update reuses both maps
        data = rng.standard_normal(A.nnz)
        op.update_values(data)
        B.data = data
        BT = transpose_of(B)
        x = rng.standard_normal(A.shape[0])
        assert_close(op.T @ x, reference(BT, x), BT, x, dtype)
        x_d = cla.to_device(op.queue, x.astype(dtype))
        assert_close(op.rmatvec(x_d).get(), reference(BT, x), BT, x, dtype)
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(B, x), B, x, dtype)
    parts = op.nbytes_parts
    # A format keeping the values in CSR order needs no map (update_values copies).
    # (An operator converted on the device keeps its map as codes, one per slot.)
    assert (parts["value_map"] > 0) == bool(op._updater.codes is not None
                                            or op._updater.device_layout)
    assert parts["transposed"] >= op.transposed.nbytes > 0
    assert op.nbytes == sum(parts.values())


def test_transposed_copy_of_a_device_matrix(device, rng):
    """A matrix given as pyopencl arrays: the copy comes from the operator's own values
    (the caller's arrays may change after construction)."""
    A = rectangular(rng, 50, 33)
    q = device.queue
    triple = (cla.to_device(q, A.data), cla.to_device(q, A.indices),
              cla.to_device(q, A.indptr))
    for fmt in ("csr-scalar", "coo"):
        op = psc.SpMV(triple, shape=A.shape, format=fmt, device=device)
        triple[0].fill(0)
        x = rng.standard_normal(50)
        AT = transpose_of(A)
        assert_close(op.T @ x, reference(AT, x), AT, x, np.float64)
        assert op.transposed.format == fmt
        triple[0].set(A.data)


def test_format_of_the_transposed_copy(device, rng):
    """A fixed format carries over with its parameters; one that refuses A^T gives
    way to format="auto", saying so; "auto" chooses for A^T on its own."""
    op = psc.SpMV(rectangular(rng, 30, 20), format="csr-vector", vector_size=4,
                  device=device)
    op.build_transposed()
    assert op.transposed.format == "csr-vector"
    assert op.transposed.params["vector_size"] == 4
    # ELL takes A (rows of 2) but not A^T (one row of 20,000: padding far over limit).
    n = 20_000
    rows = np.repeat(np.arange(n), 2)
    cols = np.stack([np.zeros(n, int), rng.integers(1, n, n)], axis=1).ravel()
    A = sp.csr_matrix((rng.standard_normal(2 * n), (rows, cols)), shape=(n, n))
    op = psc.SpMV(A, format="ell", device=device, dtype=np.float32)
    x = rng.standard_normal(n)
    AT = transpose_of(A)
    assert_close(op.T @ x, reference(AT, x), AT, x, np.float32)
    assert op.transposed.format != "ell"
    assert "ell refuses A^T" in op.transposed.explanation
    op = psc.SpMV(rectangular(rng, 30, 20), device=device, tune=False)
    assert op.build_transposed() is op.transposed
    assert op.transposed.tuning is not None   # chosen by format="auto"


# ---------------------------------------------------------------- scipy's solvers


def poisson_2d(k):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    eye = sp.identity(k)
    return sp.csr_matrix(sp.kron(eye, T) + sp.kron(T, eye))


@pytest.mark.parametrize("fmt", FORMATS)
def test_scipy_solvers_on_the_linear_operator(fmt, device, rng):
    skip_without_fp64(device, np.float64)
    # 100 x 100, SPD; the diagonal term splits Poisson's double eigenvalues (ARPACK
    # may find one copy of a double eigenvalue only), far enough apart at the top for
    # lobpcg (with linspace(0, 1) the 4th and 5th lay 0.008 apart: lobpcg stalled on
    # some starting blocks, and on scipy's own product with noise of 2e-16 added).
    n = 100
    spd = sp.csr_matrix(poisson_2d(10) + sp.diags(np.linspace(0.0, 4.0, n)))
    # Non-symmetric, diagonally dominant (well conditioned), and a tall full-rank one.
    nonsym = sp.csr_matrix(spd + sp.diags([0.7], [3], shape=(n, n))
                           - sp.diags([0.4], [-11], shape=(n, n)))
    tall = sp.csr_matrix(sp.vstack([sp.identity(40) * 3.0,
                                    sp.random(30, 40, density=0.2, random_state=rng)]))
    ops = {name: make_operator(M, fmt, dtype=np.float64, device=device)
           for name, M in (("spd", spd), ("nonsym", nonsym), ("tall", tall))}
    if any(op is None for op in ops.values()):
        pytest.skip(f"{fmt} refuses one of the matrices")
    L = {name: op.aslinearoperator() for name, op in ops.items()}
    assert isinstance(L["spd"], spla.LinearOperator) and L["spd"].dtype == np.float64
    assert L["tall"].shape == (70, 40) and L["tall"].H.shape == (40, 70)

    b = rng.standard_normal(n)
    kw = {"rtol": 1e-10, "atol": 0.0, "maxiter": 1000}
    for solver, M in ((spla.cg, spd), (spla.gmres, nonsym), (spla.bicg, nonsym),
                      (spla.bicgstab, nonsym)):
        name = "spd" if M is spd else "nonsym"
        exact = spla.spsolve(sp.csc_matrix(M), b)
        solution, info = solver(L[name], b, **kw)
        theirs, their_info = solver(M, b, **kw)
        assert info == their_info == 0, solver.__name__
        for x in (solution, theirs):
            assert np.linalg.norm(x - exact) <= 1e-7 * np.linalg.norm(exact), solver.__name__

    b = rng.standard_normal(70)
    exact = np.linalg.lstsq(tall.toarray(), b, rcond=None)[0]
    for solver in (spla.lsqr, spla.lsmr):
        solution = solver(L["tall"], b, atol=1e-12, btol=1e-12)[0]
        theirs = solver(tall, b, atol=1e-12, btol=1e-12)[0]
        for x in (solution, theirs):
            assert np.linalg.norm(x - exact) <= 1e-8 * np.linalg.norm(exact), solver.__name__

    v0 = rng.standard_normal(n)
    values = spla.eigsh(L["spd"], k=3, which="LA", v0=v0, tol=1e-10,
                        return_eigenvectors=False)
    theirs = spla.eigsh(spd, k=3, which="LA", v0=v0, tol=1e-10, return_eigenvectors=False)
    exact = np.linalg.eigvalsh(spd.toarray())[-3:]
    np.testing.assert_allclose(np.sort(values), exact, rtol=1e-9)
    np.testing.assert_allclose(np.sort(theirs), exact, rtol=1e-9)

    # lobpcg multiplies blocks (op.matmat on 4 vectors at a time); its tol bounds the
    # residuals, and the eigenvalues' error goes with their square.
    exact = np.linalg.eigvalsh(spd.toarray())[-4:]
    X = rng.standard_normal((n, 4))
    values, vectors = spla.lobpcg(L["spd"], X, largest=True, tol=1e-6, maxiter=500)
    np.testing.assert_allclose(np.sort(values), exact, rtol=1e-10)
    assert np.linalg.norm(spd @ vectors - vectors * values, axis=0).max() <= 2e-6


def test_linear_operator_products(device, rng):
    """Each product of the LinearOperator, its adjoint and transpose, on the device."""
    A = rectangular(rng, 35, 22)
    op = psc.SpMV(A, format="csr-scalar", device=device, dtype=np.float32)
    L = op.aslinearoperator()
    AT = transpose_of(A)
    assert L.dtype == np.float32 and L.shape == (35, 22)
    x, u = rng.standard_normal(22), rng.standard_normal(35)
    X, U = rng.standard_normal((22, 4)), rng.standard_normal((35, 4))
    assert_close(L.matvec(x), reference(A, x), A, x, np.float32)
    assert_close(L.rmatvec(u), reference(AT, u), AT, u, np.float32)
    assert_close(L.H.matvec(u), reference(AT, u), AT, u, np.float32)
    assert_close(L.T.matvec(u), reference(AT, u), AT, u, np.float32)
    assert_close(L.H.H.matvec(x), reference(A, x), A, x, np.float32)
    assert L.matvec(x.reshape(22, 1)).shape == (35, 1)
    for j in range(4):
        assert_close(L.matmat(X)[:, j], reference(A, X[:, j]), A, X[:, j], np.float32)
        assert_close(L.rmatmat(U)[:, j], reference(AT, U[:, j]), AT, U[:, j], np.float32)
        assert_close((U.T @ op)[j], reference(AT, U[:, j]), AT, U[:, j], np.float32)
    with pytest.raises(ValueError, match="2-D"):
        op.matmat(x)
    with pytest.raises(ValueError, match="rmatvec.*shape"):
        op.rmatvec(x)   # 22 entries where A^T needs 35
    assert op.transposed is not None
    with pytest.raises(ValueError, match="beta"):
        op.rmatvec(u, beta=1.0)


def test_a_float32_operator_in_cg(device, rng):
    """scipy's cg on a float32 operator with a float64 right-hand side: products come
    back as float64 (numpy's promotion) computed in float32."""
    A = poisson_2d(8)
    op = psc.SpMV(A, dtype=np.float32, device=device)
    b = rng.standard_normal(A.shape[0])
    solution, info = spla.cg(op.aslinearoperator(), b, rtol=1e-5, atol=0.0, maxiter=500)
    assert info == 0
    exact = spla.spsolve(sp.csc_matrix(A), b)
    assert np.linalg.norm(solution - exact) <= 1e-4 * np.linalg.norm(exact)


# -------------------------------------------------------------------- result types


X_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint8,
            np.bool_]


@with_dtypes
def test_result_type_follows_numpy(dtype, device, rng):
    """op @ x has numpy.result_type(op.dtype, x.dtype), computed in op.dtype: exactly
    the product of x rounded to op.dtype, cast.  Transposed products alike."""
    skip_without_fp64(device, dtype)
    A = rectangular(rng, 40, 30)
    op = psc.SpMV(A, format="csr-scalar", dtype=dtype, device=device)
    for x_dtype in X_DTYPES:
        for product, (k, B) in ((op.matvec, (30, A)), (op.rmatvec, (40, transpose_of(A)))):
            x = np.abs(rng.standard_normal(k) * 10).astype(x_dtype)
            y = product(x)
            assert y.dtype == np.result_type(dtype, x_dtype), (x_dtype, y.dtype)
            assert y.dtype == np.result_type(B.astype(dtype) @ x), "scipy's type"
            np.testing.assert_array_equal(y, product(x.astype(dtype)).astype(y.dtype))
            assert_close(y, reference(B, x.astype(dtype)), B, x, dtype)
            X = np.stack([x, x], axis=1)           # blocks too (a block kernel may sum
            Y = product(X)                        # in another order than the vector one)
            assert Y.dtype == y.dtype
            np.testing.assert_array_equal(Y, product(X.astype(dtype)).astype(Y.dtype))
            assert_close(Y[:, 1], reference(B, x.astype(dtype)), B, x, dtype)


@with_dtypes
def test_host_out_receives_the_result_cast(dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = rectangular(rng, 40, 30)
    op = psc.SpMV(A, format="csr-scalar", dtype=dtype, device=device)
    x = rng.standard_normal(30)
    exact = op @ x.astype(dtype)
    for out_dtype in (np.float32, np.float64):
        out = poisoned(40, out_dtype)
        assert op.matvec(x, out=out) is out and out.dtype == out_dtype
        np.testing.assert_array_equal(out, exact.astype(out_dtype))
    with pytest.raises(psc.UnsupportedDtypeError, match="floats"):
        op.matvec(x, out=np.zeros(40, dtype=np.int64))


@with_dtypes
def test_device_arrays_of_the_other_float_type(dtype, device, rng):
    """A device x or out of the other float type is cast on the device: the result
    is the same as with arrays in op.dtype, cast; integer device arrays are refused."""
    skip_without_fp64(device, np.float64)
    other = np.float64 if dtype == np.float32 else np.float32
    A = rectangular(rng, 40, 30)
    op = psc.SpMV(A, format="csr-scalar", dtype=dtype, device=device)
    q = op.queue
    x = rng.standard_normal(30).astype(other)
    exact = op @ x.astype(dtype)
    y_d = op @ cla.to_device(q, x)   # out allocated: numpy's promotion
    assert y_d.dtype == np.result_type(dtype, other)
    np.testing.assert_array_equal(y_d.get(), exact.astype(y_d.dtype))
    for x_dtype in (dtype, other):
        x_d = cla.to_device(q, x.astype(x_dtype))
        for out_dtype in (dtype, other):
            out_d = cla.to_device(q, poisoned(40, out_dtype))
            assert op.matvec(x_d, out=out_d, alpha=2.0) is out_d
            np.testing.assert_array_equal(out_d.get(), (2 * exact).astype(out_dtype))
            y0 = rng.standard_normal(40).astype(out_dtype)
            out_d = cla.to_device(q, y0)
            op.matvec(x_d, out=out_d, alpha=-1.0, beta=0.5)
            narrowest = np.float32 if np.float32 in (dtype, out_dtype) else np.float64
            assert_close(out_d.get(), reference(A, x, -1.0, 0.5, y0), A, x, narrowest)
    # The transposed products take the same rule.
    u = rng.standard_normal(40).astype(other)
    AT = transpose_of(A)
    y_d = op.rmatvec(cla.to_device(q, u))
    assert y_d.dtype == np.result_type(dtype, other)
    assert_close(y_d.get(), reference(AT, u), AT, u, dtype)
    with pytest.raises(psc.UnsupportedDtypeError, match="int64.*astype"):
        op.matvec(cla.to_device(q, np.ones(30, dtype=np.int64)))
    with pytest.raises(psc.UnsupportedDtypeError, match="int32"):
        op.matvec(cla.to_device(q, x), out=cla.empty(q, 40, np.int32))


def test_float64_device_arrays_need_fp64(device, rng):
    """Without fp64 a float64 device array cannot be cast there: a typed error; host
    float64 vectors still work (cast on the host), transposed products too."""
    A = rectangular(rng, 40, 30)
    op = psc.SpMV(A, dtype=np.float32, device=device.override(fp64=False))
    x = rng.standard_normal(30)
    with pytest.raises(psc.DeviceCapabilityError, match="float64.*double"):
        op.matvec(cla.to_device(op.queue, x))
    with pytest.raises(psc.DeviceCapabilityError, match="float64"):
        op.matvec(cla.to_device(op.queue, x.astype(np.float32)),
                  out=cla.empty(op.queue, 40, np.float64))
    assert (op @ x).dtype == np.float64
    assert_close(op @ x, reference(A, x), A, x, np.float32)
    u = rng.standard_normal(40)
    AT = transpose_of(A)
    assert_close(op.T @ u, reference(AT, u), AT, u, np.float32)


def test_the_transposed_copy_refuses_its_own_update(device, rng):
    """op.transposed accepted update_values, after which op.T (and the linear
    operator's adjoint) used other values than op; it refuses now, and op's own update
    keeps both in step."""
    A = rectangular(rng, 40, 30, density=0.2)
    op = psc.SpMV(A, format="sell", dtype=np.float32, device=device)
    op.build_transposed()
    with pytest.raises(psc.InvalidInputError, match="transposed copy .* update_values on that"):
        op.transposed.update_values(rng.standard_normal(A.nnz))
    data = rng.standard_normal(A.nnz)
    op.update_values(data)
    B = A.copy()
    B.data = data
    BT = transpose_of(B)
    u, x = rng.standard_normal(40), rng.standard_normal(30)
    assert_close(op.T @ u, reference(BT, u), BT, u, np.float32)
    assert_close(op @ x, reference(B, x), B, x, np.float32)


def test_refusals_of_transposed_products_in_the_callers_terms(device, rng):
    """x @ op checked x's shape through op.T and named x.T, a transposed operator and
    rmatvec; a strided device block failed in get() with an AssertionError; complex
    op.T with a strided device x or out, or a read-only host out, raised pyopencl's
    NotImplementedError or numpy's ValueError (their conjugation ran before the
    checks).  Each is the library's error now, and a refused out is left as given."""
    skip_without_fp64(device, np.complex128)
    A = (rectangular(rng, 7, 5, density=0.4) * (1 + 0.5j)).tocsr()
    op = psc.SpMV(A, format="csr-scalar", device=device)
    for bad in (np.ones((2, 5)), np.ones(5)):
        with pytest.raises(psc.InvalidInputError, match=re.escape(
                f"x @ op: x has shape {bad.shape}; this 7x5 operator needs (7,) or (k, 7)")):
            bad @ op if bad.ndim == 2 else op.__rmatmul__(bad)
    q = op.queue
    block = cla.to_device(q, rng.standard_normal((2, 14)))[:, ::2]   # strided (2, 7)
    with pytest.raises(psc.UnsupportedLayoutError, match="strided view"):
        op.__rmatmul__(block)
    strided = cla.to_device(q, (rng.standard_normal(14) + 1j).astype(np.complex128))[::2]
    for call in (lambda: op.T @ strided, lambda: op.__rmatmul__(strided),
                 lambda: op.T.matvec(cla.to_device(q, np.ones(7, np.complex128)),
                                     out=cla.to_device(q, np.ones(10, np.complex128))[::2],
                                     beta=1.0)):
        with pytest.raises(psc.InvalidInputError, match="must be contiguous on the device"):
            call()
    out = np.full(5, 1 + 2j)
    out.setflags(write=False)
    with pytest.raises(psc.InvalidInputError, match="read-only"):
        op.T.matvec(np.ones(7, np.complex128), out=out, beta=1.0)
    assert np.all(out == 1 + 2j)
    x = rng.standard_normal(7) + 1j * rng.standard_normal(7)
    X = rng.standard_normal((3, 7))
    np.testing.assert_allclose(x @ op, A.T @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(X @ op, (A.T @ X.T).T, rtol=1e-12, atol=1e-12)


def test_complex_transposed_products_check_like_the_others(device, rng):
    """op.T of a complex operator (and op.T.H) took alpha and beta through complex():
    beta != 0 without out was dropped (A^T x returned), a string alpha was taken as a
    number, None and a 1-element array raised a bare TypeError; a sparse x, None or an
    operator became a 0-d array refused for its shape.  Each is now the error op.matvec
    and op.H give."""
    A = (rectangular(rng, 6, 4, density=0.5) * (1 - 0.5j)).tocsr().astype(np.complex64)
    op = psc.SpMV(A, format="csr-scalar", device=device)
    u, v = np.ones(6, np.complex64), np.ones(4, np.complex64)
    for view, x in ((op.T, u), (op.T.H, v), (op.H, u)):
        with pytest.raises(psc.InvalidInputError, match="beta != 0 needs out="):
            view.matvec(x, beta=1.0)
        for bad, what in (("2", "string"), (None, "None"), (np.array([2.0]), "array")):
            with pytest.raises(psc.InvalidTypeError, match=f"alpha must be a number.*{what}"):
                view.matvec(x, alpha=bad)
        size = x.size
        for bad, name in ((sp.csr_matrix(np.ones((size, 1))), "csr_matrix"),
                          (None, "NoneType")):
            with pytest.raises(psc.InvalidTypeError, match=re.escape(
                    f"x must be a dense vector (a numpy or pyopencl array of {size} numbers), "
                    f"not {name}")):
                view @ bad
        with pytest.raises(psc.InvalidTypeError, match="x is an operator"):
            view @ op
    # ... and they still compute: alpha, beta, out.
    y0 = (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64)
    out = y0.copy()
    op.T.matvec(u, out=out, alpha=2 - 1j, beta=0.5j)
    want = (2 - 1j) * (A.T.astype(np.complex128) @ u) + 0.5j * y0
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, finer", [(np.float32, np.float64),
                                          (np.complex64, np.complex128)])
def test_a_finer_out_keeps_its_precision_in_beta(dtype, finer, device, rng):
    """A float64 out given to a float32 operator with beta != 0 (complex128 to
    complex64) was rounded to the operator's type before beta * out was added: an
    r = b - A @ x lost b's last digits.  beta * out is now taken in out's precision,
    on the host and on the device, for vectors and blocks, and through op.T."""
    skip_without_fp64(device, finer)
    A = rectangular(rng, 30, 20).astype(dtype)
    op = psc.SpMV(A, format="csr-vector", device=device)
    for shape in ((20,), (20, 3)):
        x = np.zeros(shape, dtype)          # A @ x is exactly 0: out = beta * b exactly
        b = 1 + 1e-12 * rng.standard_normal((30,) + shape[1:])
        if np.dtype(finer).kind == "c":
            b = b + 1j * (1 - 1e-12 * rng.standard_normal(b.shape))
        b = b.astype(finer)
        host = b.copy()
        assert op.matvec(x, out=host, alpha=3.0, beta=-1.0) is host
        np.testing.assert_array_equal(host, -b)
        dev = cla.to_device(op.queue, b)
        op.matvec(cla.to_device(op.queue, x), out=dev, alpha=3.0, beta=-1.0)
        np.testing.assert_array_equal(dev.get(), -b)
        # with a product: its part in op.dtype's accuracy, beta * out exact
        x = rng.standard_normal(shape).astype(dtype)
        got = b.copy()
        op.matvec(x, out=got, alpha=0.5, beta=2.0)
        want = 0.5 * (A.astype(np.complex128) @ x) + 2 * b
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    u = np.zeros(30, dtype)
    c = (1 + 1e-12 * rng.standard_normal(20)).astype(finer)
    out = c.copy()
    op.T.matvec(u, out=out, beta=2.0)
    np.testing.assert_array_equal(out, 2 * c)
