"""``cmrs`` (Compressed Multi-Row Storage): strip heights 1 ... 16 with m not a multiple
of the height, one work-item or a group per strip with both reductions, GPU-shaped
profiles, the layout read back and decoded into A (strip_ptr, row-in-strip packed into
the top 4 bits or kept in a separate byte array), the column sort inside strips,
empty strips and rows, NaN/Inf, the occupancy-based default height, tuning
candidates, footprint and validation."""

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import check_against_scipy, check_all, csr_from_row_lengths, read_back

import pyspmv_cl as psc
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats.cmrs import (
    CMRS,
    GPU_RESIDENT_WORK_ITEMS,
    default_height,
    fits_packed,
    occupancy_height,
)

pytestmark = pytest.mark.skipif("cmrs" not in psc.formats(), reason="no cmrs format")
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
GPU_PROFILES = {"gpu32": dict(simd_width=32, device_type="gpu"),
                "gpu64": dict(simd_width=64, device_type="gpu")}


def uneven(rng, m, n=300, empty_fraction=0.3):
    """Heavy-tailed rows, empty rows scattered (first and last included), a full row
    in the middle and a run of empty rows long enough to empty whole strips."""
    lengths = np.minimum(np.floor(rng.pareto(1.0, m)).astype(np.int64), n)
    lengths[rng.random(m) < empty_fraction] = 0
    lengths[0] = lengths[-1] = 0
    if m > 3:
        lengths[m // 2] = n
    if m > 80:
        lengths[20:60] = 0
    return csr_from_row_lengths(rng, lengths, n, shuffle=True)


def arrays_of(op):
    """Device arrays read back; the packed words as unsigned, row_in_strip as bytes."""
    impl = op._impl
    word = np.dtype(impl.index_dtype.str.replace("i", "u"))
    types = {"col_idx": word if impl.packed else impl.index_dtype, "row_in_strip": np.uint8}
    sizes = {"strip_ptr": impl.n_strips + 1, "col_idx": impl.nnz_stored,
             "values": impl.nnz_stored, "row_in_strip": impl.nnz_stored}
    return read_back(op, types=types, sizes=sizes)


def decode(op):
    """(strip_ptr, rows, cols, values) of an operator, rows rebuilt from the strips."""
    a = arrays_of(op)
    h = op.params["height"]
    if op._impl.packed:
        shift = op._impl.index_dtype.itemsize * 8 - 4
        cols = (a["col_idx"] & ((1 << shift) - 1)).astype(np.int64)
        r = (a["col_idx"] >> shift).astype(np.int64)
    else:
        cols, r = a["col_idx"].astype(np.int64), a["row_in_strip"].astype(np.int64)
    strip_ptr = a["strip_ptr"].astype(np.int64)
    strip = np.repeat(np.arange(strip_ptr.size - 1), np.diff(strip_ptr))
    return strip_ptr, strip * h + r, cols, a["values"]


# ------------------------------------------------------------------------ sweeps


@pytest.mark.parametrize("height", [1, 5, 16])
@with_dtypes
def test_heights(height, dtype, device, rng):
    """One work-item per strip and a group of 4 per strip (tree), m below, above and not
    a multiple of the height, with empty strips and uneven rows."""
    skip_without_fp64(device, dtype)
    for m in (max(1, height - 1), 7 * height + 3, 401):
        A = uneven(rng, m)
        for gw, reduction in ((1, "serial"), (4, "tree")):
            op = psc.SpMV(A, format="cmrs", dtype=dtype, device=device, height=height,
                          group_width=gw, reduction=reduction, work_group_size=16)
            assert (op.params["height"], op.params["group_width"]) == (height, gw)
            assert op._impl.n_strips == -(-m // height)
            check_all(op, A, dtype, rng)


@pytest.mark.parametrize("reduction", ["tree", "serial"])
@pytest.mark.parametrize("group_width", [2, 32])
def test_group_widths(group_width, reduction, device, rng):
    """Groups wider than the strip has rows (serial sums loop over rows per lane) and
    narrower ones; several strips per work-group and one."""
    A = uneven(rng, 517, n=500)
    for height, wg in ((5, 2 * group_width), (16, group_width)):
        op = psc.SpMV(A, format="cmrs", dtype=np.float32, device=device, height=height,
                      group_width=group_width, reduction=reduction, work_group_size=wg)
        check_all(op, A, np.float32, rng)


@pytest.mark.parametrize("profile", list(GPU_PROFILES))
@with_dtypes
def test_gpu_shaped_profiles(profile, dtype, device, rng):
    """GPU defaults (groups of about half the mean row length per strip, from 4 to a
    warp/wavefront, tree reduction, sorted strips, groups of 128) run correctly here,
    on short and long rows and on empty matrices."""
    skip_without_fp64(device, dtype)
    dev = device.override(**GPU_PROFILES[profile])
    for A in (uneven(rng, 1000), csr_from_row_lengths(rng, np.full(97, 70), 90),
              sp.csr_matrix((70, 9)), sp.csr_matrix((5, 0))):
        op = psc.SpMV(A, format="cmrs", dtype=dtype, device=dev)
        p = op.params
        warp = GPU_PROFILES[profile]["simd_width"]
        mean = A.nnz / max(1, A.shape[0])
        assert p["group_width"] == min(warp, max(4, 1 << max(0, int(mean // 2).bit_length() - 1)))
        assert p["reduction"] == "tree" and p["sort_columns"] is True
        assert p["work_group_size"] == 128
        assert 1 <= p["height"] <= occupancy_height(dev.profile, dtype)
        check_all(op, A, dtype, rng)


# ------------------------------------------------------------------------ layout


@pytest.mark.parametrize("row_in_strip", ["packed", "separate"])
@pytest.mark.parametrize("sort_columns", [False, True])
def test_layout_decodes_to_A(row_in_strip, sort_columns, device, rng):
    """strip_ptr[s] = row_ptr[s*height]; the entries decoded (row from strip and
    row-in-strip, column from the low bits) are A's, in CSR order or sorted by column
    inside each strip (ties in CSR order); nbytes is the sum of the arrays."""
    A = uneven(rng, 203, n=90)
    for height, bits in ((4, 32), (7, 64), (16, 32)):
        op = psc.SpMV(A, format="cmrs", dtype=np.float32, device=device, height=height,
                      row_in_strip=row_in_strip, sort_columns=sort_columns, index_bits=bits)
        assert op._impl.packed == (row_in_strip == "packed")
        strip_ptr, rows, cols, vals = decode(op)
        np.testing.assert_array_equal(strip_ptr, A.indptr[np.minimum(
            np.arange(strip_ptr.size) * height, A.shape[0])])
        A_rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
        strip = A_rows // height
        order = (np.lexsort((A.indices, strip)) if sort_columns else np.arange(A.nnz))
        np.testing.assert_array_equal(rows, A_rows[order])
        np.testing.assert_array_equal(cols, A.indices[order])
        np.testing.assert_array_equal(vals, A.data[order].astype(np.float32))
        index_bytes = bits // 8
        expected = ((strip_ptr.size + A.nnz) * index_bytes + A.nnz * 4
                    + (A.nnz if row_in_strip == "separate" else 0))
        assert op.nbytes == expected
        check_all(op, A, np.float32, rng)


def test_packed_and_separate_agree_exactly(device, rng):
    """Same entry order, same sums: the two encodings give bit-identical results."""
    A = uneven(rng, 1000)
    x = rng.standard_normal(A.shape[1])
    for dev in (device, device.override(**GPU_PROFILES["gpu32"])):
        ys = [psc.SpMV(A, format="cmrs", dtype=np.float32, device=dev, height=6,
                       row_in_strip=mode).matvec(x) for mode in ("packed", "separate")]
        np.testing.assert_array_equal(ys[0], ys[1])


def test_sorted_matches_unsorted_within_rounding(device, rng):
    """Sorting a strip's columns only reorders the additions of each row: results agree
    with the unsorted layout to rounding (and both with scipy)."""
    A = uneven(rng, 800, n=400)
    x = rng.standard_normal(A.shape[1])
    for dev in (device, device.override(**GPU_PROFILES["gpu64"])):
        for dtype in (np.float32, np.float64):
            if np.dtype(dtype) == np.float64 and not device.profile.fp64:
                continue
            y = {s: psc.SpMV(A, format="cmrs", dtype=dtype, device=dev, height=8,
                             sort_columns=s).matvec(x, out=poisoned(800, dtype))
                 for s in (False, True)}
            for yy in y.values():
                check_against_scipy(yy, A, x, dtype)
            scale = abs(A) @ np.abs(x) + 1
            assert np.all(np.abs(y[True] - y[False]) <= 1e-4 * scale)


def test_too_many_columns_for_packing(device):
    """2**28 columns leave no 4 bits with 32-bit indices: 'auto' keeps row-in-strip in a
    separate array, 'packed' is refused; 64-bit indices pack (shift 60)."""
    n = 2**28 + 1
    assert fits_packed(2**28, np.int32) and not fits_packed(n, np.int32)
    assert fits_packed(2**40, np.int64)
    A = sp.csr_matrix((np.ones(3), np.array([0, n - 1, 5]), np.array([0, 2, 2, 3])),
                      shape=(3, n))
    op = psc.SpMV(A, format="cmrs", dtype=np.float32, device=device, height=2)
    assert op.params["row_in_strip"] == "separate" and not op._impl.packed
    _, rows, cols, _ = decode(op)
    np.testing.assert_array_equal(cols, [0, n - 1, 5])
    np.testing.assert_array_equal(rows, [0, 0, 2])
    with pytest.raises(ValueError, match="row_in_strip='separate'"):
        psc.SpMV(A, format="cmrs", dtype=np.float32, device=device, row_in_strip="packed")
    op = psc.SpMV(A, format="cmrs", dtype=np.float32, device=device, index_bits=64)
    assert op._impl.packed


# ------------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("profile", [None, "gpu32"])
@with_dtypes
def test_edge_shapes(profile, dtype, device, rng):
    skip_without_fp64(device, dtype)
    dev = device if profile is None else device.override(**GPU_PROFILES[profile])
    long_row = np.zeros(300, dtype=np.int64)
    long_row[150] = 3000
    cases = [csr_from_row_lengths(rng, long_row, 3000),            # one very long row
             uneven(rng, 3001, n=7), uneven(rng, 7, n=3000),       # tall, wide
             sp.csr_matrix((65, 20)), sp.csr_matrix((1, 1)),      # nnz = 0
             sp.csr_matrix((6, 0)), sp.csr_matrix((0, 5)), sp.csr_matrix((0, 0))]
    for A in cases:
        for height in (3, 16):
            op = psc.SpMV(A, format="cmrs", dtype=dtype, device=dev, height=height)
            m, n = A.shape
            x = rng.standard_normal(n)
            y = op.matvec(x, out=poisoned(m, dtype))
            check_against_scipy(y, A, x, dtype)


@pytest.mark.parametrize("gw", [1, 8])
@with_dtypes
def test_nan_inf_propagate_as_scipy(gw, dtype, device, rng):
    """Only stored entries multiply x: rows without entries in the Inf/NaN columns, and
    empty rows beside them in the same strip, stay finite."""
    skip_without_fp64(device, dtype)
    A = uneven(rng, 300, n=60)
    A.data[rng.random(A.nnz) < 0.02] = np.nan
    x = rng.standard_normal(60)
    x[[3, 17]] = np.inf, -np.inf
    x[40] = np.nan
    op = psc.SpMV(A, format="cmrs", dtype=dtype, device=device, height=5, group_width=gw,
                  work_group_size=4 * gw)
    y = op.matvec(x, out=poisoned(300, dtype))
    check_against_scipy(y, A, x, dtype)
    assert np.all(y[np.diff(A.indptr) == 0] == 0)


def test_deterministic(device, rng):
    A = uneven(rng, 3000)
    x = rng.standard_normal(A.shape[1])
    for gw, reduction in ((1, "serial"), (8, "tree"), (8, "serial")):
        op = psc.SpMV(A, format="cmrs", dtype=np.float32, device=device, height=8,
                      group_width=gw, reduction=reduction, sort_columns=True)
        first = op @ x
        for _ in range(3):
            assert np.array_equal(op @ x, first)


# ------------------------------------------------------------------------ parameters


def test_default_height_model(device):
    """The paper's occupancy rule: 48 KiB over 2048 resident work-items gives 6 floats
    or 3 doubles each (its K20m choices: 6 and 4); 64 KiB gives 8 and 4; at most 16.
    Long rows need no strips; CPUs use their fixed default."""
    gpu = device.profile.replace(device_type="gpu", simd_width=32, local_mem_size=48 * 1024)
    assert GPU_RESIDENT_WORK_ITEMS == 2048
    assert occupancy_height(gpu, np.float32) == 6
    assert occupancy_height(gpu, np.float64) == 3
    amd = gpu.replace(local_mem_size=64 * 1024, simd_width=64)
    assert (occupancy_height(amd, np.float32), occupancy_height(amd, np.float64)) == (8, 4)
    assert occupancy_height(gpu.replace(local_mem_size=2**20), np.float32) == 16
    short = MatrixFeatures(10**6, 10**6, 2 * 10**6, 2.0, 4, 0.5, 0)
    long_rows = MatrixFeatures(1000, 10**5, 200 * 1000, 200.0, 300, 10.0, 0)
    assert default_height(short, gpu, np.float32, 32) == 6
    assert default_height(long_rows, gpu, np.float32, 32) == 1
    cpu = gpu.replace(device_type="cpu")
    assert 1 <= default_height(short, cpu, np.float32, 1) <= 16
    params = CMRS.default_params(short, gpu, np.float64)
    assert params == {"height": 3, "group_width": 4, "work_group_size": 128,
                      "sort_columns": True, "row_in_strip": "auto", "reduction": "tree"}
    # Group width: half the mean row length, from 4 up to the warp.
    assert CMRS.default_params(long_rows, gpu, np.float32)["group_width"] == 32
    mid = MatrixFeatures(1000, 10**5, 20 * 1000, 20.0, 30, 1.0, 0)
    assert CMRS.default_params(mid, gpu, np.float32)["group_width"] == 8


def test_tuning_candidates(device):
    gpu = device.profile.replace(device_type="gpu", simd_width=32, local_mem_size=48 * 1024)
    short = MatrixFeatures(10**6, 10**6, 2 * 10**6, 2.0, 4, 0.5, 0)
    # Group width 4 for 2-entry rows: height ceil(2 * 4 / 2) = 4, then half and twice.
    assert CMRS.tuning_candidates(short, gpu, np.float32) == [{}, {"height": 2},
                                                              {"height": 8}]
    cands = CMRS.tuning_candidates(short, device.profile, np.float32)
    assert cands[0] == {} and 1 < len(cands) <= 4
    assert all(1 <= c["height"] <= 16 for c in cands[1:])


def test_caller_parameters_keep_the_rest_consistent(device, rng):
    """A caller's group width brings a multiple-of-it work-group and the local buffer
    (work_group_size * height values) is kept within the device's local memory."""
    A = uneven(rng, 300)
    small = device.override(device_type="gpu", simd_width=32, local_mem_size=16 * 1024)
    op = psc.SpMV(A, format="cmrs", dtype=np.float64, device=small, height=16)
    p = op.params
    assert p["work_group_size"] % p["group_width"] == 0
    assert p["work_group_size"] * 16 * 8 <= 16 * 1024
    if device.profile.fp64:
        check_all(op, A, np.float64, rng)
    op = psc.SpMV(A, format="cmrs", dtype=np.float32, device=device, group_width=16)
    assert op.params["work_group_size"] % 16 == 0
    check_all(op, A, np.float32, rng)


BAD_PARAMS = [dict(height=0), dict(height=17), dict(height=4.0), dict(height=True),
              dict(group_width=3), dict(group_width=128), dict(group_width=8,
                                                               work_group_size=12),
              dict(sort_columns="yes"), dict(row_in_strip="top"), dict(reduction="warp"),
              dict(work_group_size=0)]


@pytest.mark.parametrize("params", BAD_PARAMS, ids=[str(p) for p in BAD_PARAMS])
def test_bad_parameters(params, device, rng):
    with pytest.raises(ValueError, match="cmrs"):
        psc.SpMV(uneven(rng, 50), format="cmrs", device=device, **params)
