"""Reduced-precision value storage (``value_bits``, formats/storage.py): sell, csr-vector
and csr-scalar store their values as IEEE half (``value_bits=16``: float32 and float64
operators) or float32 (``value_bits=32``: float64 operators) and accumulate in the
operator's type.

Every product path is checked twice against scipy in float64: within the operator's
own accuracy of the matrix *as stored* (its values rounded to the stored type, which
is what the kernels must compute with, exactly), and within the storage's bound of the
unrounded matrix (relative 2^-11 of |A| |x| for half).  Values that the stored type
cannot hold (1 + 2^-12 in half) show that the rounding really happens; host and device
conversions are compared bit for bit."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DEVICES, assert_close, poisoned, reference, skip_without_fp64
from matrix_cases import few_wide_blocks

import pyspmv_cl as psc
from pyspmv_cl.adjoint import current_values
from pyspmv_cl.formats import FORMATS, get_format
from pyspmv_cl.formats.storage import full_bits

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")

STORED = {16: np.float16, 32: np.float32}
# (operator dtype, value_bits): the reduced modes.
MODES = [(np.float32, 16), (np.float64, 32), (np.float64, 16)]
MODE_IDS = ["f32-half", "f64-float", "f64-half"]
# Each format's parameter sets: both sell mappings (T > 1 too), the three csr-vector
# mappings, csr-scalar; block_mapping both ways for the CSR formats.
VARIANTS = [
    ("sell", {"mapping": "slices", "slice_height": 8, "sigma": 32}),
    ("sell", {"mapping": "rows", "slice_height": 4, "threads_per_row": 4,
              "work_group_size": 32, "col_bits": 16}),
    ("csr-vector", {"mapping": "rows", "vector_size": 4, "block_mapping": "items"}),
    ("csr-vector", {"mapping": "adaptive", "block_mapping": "lanes"}),
    ("csr-scalar", {"block_mapping": "items"}),
    ("csr-vector", {"mapping": "merge", "work_group_size": 32, "items_per_thread": 4,
                    "block_mapping": "lanes"}),
]
VARIANT_IDS = ["sell-slices", "sell-rows-T4", "csrv-rows", "csrv-adaptive", "csr-scalar",
               "csrv-merge"]
# Each stored type's unit roundoff (half: 11 significant bits).
UNIT = {np.float16: 2.0**-11, np.float32: 2.0**-24}


def stored(A, dtype, bits):
    """A with its values as the operator stores them (rounded to dtype, then to the
    stored type), in float64."""
    A = sp.csr_matrix(A, dtype=np.float64, copy=True)
    A.data = A.data.astype(dtype).astype(STORED[bits]).astype(np.float64)
    return A


def matrix(rng, m=150, n=120, density=0.06):
    A = sp.random(m, n, density=density, format="csr", random_state=rng,
                  data_rvs=rng.standard_normal)
    A.data *= 3.0   # magnitudes around the half range's middle
    return A


def check(y, A, x, dtype, bits, alpha=1.0, beta=0.0, y0=None, AT=False):
    """y against the stored matrix at the operator's accuracy, and against the exact
    matrix within the storage bound."""
    A = A.T.tocsr() if AT else A
    As = stored(A, dtype, bits)
    assert_close(y, reference(As, x, alpha, beta, y0), As, x, dtype)
    y = np.asarray(y, dtype=np.float64)
    exact = reference(A, x, alpha, beta, y0)
    mags = sp.csr_matrix((np.abs(A.data), A.indices, A.indptr), shape=A.shape)
    scale = abs(alpha) * (mags @ np.abs(np.asarray(x, np.float64)))
    if y0 is not None:
        scale = scale + abs(beta) * np.abs(y0)
    bound = (UNIT[STORED[bits]] + 1e-5) * scale + 1e-30
    assert np.all(np.abs(y - exact) <= bound)


@pytest.fixture(params=DEVICES[:1], ids=lambda d: d.id)
def dev(request):
    return request.param


# ---------------------------------------------------------------- single-vector products


@pytest.mark.parametrize("dtype, bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt, params", VARIANTS, ids=VARIANT_IDS)
def test_matvec_alpha_beta(fmt, params, dtype, bits, dev, rng):
    skip_without_fp64(dev, dtype)
    A = matrix(rng)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=dev, value_bits=bits, **params)
    assert op.params["value_bits"] == bits
    x = rng.standard_normal(A.shape[1])
    check(op @ x, A, x, dtype, bits)
    out = poisoned(A.shape[0], dtype)
    op.matvec(x, out=out, alpha=0.5)
    check(out, A, x, dtype, bits, alpha=0.5)
    y0 = rng.standard_normal(A.shape[0]).astype(dtype)
    out = y0.copy()
    op.matvec(x, out=out, alpha=-2.0, beta=0.25)
    check(out, A, x, dtype, bits, alpha=-2.0, beta=0.25, y0=y0)
    # Device vectors: a never-written y.
    x_d = cla.to_device(op.queue, x.astype(dtype))
    y_d = cla.empty(op.queue, A.shape[0], dtype)
    op.matvec(x_d, out=y_d)
    check(y_d.get(), A, x, dtype, bits)


@pytest.mark.parametrize("dtype, bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt", ["sell", "csr-vector", "csr-scalar"])
def test_values_are_really_rounded(fmt, dtype, bits, dev):
    """Values the stored type cannot hold give exactly the rounded answer: 1 + 2^-(p+1)
    (p the stored fraction bits) rounds to 1, so a row of r such values times ones is
    exactly r; full precision would give r (1 + 2^-(p+1)).  Ties go to even: 1 + 2^-p-1
    ... checked through 1 + 3 * 2^-(p+1), which rounds up to 1 + 2^-(p-1)."""
    skip_without_fp64(dev, dtype)
    p = 10 if bits == 16 else 23
    r = 16
    m = 40
    lengths = np.arange(m) % r + 1
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([np.arange(k) for k in lengths])
    below = 1 + 2.0**-(p + 2)        # under half an ulp: rounds down
    tie_even = 1 + 2.0**-(p + 1)     # a tie: to even, 1
    tie_up = 1 + 3 * 2.0**-(p + 1)   # a tie: to even, 1 + 2^-(p-1)
    data = np.where(np.arange(indices.size) % 3 == 0, below,
                    np.where(np.arange(indices.size) % 3 == 1, tie_even, tie_up))
    A = sp.csr_matrix((data, indices, indptr), shape=(m, r))
    assert np.all(data.astype(dtype) == data)   # the operator's type holds them
    expect = sp.csr_matrix((np.where(data == tie_up, 1 + 2.0**-(p - 1), 1.0), indices,
                            indptr), shape=A.shape) @ np.ones(r)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=dev, value_bits=bits)
    y = op @ np.ones(r)
    np.testing.assert_array_equal(y, expect)
    assert not np.array_equal(y, A @ np.ones(r))
    full = psc.SpMV(A, format=fmt, dtype=dtype, device=dev)
    np.testing.assert_allclose(full @ np.ones(r), A @ np.ones(r), rtol=1e-6)


def test_tiny_values_flush_to_zero_in_half(dev):
    """Half's subnormals: 2^-24 is kept, 2^-26 (under half the smallest) becomes 0."""
    A = sp.csr_matrix(np.array([[2.0**-24, 2.0**-26], [1e-3, 0.0]]))
    op = psc.SpMV(A, format="csr-scalar", dtype=np.float32, device=dev, value_bits=16)
    y = op @ np.array([1.0, 1.0])
    assert y[0] == 2.0**-24
    assert y[1] == np.float64(np.float16(1e-3))


# csr-vector's 16-bit columns with reduced values: (mode, conversion, matrix); the
# default run takes the first two, --exhaustive the others too.
COL16_CASES = [(0, "host", "narrow"), (2, "device", "escape"), (0, "host", "escape"),
               (1, "device", "narrow"), (0, "device", "escape"), (1, "host", "escape")]


@pytest.mark.parametrize("mode, where, blocks", [
    pytest.param(MODES[i], where, blocks, id=f"{MODE_IDS[i]}-{where}-{blocks}",
                 marks=() if n < 2 else pytest.mark.exhaustive)
    for n, (i, where, blocks) in enumerate(COL16_CASES)])
def test_col_bits_16(mode, where, blocks, dev, rng):
    """csr-vector's adaptive mapping with 16-bit columns (offsets from each row block's
    base) and reduced values, converted on the host or (a CSR given on the device)
    there; "escape": a few row blocks wider than 16 bits keep 32-bit columns in
    col_wide (tests/test_csr_vector_col_bits.py).  Single products with alpha and beta,
    device vectors, blocks through the lanes kernel (its wide loop too), a value
    update."""
    dtype, bits = mode
    skip_without_fp64(dev, dtype)
    A = few_wide_blocks(rng) if blocks == "escape" else matrix(rng)
    params = {"mapping": "adaptive", "work_group_size": 16, "items_per_thread": 3,
              "col_bits": 16, "block_mapping": "lanes", "value_bits": bits}
    if where == "host":
        op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=dev, **params)
    else:
        triple = tuple(cla.to_device(dev.queue, a)
                       for a in (A.data.astype(dtype), A.indices, A.indptr))
        op = psc.SpMV(triple, shape=A.shape, format="csr-vector", dtype=dtype, device=dev,
                      **params)
        assert op._impl.converting_on_device
    assert op.params["col_bits"] == 16 and op._impl.col_escape is (blocks == "escape")
    assert op.params["value_bits"] == bits and op._impl.value_dtype == STORED[bits]
    m, n = A.shape
    x = rng.standard_normal(n)
    check(op @ x, A, x, dtype, bits)
    y0 = rng.standard_normal(m).astype(dtype)
    out = y0.copy()
    op.matvec(x, out=out, alpha=-2.0, beta=0.25)
    check(out, A, x, dtype, bits, alpha=-2.0, beta=0.25, y0=y0)
    x_d = cla.to_device(op.queue, x.astype(dtype))
    y_d = cla.empty(op.queue, m, dtype)
    op.matvec(x_d, out=y_d)
    check(y_d.get(), A, x, dtype, bits)
    X = rng.standard_normal((n, 2))   # one block (the lanes kernel's wide loop too)
    check(op @ X, A, X, dtype, bits)
    new = 3.0 * rng.standard_normal(A.nnz)
    op.update_values(new)
    B = A.copy()
    B.data = new
    check(op @ x, B, x, dtype, bits)
    np.testing.assert_array_equal(current_values(op), stored(B, dtype, bits).data)

# ----------------------------------------------------------------------- block products


@pytest.mark.parametrize("dtype, bits", MODES[:2], ids=MODE_IDS[:2])
@pytest.mark.parametrize("fmt, params", VARIANTS, ids=VARIANT_IDS)
def test_block_products(fmt, params, dtype, bits, dev, rng):
    A = matrix(rng)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=dev, value_bits=bits, **params)
    n, m = A.shape[1], A.shape[0]
    X = rng.standard_normal((n, 19))   # blocks of 16, 2, 1 (or columns)
    check(op @ X, A, X, dtype, bits)
    Y0 = rng.standard_normal((m, 3)).astype(dtype)
    X3 = rng.standard_normal((n, 3))
    X_d = cla.to_device(op.queue, X3.astype(dtype))
    Y_d = cla.to_device(op.queue, Y0)
    op.matmat(X_d, out=Y_d, alpha=1.5, beta=-1.0)
    check(Y_d.get(), A, X3, dtype, bits, alpha=1.5, beta=-1.0, y0=Y0)


def test_block_kernels_are_used(dev, rng):
    """The block kernels (not the column loop) run with half values."""
    from pyspmv_cl.launching import record_launches
    A = matrix(rng)
    X = rng.standard_normal((A.shape[1], 4))
    for fmt, params in VARIANTS[:3] + VARIANTS[4:]:
        op = psc.SpMV(A, format=fmt, device=dev, dtype=np.float32, value_bits=16, **params)
        with record_launches(with_names=True) as launched:
            Y = op @ X
        # (GPUs take the lanes kernels for blocks: sell's and the CSR formats'.)
        assert {name for name, _ in launched} <= {"sell_block", "csr_vector_block",
                                                  "csr_scalar_block", "csr_lanes_block",
                                                  "sell_lanes_block"}, launched
        check(Y, A, X, np.float32, 16)


# ------------------------------------------------------------------ transposed products


@pytest.mark.parametrize("dtype, bits", MODES[:2], ids=MODE_IDS[:2])
@pytest.mark.parametrize("fmt, params", [VARIANTS[0], VARIANTS[3]], ids=["sell", "csrv"])
def test_transposed_products_keep_the_storage(fmt, params, dtype, bits, dev, rng):
    A = matrix(rng)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=dev, value_bits=bits, **params)
    x = rng.standard_normal(A.shape[0])
    check(op.T @ x, A, x, dtype, bits, AT=True)
    assert op.transposed.params["value_bits"] == bits
    assert op.transposed.format == fmt
    out = poisoned(A.shape[1], dtype)
    op.rmatvec(x, out=out, alpha=2.0)
    check(out, A, x, dtype, bits, alpha=2.0, AT=True)
    U = rng.standard_normal((A.shape[0], 5))
    check(op.T @ U, A, U, dtype, bits, AT=True)
    # New values reach the copy rounded too.
    new = rng.standard_normal(A.nnz)
    op.update_values(new)
    B = A.copy()
    B.data = new
    check(op.T @ x, B, x, dtype, bits, AT=True)


def test_transposed_copy_in_another_format_keeps_the_rounding(dev, rng):
    """sell with col_bits=16 refuses A^T (a slice spanning 70000 columns): the copy is
    format='auto' at full width, and still computes with A's stored values, before and
    after update_values."""
    m = 70000
    A = sp.csr_matrix((np.array([1 + 2.0**-12, 3.0, 1 + 3 * 2.0**-11]),
                       (np.array([0, 5, m - 1]), np.array([0, 1, 0]))), shape=(m, 2))
    op = psc.SpMV(A, format="sell", device=dev, dtype=np.float32, value_bits=16,
                  col_bits=16, slice_height=8)
    x = np.zeros(m)
    x[[0, 5, m - 1]] = 1.0
    np.testing.assert_array_equal(op.T @ x, [1 + 1 + 2.0**-9, 3.0])
    assert op.transposed.format != "sell" or op.transposed.params["col_bits"] == 32
    op.update_values(np.array([1 + 2.0**-12, 2 + 2.0**-10, 1.0]))
    np.testing.assert_array_equal(op.T @ x, [2.0, 2.0])


# ------------------------------------------------------------------------- update_values


@pytest.mark.parametrize("dtype, bits", MODES[:2], ids=MODE_IDS[:2])
@pytest.mark.parametrize("fmt, params", [VARIANTS[0], VARIANTS[1], VARIANTS[2]],
                         ids=VARIANT_IDS[:3])
def test_update_values(fmt, params, dtype, bits, dev, rng):
    A = matrix(rng)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=dev, value_bits=bits, **params)
    x = rng.standard_normal(A.shape[1])
    for _ in range(2):
        new = rng.standard_normal(A.nnz) * 4
        op.update_values(new)
        B = A.copy()
        B.data = new
        check(op @ x, B, x, dtype, bits)
        # The device holds exactly what a fresh operator converts.
        np.testing.assert_array_equal(current_values(op), stored(B, dtype, bits).data)
    if bits == 16:
        before = op @ x
        bad = new.copy()
        bad[7] = 70000.0
        with pytest.raises(psc.InvalidInputError, match="65504"):
            op.update_values(bad)
        np.testing.assert_array_equal(op @ x, before)   # nothing changed
        ok = new.copy()
        ok[7] = 65519.0   # rounds down to 65504, not to inf
        op.update_values(ok)
        assert np.isfinite(op @ x).all()


# --------------------------------------------------------------- device-side conversion


@pytest.mark.parametrize("dtype, bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt, params", [
    ("sell", {"slice_height": 4, "sigma": 8}),
    ("sell", {"slice_height": 8, "col_bits": 16, "mapping": "rows"}),
    ("csr-vector", {}), ("csr-scalar", {})], ids=["sell", "sell-col16", "csrv", "csrs"])
def test_device_conversion_matches_the_host(fmt, params, dtype, bits, dev, rng,
                                           monkeypatch):
    """A CSR given on the device is rounded there (vstore_half_rte / convert_float_rte)
    to exactly the host conversion's bits, ties and near-overflow values included."""
    skip_without_fp64(dev, dtype)
    A = matrix(rng, 97, 80, 0.1)
    special = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 65519.0, -65505.0, 2.0**-25, 3 * 2.0**-26,
               1 + 2.0**-24, 1 + 3 * 2.0**-24, 1 / 3, 1e-30,
               # Just off a half tie by less than float32 holds: a float64 operator
               # rounds them to half directly (float64 -> float32 -> half would make
               # them ties, and 1 + 2^-11 + 2^-40 would go down to 1).
               1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-11 - 2.0**-40, -(3 + 2.0**-9 + 2.0**-45)]
    A.data[:len(special)] = special
    triple = (cla.to_device(dev.queue, A.data.astype(dtype)),
              cla.to_device(dev.queue, A.indices.astype(np.int32)),
              cla.to_device(dev.queue, A.indptr.astype(np.int32)))
    on_dev = psc.SpMV(triple, shape=A.shape, format=fmt, dtype=dtype, device=dev,
                      value_bits=bits, **params)
    # A GPU converts a host CSR on the device too: here the host conversion is wanted.
    monkeypatch.setattr(get_format(fmt), "host_input_on_device", False)
    on_host = psc.SpMV(A, format=fmt, dtype=dtype, device=dev, value_bits=bits, **params)
    impl_d, impl_h = on_dev._impl, on_host._impl
    assert impl_d.converting_on_device and not impl_h.converting_on_device
    for name, size in impl_h.value_array_sizes.items():
        got = []
        for impl in (impl_d, impl_h):
            host = np.empty(size, impl.value_dtype)
            cl.enqueue_copy(dev.queue, host, impl.buffers[name])
            got.append(host.view(np.uint16 if bits == 16 else host.dtype))
        np.testing.assert_array_equal(got[0], got[1])
    # Both hold numpy's rounding (to dtype, then to the stored type), in CSR order.
    np.testing.assert_array_equal(current_values(on_dev), stored(A, dtype, bits).data)
    if dtype == np.float64 and bits == 16:   # directly, not through float32
        near = np.array(special[-3:])
        assert not np.array_equal(near.astype(np.float16),
                                  near.astype(np.float32).astype(np.float16))
    x = rng.standard_normal(A.shape[1])
    np.testing.assert_array_equal(on_dev @ x, on_host @ x)
    check(on_dev @ x, A, x, dtype, bits)


@pytest.mark.parametrize("fmt", ["sell", "csr-vector"])
def test_overflow_is_refused(fmt, dev, rng):
    A = matrix(rng)
    A.data[3] = -1e5
    with pytest.raises(psc.FormatNotSuitableError, match="65504"):
        psc.SpMV(A, format=fmt, device=dev, dtype=np.float32, value_bits=16)
    triple = (cla.to_device(dev.queue, A.data.astype(np.float32)),
              cla.to_device(dev.queue, A.indices), cla.to_device(dev.queue, A.indptr))
    with pytest.raises(psc.FormatNotSuitableError, match="65504"):
        psc.SpMV(triple, shape=A.shape, format=fmt, device=dev, value_bits=16)
    # float32 storage of a float64 operator: 1e39 overflows float32.
    A.data[3] = 1e39
    with pytest.raises(psc.FormatNotSuitableError, match="float32"):
        psc.SpMV(A, format=fmt, device=dev, dtype=np.float64, value_bits=32)
    # Inf and NaN given stay what they are (not an overflow).
    A.data[3], A.data[4] = np.inf, np.nan
    op = psc.SpMV(A, format=fmt, device=dev, dtype=np.float32, value_bits=16)
    y = op @ np.ones(A.shape[1])
    with np.errstate(invalid="ignore"):
        ref = A @ np.ones(A.shape[1])
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
    assert np.isinf(y).any() or np.isnan(y).sum() >= 1


# ------------------------------------------------------------------------ memory, refusals


@pytest.mark.parametrize("fmt", ["sell", "csr-vector", "csr-scalar"])
def test_nbytes_counts_the_smaller_values(fmt, dev, rng):
    A = matrix(rng)
    full = psc.SpMV(A, format=fmt, device=dev, dtype=np.float32)
    half = psc.SpMV(A, format=fmt, device=dev, dtype=np.float32, value_bits=16)
    slots = full._impl.value_array_sizes["values"]
    assert slots >= A.nnz
    assert full.nbytes - half.nbytes == 2 * slots
    d64 = psc.SpMV(A, format=fmt, device=dev, dtype=np.float64)
    d32 = psc.SpMV(A, format=fmt, device=dev, dtype=np.float64, value_bits=32)
    assert d64.nbytes - d32.nbytes == 4 * d64._impl.value_array_sizes["values"]


def test_refusals(dev, rng):
    A = matrix(rng)
    with pytest.raises(psc.InvalidParameterError, match="wider"):
        psc.SpMV(A, format="sell", device=dev, dtype=np.float32, value_bits=64)
    with pytest.raises(psc.InvalidParameterError, match="complex"):
        psc.SpMV(A, format="csr-vector", device=dev, dtype=np.complex64, value_bits=16)
    with pytest.raises(psc.InvalidParameterError, match="complex"):
        psc.SpMV(A, format="sell", device=dev, dtype=np.complex128, value_bits=32)
    with pytest.raises(psc.InvalidParameterError, match="one of"):
        psc.SpMV(A, format="sell", device=dev, value_bits=8)
    with pytest.raises(psc.UnknownParameterError):
        psc.SpMV(A, format="coo", device=dev, value_bits=16)
    with pytest.raises(psc.InvalidParameterError, match="format='auto'"):
        psc.SpMV(A, device=dev, dtype=np.float32, value_bits=16, tune=False)
    # Full width is the default, given or not, complex included.
    for dtype in (np.float32, np.float64, np.complex64):
        op = psc.SpMV(A, format="sell", device=dev, dtype=dtype,
                      value_bits=full_bits(dtype))
        assert op.params["value_bits"] == full_bits(dtype)
        assert psc.SpMV(A, format="sell", device=dev, dtype=dtype).params["value_bits"] \
            == full_bits(dtype)


def test_auto_never_picks_reduced_storage(dev, rng):
    """The tuner's candidates and every format's defaults keep full precision, on CPU-
    and GPU-shaped profiles; format='auto' builds full-precision operators."""
    from pyspmv_cl.features import MatrixFeatures
    A = matrix(rng)
    features = MatrixFeatures.from_csr(A)
    gpu = dev.override(device_type="gpu", simd_width=32)
    for device in (dev, gpu):
        for name, cls in FORMATS.items():
            if "value_bits" not in cls.parameter_names():
                continue
            for dtype in (np.float32, np.float64):
                defaults = cls.default_params(features, device.profile, dtype)
                assert defaults["value_bits"] == full_bits(dtype)
                for cand in cls.tuning_candidates(features, device.profile, dtype, csr=A):
                    assert "value_bits" not in cand, (name, cand)
    for dtype in (np.float32, np.float64):
        op = psc.SpMV(A, device=dev, dtype=dtype, tune=False)
        assert op.params.get("value_bits", full_bits(dtype)) == full_bits(dtype)
        assert op._impl.value_dtype == dtype
