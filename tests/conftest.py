"""Shared fixtures: every OpenCL device found, the scipy float64 reference, poisoned
outputs and dtype tolerances."""

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import pyspmv_cl as psc

# Tests use a private kernel cache so they neither depend on nor pollute the user's.
if "PYSPMV_CL_CACHE_DIR" not in os.environ:
    import tempfile
    os.environ["PYSPMV_CL_CACHE_DIR"] = tempfile.mkdtemp(prefix="pyspmv-cl-test-cache-")
    # No compiled kernels on disk (tests/test_cache*.py turn them back on): this run's
    # cache would never read one back, and PoCL compiles every kernel of a program a
    # second time to hand out its binary.
    os.environ.setdefault("PYSPMV_CL_CACHE_BINARIES", "0")

# PYSPMV_CL_TEST_DEVICES restricts the devices tested (a comma-separated list of
# selections as PYSPMV_CL_DEVICE takes them, e.g. "nvidia" or "0:0,1:0").
DEVICES = psc.devices()
if os.environ.get("PYSPMV_CL_TEST_DEVICES"):
    DEVICES = [d for d in DEVICES if any(
        d is psc.get_device(sel) for sel in os.environ["PYSPMV_CL_TEST_DEVICES"].split(","))]
DEVICE_IDS = [f"{d.id}-{d.cl_device.name.strip().replace(' ', '_')}" for d in DEVICES]

# The shared matrices live beside the checkout: <repo>/../shared/matrices.
MATRIX_DIR = Path(os.environ.get(
    "PYSPMV_CL_MATRIX_DIR", Path(__file__).resolve().parents[2] / "shared" / "matrices"))

DTYPES = [np.float32, np.float64]
POISON = {np.dtype(np.float32): np.float32(np.nan), np.dtype(np.float64): np.nan,
          np.dtype(np.complex64): complex(np.nan, np.nan),
          np.dtype(np.complex128): complex(np.nan, np.nan)}


# Two test runs (README "Tests"): the default one, and the exhaustive sweeps behind
# ``--exhaustive`` (or PYSPMV_CL_EXHAUSTIVE=1); ``--only-exhaustive`` runs just what the
# default run leaves out (.ci/run runs both, so nothing runs twice).
#  - The per-format parameter sweeps (tests/test_format_*.py) run on the first device of
#    each type (one CPU, one GPU, ...): two PoCL builds of the same CPU would otherwise
#    double the compile-bound sweeps.  PYSPMV_CL_SWEEP_ALL_DEVICES=1 sweeps on all.
#  - The generic tests (every format on every edge case, real matrices, API) run on
#    those devices by default and on every other device with --exhaustive.
#  - Tests marked ``exhaustive`` run with --exhaustive only; ``quick_only`` ones (a
#    quick version of an exhaustive test) by default only.
FIRST_OF_EACH_TYPE = [d for i, d in enumerate(DEVICES)
                      if d.profile.device_type not in {e.profile.device_type
                                                       for e in DEVICES[:i]}]
SWEEP_DEVICES = DEVICES if os.environ.get("PYSPMV_CL_SWEEP_ALL_DEVICES") == "1" \
    else FIRST_OF_EACH_TYPE


def pytest_addoption(parser):
    group = parser.getgroup("pyspmv_cl")
    group.addoption("--exhaustive", action="store_true",
                    default=os.environ.get("PYSPMV_CL_EXHAUSTIVE", "") not in ("", "0"),
                    help="also run the exhaustive sweeps (every device, every variant)")
    group.addoption("--only-exhaustive", action="store_true",
                    help="run only what the default run leaves out")


def pytest_configure(config):
    config.addinivalue_line("markers", "exhaustive: runs with --exhaustive only")
    config.addinivalue_line("markers", "quick_only: a quick version of an exhaustive "
                            "test, left out with --exhaustive")


def _mode(config):
    if config.getoption("only_exhaustive"):
        return "only-exhaustive"
    return "exhaustive" if config.getoption("exhaustive") else "default"


def pytest_collection_modifyitems(config, items):
    mode = _mode(config)
    keep, drop = [], []
    for item in items:
        exhaustive = item.get_closest_marker("exhaustive") is not None
        quick_only = item.get_closest_marker("quick_only") is not None
        run = {"default": not exhaustive,
               "exhaustive": not quick_only,
               "only-exhaustive": exhaustive}[mode]
        (keep if run else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config):
    return (f"pyspmv_cl tests: {_mode(config)} run on {len(DEVICES)} device(s) "
            "(--exhaustive: every device and every Oclgrind variant)")


def pytest_generate_tests(metafunc):
    """Parametrise the ``device`` fixture (see the notes above for which devices)."""
    if "device" not in metafunc.fixturenames or any(
            "device" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")):
        return      # a test that picks its own devices
    sweep = metafunc.module.__name__.rpartition(".")[2].startswith("test_format_")
    devices = SWEEP_DEVICES if sweep else DEVICES
    params = [pytest.param(d, id=DEVICE_IDS[DEVICES.index(d)],
                           marks=() if d in FIRST_OF_EACH_TYPE or sweep
                           else pytest.mark.exhaustive) for d in devices]
    metafunc.parametrize("device", params or [pytest.param(None, id="no-device")],
                         indirect=True)


@pytest.fixture
def device(request):
    """Each OpenCL device present (the test is skipped when there is none)."""
    if request.param is None:
        pytest.skip("no OpenCL device")
    return request.param


def skip_without_fp64(device, dtype):
    if np.dtype(dtype) in (np.float64, np.complex128) and not device.profile.fp64:
        pytest.skip(f"{device.profile.name} has no fp64")


def reference(A, x, alpha=1.0, beta=0.0, y0=None):
    """alpha*A@x + beta*y0 in float64 with scipy (the oracle of every test)."""
    A64 = sp.csr_matrix(A, dtype=np.float64, copy=True)
    # NaN/Inf cases (matrix_cases' nan_inf_in_matrix) make inf * 0 on purpose: the
    # reference's own warning about it is noise.
    with np.errstate(invalid="ignore", over="ignore"):
        y = alpha * (A64 @ np.asarray(x, dtype=np.float64))
        if beta != 0:
            y = y + beta * np.asarray(y0, dtype=np.float64)
    return y


def tolerance(dtype, A):
    """Relative tolerance scaled by the longest row: float32 accumulates one rounding
    per term (~1e-5 for typical rows); float64 ~1e-12."""
    A = sp.csr_matrix(A, copy=True)
    longest = int(np.diff(A.indptr).max()) if A.shape[0] and A.nnz else 1
    eps = np.finfo(dtype).eps
    return max(1e-12 if np.dtype(dtype) == np.float64 else 1e-5, 4 * eps * np.sqrt(longest))


def assert_close(y, y_ref, A, x, dtype):
    """Compare against the float64 reference with an error bound proportional to the
    magnitudes summed in each row (|A| @ |x|), so cancellation does not fail honest
    results and unwritten (NaN-poisoned) entries always fail."""
    y = np.asarray(y, dtype=np.float64)
    assert y.shape == y_ref.shape
    A64 = sp.csr_matrix(A, dtype=np.float64, copy=True)
    # |a| of every stored entry, duplicates apart: abs() sums duplicates first, and a
    # row whose duplicates cancel would then get the bound of its (small) result.
    magnitudes = sp.csr_matrix((np.abs(A64.data), A64.indices, A64.indptr), shape=A64.shape)
    scale = magnitudes @ np.abs(np.asarray(x, dtype=np.float64))
    scale = np.maximum(scale, np.abs(y_ref))
    tol = tolerance(dtype, A)
    finite = np.isfinite(y_ref)
    assert np.array_equal(np.isnan(y), np.isnan(y_ref)), "NaN pattern differs from scipy"
    assert np.array_equal(y[~finite & ~np.isnan(y_ref)], y_ref[~finite & ~np.isnan(y_ref)]), \
        "Inf entries differ from scipy"
    err = np.abs(y[finite] - y_ref[finite])
    bound = tol * scale[finite] + np.finfo(dtype).tiny
    bad = err > bound
    assert not bad.any(), (f"{bad.sum()} entries off; worst error {err.max():.3e} "
                           f"(bound {bound[np.argmax(err - bound)]:.3e})")


def assert_cclose(y, ref, A, x, dtype, y0=None, beta=0):
    """|y - ref| within a bound proportional to |A| |x| (+ |beta y0|); NaN only where
    scipy has one (a poisoned, unwritten entry fails)."""
    y = np.asarray(y, dtype=np.complex128)
    assert y.shape == ref.shape
    assert np.array_equal(np.isnan(y), np.isnan(ref)), "NaN pattern differs from scipy"
    A = sp.csr_matrix(A, dtype=np.complex128)
    mags = sp.csr_matrix((np.abs(A.data), A.indices, A.indptr), shape=A.shape)
    scale = mags @ np.abs(np.asarray(x, dtype=np.complex128)) + np.abs(ref)
    if y0 is not None:
        scale = scale + abs(beta) * np.abs(y0)
    longest = int(np.diff(A.indptr).max()) if A.shape[0] and A.nnz else 1
    eps = np.finfo(np.dtype(dtype).char.lower()).eps
    tol = max(1e-12 if np.dtype(dtype) == np.complex128 else 1e-5,
              8 * eps * np.sqrt(longest))
    finite = np.isfinite(ref)
    err = np.abs(y[finite] - ref[finite])
    assert np.all(err <= tol * scale[finite] + 1e-30), f"worst error {err.max():.3e}"


def make_operator(A, fmt, **kwargs):
    """``psc.SpMV(A, format=fmt, ...)``, or None when a format that may refuse matrices
    (DIA, ELL: too much padding) refuses this one with FormatNotSuitableError, which
    is correct behaviour; any other format refusing is a failure."""
    from pyspmv_cl.formats import get_format

    try:
        return psc.SpMV(A, format=fmt, **kwargs)
    except psc.FormatNotSuitableError as exc:
        if not get_format(fmt).may_refuse:
            raise
        assert fmt in str(exc) and len(str(exc)) > 30, f"unhelpful refusal: {exc}"
        return None


def poisoned(shape, dtype):
    """An output array full of NaN: any entry the kernel fails to write fails the test."""
    return np.full(shape, POISON[np.dtype(dtype)], dtype=dtype)


@pytest.fixture
def empty_tuning_db(tmp_path, monkeypatch):
    """An empty tuning database: its directory under tmp_path (yielded), the memory
    layer cleared before and after, and the caller's PYSPMV_CL_TUNE and
    PYSPMV_CL_TUNE_BUDGET unset."""
    from pyspmv_cl.tuning import database
    root = tmp_path / "tuning"
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(root))
    monkeypatch.delenv("PYSPMV_CL_TUNE", raising=False)
    monkeypatch.delenv("PYSPMV_CL_TUNE_BUDGET", raising=False)
    database.clear_memory()
    yield root
    database.clear_memory()


@pytest.fixture
def rng():
    """Fresh random data every run (the seed is printed on failure by pytest's repr)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
