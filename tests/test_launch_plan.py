"""Launch plans (SpMVFormat.enqueue): kernel arguments are set once per (queue, x, y,
alpha, beta) and reused.  Products that change any of them must stay right, a kernel
launched twice in one product must get its own arguments each time, out-of-order
queues must still run the passes in order, and ``format="auto"`` must measure on a
user's queue that has no profiling."""

import gc

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DEVICES, make_operator, poisoned
from matrix_cases import CASES, check_against_scipy

import pyspmv_cl as psc
from pyspmv_cl.tuning import database

FORMATS = psc.formats()
DTYPE = np.float32

# (x, y, alpha, beta) of successive products; each step changes one thing or returns
# to an earlier combination, so a stale argument shows up as a wrong result.
SEQUENCE = [(0, 0, 1.0, 0.0), (0, 0, 1.0, 0.0), (1, 0, 1.0, 0.0), (1, 1, 1.0, 0.0),
            (1, 1, 2.5, 0.0), (1, 1, 2.5, -0.5), (0, 1, 2.5, -0.5), (0, 0, 1.0, 1.0),
            (0, 0, 1.0, 0.0)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_changing_vectors_and_scalars(fmt, device, rng):
    A = CASES["empty_rows"](rng)      # coo's empty-row pass runs only when beta != 1
    op = make_operator(A, fmt, dtype=DTYPE, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    m, n = A.shape
    xs = [rng.standard_normal(n) for _ in range(2)]
    x_devs = [cla.to_device(op.queue, x.astype(DTYPE)) for x in xs]
    y_devs = [cla.empty(op.queue, m, DTYPE) for _ in range(2)]
    for step, (xi, yi, alpha, beta) in enumerate(SEQUENCE):
        y0 = rng.standard_normal(m).astype(DTYPE) if beta else poisoned(m, DTYPE)
        y_devs[yi].set(y0)
        op.matvec(x_devs[xi], out=y_devs[yi], alpha=alpha, beta=beta)
        check_against_scipy(y_devs[yi].get(), A, xs[xi], DTYPE, alpha, beta, y0)
        if step % 3 == 2:   # a host product in between switches to the staging buffers
            x = rng.standard_normal(n)
            check_against_scipy(op @ x, A, x, DTYPE)


@pytest.mark.parametrize("fmt", ["csr-scalar", "coo", "csr5", "bccoo", "hyb"])
def test_vectors_freed_and_reallocated(fmt, device, rng):
    """New arrays of the same size (the allocator may hand back the same handles)."""
    A = CASES["power_law"](rng)
    op = make_operator(A, fmt, dtype=DTYPE, device=device)
    for _ in range(4):
        x = rng.standard_normal(A.shape[1])
        x_dev = cla.to_device(op.queue, x.astype(DTYPE))
        y_dev = op.matvec(x_dev)
        check_against_scipy(y_dev.get(), A, x, DTYPE)
        del x_dev, y_dev
        gc.collect()


def test_kernel_launched_twice_in_one_product(device, rng):
    """Two launches of one kernel object with different arguments: csr-scalar's kernel
    with alpha 0 (x is zero anyway) and beta 2, then beta 3, scales y by 6."""
    A = CASES["empty_rows"](rng)
    op = psc.SpMV(A, format="csr-scalar", dtype=DTYPE, device=device)
    impl = op._impl
    m = A.shape[0]
    wg = impl.params["work_group_size"]
    geometry = (-(-m // wg) * wg, wg)

    def launches(beta):
        return [impl.step("csr_scalar", *geometry, n_rows=m, alpha=0.0, beta=factor)
                for factor in (2, 3)]

    impl.launches = launches
    y0 = rng.standard_normal(m).astype(DTYPE)
    for _ in range(2):  # the second product reuses the plan
        y_dev = cla.to_device(op.queue, y0)
        op.matvec(cla.zeros(op.queue, A.shape[1], DTYPE), out=y_dev, beta=1.0)
        np.testing.assert_array_equal(y_dev.get(), y0 * DTYPE(6))


def test_steps_bind_arguments_by_name(device, rng):
    """A step naming an argument its kernel lacks is refused, not silently ignored."""
    A = CASES["empty_rows"](rng)
    op = psc.SpMV(A, format="csr-scalar", dtype=DTYPE, device=device)
    impl = op._impl
    impl.launches = lambda beta: [impl.step("csr_scalar", 64, 64, n_rows=A.shape[0],
                                            no_such_argument=1)]
    with pytest.raises(TypeError, match="no_such_argument"):
        op @ np.ones(A.shape[1])


def _out_of_order_queue(device):
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    try:
        return cl.CommandQueue(device.context, device.cl_device, properties=props)
    except cl.Error:
        pytest.skip(f"{device.profile.name} has no out-of-order queues")


@pytest.mark.parametrize("fmt", ["coo", "hyb", "csr5", "bccoo", "sell"])
def test_out_of_order_queue(fmt, device, rng):
    """Every pass of a product, and the copies around it, ordered by events."""
    queue = _out_of_order_queue(device)
    A = CASES["power_law"](rng)
    op = make_operator(A, fmt, dtype=DTYPE, device=queue)
    assert op.queue is queue
    for _ in range(5):
        x = rng.standard_normal(A.shape[1])
        check_against_scipy(op @ x, A, x, DTYPE)
    x = rng.standard_normal(A.shape[1])
    if A.shape[0] == A.shape[1]:
        x_dev = cla.to_device(queue, x.astype(DTYPE))
        z = op.matvec(op.matvec(x_dev)).get()
        check_against_scipy(z, A @ A, x, DTYPE)


@pytest.mark.parametrize("fmt", ["csr-scalar", "coo", "hyb", "csr5", "bccoo"])
def test_out_of_order_queue_products_back_to_back(fmt, device, rng):
    """Independent products on device arrays, enqueued without waiting: each must wait
    for the one before, which may still read the format's scratch arrays (carries
    between kernels) or the copy of x an in-place product multiplies.  Without it
    several products in 16 came out wrong on PoCL (every format in place)."""
    queue = _out_of_order_queue(device)
    A = sp.csr_matrix(CASES["power_law"](rng))[:1500]   # square: in place
    op = make_operator(A, fmt, dtype=DTYPE, device=queue)
    for _ in range(3):
        xs = [rng.standard_normal(A.shape[1]).astype(DTYPE) for _ in range(8)]
        ys = [op.matvec(cla.to_device(queue, x)) for x in xs]
        vs = [cla.to_device(queue, x) for x in xs]
        for v in vs:
            op.matvec(v, out=v, alpha=2.0, beta=-0.5)
        for x, y, v in zip(xs, ys, vs):
            check_against_scipy(y.get(), A, x, DTYPE)
            check_against_scipy(v.get(), A, x, DTYPE, 2.0, -0.5, x)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_auto_measures_on_a_queue_without_profiling(device, rng, tmp_path, monkeypatch):
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(tmp_path / "tuning"))
    database.clear_memory()
    try:
        queue = cl.CommandQueue(device.context, device.cl_device)
        assert not queue.properties & cl.command_queue_properties.PROFILING_ENABLE
        A = CASES["power_law"](rng)
        op = psc.SpMV(A, format="auto", dtype=DTYPE, device=queue, tune="force",
                      tune_budget=30)
    finally:
        database.clear_memory()
    assert op.tuning.source == "measured", op.explanation
    assert "PROFILING" not in op.explanation
    assert op.queue is queue
    x = rng.standard_normal(A.shape[1])
    check_against_scipy(op @ x, A, x, DTYPE)
