"""``hyb``: ELL part of width K plus a COO remainder.  K forced to 0, 1, the longest
row and beyond; the Bell & Garland / CUSP rule on power-law matrices (K and the split);
the split itself; NaN/Inf in x with rows shorter than K (ELL padding never multiplied);
beta == 0 / 1 / other; GPU-shaped profiles; footprint; parameter validation."""

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import CASES, check_against_scipy, check_all, csr_from_row_lengths

import pyspmv_cl as psc
from pyspmv_cl.formats.hyb import BREAKEVEN_THRESHOLD, RELATIVE_SPEED, hyb_width, split_csr

pytestmark = pytest.mark.skipif("hyb" not in psc.formats(), reason="no hyb format")
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)


def cusp_width(lengths, relative_speed=RELATIVE_SPEED, threshold=BREAKEVEN_THRESHOLD):
    """CUSP's compute_optimal_entries_per_row, loop for loop (the oracle of the rule)."""
    lengths = np.asarray(lengths)
    m = lengths.size
    longest = int(lengths.max(initial=0))
    histogram = np.bincount(lengths, minlength=longest + 1)
    rows = m
    for k in range(longest):
        rows -= histogram[k]  # rows longer than k
        if relative_speed * rows < m or rows < threshold:
            return k
    return longest


def split_expected(lengths, width):
    ell = int(np.minimum(lengths, width).sum())
    return ell, int(lengths.sum()) - ell


def mixed_lengths(rng, m=700, n=400):
    lengths = rng.integers(0, 12, m)
    lengths[rng.random(m) < 0.2] = 0
    lengths[[0, m // 2, m - 1]] = [n, 90, 0]
    return lengths


# ------------------------------------------------------------------ forced widths


@pytest.mark.parametrize("width", [0, 1, 5, "longest", 10**6])
@with_dtypes
def test_forced_width(width, dtype, device, rng):
    """K = 0 (all COO, ELL only scales y), 1, a middle value, the longest row (COO part
    empty) and far beyond it (clamped to the longest row)."""
    skip_without_fp64(device, dtype)
    lengths = mixed_lengths(rng)
    A = csr_from_row_lengths(rng, lengths, 400, shuffle=True)
    longest = int(lengths.max())
    k = longest if width == "longest" else width
    op = psc.SpMV(A, format="hyb", dtype=dtype, device=device, ell_width=k)
    used = min(k, longest)
    ell_nnz, coo_nnz = split_expected(lengths, used)
    assert (op.params["ell_width"], op.params["ell_nnz"], op.params["coo_nnz"]) == \
        (used, ell_nnz, coo_nnz)
    check_all(op, A, dtype, rng)


@pytest.mark.parametrize("case", ["0x0", "m_x_0", "0_x_n", "all_rows_empty", "1x1",
                                  "1x1_empty", "one_long_row", "duplicates_csr",
                                  "unsorted_by_hand", "explicit_zeros", "dense_1_x_3000"])
@pytest.mark.parametrize("width", [0, 1, 3])
@with_dtypes
def test_forced_width_edge_cases(case, width, dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = CASES[case](rng)
    op = psc.SpMV(A, format="hyb", dtype=dtype, device=device, ell_width=width)
    assert op.params["ell_nnz"] + op.params["coo_nnz"] == A.nnz
    if A.shape[0]:
        check_all(op, A, dtype, rng)


@pytest.mark.parametrize("width", [0, 2, 40])
@with_dtypes
def test_specials_in_x_with_short_rows(width, dtype, device, rng):
    """Rows shorter than K leave ELL padding; NaN/Inf in x must reach exactly the rows
    that store an entry in their column (0 * inf = NaN only through explicit zeros)."""
    skip_without_fp64(device, dtype)
    lengths = mixed_lengths(rng, 500, 300)
    A = csr_from_row_lengths(rng, lengths, 300)
    A.data[::13] = 0.0  # explicit zeros: those rows must turn NaN against an infinity
    op = psc.SpMV(A, format="hyb", dtype=dtype, device=device, ell_width=width)
    x = rng.standard_normal(300)
    x[[0, 7, 150]] = [np.inf, np.nan, -np.inf]
    y = op.matvec(x, out=poisoned(500, dtype))
    check_against_scipy(y, A, x, dtype)
    y0 = rng.standard_normal(500).astype(dtype)
    check_against_scipy(op.matvec(x, out=y0.copy(), alpha=2.0, beta=1.0), A, x, dtype,
                        2.0, 1.0, y0)


@pytest.mark.parametrize("width", [0, 1, 3])
def test_alpha_scales_the_row_sum_once(width, device, rng):
    """alpha is applied to a row's whole sum, not to its ELL and COO parts apart: inf
    gave NaN in rows whose ELL part is empty (inf * 0) where scipy gives inf, and 1e300
    times parts of 1e10 and -1e10 overflowed where the row's sum is 0."""
    skip_without_fp64(device, np.float64)
    A = sp.csr_matrix(np.array([[1e10, -1e10, 0, 0], [0, 1.0, 2.0, 0], [0, 0, 0, 0],
                                [3.0, 0, 1.0, 5.0]]))
    x = np.ones(4)
    op = psc.SpMV(A, format="hyb", dtype=np.float64, device=device, ell_width=width)
    with np.errstate(invalid="ignore", over="ignore"):
        for alpha in (np.inf, -np.inf, 1e300, 2.0, 0.5):
            want = alpha * (A @ x)
            got = op.matvec(x, out=poisoned(4, np.float64), alpha=alpha)
            np.testing.assert_array_equal(got, want, err_msg=f"alpha={alpha}")
            y0 = rng.standard_normal(4)
            got = op.matvec(x, out=y0.copy(), alpha=alpha, beta=-0.5)
            if np.isfinite(alpha):   # (rounding bounded by |alpha| |A| |x|, and |y0|)
                check_against_scipy(got, A, x, np.float64, alpha, -0.5, y0)
            else:
                np.testing.assert_array_equal(got, want - 0.5 * y0, err_msg=f"{alpha}")
        X = rng.standard_normal((4, 3))   # blocks go column by column through the same
        np.testing.assert_allclose(op.matmat(X, alpha=3.0), 3.0 * (A @ X), rtol=1e-12)


# ------------------------------------------------------------------ the rule


def test_rule_matches_cusp(rng):
    """hyb_width equals CUSP's histogram loop on random, power-law, flat and tiny
    row-length distributions and thresholds."""
    for _ in range(200):
        m = int(rng.integers(0, 20_000))
        kind = rng.integers(0, 3)
        if kind == 0:
            lengths = np.floor(rng.pareto(rng.uniform(0.8, 3), m) * rng.uniform(1, 20))
        elif kind == 1:
            lengths = rng.integers(0, rng.integers(1, 40), m)
        else:
            lengths = np.full(m, rng.integers(0, 9))
        lengths = lengths.astype(np.int64).clip(0, 5000)
        speed = float(rng.choice([1.0, 2.0, RELATIVE_SPEED, 7.5]))
        threshold = int(rng.choice([0, 1, 100, BREAKEVEN_THRESHOLD, 30_000]))
        assert hyb_width(lengths, speed, threshold) == cusp_width(lengths, speed, threshold)
    # A row too long for hyb_width's histogram: the partition, with the same answer (the
    # oracle stops early, at the short rows).
    lengths = np.r_[np.arange(10_000) % 7, 1 << 23]
    for threshold in (1, 100, 9_000):
        assert hyb_width(lengths, 2.0, threshold) == cusp_width(lengths, 2.0, threshold)


@with_dtypes
def test_rule_on_power_law(dtype, device, rng):
    """The rule's K on a power-law matrix: at least max(4096, m/3) rows hold K or more
    entries, fewer hold K + 1; the split puts min(length, K) of each row in ELL."""
    skip_without_fp64(device, dtype)
    m, n = 30_000, 5000
    lengths = np.minimum(np.floor(rng.pareto(1.3, m) * 4).astype(np.int64), n)
    lengths[rng.choice(m, 3, replace=False)] = [n, 3000, 1000]
    A = csr_from_row_lengths(rng, lengths, n)
    op = psc.SpMV(A, format="hyb", dtype=dtype, device=device)
    k = op.params["ell_width"]
    needed = max(BREAKEVEN_THRESHOLD, m / RELATIVE_SPEED)
    assert k >= 1 and k == cusp_width(lengths)
    assert np.count_nonzero(lengths >= k) >= needed > np.count_nonzero(lengths >= k + 1)
    assert (op.params["ell_nnz"], op.params["coo_nnz"]) == split_expected(lengths, k)
    assert op.params["coo_nnz"] > 0 and op.params["ell_nnz"] > 0
    check_all(op, A, dtype, rng)
    # The rule's parameters: a lower breakeven on a smaller matrix, and relative_speed.
    small = csr_from_row_lengths(rng, lengths[:3000], n)
    assert psc.SpMV(small, format="hyb", dtype=dtype, device=device).params["ell_width"] == 0
    op = psc.SpMV(small, format="hyb", dtype=dtype, device=device, breakeven_threshold=100,
                  relative_speed=1.5)
    assert op.params["ell_width"] == cusp_width(lengths[:3000], 1.5, 100) >= 1
    check_all(op, small, dtype, rng)


def test_split(rng):
    """split_csr: the first K stored entries of each row (CSR order, duplicates and
    unsorted columns as stored) in the ELL part, the rest in the COO part."""
    for case in ("unsorted_indices", "duplicates_csr", "power_law", "empty_rows"):
        A = sp.csr_matrix(CASES[case](rng))
        lengths = np.diff(A.indptr)
        for k in (0, 1, 3, int(lengths.max(initial=0))):
            ell, coo = split_csr(A, k)
            np.testing.assert_array_equal(np.diff(ell.indptr), np.minimum(lengths, k))
            np.testing.assert_array_equal(np.diff(coo.indptr), np.maximum(lengths - k, 0))
            for i in range(0, A.shape[0], 7):
                row = slice(A.indptr[i], A.indptr[i + 1])
                got = np.concatenate([ell.indices[ell.indptr[i]:ell.indptr[i + 1]],
                                      coo.indices[coo.indptr[i]:coo.indptr[i + 1]]])
                np.testing.assert_array_equal(got, A.indices[row])
            np.testing.assert_allclose((ell + coo).toarray(), A.toarray())


# ------------------------------------------------------------------ devices and params


@pytest.mark.parametrize("override", [dict(simd_width=32),
                                      dict(simd_width=64, device_type="gpu")],
                         ids=["simd32", "gpu-simd64"])
@with_dtypes
def test_profile_overrides(override, dtype, device, rng):
    skip_without_fp64(device, dtype)
    dev = device.override(**override)
    lengths = mixed_lengths(rng, 5000, 3000)
    lengths[100] = 2999
    A = csr_from_row_lengths(rng, lengths, 3000)
    for params in ({}, dict(ell_width=4), dict(breakeven_threshold=0)):
        op = psc.SpMV(A, format="hyb", dtype=dtype, device=dev, **params)
        if override.get("device_type") == "gpu":
            assert op.params["layout"] == "interleaved" and op.params["scan"] == "tree"
        check_all(op, A, dtype, rng)


@pytest.mark.parametrize("index_bits", [32, 64])
@pytest.mark.parametrize("width", [0, 3, 60])
def test_nbytes(width, index_bits, device, rng):
    """ELL arrays (stride * K slots) + COO arrays + two carries per COO chunk."""
    lengths = mixed_lengths(rng, 300, 100)
    A = csr_from_row_lengths(rng, lengths, 100)
    op = psc.SpMV(A, format="hyb", dtype=np.float64, device=device, ell_width=width,
                  index_bits=index_bits)
    impl = op._impl
    isz, rsz = index_bits // 8, 8
    slots = impl.width * impl.stride
    coo_nnz = op.params["coo_nnz"]
    chunk = op.params["coo_work_group_size"] * op.params["items_per_thread"]
    groups = -(-coo_nnz // chunk)
    stored = groups * chunk if op.params["layout"] == "interleaved" else coo_nnz
    expected = slots * (isz + rsz) + stored * (2 * isz + rsz) + 2 * groups * (isz + rsz)
    assert op.nbytes == expected
    assert impl.width == min(width, lengths.max())


@with_dtypes
def test_deterministic(dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = csr_from_row_lengths(rng, mixed_lengths(rng, 3000, 2000), 2000)
    x = rng.standard_normal(2000)
    op = psc.SpMV(A, format="hyb", dtype=dtype, device=device, ell_width=2,
                  coo_work_group_size=4, items_per_thread=16)
    first = op.matvec(x, out=poisoned(3000, dtype))
    for _ in range(3):
        assert np.array_equal(op.matvec(x, out=poisoned(3000, dtype)), first)


def test_coo_geometry_parameters(device, rng):
    A = csr_from_row_lengths(rng, mixed_lengths(rng), 400)
    op = psc.SpMV(A, format="hyb", dtype=np.float32, device=device, ell_width=2,
                  coo_work_group_size=16, items_per_thread=3, layout="interleaved",
                  scan="tree", work_group_size=32)
    assert (op.params["coo_work_group_size"], op.params["items_per_thread"],
            op.params["layout"], op.params["scan"], op.params["work_group_size"]) == \
        (16, 3, "interleaved", "tree", 32)
    check_all(op, A, np.float32, rng)


def test_bad_parameters(device, rng):
    A = csr_from_row_lengths(rng, [3, 0, 2], 5)
    for bad in (dict(ell_width=-1), dict(ell_width=1.5), dict(ell_width=True),
                dict(relative_speed=0), dict(relative_speed="fast"),
                dict(breakeven_threshold=-5), dict(breakeven_threshold=2.5),
                dict(coo_work_group_size=0),
                dict(coo_work_group_size=device.profile.max_work_group_size + 1),
                dict(items_per_thread=0), dict(layout="x"), dict(scan="x"),
                dict(work_group_size=0)):
        with pytest.raises(ValueError):
            psc.SpMV(A, format="hyb", device=device, **bad)
    with pytest.raises(TypeError, match="max_padding"):
        psc.SpMV(A, format="hyb", device=device, max_padding=3)
