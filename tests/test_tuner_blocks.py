"""Tuning for block products (``block_size=k``), beyond test_tuner.py's block tests:
every candidate timed on a product of k different vectors as the operator runs it
(block kernels, else column by column through the operator's strided copy,
formats/columns.py) and its result checked against scipy's ``A @ X``; results of
operators tuned for k against scipy in float64.  Small matrices and short budgets keep
each tuning well under a second on PoCL."""

import numpy as np
import pyopencl.array as cla
import pytest
from conftest import DEVICES, assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats import FORMATS
from pyspmv_cl.formats import columns as columns_module
from pyspmv_cl.formats.base import SpMVFormat
from pyspmv_cl.tuning import database, tuner

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
DTYPE = np.float64 if DEVICES and DEVICES[0].profile.fp64 else np.float32
BUDGET = 0.5


@pytest.fixture(autouse=True)
def db(tmp_path, monkeypatch):
    root = tmp_path / "tuning"
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(root))
    monkeypatch.delenv("PYSPMV_CL_TUNE", raising=False)
    monkeypatch.delenv("PYSPMV_CL_TUNE_BUDGET", raising=False)
    database.clear_memory()
    yield root
    database.clear_memory()


def random_values(A, rng):
    """``A``'s pattern with fresh random values."""
    A = A.tocsr().astype(np.float64)
    A.data = rng.standard_normal(A.nnz)
    return A


def check_block(op, A, k, rng):
    """op @ X for k fresh random vectors, on the host into a NaN-poisoned out and on
    the device, against scipy in float64."""
    X = rng.standard_normal((A.shape[1], k))
    out = np.full((A.shape[0], k), np.nan, op.dtype)
    op.matmat(X, out=out)
    assert_close(out, reference(A, X), A, X, op.dtype)
    Xd = cla.to_device(op.queue, X.astype(op.dtype))
    Yd = cla.to_device(op.queue, np.full((A.shape[0], k), np.nan, op.dtype))
    op.matmat(Xd, out=Yd)
    assert_close(Yd.get(), reference(A, X.astype(op.dtype)), A, X, op.dtype)


def measure(A, names, k, **kw):
    registry = {name: FORMATS[name] for name in names}
    return tuner.measure(A, MatrixFeatures.from_csr(A), DEVICES[0], DTYPE, budget=30,
                         registry=registry, alternatives=False, block_size=k, **kw)


def test_candidates_are_timed_as_the_operator_runs_blocks(monkeypatch, rng):
    """For k = 5 every product the tuner runs is a block product: csr-scalar's block
    kernels (no single-vector launch), coo (no block kernels) column by column through
    the operator's strided copy (a copy of X's column in, one of y out, per product)."""
    calls = {}

    def counting(key, original):
        def wrapper(self, *args, **kwargs):
            name = key if isinstance(key, str) else f"{self.name}/{key[0]}"
            calls[name] = calls.get(name, 0) + 1
            return original(self, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(SpMVFormat, "enqueue", counting(("vector",), SpMVFormat.enqueue))
    monkeypatch.setattr(SpMVFormat, "enqueue_block",
                        counting(("block",), SpMVFormat.enqueue_block))
    monkeypatch.setattr(columns_module.ColumnCopy, "enqueue",
                        counting("copy", columns_module.ColumnCopy.enqueue))
    A = random_values(generators.random_uniform(300, 280, 4, seed=3), rng)
    entry, impl, chosen = measure(A, ("csr-scalar", "coo"), 5)
    products = {c["format"]: c["product"] for c in entry["candidates"]}
    assert products == {"csr-scalar": "block kernels", "coo": "column by column"}
    assert entry["block_size"] == 5
    assert calls.get("csr-scalar/block", 0) > 0 and "csr-scalar/vector" not in calls
    assert "coo/block" not in calls
    assert calls["coo/vector"] > 0 and calls["coo/vector"] % 5 == 0
    assert calls["copy"] == 2 * calls["coo/vector"]
    assert chosen["format"] in products and impl is not None
    # The k = 1 records say nothing of a path.
    entry, _, _ = measure(A, ("csr-scalar",), 1)
    assert "product" not in entry["candidates"][0]


def test_wrong_block_products_are_skipped(monkeypatch, rng):
    """The block product is what is checked: a block kernel that leaves Y's last
    column unwritten, or a column loop that skips it, is skipped as a wrong result
    (each alone: the bench's Y is shared by the candidates of one run)."""
    A = random_values(generators.random_uniform(300, 280, 4, seed=4), rng)
    original = SpMVFormat.enqueue_block

    def short_block(self, queue, x_buf, y_buf, k, *args, **kwargs):
        return original(self, queue, x_buf, y_buf, k - 1, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(SpMVFormat, "enqueue_block", short_block)
        entry, impl, chosen = measure(A, ("csr-scalar",), 4)
    assert chosen is None and "wrong result" in dict(entry["skipped"])["csr-scalar"]
    entry, impl, chosen = measure(A, ("csr-scalar",), 4)   # unpatched: measured
    assert chosen["format"] == "csr-scalar"

    def short_columns(copy, queue, product, x_buf, y_buf, xs, ys, shape, k, *args, **kw):
        return columns_module.columns_product(copy, queue, product, x_buf, y_buf, xs, ys,
                                              shape, k - 1, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(tuner, "columns_product", short_columns)
        entry, impl, chosen = measure(A, ("coo",), 4)
    assert chosen is None and "wrong result" in dict(entry["skipped"])["coo"]
    entry, impl, chosen = measure(A, ("coo",), 4)
    assert chosen["format"] == "coo"


@pytest.mark.parametrize("k", [2, 7])
def test_block_products_right_after_tuning_for_k(k, rng):
    """Operators tuned for k multiply any k right (host and device blocks), whether
    the winner has block kernels or not."""
    A = random_values(generators.random_uniform(400, 350, 5, seed=5), rng)
    op = psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], tune=True, tune_budget=BUDGET,
                  block_size=k)
    assert op.tuning.source == "measured" and op.tuning.block_size == k
    assert {c["product"] for c in op.tuning.entry["candidates"]} <= {
        "block kernels", "column by column"}
    for j in (k, 1, 3, 17):
        check_block(op, A, j, rng)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
