"""Tests for pyspmv_cl.bench.peers: the timing rule, the scipy peer, and peer detection."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from pyspmv_cl.bench import peers

REPO = Path(__file__).resolve().parents[1]


def fresh_matrix(seed=0, shape=(300, 200), density=0.05):
    rng = np.random.default_rng(seed)
    A = sp.random(*shape, density=density, format="csr", random_state=rng)
    return A, rng.standard_normal(shape[1])


# ----------------------------------------------------------------------------- median_time


def test_median_time_counts_warmup_and_repeats():
    calls = []
    t = peers.median_time(lambda: calls.append(1), warmup=2, repeats=15, min_time=0.0,
                          max_time=60.0)
    assert isinstance(t, float) and t > 0
    assert len(calls) == 2 + 15


def test_median_time_measures_the_call():
    t = peers.median_time(lambda: time.sleep(0.002), warmup=0, repeats=5, min_time=0.0)
    assert 0.002 <= t < 0.2


def test_median_time_runs_until_min_time():
    calls = []
    start = time.perf_counter()
    peers.median_time(lambda: calls.append(1), warmup=0, repeats=1, min_time=0.05)
    assert time.perf_counter() - start >= 0.05
    assert len(calls) > 10


def test_median_time_stops_at_max_time():
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)

    peers.median_time(slow, warmup=1, repeats=1000, min_time=0.0, max_time=0.1)
    assert 2 <= len(calls) <= 1 + 8


def test_median_time_rejects_bad_counts():
    with pytest.raises(ValueError):
        peers.median_time(lambda: None, repeats=0)


# ----------------------------------------------------------------------------- scipy peer


def scipy_peer():
    (p,) = peers.available_peers(["scipy"])
    assert p.name == "scipy" and p.available and p.device == "cpu"
    return p


def test_scipy_peer_matches_matmul_float64():
    A, x = fresh_matrix(seed=11)
    seconds, y = peers.time_peer(scipy_peer(), A, x, np.float64, warmup=1, repeats=3,
                                 min_time=0.0)
    assert seconds > 0
    assert isinstance(y, np.ndarray) and y.dtype == np.float64 and y.shape == (300,)
    np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=0)


def test_scipy_peer_float32():
    A, x = fresh_matrix(seed=12)
    f = scipy_peer().prepare(A, np.float32)
    y = f(x.astype(np.float32))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, A @ x, rtol=1e-4, atol=1e-5)


def test_prepare_on_unavailable_peer_raises():
    p = peers.Peer("nothing", False, "not installed")
    with pytest.raises(RuntimeError, match="not installed"):
        p.prepare(sp.identity(3, format="csr"), np.float64)


# ----------------------------------------------------------------------------- detection


def test_available_peers_never_raises_and_is_ordered():
    found = peers.available_peers()
    assert [p.name for p in found] == list(peers.PEER_NAMES)
    for p in found:
        assert isinstance(p.available, bool)
        if not p.available:
            assert p.reason  # why it cannot run is always recorded
    assert found[0].name == "scipy" and found[0].available


def test_available_peers_include_and_aliases():
    assert [p.name for p in peers.available_peers(["torch", "scipy"])] == ["scipy", "torch-csr"]
    assert [p.name for p in peers.available_peers(["cupy"])] == ["cupy-csr"]
    with pytest.raises(ValueError, match="unknown"):
        peers.available_peers(["nope"])


@pytest.mark.parametrize(("module", "peer"), [("torch", "torch-csr"),
                                               ("sparse_dot_mkl", "mkl"),
                                               ("cupy", "cusparse"),
                                               ("cupy", "cupy-csr")])
def test_missing_library_makes_peer_unavailable(monkeypatch, module, peer):
    # A None entry in sys.modules makes `import module` raise ImportError.
    monkeypatch.setitem(sys.modules, module, None)
    (p,) = peers.available_peers([peer])
    assert p.name == peer and not p.available
    assert "Error" in p.reason
    with pytest.raises(RuntimeError):
        p.prepare(sp.identity(2, format="csr"), np.float64)


@pytest.mark.parametrize("name", ["torch-csr", "mkl", "cusparse", "cupy-csr"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_optional_peers_agree_with_scipy(name, dtype):
    (p,) = peers.available_peers([name])
    if not p.available:
        pytest.skip(f"{name}: {p.reason}")
    A, x = fresh_matrix(seed=13, shape=(500, 400))
    seconds, y = peers.time_peer(p, A, x, dtype, warmup=1, repeats=3, min_time=0.0)
    assert seconds > 0
    assert y.dtype == dtype and y.shape == (500,)
    ref = A.astype(dtype) @ x.astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_import_does_not_pull_in_optional_libraries():
    code = ("import sys, pyspmv_cl.bench.peers; "
            "bad = {'torch', 'cupy', 'sparse_dot_mkl'} & set(sys.modules); "
            "sys.exit(1 if bad else 0)")
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", ["cusparse", "cupy-csr"])
def test_cuda_peers_follow_a_new_x(name):
    """The cusparse peer keeps x's descriptor: a different x must get its own."""
    (p,) = peers.available_peers([name])
    if not p.available:
        pytest.skip(f"{name}: {p.reason}")
    import cupy

    A, _ = fresh_matrix(seed=5, shape=(300, 200))
    f = p.prepare(A, np.float64)
    rng = np.random.default_rng()
    for _ in range(3):
        x = rng.standard_normal(200)
        y = cupy.asnumpy(f(cupy.asarray(x)))
        np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12 * np.abs(A @ x).max())
