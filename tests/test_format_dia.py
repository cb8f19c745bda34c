"""``dia``: the diagonal layout read back (offsets, consecutive rows at consecutive
addresses), stored zeros versus padding (validity bitmap only when a stored value is
zero; 0 * inf = NaN through a stored zero, nothing through padding), duplicates kept
as separate products (layers), stencils and banded matrices accepted, refusals (too
many diagonals, too much fill) with their numbers, work-group sizes and GPU-shaped
profiles, footprint and parameter validation."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import CASES, band, check_against_scipy, check_all, check_then_update, with_holes
from matrix_cases import read_back as shared_read_back

import pyspmv_cl as psc
from pyspmv_cl.formats.dia import DEFAULT_MAX_DIAGONALS, dia_diagonals
from pyspmv_cl.formats.ell import SMALL_BYTES

with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
PROFILES = {"native": {}, "simd32": dict(simd_width=32),
            "gpu64": dict(simd_width=64, device_type="gpu")}
NO_LIMITS = dict(max_fill=float("inf"), max_diagonals=10**9)


def read_back(op):
    return shared_read_back(op, types={"data": op._impl.dtype, "mask": np.uint32})


def stencil_2d(k):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    return sp.csr_matrix(sp.kron(sp.identity(k), T) + sp.kron(T, sp.identity(k)))


def stencil_3d_27(k):
    T = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(k, k))
    A = sp.kron(sp.kron(T, T), T)
    return sp.csr_matrix(A - 28.0 * sp.identity(k ** 3))


# ------------------------------------------------------------------------ layout


def test_diagonals_and_layers():
    # Row 0: (0,2) (0,0) (0,2); row 1: (1,0); row 2: (2,2) (2,1) (2,2).
    A = sp.csr_matrix((np.arange(1.0, 8.0), np.array([2, 0, 2, 0, 2, 1, 2]),
                       np.array([0, 3, 4, 7])), shape=(3, 3))
    offsets, diag, rows = dia_diagonals(A)
    # Offsets -1, 0, 0 (layer 1), 2, 2 (layer 1): a repeated (row, col) goes to a second
    # copy of its diagonal.
    np.testing.assert_array_equal(offsets, [-1, 0, 0, 2, 2])
    np.testing.assert_array_equal(rows, [0, 0, 0, 1, 2, 2, 2])
    np.testing.assert_array_equal(diag, [3, 1, 4, 0, 1, 0, 2])
    # Without duplicates there are no layers.
    offsets, diag, _ = dia_diagonals(sp.csr_matrix(np.eye(4) + np.eye(4, k=3)))
    np.testing.assert_array_equal(offsets, [0, 3])
    np.testing.assert_array_equal(diag, [0, 1, 0, 0, 0])


@pytest.mark.parametrize("shape,nnz", [((300, 300), 2000), ((50, 4000), 900),
                                       ((4000, 30), 900), ((7, 3_000_000), 40)],
                         ids=["square", "wide", "tall", "very-wide-by-sort"])
def test_diagonals_by_count_match_unique(shape, nnz, rng):
    """The count over every possible diagonal gives np.unique's offsets and inverse,
    unsorted columns and entries on the first and last diagonals included; a matrix
    too wide for the count takes the sort."""
    m, n = shape
    rows = np.concatenate([[m - 1, 0], rng.integers(0, m, nnz)])
    cols = np.concatenate([[0, n - 1], rng.integers(0, n, nnz)])
    A = sp.coo_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=shape).tocsr()
    A.sum_duplicates()
    A.indices[A.indptr[1]:A.indptr[2]] = A.indices[A.indptr[1]:A.indptr[2]][::-1].copy()
    A.has_sorted_indices = False
    offsets, diag, got_rows = dia_diagonals(A)
    entry_rows = np.repeat(np.arange(m), np.diff(A.indptr))
    want, inverse = np.unique(A.indices - entry_rows, return_inverse=True)
    np.testing.assert_array_equal(got_rows, entry_rows)
    np.testing.assert_array_equal(offsets, want)
    np.testing.assert_array_equal(diag, inverse.ravel())
    assert offsets[0] == -(m - 1) and offsets[-1] == n - 1


@pytest.mark.parametrize("bits", [32, 64])
@with_dtypes
def test_layout_on_device_and_nbytes(bits, dtype, device, rng):
    skip_without_fp64(device, dtype)
    k = 37
    A = sp.csr_matrix(sp.diags([rng.standard_normal(k - 3), rng.standard_normal(k),
                                rng.standard_normal(k - 1)], [-3, 0, 1]))
    op = psc.SpMV(A, format="dia", dtype=dtype, device=device.override(simd_width=32),
                  index_bits=bits)
    impl = op._impl
    assert impl.stride == 64 and impl.n_diags == 3 and not impl.has_mask
    arrays = read_back(op)
    assert set(arrays) == {"offsets", "data"}
    np.testing.assert_array_equal(arrays["offsets"], [-3, 0, 1])
    data = arrays["data"].reshape(3, 64)
    dense = A.toarray()
    rows = np.arange(k)
    for d, off in enumerate([-3, 0, 1]):
        ok = (rows + off >= 0) & (rows + off < k)
        # Consecutive rows at consecutive addresses; slots outside the matrix hold 0.
        np.testing.assert_array_equal(data[d, rows[ok]], dense[rows[ok], rows[ok] + off]
                                      .astype(dtype))
        assert not data[d, rows[~ok]].any() and not data[d, k:].any()
    assert op.nbytes == 3 * 64 * np.dtype(dtype).itemsize + 3 * bits // 8
    assert op.nbytes == sum(a.nbytes for a in arrays.values())
    check_all(op, A, dtype, rng)


@with_dtypes
def test_stored_zeros_versus_padding(dtype, device, rng):
    """A stored zero times inf is NaN (scipy), a padding slot contributes nothing; the
    bitmap marks exactly the stored slots."""
    skip_without_fp64(device, dtype)
    n = 300
    A = sp.csr_matrix(sp.diags([rng.standard_normal(n - 1), rng.standard_normal(n),
                                rng.standard_normal(n - 5)], [-1, 0, 5]))
    A.data[rng.random(A.nnz) < 0.25] = 0.0
    A.data[7] = -0.0  # negative zero is a zero too
    op = psc.SpMV(A, format="dia", dtype=dtype, device=device)
    impl = op._impl
    assert impl.has_mask
    arrays = read_back(op)
    bits = np.unpackbits(arrays["mask"].view(np.uint8), bitorder="little")
    assert bits.sum() == A.nnz
    assert op.nbytes == sum(a.nbytes for a in arrays.values())
    for special in (np.inf, -np.inf, np.nan):
        x = rng.standard_normal(n)
        x[rng.choice(n, 30, replace=False)] = special
        y = op.matvec(x, out=poisoned(n, dtype))
        check_against_scipy(y, A, x, dtype)
    # Without stored zeros, no bitmap, and padding still never multiplies inf.
    B = sp.csr_matrix(sp.diags([np.ones(n - 1), np.ones(n - 40)], [1, -40]))
    op = psc.SpMV(B, format="dia", dtype=dtype, device=device)
    assert not op._impl.has_mask and "mask" not in op._impl.buffers
    x = np.full(n, np.inf)
    y = op.matvec(x, out=poisoned(n, dtype))
    check_against_scipy(y, B, x, dtype)
    assert np.isposinf(y[:-1]).all() and not np.isnan(y).any()


@with_dtypes
def test_duplicates_are_separate_products(dtype, device, rng):
    """Each repeat of a (row, col) is its own stored entry, multiplied on its own as
    scipy does: +inf and -inf repeats, 1 and -1 repeats against x = inf (NaN), repeats
    of stored zeros against inf."""
    skip_without_fp64(device, dtype)
    cols = np.array([1, 1, 2, 2, 0, 0, 0, 3, 3])  # rows 0, 0, 1, 1, 2, 2, 2, 3, 3
    data = np.array([np.inf, -np.inf, 1.0, -1.0, 2.0, 0.0, 3.0, 0.0, 0.0])
    A = sp.csr_matrix((data, cols, np.array([0, 2, 4, 7, 9])), shape=(4, 4))
    A.has_canonical_format = False
    assert A.nnz == 9
    op = psc.SpMV(A, format="dia", dtype=dtype, device=device)
    # Offset -2 in 3 layers, 0 and 1 in 2 layers each.
    assert op._impl.n_diags == 7 and op._impl.has_mask
    for x in ([1.0, 0.0, np.inf, 2.0], [1.0, 2.0, 3.0, np.inf], [np.nan, 1.0, 1.0, 1.0]):
        x = np.array(x)
        y = op.matvec(x, out=poisoned(4, dtype))
        check_against_scipy(y, A, x, dtype)
    B = CASES["duplicates_coo"](rng)
    check_all(psc.SpMV(B, format="dia", dtype=dtype, device=device, **NO_LIMITS), B, dtype,
              rng)


# ------------------------------------------------------------------------ sweeps


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("wg", [None, 1, 64, 96, 512])
@with_dtypes
def test_work_group_sizes_and_profiles(wg, profile, dtype, device, rng):
    """Every case of the corpus, the unsuitable ones with the limits lifted."""
    skip_without_fp64(device, dtype)
    dev = device.override(**PROFILES[profile]) if PROFILES[profile] else device
    for case in ("row_length_sweep", "empty_rows", "one_long_row", "explicit_zeros",
                 "nan_inf_in_matrix", "unsorted_by_hand", "tall_3000x7", "wide_7x3000",
                 "1x1", "diagonal_1031"):
        A = CASES[case](rng)
        op = psc.SpMV(A, format="dia", dtype=dtype, device=dev, work_group_size=wg,
                      **NO_LIMITS)
        assert op.params["work_group_size"] <= (wg or 512)
        assert op._impl.stride % min(dev.profile.simd_width, 64) == 0
        check_all(op, A, dtype, rng)


@with_dtypes
def test_stencils_and_banded_accepted(dtype, device, rng):
    skip_without_fp64(device, dtype)
    n = 30000
    full = band(rng, n, 10)
    # A banded matrix with half of the band missing at random: fill about 2.
    sparse_band = with_holes(rng, full, 0.5)
    for A, n_diags in ((stencil_2d(300), 5), (stencil_3d_27(24), 27), (full, 21),
                       (sparse_band, 21)):
        op = psc.SpMV(A, format="dia", dtype=dtype, device=device)
        assert op._impl.n_diags == n_diags
        assert op.nbytes > SMALL_BYTES  # the limits applied, and this matrix passed them
        check_all(op, A, dtype, rng)


def test_refusals(device, rng):
    # Too many diagonals: a random sparse matrix.
    A = sp.random(3000, 3000, density=0.002, format="csr", random_state=rng)
    with pytest.raises(psc.FormatNotSuitableError, match="dia") as info:
        psc.SpMV(A, format="dia", device=device)
    text = str(info.value)
    n_diags = np.unique(A.tocoo().col - A.tocoo().row).size
    assert f"{n_diags} diagonals" in text and f"max_diagonals={DEFAULT_MAX_DIAGONALS}" in text
    assert "ell" in text and str(A.nnz) in text
    # Allowing the diagonals, the fill refuses it.
    with pytest.raises(psc.FormatNotSuitableError, match="max_fill=3"):
        psc.SpMV(A, format="dia", device=device, max_diagonals=10**6)
    # No limits: accepted and correct.
    check_all(psc.SpMV(A, format="dia", device=device, dtype=np.float32, **NO_LIMITS), A,
              np.float32, rng)
    # A tighter fill limit refuses a matrix the default accepts (fill 1.6 here).
    B = sp.csr_matrix(sp.diags([np.ones(200000), np.ones(50000)], [0, 150000]))
    psc.SpMV(B, format="dia", device=device)
    with pytest.raises(psc.FormatNotSuitableError, match="max_fill=1.5"):
        psc.SpMV(B, format="dia", device=device, max_fill=1.5)
    with pytest.raises(psc.FormatNotSuitableError, match="max_diagonals=1"):
        psc.SpMV(B, format="dia", device=device, max_diagonals=1)


def test_small_matrices_never_refused(device, rng):
    for case in ("dense_1_x_3000", "dense_33x33", "wide_7x3000", "power_law"):
        A = CASES[case](rng)
        if case == "power_law":
            A = A[:50]
        op = psc.SpMV(A, format="dia", device=device, dtype=np.float32, max_fill=1,
                      max_diagonals=1)
        assert op.nbytes <= SMALL_BYTES
        check_all(op, A, np.float32, rng)


def test_device_memory_refusal(device):
    A = stencil_2d(100)
    with pytest.raises(psc.FormatNotSuitableError, match="dia.*more than"):
        psc.SpMV(A, format="dia", device=device.override(max_alloc_size=10_000))


@pytest.mark.parametrize("bad", [dict(max_fill=0.5), dict(max_fill="3"), dict(max_fill=True),
                                 dict(max_diagonals=0), dict(max_diagonals=2.5),
                                 dict(work_group_size=0)])
def test_bad_parameters(bad, device, rng):
    with pytest.raises(ValueError, match=next(iter(bad))):
        psc.SpMV(CASES["empty_rows"](rng), format="dia", device=device, **bad)


def test_estimate_cost(device):
    """The tuner's model (moved from the tuner): the diagonal slots' bytes; not worth
    timing for rows too uneven to count diagonals or a fill above 3."""
    from pyspmv_cl.features import MatrixFeatures
    from pyspmv_cl.formats.dia import DIA

    f = MatrixFeatures(n_rows=1000, n_cols=1000, nnz=2990, mean_row_length=2.99,
                       max_row_length=3, std_row_length=0.1, empty_rows=0, diagonals=3)
    assert DIA.estimate_cost(f, device.profile, np.float32) == (3 * 1000 * 4, None)
    assert DIA.estimate_cost(f, device.profile, np.float64) == (3 * 1000 * 8, None)
    cost, why = DIA.estimate_cost(dataclasses.replace(f, diagonals=-1), device.profile,
                                  np.float32)
    assert cost is None and "uneven" in why
    cost, why = DIA.estimate_cost(dataclasses.replace(f, diagonals=9), device.profile,
                                  np.float32)
    assert cost is None and "9 diagonals, fill 3.0x" in why


def test_no_limit_is_inf_and_round_trips(device, rng):
    """max_fill and max_diagonals take inf for no limit (None keeps the default, as for
    every parameter), and op.params gives back what builds the same operator."""
    import scipy.sparse as sp
    n = 3000
    offsets = list(range(-700, 700, 2))   # 700 diagonals: over the default 512
    A = sp.diags([np.ones(n - abs(k)) for k in offsets], offsets, format="csr")
    with pytest.raises(psc.FormatNotSuitableError, match="max_diagonals"):
        psc.SpMV(A, format="dia", device=device, max_diagonals=None)
    op = psc.SpMV(A, format="dia", device=device, max_diagonals=float("inf"),
                  max_fill=float("inf"))
    assert op.params["max_diagonals"] == float("inf") and op.params["max_fill"] == float("inf")
    again = psc.SpMV(A, format="dia", device=device, **op.params)
    assert again.params == op.params
    x = rng.standard_normal(n)
    np.testing.assert_allclose(again @ x, A @ x, rtol=1e-10, atol=1e-10)
    for bad in (0, 2.5, "3", True):
        with pytest.raises(ValueError, match="max_diagonals"):
            psc.SpMV(A, format="dia", device=device, max_diagonals=bad)


def test_a_stale_canonical_flag_keeps_duplicates(device, rng):
    """scipy caches has_canonical_format; an edit of indices in place afterwards leaves
    it True over a duplicate, which dia took on trust (it lost the duplicate, and
    update_values then raised pyopencl's INVALID_VALUE: a test drive)."""
    skip_without_fp64(device, np.float64)
    A = band(rng, 40, 2)
    assert A.has_canonical_format   # read once: scipy keeps it
    A.indices[A.indptr[5] + 1] = A.indices[A.indptr[5]]   # a duplicate, flag stale
    assert A.has_canonical_format
    op = psc.SpMV(A, format="dia", dtype=np.float64, device=device)
    check_then_update(op, A, rng)
