"""``bccoo`` (yaSpMV's BCCOO, and BCCOO+ with ``slices > 1``): the paper's running
examples read back from the device (bit flags, column indices, one value array per
block row, first result entries), every block shape, every bit-flag word, both
strategies, slices, offline transpose, column-delta compression, both scans, result
caches that overflow, rows across many groups (the carry kernel), the int column path
of matrices wider than 65535, fill entries that must not multiply Inf/NaN in x,
duplicates, GPU-shaped profiles, nbytes == the arrays and scratch == the static
footprint, the tuner's block-shape pruning and parameter validation."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import (
    CASES,
    check_against_scipy,
    check_all,
    check_then_update,
    csr_from_row_lengths,
    read_back,
)

import pyspmv_cl as psc
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats.bccoo import BCCOO, BLOCK_HEIGHTS, BLOCK_WIDTHS

pytestmark = pytest.mark.skipif("bccoo" not in psc.formats(), reason="no bccoo format")
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)

# Small tiles and groups so that rows cross threads and groups; each parameter value at
# least once (not the cross product).  Each entry: (params, dtype).
GRID = [
    (dict(strategy=1, tile_size=5, work_group_size=4, flag_bits=8, scan="serial"), np.float32),
    (dict(strategy=2, tile_size=7, work_group_size=8, flag_bits=8, transpose=True,
          col_compress=True, scan="tree"), np.float64),
    (dict(strategy=2, tile_size=3, work_group_size=5, flag_bits=16, slices=2,
          result_cache=2, scan="tree"), np.float32),
    (dict(strategy=1, tile_size=16, work_group_size=8, flag_bits=16, transpose=True,
          slices=5, block_height=2, block_width=2), np.float64),
    (dict(strategy=2, tile_size=33, work_group_size=3, flag_bits=32, result_cache=4,
          scan="serial", block_height=3, block_width=4, col_compress=True), np.float32),
    (dict(strategy=1, tile_size=1, work_group_size=1, flag_bits=8, slices=32,
          transpose=True, col_compress=True), np.float32),
    (dict(strategy=1, tile_size=40, work_group_size=16, flag_bits=32, block_height=4,
          block_width=1, scan="tree", col_compress=True, transpose=True), np.float64),
    (dict(strategy=2, tile_size=8, work_group_size=32, flag_bits=8, block_height=1,
          block_width=2, slices=3, transpose=True, scan="tree"), np.float64),
]
GRID_IDS = ["-".join(f"{k[:4]}{int(v) if isinstance(v, bool) else v}"
                     for k, v in p.items()) + f"-{np.dtype(d).name}" for p, d in GRID]
with_grid = pytest.mark.parametrize("params,dtype", GRID, ids=GRID_IDS)


def bccoo_op(A, dtype, device, **params):
    op = psc.SpMV(A, format="bccoo", dtype=dtype, device=device, **params)
    assert op.format == "bccoo"
    for key, value in params.items():
        if key != "work_group_size":    # the device may shrink it
            assert op.params[key] == value, key
    return op


def uneven(rng, m=300, n=500):
    """Short, empty (first, last, runs) and two long rows, unsorted columns."""
    lengths = rng.integers(0, 8, m)
    lengths[rng.random(m) < 0.25] = 0
    lengths[[0, m - 1]] = 0
    lengths[100:140] = 0
    lengths[[17, m // 2]] = [n, 3 * n // 4]
    return csr_from_row_lengths(rng, lengths, n, shuffle=True)


def flags_bits(words):
    """Bit flags unpacked from the device words (little-endian bit order)."""
    return np.unpackbits(words.view(np.uint8), bitorder="little")


# ------------------------------------------------------------------ the paper's examples

# Eq. 1 of the paper, a..p = 1..16.
EQ1 = np.array([[0, 0, 1, 0, 0, 0, 2, 3],
                [0, 0, 4, 5, 0, 0, 6, 0],
                [0, 0, 0, 0, 7, 8, 9, 10],
                [11, 12, 0, 0, 13, 14, 15, 16]], dtype=np.float64)


@pytest.mark.parametrize("slices", [1, 2])
def test_paper_figures_3_and_4(slices, device):
    """Matrix A of Eq. 1 with 2x2 blocks: BCCOO (Figure 3) and BCCOO+ with two slices
    (Figure 4): bit flags, block-column indices and the two value arrays."""
    A = sp.csr_matrix(EQ1)
    op = bccoo_op(A, np.float32, device, block_height=2, block_width=2, slices=slices,
                  tile_size=5, work_group_size=1, flag_bits=8, transpose=False)
    arrays = read_back(op, types={"flags": np.uint8, "cols": np.uint16,
                                  "first_entry": np.int32, "group_full": np.uint8})
    if slices == 1:
        flags, cols = [1, 0, 1, 1, 0], [1, 3, 0, 2, 3]
        rows = [[1, 0, 2, 3, 0, 0, 7, 8, 9, 10], [4, 5, 6, 0, 11, 12, 13, 14, 15, 16]]
    else:
        flags, cols = [0, 0, 0, 1, 0], [1, 0, 3, 2, 3]
        rows = [[1, 0, 0, 0, 2, 3, 7, 8, 9, 10], [4, 5, 11, 12, 6, 0, 13, 14, 15, 16]]
    assert list(flags_bits(arrays["flags"])[:5]) == flags
    assert list(arrays["cols"][:5]) == cols
    np.testing.assert_array_equal(arrays["values"][:20], np.concatenate(rows))
    x = np.arange(1.0, 9.0)
    np.testing.assert_allclose(op @ x, EQ1 @ x)


def test_paper_figure_6_first_result_entries(device):
    """Matrix C of Eq. 2 (1x1 blocks), four threads of four blocks: result entries
    0 0 2 3, and the per-group skip flag (one group, thread 0 has no stop: no skip)."""
    C = np.zeros((4, 8))
    for r, cs in enumerate([[0, 2, 4, 6, 7], [3, 6], [1, 3, 5], [1, 2, 3, 5, 6, 7]]):
        C[r, cs] = np.arange(1, len(cs) + 1)
    op = bccoo_op(sp.csr_matrix(C), np.float32, device, tile_size=4, work_group_size=4,
                  flag_bits=8, strategy=2)
    arrays = read_back(op, types={"first_entry": np.int32, "group_full": np.uint8})
    assert list(arrays["first_entry"][:5]) == [0, 0, 2, 3, 4]
    assert list(arrays["group_full"][:1]) == [0]
    x = np.linspace(-1, 2, 8)
    np.testing.assert_allclose(op @ x, C @ x, rtol=1e-6)



@pytest.mark.parametrize("slices", [1, 2])
def test_one_by_one_blocks_of_a_sorted_csr(slices, rng):
    """build_blocks' shortcut for 1 x 1 blocks whose keys are already in order (each
    entry a block, rows and columns taken as they are) gives the Blocks the general
    path gives the same matrix with each row's entries shuffled: empty rows (dummies),
    duplicates, stored zeros (-0.0) and int64 indices included."""
    from pyspmv_cl.formats.bccoo_convert import build_blocks

    for case in range(6):
        m, n = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        A = sp.random(m, n, density=float(rng.uniform(0.005, 0.2)), format="csr",
                      random_state=rng)
        if case % 2 or case == 4:   # no empty rows: the shortcut returns at once
            A = (A + sp.eye(m, n, format="csr")).tocsr()
        A.data[rng.random(A.nnz) < 0.1] = 0.0
        if case == 4:   # a copy of row 0's first entry beside it (scipy keeps both)
            at = A.indptr[0]
            A = sp.csr_matrix((np.insert(A.data, at, 2.5), np.insert(A.indices, at, A.indices[at]),
                               np.r_[A.indptr[:1], A.indptr[1:] + 1]), shape=A.shape)
        if case == 5:
            A.indices = A.indices.astype(np.int64)
            A.indptr = A.indptr.astype(np.int64)
        shuffled = A.copy()
        # A test's loop over rows: the shuffle itself (not row 0 when it holds the two
        # copies, whose order stays CSR's on both paths).
        for i in range(1 if case == 4 else 0, m):
            lo, hi = shuffled.indptr[i], shuffled.indptr[i + 1]
            p = rng.permutation(hi - lo) + lo
            shuffled.indices[lo:hi], shuffled.data[lo:hi] = A.indices[p], A.data[p]
        shuffled.has_sorted_indices = False
        fast = build_blocks(A, 1, 1, slices, np.float32)
        general = build_blocks(shuffled, 1, 1, slices, np.float32)
        for field in ("n_block_rows", "n_block_cols", "slices"):
            assert getattr(fast, field) == getattr(general, field)
        assert np.array_equal(fast.block_cols, general.block_cols)
        assert np.array_equal(fast.stops, general.stops)
        assert np.array_equal(fast.values.view(np.uint32), general.values.view(np.uint32))
        assert not np.shares_memory(fast.block_cols, A.indices)

def test_group_full_skips_the_scan(device, rng):
    """One non-zero per row and tiles of 4: every thread has a row stop, every group is
    flagged to skip the scan, and the results are still right; one long row clears it."""
    A = csr_from_row_lengths(rng, np.ones(64, dtype=np.int64), 50)
    op = bccoo_op(A, np.float32, device, tile_size=4, work_group_size=4)
    assert read_back(op, types={"group_full": np.uint8})["group_full"][:4].all()
    check_all(op, A, np.float32, rng)
    lengths = np.ones(64, dtype=np.int64)
    lengths[5] = 40
    A = csr_from_row_lengths(rng, lengths, 50)
    op = bccoo_op(A, np.float32, device, tile_size=4, work_group_size=4)
    full = read_back(op, types={"group_full": np.uint8})["group_full"][:op._impl.geometry[
        "n_groups"]]
    assert 0 < full.sum() < full.size
    check_all(op, A, np.float32, rng)


# ------------------------------------------------------------------ sweeps


SHAPES = list(itertools.product(BLOCK_HEIGHTS, BLOCK_WIDTHS))


@pytest.mark.parametrize("shape,dtype", [(s, DTYPES[i % 2]) for i, s in enumerate(SHAPES)],
                         ids=[f"{h}x{w}" for h, w in SHAPES])
def test_block_shapes(shape, dtype, device, rng):
    """Every block shape (float32 and float64 alternately: both strategies and dtypes
    meet every height and width), m and n not multiples of it, uneven rows across
    groups."""
    skip_without_fp64(device, dtype)
    h, w = shape
    A = uneven(rng, 301, 499)
    op = bccoo_op(A, dtype, device, block_height=h, block_width=w, tile_size=6,
                  work_group_size=4, strategy=1 + (h + w) % 2)
    check_all(op, A, dtype, rng)


@with_grid
def test_parameter_grid(params, dtype, device, rng):
    """Flag words, strategies, slices, transpose, compression, scans and result caches on
    uneven rows, a long first row, and a tall matrix."""
    skip_without_fp64(device, dtype)
    lengths = rng.integers(0, 4, 200)
    lengths[0] = 700
    for A in (uneven(rng), csr_from_row_lengths(rng, lengths, 800),
              sp.random(900, 9, density=0.3, format="csr", random_state=rng)):
        check_all(bccoo_op(A, dtype, device, **params), A, dtype, rng)


@pytest.mark.parametrize("case", ["m_x_0", "large_m_x_0", "0_x_n", "0x0", "all_rows_empty",
                                  "empty_rows", "one_long_row", "long_first_and_last_rows",
                                  "1x1", "dense_1_x_3000", "dense_3000_x_1", "wide_7x3000",
                                  "prime_nnz_997", "duplicates_csr", "unsorted_by_hand"])
def test_edge_cases_on_the_grid(case, device, rng):
    """The shared edge cases under several grid entries (the generic tests run them with
    the defaults)."""
    for params, dtype in (GRID[1], GRID[2], GRID[4]):
        if np.dtype(dtype) == np.float64 and not device.profile.fp64:
            continue
        A = CASES[case](rng)
        op = bccoo_op(A, dtype, device, **params)
        m, n = A.shape
        x = rng.standard_normal(n)
        check_against_scipy(op.matvec(x, out=poisoned(m, dtype)), A, x, dtype)
        y0 = rng.standard_normal(m).astype(dtype)
        check_against_scipy(op.matvec(x, out=y0.copy(), alpha=0.5, beta=-2.0), A, x, dtype,
                            0.5, -2.0, y0)


@pytest.mark.parametrize("strategy", [1, 2])
@with_dtypes
def test_rows_across_many_groups(strategy, dtype, device, rng):
    """A 20,000-long row among short ones spans hundreds of groups (a long carry chain);
    rows of one block each overflow a one-group result cache (strategy 2)."""
    skip_without_fp64(device, dtype)
    lengths = rng.integers(0, 4, 500)
    lengths[250] = 20_000
    for A in (csr_from_row_lengths(rng, lengths, 20_000),
              csr_from_row_lengths(rng, [20_000], 20_000),
              csr_from_row_lengths(rng, np.ones(3000, dtype=np.int64), 100)):
        op = bccoo_op(A, dtype, device, strategy=strategy, tile_size=4, work_group_size=8,
                      result_cache=1, scan="tree")
        check_all(op, A, dtype, rng)


@pytest.mark.parametrize("params", [dict(), dict(block_width=4, col_compress=True),
                                    dict(col_compress=True, slices=4, strategy=2)],
                         ids=["1x1", "1x4-compress", "compress-sliced"])
def test_wider_than_65535_uses_int_columns(params, device, rng):
    """n > 65535: block columns in int (ushort below), deltas that escape (-1) to the
    full index; both directions of the escape and columns near the end."""
    n = 70_001
    lengths = rng.integers(0, 30, 120)
    lengths[3] = 5000
    A = csr_from_row_lengths(rng, lengths, n, shuffle=True)
    ends = sp.csr_matrix(([2.5, -1.0, 3.0], ([0, 0, 0], [n - 1, 0, n - 2])), shape=(1, n))
    A = sp.vstack([A, ends, A[:5]], format="csr")
    op = bccoo_op(A, np.float32, device, tile_size=12, work_group_size=4, **params)
    assert op._impl.col_dtype == np.int32
    assert op._impl.buffers["cols"].size >= 4 * op._impl.geometry["n_blocks_padded"]
    check_all(op, A, np.float32, rng)
    narrow = bccoo_op(A[:, :65534].tocsr(), np.float32, device)
    assert narrow._impl.col_dtype == np.uint16


# ------------------------------------------------------------------ NaN / Inf


@pytest.mark.parametrize("shape,dtype", [((1, 1), np.float32), ((2, 2), np.float64),
                                         ((4, 4), np.float32), ((3, 2), np.float64)],
                         ids=["1x1", "2x2", "4x4", "3x2"])
def test_fill_never_multiplies_x(shape, dtype, device, rng):
    """Inf/NaN in x next to stored entries: the zeros that fill a block (and dummy and
    padding blocks) are skipped as scipy skips them; stored zeros, duplicates of one
    entry and Inf in A propagate as in scipy."""
    skip_without_fp64(device, dtype)
    h, w = shape
    A = csr_from_row_lengths(rng, rng.integers(0, 5, 120), 60, shuffle=True)
    A.data[rng.random(A.nnz) < 0.2] = 0.0
    A.data[:3] = [np.inf, -np.inf, np.nan]
    dup = sp.csr_matrix((np.array([1.0, -1.0, 2.0]), np.array([5, 5, 6]), np.array([0, 3])),
                        shape=(1, 60))
    dup.has_canonical_format = False
    A = sp.vstack([A, dup], format="csr")
    A.has_canonical_format = False
    params = dict(strategy=2, slices=3, transpose=True, col_compress=True) if h % 2 else {}
    op = bccoo_op(A, dtype, device, block_height=h, block_width=w, tile_size=4,
                  work_group_size=4, **params)
    assert A.indptr[-1] - A.indptr[-2] == 3   # the duplicate survived
    for special in (np.inf, -np.inf, np.nan):
        x = rng.standard_normal(60)
        x[rng.choice(60, 6, replace=False)] = special
        x[5] = special   # 1.0 * Inf + -1.0 * Inf = NaN in the last row
        y = op.matvec(x, out=poisoned(A.shape[0], dtype))
        check_against_scipy(y, A, x, dtype)
        assert np.isnan(y[-1])


# ------------------------------------------------------------------ profiles, determinism


@pytest.mark.parametrize("override", [dict(simd_width=32, device_type="gpu"),
                                      dict(simd_width=64, device_type="gpu"),
                                      dict(simd_width=32)],
                         ids=["gpu-simd32", "gpu-simd64", "simd32"])
@with_dtypes
def test_profile_overrides(override, dtype, device, rng):
    """GPU-shaped defaults (groups of 256, transposed tiles, tree scan) on short rows
    (strategy 1) and long rows (strategy 2); CPU defaults (strategy 2)."""
    skip_without_fp64(device, dtype)
    dev = device.override(**override)
    for A in (uneven(rng, 3000, 400), csr_from_row_lengths(rng, np.full(200, 300), 400)):
        op = psc.SpMV(A, format="bccoo", dtype=dtype, device=dev)
        features = MatrixFeatures.from_csr(A)
        defaults = BCCOO.default_params(features, dev.profile, dtype)
        for key, value in defaults.items():
            if key != "work_group_size":
                assert op.params[key] == value, key
        long_rows = features.mean_row_length >= defaults["tile_size"]
        if dev.profile.is_gpu:
            assert op.params["transpose"] and op.params["scan"] == "tree"
            assert op.params["strategy"] == (2 if long_rows else 1)
        else:
            assert op.params["strategy"] == 2
        check_all(op, A, dtype, rng)


@pytest.mark.parametrize("strategy", [1, 2])
def test_deterministic(strategy, device, rng):
    A = uneven(rng, 2000, 3000)
    op = bccoo_op(A, np.float32, device, strategy=strategy, tile_size=4, work_group_size=8,
                  result_cache=1, scan="tree")
    x = rng.standard_normal(3000)
    first = op @ x
    for _ in range(3):
        np.testing.assert_array_equal(op @ x, first)


# ------------------------------------------------------------------ footprint, tuning


@pytest.mark.parametrize("params,dtype", [
    (dict(), np.float32), (dict(), np.float64),
    (dict(block_height=3, block_width=2, flag_bits=8), np.float32),
    (dict(block_height=4, block_width=4, slices=7, col_compress=True, tile_size=13),
     np.float64)], ids=["defaults-f32", "defaults-f64", "3x2-f32", "4x4-sliced-f64"])
def test_nbytes_is_the_sum_of_arrays_and_the_static_footprint(params, dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = uneven(rng)
    op = bccoo_op(A, dtype, device, **params)
    impl = op._impl
    # The scratch buffers (per-group carries, BCCOO+'s partial results) count too.
    assert op.nbytes == (sum(b.size for b in impl.buffers.values())
                         + sum(impl.scratch_sizes().values()))
    p = op.params
    assert op.nbytes == BCCOO.footprint(
        A, p["block_height"], p["block_width"], dtype, slices=p["slices"],
        tile_size=p["tile_size"], work_group_size=p["work_group_size"],
        flag_bits=p["flag_bits"], col_compress=p["col_compress"])
    # Values: h * w per (padded) block; below CSR for 1x1 blocks (ushort columns, bits).
    g = impl.geometry
    assert impl.buffers["values"].size == (g["n_blocks_padded"] * p["block_height"]
                                           * p["block_width"] * np.dtype(dtype).itemsize)


def test_footprint_shapes_and_tuning_candidates(device, rng):
    """A matrix of dense 2x2 blocks: 2x2 beats 1x1 and the 4 candidates are the 4
    smallest footprints; without the matrix the tuner gets the defaults only."""
    base = csr_from_row_lengths(rng, rng.integers(1, 20, 2000), 300)
    A = sp.kron(base, np.ones((2, 2)), format="csr")
    # Small group tiles: padding to whole tiles does not blur the comparison.
    sizes = BCCOO.block_footprints(A, np.float32, tile_size=4, work_group_size=8)
    assert sizes[(2, 2)] < sizes[(1, 2)] < sizes[(1, 1)]
    features = MatrixFeatures.from_csr(A)
    profile = device.profile
    cands = BCCOO.tuning_candidates(features, profile, np.float32, csr=A)
    # GPUs add the smallest shape with the other tile size (8 for float32's 16).
    other_tiles = [c for c in cands if "tile_size" in c]
    cands = [c for c in cands if "tile_size" not in c]
    assert other_tiles == ([dict(cands[0], tile_size=8)] if profile.is_gpu else [])
    assert len(cands) == 4
    assert {"block_height": 2, "block_width": 2} in cands
    p = BCCOO.default_params(features, profile, np.float32)
    sizes = BCCOO.block_footprints(A, np.float32, tile_size=p["tile_size"],
                                   work_group_size=p["work_group_size"],
                                   flag_bits=p["flag_bits"])
    worst_kept = max(sizes[(c["block_height"], c["block_width"])] for c in cands)
    dropped = [s for shape, s in sizes.items()
               if {"block_height": shape[0], "block_width": shape[1]} not in cands]
    assert worst_kept <= min(dropped)
    assert BCCOO.tuning_candidates(features, profile, np.float32) == [{}]
    gpu = profile.replace(device_type="gpu", simd_width=32, max_work_group_size=1024)
    for dtype, tile in ((np.float32, 8), (np.float64, 16)):
        gpu_cands = BCCOO.tuning_candidates(features, gpu, dtype, csr=A)
        assert len(gpu_cands) == 5 and gpu_cands[1] == dict(gpu_cands[0], tile_size=tile)
    for cand in cands[:2]:
        check_all(psc.SpMV(A, format="bccoo", device=device, dtype=np.float32, **cand), A,
                  np.float32, rng)


@pytest.mark.parametrize("bad", [dict(block_height=5), dict(block_width=3), dict(flag_bits=12),
                                 dict(slices=0), dict(slices=33), dict(strategy=3),
                                 dict(tile_size=0), dict(tile_size=1000),
                                 dict(transpose="yes"), dict(col_compress=1),
                                 dict(result_cache=5), dict(scan="fast"),
                                 dict(block_height=True)], ids=str)
def test_invalid_parameters(bad, device):
    A = sp.random(20, 20, density=0.2, format="csr", random_state=0)
    with pytest.raises(ValueError, match="bccoo"):
        psc.SpMV(A, format="bccoo", device=device, **bad)


@pytest.mark.parametrize("params", [{}, {"block_height": 2, "block_width": 2},
                                    {"slices": 3}], ids=str)
def test_a_stale_canonical_flag_keeps_duplicates(params, device, rng):
    """scipy caches has_canonical_format; an edit of indices in place afterwards leaves
    it True over a duplicate, which the conversion took on trust (the duplicate's value
    was lost: a test drive). The library checks the arrays; update_values follows."""
    skip_without_fp64(device, np.float64)
    A = sp.random(30, 30, density=0.2, format="csr", random_state=int(rng.integers(99)))
    A.sort_indices()
    assert A.has_canonical_format   # read once: scipy keeps it
    row = int(np.argmax(np.diff(A.indptr)))
    A.indices[A.indptr[row] + 1] = A.indices[A.indptr[row]]   # a duplicate, flag stale
    assert A.has_canonical_format
    op = psc.SpMV(A, format="bccoo", dtype=np.float64, device=device, **params)
    check_then_update(op, A, rng)
