"""Online tuning (the default for a new matrix): the operator starts on a CSR kernel at
once, measures in a background thread, switches between two products, stores the
decision; results are right before, during and after the switch, on host and device
vectors and on a user's queue, and values updated during the tuning reach the winner."""

import sys
import threading

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DEVICES, assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.formats import FORMATS
from pyspmv_cl.tuning import database, online

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
DTYPE = np.float32


@pytest.fixture(autouse=True)
def db(empty_tuning_db):
    return empty_tuning_db


def matrix(seed=0):
    # >= 100k non-zeros: the size from which the defaults tune.
    return generators.random_uniform(40_000, nnz_per_row=3, seed=seed).astype(DTYPE)


def start_now(op):
    """Make the background measurement start at the next product (the CPU trigger
    waits for many products otherwise)."""
    op.tuning.online.start_at_next()


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
    # op.tuning tells the decision taken, not the start (a test drive's report)
    assert op.tuning.format == op.format and op.tuning.source == "online"
    assert op.tuning.explanation.startswith("measured online in")
    assert op.tuning.entry and op.tuning.kernel_seconds
    assert any(c["format"] == op.format for c in op.tuning.entry["candidates"])
    online_state = op.tuning.online
    assert online_state.started <= online_state.finished
    assert (op.format != start) == (online_state.switched_at_call is not None)
    for _ in range(3):
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(A, x), A, x, DTYPE)
    again = psc.SpMV(A, device=device)
    assert again.tuning.source == "database"
    again.finish_tuning()   # a winner converting on the host is handed over later
    assert again.format == op.format


def force_switches(op):
    """Replace ``op``'s background measurement by one that hands over a format at once,
    then, once ``release`` is set, returns another as its final winner, each built from
    the snapshot on a queue of its own and finished there (as the measurement's): two
    switches, to neither the start format.  Starts at the next product.  Returns
    ``(offered, release, interim, final)``."""
    from pyspmv_cl.formats.base import instantiate
    from pyspmv_cl.tuning import tuner

    device = op.device
    interim, final = [f for f in ("ell", "coo", "csr-scalar") if f != op.format][:2]
    offered, release = threading.Event(), threading.Event()

    def built(name, snapshot):
        own = device.on_queue(cl.CommandQueue(device.context, device.cl_device))
        cls = FORMATS[name]
        features = psc.tuning.MatrixFeatures.from_csr(snapshot)
        impl = instantiate(cls, snapshot, own, DTYPE,
                           cls.resolve_params(features, device.profile, DTYPE, {}))
        own.queue.finish()
        return impl

    def fake_measurement(snapshot, should_stop, offer, exclusive):
        assert offer(interim, {}, built(interim, snapshot))
        offered.set()
        release.wait(60)
        return tuner.Decision(final, {}, "fake final", "online",
                              impl=built(final, snapshot))

    op.tuning.online._run_measurement = fake_measurement
    start_now(op)
    return offered, release, interim, final


class DeviceProducts:
    """Products on device vectors of ``queue``, each enqueued behind the caller's own
    pending work there: a new ``x`` (doubled) written after a user event that is set
    only once the product is enqueued, then the output poisoned with NaN.  The product
    must neither wait for that work (a hang: a safety timer sets the event after 30 s,
    and the test fails) nor run before it; each output, read back, against scipy's.
    Returns the format that ran."""

    def __init__(self, op, queue, A, rng):
        self.op, self.queue, self.A = op, queue, A
        self.x = rng.standard_normal(A.shape[1]).astype(DTYPE)
        self.x_dev = cla.to_device(queue, self.x)
        self.y_dev = cla.empty(queue, A.shape[0], DTYPE)

    def __call__(self):
        complete = cl.command_execution_status.COMPLETE
        gate = cl.UserEvent(self.queue.context)
        self.x = self.x * 2   # (exact; kept alive until the write is done)
        self.x_dev.add_event(cl.enqueue_copy(self.queue, self.x_dev.base_data, self.x,
                                             wait_for=[gate], is_blocking=False))
        self.y_dev.fill(np.nan)
        fired = []

        def release():
            fired.append(True)
            gate.set_status(complete)

        safety = threading.Timer(30, release)
        safety.start()
        try:
            self.op.matvec(self.x_dev, out=self.y_dev)
        finally:
            safety.cancel()
            safety.join()
            if not fired:
                gate.set_status(complete)
        assert not fired, "the product waited for the caller's pending work"
        assert_close(self.y_dev.get(), reference(self.A, self.x), self.A, self.x, DTYPE)
        return self.op.format


def products_across_forced_switches(op, queue, A, rng, during=1):
    """Device products on ``queue`` (``DeviceProducts``) before, between and after two
    forced switches (``force_switches``), ``during`` of them while the measurement
    holds the interim format, host products too; asserts the switches happened."""
    start = op.format
    offered, release, interim, final = force_switches(op)
    product = DeviceProducts(op, queue, A, rng)
    seen = [product()]   # on the start format; starts the measurement
    assert offered.wait(60) and op.tuning.online.state == "running"
    seen += [product() for _ in range(during)]
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    release.set()
    assert op.tuning.online.wait(60) and op.tuning.online.state == "done"
    seen += [product(), product()]
    assert seen == [start] + [interim] * during + [final] * 2
    assert [fmt for _, fmt in op.tuning.online.switches] == [interim, final]
    assert op.finish_tuning(60) == "done" and op.format == final
    assert op.queue is queue and op._impl.device is op.device
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert product() == final


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_device_products_stay_right_across_the_switch(device, rng):
    """Device vectors on the operator's queue: every product, while the measurement
    runs and after each of two switches (forced: a real measurement may keep the start
    format), matches scipy."""
    A = matrix(1)
    op = psc.SpMV(A, device=device, tune="online")
    products_across_forced_switches(op, op.queue, A, rng, during=5)


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


OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


def user_queue(device, order):
    """A queue of the caller's, without profiling: in order, or out of order (skipped
    where the device has none)."""
    if order == "in-order":
        return cl.CommandQueue(device.context, device.cl_device)
    try:
        return cl.CommandQueue(device.context, device.cl_device, properties=OUT_OF_ORDER)
    except cl.Error:
        pytest.skip(f"{device.cl_device.name.strip()} has no out-of-order queues")


def record_builds(monkeypatch):
    """Every format instance built from now on: ``(format, its queue, thread name)``."""
    from pyspmv_cl.formats.base import SpMVFormat

    built = []
    plain = SpMVFormat.__init__

    def recorded(self, csr, device, *args, **kwargs):
        built.append((type(self).name, device.queue, threading.current_thread().name))
        plain(self, csr, device, *args, **kwargs)

    monkeypatch.setattr(SpMVFormat, "__init__", recorded)
    return built


@pytest.mark.parametrize("order", ["in-order", "out-of-order"])
@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_a_user_queue_without_profiling_is_respected(device, order, rng, monkeypatch):
    """A caller's queue (no profiling; in order or out of order) stays the operator's
    through a real online measurement: products on host vectors and on device vectors
    of that queue (after the caller's pending work there) are right before and after
    it; the start format is built on that queue, and no candidate is built or
    converted there (each on the measurement's own queue)."""
    queue = user_queue(device, order)
    built = record_builds(monkeypatch)
    A = matrix(3)
    op = psc.SpMV(A, device=queue, tune="online")
    assert op.queue is queue
    assert [q for _, q, _ in built] == [queue]   # the start format: the caller's queue
    del built[:]
    start_now(op)
    product = DeviceProducts(op, queue, A, rng)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)   # starts the measurement
    product()
    assert op.finish_tuning() == "done", op.tuning.online.error
    assert op.queue is queue
    assert not queue.properties & cl.command_queue_properties.PROFILING_ENABLE
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    product()
    assert built, "no candidate was built"
    on_callers = [(fmt, thread) for fmt, q, thread in built if q is queue]
    assert not on_callers, on_callers
    assert all(q.context == queue.context for _, q, _ in built)


@pytest.mark.parametrize("order", ["in-order", "out-of-order"])
@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_forced_switches_on_a_user_queue(device, order, rng):
    """Two switches (forced) of an operator on a caller's queue, in order or out of
    order: device products on that queue, poisoned, each after the caller's pending
    work there, match scipy before, between and after them; the queue stays the
    operator's."""
    queue = user_queue(device, order)
    A = matrix(6)
    op = psc.SpMV(A, device=queue, tune="online")
    products_across_forced_switches(op, queue, A, rng)


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


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_structure_hashed_only_when_the_database_may_hold_it(device, rng, monkeypatch):
    """Setup on a new matrix reads no index twice: the structure hash waits for the
    background measurement (which stores under it); a database holding an entry of the
    same shape makes the next operator hash and find it; a same-shape matrix of another
    structure is hashed, not found, and measured anew."""
    from pyspmv_cl.tuning import tuner

    calls = []
    real = tuner.structure_digest
    monkeypatch.setattr(tuner, "structure_digest",
                        lambda csr: calls.append(threading.current_thread().name)
                        or real(csr))
    A = matrix()
    op = psc.SpMV(A, device=device)
    assert calls == []           # nothing hashed before the first product
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.finish_tuning() == "done", op.tuning.online.error
    assert calls == ["pyspmv_cl-online-tuning"]   # hashed in the background, to store
    again = psc.SpMV(A, device=device)
    assert again.tuning.source == "database" and calls[1:] == ["MainThread"]
    other = A.copy()
    other.indices = other.indices[::-1].copy()  # same shape and row lengths, new columns
    other.has_sorted_indices = False
    third = psc.SpMV(other, device=device)
    assert third.tuning.source == "online" and len(calls) == 3
    assert_close(third @ x, reference(other, x), other, x, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_measure_hands_over_a_faster_candidate_and_never_touches_it_again(device,
                                                                        monkeypatch):
    """``offer``: a first-pass candidate faster than the included start by the margin is
    handed over at once; it is left out of the re-timed finalists (the caller owns it),
    and the winner returned is None when it is the handed-over one."""
    from pyspmv_cl.tuning import tuner

    A = matrix()
    features = psc.tuning.MatrixFeatures.from_csr(A)
    timed = []

    def fake_time(self, impl, best=None, **kw):   # csr-scalar slow, every other fast
        timed.append(impl)
        return [2e-3 if type(impl).name == "csr-scalar" else 1e-3]

    monkeypatch.setattr(tuner._Bench, "time", fake_time)
    handed = []
    entry, impl, chosen = tuner.measure(
        A, features, device, DTYPE, budget=30, max_formats=2, alternatives=False,
        include=[("csr-scalar", {})],
        offer=lambda fmt, params, built: handed.append((fmt, params, built)) or True)
    assert entry["candidates"][0]["format"] == "csr-scalar"   # the start, timed first
    assert len(handed) == 1 and handed[0][0] != "csr-scalar"
    assert sum(c.get("handed_over", False) for c in entry["candidates"]) == 1
    assert timed.count(handed[0][2]) == 1   # timed once, before the hand-over; never after
    text = tuner._describe(entry, chosen, None, "measured")
    if chosen.get("handed_over"):
        assert impl is None
        # (not named the best of finalists it was never re-timed with)
        assert f"{chosen['format']} was handed over at its first pass" in text, text
    else:
        assert impl is not None and impl is not handed[0][2]
        assert f"{chosen['format']} has the lowest" in text, text


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_operator_switches_to_a_handed_over_candidate_while_measuring(device, rng):
    """The operator takes a handed-over candidate at its next product while the
    measurement still runs, then the final winner; results are right at each stage."""
    from pyspmv_cl.formats import FORMATS
    from pyspmv_cl.formats.base import instantiate
    from pyspmv_cl.tuning import tuner

    A = matrix()
    features = psc.tuning.MatrixFeatures.from_csr(A)

    own = device.on_queue(cl.CommandQueue(device.context))   # as the measurement's

    def built(name):
        cls = FORMATS[name]
        return instantiate(cls, A, own, DTYPE,
                           cls.resolve_params(features, device.profile, DTYPE, {}))

    offered, release = threading.Event(), threading.Event()

    intervals = []

    def fake_measurement(snapshot, should_stop, offer, exclusive):
        intervals.append(sys.getswitchinterval())
        assert offer("sell", {}, built("sell"))
        offered.set()
        release.wait(60)
        return tuner.Decision("ell", {}, "fake final", "online", impl=built("ell"))

    before = sys.getswitchinterval()
    op = psc.SpMV(A, device=device)
    tuning = op.tuning.online
    tuning._run_measurement = fake_measurement
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)   # starts the measurement
    assert offered.wait(60) and tuning.state == "running"
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.format == "sell" and "switched to sell" in op.explanation
    assert op._impl.device is op.device   # the operator's from now on
    release.set()
    assert op.finish_tuning(60) == "done"
    # (on a GPU the explanation also carries the numbering hint, a scattered matrix's)
    assert op.format == "ell" and op.explanation == "fake final" + op._numbering_hint
    assert [fmt for _, fmt in tuning.switches] == ["sell", "ell"]
    # The caller's thread gets the GIL back quickly while the measurement runs; the
    # interpreter's own switch interval is restored afterwards.
    assert intervals == [pytest.approx(online.TUNING_SWITCH_INTERVAL, abs=1e-6)]
    assert sys.getswitchinterval() == before
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_a_switch_inside_a_block_product_to_a_format_without_block_kernels(device, where,
                                                                          rng):
    """The switch is taken at the launch of a block product routed to the start
    format's block kernels; a winner without them (coo) runs that product its own way.
    It raised a bare StopIteration from the block plan (a test drive)."""
    from pyspmv_cl.formats import FORMATS
    from pyspmv_cl.formats.base import instantiate
    from pyspmv_cl.tuning import tuner

    A = matrix()
    features = psc.tuning.MatrixFeatures.from_csr(A)
    own = device.on_queue(cl.CommandQueue(device.context))

    def fake_measurement(snapshot, should_stop, offer, exclusive):
        cls = FORMATS["coo"]
        impl = instantiate(cls, A, own, DTYPE,
                           cls.resolve_params(features, device.profile, DTYPE, {}))
        return tuner.Decision("coo", {}, "fake final", "online", impl=impl)

    op = psc.SpMV(A, device=device)
    assert op.has_block_kernels and not FORMATS["coo"].block_widths
    tuning = op.tuning.online
    tuning._run_measurement = fake_measurement
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)   # starts the measurement
    assert tuning.wait(60) and tuning.state == "done" and op.format != "coo"
    X = rng.standard_normal((A.shape[1], 3))
    if where == "host":
        Y = op @ X
    else:
        Y = op.matmat(cla.to_device(op.queue, X.astype(DTYPE)),
                      out=cla.to_device(op.queue, np.full((A.shape[0], 3), np.nan,
                                                          DTYPE))).get()
    assert op.format == "coo"   # switched inside that product
    assert_close(Y, reference(A, X), A, X, DTYPE)
    assert_close(op @ X, reference(A, X), A, X, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_online_measure_checks_candidates_against_the_start_format(device, monkeypatch):
    """An online measurement checks candidates against the start format's product (no
    float64 pass on the host): a candidate computing 2A is skipped as wrong."""
    from pyspmv_cl.formats import FORMATS
    from pyspmv_cl.tuning import tuner

    class Doubled(FORMATS["csr-scalar"]):   # a broken format: values doubled
        name = "doubled"

        def convert(self, csr):
            arrays = super().convert(csr)
            return {**arrays, "values": arrays["values"] * 2}

    def no_scipy(self):
        raise AssertionError("the online check computed scipy's reference")

    monkeypatch.setattr(tuner._Bench, "_scipy_reference", no_scipy)
    A = matrix()
    features = psc.tuning.MatrixFeatures.from_csr(A)
    registry = {"csr-scalar": FORMATS["csr-scalar"], "doubled": Doubled,
                "csr-vector": FORMATS["csr-vector"]}
    entry, impl, chosen = tuner.measure(
        A, features, device, DTYPE, budget=30, registry=registry, alternatives=False,
        include=[("csr-scalar", {})], offer=lambda *a: False)
    measured = {c["format"] for c in entry["candidates"]}
    assert "csr-scalar" in measured and "csr-vector" in measured
    assert "doubled" not in measured
    assert any(name == "doubled" and "wrong result" in why for name, why in entry["skipped"])


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_a_stored_winner_converting_on_the_host_is_handed_over(device, rng):
    """A database hit on a format converted on the host (bccoo of 2 x 1 blocks, on
    every device) starts on the CSR kernel and converts the winner in the background;
    expected_calls= or tune=True convert it before the first product instead.  Results
    are right throughout."""
    from pyspmv_cl.features import shape_fingerprint, structure_digest

    A = matrix()
    features = psc.tuning.MatrixFeatures.from_csr(A)
    fp = {**shape_fingerprint(features), "structure_sha256": structure_digest(A)}
    key = database.entry_key(device.profile, fp, np.dtype(DTYPE).name)
    database.store(key, {"candidates": [
        {"format": "bccoo", "params": {"block_height": 2}, "kernel_seconds": 1e-6,
         "conversion_seconds": 0.01, "confirmed": True},
        {"format": "csr-scalar", "params": {}, "kernel_seconds": 2e-6,
         "conversion_seconds": 0.0, "confirmed": True}], "skipped": [],
        "tuning_seconds": 0.1, "created": "2026-11-23 00:00:00 UTC", "fingerprint": fp})
    start = online.start_choice(features, device.profile, DTYPE)[0]
    op = psc.SpMV(A, device=device)
    assert op.tuning.source == "database" and op.format == start
    assert "bccoo converts in the background" in op.explanation
    trigger = op.tuning.online.trigger   # the explanation says when it starts
    assert (f"after {trigger} products" if trigger > 1 else "after the first product") \
        in op.explanation
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.finish_tuning(60) == "done"
    assert op.format == "bccoo" and op.explanation.startswith("tuning database")
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    for kwargs in ({"expected_calls": 10**6}, {"tune": True}):
        now = psc.SpMV(A, device=device, **kwargs)
        assert now.format == "bccoo" and now.tuning.online is None, kwargs
        assert_close(now @ x, reference(A, x), A, x, DTYPE)


def test_a_stored_bccoo_winner_on_a_gpu_is_handed_over_only_for_a_host_shape(rng):
    """On a GPU, bccoo's 1 x 1 blocks convert on the device: a stored winner of that
    shape is built before SpMV returns; one of 2 x 1 blocks converts on the host and is
    handed over in the background."""
    from pyspmv_cl.features import shape_fingerprint, structure_digest

    gpu = DEVICES[0].override(device_type="gpu")
    A = matrix(4)
    features = psc.tuning.MatrixFeatures.from_csr(A)
    fp = {**shape_fingerprint(features), "structure_sha256": structure_digest(A)}
    key = database.entry_key(gpu.profile, fp, np.dtype(DTYPE).name)
    x = rng.standard_normal(A.shape[1])
    for params, at_once in (({"block_height": 2}, False), ({}, True)):
        database.store(key, {"candidates": [
            {"format": "bccoo", "params": params, "kernel_seconds": 1e-6,
             "conversion_seconds": 0.01, "confirmed": True}], "skipped": [],
            "tuning_seconds": 0.1, "created": "2026-11-26 00:00:00 UTC", "fingerprint": fp})
        op = psc.SpMV(A, device=gpu)
        assert op.tuning.source == "database"
        assert (op.format == "bccoo") == at_once, params
        if at_once:
            assert op._impl.converting_on_device and op.tuning.online is None
        else:
            assert "bccoo converts in the background" in op.explanation
            assert op.finish_tuning(60) == "done" and op.format == "bccoo"
            assert not op._impl.converting_on_device
            assert op.params["block_height"] == 2
        assert_close(op @ x, reference(A, x), A, x, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_a_stored_winner_of_the_start_format_is_built_at_once(device, rng):
    """A database hit whose winner is the online start's own format (sell on CPUs, with
    other parameters) is built before SpMV returns, with the stored parameters: it
    converts as fast as the start would, so there is nothing to hand over."""
    from pyspmv_cl.features import shape_fingerprint, structure_digest

    A = matrix(3)
    features = psc.tuning.MatrixFeatures.from_csr(A)
    start = online.start_choice(features, device.profile, DTYPE)[0]
    params = ({"slice_height": 4, "sigma": 64} if start == "sell"
              else {"work_group_size": 64})
    fp = {**shape_fingerprint(features), "structure_sha256": structure_digest(A)}
    key = database.entry_key(device.profile, fp, np.dtype(DTYPE).name)
    database.store(key, {"candidates": [
        {"format": start, "params": params, "kernel_seconds": 1e-6,
         "conversion_seconds": 0.01, "confirmed": True}], "skipped": [],
        "tuning_seconds": 0.1, "created": "2026-11-25 00:00:00 UTC", "fingerprint": fp})
    op = psc.SpMV(A, device=device)
    assert op.tuning.source == "database" and op.tuning.online is None
    assert op.format == start
    assert all(op.params[k] == v for k, v in params.items()), op.params
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_measures_in_the_callers_thread_where_the_device_runs_commands_there(
        device, rng, monkeypatch):
    """On a device that runs commands in the enqueuing thread (PoCL's basic driver,
    which deadlocks when two threads enqueue at once) no thread is started: the product
    that reaches the trigger measures, and returns with the measurement done."""
    from pyspmv_cl.tuning import tuner

    monkeypatch.setattr(tuner, "runs_in_calling_thread", lambda device: True)
    A = matrix(7)
    op = psc.SpMV(A, device=device, tune="online")
    tuning = op.tuning.online
    assert tuning.inline and tuning.state == "waiting"
    start_now(op)
    before = threading.active_count()
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert tuning._thread is None and threading.active_count() == before
    assert tuning.state == "done", tuning.error
    for _ in range(2):   # the switch, if any, at the next product
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.finish_tuning() == "done"
    assert op.format == tuning.decision.format


SELL_LAYOUTS = [{}, {"mapping": "rows", "slice_height": 4, "threads_per_row": 2},
                {"mapping": "slices", "slice_height": 8, "sigma": 64},
                {"slice_height": 2, "sigma": 1}, {"col_bits": 16},
                {"value_bits": 16}]


@pytest.mark.parametrize("params", SELL_LAYOUTS, ids=str)
def test_sell_snapshot_gives_back_the_csr(params, rng):
    """CPUs start online tuning on sell, so the measurement's snapshot reads a sell
    operator back as CSR (``read_csr``): every slice height, sort window and mapping, compressed
    columns, half values (as stored), empty rows, a row count no multiple of C."""
    device = DEVICES[0]
    m, n = 203, 150
    A = sp.random(m, n, density=0.04, format="lil", random_state=int(rng.integers(1 << 30)),
                  dtype=np.float64)
    A[5, :] = 0
    A[7, :] = rng.standard_normal(n)   # a full row
    A = sp.csr_matrix(A)
    op = psc.SpMV(A, "sell", device=device, dtype=DTYPE, **params)
    indptr, indices, data = op._impl.read_csr(op.queue)[0]
    want = A.astype(DTYPE)
    stored = want.data.astype(np.float16) if params.get("value_bits") == 16 else want.data
    assert np.array_equal(indptr, want.indptr)
    assert np.array_equal(indices, want.indices)
    assert np.array_equal(data, stored.astype(DTYPE))


def test_gpu_trigger_waits_until_products_pay_for_the_measurement():
    """GPUs: the measurement starts once what a switch might have saved the products
    run (GPU_SWITCH_GAIN of their kernel time) adds up to what it costs them
    (GPU_MEASUREMENT_SECONDS_PER_MNNZ): sooner for wider values (each product costs
    more); a known winner's conversion starts at once; CPUs keep their budget rule."""
    from types import SimpleNamespace

    from pyspmv_cl.tuning import online
    gpu = DEVICES[0].override(device_type="gpu").profile
    cpu = DEVICES[0].override(device_type="cpu").profile

    def features(nnz):
        return SimpleNamespace(nnz=nnz, n_rows=nnz // 14, n_cols=nnz // 14)

    big, small = features(20_000_000), features(50_000)
    f32 = online.trigger_calls(big, gpu, np.float32, 1.0)
    f64 = online.trigger_calls(big, gpu, np.float64, 1.0)
    kernel = (20_000_000 * 8 + 2 * (20_000_000 // 14) * 4) / online.GPU_BYTES_PER_SECOND
    assert f32 == int(np.ceil(online.GPU_MEASUREMENT_SECONDS_PER_MNNZ * 20
                              / (online.GPU_SWITCH_GAIN * kernel)))
    assert 10_000 < f64 < f32 < 30_000   # a solve of 10,000 products is not disturbed
    assert 10_000 < online.trigger_calls(small, gpu, np.float32, 1.0) < 30_000
    assert online.trigger_calls(big, gpu, np.float32, 1.0, measuring=False) == 1
    assert online.trigger_calls(big, cpu, np.float32, 1.0) == \
        online.trigger_calls(big, cpu, np.float32, 1.0, measuring=False) > 1


def test_gpu_online_leaves_out_host_conversions_but_the_rules_choice(rng):
    """On GPUs the online measurement times no candidate that converts on the host
    (bccoo's shapes but 1 x 1; dia on a matrix with duplicates, unless the rules choose
    it), and says so; the measuring tuner and CPUs time them.  Every operator still
    multiplies right after the switch."""
    from pyspmv_cl.tuning import tuner
    gpu = DEVICES[0].override(device_type="gpu")
    # Every format converts on the device, in some cases at least.
    assert all(c.converts_on_device for c in FORMATS.values())
    assert not online.host_conversions(gpu.profile)
    assert online.host_conversions(DEVICES[0].override(device_type="cpu").profile)

    A = matrix(seed=3)
    op = psc.SpMV(A, device=gpu, tune="online")
    assert op.finish_tuning() == "done", op.tuning.online.error
    entry = op.tuning.online.decision.entry
    assert all(c["resolved"]["block_height"] == c["resolved"]["block_width"] == 1
               for c in entry["candidates"] if c["format"] == "bccoo")
    left = {name for name, why in entry["skipped"] if why == tuner.HOST_CONVERSION_LEFT_OUT}
    assert all(name.startswith("bccoo ") for name in left), left
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)

    # A stencil with a duplicate entry: dia converts it on the host (its layers), yet
    # the GPU rules choose dia, which is then timed (first, as the rules' choice).
    S = generators.poisson2d(320).astype(DTYPE).tocsr()
    S.indices[S.indptr[7] + 1] = S.indices[S.indptr[7]]
    S.has_canonical_format = False
    assert not FORMATS["dia"].device_conversion_takes(S, {}, DTYPE)
    f = psc.tuning.MatrixFeatures.from_csr(S)
    from pyspmv_cl.tuning import heuristics
    assert heuristics.choose_format(f.with_diagonals(S), gpu.profile, DTYPE)[0] == "dia"
    entry, _, _ = tuner.measure(S, f, gpu, DTYPE, budget=30, max_formats=3,
                                alternatives=False, host_conversions=False)
    assert "dia" in {c["format"] for c in entry["candidates"]}
    assert all(name.startswith("bccoo ") for name, why in entry["skipped"]
               if why == tuner.HOST_CONVERSION_LEFT_OUT)


def test_gpu_online_times_bccoo_only_where_it_converts_on_the_device(rng):
    """bccoo converts 1 x 1 blocks on the device and other shapes on the host: with
    host conversions left out (online tuning on GPUs), its other shapes are skipped and
    said to be; the measuring tuner times them."""
    from pyspmv_cl.tuning import tuner
    gpu = DEVICES[0].override(device_type="gpu")
    A = matrix(seed=5)
    f = psc.tuning.MatrixFeatures.from_csr(A)
    registry = {"bccoo": FORMATS["bccoo"]}
    shapes = [{"block_height": 1, "block_width": 1}, {"block_height": 2, "block_width": 1}]
    entries = {}
    for host in (False, True):
        entries[host], _, _ = tuner.measure(A, f, gpu, DTYPE, budget=30, registry=registry,
                                            include=[("bccoo", p) for p in shapes],
                                            alternatives=False, host_conversions=host)
    timed = {host: {(c["resolved"]["block_height"], c["resolved"]["block_width"])
                    for c in entries[host]["candidates"]} for host in entries}
    assert timed[False] == {(1, 1)}
    assert {(1, 1), (2, 1)} <= timed[True]
    left = [name for name, why in entries[False]["skipped"]
            if why == tuner.HOST_CONVERSION_LEFT_OUT]
    assert any("block_height" in name and name.startswith("bccoo ") for name in left), left


# -- timing bursts: the caller's products kept off the device while a candidate is timed --

class _Event:
    """A stand-in for a caller's product event: running for ``polls`` status reads
    (None: never ends)."""

    def __init__(self, polls):
        self.polls, self.reads = polls, 0

    @property
    def command_execution_status(self):
        self.reads += 1
        return 1 if self.polls is None or self.reads <= self.polls else 0


class _Queue:
    def __init__(self):
        self.flushes = 0

    def flush(self):
        self.flushes += 1


def _tuning():
    return online.OnlineTuning(lambda *args: None, budget=1.0, trigger=10**9,
                               start=("csr-vector", {}))


def test_a_timing_burst_starts_after_the_callers_last_product():
    """``exclusive`` flushes the caller's queue (an unflushed product may never start)
    and waits for the last product to end before the burst runs."""
    tuning = _tuning()
    queue, event = _Queue(), _Event(polls=3)
    tuning.note_call(None, 0, queue, event)
    with tuning.exclusive():
        assert event.reads == 4 and queue.flushes == 1   # 3 reads running, then done
        assert tuning._bursting
    assert not tuning._bursting


def test_a_timing_burst_waits_a_bounded_time_for_a_product_that_does_not_end(monkeypatch):
    """A product waiting on an event the caller sets later must not hang the measurement
    (nor the caller, whose next product waits for the burst): the burst times anyway
    after ``EXCLUSIVE_WAIT``."""
    import time

    monkeypatch.setattr(online, "EXCLUSIVE_WAIT", 0.05)
    tuning = _tuning()
    tuning.note_call(None, 0, _Queue(), _Event(polls=None))
    t0 = time.perf_counter()
    with tuning.exclusive():
        waited = time.perf_counter() - t0
    assert 0.05 <= waited < 5


def test_the_callers_products_wait_out_a_timing_burst():
    """While a burst runs, a product of the caller waits at ``product_slot``; it goes on
    when the burst ends.  Outside a running measurement nothing waits."""
    tuning = _tuning()
    with tuning.exclusive():   # not running: the caller is not held
        with tuning.product_slot():
            pass
    tuning.state = "running"
    entered = threading.Event()

    def caller():
        with tuning.product_slot():
            entered.set()

    with tuning.exclusive():
        thread = threading.Thread(target=caller)
        thread.start()
        assert not entered.wait(0.2)   # held for the whole burst
    assert entered.wait(10)
    thread.join(10)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_no_product_of_the_caller_is_enqueued_during_a_timing_burst(device, rng):
    """A real operator with a measurement that holds three bursts: the caller's products
    (host vectors, one after another) go on between them, none inside one, and stay
    right."""
    import time

    from pyspmv_cl.tuning import tuner

    A = matrix()
    bursts, done = [], threading.Event()

    def fake_measurement(snapshot, should_stop, offer, exclusive):
        for _ in range(3):
            with exclusive():
                t0 = time.perf_counter()
                time.sleep(0.05)
                bursts.append((t0, time.perf_counter()))
            time.sleep(0.02)
        done.set()
        return tuner.Decision("csr-vector", {}, "fake final", "online")

    op = psc.SpMV(A, device=device)
    tuning = op.tuning.online
    tuning._run_measurement = fake_measurement
    start_now(op)
    enqueued = []
    plain = op._enqueue

    def recorded(*args):
        enqueued.append(time.perf_counter())
        return plain(*args)

    op._enqueue = recorded
    x = rng.standard_normal(A.shape[1])
    y_ref = reference(A, x)
    deadline = time.perf_counter() + 60
    while not done.is_set() and time.perf_counter() < deadline:
        assert_close(op @ x, y_ref, A, x, DTYPE)
    assert done.is_set() and op.finish_tuning(60) == "done"
    assert len(bursts) == 3 and len(enqueued) > 3
    inside = [t for t in enqueued for a, b in bursts if a <= t <= b]
    assert not inside
    assert any(b1 < t < a2 for t in enqueued for (_, b1), (a2, _) in zip(bursts, bursts[1:]))


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_candidates_convert_on_the_measurements_queue(device, rng, monkeypatch):
    """The candidates are uploaded and converted on the measurement's own queue (the
    caller's products must not wait behind them in the caller's queue); the winner the
    operator takes is then its own, on its device."""
    from pyspmv_cl.tuning import tuner

    queues = []
    plain = tuner.instantiate

    def recorded(cls, csr, on, dtype, params, *rest):
        queues.append(on.queue)
        return plain(cls, csr, on, dtype, params, *rest)

    monkeypatch.setattr(tuner, "instantiate", recorded)
    A = matrix()
    op = psc.SpMV(A, device=device, format="auto")
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.finish_tuning(120) == "done"
    assert queues and all(q is not op.queue and q.context == op.queue.context
                          for q in queues)
    assert op._impl.device is op.device
    assert_close(op @ x, reference(A, x), A, x, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_candidates_share_one_upload_of_the_matrix(device, rng, monkeypatch):
    """On a GPU the candidates that convert on the device share one upload of the host
    matrix (each upload held up the caller's products on NVIDIA); each counts its time
    in its conversion, and the winner keeps its own arrays: its products stay right
    once the measurement (and the shared upload) is gone."""
    from pyspmv_cl.device_inputs import DeviceCSR
    from pyspmv_cl.tuning import tuner

    gpu = device.override(device_type="gpu")
    uploads = []
    plain = DeviceCSR.upload.__func__

    def counted(cls, *args, **kwargs):
        uploads.append(kwargs.get("owned", False))
        return plain(cls, *args, **kwargs)

    monkeypatch.setattr(DeviceCSR, "upload", classmethod(counted))
    A = matrix()
    features = psc.tuning.MatrixFeatures.from_csr(A)
    registry = {name: FORMATS[name] for name in ("csr-vector", "sell", "ell")}
    entry, impl, chosen = tuner.measure(A, features, gpu, DTYPE, budget=30,
                                        registry=registry, alternatives=False)
    assert sorted(c["format"] for c in entry["candidates"]) == sorted(registry)
    assert uploads == [False]   # one upload, not handed to any candidate to keep
    assert all(c["conversion_seconds"] > 0 for c in entry["candidates"])
    x = rng.standard_normal(A.shape[1]).astype(DTYPE)
    x_dev = cla.to_device(gpu.queue, x)
    y_dev = cla.to_device(gpu.queue, np.full(A.shape[0], np.nan, DTYPE))
    impl.enqueue(gpu.queue, x_dev.data, y_dev.data, 1.0, 0.0).wait()
    assert_close(y_dev.get(), reference(A, x), A, x, DTYPE)


@pytest.mark.parametrize("device", DEVICES[:1], ids=[d.id for d in DEVICES[:1]])
def test_snapshot_and_upload_go_through_pinned_staging_on_a_gpu(device, rng, monkeypatch):
    """Where the device has memory of its own (a GPU), the snapshot is read back and
    the candidates' one upload made through a small pinned buffer (a copy into or out
    of pageable memory held up the caller's products); the decision and the products
    stay right."""
    from pyspmv_cl.device import Device
    from pyspmv_cl.pinned_staging import PinnedStaging

    used = {"read": 0, "write": 0}
    for name in used:
        plain = getattr(PinnedStaging, name)

        def counted(self, *args, _plain=plain, _name=name):
            used[_name] += 1
            return _plain(self, *args)

        monkeypatch.setattr(PinnedStaging, name, counted)
    monkeypatch.setattr(Device, "shares_host_memory", property(lambda self: False))
    A = matrix()
    gpu = device.override(device_type="gpu")   # starts on csr-vector: read as it is
    op = psc.SpMV(A, device=gpu, format="auto")
    assert op.tuning.online.start[0] == "csr-vector"
    # 16-bit columns (the adaptive mapping where they fit): each row's base read too.
    snapshot_reads = 4 if op.params.get("col_bits") == 16 else 3
    start_now(op)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert op.finish_tuning(120) == "done" and op.tuning.online.error is None
    timed = len(op.tuning.online.decision.entry["candidates"])
    # the CSR arrays; then each candidate's result, and the start's (reference)
    assert used["read"] == snapshot_reads + timed + 1
    assert used["write"] == 3 + 1   # the same once for every candidate, and x
    assert_close(op @ x, reference(A, x), A, x, DTYPE)
