"""``sell`` (SELL-C-σ): every slice height with σ = 1, C, 8C and the whole matrix, both
work mappings, threads per row, GPU-shaped profiles, the permutation undone on output
(very uneven rows), the device layout read back (column-major slices, -1 padding),
padding that must not touch x (Inf/NaN in x[0]), empty rows everywhere, m not a
multiple of C, nnz == 0, automatic σ, 32/64-bit slots, footprint and validation."""

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import check_against_scipy, check_all, csr_from_row_lengths
from matrix_cases import read_back as shared_read_back

import pyspmv_cl as psc
from pyspmv_cl.errors import FormatNotSuitableError, IndexOverflowError
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats import base as base_module
from pyspmv_cl.formats.sell import (
    PAD_OFFSET,
    SLICE_HEIGHTS,
    auto_sigma,
    default_threads_per_row,
    padded_size,
    sort_permutation,
)

pytestmark = pytest.mark.skipif("sell" not in psc.formats(), reason="no sell format")
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)

GPU_PROFILES = {"gpu32": dict(simd_width=32, device_type="gpu"),
                "gpu64": dict(simd_width=64, device_type="gpu"),
                "simd32": dict(simd_width=32)}


def uneven(rng, m, n=400, empty_fraction=0.3):
    """Very uneven rows (0 ... n, heavy tail) with empty rows scattered everywhere,
    including the first and last rows."""
    lengths = np.minimum(np.floor(rng.pareto(1.0, m)).astype(np.int64), n)
    lengths[rng.random(m) < empty_fraction] = 0
    lengths[0] = lengths[-1] = 0
    if m > 3:
        lengths[m // 2] = n          # one full row
    return csr_from_row_lengths(rng, lengths, n, shuffle=True)


def sigma_value(name, C):
    return {"1": 1, "C": C, "8C": 8 * C, "all": "all"}[name]


def read_back(op):
    """The device arrays of a sell operator, as numpy arrays."""
    return shared_read_back(op, sizes={"slice_ptr": op._impl.n_slices + 1})


def expected_nbytes(A, C, sigma, dtype, index_bytes, has_perm):
    m = A.shape[0]
    slots = padded_size(np.diff(A.indptr), C, sigma)
    return ((-(-m // C) + 1) * index_bytes + slots * (index_bytes + np.dtype(dtype).itemsize)
            + (m * index_bytes if has_perm else 0))


# ------------------------------------------------------------------------ sweeps


@pytest.mark.parametrize("sigma", ["1", "C", "8C", "all"])
@pytest.mark.parametrize("C", SLICE_HEIGHTS)
@with_dtypes
def test_slice_heights_and_sigmas(C, sigma, dtype, device, rng):
    """Both mappings, m not a multiple of C (and m < C), uneven rows, empty rows."""
    skip_without_fp64(device, dtype)
    for m in (3 * C + 1 if C > 1 else 97, max(1, C - 1), 517):
        A = uneven(rng, m)
        for mapping in ("slices", "rows"):
            wg = max(C, 16) if mapping == "rows" else 16
            op = psc.SpMV(A, format="sell", dtype=dtype, device=device, slice_height=C,
                          sigma=sigma_value(sigma, C), mapping=mapping, work_group_size=wg)
            p = op.params
            assert (p["slice_height"], p["mapping"]) == (C, mapping)
            assert p["sigma"] == sigma_value(sigma, C)
            if mapping == "rows":
                assert p["work_group_size"] % C == 0
            assert op.nbytes == expected_nbytes(A, C, p["sigma"], dtype, 4,
                                                op._impl._has_perm)
            check_all(op, A, dtype, rng)


@pytest.mark.parametrize("T", [2, 4, 8, 16, 32, 64])
@with_dtypes
def test_threads_per_row(T, dtype, device, rng):
    """T work-items per row meeting in local memory, several slices per group and one."""
    skip_without_fp64(device, dtype)
    A = uneven(rng, 301, n=700)
    for C, wg_factor, sigma in ((1, 1, 1), (4, 2, 32), (8, 1, "all"), (32, 1, 1)):
        wg = C * T * wg_factor
        if wg > device.profile.max_work_group_size:
            continue
        try:
            op = psc.SpMV(A, format="sell", dtype=dtype, device=device, slice_height=C,
                          mapping="rows", threads_per_row=T, work_group_size=wg, sigma=sigma)
        except RuntimeError as exc:
            # A driver may compile the kernel for fewer work-items than C * T (NVIDIA:
            # 256): asking for more explicitly is refused, saying so.
            assert wg > 256 and "allows work-groups of at most" in str(exc)
            continue
        assert op.params["threads_per_row"] == T
        assert op.params["work_group_size"] % (C * T) == 0
        check_all(op, A, dtype, rng)


@pytest.mark.parametrize("profile", list(GPU_PROFILES))
@with_dtypes
def test_gpu_shaped_profiles(profile, dtype, device, rng):
    """GPU-shaped defaults run correctly here: C = the warp/wavefront, the rows mapping,
    work-groups of whole slices; and σ = 1, C, 8C, whole matrix on top of them."""
    skip_without_fp64(device, dtype)
    dev = device.override(**GPU_PROFILES[profile])
    lanes = dev.profile.lanes(dtype)
    for A in (uneven(rng, 1000), uneven(rng, 37), sp.csr_matrix((70, 9))):
        op = psc.SpMV(A, format="sell", dtype=dtype, device=dev)
        p = op.params
        assert p["slice_height"] == min(64, lanes)
        if dev.profile.is_gpu:
            assert p["slice_height"] == GPU_PROFILES[profile]["simd_width"]
            assert p["mapping"] == "rows"
            assert p["work_group_size"] % (p["slice_height"] * p["threads_per_row"]) == 0
        else:
            assert p["mapping"] == "slices" and p["threads_per_row"] == 1
        check_all(op, A, dtype, rng)
        for sigma in ("1", "C", "8C", "all"):
            op = psc.SpMV(A, format="sell", dtype=dtype, device=dev,
                          sigma=sigma_value(sigma, p["slice_height"]))
            check_all(op, A, dtype, rng)


# ------------------------------------------------------------------------ layout


def test_device_layout(device, rng):
    """Slices padded to their own width, column-major, -1/0 padding, the sort within
    windows stable and decreasing, and the permutation mapping back to A's rows."""
    A = uneven(rng, 203, n=90)
    A.sort_indices()
    lengths = np.diff(A.indptr)
    for C, sigma in ((4, 1), (4, 16), (8, "all"), (1, 1), (32, 64)):
        op = psc.SpMV(A, format="sell", dtype=np.float32, device=device, slice_height=C,
                      sigma=sigma)
        arrays = read_back(op)
        perm = arrays.get("perm", np.arange(A.shape[0]))
        assert ("perm" in arrays) == (sigma != 1)
        assert np.array_equal(np.sort(perm), np.arange(A.shape[0]))
        window = A.shape[0] if sigma == "all" else sigma
        for start in range(0, A.shape[0], window):
            w = perm[start:start + window]
            assert np.all(w >= start) and np.all(w < start + window)
            assert np.all(np.diff(lengths[w]) <= 0)                  # longest first
            ties = np.diff(lengths[w]) == 0
            assert np.all(np.diff(w)[ties] > 0)                      # stable
        slice_ptr = arrays["slice_ptr"]
        n_slices = -(-A.shape[0] // C)
        assert slice_ptr.size == n_slices + 1 and slice_ptr[0] == 0
        sorted_lengths = np.zeros(n_slices * C, dtype=np.int64)
        sorted_lengths[:A.shape[0]] = lengths[perm]
        widths = np.diff(slice_ptr) // C
        assert np.all(np.diff(slice_ptr) % C == 0)
        np.testing.assert_array_equal(widths, sorted_lengths.reshape(-1, C).max(axis=1))
        col, val = arrays["col_idx"], arrays["values"]
        assert col.size == slice_ptr[-1] == padded_size(lengths, C, sigma)
        for s in range(n_slices):
            block_c = col[slice_ptr[s]:slice_ptr[s + 1]].reshape(widths[s], C)
            block_v = val[slice_ptr[s]:slice_ptr[s + 1]].reshape(widths[s], C)
            for lane in range(C):
                p = s * C + lane
                length = sorted_lengths[p]
                assert np.all(block_c[length:, lane] == -1)
                assert np.all(block_v[length:, lane] == 0)
                if p < A.shape[0]:
                    row = perm[p]
                    lo, hi = A.indptr[row], A.indptr[row + 1]
                    np.testing.assert_array_equal(block_c[:length, lane], A.indices[lo:hi])
                    np.testing.assert_array_equal(block_v[:length, lane],
                                                  A.data[lo:hi].astype(np.float32))


@pytest.mark.parametrize("col_bits", [32, 16])
@pytest.mark.parametrize("mapping", ["slices", "rows"])
@with_dtypes
def test_padding_never_multiplies_x(mapping, col_bits, dtype, device, rng):
    """Padding slots point nowhere: x[0] (read, then discarded, by the slices kernel)
    and every other x entry may be Inf or NaN without leaking into padded rows."""
    skip_without_fp64(device, dtype)
    lengths = np.array([0, 1, 30, 2, 0, 5, 1, 0, 7, 3, 0, 1], dtype=np.int64)
    A = csr_from_row_lengths(rng, lengths, 40)
    for C in (4, 8, 32):
        wg = C if mapping == "rows" else 4
        op = psc.SpMV(A, format="sell", dtype=dtype, device=device, slice_height=C,
                      mapping=mapping, work_group_size=wg, sigma=1, col_bits=col_bits)
        for special in (np.inf, -np.inf, np.nan):
            x = rng.standard_normal(40)
            x[0] = special
            x[A.indices[A.indptr[2]:A.indptr[3]][5]] = special  # one entry of the long row
            y = op.matvec(x, out=poisoned(A.shape[0], dtype))
            check_against_scipy(y, A, x, dtype)
            assert np.isfinite(y[lengths == 0]).all() and (y[lengths == 0] == 0).all()


# ------------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("profile", [None, "gpu32", "gpu64"])
@with_dtypes
def test_empty_rows_and_no_entries(profile, dtype, device, rng):
    skip_without_fp64(device, dtype)
    dev = device if profile is None else device.override(**GPU_PROFILES[profile])
    lengths = rng.integers(0, 9, 1003)
    lengths[:70] = 0                       # leading run, whole slices
    lengths[-45:] = 0                      # trailing run
    lengths[300:700:3] = 0                 # scattered
    lengths[500:501] = 0
    cases = [csr_from_row_lengths(rng, lengths, 50), sp.csr_matrix((65, 20)),
             sp.csr_matrix((1, 1)), sp.csr_matrix((0, 5)), sp.csr_matrix((6, 0))]
    for A in cases:
        for sigma in (1, "all", "auto"):
            op = psc.SpMV(A, format="sell", dtype=dtype, device=dev, sigma=sigma)
            if A.nnz == 0:
                assert not op._impl._has_perm  # nothing to sort: no permutation array
                assert op.nbytes == (op._impl.n_slices + 1) * 4  # slice_ptr alone
            m, n = A.shape
            x = rng.standard_normal(n)
            y = op.matvec(x, out=poisoned(m, dtype))
            check_against_scipy(y, A, x, dtype)


@with_dtypes
def test_index_bits_64(dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = uneven(rng, 300)
    ops = {bits: psc.SpMV(A, format="sell", dtype=dtype, device=device, index_bits=bits,
                          sigma=32) for bits in (32, 64)}
    for bits, op in ops.items():
        assert op.params["index_bits"] == bits
        check_all(op, A, dtype, rng)
    slots = padded_size(np.diff(A.indptr), ops[32].params["slice_height"], 32)
    n_index = ops[32]._impl.n_slices + 1 + slots + A.shape[0]  # slice_ptr, col_idx, perm
    assert ops[64].nbytes - ops[32].nbytes == 4 * n_index


def test_padding_past_32_bits_switches_to_64(device, rng, monkeypatch):
    """Padding can outgrow 32-bit slots where nnz fits: the default moves to 64-bit
    indices, an explicit index_bits=32 is refused (shown with a lowered limit)."""
    lengths = np.zeros(64, dtype=np.int64)
    lengths[::8] = 50                              # 8 rows of 50 in 8 slices of 8
    A = csr_from_row_lengths(rng, lengths, 60)
    monkeypatch.setattr(base_module, "INT32_LIMIT", 1000)   # 3200 slots > 1000 > nnz
    op = psc.SpMV(A, format="sell", dtype=np.float32, device=device, slice_height=8,
                  sigma=1)
    assert op.params["index_bits"] == 64
    x = rng.standard_normal(60)
    check_against_scipy(op.matvec(x, out=poisoned(64, np.float32)), A, x, np.float32)
    with pytest.raises(IndexOverflowError, match="index_bits=64"):
        psc.SpMV(A, format="sell", dtype=np.float32, device=device, slice_height=8,
                 sigma=1, index_bits=32)


# ------------------------------------------------------------------------ parameters


def test_auto_sigma(device, rng):
    """No sort where it saves nothing (equal rows, Poisson), a window where it does."""
    k = 40
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    poisson = sp.csr_matrix(sp.kron(sp.identity(k), T) + sp.kron(T, sp.identity(k)))
    equal = csr_from_row_lengths(rng, np.full(1000, 7), 100)
    skewed = uneven(rng, 5000, n=300, empty_fraction=0.0)
    for C in (4, 8, 32):
        assert auto_sigma(np.diff(equal.indptr), C) == 1
        assert auto_sigma(np.diff(poisson.indptr), C) == 1
        lengths = np.diff(skewed.indptr)
        sigma = auto_sigma(lengths, C)
        assert sigma != 1
        best = padded_size(lengths, C, "all")
        assert padded_size(lengths, C, sigma) <= 1.1 * best < padded_size(lengths, C, 1)
    op = psc.SpMV(poisson, format="sell", device=device)
    assert op.params["sigma"] == 1 and not op._impl._has_perm
    op = psc.SpMV(skewed, format="sell", device=device, dtype=np.float32)
    assert op.params["sigma"] != 1 and op._impl._has_perm
    check_all(op, skewed, np.float32, rng)



@pytest.mark.parametrize("seed", range(8))
def test_auto_sigma_is_the_ladder(seed):
    """auto_sigma's shortcut (sigma = 1 when the unsorted slices pad within the slack of
    the entries themselves, without sorting the whole matrix) picks what the ladder of
    windows against the whole sort picks."""
    from pyspmv_cl.formats.sell import AUTO_SIGMA_SLACK, LADDER_STEP

    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 4000))
    if seed % 2:   # nearly regular rows: the shortcut's case
        lengths = rng.integers(5, 5 + seed, m)
    else:
        lengths = (rng.pareto(rng.uniform(0.8, 5), m) * rng.integers(1, 10)).astype(np.int64)
    for C in (4, 8, 32):
        expected = 1
        if m > C:
            limit, sigma, expected = AUTO_SIGMA_SLACK * padded_size(lengths, C, "all"), 1, "all"
            while sigma < m:
                if padded_size(lengths, C, sigma) <= limit:
                    expected = sigma
                    break
                sigma = LADDER_STEP * C if sigma == 1 else LADDER_STEP * sigma
        assert auto_sigma(lengths, C) == expected

def test_sort_permutation_helpers(rng):
    lengths = rng.integers(0, 20, 103)
    for sigma in (1, 8, 32, 103, 1000, "all"):
        perm = sort_permutation(lengths, sigma)
        assert np.array_equal(np.sort(perm), np.arange(103))
        # padded_size agrees with a direct count over the permuted rows.
        for C in (1, 3, 4, 6, 8):
            if sigma not in (1, "all") and sigma < 103 and sigma % C:
                continue
            sl = np.zeros(-(-103 // C) * C, dtype=np.int64)
            sl[:103] = lengths[perm]
            assert padded_size(lengths, C, sigma) == C * sl.reshape(-1, C).max(axis=1).sum()
    assert padded_size(np.zeros(0, dtype=np.int64), 8, "all") == 0
    assert sort_permutation(np.zeros(0, dtype=np.int64), 8).size == 0


def test_default_threads_per_row(device):
    gpu = device.profile.replace(device_type="gpu", simd_width=32,
                                           compute_units=80, max_work_group_size=1024)
    few_long = MatrixFeatures(500, 100000, 500 * 2000, 2000.0, 2500, 10.0, 0)
    many_short = MatrixFeatures(10**6, 10**6, 5 * 10**6, 5.0, 5, 0.1, 0)
    T = default_threads_per_row(few_long, gpu, 32)
    assert 1 < T <= 32 and 32 * T <= 1024
    assert default_threads_per_row(many_short, gpu, 32) == 1
    assert default_threads_per_row(few_long, gpu.replace(device_type="cpu"), 8) == 1


BAD_PARAMS = [dict(slice_height=3), dict(slice_height=128), dict(slice_height=8.0),
              dict(slice_height=True), dict(sigma=0), dict(sigma=12, slice_height=8),
              dict(sigma="sorted"), dict(sigma=2.0), dict(mapping="warps"),
              dict(threads_per_row=3, mapping="rows"), dict(threads_per_row=2, mapping="slices"),
              dict(mapping="rows", slice_height=8, threads_per_row=4, work_group_size=48),
              dict(work_group_size=0)]


@pytest.mark.parametrize("params", BAD_PARAMS, ids=[str(p) for p in BAD_PARAMS])
def test_bad_parameters(params, device, rng):
    A = uneven(rng, 200)
    with pytest.raises(ValueError, match="sell"):
        psc.SpMV(A, format="sell", device=device, **params)


def test_sigma_of_whole_matrix_need_not_be_a_multiple_of_C(device, rng):
    A = uneven(rng, 100)
    op = psc.SpMV(A, format="sell", device=device, slice_height=8, sigma=100,
                  dtype=np.float32)
    assert op.params["sigma"] == 100
    check_all(op, A, np.float32, rng)


def test_deterministic(device, rng):
    A = uneven(rng, 2000)
    x = rng.standard_normal(A.shape[1])
    for mapping, T in (("slices", 1), ("rows", 4)):
        op = psc.SpMV(A, format="sell", device=device, mapping=mapping, threads_per_row=T,
                      work_group_size=32 * T, slice_height=8, dtype=np.float32)
        first = op @ x
        for _ in range(3):
            assert np.array_equal(op @ x, first)


@pytest.mark.parametrize("profile", [None, "gpu32", "gpu64"])
@pytest.mark.parametrize("given", [dict(slice_height=64), dict(mapping="rows"),
                                   dict(mapping="slices"), dict(threads_per_row=8,
                                                                mapping="rows"),
                                   dict(slice_height=16, mapping="rows", threads_per_row=2)],
                         ids=lambda g: "-".join(f"{k}{v}" for k, v in g.items()))
def test_one_parameter_keeps_the_rest_consistent(given, profile, device, rng):
    """Defaults of T and the work-group size follow a caller's C or mapping."""
    dev = device if profile is None else device.override(**GPU_PROFILES[profile])
    A = uneven(rng, 150, n=800)
    op = psc.SpMV(A, format="sell", device=dev, dtype=np.float32, **given)
    p = op.params
    for key, value in given.items():
        assert p[key] == value
    if p["mapping"] == "rows":
        assert p["work_group_size"] % (p["slice_height"] * p["threads_per_row"]) == 0
    else:
        assert p["threads_per_row"] == 1
    check_all(op, A, np.float32, rng)


# ------------------------------------------------------------------------ col_bits=16


@pytest.mark.parametrize("profile", [None, "gpu32"])
@pytest.mark.parametrize("mapping", ["slices", "rows"])
@with_dtypes
def test_16_bit_columns(mapping, profile, dtype, device, rng):
    """Offsets from each slice's smallest column: products as with 32-bit columns
    (scipy, poisoned outputs, alpha/beta, device vectors), blocks of vectors (the items
    kernels, and on a GPU-shaped profile the lanes kernels of complex values), and the
    footprint of 2 bytes a slot plus one index a slice."""
    skip_without_fp64(device, dtype)
    dev = device if profile is None else device.override(**GPU_PROFILES[profile])
    A = uneven(rng, 700, n=3000)
    for C, sigma in ((4, 1), (8, "all"), (32, 64)):
        if mapping == "rows" and C * 2 > dev.max_work_group_size:
            continue
        op = psc.SpMV(A, format="sell", dtype=dtype, device=dev, slice_height=C,
                      sigma=sigma, mapping=mapping, col_bits=16)
        assert op.params["col_bits"] == 16
        check_all(op, A, dtype, rng)
        wide = psc.SpMV(A, format="sell", dtype=dtype, device=dev, slice_height=C,
                        sigma=sigma, mapping=mapping)
        slots = op._impl.buffers["col_off"].size // 2
        assert wide.nbytes - op.nbytes == 2 * slots - 4 * op._impl.n_slices
        X = rng.standard_normal((A.shape[1], 5))
        Y = op.matmat(X.astype(dtype), out=poisoned((A.shape[0], 5), dtype))
        for j in range(5):
            check_against_scipy(Y[:, j], A, X[:, j], dtype)


def test_16_bit_layout(device, rng):
    """Each slice's base is its smallest column, and base + offset gives back the
    32-bit layout's columns, padding (0xFFFF) where it has -1."""
    A = uneven(rng, 203, n=90)
    for C, sigma in ((4, 1), (8, "all")):
        narrow = read_back(psc.SpMV(A, format="sell", dtype=np.float32, device=device,
                                    slice_height=C, sigma=sigma, col_bits=16))
        wide = read_back(psc.SpMV(A, format="sell", dtype=np.float32, device=device,
                                  slice_height=C, sigma=sigma))
        slice_ptr = wide["slice_ptr"]
        n_slices = slice_ptr.size - 1
        offsets = shared_read_back_offsets(device, A, C, sigma)
        base = narrow["col_base"][:n_slices]
        col = wide["col_idx"]
        counts = np.diff(slice_ptr)
        decoded = np.where(offsets == PAD_OFFSET, -1,
                           np.repeat(base, counts) + offsets.astype(np.int64))
        np.testing.assert_array_equal(decoded, col)
        for s in range(n_slices):
            real = col[slice_ptr[s]:slice_ptr[s + 1]]
            real = real[real >= 0]
            assert base[s] == (real.min() if real.size else 0)


def shared_read_back_offsets(device, A, C, sigma):
    op = psc.SpMV(A, format="sell", dtype=np.float32, device=device, slice_height=C,
                  sigma=sigma, col_bits=16)
    arrays = shared_read_back(op, types={"col_off": np.uint16})
    return arrays["col_off"][:int(read_back(op)["slice_ptr"][-1])]


def one_slice_spanning(rng, span, n):
    """A sparse 64 x n matrix whose rows 0-3 (one slice of 4, sigma=1) hold just two
    entries, ``span`` columns apart: a random entry there could widen the span past
    the limit (seed 496466800 put one at column 65542)."""
    from matrix_cases import random_csr
    A = random_csr(rng, 64, n, 0.0001).tolil()
    A[0:4, :] = 0
    A[3, 5] = 1.0
    A[3, 5 + span] = 2.0
    return A.tocsr()


def host_and_device(A, device):
    """``(source, kwargs)`` for SpMV: the host CSR, and the same CSR on the device."""
    import pyopencl.array as cla
    triple = tuple(cla.to_device(device.queue, a) for a in
                   (A.data.astype(np.float32), A.indices.astype(np.int32),
                    A.indptr.astype(np.int32)))
    return ((A, {}), (triple, {"shape": A.shape}))


def test_16_bit_columns_refuse_a_wide_slice(device, rng):
    """A slice spanning 0xFFFF columns or more is refused clearly, on the host and on
    the device (a device CSR converts there); one column less fits."""
    n = PAD_OFFSET + 10
    for span, fits in ((PAD_OFFSET - 1, True), (PAD_OFFSET, False)):
        A = one_slice_spanning(rng, span, n)
        for source, kwargs in host_and_device(A, device):
            args = dict(format="sell", dtype=np.float32, device=device, sigma=1,
                        slice_height=4, col_bits=16, **kwargs)
            if fits:
                op = psc.SpMV(source, **args)
                x = rng.standard_normal(n)
                check_against_scipy(op @ x, A, x, np.float32)
            else:
                with pytest.raises(FormatNotSuitableError, match="col_bits=16"):
                    psc.SpMV(source, **args)


def test_auto_column_bits_take_16_where_slices_fit(device, rng):
    """col_bits="auto": 16 bits where every slice fits (a host and a device CSR), 32
    where one slice spans too much (the kernels built again for 32 bits); products
    right either way, with blocks, update_values and a transposed product."""
    n = PAD_OFFSET + 10
    for span, bits in ((PAD_OFFSET - 1, 16), (PAD_OFFSET, 32)):
        A = one_slice_spanning(rng, span, n)
        for source, kwargs in host_and_device(A, device):
            op = psc.SpMV(source, format="sell", dtype=np.float32, device=device,
                          sigma=1, slice_height=4, col_bits="auto", **kwargs)
            assert op.params["col_bits"] == bits
            assert ("col_off" in op._impl.buffers) == (bits == 16)
            x = rng.standard_normal(n)
            check_against_scipy(op.matvec(x, out=poisoned(64, np.float32)), A, x,
                                np.float32)
            X = rng.standard_normal((n, 3))
            Y = op @ X
            for j in range(3):
                check_against_scipy(Y[:, j], A, X[:, j], np.float32)
            new = rng.standard_normal(A.nnz)
            op.update_values(new)
            B = A.copy()
            B.data = new
            check_against_scipy(op @ x, B, x, np.float32)
            y = rng.standard_normal(64)
            check_against_scipy(op.T @ y, B.T.tocsr(), y, np.float32)


@pytest.mark.parametrize("spread, bits", [(0.2, 16), (1.0, 32)])
def test_gpu_default_column_bits_follow_the_row_spread(spread, bits, device, rng):
    """On a GPU-shaped profile sell takes 16-bit columns by default where rows are
    regular (their spread at most NARROW_DEFAULT_SPREAD) and the slices fit."""
    dev = device.override(**GPU_PROFILES["gpu32"])
    lengths = np.maximum(1, np.round(10 + 10 * spread * rng.standard_normal(2000)))
    A = csr_from_row_lengths(rng, lengths.astype(np.int64), 3000)
    op = psc.SpMV(A, format="sell", dtype=np.float32, device=dev)
    assert op.params["col_bits"] == bits
    check_all(op, A, np.float32, rng)


@pytest.mark.parametrize("profile", [None, "gpu32"])
def test_16_bit_columns_complex(profile, device, rng):
    """Complex values with 16-bit columns: one vector and a block (the lanes kernel on a
    GPU-shaped profile), against scipy in complex128."""
    from conftest import assert_cclose
    dtype = np.complex128 if device.fp64 else np.complex64
    dev = device if profile is None else device.override(**GPU_PROFILES[profile])
    A = uneven(rng, 300, n=2000).astype(np.complex128)
    A.data = A.data + 1j * rng.standard_normal(A.nnz)
    op = psc.SpMV(A, format="sell", dtype=dtype, device=dev, col_bits=16)
    x = rng.standard_normal(2000) + 1j * rng.standard_normal(2000)
    assert_cclose(op.matvec(x.astype(dtype), out=poisoned(300, dtype)), A @ x, A, x, dtype)
    X = (rng.standard_normal((2000, 3)) + 1j * rng.standard_normal((2000, 3))).astype(dtype)
    Y = op.matmat(X, out=poisoned((300, 3), dtype))
    for j in range(3):
        assert_cclose(Y[:, j], A @ X[:, j].astype(np.complex128), A, X[:, j], dtype)
