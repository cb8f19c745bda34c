"""What an operator holds, and for how long: a program building an operator a time step
must not accumulate kernels, matrices or the caller's blocks (found by a test drive)."""

import gc
import weakref

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp

import pyspmv_cl as psc
from pyspmv_cl.bench import generators

FORMATS = ["csr-scalar", "csr-vector", "ell", "ellr-t", "sell", "hyb", "coo", "csr5",
           "bccoo", "cmrs", "dia"]


def matrix(rng):
    A = sp.csr_matrix(generators.random_uniform(60, 50, 4, seed=int(rng.integers(999))))
    return (A + sp.eye(60, 50, format="csr")).tocsr()


def kernels_of(op):
    """Every kernel object the operator and its block and column paths made."""
    impl = op._impl
    found = list(impl.kernels.values())
    for built in getattr(impl, "_blocks", {}).values():
        found += list(built[0].values())
    if op._column_path is not None:
        found += [k for k, _ in op._column_path.transpose._kernels.values()]
    return found


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_objects_are_released_with_the_operator(fmt, device, rng):
    """pyopencl's Program.all_kernels() returned kernels retained once too often, so the
    driver's kernel and program outlived the object (1-8 kB a dropped operator on
    PoCL).  Every kernel an operator holds has one reference: its own."""
    A = matrix(rng)
    op = psc.SpMV(A, format=fmt, dtype=np.float32, device=device, max_padding=np.inf) \
        if fmt in ("ell", "ellr-t") else psc.SpMV(A, format=fmt, dtype=np.float32,
                                                  device=device)
    X = rng.standard_normal((50, 5))
    np.testing.assert_allclose(op @ X, A @ X, rtol=1e-4, atol=1e-4)
    op.matmat(cla.to_device(op.queue, X.astype(np.float32)))   # the column path's transposes
    op.queue.finish()   # (a command in flight holds its kernel too)
    kernels = kernels_of(op)
    assert kernels
    for kernel in kernels:
        assert kernel.get_info(cl.kernel_info.REFERENCE_COUNT) == 1, kernel.function_name


@pytest.mark.parametrize("use", ["T", "H", "rmatvec", "update_values"])
def test_a_dropped_operator_is_freed_at_once(use, device, rng):
    """op.T (and op.H, rmatvec) kept the view in the operator and the operator in the
    view, and update_values kept a closure over the operator in it: such an operator,
    its matrix and its transposed copy stayed on the device until a full garbage
    collection.  Dropped, it is freed at once now."""
    A = matrix(rng).astype(np.complex64)
    op = psc.SpMV(A, format="csr-vector", device=device)
    x = np.ones(60, np.complex64)
    if use == "T":
        np.testing.assert_allclose(op.T @ x, A.T @ x, rtol=1e-4)
        assert op.T.T is op
    elif use == "H":
        np.testing.assert_allclose(op.H @ x, A.conj().T @ x, rtol=1e-4)
    elif use == "rmatvec":
        op.rmatvec(x)
    else:
        op.update_values(2 * A.data)
        np.testing.assert_allclose(op @ np.ones(50, np.complex64), 2 * A @ np.ones(50),
                                   rtol=1e-4)
    ref = weakref.ref(op)
    transposed = op._transposed and weakref.ref(op._transposed)
    gc.disable()
    try:
        del op
        assert ref() is None
        assert not transposed or transposed() is None
    finally:
        gc.enable()


def test_a_view_outlives_its_reference_in_the_operator(device, rng):
    """The views are held weakly by the operator: a view kept by the caller still works
    after the operator's name is gone, and op.T is op.T while someone holds it."""
    A = matrix(rng)
    op = psc.SpMV(A, format="csr-scalar", dtype=np.float64, device=device)
    view = op.T
    assert op.T is view
    del op
    gc.collect()
    y = np.ones(60)
    np.testing.assert_allclose(view @ y, A.T @ y, rtol=1e-12)
    np.testing.assert_allclose(view.T @ np.ones(50), A @ np.ones(50), rtol=1e-12)


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell"])
def test_a_block_product_does_not_keep_the_callers_block(fmt, device, rng):
    """The block kernels' argument memo kept each width's X and Y until a later product
    of that same width: a large block stayed referenced by the operator through other
    products.  Now a product keeps only its own widths' arguments, and a single-vector
    product none."""
    A = matrix(rng)
    op = psc.SpMV(A, format=fmt, dtype=np.float32, device=device)
    if not op.has_block_kernels:
        pytest.skip("no block kernels here")
    q = op.queue
    X = cla.to_device(q, rng.standard_normal((50, 35)).astype(np.float32))
    Y = op @ X                               # widths of 32, 2 and 1 (or 16 and 2 and 1)
    np.testing.assert_allclose(Y.get(), A @ X.get(), rtol=1e-4, atol=1e-4)
    memo = op._impl.__dict__["_block_args"]
    assert memo
    X8 = rng.standard_normal((50, 8)).astype(np.float32)
    np.testing.assert_allclose(op @ X8, A @ X8, rtol=1e-4, atol=1e-4)
    assert {key.rsplit("/", 1)[1] for key in memo} == {"8"}
    held = {id(a) for args in memo.values() for a in args}
    assert id(X.base_data) not in held and id(Y.base_data) not in held
    np.testing.assert_allclose(op @ X8[:, 0], A @ X8[:, 0], rtol=1e-4, atol=1e-4)
    assert not memo
    # ... and the block product after both sets its arguments again, right.
    np.testing.assert_allclose((op @ X).get(), A @ X.get(), rtol=1e-4, atol=1e-4)
