"""Tuning for block products (``block_size=k``), beyond test_tuner.py's block tests:
every candidate timed on a product of k different vectors as the operator runs it
(block kernels, else column by column through the operator's strided copy,
formats/columns.py) and its result checked against scipy's ``A @ X``; results of
operators tuned for k against scipy in float64.  Small matrices and short budgets keep
each tuning well under a second on PoCL."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from conftest import DEVICES, assert_cclose, assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats import FORMATS
from pyspmv_cl.formats import columns as columns_module
from pyspmv_cl.formats.base import SpMVFormat
from pyspmv_cl.formats.lanes import CSR_REGULAR_SPREAD, CSR_SHORT_ROWS
from pyspmv_cl.tuning import database, tuner

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
DTYPE = np.float64 if DEVICES and DEVICES[0].profile.fp64 else np.float32
BUDGET = 0.5


@pytest.fixture(autouse=True)
def db(empty_tuning_db):
    return empty_tuning_db


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
    the operator's column path (one transpose of X in, one of Y out, per block product)."""
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
    monkeypatch.setattr(columns_module.Transpose, "enqueue",
                        counting("transpose", columns_module.Transpose.enqueue))
    A = random_values(generators.random_uniform(300, 280, 4, seed=3), rng)
    entry, impl, chosen = measure(A, ("csr-scalar", "coo"), 5)
    products = {c["format"]: c["product"] for c in entry["candidates"]}
    assert products == {"csr-scalar": "block kernels", "coo": "column by column"}
    assert entry["block_size"] == 5
    assert calls.get("csr-scalar/block", 0) > 0 and "csr-scalar/vector" not in calls
    assert "coo/block" not in calls
    assert calls["coo/vector"] > 0 and calls["coo/vector"] % 5 == 0
    assert calls["transpose"] == 2 * calls["coo/vector"] // 5
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

    def short_columns(path, queue, product, x_buf, y_buf, staging, shape, k, *args, **kw):
        def short_product(x_column, y_column, waits):   # Y's last column left unwritten
            done.append(None)
            return product(x_column, y_column, waits) if len(done) % k else \
                cl.enqueue_marker(queue, wait_for=waits)

        return columns_module.columns_product(path, queue, short_product, x_buf, y_buf,
                                              staging, shape, k, *args, **kw)

    done = []

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


# -- the model and the rules ------------------------------------------------------------

def gpu_device():
    """The test device with a GPU profile (the lanes kernels, csr-vector's adaptive
    mapping, the GPU rules); its kernels still run on the device."""
    return DEVICES[0].override(device_type="gpu")


def skewed(rng):
    """Short rows and one of 5000 entries: the GPU rules' coo (skewed rows)."""
    import scipy.sparse as sp
    A = sp.random(6000, 6000, density=3 / 6000, format="lil", random_state=rng.integers(2**31))
    A[0, :5000] = 1.0
    return random_values(A, rng)


BLOCK_VARIANTS = [
    ("csr-scalar", {}), ("csr-scalar", {"block_mapping": "items"}),
    ("csr-scalar", {"block_mapping": "lanes"}),
    ("csr-vector", {"mapping": "rows"}), ("csr-vector", {"mapping": "adaptive"}),
    ("csr-vector", {"mapping": "adaptive", "block_mapping": "items"}),
    ("csr-vector", {"mapping": "adaptive", "block_mapping": "lanes"}),
    ("csr-vector", {"mapping": "merge", "block_mapping": "items"}),
    ("csr-vector", {"mapping": "merge", "block_mapping": "lanes"}),
    ("ell", {}), ("sell", {}), ("sell", {"mapping": "slices", "slice_height": 8}),
    ("coo", {}), ("dia", {}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("on_gpu", [False, True])
def test_block_widths_known_before_building(on_gpu, dtype, rng):
    """``block_widths_for`` (the tuner's and the rules' view, nothing built) agrees
    with the built operator's ``supported_block_widths`` for every block format, the
    lanes and the items kernels, csr-vector's mappings, real and complex values; and
    the operator multiplies blocks right."""
    device = gpu_device() if on_gpu else DEVICES[0]
    A = random_values(generators.banded(300, 2), rng)
    X = rng.standard_normal((300, 5))
    if np.dtype(dtype).kind == "c":
        A = A + 1j * random_values(A, rng)
        X = X + 1j * rng.standard_normal(X.shape)
    f = MatrixFeatures.from_csr(A)
    seen = set()
    for name, params in BLOCK_VARIANTS:
        op = psc.SpMV(A, name, dtype=dtype, device=device, **params)
        predicted = FORMATS[name].block_widths_for(f, device.profile, dtype, params)
        assert predicted == op._impl.supported_block_widths(), (name, params)
        assert (1 in predicted) == op.has_block_kernels
        seen.add(op.has_block_kernels)
        assert_cclose(op @ X, A.astype(np.complex128) @ X, A, X, dtype)
    assert seen == {True, False}
    assert FORMATS["csr-vector"].block_widths_for(f, device.profile, dtype,
                                                  {"mapping": "nonsense"}) == ()


def test_passes_and_ranking_for_k():
    cpu = DEVICES[0].profile.replace(device_type="cpu")   # whatever the test device is
    gpu = gpu_device().profile
    stencil = generators.poisson2d(100).tocsr()
    f = MatrixFeatures.from_csr(stencil).with_diagonals(stencil)
    passes = tuner.block_passes
    assert passes(FORMATS["sell"], f, gpu, np.float32, {}, 33) == 2      # lanes: 32, 1
    assert passes(FORMATS["sell"], f, gpu, np.complex64, {}, 33) == 2    # lanes: 32, 1
    assert passes(FORMATS["sell"], f, cpu, np.float32, {}, 33) == 3      # 16, 16, 1
    assert passes(FORMATS["sell"], f, cpu, np.complex64, {}, 33) == 5    # 8, 8, 8, 8, 1
    assert passes(FORMATS["coo"], f, gpu, np.float32, {}, 33) == 33
    assert passes(FORMATS["csr-vector"], f, gpu, np.float32,
                  {"mapping": "adaptive", "block_mapping": "items"}, 33) == 33
    assert passes(FORMATS["csr-vector"], f, gpu, np.float32, {"mapping": "adaptive"}, 33) == 2
    assert passes(FORMATS["coo"], f, gpu, np.float32, {}, 1) == 1
    for profile in (cpu, gpu):
        order, _ = tuner.rank_candidates(f, profile, np.float32, dict(FORMATS), "sell",
                                         block_size=16)
        blocks = [1 in FORMATS[n].block_widths_for(f, profile, np.float32, p[0])
                  for n, p in order]
        assert any(blocks) and not all(blocks)
        assert blocks == sorted(blocks, reverse=True)   # every block format first
    # A caller's block_mapping="items" on a GPU: csr-vector's row mapping (block
    # kernels) is timed first, the adaptive one (none with items) after it.
    order, _ = tuner.rank_candidates(f, gpu, np.float32, dict(FORMATS), "sell",
                                     block_size=16, user_params={"block_mapping": "items"})
    first = dict(order)["csr-vector"][0]
    assert first["mapping"] == "rows"
    order, _ = tuner.rank_candidates(f, gpu, np.float32, dict(FORMATS), "sell")
    assert dict(order)["csr-vector"][0]["mapping"] == "adaptive"   # k = 1: as before


def test_lane_columns_alternative_for_k(rng):
    """Block tuning on a GPU also times the CSR formats' lanes kernels with another
    count of columns per work-item (second in their lists: the first alternative a
    second pass or an online measurement of blocks times): the other of one and two at
    k = 4 and 8, of two and four from 16 (these rows are short and even: the rule takes
    two, then four); not for k < 4, sell or ell, the CPU's items kernels, single
    products, or a caller's own lane_columns.  The measured candidate multiplies right
    and says its count."""
    from pyspmv_cl.tuning import online
    cpu = DEVICES[0].profile.replace(device_type="cpu")   # whatever the test device is
    gpu = gpu_device().profile
    A = random_values(generators.random_uniform(2000, 2000, 6, seed=3), rng)
    f = MatrixFeatures.from_csr(A)

    def lists(profile, k, **user):
        order, _ = tuner.rank_candidates(f, profile, np.float32, dict(FORMATS), "sell",
                                         block_size=k, user_params=user)
        return dict(order)

    # Short, even rows: the rule takes two columns at k = 4 and 8 and four from 16.
    assert f.row_spread <= min(*CSR_REGULAR_SPREAD.values(), CSR_SHORT_ROWS[1])
    assert f.mean_row_length <= CSR_SHORT_ROWS[0]
    for k, want in ((32, 2), (33, 2), (16, 2), (8, 1), (4, 1)):
        for name in ("csr-scalar", "csr-vector"):
            sets = lists(gpu, k)[name]
            assert sets[1] == {**sets[0], "lane_columns": want}, (name, k)
    for name, sets in lists(gpu, 32).items():
        if name not in ("csr-scalar", "csr-vector"):
            assert all("lane_columns" not in p for p in sets), name
    for sets in (lists(gpu, 2)["csr-vector"], lists(gpu, 1)["csr-vector"],
                 lists(cpu, 32)["csr-vector"], lists(gpu, 32, lane_columns=2)["csr-vector"]):
        assert all("lane_columns" not in p for p in sets)
    assert online.online_alternatives(1) == 0 and online.online_alternatives(16) == 2
    entry, impl, _ = tuner.measure(A, f, gpu_device(), np.float32, budget=30,
                                   registry={"csr-vector": FORMATS["csr-vector"]},
                                   alternatives=1, block_size=16)
    timed = [c for c in entry["candidates"] if c["alternative"]]
    assert [c["resolved"]["lane_columns"] for c in timed] == [2]
    assert impl is not None


def check_not_timed_off_gpu_csr(lists, gpu_profile, param):
    """Block tuning at k = 8 times no ``param`` on a CPU, for ell and sell, or on short,
    even rows (``lists(profile, k, features=...)``: the ranked sets by format)."""
    cpu = DEVICES[0].profile.replace(device_type="cpu")
    assert all(param not in p for p in lists(cpu, 8)["csr-vector"])
    for name in ("ell", "sell"):
        assert all(param not in p for p in lists(gpu_profile, 8).get(name, []))
    even = MatrixFeatures.from_csr(generators.random_uniform(2000, 2000, 20, seed=1))
    assert all(param not in p for p in lists(gpu_profile, 8, even)["csr-vector"])


def test_row_order_alternative(rng):
    """Block tuning on a GPU also times the CSR formats' lanes kernels with the rows
    taken longest first from k = 8 where their lengths are uneven (spread 1.4+): in
    windows of 256, or of 4096 with the row split where that is timed (after it); not
    at k = 4, on even rows, on a CPU, for ell/sell, or over a caller's lane_order, split
    or column count.  The measured candidate multiplies right."""
    from matrix_cases import csr_from_row_lengths

    from pyspmv_cl.formats.lanes import (
        ORDER_CANDIDATE,
        ORDER_SPREAD,
        SPLIT_CANDIDATE,
        SPLIT_ORDER_CANDIDATE,
    )
    gpu = gpu_device()
    lengths = np.full(2000, 3)
    lengths[::10] = 40    # mean 6.7, spread 1.8: uneven, too short for the split
    A = random_values(csr_from_row_lengths(rng, lengths, 2000).tocsr(), rng)
    f = MatrixFeatures.from_csr(A)
    assert ORDER_SPREAD <= f.row_spread < 2 and f.mean_row_length < 16

    def lists(profile, k, features=f, **user):
        order, _ = tuner.rank_candidates(features, profile, np.float32, dict(FORMATS),
                                         "sell", block_size=k, user_params=user)
        return dict(order)

    for name in ("csr-scalar", "csr-vector"):
        for k in (8, 32, 40):
            sets = lists(gpu.profile, k)[name]
            assert sets[1] == {**sets[0], **ORDER_CANDIDATE}, (name, k)
        assert all("lane_order" not in p for p in lists(gpu.profile, 4)[name])
        for user in ({"lane_order": 2}, {"lane_split": 1}, {"lane_columns": 1}):
            assert all(p.get("lane_order") in (None, user.get("lane_order"))
                       for p in lists(gpu.profile, 8, **user)[name])
    check_not_timed_off_gpu_csr(lists, gpu.profile, "lane_order")
    # Long, uneven rows: the split first, then the split with windows of 4096.
    long_rows = np.full(2000, 5)
    long_rows[::20] = 300
    B = csr_from_row_lengths(rng, long_rows, 2000).tocsr()
    sets = lists(gpu.profile, 8, MatrixFeatures.from_csr(B))["csr-vector"]
    assert sets[1:3] == [{**sets[0], **SPLIT_CANDIDATE}, {**sets[0], **SPLIT_ORDER_CANDIDATE}]
    op = psc.SpMV(A, format="csr-vector", dtype=DTYPE, device=gpu,
                  **lists(gpu.profile, 8)["csr-vector"][1])
    assert "row_order" in op._impl.buffers
    check_block(op, A, 8, rng)


def test_split_rows_alternative_for_k_8(rng):
    """Block tuning on a GPU also times the CSR formats' lanes kernels with a row split
    among 4 groups of 2-column lanes, first among the alternatives, at k = 8 where rows
    are long and uneven (mean 16+, spread 2+: measured on an H100); not at k = 32, on
    short even rows, on a CPU, for ell/sell, or over a caller's lane_columns. The
    measured candidate multiplies right."""
    from matrix_cases import csr_from_row_lengths

    from pyspmv_cl.formats.lanes import SPLIT_CANDIDATE
    gpu = gpu_device()
    lengths = np.full(2000, 5)
    lengths[::20] = 300
    A = random_values(csr_from_row_lengths(rng, lengths, 2000).tocsr(), rng)
    f = MatrixFeatures.from_csr(A)
    assert f.mean_row_length >= 16 and f.row_spread >= 2

    def lists(profile, k, features=f, **user):
        order, _ = tuner.rank_candidates(features, profile, np.float32, dict(FORMATS),
                                         "sell", block_size=k, user_params=user)
        return dict(order)

    for name in ("csr-scalar", "csr-vector"):
        sets = lists(gpu.profile, 8)[name]
        assert sets[1] == {**sets[0], **SPLIT_CANDIDATE}, name
        assert all("lane_split" not in p for p in lists(gpu.profile, 32)[name])
        assert all("lane_split" not in p for p in lists(gpu.profile, 8, lane_columns=1)[name])
    check_not_timed_off_gpu_csr(lists, gpu.profile, "lane_split")
    op = psc.SpMV(A, format="csr-vector", dtype=DTYPE, device=gpu,
                  **lists(gpu.profile, 8)["csr-vector"][1])
    assert op._impl._lane_split(8) == 4
    check_block(op, A, 8, rng)


def test_rules_choose_block_kernels_for_k(rng):
    """GPU rules: dia (stencil) becomes sell and coo (skewed rows) csr-vector for
    k > 1, since neither has block kernels; k = 1 keeps them.  The operators chosen
    multiply blocks right."""
    device = gpu_device()
    stencil = random_values(generators.poisson2d(40), rng)
    cases = [(stencil, "dia", "sell"), (skewed(rng), "coo", "csr-vector")]
    for A, single, block in cases:
        one = psc.SpMV(A, dtype=DTYPE, device=device, tune=False)
        assert one.format == single and one.tuning.block_size == 1
        op = psc.SpMV(A, dtype=DTYPE, device=device, tune=False, block_size=16)
        assert op.format == block and op.has_block_kernels
        assert "for products of 16 vectors" in op.explanation
        assert f"{single} has no block kernels" in op.explanation
        check_block(op, A, 16, rng)
    # The caller's items kernels with csr-vector's adaptive default: the row mapping.
    A = random_values(generators.random_uniform(3000, 3000, 40, seed=1), rng)
    f = MatrixFeatures.from_csr(A)
    assert FORMATS["csr-vector"].resolve_params(f, device.profile, DTYPE, {})[
        "mapping"] == "adaptive"
    op = psc.SpMV(A, dtype=DTYPE, device=device, tune=False, block_size=8,
                  block_mapping="items")
    assert op.format == "csr-vector" and op.params["mapping"] == "rows"
    assert op.has_block_kernels
    check_block(op, A, 8, rng)
    op = psc.SpMV(A, dtype=DTYPE, device=device, tune=False, block_mapping="items")
    assert op.params["mapping"] == "adaptive" and not op.has_block_kernels   # k = 1


def test_measuring_pays_sooner_for_k():
    """expected_calls repays the budget as if each product cost k single ones."""
    A = generators.random_uniform(3000, 3000, 10, seed=2)
    f = MatrixFeatures.from_csr(A.tocsr())
    profile = DEVICES[0].profile.replace(device_type="cpu")
    calls = 50_000   # 13-20 us a single product at the CPU model's 20 GB/s: 0.2-0.3 s
    worth1, why = tuner._worth_measuring(f, profile, DTYPE, calls, 1.0)
    worth16, _ = tuner._worth_measuring(f, profile, DTYPE, calls, 1.0, 16)
    assert not worth1 and "would not repay" in why
    assert worth16


# -- online tuning, the database hand-over, the transposed copy --------------------------

def test_online_tuning_for_k(rng):
    """tune="online" with k = 4: starts on a CSR kernel with block kernels, times the
    candidates on blocks in the background, stores the decision for k's class."""
    A = random_values(generators.poisson2d(40), rng)
    op = psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], tune="online", block_size=4)
    assert op.tuning.source == "online" and op.tuning.block_size == 4
    assert "online for products of 4 vectors" in op.explanation
    assert op.has_block_kernels
    check_block(op, A, 4, rng)
    assert op.finish_tuning() == "done", op.tuning.online.error
    decision = op.tuning.online.decision
    assert decision.block_size == 4 and decision.entry["block_size"] == 4
    assert {c["product"] for c in decision.entry["candidates"]} <= {"block kernels",
                                                                    "column by column"}
    check_block(op, A, 4, rng)
    again = psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], block_size=2)   # class 2-4
    assert again.tuning.source == "database" and again.tuning.block_size == 2
    for k in (None, 1, 5):   # other classes: the rules for this small matrix
        assert psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], block_size=k).tuning.source \
            == "model"


def test_online_trigger_counts_blocks_by_their_weight(rng):
    """The trigger is in products of block_size vectors: a product of k vectors weighs
    sqrt(k) single ones, on the model's trigger and on the count toward it (a caller
    of 16-vector blocks started the measurement 4x later than its rule said)."""
    from pyspmv_cl.tuning import online
    A = random_values(generators.poisson2d(40), rng)
    f = MatrixFeatures.from_csr(A.tocsr())
    for profile in (DEVICES[0].profile.replace(device_type="cpu"),
                    DEVICES[0].profile.replace(device_type="gpu")):
        one = online.trigger_calls(f, profile, DTYPE, 5.0)
        sixteen = online.trigger_calls(f, profile, DTYPE, 5.0, block_size=16)
        assert one > 4 and sixteen == pytest.approx(one / 4, abs=1), (one, sixteen)
    op = psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], tune="online", block_size=16)
    tuning = op.tuning.online
    tuning._run_measurement = lambda *a: (_ for _ in ()).throw(RuntimeError("stop"))
    tuning.trigger = 2
    X = rng.standard_normal((A.shape[1], 16))
    assert_close(op @ X, reference(A, X), A, X, DTYPE)   # 16 vectors: 1 of 2
    for _ in range(3):                   # three single ones: a quarter each
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(A, x), A, x, DTYPE)
    assert tuning.state == "waiting" and tuning.calls == 4
    assert tuning.work == pytest.approx(1.75)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, DTYPE)   # the fourth: 2 of 2, it starts
    assert op.finish_tuning(60) == "failed" and "stop" in tuning.error
    assert tuning.calls == 5


def test_online_start_has_block_kernels_on_gpus(rng):
    """On a GPU the online start is csr-vector; with the caller's
    block_mapping="items", whose adaptive mapping has no block kernels, k > 1 starts
    on the row mapping instead (k = 1 keeps the adaptive start)."""
    from pyspmv_cl.tuning import online

    device = gpu_device()
    A = random_values(generators.random_uniform(3000, 3000, 40, seed=1), rng)
    f = MatrixFeatures.from_csr(A)
    items = {"block_mapping": "items"}
    assert online.start_choice(f, device.profile, DTYPE)[1]["mapping"] == "adaptive"
    assert online.start_choice(f, device.profile, DTYPE, 8, items)[1]["mapping"] == "rows"
    op = psc.SpMV(A, dtype=DTYPE, device=device, tune="online", block_size=8, **items)
    assert op.tuning.source == "online" and op.format == "csr-vector"
    assert op.params["mapping"] == "rows" and op.has_block_kernels
    check_block(op, A, 8, rng)
    assert op.finish_tuning() == "done", op.tuning.online.error
    check_block(op, A, 8, rng)


def test_database_handover_for_k(rng):
    """A stored k = 16 decision whose winner converts on the host (ell) is found for
    k = 12 (same class): the operator starts on the CPU start format (sell, with block
    kernels) and takes ell once converted in the background; k = 1 and k = 17 do not
    see it."""
    from pyspmv_cl.features import shape_fingerprint, structure_digest

    A = random_values(generators.poisson2d(30), rng)
    device = DEVICES[0]
    if device.profile.is_gpu:
        pytest.skip("the CPU start format (sell) is asserted")
    features = MatrixFeatures.from_csr(A, count_diagonals=False)
    fp = {**shape_fingerprint(features), "block_class": tuner.block_class(16),
          "structure_sha256": structure_digest(A)}
    key = database.entry_key(device.profile, fp, np.dtype(DTYPE).name)
    database.store(key, {"candidates": [{"format": "ell", "params": {},
                                         "kernel_seconds": 1e-6,
                                         "conversion_seconds": 0.01}],
                         "skipped": [], "fingerprint": fp, "created": "earlier",
                         "block_size": 16})
    op = psc.SpMV(A, dtype=DTYPE, device=device, block_size=12)
    assert op.tuning.source == "database" and op.tuning.block_size == 12
    assert op.format == "sell" and "converts in the background" in op.explanation
    assert "product of 16 vectors" in op.explanation
    check_block(op, A, 12, rng)
    assert op.finish_tuning() == "done"
    check_block(op, A, 12, rng)
    assert op.format == "ell"
    for k in (None, 1, 17):
        assert psc.SpMV(A, dtype=DTYPE, device=device, block_size=k).tuning.source \
            == "model", k


def test_entries_without_k_still_mean_one_vector(rng):
    """An entry under the key single-vector decisions always had (no block class in
    the fingerprint, no block_size field) answers k = 1 only."""
    from pyspmv_cl.features import shape_fingerprint, structure_digest

    A = random_values(generators.poisson2d(30), rng)
    features = MatrixFeatures.from_csr(A, count_diagonals=False)
    fp = {**shape_fingerprint(features), "structure_sha256": structure_digest(A)}
    key = database.entry_key(DEVICES[0].profile, fp, np.dtype(DTYPE).name)
    # csr-vector: converted without a hand-over (a cast of the CSR arrays).
    database.store(key, {"candidates": [{"format": "csr-vector",
                                         "params": {"mapping": "rows", "vector_size": 2},
                                         "kernel_seconds": 1e-6,
                                         "conversion_seconds": 0.0}],
                         "skipped": [], "fingerprint": fp, "created": "earlier"})
    for k in (None, 1):
        op = psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], block_size=k)
        assert op.tuning.source == "database" and op.tuning.block_size == 1
        assert (op.format, op.params["vector_size"]) == ("csr-vector", 2)
        check_block(op, A, 3, rng)
    for k in (2, 16):
        assert psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], block_size=k).tuning.source \
            == "model"


def test_transposed_copy_is_chosen_for_the_same_k(rng):
    """op.T's operator is tuned for the k given for A: on a GPU the rules' dia for a
    stencil becomes sell for A^T too."""
    device = gpu_device()
    A = random_values(generators.poisson2d(30), rng)
    op = psc.SpMV(A, dtype=DTYPE, device=device, tune=False, block_size=8)
    X = rng.standard_normal((A.shape[0], 8))
    assert_close(op.T @ X, reference(A.T, X), A.T, X, DTYPE)
    assert op.transposed.tuning.block_size == 8 and op.transposed.format == "sell"
    one = psc.SpMV(A, dtype=DTYPE, device=device, tune=False)
    x = rng.standard_normal(A.shape[0])
    assert_close(one.T @ x, reference(A.T, x), A.T, x, DTYPE)
    assert one.transposed.tuning.block_size == 1 and one.transposed.format == "dia"


# -- pyspmv-cl tune --block-size --------------------------------------------------------

def test_tune_command_block_size(capsys, rng):
    """``pyspmv-cl tune --block-size K`` stores the decision for K's class, which
    ``SpMV(A, block_size=k)`` then finds for any k of the class (and not for k = 1)."""
    import json

    from pyspmv_cl.cli import main

    common = ["tune", "--device", DEVICES[0].id, "--quiet", "--dtype", np.dtype(DTYPE).name,
              "--budget", "0.3"]
    for bad in ("0", "-2"):
        assert main([*common, "--block-size", bad, "poisson2d:10"]) == 2
        assert "--block-size must be a positive integer" in capsys.readouterr().err
    assert main([*common, "--json", "--block-size", "4", "poisson2d:20"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert rows[0]["block_size"] == 4 and rows[0]["source"] == "measured"
    assert "product of 4 vectors" in rows[0]["explanation"]
    assert main([*common, "--block-size", "3", "poisson2d:20"]) == 0   # class 2-4: stored
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"{rows[0]['matrix']} {np.dtype(DTYPE).name} k=3: "
                           f"{rows[0]['format']}") and "[database" in line
    A = generators.poisson2d(20)
    op = psc.SpMV(A, dtype=DTYPE, device=DEVICES[0], block_size=2)
    assert op.tuning.source == "database" and op.tuning.block_size == 2
    check_block(op, A, 2, rng)
    op.finish_tuning()   # a winner converted on the host is handed over in the background
    assert op.format == rows[0]["format"]
    check_block(op, A, 2, rng)
    assert psc.SpMV(A, dtype=DTYPE, device=DEVICES[0]).tuning.source == "model"
    assert main([*common, "--json", "poisson2d:20"]) == 0   # k = 1: measured anew
    assert json.loads(capsys.readouterr().out)["results"][0]["block_size"] == 1
