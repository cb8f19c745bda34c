"""Online tuning (the default for a new matrix): the operator starts on a CSR kernel at
once, measures in a background thread, switches between two products, stores the
decision; results are right before, during and after the switch, on host and device
vectors and on a user's queue, and values updated during the tuning reach the winner."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from conftest import DEVICES, assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.tuning import database, online

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
DTYPE = np.float32


@pytest.fixture(autouse=True)
def db(tmp_path, monkeypatch):
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(tmp_path / "tuning"))
    monkeypatch.delenv("PYSPMV_CL_TUNE", raising=False)
    database.clear_memory()
    yield
    database.clear_memory()


def matrix(seed=0):
    # >= 100k non-zeros: the size from which the defaults tune.
    return generators.random_uniform(40_000, nnz_per_row=3, seed=seed).astype(DTYPE)


def start_now(op):
    """Make the background measurement start at the next product (the CPU trigger
    waits for many products otherwise)."""
    op.tuning.online.trigger = op.tuning.online.calls + 1


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_defaults_tune_online_and_store_the_decision(device, rng):
    A = matrix()
    op = psc.SpMV(A, device=device)
    assert op.tuning.source == "online" and op.tuning.online.state == "waiting"
    start = online.start_choice(psc.tuning.MatrixFeatures.from_csr(A), device.profile,
                                DTYPE)[0]
    assert op.format == start and op.explanation.startswith("online: starting on")
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.finish_tuning() == "done", op.tuning.online.error
    assert op.explanation.startswith("measured online in")
    online_state = op.tuning.online
    assert online_state.started <= online_state.finished
    assert (op.format != start) == (online_state.switched_at_call is not None)
    for _ in range(3):
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(A, x), A, x, DTYPE)
    again = psc.SpMV(A, device=device)
    assert again.tuning.source == "database" and again.format == op.format


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_device_products_stay_right_across_the_switch(device, rng):
    A = matrix(1)
    op = psc.SpMV(A, device=device, tune="online")
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    x_dev = cla.to_device(op.queue, x.astype(DTYPE))
    y_dev = cla.empty(op.queue, A.shape[0], DTYPE)
    formats = set()
    for _ in range(200):   # products while the thread measures, and after it switched
        op.matvec(x_dev, out=y_dev)
        formats.add(op.format)
        if op.tuning.online.state not in ("waiting", "running") and op._online is None:
            break
    assert_close(y_dev.get(), reference(A, x), A, x, DTYPE)
    op.finish_tuning()
    op.matvec(x_dev, out=y_dev)
    assert_close(y_dev.get(), reference(A, x), A, x, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_values_updated_during_the_tuning_reach_the_winner(device, rng):
    A = matrix(2)
    op = psc.SpMV(A, device=device, tune="online")
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)   # starts the thread
    assert op.tuning.online.state in ("running", "done")
    B = A.copy()
    B.data = rng.standard_normal(A.nnz).astype(DTYPE)
    op.update_values(B.data)            # after the snapshot the candidates come from
    assert_close(op @ x, reference(B, x), B, x, DTYPE)
    assert op.finish_tuning() == "done"
    for _ in range(2):
        assert_close(op @ x, reference(B, x), B, x, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_a_user_queue_without_profiling_is_respected(device, rng):
    queue = cl.CommandQueue(device.context, device.cl_device)
    A = matrix(3)
    op = psc.SpMV(A, device=queue, tune="online")
    assert op.queue is queue
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.finish_tuning() == "done", op.tuning.online.error
    assert op.queue is queue
    assert_close(op @ x, reference(A, x), A, x, DTYPE)


def test_policies():
    """expected_calls or tune=True measure now; tune=False and small matrices use the
    rules; a fixed format has no tuning."""
    device = DEVICES[0]
    A = matrix(4)
    assert psc.SpMV(A, device=device, tune=False).tuning.source == "model"
    assert psc.SpMV(A[:1000], device=device).tuning.source == "model"
    assert psc.SpMV(A, device=device, tune=True, tune_budget=5).tuning.source == "measured"
    op = psc.SpMV(A, format="csr-scalar", device=device)
    assert op.tuning is None and op.finish_tuning() == "none"
    with pytest.raises(ValueError, match="online"):
        psc.SpMV(A, device=device, tune="sometimes")
