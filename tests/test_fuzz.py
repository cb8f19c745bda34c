"""Fuzzing every format with adversarially structured matrices (hypothesis), against
scipy: empty leading/trailing rows, one huge row, every non-zero in one column,
duplicate entries, explicit zeros, NaN/Inf in x, sizes and row lengths just around
every tile / vector / warp / work-group size, and m or n of 0 or 1; on the native
profile and GPU-shaped ones.

CI runs a fixed, derandomised set of examples (bounded time).  For a longer random
hunt: ``PYSPMV_CL_FUZZ_EXAMPLES=500 PYSPMV_CL_FUZZ_RANDOM=1 pytest tests/test_fuzz.py``
(hypothesis prints the failing example; ``seed`` in it reproduces the values).
"""

import os

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, make_operator, poisoned, skip_without_fp64
from format_variants import GPU32, GPU64
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matrix_cases import check_against_scipy

import pyspmv_cl as psc

FORMATS = psc.formats()
EXAMPLES = int(os.environ.get("PYSPMV_CL_FUZZ_EXAMPLES", "12"))
RANDOM = os.environ.get("PYSPMV_CL_FUZZ_RANDOM", "") not in ("", "0")
PROFILES = {"native": {}, "gpu32": GPU32, "gpu64": GPU64}

# Around every power of two a kernel may tile by (vector sizes, warps, wavefronts,
# work-groups, CSR5's omega * sigma tiles, BCCOO's tiles) and a few odd sizes.
BOUNDARIES = sorted({0, 1, 2, 3} | {b + d for b in (4, 8, 16, 32, 64, 128, 256, 512)
                                   for d in (-1, 0, 1)} | {5, 6, 7, 11, 13, 97})
SIZES = st.sampled_from([0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255,
                         256, 257, 511, 512, 513])

structures = st.fixed_dictionaries({
    "m": SIZES,
    "n": SIZES,
    "lengths": st.sampled_from(["boundaries", "sparse", "equal", "zero"]),
    "empty_lead": st.sampled_from([0, 0, 1, 5, 33]),
    "empty_trail": st.sampled_from([0, 0, 1, 7, 65]),
    "huge_row": st.booleans(),
    "one_column": st.booleans(),
    "duplicates": st.booleans(),
    "explicit_zeros": st.booleans(),
    "unsorted": st.booleans(),
    "x_specials": st.booleans(),
    "profile": st.sampled_from(list(PROFILES)),
    "seed": st.integers(0, 2**32 - 1),
})


def build(spec):
    """(A, x) for one drawn structure, vectorised (no loop per row)."""
    rng = np.random.default_rng(spec["seed"])
    m, n = spec["m"], spec["n"]
    if n == 0 or m == 0 or spec["lengths"] == "zero":
        lengths = np.zeros(m, dtype=np.int64)
    elif spec["lengths"] == "boundaries":
        lengths = rng.choice(BOUNDARIES, m)
    elif spec["lengths"] == "sparse":
        lengths = rng.binomial(3, 0.3, m)
    else:
        lengths = np.full(m, rng.choice(BOUNDARIES))
    if m and n:
        cap = 2 * n if spec["duplicates"] else n  # duplicates may repeat columns
        lengths = np.minimum(lengths, cap)
        if spec["huge_row"]:
            lengths[rng.integers(m)] = cap
    # Empty leading/trailing runs, leaving a middle third (for tiny m: the last row).
    lead, trail = min(spec["empty_lead"], m // 3), min(spec["empty_trail"], m // 3)
    lengths[:lead] = 0
    lengths[m - trail:] = 0 if trail else lengths[m - trail:]
    nnz = int(lengths.sum())
    rows = np.repeat(np.arange(m), lengths)
    if spec["one_column"] and n:
        cols = np.full(nnz, rng.integers(n))
    elif spec["duplicates"] and n:
        cols = rng.integers(0, n, nnz)
    else:  # distinct columns per row: a random permutation prefix, vectorised
        keys = rng.random((m, n)) if m * n <= 600_000 else None
        if keys is None:
            cols = rng.integers(0, max(n, 1), nnz)
        else:
            order = np.argsort(keys, axis=1)
            cols = order[np.arange(m)[:, None], np.arange(n)[None, :]][
                np.arange(n)[None, :] < lengths[:, None]]
    if not spec["unsorted"] and nnz:
        order = np.lexsort((cols, rows))
        cols = cols[order]
    data = rng.standard_normal(nnz)
    if spec["explicit_zeros"] and nnz:
        data[rng.random(nnz) < 0.2] = 0.0
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    A = sp.csr_matrix((data, cols.astype(np.int32), indptr.astype(np.int32)), shape=(m, n))
    A.has_canonical_format = False          # duplicates stay, as stored
    A.has_sorted_indices = not spec["unsorted"]
    x = rng.standard_normal(n)
    if spec["x_specials"] and n:
        picks = rng.choice(n, min(n, 3), replace=False)
        x[picks] = [np.inf, -np.inf, np.nan][: picks.size]
    return A, x


def check_build_is_adversarial():
    """The builder honours the drawn structure (a self-check, run below)."""
    spec = {"m": 65, "n": 33, "lengths": "boundaries", "empty_lead": 5, "empty_trail": 65,
            "huge_row": True, "one_column": False, "duplicates": True,
            "explicit_zeros": True, "unsorted": True, "x_specials": True,
            "profile": "native", "seed": 3}
    A, x = build(spec)
    lengths = np.diff(A.indptr)
    assert not lengths[:5].any() and not lengths[-21:].any() and lengths.max() == 66
    assert A.nnz > sp.csr_matrix(A, copy=True).tocoo().tocsr().nnz  # duplicates kept
    assert np.isinf(x).sum() == 2 and np.isnan(x).sum() == 1


def test_builder():
    check_build_is_adversarial()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=EXAMPLES, derandomize=not RANDOM, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(spec=structures)
def test_fuzz_against_scipy(spec, fmt, dtype, device):
    skip_without_fp64(device, dtype)
    A, x = build(spec)
    override = PROFILES[spec["profile"]]
    dev = device.override(**override) if override else device
    op = make_operator(A, fmt, dtype=dtype, device=dev)
    if op is None:
        return
    m = A.shape[0]
    y = op.matvec(x, out=poisoned(m, dtype))
    check_against_scipy(y, A, x, dtype)
    y0 = np.random.default_rng(spec["seed"]).standard_normal(m).astype(dtype)
    y = op.matvec(x, out=y0.copy(), alpha=-0.5, beta=2.0)
    check_against_scipy(y, A, x, dtype, -0.5, 2.0, y0)
