"""The CSR copy behind block products of formats without block kernels
(``pyspmv_cl/block_copy.py``): made once the column path's block products have paid
for it (or by ``build_block_copy``), one block kernel per block (no transposes, no
product per column), single products left on the format, values kept in step, and
the cases where blocks still go column by column."""

import types

import numpy as np
import pyopencl.array as cla
import pytest
from conftest import assert_close, poisoned, reference, skip_without_fp64

import pyspmv_cl as psc
from pyspmv_cl import block_copy
from pyspmv_cl.bench import generators
from pyspmv_cl.errors import DeviceCapabilityError
from pyspmv_cl.launching import record_launches

NO_BLOCK_KERNELS = ["coo", "hyb", "csr5", "bccoo", "cmrs", "ellr-t"]


def matrix(rng, m=120, n=100):
    return generators.random_uniform(m, n, 6, seed=int(rng.integers(1000)))


def check_block(Y, A, X, dtype, alpha=1.0, beta=0.0, Y0=None):
    for j in range(X.shape[1]):
        want = reference(A, X[:, j], alpha, beta, None if Y0 is None else Y0[:, j])
        assert_close(Y[:, j], want, A, X[:, j], dtype)


def cheap_copy(monkeypatch):
    """The copy paid for by the first block product."""
    monkeypatch.setattr("pyspmv_cl.matrix.copy_seconds", lambda op: 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", NO_BLOCK_KERNELS)
def test_the_copy_runs_the_blocks(fmt, dtype, device, rng, monkeypatch):
    skip_without_fp64(device, dtype)
    cheap_copy(monkeypatch)
    A = matrix(rng)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device)
    assert not op.has_block_kernels and op.block_copy is None
    before = op.nbytes
    X = rng.standard_normal((100, 5))
    check_block(op.matmat(X, out=poisoned((120, 5), dtype)), A, X, dtype)
    copy = op.block_copy
    assert copy.format == "csr-scalar" and "block copy" in copy.explanation
    assert op.nbytes == before + copy.nbytes and op.nbytes_parts["blocks"] == copy.nbytes
    q = op.queue
    X_d = cla.to_device(q, X.astype(dtype))
    Y0 = rng.standard_normal((120, 5))
    Y_d = cla.to_device(q, Y0.astype(dtype))
    with record_launches(with_names=True) as launches:
        op.matmat(X_d, out=Y_d, alpha=-0.5, beta=2.0)
    check_block(Y_d.get(), A, X, dtype, -0.5, 2.0, Y0.astype(dtype))
    names = {name for name, _ in launches}
    assert names and all(name.startswith("csr_") for name in names), names
    # Single products stay on the operator's own format.
    with record_launches(with_names=True) as launches:
        y = op.matvec(X[:, 0], out=poisoned(120, dtype))
    assert_close(y, reference(A, X[:, 0]), A, X[:, 0], dtype)
    assert not any(name.startswith("csr_scalar") for name, _ in launches)
    assert op.block_copy is copy   # made once


def test_the_copy_is_bought_when_the_rent_paid_reaches_its_cost(device, rng,
                                                                 monkeypatch):
    """Column by column (two transposes a block) until the guessed savings of the
    block products so far reach the guessed cost of the copy; on the copy after."""
    monkeypatch.setattr("pyspmv_cl.matrix.copy_seconds", lambda op: 1.0)
    monkeypatch.setattr("pyspmv_cl.matrix.saved_seconds", lambda op, k: 0.1 * k)
    A = matrix(rng)
    op = psc.SpMV(A, format="coo", dtype=np.float32, device=device)
    X = rng.standard_normal((100, 3))
    X_d = cla.to_device(op.queue, X.astype(np.float32))
    Y_d = cla.empty(op.queue, (120, 3), np.float32)
    transposes = []
    for _ in range(4):   # rent 0.3, 0.6, 0.9, 1.2: bought at the fourth
        op.matvec(X[:, 0])   # single products pay no rent
        with record_launches(with_names=True) as launches:
            op.matmat(X_d, out=Y_d)
        check_block(Y_d.get(), A, X, np.float32)
        transposes.append([name for name, _ in launches].count("transpose"))
    assert transposes == [2, 2, 2, 0] and op.block_copy is not None


def test_build_block_copy_now(device, rng):
    A = matrix(rng)
    op = psc.SpMV(A, format="csr5", dtype=np.float32, device=device)
    copy = op.build_block_copy()
    assert copy is op.block_copy and copy.format == "csr-scalar"
    X = rng.standard_normal((100, 2))
    with record_launches(with_names=True) as launches:
        check_block(op @ X, A, X, np.float32)
    assert not any(name == "transpose" for name, _ in launches)
    # An operator that multiplies blocks itself has none to build.
    assert psc.SpMV(A, format="sell", device=device).build_block_copy() is None
    assert psc.SpMV(A, format="coo", device=device, block_copy=False).build_block_copy() \
        is None


def test_update_values_reaches_the_copy(device, rng):
    A = matrix(rng)
    op = psc.SpMV(A, format="coo", dtype=np.float32, device=device)
    X = rng.standard_normal((100, 3))
    op.build_block_copy()
    for _ in range(2):
        data = rng.standard_normal(A.nnz)
        op.update_values(data)
        B = A.copy()
        B.data = data
        check_block(op @ X, B, X, np.float32)
        check_block(op.block_copy @ X, B, X, np.float32)


def test_copy_after_values_were_updated(device, rng):
    """The copy is made from the values the operator holds, not the ones given first."""
    A = matrix(rng)
    op = psc.SpMV(A, format="csr5", dtype=np.float32, device=device)
    data = rng.standard_normal(A.nnz)
    op.update_values(data)
    B = A.copy()
    B.data = data
    X = rng.standard_normal((100, 4))
    assert op.build_block_copy() is not None
    check_block(op @ X, B, X, np.float32)


def test_column_by_column_when_asked_or_tuned_for_blocks(device, rng, monkeypatch):
    cheap_copy(monkeypatch)
    A = matrix(rng)
    X = rng.standard_normal((100, 3))
    op = psc.SpMV(A, format="coo", dtype=np.float32, device=device, block_copy=False)
    check_block(op @ X, A, X, np.float32)
    assert op.block_copy is None and op.nbytes_parts["blocks"] == 0
    # Tuned for blocks: the tuner timed the column path and chose; it stays.
    op = psc.SpMV(A, format="coo", dtype=np.float32, device=device)
    op.tuning = types.SimpleNamespace(block_size=8)
    assert not block_copy.wants_copy(op, 3)
    check_block(op @ X, A, X, np.float32)
    assert op.block_copy is None
    op.tuning = types.SimpleNamespace(block_size=1)
    assert block_copy.wants_copy(op, 3) and not block_copy.wants_copy(op, 1)
    empty = psc.SpMV(A[:0], format="coo", dtype=np.float32, device=device)
    assert empty.matmat(X).shape == (0, 3) and empty.block_copy is None
    with pytest.raises(psc.InvalidInputError, match="block_copy must be True or False"):
        psc.SpMV(A, format="coo", device=device, block_copy="yes")


def test_a_copy_that_cannot_be_made_leaves_the_column_path(device, rng, monkeypatch):
    """No memory for a second matrix (say): the block still comes out right, column by
    column, and the operator does not try again on every block."""
    tries = []

    def refuse(op, make):
        tries.append(1)
        raise DeviceCapabilityError("no room for the copy")
    monkeypatch.setattr("pyspmv_cl.matrix.BlockCopy", refuse)
    cheap_copy(monkeypatch)
    A = matrix(rng)
    op = psc.SpMV(A, format="ellr-t", dtype=np.float32, device=device)
    X = rng.standard_normal((100, 4))
    for _ in range(2):
        check_block(op @ X, A, X, np.float32)
        X_d = cla.to_device(op.queue, X.astype(np.float32))
        check_block(op.matmat(X_d).get(), A, X, np.float32)
    assert op.block_copy is None and len(tries) == 1
    assert "no room" in op._block_copy_error


def test_reduced_values_are_copied_as_stored(device, rng, monkeypatch):
    """A format without block kernels here that stores half values (csr-vector's
    adaptive mapping with block_mapping="items"): the copy stores them alike, so a block
    column equals the single product of that column."""
    A = matrix(rng)
    op = psc.SpMV(A, format="csr-vector", mapping="adaptive", block_mapping="items",
                  value_bits=16, dtype=np.float32, device=device)
    assert not op.has_block_kernels
    op.build_block_copy()
    X = rng.standard_normal((100, 3)).astype(np.float32)
    Y = op @ X
    assert op.block_copy.params["value_bits"] == 16
    for j in range(3):
        np.testing.assert_allclose(Y[:, j], op @ X[:, j], rtol=1e-5, atol=1e-5)


def test_transposed_blocks(device, rng, monkeypatch):
    """op.T of a format without block kernels: its copy of A^T makes a block copy too."""
    cheap_copy(monkeypatch)
    A = matrix(rng)
    op = psc.SpMV(A, format="coo", dtype=np.float32, device=device)
    Y = rng.standard_normal((120, 4))
    check_block(op.T @ Y, A.T.tocsr(), Y, np.float32)
    if not op.transposed.has_block_kernels:
        assert op.transposed.block_copy is not None


def test_the_block_copy_refuses_its_own_update(device, rng):
    """op.block_copy accepted update_values, after which block products used other
    values than single ones; it refuses now."""
    A = matrix(rng)
    op = psc.SpMV(A, format="coo", dtype=np.float32, device=device)
    op.build_block_copy()
    with pytest.raises(psc.InvalidInputError, match="the block copy .* update_values on that"):
        op.block_copy.update_values(rng.standard_normal(A.nnz))
    X = rng.standard_normal((100, 3))
    check_block(op @ X, A, X, np.float32)
