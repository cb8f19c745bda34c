"""``coo``: segmented reduction over chunks of work_group_size * items_per_thread
non-zeros.  Rows split across many groups, row ends exactly at item and chunk
boundaries, nnz = chunk +- 1, every geometry the defaults can produce, both layouts and
scans, 64-bit chunk positions, determinism, GPU-shaped profiles, beta == 1 (the HYB
accumulation), footprint and parameter validation."""

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import check_against_scipy, check_all, csr_from_row_lengths

import pyspmv_cl as psc
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats.coo import CPU_ITEMS, default_coo_params

pytestmark = pytest.mark.skipif("coo" not in psc.formats(), reason="no coo format")
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)

# (work_group_size, items_per_thread, layout, scan): small chunks so that rows cross many
# groups and items; non-power-of-two groups for the tree scan; one-item groups.
GEOMETRIES = [(4, 8, "contiguous", "serial"), (8, 3, "interleaved", "tree"),
              (5, 7, "interleaved", "serial"), (24, 2, "contiguous", "tree"),
              (1, 16, "contiguous", "serial"), (32, 1, "interleaved", "tree")]
GEOMETRY_IDS = [f"wg{w}-T{t}-{lay[:5]}-{scan}" for w, t, lay, scan in GEOMETRIES]
with_geometries = pytest.mark.parametrize("geometry", GEOMETRIES, ids=GEOMETRY_IDS)


def coo_op(A, dtype, device, geometry=None, **kw):
    if geometry is not None:
        wg, items, layout, scan = geometry
        kw.update(work_group_size=wg, items_per_thread=items, layout=layout, scan=scan)
    op = psc.SpMV(A, format="coo", dtype=dtype, device=device, **kw)
    assert op.format == "coo"
    if geometry is not None:
        assert (op.params["work_group_size"], op.params["items_per_thread"],
                op.params["layout"], op.params["scan"]) == geometry
    return op


def n_groups(op):
    p = op.params
    return -(-op._impl.part.nnz // (p["work_group_size"] * p["items_per_thread"]))


# ------------------------------------------------------------------ rows across groups


@with_geometries
@with_dtypes
def test_one_row_across_many_groups(geometry, dtype, device, rng):
    """A row of 50,000 non-zeros among short and empty rows spans thousands of chunks:
    its value comes from a long run of carries."""
    skip_without_fp64(device, dtype)
    lengths = rng.integers(0, 5, 400)
    lengths[[0, 150, 151, 399]] = 0
    lengths[152] = 50_000
    A = csr_from_row_lengths(rng, lengths, 60_000)
    op = coo_op(A, dtype, device, geometry)
    assert n_groups(op) >= 50_000 // (geometry[0] * geometry[1])
    check_all(op, A, dtype, rng)
    # The long row first and last, and alone.
    for lengths in ([50_000, 3, 0, 2], [0, 2, 1, 50_000], [50_000]):
        A = csr_from_row_lengths(rng, lengths, 50_000)
        check_all(coo_op(A, dtype, device, geometry), A, dtype, rng)


@with_geometries
@with_dtypes
def test_row_ends_on_item_and_chunk_boundaries(geometry, dtype, device, rng):
    """Rows ending exactly where a work-item's run or a chunk ends, rows of exactly one
    item or one chunk, and rows of one non-zero each."""
    skip_without_fp64(device, dtype)
    wg, items = geometry[:2]
    chunk = wg * items
    patterns = [
        np.full(37, chunk),                               # every row is one chunk
        np.full(5 * wg + 3, items),                       # every row is one item's run
        np.tile([items, 0, chunk - items or chunk, 2 * chunk, 0, 0], 6),
        np.tile([chunk - 1, 1, chunk + 1, chunk - 1], 5),  # ends just off the boundaries
        np.ones(3 * chunk + 1, dtype=np.int64),            # a new row at every non-zero
    ]
    for lengths in patterns:
        A = csr_from_row_lengths(rng, lengths, int(max(lengths.max(), 1)) + 5)
        check_all(coo_op(A, dtype, device, geometry), A, dtype, rng)


@with_geometries
@with_dtypes
def test_nnz_around_one_chunk(geometry, dtype, device, rng):
    """nnz = chunk - 1, chunk, chunk + 1 (and 1, 2 chunks + 1): the last group full,
    short by one, or holding a single non-zero; rows split at random or one row only."""
    skip_without_fp64(device, dtype)
    chunk = geometry[0] * geometry[1]
    for nnz in {1, chunk - 1, chunk, chunk + 1, 2 * chunk + 1} - {0}:
        n = nnz + 3
        cuts = np.sort(rng.integers(0, nnz + 1, 6))
        lengths = np.diff(np.concatenate([[0], cuts, [nnz]]))
        for lens in (lengths, np.array([0, nnz, 0])):
            A = csr_from_row_lengths(rng, lens, n)
            assert A.nnz == nnz
            check_all(coo_op(A, dtype, device, geometry), A, dtype, rng)


@pytest.mark.parametrize("seed_round", range(3))
@with_dtypes
def test_random_geometries(seed_round, dtype, device, rng):
    """Random geometries on random matrices with long, short and empty rows."""
    skip_without_fp64(device, dtype)
    for _ in range(3):
        geometry = (int(rng.integers(1, 40)), int(rng.integers(1, 20)),
                    str(rng.choice(["interleaved", "contiguous"])),
                    str(rng.choice(["tree", "serial"])))
        m = int(rng.integers(1, 300))
        lengths = rng.integers(0, 12, m)
        lengths[rng.random(m) < 0.3] = 0
        lengths[rng.integers(0, m)] = rng.integers(200, 2000)
        A = csr_from_row_lengths(rng, lengths, 2100, shuffle=bool(rng.integers(0, 2)))
        check_all(coo_op(A, dtype, device, geometry), A, dtype, rng)


# ------------------------------------------------------------------ defaults and profiles


def _profiles(device):
    """The device's own profile and the GPU/CPU shapes the defaults distinguish."""
    base = device.profile
    return [base, base.replace(simd_width=32), base.replace(simd_width=64, device_type="gpu"),
            base.replace(simd_width=32, device_type="gpu"),
            base.replace(device_type="cpu", compute_units=64, max_work_group_size=4)]


NNZ_SWEEP = [0, 1, 100, 10_000, 10**6, 10**8, 10**10]


def default_geometries(device):
    seen = set()
    for profile in _profiles(device):
        for dtype in DTYPES:
            for nnz in NNZ_SWEEP:
                p = default_coo_params(nnz, profile, dtype)
                seen.add((p["work_group_size"], p["items_per_thread"], p["layout"], p["scan"]))
    return sorted(seen)


def test_defaults_are_the_documented_ones(device):
    """CPUs: small groups, contiguous runs of a power of two in CPU_ITEMS, serial scan;
    GPUs: 256-wide groups (a multiple of the warp), 8 (float32) / 4 (float64) items,
    interleaved, tree scan."""
    lo, hi = CPU_ITEMS
    for wg, items, layout, scan in default_geometries(device):
        if layout == "interleaved":
            assert (wg, scan) == (256, "tree") and items in (4, 8)
        else:
            assert scan == "serial" and wg <= 8
            assert lo <= items <= hi and items & (items - 1) == 0
    cpu = device.profile.replace(device_type="cpu")
    small = default_coo_params(1000, cpu, np.float32)["items_per_thread"]
    large = default_coo_params(10**9, cpu, np.float32)["items_per_thread"]
    assert (small, large) == (lo, hi)


@with_dtypes
def test_every_default_geometry(dtype, device, rng):
    """Each (work_group_size, items_per_thread, layout, scan) the defaults can produce,
    on a matrix spanning several of its chunks."""
    skip_without_fp64(device, dtype)
    for geometry in default_geometries(device):
        if geometry[0] > device.profile.max_work_group_size:
            continue
        chunk = geometry[0] * geometry[1]
        lengths = rng.integers(0, 40, max(8, 5 * chunk // 20))
        lengths[3] = 3 * chunk + 7
        A = csr_from_row_lengths(rng, lengths, 4 * chunk)
        op = coo_op(A, dtype, device, geometry)
        assert n_groups(op) >= 4
        check_all(op, A, dtype, rng)


@pytest.mark.parametrize("override", [dict(simd_width=32),
                                      dict(simd_width=64, device_type="gpu")],
                         ids=["simd32", "gpu-simd64"])
@with_dtypes
def test_profile_overrides(override, dtype, device, rng):
    """GPU-shaped defaults (interleaved layout, tree scan over 256 work-items) run on
    whatever device is present."""
    skip_without_fp64(device, dtype)
    dev = device.override(**override)
    lengths = rng.integers(0, 30, 3000)
    lengths[[5, 1000]] = [9000, 4096]
    lengths[2000:2100] = 0
    A = csr_from_row_lengths(rng, lengths, 10_000)
    op = psc.SpMV(A, format="coo", dtype=dtype, device=dev)
    for key, value in default_coo_params(A.nnz, dev.profile, dtype).items():
        assert op.params[key] == value
    if override.get("device_type") == "gpu":
        assert op.params["layout"] == "interleaved" and op.params["scan"] == "tree"
    check_all(op, A, dtype, rng)


# ------------------------------------------------------------------ properties


@with_dtypes
def test_deterministic(dtype, device, rng):
    """No atomics: repeated products, and a second operator, give bit-identical results."""
    skip_without_fp64(device, dtype)
    lengths = np.floor(rng.pareto(1.1, 5000)).astype(np.int64).clip(0, 3000)
    lengths[17] = 3000
    A = csr_from_row_lengths(rng, lengths, 3000)
    x = rng.standard_normal(3000) * 1e3
    for geometry in (GEOMETRIES[0], GEOMETRIES[1], None):
        ops = [coo_op(A, dtype, device, geometry) for _ in range(2)]
        results = [op.matvec(x, out=poisoned(A.shape[0], dtype)) for op in ops + ops]
        for y in results[1:]:
            assert np.array_equal(y, results[0])
        check_against_scipy(results[0], A, x, dtype)


@with_dtypes
def test_beta_one_leaves_empty_rows_alone(dtype, device, rng):
    """beta == 1 (how HYB adds its COO part) skips the empty-row pass: those rows keep
    exactly what y held, NaN included."""
    skip_without_fp64(device, dtype)
    lengths = rng.integers(0, 9, 500)
    lengths[::3] = 0
    A = csr_from_row_lengths(rng, lengths, 200)
    op = coo_op(A, dtype, device, GEOMETRIES[1])
    x = rng.standard_normal(200)
    y0 = rng.standard_normal(500).astype(dtype)
    y0[::6] = np.nan
    y = op.matvec(x, out=y0.copy(), alpha=3.0, beta=1.0)
    empty = lengths == 0
    np.testing.assert_array_equal(y[empty], y0[empty])
    finite = ~np.isnan(y0)
    check_against_scipy(y[finite], A[finite], x, dtype, 3.0, 1.0, y0[finite])


@pytest.mark.parametrize("shape", [(0, 0), (9, 0), (0, 4), (300, 41), (1, 1)])
@with_geometries
@with_dtypes
def test_no_nonzeros(shape, geometry, dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = sp.csr_matrix(shape, dtype=np.float64)
    op = coo_op(A, dtype, device, geometry)
    m, n = shape
    x = rng.standard_normal(n)
    np.testing.assert_array_equal(op.matvec(x, out=poisoned(m, dtype)), np.zeros(m))
    y0 = rng.standard_normal(m).astype(dtype)
    np.testing.assert_array_equal(op.matvec(x, out=y0.copy(), beta=-2.0), -2 * y0)
    np.testing.assert_array_equal(op.matvec(x, out=y0.copy(), beta=1.0), y0)


@with_dtypes
def test_64_bit_positions_and_indices(dtype, device, rng):
    """Chunks of 2**30 (and 2**31) non-zeros need 64-bit positions in the kernel even for
    a small matrix; index_bits=64 uses 64-bit rows and columns as well."""
    skip_without_fp64(device, dtype)
    lengths = rng.integers(0, 50, 300)
    lengths[100] = 4000
    A = csr_from_row_lengths(rng, lengths, 4000)
    for geometry in ((1, 2**30, "contiguous", "serial"), (2, 2**30, "contiguous", "tree")):
        op = coo_op(A, dtype, device, geometry)
        assert op._impl.part.pos_dtype == np.int64
        check_all(op, A, dtype, rng)
    op = coo_op(A, dtype, device, GEOMETRIES[1], index_bits=64)
    assert op.params["index_bits"] == 64 and op._impl.part.pos_dtype == np.int64
    check_all(op, A, dtype, rng)
    assert coo_op(A, dtype, device, GEOMETRIES[1])._impl.part.pos_dtype == np.int32


@pytest.mark.parametrize("index_bits", [32, 64])
@with_geometries
def test_nbytes(geometry, index_bits, device, rng):
    """rows + cols + values (the interleaved layout pads the last chunk), the empty-row
    list and two carries per group."""
    lengths = rng.integers(0, 30, 200)
    lengths[::7] = 0
    A = csr_from_row_lengths(rng, lengths, 100)
    op = coo_op(A, np.float32, device, geometry, index_bits=index_bits)
    isz = index_bits // 8
    chunk = geometry[0] * geometry[1]
    groups = -(-A.nnz // chunk)
    stored = groups * chunk if geometry[2] == "interleaved" else A.nnz
    expected = (stored * (2 * isz + 4) + int(np.count_nonzero(lengths == 0)) * isz
                + 2 * groups * (isz + 4))
    assert op.nbytes == expected


def test_bad_parameters(device, rng):
    A = csr_from_row_lengths(rng, [3, 0, 2], 5)
    for bad in (dict(items_per_thread=0), dict(items_per_thread=-4),
                dict(items_per_thread=2.5), dict(items_per_thread=True),
                dict(layout="rows"), dict(scan="parallel"), dict(work_group_size=0),
                dict(layout="interleaved", work_group_size=8, items_per_thread=2**20),
                dict(work_group_size=device.profile.max_work_group_size + 1)):
        with pytest.raises(ValueError):
            psc.SpMV(A, format="coo", device=device, **bad)
    with pytest.raises(TypeError, match="vector_size"):
        psc.SpMV(A, format="coo", device=device, vector_size=4)


def test_params_reported(device, rng):
    A = csr_from_row_lengths(rng, rng.integers(0, 10, 100), 50)
    op = psc.SpMV(A, format="coo", dtype=np.float32, device=device)
    expected = default_coo_params(MatrixFeatures.from_csr(A).nnz, device.profile, np.float32)
    for key, value in expected.items():
        assert op.params[key] == value
    assert op.params["index_bits"] == 32
