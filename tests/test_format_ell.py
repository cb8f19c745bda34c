"""``ell``: the column-major layout read back (sentinel -1 padding, aligned stride),
``ell_arrays`` as hyb reuses it, the ELL class driven directly on a CSR cut to K
entries per row (``max_padding=None``, accumulating into y), work-group sizes and
GPU-shaped profiles, padding that must not touch x (Inf/NaN), refusals with their
numbers and the 1 MiB floor, stencils/banded matrices accepted, footprint and parameter
validation."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import CASES, check_against_scipy, check_all, csr_from_row_lengths, read_back

import pyspmv_cl as psc
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats.ell import ELL, SMALL_BYTES, ell_arrays, ell_stride

with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
PROFILES = {"native": {}, "simd32": dict(simd_width=32),
            "gpu64": dict(simd_width=64, device_type="gpu")}


def poisson_2d(k):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    return sp.csr_matrix(sp.kron(sp.identity(k), T) + sp.kron(T, sp.identity(k)))


# ------------------------------------------------------------------------ host layout


def test_ell_arrays_layout():
    A = sp.csr_matrix((np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([4, 0, 2, 2, 1]),
                       np.array([0, 2, 2, 5])), shape=(3, 6))
    col, val = ell_arrays(A, 3, 4, np.int32, np.float32)
    assert col.dtype == np.int32 and val.dtype == np.float32
    assert ell_stride(3, 4) == 4 and col.shape == val.shape == (12,)
    # Column-major: slot k of row i at k * 4 + i, entries in CSR order, then -1 padding.
    np.testing.assert_array_equal(col.reshape(3, 4), [[4, -1, 2, -1], [0, -1, 2, -1],
                                                      [-1, -1, 1, -1]])
    np.testing.assert_array_equal(val.reshape(3, 4), [[1, 0, 3, 0], [2, 0, 4, 0],
                                                      [0, 0, 5, 0]])
    # A wider width pads more slots; a narrower one is refused.
    col, _ = ell_arrays(A, 5, 1, np.int64, np.float64)
    assert col.shape == (15,) and col.dtype == np.int64 and (col[9:] == -1).all()
    with pytest.raises(ValueError, match="width"):
        ell_arrays(A, 2, 4, np.int32, np.float32)
    assert ell_stride(0, 32) == 0 and ell_stride(33, 32) == 64 and ell_stride(5, 1) == 5


def test_ell_arrays_random_roundtrip(rng):
    A = csr_from_row_lengths(rng, rng.integers(0, 9, 77), 50, shuffle=True)
    width, align = 11, 8
    col, val = ell_arrays(A, width, align, np.int32, np.float64)
    stride = ell_stride(77, align)
    col, val = col.reshape(width, stride), val.reshape(width, stride)
    assert (col[:, 77:] == -1).all()
    rows, slots = np.nonzero(col.T >= 0)
    B = sp.csr_matrix((val.T[rows, slots], (rows, col.T[rows, slots])), shape=A.shape)
    assert abs(B - A).max() == 0
    assert np.count_nonzero(col >= 0) == A.nnz


# ------------------------------------------------------------------------ sweeps


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("wg", [None, 1, 64, 96, 512])
@with_dtypes
def test_work_group_sizes_and_profiles(wg, profile, dtype, device, rng):
    skip_without_fp64(device, dtype)
    dev = device.override(**PROFILES[profile]) if PROFILES[profile] else device
    for case in ("row_length_sweep", "empty_rows", "duplicates_csr_large", "explicit_zeros",
                 "unsorted_indices", "tall_3000x7", "1x1"):
        A = CASES[case](rng)
        op = psc.SpMV(A, format="ell", dtype=dtype, device=dev, work_group_size=wg)
        assert op.params["work_group_size"] <= (wg or 512)
        impl = op._impl
        assert impl.stride % min(dev.profile.simd_width, 64) == 0
        assert impl.stride >= A.shape[0] and impl.width == np.diff(A.indptr).max()
        check_all(op, A, dtype, rng)


@with_dtypes
def test_layout_on_device_and_nbytes(dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = csr_from_row_lengths(rng, rng.integers(0, 12, 333), 90, shuffle=True)
    for bits in (32, 64):
        op = psc.SpMV(A, format="ell", dtype=dtype, device=device.override(simd_width=32),
                      index_bits=bits)
        impl = op._impl
        assert impl.stride == 352  # 333 rows aligned to the SIMD width
        arrays = read_back(op)
        col, val = ell_arrays(A, impl.width, 32, impl.index_dtype, dtype)
        np.testing.assert_array_equal(arrays["col_idx"], col)
        np.testing.assert_array_equal(arrays["values"], val)
        slots = impl.width * impl.stride
        assert op.nbytes == slots * (bits // 8 + np.dtype(dtype).itemsize)
        assert op.nbytes == sum(a.nbytes for a in arrays.values())


@with_dtypes
def test_padding_never_multiplies_x(dtype, device, rng):
    """Rows of very different lengths (lots of padding) with Inf/NaN in x: padding slots
    must contribute nothing, stored zeros must give NaN."""
    skip_without_fp64(device, dtype)
    A = csr_from_row_lengths(rng, rng.integers(0, 30, 400), 200)
    A.data[rng.random(A.nnz) < 0.2] = 0.0
    op = psc.SpMV(A, format="ell", dtype=dtype, device=device)
    for special in (np.inf, -np.inf, np.nan):
        x = rng.standard_normal(200)
        x[[0, 1, 17, 199]] = special
        y = op.matvec(x, out=poisoned(400, dtype))
        check_against_scipy(y, A, x, dtype)
        assert np.isfinite(y).any() and not np.isfinite(y).all()


# ------------------------------------------------------------------------ acceptance


@with_dtypes
def test_regular_matrices_accepted(dtype, device, rng):
    skip_without_fp64(device, dtype)
    band = sp.diags([rng.standard_normal(20000 - abs(k)) for k in range(-4, 5)],
                    list(range(-4, 5)), format="csr")
    for A in (poisson_2d(200), band, csr_from_row_lengths(rng, np.full(30000, 9), 30000)):
        op = psc.SpMV(A, format="ell", dtype=dtype, device=device)
        assert op.nbytes > SMALL_BYTES  # the limit applied, and this matrix passed it
        check_all(op, A, dtype, rng)


def test_refusal_and_its_override(device, rng):
    lengths = rng.integers(0, 4, 4000)
    lengths[123] = 5000
    A = csr_from_row_lengths(rng, lengths, 6000)
    with pytest.raises(psc.FormatNotSuitableError, match="ell") as info:
        psc.SpMV(A, format="ell", device=device)
    message = str(info.value)
    assert "max_padding=20" in message and "hyb" in message and str(A.nnz) in message
    # A looser limit or none at all accepts it.
    for limit in (1e6, float("inf")):
        op = psc.SpMV(A, format="ell", device=device, dtype=np.float32, max_padding=limit)
        check_all(op, A, np.float32, rng)
    # A tighter limit refuses a matrix the default accepts.
    B = csr_from_row_lengths(rng, np.r_[np.full(99999, 3), 12], 500)
    psc.SpMV(B, format="ell", device=device)
    with pytest.raises(psc.FormatNotSuitableError, match="max_padding=2"):
        psc.SpMV(B, format="ell", device=device, max_padding=2)


def test_small_matrices_never_refused_for_padding(device, rng):
    """Under 1 MiB the padding ratio does not matter: one dense row, a lone entry."""
    one = sp.csr_matrix(([1.5], ([0], [999])), shape=(3000, 1000))
    lengths = np.zeros(4000, dtype=np.int64)
    lengths[7] = 30
    for A in (CASES["one_long_row"](rng)[:100], one, csr_from_row_lengths(rng, lengths, 40)):
        op = psc.SpMV(A, format="ell", device=device, dtype=np.float32, max_padding=1)
        assert op.nbytes <= SMALL_BYTES
        check_all(op, A, np.float32, rng)


def test_device_memory_refusal(device, rng):
    A = csr_from_row_lengths(rng, rng.integers(1, 40, 3000), 100)
    small = device.override(max_alloc_size=100_000)
    with pytest.raises(psc.FormatNotSuitableError, match="ell.*more than"):
        psc.SpMV(A, format="ell", device=small, dtype=np.float32)


# ------------------------------------------------------------------------ ELL driven directly


@with_dtypes
def test_class_as_hyb_ell_part(dtype, device, rng):
    """Build ELL directly on a CSR cut to K entries per row with max_padding=None (no
    refusal, however uneven), then accumulate into y with beta=1 (as hyb's ELL part
    does with the same kernel)."""
    skip_without_fp64(device, dtype)
    lengths = rng.integers(0, 6, 50000)
    lengths[:47000] = 0
    lengths[-1] = 6
    A = csr_from_row_lengths(rng, lengths, 300)  # padding ratio ~ 40x, over 1 MiB
    features = MatrixFeatures.from_csr(A)
    params = ELL.default_params(features, device.profile, dtype)
    params["max_padding"] = None
    ell = ELL(A, device, dtype, params)
    assert ell.width == 6 and ell.nbytes > SMALL_BYTES
    assert ell.nbytes == ell.width * ell.stride * (np.dtype(dtype).itemsize + 4)
    queue = device.queue
    x = rng.standard_normal(300)
    y0 = rng.standard_normal(50000)
    x_d = cla.to_device(queue, x.astype(dtype))
    y_d = cla.to_device(queue, y0.astype(dtype))
    assert set(ell.kernels) == {"ell"}  # built with the object
    event = ell.enqueue(queue, x_d.data, y_d.data, 2.0, 1.0)
    event.wait()
    check_against_scipy(y_d.get(), A, x, dtype, 2.0, 1.0, y0.astype(dtype))
    # Through SpMV the same is spelled max_padding=inf (None means the default there).
    with pytest.raises(psc.FormatNotSuitableError):
        psc.SpMV(A, format="ell", device=device, dtype=dtype, max_padding=None)
    op = psc.SpMV(A, format="ell", device=device, dtype=dtype, max_padding=float("inf"))
    # Kept as inf, so that op.params passed back builds the same operator (as None it
    # meant the default: a test drive's report).
    assert op.params["max_padding"] == float("inf")
    again = psc.SpMV(A, format="ell", device=device, dtype=dtype, **op.params)
    assert again.params == op.params


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize("bad", [0.5, 0, -3, "20", True, float("nan")])
def test_bad_max_padding(bad, device, rng):
    with pytest.raises(ValueError, match="max_padding"):
        psc.SpMV(CASES["empty_rows"](rng), format="ell", device=device, max_padding=bad)


def test_bad_work_group_size(device, rng):
    for bad in (0, 10**6, 2.5):
        with pytest.raises(ValueError, match="work_group_size"):
            psc.SpMV(CASES["empty_rows"](rng), format="ell", device=device,
                     work_group_size=bad)
    with pytest.raises(TypeError, match="max_fill"):
        psc.SpMV(CASES["empty_rows"](rng), format="ell", device=device, max_fill=2)
