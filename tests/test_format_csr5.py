"""``csr5``: the tile layout against a direct per-tile construction (bit_flag, y_offset,
seg_offset bit fields, tile_ptr with its empty-row sign bit, empty_offset), the exact
CSR round trip, empty rows at every position of a tile, rows longer than a tile and a
work-group, nnz not a multiple of a tile and below one, omega/sigma/work-group sweeps
(one and several descriptor words, both segmented sums), GPU-shaped omegas, Inf/NaN
staying in their rows, determinism, 64-bit indices, footprint, validation, and the
sigma rule with its remembered bounds and calibration."""

import json
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import check_against_scipy, check_all, csr_from_row_lengths

import pyspmv_cl as psc
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats import csr5_calibration, csr5_model
from pyspmv_cl.formats.csr5 import CSR5, field_bits, tile_arrays, untranspose_tiles

pytestmark = pytest.mark.skipif("csr5" not in psc.formats(), reason="no csr5 format")
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)

GPU_PROFILES = {"gpu32": dict(simd_width=32, device_type="gpu"),
                "gpu64": dict(simd_width=64, device_type="gpu")}


def tricky_rows(rng, omega, sigma, n=None):
    """Row lengths built around tiles of omega*sigma: empty rows first and last in the
    matrix, runs of empty rows spanning tile boundaries, rows longer than several
    tiles, a row ending exactly at a tile boundary, short rows, nnz not a multiple."""
    tile = omega * sigma
    n = n or 3 * tile + 2
    lengths = list(rng.integers(0, 4, 20)) + [0, 0, 0]
    lengths += [3 * tile + 1] + [0] * 40 + [1] * 5 + [tile] + [0] * 3
    lengths += list(rng.integers(0, 7, 60)) + [2 * tile - 1] + [0] * 7 + [1]
    lengths = np.array([0] + lengths + list(rng.integers(0, 3, 30)) + [0, 0], dtype=np.int64)
    lengths = np.minimum(lengths, n)
    # Row 50 ends exactly at a tile boundary, and empty rows follow it.
    lengths[50] = min(n, lengths[50] + (-lengths[:51].sum()) % tile)
    lengths[51:54] = 0
    return csr_from_row_lengths(rng, lengths, n)


def reference_layout(A, omega, sigma):
    """The CSR5 arrays built tile by tile, as the paper describes them."""
    indptr = A.indptr.astype(np.int64)
    m, nnz, tile = A.shape[0], A.nnz, omega * sigma
    p_full, p = nnz // tile, -(-nnz // tile)
    row_of = np.repeat(np.arange(m), np.diff(indptr))
    lengths = np.diff(indptr)
    first_row = [int(row_of[t * tile]) for t in range(p)] + [m]
    tiles = []
    for t in range(p_full):
        entries = np.arange(t * tile, (t + 1) * tile)
        start = np.isin(entries, indptr[:-1][lengths > 0])
        start[0] = True
        flags = start.reshape(omega, sigma)                      # [column, step]
        count = flags.sum(axis=1)
        y_offset = np.concatenate([[0], np.cumsum(count)[:-1]])
        seg_offset = np.zeros(omega, dtype=np.int64)
        for i in range(omega):
            k = i + 1
            while k < omega and count[k] == 0:
                k += 1
            seg_offset[i] = k - i - 1
        has_empty = bool((lengths[first_row[t] + 1:first_row[t + 1]] == 0).any())
        segment_rows = row_of[entries[start]] - first_row[t]
        tiles.append((flags, y_offset, seg_offset, has_empty, segment_rows))
    return first_row, tiles


def decode_desc(desc, p_full, omega, sigma):
    y_bits, seg_bits, words = field_bits(omega, sigma)
    desc = desc.reshape(p_full, words, omega).astype(np.uint64)
    full = np.zeros((p_full, omega), dtype=object)
    for w in range(words):
        full = full + (desc[:, w, :].astype(object) << (32 * w))
    y_offset = (full & ((1 << y_bits) - 1)).astype(np.int64)
    seg_offset = ((full >> y_bits) & ((1 << seg_bits) - 1)).astype(np.int64)
    flags = np.zeros((p_full, omega, sigma), dtype=bool)
    for j in range(sigma):
        flags[:, :, j] = ((full >> (y_bits + seg_bits + j)) & 1).astype(bool)
    return y_offset, seg_offset, flags


# ------------------------------------------------------------------------ layout (host)


@pytest.mark.parametrize("omega,sigma", [(1, 1), (4, 3), (8, 16), (32, 4), (4, 40), (64, 7)])
def test_layout_matches_the_paper(omega, sigma, rng):
    A = tricky_rows(rng, omega, sigma)
    arrays = tile_arrays(A.indptr, A.indices, A.data, omega, sigma, np.int32, np.float64)
    first_row, tiles = reference_layout(A, omega, sigma)
    tile, p_full = omega * sigma, A.nnz // omega // sigma
    sign = np.uint32(1 << 31)
    tile_ptr = arrays["tile_ptr"]
    assert tile_ptr.dtype == np.uint32 and tile_ptr.size == -(-A.nnz // tile) + 1
    np.testing.assert_array_equal(tile_ptr & ~sign, first_row)
    y_offset, seg_offset, flags = decode_desc(arrays["tile_desc"], p_full, omega, sigma)
    eo_ptr, eo = arrays.get("empty_offset_ptr"), arrays.get("empty_offset")
    for t, (ref_flags, ref_y, ref_seg, has_empty, segment_rows) in enumerate(tiles):
        np.testing.assert_array_equal(flags[t], ref_flags)
        np.testing.assert_array_equal(y_offset[t], ref_y)
        np.testing.assert_array_equal(seg_offset[t], ref_seg)
        assert bool(tile_ptr[t] & sign) == has_empty
        if has_empty:
            np.testing.assert_array_equal(eo[eo_ptr[t]:eo_ptr[t + 1]], segment_rows)
        elif eo_ptr is not None:
            assert eo_ptr[t] == eo_ptr[t + 1]
    assert any(t[3] for t in tiles) == ("empty_offset" in arrays)
    # Complete tiles transposed in place, the incomplete one left in CSR order.
    n = p_full * tile
    for name, src in (("col_idx", A.indices), ("values", A.data)):
        out = arrays[name]
        np.testing.assert_array_equal(
            out[:n].reshape(p_full, sigma, omega), src[:n].reshape(p_full, omega, sigma)
            .transpose(0, 2, 1))
        np.testing.assert_array_equal(out[n:], src[n:])
        np.testing.assert_array_equal(untranspose_tiles(out, omega, sigma), src)


def test_field_widths():
    assert field_bits(32, 16) == (9, 5, 1)      # the paper's example: 9 + 5 + 16 = 30 bits
    assert field_bits(64, 4) == (8, 6, 1)
    assert field_bits(32, 32) == (10, 5, 2)     # 47 bits: two words per column
    assert field_bits(4, 200) == (10, 2, 7)
    assert field_bits(1, 1) == (1, 1, 1)


# ------------------------------------------------------------------------ SpMV


@pytest.mark.parametrize("profile", [None, "gpu32", "gpu64"])
@with_dtypes
def test_tile_edge_cases(profile, dtype, device, rng):
    """Default omega for the profile, small sigmas: empty rows first/last in tiles and in
    runs across tiles, long rows, nnz below one tile and not a multiple of one."""
    skip_without_fp64(device, dtype)
    dev = device if profile is None else device.override(**GPU_PROFILES[profile])
    omega = dev.profile.simd_width if dev.profile.is_gpu else dev.profile.lanes(dtype)
    sigma = 3
    cases = [tricky_rows(rng, omega, sigma),
             csr_from_row_lengths(rng, [0, 3, 0, 0, 2, 0], 9),           # nnz < one tile
             sp.csr_matrix((40, 7)), sp.csr_matrix((3, 0)), sp.csr_matrix((0, 4)),
             sp.random(2000, 3, density=0.5, format="csr", random_state=rng),   # tall
             sp.random(3, 2000, density=0.5, format="csr", random_state=rng)]   # wide
    for i, A in enumerate(cases):
        op = psc.SpMV(A, format="csr5", dtype=dtype, device=dev, sigma=sigma)
        assert op.params["omega"] == omega and op.params["sigma"] == sigma
        assert op.params["work_group_size"] % omega == 0
        if i == 0:
            check_all(op, A, dtype, rng)
        else:
            x = rng.standard_normal(A.shape[1])
            check_against_scipy(op.matvec(x, out=poisoned(A.shape[0], dtype)), A, x, dtype)


# (omega, sigma, work_group_size, segmented_sum): one and several descriptor words,
# non-power-of-two sigmas, one tile per group and several, omega = 1.
GEOMETRIES = [(1, 1, 4, "serial"), (1, 7, 1, "scan"), (4, 3, 8, "scan"), (8, 16, 64, "serial"),
              (16, 33, 32, "scan"), (32, 5, 32, "serial"), (64, 2, 128, "scan"),
              (4, 70, 16, "serial")]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "w{}-s{}-wg{}-{}".format(*g))
def test_geometries(geometry, device, rng):
    omega, sigma, wg, segmented_sum = geometry
    cases = [tricky_rows(rng, omega, sigma), tricky_rows(rng, omega, sigma, n=30)]
    for A in cases:
        op = psc.SpMV(A, format="csr5", dtype=np.float32, device=device, omega=omega,
                      sigma=sigma, work_group_size=wg, segmented_sum=segmented_sum)
        assert (op.params["omega"], op.params["sigma"]) == (omega, sigma)
        assert op.params["work_group_size"] == wg
        check_all(op, A, np.float32, rng)


@pytest.mark.parametrize("segmented_sum", ["scan", "serial"])
@with_dtypes
def test_rows_longer_than_a_work_group(segmented_sum, dtype, device, rng):
    """A row spanning many work-groups, others ending at the tile edges around it."""
    skip_without_fp64(device, dtype)
    lengths = rng.integers(0, 5, 300)
    lengths[[0, 100, 101, 299]] = 0
    lengths[102] = 20_000
    A = csr_from_row_lengths(rng, lengths, 25_000)
    op = psc.SpMV(A, format="csr5", dtype=dtype, device=device, omega=8, sigma=4,
                  work_group_size=16, segmented_sum=segmented_sum)
    check_all(op, A, dtype, rng)


@pytest.mark.parametrize("run_group", [1, 2, 8, 64])
def test_run_sums(run_group, device, rng):
    """The run-sums pass (rows over many tiles): rows spanning several run groups,
    starting and ending on group and tile boundaries, one reaching into the incomplete
    last tile, empty rows between them; correct with and without the pass, and
    bit-identical from run to run."""
    omega, sigma = 4, 2                      # tiles of 8 entries
    tile = omega * sigma
    lengths = np.concatenate([[0, 3], [run_group * tile * 3 + 5], [0] * 4, [1, 2],
                              [tile * run_group], [tile], rng.integers(0, 4, 50),
                              [0, 0], [7 * tile * run_group]]).astype(np.int64)
    lengths[-1] += tile // 2 - lengths.sum() % tile    # ... ending in the incomplete tile
    A = csr_from_row_lengths(rng, lengths, 8000)
    assert A.nnz % tile == tile // 2
    op = psc.SpMV(A, format="csr5", dtype=np.float32, device=device, omega=omega,
                  sigma=sigma, work_group_size=8, run_group=run_group)
    assert op.params["run_group"] == run_group
    check_all(op, A, np.float32, rng)
    x = rng.standard_normal(A.shape[1])
    first = op @ x
    assert np.array_equal(op @ x, first)
    check_against_scipy(first, A, x, np.float32)
    serial = psc.SpMV(A, format="csr5", dtype=np.float32, device=device, omega=omega,
                      sigma=sigma, work_group_size=8, run_group=0)
    check_against_scipy(serial @ x, A, x, np.float32)


def test_run_sums_default(device, rng):
    """On by default exactly when the longest row spans more than LONG_RUN_TILES tiles."""
    from pyspmv_cl.formats.csr5 import LONG_RUN_TILES
    tile = 4 * 2
    for longest, expect_on in ((LONG_RUN_TILES * tile, False), (LONG_RUN_TILES * tile + 1, True)):
        A = csr_from_row_lengths(rng, [3, longest, 0, 5], 4000)
        op = psc.SpMV(A, format="csr5", dtype=np.float32, device=device, omega=4, sigma=2)
        assert (op.params["run_group"] > 0) == expect_on
        check_against_scipy(op @ np.ones(4000), A, np.ones(4000), np.float32)
    # Its local buffers (a value and an index per work-item) fit the device.
    small = device.override(local_mem_size=1024)
    op = psc.SpMV(A, format="csr5", dtype=np.float32, device=small, omega=4, sigma=2)
    assert 0 < op.params["run_group"] <= 1024 // 12
    check_against_scipy(op @ np.ones(4000), A, np.ones(4000), np.float32)


@pytest.mark.parametrize("segmented_sum", ["scan", "serial"])
def test_inf_nan_stay_in_their_rows(segmented_sum, device, rng):
    """An Inf or NaN in x or A reaches exactly the rows scipy gives it, though rows of
    one tile are joined by the segmented sum (differences of a plain prefix sum would
    turn a neighbour's Inf into NaN)."""
    lengths = np.tile([1, 3, 0, 2, 5, 1, 0, 9], 40)
    A = csr_from_row_lengths(rng, lengths, 50)
    A.data[A.indptr[9]] = np.nan
    A.data[A.indptr[20]] = -np.inf
    op = psc.SpMV(A, format="csr5", dtype=np.float64 if device.profile.fp64 else np.float32,
                  device=device, omega=8, sigma=3, segmented_sum=segmented_sum)
    for special in (np.inf, -np.inf, np.nan):
        x = rng.standard_normal(50)
        x[A.indices[A.indptr[33]]] = special
        y = op.matvec(x, out=poisoned(A.shape[0], op.dtype))
        check_against_scipy(y, A, x, op.dtype)
        assert np.isfinite(y).sum() >= A.shape[0] // 2


@with_dtypes
def test_to_csr_round_trip(dtype, device, rng):
    """CSR -> CSR5 -> CSR gives back the same arrays: unsorted columns, duplicates and
    explicit zeros kept, tails and empty rows included."""
    skip_without_fp64(device, dtype)
    A = csr_from_row_lengths(rng, rng.integers(0, 30, 200), 90, shuffle=True)
    A.data[::7] = 0.0
    dup = sp.csr_matrix((np.ones(5), np.array([3, 3, 1, 3, 0]), np.array([0, 4, 4, 5])),
                        shape=(3, 5))
    dup.has_canonical_format = False
    for B in (A, dup, sp.csr_matrix((5, 3)), tricky_rows(rng, 4, 3)):
        op = psc.SpMV(B, format="csr5", dtype=dtype, device=device, omega=4, sigma=3)
        C = op._impl.to_csr()
        assert C.shape == B.shape and C.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(C.indptr, B.indptr)
        np.testing.assert_array_equal(C.indices, B.indices)
        np.testing.assert_array_equal(C.data, B.data.astype(dtype))


def test_deterministic_and_64_bit_indices(device, rng):
    lengths = rng.integers(0, 40, 3000)
    lengths[::17] = 0
    A = csr_from_row_lengths(rng, lengths, 500)
    x = rng.standard_normal(500)
    ops = [psc.SpMV(A, format="csr5", device=device, dtype=np.float32, index_bits=bits,
                    sigma=6) for bits in (32, 64)]
    assert ops[1].params["index_bits"] == 64
    first = ops[0] @ x
    for _ in range(3):
        assert np.array_equal(ops[0] @ x, first)
    check_against_scipy(ops[1] @ x, A, x, np.float32)
    assert np.array_equal(ops[1] @ x, first)   # same order of additions
    assert ops[1]._impl.index_dtype == np.int64
    assert ops[1]._impl.to_csr().nnz == A.nnz


@with_dtypes
def test_nbytes(dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = tricky_rows(rng, 4, 5)
    op = psc.SpMV(A, format="csr5", dtype=dtype, device=device, omega=4, sigma=5)
    arrays = tile_arrays(A.indptr, A.indices, A.data, 4, 5, np.int32, dtype)
    assert "empty_offset" in arrays
    scratch = 2 * (A.nnz // 20) * np.dtype(dtype).itemsize      # head and tail per tile
    tail_row_begin = np.searchsorted(A.indptr, (A.nnz // 20) * 20, side="right")
    empty_rows = (np.diff(A.indptr[:tail_row_begin + 1]) == 0).sum() * 4
    assert op.nbytes == sum(a.nbytes for a in arrays.values()) + scratch + empty_rows


BAD_PARAMS = [dict(omega=3), dict(omega=0), dict(omega=2048), dict(omega=4.0), dict(sigma=0),
              dict(sigma=True), dict(sigma=10_000), dict(omega=8, work_group_size=12),
              dict(segmented_sum="tree"), dict(work_group_size=0), dict(run_group=3),
              dict(run_group=-1), dict(run_group=1.5)]


@pytest.mark.parametrize("params", BAD_PARAMS, ids=[str(p) for p in BAD_PARAMS])
def test_bad_parameters(params, device, rng):
    A = tricky_rows(rng, 4, 4)
    with pytest.raises(ValueError, match="csr5"):
        psc.SpMV(A, format="csr5", device=device, **params)


# ------------------------------------------------------------------------ sigma rule


def features(nnz_per_row, rows=1000):
    return MatrixFeatures(rows, rows, int(rows * nnz_per_row), float(nnz_per_row),
                          int(nnz_per_row) + 1, 1.0, 0)


def test_sigma_rule_and_defaults(device, tmp_path, monkeypatch):
    monkeypatch.setenv("PYSPMV_CL_CACHE_DIR", str(tmp_path))
    nvidia, amd = csr5_model.DEFAULT_BOUNDS["nvidia"], csr5_model.DEFAULT_BOUNDS["amd"]
    assert [csr5_model.sigma_rule(n, nvidia) for n in (1, 4, 4.9, 5, 20, 32, 33, 256, 257)] \
        == [4, 4, 4, 5, 20, 32, 32, 32, 4]
    assert [csr5_model.sigma_rule(n, amd) for n in (2, 6, 8, 300)] == [4, 6, 7, 4]
    cpu = device.profile.replace(device_type="cpu")
    for dtype in (np.float32, np.float64):
        p = CSR5.default_params(features(5), cpu, dtype)
        assert p["omega"] == cpu.lanes(dtype) and p["sigma"] == 16
    for family, simd, bounds in (("nvidia", 32, nvidia), ("amd", 64, amd)):
        gpu = device.profile.replace(device_type="gpu", vendor_family=family, simd_width=simd,
                                     max_work_group_size=1024)
        for npr in (2, 6, 20, 100, 1000):
            p = CSR5.default_params(features(npr), gpu, np.float64)
            assert p["omega"] == simd and p["work_group_size"] % simd == 0
            assert p["sigma"] == csr5_model.sigma_rule(npr, bounds)
        cands = CSR5.tuning_candidates(features(20), gpu, np.float64)
        sigma = CSR5.default_params(features(20), gpu, np.float64)["sigma"]
        assert cands[0] == {} and 2 <= len(cands) <= 4
        assert {c["sigma"] for c in cands[1:]} <= {sigma // 2, 2 * sigma}


def test_remembered_bounds(device, tmp_path, monkeypatch):
    """The rule reads remembered bounds for this device, dtype and omega (one file
    each); a missing entry falls back to the paper's defaults, and so does a damaged
    one, with one warning; writing one entry leaves the others alone."""
    monkeypatch.setenv("PYSPMV_CL_CACHE_DIR", str(tmp_path))
    prof = device.profile
    omega = CSR5.default_params(features(30), prof, np.float32)["omega"]
    default = csr5_model.DEFAULT_BOUNDS[csr5_model.device_class(prof)]
    assert csr5_model.bounds_for(prof, np.float32, omega) == default
    p32 = csr5_model.remember_bounds(prof, np.float32, omega, (2, 40, 100, 3))
    p64 = csr5_model.remember_bounds(prof, np.float64, omega, (6, 6, 99, 6))
    root = tmp_path / csr5_model.BOUNDS_DIR
    assert p32 != p64 and sorted(root.rglob("*.json")) == sorted([p32, p64])
    assert not list(tmp_path.rglob(".tmp-*"))
    assert csr5_model.bounds_for(prof, np.float32, omega) == (2, 40, 100, 3)
    assert csr5_model.bounds_for(prof, np.float64, omega) == (6, 6, 99, 6)
    assert csr5_model.bounds_for(prof, np.float32, 2 * omega) == default   # other omega
    assert CSR5.default_params(features(30), prof, np.float32)["sigma"] == 30
    assert CSR5.default_params(features(500), prof, np.float32)["sigma"] == 3
    csr5_model.clear_memory()   # as a new process: read back from the files
    assert csr5_model.bounds_for(prof, np.float32, omega) == (2, 40, 100, 3)
    entry = json.loads(p32.read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for damage in ("{not json", json.dumps(dict(entry, bounds=["bad", 1, 2])),
                       json.dumps(dict(entry, key="0" + entry["key"]))):
            p32.write_text(damage)
            csr5_model.clear_memory()
            assert csr5_model.bounds_for(prof, np.float32, omega) == default
            assert csr5_model.bounds_for(prof, np.float64, omega) == (6, 6, 99, 6)
    damaged = [w for w in caught if "damaged CSR5 bounds" in str(w.message)]
    assert len(damaged) == 1, [str(w.message) for w in caught]
    assert csr5_model.remember_bounds(prof, np.float32, omega, (2, 40, 100, 3)) == p32
    csr5_model.clear_memory()
    assert csr5_model.bounds_for(prof, np.float32, omega) == (2, 40, 100, 3)


def test_bounds_past_the_largest_sigma_are_damaged(device, tmp_path, monkeypatch):
    """Remembered bounds that give a sigma past csr5's range (u = 1000: an edit, a bit
    flip) are a damaged file: the defaults, with one warning.  They passed before, and
    every csr5 operator failed ("sigma must be an integer in [1, 512], not 1000").
    The rule keeps its sigma in range too, whatever the bounds."""
    monkeypatch.setenv("PYSPMV_CL_CACHE_DIR", str(tmp_path))
    prof = device.profile
    omega = CSR5.default_params(features(30), prof, np.float32)["omega"]
    default = csr5_model.DEFAULT_BOUNDS[csr5_model.device_class(prof)]
    path = csr5_model.remember_bounds(prof, np.float32, omega, (2, 40, 100, 3))
    entry = json.loads(path.read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for bad in ([1, 1, 1, 1000], [2, 600, 700, 3], [513, 513, 600, 4]):
            path.write_text(json.dumps(dict(entry, bounds=bad)))
            csr5_model.clear_memory()
            assert csr5_model.bounds_for(prof, np.float32, omega) == default
            for npr in (1, 30, 650, 5000):
                sigma = CSR5.resolve_params(features(npr), prof, np.float32, {})["sigma"]
                assert sigma == csr5_model.sigma_rule(npr, default)
    damaged = [w for w in caught if "damaged CSR5 bounds" in str(w.message)]
    assert len(damaged) == 1, [str(w.message) for w in caught]
    # t is a row length, not a sigma: any size
    path.write_text(json.dumps(dict(entry, bounds=[2, 40, 10**6, 3])))
    csr5_model.clear_memory()
    assert csr5_model.bounds_for(prof, np.float32, omega) == (2, 40, 10**6, 3)
    assert csr5_model.MAX_SIGMA == 512
    rule = csr5_model.sigma_rule
    assert [rule(n, (1, 1, 1, 1000)) for n in (1, 2)] == [1, 512]
    assert [rule(n, (4, 900, 1000, 4)) for n in (3, 700, 950, 2000)] == [4, 512, 512, 4]
    assert rule(0, (0, 0, 0, 0)) == 1


def test_fit_bounds():
    assert csr5_model.fit_bounds({3: 8, 12: 16, 40: 32, 600: 4}) == (8, 32, 256, 4)
    assert csr5_model.fit_bounds({3: 16, 12: 8, 40: 8, 600: 16}) == (16, 16, 256, 16)
    assert csr5_model.fit_bounds({2: 4, 8: 8}) == (4, 4, 5, 8)


def test_calibration_matrices():
    A = csr5_calibration.fixed_length_matrix(500, 700, 40, seed=3)
    assert A.shape == (500, 700) and A.nnz == 500 * 40
    assert (np.diff(A.indptr) == 40).all() and A.has_sorted_indices
    assert (np.diff(A.indices.reshape(500, 40), axis=1) > 0).all()   # distinct columns
    assert A.indices.min() >= 0 and A.indices.max() < 700
    B = csr5_calibration.fixed_length_matrix(500, 700, 40, seed=3)
    assert (A != B).nnz == 0                                           # seeded
    assert csr5_calibration.fixed_length_matrix(3, 5, 5, seed=0).toarray().all()   # full


def test_calibrate_bounds(device, tmp_path, monkeypatch):
    """A short calibration measures, fits, remembers, and the rule then uses it."""
    monkeypatch.setenv("PYSPMV_CL_CACHE_DIR", str(tmp_path))

    def no_operator(*args, **kwargs):
        raise AssertionError("the calibration times the format class, not SpMV")

    monkeypatch.setattr(psc.SpMV, "__init__", no_operator)
    bounds, best = csr5_calibration.calibrate_bounds(
        device, np.float32, row_lengths=(3, 40), sigmas=(4, 16), nnz=2**14, repeats=2)
    assert set(best) == {3, 40} and set(best.values()) <= {4, 16}
    assert bounds == csr5_model.fit_bounds(best)
    omega = CSR5.default_params(features(3), device.profile, np.float32)["omega"]
    assert csr5_model.bounds_for(device.profile, np.float32, omega) == bounds
    p = CSR5.default_params(features(3), device.profile, np.float32)
    assert p["sigma"] == csr5_model.sigma_rule(3, bounds)
    with pytest.raises(ValueError, match="two row lengths"):
        csr5_calibration.calibrate_bounds(device, np.float32, row_lengths=(3,))
