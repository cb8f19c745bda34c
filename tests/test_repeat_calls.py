"""A device product on the same two arrays as the call before skips the checks that
call made (``SpMV._matvec_device_again``): the results stay right as the arrays'
contents, the matrix's values and the format change, and any other array, a view, an
aliasing or cast pair, or a wrong shape, goes through every check again."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, make_operator, reference

import pyspmv_cl as psc
from pyspmv_cl.bench import generators


def spy_again(monkeypatch):
    """Count the products that took the short path."""
    taken = []
    original = psc.SpMV._matvec_device_again

    def spy(self, *args):
        taken.append(args[0])
        return original(self, *args)
    monkeypatch.setattr(psc.SpMV, "_matvec_device_again", spy)
    return taken


@pytest.mark.parametrize("fmt", ["csr-vector", "sell", "coo", "csr5"])
def test_same_arrays_again_stay_right(fmt, device, rng, monkeypatch):
    taken = spy_again(monkeypatch)
    A = sp.csr_matrix(generators.random_uniform(90, 70, 5, seed=int(rng.integers(99))))
    op = make_operator(A, fmt, dtype=np.float32, device=device)
    q = op.queue
    x_d = cla.empty(q, 70, np.float32)
    y_d = cla.empty(q, 90, np.float32)
    for i in range(4):       # new contents each time, alpha and beta too
        x = rng.uniform(-1, 1, 70)
        y0 = rng.uniform(-1, 1, 90)
        x_d.set(x.astype(np.float32))
        y_d.set(y0.astype(np.float32))
        alpha, beta = 1.0 + i, (0.0, -0.5)[i % 2]
        assert op.matvec(x_d, out=y_d, alpha=alpha, beta=beta) is y_d
        assert_close(y_d.get(), reference(A, x, alpha, beta, y0), A, x, np.float32)
    assert len(taken) == 3
    # New values: the same arrays, the new matrix.
    data = rng.standard_normal(A.nnz)
    op.update_values(data)
    B = A.copy()
    B.data = data
    op.matvec(x_d, out=y_d)
    assert_close(y_d.get(), reference(B, x), B, x, np.float32)
    assert len(taken) == 4


def test_anything_else_is_checked_again(device, rng, monkeypatch):
    taken = spy_again(monkeypatch)
    A = sp.csr_matrix(generators.random_uniform(40, 30, 4, seed=int(rng.integers(99))))
    op = make_operator(A, "csr-scalar", dtype=np.float32, device=device)
    q = op.queue
    x = rng.uniform(-1, 1, 30)
    x_d = cla.to_device(q, x.astype(np.float32))
    y_d = cla.empty(q, 40, np.float32)
    op.matvec(x_d, out=y_d)
    op.matvec(x_d, out=y_d)
    assert len(taken) == 1
    # Another out, out=None, a view, a block, the other dtype: the full path.
    other = cla.empty(q, 40, np.float32)
    op.matvec(x_d, out=other)
    assert_close(other.get(), reference(A, x), A, x, np.float32)
    assert_close(op.matvec(x_d).get(), reference(A, x), A, x, np.float32)
    big = cla.to_device(q, np.full(100, np.nan, np.float32))
    view = big[3:43]
    op.matvec(x_d, out=view)
    assert_close(view.get(), reference(A, x), A, x, np.float32)
    assert np.isnan(np.delete(big.get(), np.s_[3:43])).all()
    y64 = cla.empty(q, 40, np.float64)
    op.matvec(x_d, out=y64)
    assert_close(y64.get(), reference(A, x), A, x, np.float32)
    assert len(taken) == 1
    # A wrong shape after a short-path call is still refused.
    op.matvec(x_d, out=y_d)
    op.matvec(x_d, out=y_d)
    assert len(taken) == 2
    with pytest.raises(psc.InvalidInputError, match="out has shape"):
        op.matvec(x_d, out=cla.empty(q, 41, np.float32))
    with pytest.raises(psc.InvalidInputError, match="x has shape"):
        op.matvec(cla.empty(q, 31, np.float32), out=y_d)


def test_in_place_pair_is_never_remembered(device, rng, monkeypatch):
    """out is x (square): each call multiplies a copy of x, never x while writing it."""
    taken = spy_again(monkeypatch)
    A = sp.csr_matrix(generators.random_uniform(50, 50, 6, seed=int(rng.integers(99))))
    op = make_operator(A, "csr-scalar", dtype=np.float64 if device.fp64 else np.float32,
                       device=device)
    v = rng.uniform(-1, 1, 50)
    v_d = cla.to_device(op.queue, v.astype(op.dtype))
    for _ in range(3):
        op.matvec(v_d, out=v_d)
        v = A @ v
        assert_close(v_d.get(), v, A, v, op.dtype)
    assert not taken


def test_blocks_again(device, rng, monkeypatch):
    """A device block (a format with block kernels and one without) again."""
    taken = spy_again(monkeypatch)
    A = sp.csr_matrix(generators.random_uniform(60, 45, 5, seed=int(rng.integers(99))))
    for fmt in ("sell", "coo"):
        op = make_operator(A, fmt, dtype=np.float32, device=device)
        X_d = cla.empty(op.queue, (45, 3), np.float32)
        Y_d = cla.empty(op.queue, (60, 3), np.float32)
        for _ in range(2):
            X = rng.uniform(-1, 1, (45, 3))
            X_d.set(X.astype(np.float32))
            op.matvec(X_d, out=Y_d)
            want = reference(A, X)
            for j in range(3):
                assert_close(Y_d.get()[:, j], want[:, j], A, X[:, j], np.float32)
    assert len(taken) == 2
