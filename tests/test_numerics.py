"""Numerical honesty, every format: a rigorous per-row error bound, NaN/Inf exactly as
scipy, and bit-for-bit determinism from run to run.

Error bound (README, "Reliability").  Row i with L_i stored entries (duplicates and
explicit zeros counted) is a sum of L_i products, each of two inputs rounded to the
dtype; however a format splits and reorders that sum (tiles, carries, segmented scans,
partial sums scaled by alpha before they are added), every term goes through at most
L_i + 6 roundings, so with unit roundoff u (2**-24 for float32, 2**-53 for float64)

    |y_i - y_exact_i| <= gamma(L_i + 6) * (|alpha| * (|A| @ |x|)_i + |beta| * |y0_i|),
    gamma(k) = k * u / (1 - k * u)

(Higham, Accuracy and Stability of Numerical Algorithms, 3.1 and 3.5).  The bound is
checked row by row, against a float64 reference whose own error (gamma(L_i) in
float64) is added for the float64 case, on rows of 1 to 1500 entries whose magnitudes
span six decades, so long rows, big carries and cancellation are all exercised.
"""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import poisoned, skip_without_fp64
from format_variants import GPU32, GPU64
from matrix_cases import csr_from_row_lengths, magnitudes

import pyspmv_cl as psc
from pyspmv_cl.formats import get_format

FORMATS = psc.formats()
with_formats = pytest.mark.parametrize("fmt", FORMATS)
PROFILES = {"native": {}, "gpu32": GPU32, "gpu64": GPU64}
EXTRA_ROUNDINGS = 6


def combos(*pairs):
    """(profile, dtype) pairs: both dtypes natively, GPU-shaped profiles in one each
    (they change the kernels' geometry, not their arithmetic)."""
    return pytest.mark.parametrize("profile,dtype", pairs,
                                   ids=[f"{p}-{np.dtype(d).name}" for p, d in pairs])


F32, F64 = np.float32, np.float64


def gamma(k, dtype):
    u = np.finfo(dtype).eps / 2
    k = np.asarray(k, dtype=np.float64)
    return k * u / (1 - k * u)


def error_bound(A, x, dtype, alpha=1.0, beta=0.0, y0=None):
    """Per-row bound of the module docstring (plus the float64 reference's own error)."""
    lengths = np.diff(sp.csr_matrix(A).indptr)
    scale = abs(alpha) * (magnitudes(A) @ np.abs(x))
    if beta:
        scale = scale + abs(beta) * np.abs(np.asarray(y0, dtype=np.float64))
    bound = gamma(lengths + EXTRA_ROUNDINGS, dtype) * scale
    if np.dtype(dtype) != np.float64:
        return bound
    return bound + gamma(lengths + 2, np.float64) * scale  # the reference's own rounding


def exact_reference(A, x, alpha=1.0, beta=0.0, y0=None):
    y = alpha * (sp.csr_matrix(A, dtype=np.float64, copy=True) @ np.asarray(x, np.float64))
    return y + beta * np.asarray(y0, np.float64) if beta else y


def wide_range(rng, size):
    """Signed values whose magnitudes span 1e-3 .. 1e3."""
    return rng.choice([-1.0, 1.0], size) * 10.0 ** rng.uniform(-3, 3, size)


def bound_matrix(rng):
    lengths = np.concatenate([np.arange(0, 40), [63, 64, 65, 127, 128, 129, 255, 256, 257,
                                                 511, 512, 513, 1000, 1500],
                              rng.integers(0, 20, 200)])
    rng.shuffle(lengths)
    A = csr_from_row_lengths(rng, lengths, 1600, shuffle=True)
    A.data = wide_range(rng, A.nnz)
    return A


def make(A, fmt, dtype, device, **params):
    try:
        return psc.SpMV(A, format=fmt, dtype=dtype, device=device, **params)
    except psc.FormatNotSuitableError:
        if not get_format(fmt).may_refuse:
            raise
        return None


# ------------------------------------------------------------------------ error bound


@combos(("native", F32), ("native", F64), ("gpu32", F32))
@with_formats
def test_error_within_the_documented_bound(fmt, dtype, profile, device, rng):
    skip_without_fp64(device, dtype)
    dev = device.override(**PROFILES[profile]) if PROFILES[profile] else device
    A = bound_matrix(rng)
    extra = {"max_padding": float("inf")} if fmt in ("ell", "ellr-t") else {}
    extra.update({"max_fill": float("inf"), "max_diagonals": 10**9} if fmt == "dia" else {})
    op = make(A, fmt, dtype, dev, **extra)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    m, n = A.shape
    for alpha, beta in ((1.0, 0.0), (-0.75, 1.5)):
        x = wide_range(rng, n)
        y0 = wide_range(rng, m).astype(dtype)
        start = poisoned(m, dtype) if beta == 0 else y0.copy()
        y = op.matvec(x, out=start, alpha=alpha, beta=beta).astype(np.float64)
        # The exact product of the values the device actually holds: rounding the inputs
        # to float32 is part of the bound, not of the reference.
        err = np.abs(y - exact_reference(A, x, alpha, beta, y0))
        bound = error_bound(A, x, dtype, alpha, beta, y0)
        bad = err > bound
        assert not bad.any(), (f"{bad.sum()} rows over the bound; worst row "
                               f"{np.argmax(err / np.maximum(bound, 1e-300))}: error "
                               f"{err[bad].max():.3e}, bound {bound[bad].min():.3e}")
        # The bound is not vacuous: the float32 error is visible but far below it.
        if np.dtype(dtype) == np.float32:
            assert 0 < err.max() and np.median(err[bound > 0] / bound[bound > 0]) < 0.2


def test_bound_is_tight_enough_to_catch_a_lost_term(rng):
    """Dropping one term of a long row (what an off-by-one in a tile loop does) breaks
    the bound: the bound is a real check, not a loose tolerance."""
    A = bound_matrix(rng)
    x = wide_range(rng, A.shape[1])
    y = exact_reference(A, x)
    row = int(np.argmax(np.diff(A.indptr)))
    lo, hi = A.indptr[row], A.indptr[row + 1]
    terms = A.data[lo:hi] * x[A.indices[lo:hi]]
    y[row] -= terms[np.argmax(np.abs(terms))]
    assert (np.abs(y - exact_reference(A, x)) > error_bound(A, x, np.float32)).any()


# ------------------------------------------------------------------------ NaN / Inf


def specials_matrix(rng, n=70):
    """Rows that each test one rule of IEEE propagation through a sparse product."""
    rows, cols, vals = [], [], []

    def row(i, entries):
        for c, v in entries:
            rows.append(i)
            cols.append(c)
            vals.append(v)

    row(0, [(5, 1.0), (6, 2.0)])                     # finite
    row(1, [(0, 0.0)])                               # explicit 0 * inf = nan
    row(2, [(0, 3.0), (7, 1.0)])                     # +inf via x
    row(3, [(0, -3.0), (1, 2.0)])                    # -inf + +inf = nan
    row(4, [(8, np.inf), (9, 1.0)])                  # inf in A
    row(5, [(8, np.inf), (9, -np.inf)])              # inf - inf in A = nan
    row(6, [(10, np.nan)])                           # nan in A
    row(7, [(2, 1.0)])                               # x nan
    for i in range(8, 40):                           # rows of 1..32 finite entries, no
        k = i - 7                                    # entry in the inf/nan columns: the
        row(i, [(c, 1.0 + c) for c in range(11, 11 + k)])  # padding must stay out
    row(40, [(c, 1.0) for c in range(n)])            # a full row through every special
    row(41, [(3, 1.0), (3, -1.0)])                   # duplicates through -inf
    # rows 42..44 empty, then a long finite row
    row(45, [(c, 0.5) for c in range(11, n)])
    # Built as CSR directly: the duplicates of row 41 stay two entries.
    indptr = np.searchsorted(np.array(rows), np.arange(48))
    A = sp.csr_matrix((np.array(vals), np.array(cols), indptr), shape=(47, n))
    A.has_canonical_format = False
    x = np.abs(rng.standard_normal(n)) + 0.5   # positive: the signs of the infinities
    x[0], x[1], x[2], x[3] = np.inf, np.inf, np.nan, -np.inf
    return A, x


def assert_same_ieee(y, y_ref):
    y = np.asarray(y, dtype=np.float64)
    assert np.array_equal(np.isnan(y), np.isnan(y_ref)), (
        f"NaN rows {np.flatnonzero(np.isnan(y))} vs scipy {np.flatnonzero(np.isnan(y_ref))}")
    inf = np.isinf(y_ref)
    assert np.array_equal(np.isinf(y), inf), (
        f"Inf rows {np.flatnonzero(np.isinf(y))} vs scipy {np.flatnonzero(inf)}")
    assert np.array_equal(y[inf], y_ref[inf]), "signs of infinities differ"


@combos(("native", F32), ("native", F64), ("gpu64", F32))
@with_formats
def test_nan_inf_exactly_as_scipy(fmt, dtype, profile, device, rng):
    skip_without_fp64(device, dtype)
    dev = device.override(**PROFILES[profile]) if PROFILES[profile] else device
    A, x = specials_matrix(rng)
    ref = sp.csr_matrix(A, copy=True) @ x        # scipy itself, as a user would call it
    assert np.isnan(ref[[1, 3, 5, 6, 7, 40, 41]]).all() and np.isinf(ref[[2, 4]]).all()
    op = make(A, fmt, dtype, dev, **({"max_padding": float("inf")}
                                     if fmt in ("ell", "ellr-t") else {}))
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    assert_same_ieee(op.matvec(x, out=poisoned(A.shape[0], dtype)), ref)
    # beta == 0: a NaN already in y is never read.  beta != 0: y0's Inf/NaN propagate.
    y0 = np.full(A.shape[0], 1.0, dtype=dtype)
    y0[[0, 9]] = np.inf, np.nan
    y = op.matvec(x, out=y0.copy(), alpha=2.0, beta=0.5)
    assert_same_ieee(y, 2.0 * ref + 0.5 * y0.astype(np.float64))


# ------------------------------------------------------------------------ determinism


def deterministic_params(fmt):
    """Parameters under which ``fmt`` promises bit-identical results: none needed unless
    the format says otherwise (``deterministic = False`` plus ``deterministic_params``,
    e.g. a float-atomics variant with a two-pass fallback)."""
    cls = get_format(fmt)
    if getattr(cls, "deterministic", True):
        return {}
    params = getattr(cls, "deterministic_params", None)
    assert params is not None, f"{fmt} is not deterministic and offers no option that is"
    return dict(params)


def carry_matrix(rng):
    """Long rows spanning many work-groups and tiles, plus short and empty rows."""
    lengths = rng.integers(0, 12, 1500)
    lengths[[3, 700, 1499]] = [1800, 2500, 1200]
    A = csr_from_row_lengths(rng, lengths, 3000)
    A.data = wide_range(rng, A.nnz)
    return A


@combos(("native", F32), ("native", F64), ("gpu64", F32))
@with_formats
def test_deterministic_run_to_run(fmt, dtype, profile, device, rng):
    skip_without_fp64(device, dtype)
    dev = device.override(**PROFILES[profile]) if PROFILES[profile] else device
    A = carry_matrix(rng)
    params = deterministic_params(fmt)
    if fmt in ("ell", "ellr-t"):
        params["max_padding"] = float("inf")
    if fmt == "dia":
        params.update(max_fill=float("inf"), max_diagonals=10**9)
    first = make(A, fmt, dtype, dev, **params)
    if first is None:
        pytest.skip(f"{fmt} refuses this matrix")
    second = make(A, fmt, dtype, dev, **params)
    assert first.params == second.params
    x = wide_range(rng, A.shape[1])
    expected = first.matvec(x, out=poisoned(A.shape[0], dtype))
    results = [first.matvec(x, out=poisoned(A.shape[0], dtype)) for _ in range(3)]
    results.append(second.matvec(x, out=poisoned(A.shape[0], dtype)))
    for y in results:
        assert np.array_equal(y, expected), (
            f"{fmt}: {np.count_nonzero(y != expected)} entries differ between runs")


@with_formats
def test_non_finite_alpha_on_rows_without_entries(fmt, device, rng):
    """alpha * (A @ x) + beta * y with alpha inf or NaN: rows without entries are NaN
    (inf * 0), as numpy gives, whatever beta.  coo left them at 0, or at beta * y, and
    skipped them altogether for beta == 1 (a test drive found it)."""
    A = sp.csr_matrix(np.array([[0, 0, 0], [1, 2, 0], [0, 0, 0], [0, 3, 1.5]]))
    params = {"max_padding": np.inf} if fmt in ("ell", "ellr-t") else {}
    try:
        op = psc.SpMV(A, format=fmt, dtype=np.float32, device=device, **params)
    except psc.FormatNotSuitableError:
        pytest.skip(f"{fmt} refuses this matrix")
    x = np.array([1.0, 2.0, 3.0], np.float32)
    for alpha in (np.inf, -np.inf, np.nan):
        for beta, y0 in ((0.0, None), (1.0, np.full(4, 2.0)), (0.5, np.full(4, 2.0))):
            out = None if y0 is None else y0.astype(np.float32)
            got = op.matvec(x, out=out, alpha=alpha, beta=beta)
            with np.errstate(all="ignore"):
                want = alpha * (A @ x.astype(np.float64)) + (0 if y0 is None else beta * y0)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=(alpha, beta))
            finite = ~np.isnan(want)
            np.testing.assert_array_equal(got[finite], want[finite].astype(np.float32))


def test_a_scalar_of_one_is_not_multiplied_in_on_every_path(device, rng):
    """beta == 1 adds out as it is (README): (inf + 0j) * (1 + 0j) is inf + NaN j, which
    hyb's complex |alpha| > 1 path, an out finer than the operator's type, and a real
    operator's complex products (host and device) gave; a real alpha on a real operator
    with a real x and a complex out scaled the zero imaginary part (inf * 0)."""
    skip_without_fp64(device, np.complex128)
    A = sp.csr_matrix(np.array([[1.0, 0.0], [1.0, 2.0]]))
    x = np.array([1.0, 1.0])
    y0 = np.array([np.inf + 0j, 1 + 0j])
    want = np.array([np.inf + 0j, 2.5 * 3 + 1])
    hyb = psc.SpMV(A, format="hyb", dtype=np.complex64, device=device)
    for op, out_dtype in ((hyb, np.complex64),
                          (psc.SpMV(A, format="csr-scalar", dtype=np.complex64,
                                    device=device), np.complex128),
                          (psc.SpMV(A, format="csr-scalar", dtype=np.float64,
                                    device=device), np.complex128)):
        out = y0.astype(out_dtype)
        op.matvec(x.astype(op.dtype), out=out, alpha=2.5, beta=1.0)
        np.testing.assert_array_equal(out, want.astype(out_dtype))
        if np.dtype(op.dtype).kind == "c":   # the device path, out of either type
            out_d = cla.to_device(op.queue, y0.astype(out_dtype))
            op.matvec(cla.to_device(op.queue, x.astype(op.dtype)), out=out_d, alpha=2.5,
                      beta=1.0)
            np.testing.assert_array_equal(out_d.get(), want.astype(out_dtype))
    real = psc.SpMV(A, format="csr-scalar", dtype=np.float64, device=device)
    out = np.array([1 + 1j, 1 + 1j])
    real.matvec(x, out=out, alpha=np.inf, beta=0.5)
    np.testing.assert_array_equal(out, np.array([np.inf + 0.5j, np.inf + 0.5j]))


def test_scalar_range_follows_the_types_rounding(device):
    """alpha/beta refused where float32 holds them as inf or 0, decided by float32's
    rounding: its largest value written in more digits is taken, half its smallest
    subnormal (which rounds to 0) refused."""
    op = psc.SpMV(sp.csr_matrix(np.array([[1.0, 1.0]])), format="csr-scalar",
                  dtype=np.float32, device=device)
    x = np.array([1.0, 0.0], np.float32)
    top = 3.402823567797336e38   # float32 rounds it to its largest, 3.4028235e38
    assert op.matvec(x, alpha=top)[0] == np.finfo(np.float32).max
    with pytest.raises(psc.InvalidInputError, match="round to 0"):
        op.matvec(x, alpha=2.0 ** -150)
    with pytest.raises(psc.InvalidInputError, match="outside float32's range"):
        op.matvec(x, alpha=3.5e38)
    assert op.matvec(x, alpha=2.0 ** -149)[0] == np.float32(2.0 ** -149)
