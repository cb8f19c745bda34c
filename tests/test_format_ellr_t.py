"""``ellr-t``: every T (1 ... 64) and several work-group sizes on GPU-shaped profiles,
the ELLR-T layout read back (figure 2a: the T work-items of consecutive rows read
consecutive addresses; rl[]), defaults from the paper's model (and T = 1 on CPUs),
partial parameters completed by the model, padding that is never read (Inf/NaN in x),
refusals with their numbers, stencils accepted, footprint and validation."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import CASES, check_against_scipy, check_all, csr_from_row_lengths, read_back

import pyspmv_cl as psc
from pyspmv_cl.formats.ell import SMALL_BYTES
from pyspmv_cl.formats.ellr_t import MODEL_OVERHEAD, block_size_candidates, ellrt_arrays
from pyspmv_cl.formats.ellrt_model import ellrt_model

with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
GPU32 = dict(simd_width=32, device_type="gpu")
GPU64 = dict(simd_width=64, device_type="gpu")


def stencil_2d(k):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    return sp.csr_matrix(sp.kron(sp.identity(k), T) + sp.kron(T, sp.identity(k)))


# ------------------------------------------------------------------------ layout


def test_layout_t2():
    """Figure 2a for T = 2: iteration k holds entries 2k and 2k+1 of every row, rows
    side by side."""
    A = sp.csr_matrix((np.arange(1.0, 8.0), np.array([0, 1, 2, 3, 4, 5, 6]),
                       np.array([0, 5, 5, 7])), shape=(3, 7))
    col, val, rl, slice_ = ellrt_arrays(A, 2, 4, np.int32, np.float64)
    assert slice_ == 8  # 3 rows aligned to 4, times T
    np.testing.assert_array_equal(rl, [5, 0, 2])
    np.testing.assert_array_equal(col.reshape(3, 8), [[0, 1, -1, -1, 5, 6, -1, -1],
                                                      [2, 3, -1, -1, -1, -1, -1, -1],
                                                      [4, -1, -1, -1, -1, -1, -1, -1]])
    np.testing.assert_array_equal(val.reshape(3, 8)[0], [1, 2, 0, 0, 6, 7, 0, 0])
    # T = 1 is plain ELLPACK-R: the ELL layout.
    col, _, _, slice_ = ellrt_arrays(A, 1, 4, np.int32, np.float64)
    assert slice_ == 4 and col.shape == (20,)
    np.testing.assert_array_equal(col.reshape(5, 4)[:, 0], [0, 1, 2, 3, 4])


@pytest.mark.parametrize("t", [1, 4, 32])
def test_layout_on_device_and_nbytes(t, device, rng):
    A = csr_from_row_lengths(rng, rng.integers(0, 70, 203), 100, shuffle=True)
    for bits in (32, 64):
        op = psc.SpMV(A, format="ellr-t", dtype=np.float32, device=device.override(**GPU32),
                      T=t, index_bits=bits)
        arrays = read_back(op)
        col, val, rl, slice_ = ellrt_arrays(A, t, 32, op._impl.index_dtype, np.float32)
        assert op._impl.slice == slice_ == 224 * t
        np.testing.assert_array_equal(arrays["col_idx"], col)
        np.testing.assert_array_equal(arrays["values"], val)
        np.testing.assert_array_equal(arrays["row_length"], np.diff(A.indptr))
        iterations = -(-np.diff(A.indptr).max() // t)
        assert op.nbytes == iterations * slice_ * (4 + bits // 8) + 203 * bits // 8
        assert op.nbytes == sum(a.nbytes for a in arrays.values())
        check_all(op, A, np.float32, rng)


# ------------------------------------------------------------------------ sweeps


@pytest.mark.parametrize("t", [1, 2, 4, 8, 16, 32, 64])
@with_dtypes
def test_every_t(t, dtype, device, rng):
    skip_without_fp64(device, dtype)
    dev = device.override(**(GPU64 if t == 64 else GPU32))
    for wg in (t, 3 * t, 256):
        if wg < t or wg % t:
            continue
        for case in ("row_length_sweep", "empty_rows", "duplicates_csr_large",
                     "unsorted_indices", "nan_inf_in_matrix", "1x1", "dense_1_x_3000"):
            A = CASES[case](rng)
            op = psc.SpMV(A, format="ellr-t", dtype=dtype, device=dev, T=t,
                          work_group_size=wg, max_padding=float("inf"))
            params = op.params
            assert params["T"] == t and params["work_group_size"] % t == 0
            assert params["work_group_size"] <= wg
            check_all(op, A, dtype, rng)


@pytest.mark.parametrize("t", [1, 2, 8])
@with_dtypes
def test_native_profile(t, dtype, device, rng):
    """T up to the real device's SIMD width, on the real profile."""
    skip_without_fp64(device, dtype)
    if t > device.profile.simd_width:
        pytest.skip("T above this device's SIMD width")
    for case in ("row_length_sweep", "one_long_row", "explicit_zeros", "tall_3000x7"):
        A = CASES[case](rng)
        op = psc.SpMV(A, format="ellr-t", dtype=dtype, device=device, T=t,
                      max_padding=float("inf"))
        check_all(op, A, dtype, rng)


@with_dtypes
def test_padding_never_read(dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = csr_from_row_lengths(rng, rng.integers(0, 40, 500), 120)
    A.data[rng.random(A.nnz) < 0.2] = 0.0
    for t in (1, 4, 32):
        op = psc.SpMV(A, format="ellr-t", dtype=dtype, device=device.override(**GPU32), T=t)
        for special in (np.inf, np.nan):
            x = rng.standard_normal(120)
            x[[0, 5, 119]] = special
            y = op.matvec(x, out=poisoned(500, dtype))
            check_against_scipy(y, A, x, dtype)
            assert np.isfinite(y).any() and not np.isfinite(y).all()


# ------------------------------------------------------------------------ defaults


def test_defaults_follow_the_model(device, rng):
    lengths = np.floor(rng.pareto(1.3, 20000) * 4).astype(np.int64).clip(0, 500)
    A = csr_from_row_lengths(rng, lengths, 600)
    for override in (GPU32, GPU64, dict(GPU32, compute_units=80)):
        dev = device.override(**override)
        op = psc.SpMV(A, format="ellr-t", device=dev, dtype=np.float32, max_padding=1e9)
        p = dev.profile
        ts = tuple(1 << k for k in range(7) if 1 << k <= min(p.simd_width, 64))
        expected = ellrt_model(lengths, p.compute_units, p.simd_width, t_values=ts,
                               block_sizes=block_size_candidates(p), overhead=MODEL_OVERHEAD)
        assert block_size_candidates(p) == (128, 256)  # GPU profiles: what drivers run
        assert (op.params["work_group_size"], op.params["T"]) == expected
        check_all(op, A, np.float32, rng)
    # Long regular rows on a GPU: more than one work-item per row.
    B = csr_from_row_lengths(rng, np.full(3000, 400), 1000)
    op = psc.SpMV(B, format="ellr-t", device=device.override(**GPU32), dtype=np.float32)
    assert op.params["T"] > 1
    # CPU devices: T = 1 (barriers split PoCL's work-item loops); BS from the model.
    cpu = device.override(device_type="cpu", simd_width=32)
    op = psc.SpMV(B, format="ellr-t", device=cpu, dtype=np.float32)
    assert op.params["T"] == 1 and op.params["work_group_size"] in (128, 256, 512)


def test_partial_parameters_completed_by_the_model(device, rng):
    lengths = rng.integers(0, 90, 5000)
    A = csr_from_row_lengths(rng, lengths, 300)
    dev = device.override(**GPU32)
    p = dev.profile
    op = psc.SpMV(A, format="ellr-t", device=dev, dtype=np.float32, T=16)
    assert op.params["T"] == 16
    assert op.params["work_group_size"] == ellrt_model(
        lengths, p.compute_units, 32, t_values=(16,), block_sizes=block_size_candidates(p),
        overhead=MODEL_OVERHEAD)[0]
    op = psc.SpMV(A, format="ellr-t", device=dev, dtype=np.float32, work_group_size=96)
    assert op.params["work_group_size"] == 96
    assert op.params["T"] == ellrt_model(lengths, p.compute_units, 32, block_sizes=(96,),
                                         t_values=(1, 2, 4, 8, 16, 32),
                                         overhead=MODEL_OVERHEAD)[1]
    check_all(op, A, np.float32, rng)


def test_small_work_group_limit(device, rng):
    """A device whose work-groups hold fewer than 128 work-items gets a smaller BS."""
    A = csr_from_row_lengths(rng, rng.integers(0, 30, 700), 100)
    dev = device.override(max_work_group_size=64, **GPU32)
    op = psc.SpMV(A, format="ellr-t", device=dev, dtype=np.float32)
    assert op.params["work_group_size"] <= 64
    check_all(op, A, np.float32, rng)


# ------------------------------------------------------------------------ refusal


def test_refusal_and_regular_matrices(device, rng):
    lengths = rng.integers(0, 4, 4000)
    lengths[77] = 5000
    A = csr_from_row_lengths(rng, lengths, 6000)
    with pytest.raises(psc.FormatNotSuitableError, match="ellr-t") as info:
        psc.SpMV(A, format="ellr-t", device=device, T=1)
    assert "max_padding=20" in str(info.value) and str(A.nnz) in str(info.value)
    check_all(psc.SpMV(A, format="ellr-t", device=device, dtype=np.float32,
                       max_padding=float("inf")), A, np.float32, rng)
    band = sp.diags([rng.standard_normal(30000 - abs(k)) for k in range(-6, 7)],
                    list(range(-6, 7)), format="csr")
    for B in (stencil_2d(200), band):
        for dev in (device, device.override(**GPU32)):
            op = psc.SpMV(B, format="ellr-t", device=dev, dtype=np.float32)
            assert op.nbytes > SMALL_BYTES
            check_all(op, B, np.float32, rng)
    with pytest.raises(psc.FormatNotSuitableError, match="ellr-t.*more than"):
        psc.SpMV(band, format="ellr-t", device=device.override(max_alloc_size=100_000))


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize("bad", [dict(T=3), dict(T=0), dict(T=128), dict(T=2.0),
                                 dict(T=True), dict(T=4, work_group_size=6),
                                 dict(T=8, work_group_size=4), dict(max_padding=0.1),
                                 dict(work_group_size=0), dict(work_group_size=10**6)])
def test_bad_parameters(bad, device, rng):
    with pytest.raises(ValueError, match="|".join(bad)):
        psc.SpMV(CASES["empty_rows"](rng), format="ellr-t", device=device.override(**GPU64),
                 **bad)


def test_t_above_simd_width_refused(device, rng):
    dev = device.override(simd_width=8)
    with pytest.raises(ValueError, match="SIMD width"):
        psc.SpMV(CASES["empty_rows"](rng), format="ellr-t", device=dev, T=16)
    with pytest.raises(ValueError, match="from 1 to 32"):
        psc.SpMV(CASES["empty_rows"](rng), format="ellr-t", device=device.override(**GPU32),
                 T=64)


def test_estimate_cost(device):
    """The tuner's model (moved from the tuner): the padded arrays' bytes at 85%; not
    worth timing above 3 slots per non-zero."""
    from pyspmv_cl.features import MatrixFeatures
    from pyspmv_cl.formats.ellr_t import ELLRT

    f = MatrixFeatures(n_rows=1000, n_cols=1000, nnz=5000, mean_row_length=5.0,
                       max_row_length=15, std_row_length=1.0, empty_rows=0)
    assert ELLRT.estimate_cost(f, device.profile, np.float32) == (1000 * 15 * 8 / 0.85, None)
    cost, why = ELLRT.estimate_cost(dataclasses.replace(f, max_row_length=16),
                                    device.profile, np.float32)
    assert cost is None and why == "padding 3.2x > 3"
