"""Multi-vector products (SpMM): ``op @ X`` and ``op.matmat(X, out, alpha, beta)`` for a
block of k vectors, host (C/F order, views) and device (row-major and column-major pyopencl arrays),
against scipy in float64 with fresh random data and NaN-poisoned outputs.

Formats with block kernels (csr-scalar, csr-vector's row mapping, ell, sell) read the
matrix once per block of 16, 8, 4, 2 or 1 vectors; the others multiply column by
column.  Block widths are built on first use, so the k values below use widths 1, 2, 4
and 16 (3 = 2+1, 7 = 4+2+1, 33 = 16+16+1, 64 = 4x16).  Complex values (complex64,
complex128, against scipy in complex128) go up to width 8: k = 1, 2, 3, 8, 17; their
tests also prove from the launches that the block kernels run, and cover op.H, op.T
and rmatmat on blocks."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import POISON, assert_cclose, assert_close, reference, skip_without_fp64

import pyspmv_cl as psc
from pyspmv_cl.launching import record_launches

KS = (1, 2, 3, 7, 16, 33, 64)

# (format, params) with block kernels: both mappings of sell, both reductions of
# csr-vector's row mapping.
BLOCK_VARIANTS = [
    ("csr-scalar", {}),
    ("csr-vector", {"mapping": "rows", "vector_size": 4, "reduction": "serial"}),
    ("csr-vector", {"mapping": "rows", "vector_size": 8, "work_group_size": 32,
                    "reduction": "tree"}),
    ("ell", {"max_padding": float("inf")}),
    ("sell", {"mapping": "slices", "slice_height": 8, "sigma": 64}),
    ("sell", {"mapping": "rows", "slice_height": 4, "threads_per_row": 2,
              "work_group_size": 16, "sigma": 1}),
    # The lanes kernel (the GPU default of both CSR formats; widths up to 32).
    ("csr-scalar", {"block_mapping": "lanes"}),
    ("csr-vector", {"mapping": "adaptive", "block_mapping": "lanes"}),
    ("csr-vector", {"mapping": "merge", "block_mapping": "lanes"}),
]
BLOCK_FORMATS = {"csr-scalar", "csr-vector", "ell", "sell"}
# The items kernels (the CPU default; on this test's devices ell and sell use them for
# complex values too unless the device is a GPU): the complex tests below force them.
ITEMS_VARIANTS = [(f, {**p, "block_mapping": "items"} if f.startswith("csr") else p)
                  for f, p in BLOCK_VARIANTS if p.get("block_mapping") != "lanes"]


def _id(variant):
    fmt, params = variant
    return fmt + "".join(f"-{v}" for k, v in params.items()
                         if k in ("mapping", "reduction", "block_mapping"))


def random_matrix(rng, m, n, density=0.08):
    A = sp.random(m, n, density=density, format="csr", random_state=rng,
                  data_rvs=rng.standard_normal)
    A.data[::7] *= 1e3   # a spread of magnitudes
    return A


def check(Y, A, X, dtype, alpha=1.0, beta=0.0, Y0=None):
    assert_close(Y, reference(A, X, alpha, beta, Y0), A, X, dtype)


def poisoned(shape, dtype, order="C"):
    nan = complex(np.nan, np.nan) if np.dtype(dtype).kind == "c" else POISON[np.dtype(dtype)]
    return np.full(shape, nan, dtype=dtype, order=order)


@pytest.mark.parametrize("variant", BLOCK_VARIANTS, ids=_id)
def test_block_kernels_against_scipy(device, variant):
    """Every k, host C- and F-ordered X, out= poisoned with beta == 0, alpha/beta with
    out= given, device arrays (float64)."""
    fmt, params = variant
    dtype = np.float64
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    A = random_matrix(rng, 203, 157)
    op = psc.SpMV(A, fmt, dtype=dtype, device=device, **params)
    assert op.has_block_kernels
    if "lane_columns" in params:
        assert [op._impl._lane_columns(kb) for kb in (1, 2, 32)] == \
            [1, min(2, params["lane_columns"]), params["lane_columns"]]
    for k in KS:
        X = rng.standard_normal((157, k))
        check(op @ X, A, X, dtype)
        out = poisoned((203, k), dtype, order="F")
        Xf = np.asfortranarray(X)
        assert op.matmat(Xf, out=out, alpha=-0.5) is out
        check(out, A, X, dtype, alpha=-0.5)
        Y0 = rng.standard_normal((203, k))
        Y = op.matmat(X, out=Y0.copy(), alpha=2.0, beta=-0.75)
        check(Y, A, X, dtype, 2.0, -0.75, Y0)
        Xd = cla.to_device(op.queue, X)
        Yd = cla.to_device(op.queue, poisoned((203, k), dtype))
        assert op.matmat(Xd, out=Yd, alpha=1.5) is Yd
        check(Yd.get(), A, X, dtype, 1.5)
        Yd = cla.to_device(op.queue, Y0)
        op.matmat(Xd, out=Yd, alpha=0.5, beta=2.0)
        check(Yd.get(), A, X, dtype, 0.5, 2.0, Y0)


@pytest.mark.parametrize("block_copy", [False, True])
@pytest.mark.parametrize("fmt", sorted(set(psc.formats()) - BLOCK_FORMATS))
def test_formats_without_block_kernels(device, fmt, block_copy):
    """The column loop (``block_copy=False``: host C/F order with alpha/beta, device
    arrays through the transposes), and the CSR copy with block kernels that the first
    block product makes otherwise."""
    dtype = np.float64
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    A = random_matrix(rng, 97, 88, density=0.1)
    params = {"max_padding": float("inf")} if fmt == "ellr-t" else {}
    if fmt == "dia":
        params = {"max_fill": float("inf"), "max_diagonals": 10**9}
    op = psc.SpMV(A, fmt, dtype=dtype, device=device, block_copy=block_copy, **params)
    assert not op.has_block_kernels and op.block_copy is None
    if block_copy:   # made now, not once block products have paid for it
        op.build_block_copy()
    for k in (3, 7):
        X = rng.standard_normal((88, k))
        check(op @ np.asfortranarray(X), A, X, dtype)
        Y0 = rng.standard_normal((97, k))
        check(op.matmat(X, out=Y0.copy(), alpha=2.0, beta=0.5), A, X, dtype, 2.0, 0.5, Y0)
        Xd = cla.to_device(op.queue, X)
        Yd = cla.to_device(op.queue, poisoned((97, k), dtype))
        check(op.matmat(Xd, out=Yd, alpha=-1.0).get(), A, X, dtype, -1.0)
        Yd = cla.to_device(op.queue, Y0)
        check(op.matmat(Xd, out=Yd, alpha=0.5, beta=-1.0).get(), A, X, dtype, 0.5, -1.0, Y0)
    if block_copy:
        assert op.block_copy.format == "csr-scalar" and op.block_copy.has_block_kernels
        assert op.nbytes_parts["blocks"] == op.block_copy.nbytes > 0
    else:
        assert op.block_copy is None and op.nbytes_parts["blocks"] == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["csr-scalar", "sell"])
def test_dtypes(device, fmt, dtype):
    """Both value types; x of the other float type (host: numpy's result type; device:
    cast on the device) and out of the other type."""
    skip_without_fp64(device, np.float64)
    rng = np.random.default_rng()
    A = random_matrix(rng, 120, 90)
    op = psc.SpMV(A, fmt, dtype=dtype, device=device)
    other = np.float64 if dtype == np.float32 else np.float32
    for k in (3, 16):
        X = rng.standard_normal((90, k)).astype(dtype)
        Y = op @ X
        assert Y.dtype == dtype
        check(Y, A, X, dtype)
        Y = op @ X.astype(other)
        assert Y.dtype == np.result_type(dtype, other)
        check(Y, A, X.astype(other).astype(dtype), dtype)
        Xd = cla.to_device(op.queue, X.astype(other))
        Yd = op @ Xd
        assert Yd.dtype == np.result_type(dtype, other)
        check(Yd.get(), A, X.astype(other).astype(dtype), dtype)
        Y0 = rng.standard_normal((120, k)).astype(other)
        Yd = cla.to_device(op.queue, Y0)
        op.matmat(cla.to_device(op.queue, X), out=Yd, alpha=2.0, beta=1.0)
        check(Yd.get(), A, X, np.float32, 2.0, 1.0, Y0)   # out's precision is float32


# The lanes kernels (formats/lanes.py): the CSR formats' with block_mapping="lanes" (the
# GPU default), ell's and sell's for every value type on GPUs.
LANES_CASES = [
    *[("csr-scalar", {"block_mapping": "lanes"}, "csr_lanes_block", d)
      for d in (np.float32, np.complex64, np.complex128)],
    *[("csr-vector", {"block_mapping": "lanes"}, "csr_lanes_block", d)
      for d in (np.float32, np.complex64, np.complex128)],
    *[("ell", {"max_padding": float("inf")}, "ell_lanes_block", d)
      for d in (np.float32, np.float64, np.complex64, np.complex128)],
    ("sell", {}, "sell_lanes_block", np.complex64),
    ("sell", {}, "sell_lanes_block", np.float32),
    ("sell", {"mapping": "rows", "slice_height": 4, "threads_per_row": 2},
     "sell_lanes_block", np.float64),
    ("sell", {"mapping": "slices", "slice_height": 8, "sigma": 64}, "sell_lanes_block",
     np.complex128),
    # A fixed lane_columns (clipped to narrower blocks) instead of lane_columns's rule.
    ("csr-scalar", {"block_mapping": "lanes", "lane_columns": 8}, "csr_lanes_block",
     np.float32),
    ("csr-vector", {"block_mapping": "lanes", "lane_columns": 4}, "csr_lanes_block",
     np.complex128),
    ("ell", {"max_padding": float("inf"), "lane_columns": 1}, "ell_lanes_block",
     np.float32),
    ("sell", {"lane_columns": 8}, "sell_lanes_block", np.float64),
    # A row's entries split among groups of its lanes (their sums met in local memory),
    # clipped where a group of 128 holds fewer (k = 32: at most 4 groups of 32 lanes).
    ("csr-scalar", {"block_mapping": "lanes", "lane_split": 4}, "csr_lanes_block",
     np.float64),
    ("csr-vector", {"block_mapping": "lanes", "lane_split": 32, "lane_columns": 2},
     "csr_lanes_block", np.complex64),
    ("csr-vector", {"block_mapping": "lanes", "lane_split": 2, "mapping": "rows"},
     "csr_lanes_block", np.float32),
    # Rows taken longest first in windows (row_order): of 4 rows, of 256 with the split,
    # and one window wider than the matrix.
    ("csr-scalar", {"block_mapping": "lanes", "lane_order": 4}, "csr_lanes_block",
     np.float64),
    ("csr-vector", {"block_mapping": "lanes", "lane_order": 256, "lane_split": 4,
                    "lane_columns": 2}, "csr_lanes_block", np.complex64),
    ("csr-vector", {"block_mapping": "lanes", "lane_order": 1024}, "csr_lanes_block",
     np.float32),
]


@pytest.mark.parametrize("fmt, params, kernel, dtype", LANES_CASES,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_lanes_kernel(device, fmt, params, kernel, dtype):
    """The lanes kernels: k up to 32 in one launch (33 and 40 in two), complex values
    included; rows of 0, 1 and 5000 entries, a row count that is no multiple of a
    group's rows; poisoned outputs, alpha/beta, device arrays."""
    from pyspmv_cl.launching import record_launches

    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    m, n = 301, 5003
    A = random_matrix(rng, m, n, density=0.002).tolil()
    A[5, :] = 0
    A[7, :] = 0
    A[7, 11] = 2.5
    A[9, :] = rng.standard_normal(n)          # a 5000-entry row
    A = A.tocsr()
    if np.dtype(dtype).kind == "c":
        A = A + 1j * A.multiply(rng.standard_normal(A.shape))
    A = sp.csr_matrix(A)
    if fmt in ("ell", "sell"):   # their lanes kernels: on GPUs only
        device = device.override(device_type="gpu")
    op = psc.SpMV(A, fmt, dtype=dtype, device=device, **params)
    assert op.has_block_kernels
    if "lane_columns" in params:
        assert [op._impl._lane_columns(kb) for kb in (1, 2, 32)] == \
            [1, min(2, params["lane_columns"]), params["lane_columns"]]
    if "lane_split" in params:   # at most the group's 128 work-items a row
        for kb in (1, 2, 8, 32):
            lanes = kb // op._impl._lane_columns(kb)
            assert op._impl._lane_split(kb) == min(params["lane_split"], 128 // lanes)
            assert op._impl.block_local_bytes(kb, 128) > 0
    if "lane_order" in params:   # the rows' order, made beside the CSR arrays
        check_row_order(op, A, params["lane_order"])

    def block(k, rows=n):
        X = rng.standard_normal((rows, k))
        return X + 1j * rng.standard_normal((rows, k)) if np.dtype(dtype).kind == "c" else X

    A128 = sp.csr_matrix(A, dtype=np.complex128)
    mags = abs(A128)
    eps = np.finfo(np.dtype(dtype).char.lower()).eps

    def check(Y, X, alpha=1.0, beta=0.0, Y0=None):
        """Against scipy in complex128: NaN nowhere (poison caught), error within a
        bound proportional to |A| |X| (+ |beta Y0|) for the row's 5000 entries."""
        want = alpha * (A128 @ X.astype(np.complex128))
        scale = abs(alpha) * (mags @ np.abs(X)) + np.abs(want)
        if Y0 is not None:
            want = want + beta * Y0
            scale = scale + abs(beta) * np.abs(Y0)
        Y = np.asarray(Y, dtype=np.complex128)
        assert Y.shape == want.shape and not np.isnan(Y).any()
        assert np.all(np.abs(Y - want) <= 16 * eps * np.sqrt(5000) * scale + 1e-30)

    # (k = 1 is a single product: the format's own kernel.)
    for k, launches in ((1, None), (2, 1), (5, 2), (8, 1), (31, 5), (32, 1), (33, 2),
                        (40, 2)):
        X = block(k).astype(dtype)
        Xd = cla.to_device(op.queue, X)
        Yd = cla.to_device(op.queue, poisoned((m, k), dtype))
        with record_launches(with_names=True) as events:
            op.matmat(Xd, out=Yd, alpha=1.5)
        if launches is not None:
            assert [name for name, _ in events] == [kernel] * launches, k
        check(Yd.get(), X, 1.5)
        Y0 = block(k, m).astype(dtype)
        alpha, beta = (0.5 - 1j, 2.0 + 0.5j) if np.dtype(dtype).kind == "c" else (0.5, 2.0)
        check(op.matmat(X, out=Y0.copy(), alpha=alpha, beta=beta), X, alpha, beta, Y0)
        check(op @ np.asfortranarray(X), X)


def check_row_order(op, A, window):
    """The operator's row_order: a permutation of the rows, each window of ``window``
    rows in place, longest first, equal lengths in their order."""
    order = cla.Array(op.queue, A.shape[0], op._impl.index_dtype,
                      data=op._impl.buffers["row_order"]).get()
    m = A.shape[0]
    assert np.array_equal(np.sort(order), np.arange(m))
    lengths = np.diff(A.indptr)
    for start in range(0, m, window):
        part = order[start:start + window]
        assert part.min() >= start and part.max() < start + window
        key = [(-lengths[r], r) for r in part]
        assert key == sorted(key)


def test_row_order_from_a_device_matrix(device):
    """lane_order on a CSR given on the device: the same order (from its row pointers
    on the host) and right block products; rows in order by default, and without the
    lanes kernel no order is made."""
    rng = np.random.default_rng()
    lengths = rng.integers(0, 40, 700)
    lengths[::50] = 300
    from matrix_cases import csr_from_row_lengths
    A = csr_from_row_lengths(rng, lengths, 900).tocsr()
    A.data = rng.standard_normal(A.nnz)
    q = device.queue
    triple = tuple(cla.to_device(q, a) for a in (A.data, A.indices, A.indptr))
    op = psc.SpMV(triple, shape=A.shape, format="csr-vector", device=device,
                  block_mapping="lanes", lane_order=64, dtype=np.float64)
    assert op._impl.converting_on_device
    check_row_order(op, A, 64)
    X = rng.standard_normal((900, 8))
    assert np.allclose(op @ X, A @ X, rtol=1e-12, atol=1e-12)
    plain = psc.SpMV(A, format="csr-vector", device=device, block_mapping="lanes")
    assert "row_order" not in plain._impl.buffers
    items = psc.SpMV(A, format="csr-scalar", device=device, block_mapping="items",
                     lane_order=64)
    assert "row_order" not in items._impl.buffers
    assert np.allclose(items @ X, A @ X, rtol=1e-5, atol=1e-4)
    with pytest.raises(psc.InvalidParameterError, match="lane_order"):
        psc.SpMV(A, format="csr-vector", device=device, lane_order=100)


def test_lanes_is_the_gpu_default_items_the_cpu_one(device):
    A = random_matrix(np.random.default_rng(), 40, 30)
    op = psc.SpMV(A, "csr-scalar", device=device)
    want = "lanes" if device.profile.is_gpu else "items"
    assert op.params["block_mapping"] == want
    with pytest.raises(psc.InvalidParameterError, match="block_mapping"):
        psc.SpMV(A, "csr-scalar", device=device, block_mapping="warps")


def test_lane_columns_rule():
    """The lanes kernels' column count: the CSR formats take two at k = 4 and 8 only
    where the rows are known to be regular (spread of their lengths at most
    CSR_REGULAR_SPREAD[k]), one at k = 1 and 2; from 16 four where they are known to
    be short and even (CSR_SHORT_ROWS), else two.  Tuning's alternative: the other of
    one and two at k = 4 and 8, of two and four from 16.  ell and sell (slotted) keep
    theirs."""
    from pyspmv_cl.formats.lanes import (
        CSR_REGULAR_SPREAD,
        CSR_SHORT_ROWS,
        lane_columns,
        lane_columns_alternative,
    )
    assert [lane_columns(kb) for kb in (1, 2, 4, 8, 16, 32)] == [1, 1, 1, 1, 2, 2]
    for kb, bound in CSR_REGULAR_SPREAD.items():
        assert lane_columns(kb, row_spread=bound) == 2
        assert lane_columns(kb, row_spread=bound + 0.01) == 1
        assert lane_columns_alternative(kb) == 2
        assert lane_columns_alternative(kb, row_spread=bound) == 1
    assert [lane_columns(kb, row_spread=0.0) for kb in (1, 2, 16, 32)] == [1, 1, 2, 2]
    assert [lane_columns(kb, True, 0.0) for kb in (1, 8, 16)] == [1, 2, 4]
    assert lane_columns_alternative(16, row_spread=0.0) == 4
    mean, spread = CSR_SHORT_ROWS
    for kb in (16, 32):
        assert lane_columns(kb, row_spread=spread, mean_row=mean) == 4
        assert lane_columns(kb, row_spread=spread + 0.01, mean_row=mean) == 2
        assert lane_columns(kb, row_spread=spread, mean_row=mean + 0.5) == 2
        assert lane_columns_alternative(kb, row_spread=spread, mean_row=mean) == 2
    assert lane_columns_alternative(2, row_spread=0.0) is None
    assert lane_columns_alternative(8, True, 0.0) is None


@pytest.mark.parametrize("fmt", ["csr-scalar", "csr-vector"])
def test_lane_columns_from_the_rows(device, fmt):
    """SpMV hands the matrix's row statistics to its format: a banded matrix's k = 4
    and 8 lanes kernels compute two columns per work-item and its k = 16 one four (five
    entries a row), a power-law one's one and two; all right."""
    rng = np.random.default_rng()
    dev = device.override(simd_width=32, device_type="gpu")
    n = 600
    banded = sp.diags([rng.standard_normal(n - abs(d)) for d in (-2, -1, 0, 1, 2)],
                      [-2, -1, 0, 1, 2], format="csr")
    lengths = np.minimum(n, (rng.pareto(1.2, n) + 1).astype(int))
    lengths[::50] = n   # a few full rows: spread well above the bound
    rows = np.repeat(np.arange(n), lengths)
    cols = np.concatenate([rng.choice(n, k, replace=False) for k in lengths])
    skewed = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(n, n))
    for A, wants in ((banded, {4: 2, 8: 2, 16: 4}), (skewed, {4: 1, 8: 1, 16: 2})):
        op = psc.SpMV(A, fmt, device=dev, dtype=np.float32, block_mapping="lanes")
        assert op._impl.row_spread is not None and op._impl.mean_row_length is not None
        for k, want in wants.items():
            assert op._impl._lane_columns(k) == want, op._impl.row_spread
            X = rng.standard_normal((n, k))
            out = poisoned((n, k), np.float32)
            with record_launches(with_names=True) as launched:
                op.matmat(X, out=out)
            assert {name for name, _ in launched} == {"csr_lanes_block"}
            check(out, A, X, np.float32)


def test_views_and_aliasing(device):
    """Non-contiguous host views; out= overlapping X (host and device, square A)."""
    dtype = np.float64
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    A = random_matrix(rng, 80, 80, density=0.15)
    op = psc.SpMV(A, "csr-scalar", dtype=dtype, device=device)
    big = rng.standard_normal((160, 30))
    X = big[::2, 3::3]          # (80, 9), neither C- nor F-contiguous
    check(op @ X, A, X, dtype)
    check(op @ big[::2, :].T[:7].T, A, big[::2, :7], dtype)
    X = rng.standard_normal((80, 5))
    X0 = X.copy()
    op.matmat(X, out=X)          # in place on the host
    check(X, A, X0, dtype)
    X = rng.standard_normal((80, 5))
    Xd = cla.to_device(op.queue, X)
    op.matmat(Xd, out=Xd)       # in place on the device
    check(Xd.get(), A, X, dtype)


def test_edge_shapes(device):
    """k = 0, empty matrices, a matrix without entries."""
    dtype = np.float64
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    for A in (sp.csr_matrix((0, 5)), sp.csr_matrix((6, 0)), sp.csr_matrix((6, 5))):
        m, n = A.shape
        for fmt in ("csr-scalar", "sell", "ell", "coo"):
            op = psc.SpMV(A, fmt, dtype=dtype, device=device)
            for k in (0, 1, 3):
                X = rng.standard_normal((n, k))
                Y = op.matmat(X, out=poisoned((m, k), dtype))
                np.testing.assert_array_equal(Y, np.zeros((m, k)))
                Yd = op @ cla.to_device(op.queue, X)
                assert Yd.shape == (m, k)
                if k and m:
                    Yd = cla.to_device(op.queue, poisoned((m, k), dtype))
                    np.testing.assert_array_equal(op.matmat(cla.to_device(op.queue, X),
                                                            out=Yd).get(), np.zeros((m, k)))
    X = rng.standard_normal((5, 0))
    op = psc.SpMV(sp.random(4, 5, density=0.5, format="csr"), "sell", device=device)
    assert (op @ X).shape == (4, 0)


def test_device_column_major_blocks(device):
    """Column-major (F-ordered) device blocks, X and out, at an offset too, with
    alpha/beta and a poisoned out, give scipy's result in out's own order."""
    rng = np.random.default_rng()
    A = random_matrix(rng, 30, 20)
    for fmt in ("csr-scalar", "coo"):   # a block kernel, and the column path
        op = psc.SpMV(A, fmt, dtype=np.float32, device=device)
        q = op.queue
        for k in (2, 5):
            X = rng.standard_normal((20, k)).astype(np.float32)
            want = A @ X.astype(np.float64)
            Y = op @ cla.to_device(q, np.asfortranarray(X))
            np.testing.assert_allclose(Y.get(), want, rtol=1e-4, atol=1e-4)
            out = cla.to_device(q, np.asfortranarray(poisoned((30, k), np.float32)))
            assert op.matmat(cla.to_device(q, X), out=out) is out
            assert out.flags.f_contiguous and not out.flags.c_contiguous
            np.testing.assert_allclose(out.get(), want, rtol=1e-4, atol=1e-4)
            old = rng.standard_normal((30, k)).astype(np.float32)
            out = cla.to_device(q, np.asfortranarray(old))
            wider = cla.to_device(q, np.asfortranarray(
                rng.standard_normal((20, k + 2)).astype(np.float32)))
            view = wider[:, 1:k + 1]   # F-ordered at an offset
            assert view.offset and view.flags.f_contiguous
            op.matmat(view, out=out, alpha=2.0, beta=-0.5)
            want = 2 * (A @ wider.get()[:, 1:k + 1].astype(np.float64)) - 0.5 * old
            np.testing.assert_allclose(out.get(), want, rtol=1e-4, atol=1e-4)


def test_device_layout_errors(device):
    """Strided device blocks are refused with a typed error; wrong shapes too."""
    rng = np.random.default_rng()
    A = random_matrix(rng, 30, 20)
    op = psc.SpMV(A, "csr-scalar", dtype=np.float32, device=device)
    X = rng.standard_normal((20, 8)).astype(np.float32)
    strided = cla.to_device(op.queue, X)[:, ::2]
    with pytest.raises(psc.UnsupportedLayoutError, match="C-contiguous"):
        op @ strided
    with pytest.raises(psc.InvalidInputError, match="shape"):
        op.matmat(cla.to_device(op.queue, np.ascontiguousarray(X[:, :4])),
                  out=cla.empty(op.queue, (30, 5), np.float32))
    with pytest.raises(psc.InvalidInputError, match="shape"):
        op.matmat(cla.to_device(op.queue, np.asfortranarray(X[:, :4])),
                  out=cla.empty(op.queue, (31, 4), np.float32, order="F"))


def test_linear_operator_and_transposed(device):
    """aslinearoperator().matmat and op.T.matmat (the transposed copy's block kernels)."""
    dtype = np.float64
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    A = random_matrix(rng, 70, 50)
    op = psc.SpMV(A, "csr-scalar", dtype=dtype, device=device)
    X = rng.standard_normal((50, 7))
    check(op.aslinearoperator().matmat(X), A, X, dtype)
    check(op.aslinearoperator() @ X, A, X, dtype)
    Z = rng.standard_normal((70, 3))
    check(op.T.matmat(Z), A.T.tocsr(), Z, dtype)
    check(op.rmatmat(Z), A.T.tocsr(), Z, dtype)


# -- complex values --------------------------------------------------------------------
# Complex blocks hold a row's KB sums as 2*KB interleaved parts (common.mako): widths
# 8, 4, 2, 1, so 17 = 8+8+1 and 3 = 2+1 cover a partial last block.
CKS = (1, 2, 3, 8, 17)
CDTYPES = [np.complex64, np.complex128]
BLOCK_KERNEL = {"csr-scalar": "csr_scalar_block", "csr-vector": "csr_vector_block",
                "ell": "ell_block", "sell": "sell_block"}


def cblock(rng, rows, k):
    return rng.standard_normal((rows, k)) + 1j * rng.standard_normal((rows, k))


def crandom_matrix(rng, m, n, density=0.08):
    A = random_matrix(rng, m, n, density)
    A.data = A.data * (1 + 0.5j) + 1j * rng.standard_normal(A.nnz)
    return A


def launched_kernels(product):
    """The names of the kernels ``product()`` launches (all of them finished)."""
    with record_launches(with_names=True) as launched:
        result = product()
        if launched:
            launched[-1][1].wait()
    return [name for name, _ in launched], result


def complex_items_operator(device, variant, dtype, m, n, **density):
    """(rng, A, op): a fresh random complex m x n matrix and its operator in ``variant``
    with the items block kernels (ell's and sell's under a CPU profile: GPUs give them
    the lanes kernels for complex values); skipped without fp64 for complex128."""
    fmt, params = variant
    if fmt in ("ell", "sell") and device.profile.is_gpu:
        device = device.override(device_type="cpu")
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    A = crandom_matrix(rng, m, n, **density)
    return rng, A, psc.SpMV(A, fmt, dtype=dtype, device=device, **params)


@pytest.mark.parametrize("dtype", CDTYPES, ids=["c64", "c128"])
@pytest.mark.parametrize("variant", ITEMS_VARIANTS, ids=_id)
def test_complex_block_kernels_against_scipy(device, variant, dtype):
    """Complex blocks: every k, host C- and F-ordered X, out= poisoned (F-ordered) with
    beta == 0, complex alpha/beta with out= given, device X and out (poisoned, and
    with beta), a real X (numpy's promotion)."""
    m, n = 203, 157
    rng, A, op = complex_items_operator(device, variant, dtype, m, n)
    assert op.has_block_kernels and op.is_complex
    alpha, beta = complex(rng.standard_normal(), rng.standard_normal()), 0.75 - 1.5j
    for k in CKS:
        X, Y0 = cblock(rng, n, k), cblock(rng, m, k).astype(dtype)
        Y = op @ X
        assert Y.dtype == np.complex128   # numpy's promotion with a complex128 X
        assert_cclose(Y, A @ X, A, X, dtype)
        out = poisoned((m, k), dtype, order="F")
        assert op.matmat(np.asfortranarray(X), out=out, alpha=alpha) is out
        assert_cclose(out, alpha * (A @ X), A, X, dtype)
        Y = op.matmat(X, out=Y0.copy(), alpha=alpha, beta=beta)
        assert_cclose(Y, alpha * (A @ X) + beta * Y0, A, X, dtype, Y0, beta)
        Xd = cla.to_device(op.queue, X.astype(dtype))
        Yd = cla.to_device(op.queue, poisoned((m, k), dtype))
        assert op.matmat(Xd, out=Yd, alpha=alpha) is Yd
        assert_cclose(Yd.get(), alpha * (A @ X), A, X, dtype)
        Yd = cla.to_device(op.queue, Y0)
        op.matmat(Xd, out=Yd, alpha=alpha, beta=beta)
        assert_cclose(Yd.get(), alpha * (A @ X) + beta * Y0, A, X, dtype, Y0, beta)
    Xr = rng.standard_normal((n, 3))
    assert_cclose(op @ Xr, A @ Xr, A, Xr, dtype)


@pytest.mark.parametrize("dtype", CDTYPES, ids=["c64", "c128"])
@pytest.mark.parametrize("variant", ITEMS_VARIANTS, ids=_id)
def test_complex_blocks_use_block_kernels(device, variant, dtype):
    """A complex block reads the matrix once per block: k = 17 runs exactly three
    launches of the format's block kernel (widths 8, 8, 1), host or device X, where the
    column loop would run 17 products (and 51 copies on the device); A^H @ U and
    A^T @ U run on the transposed copy's block kernels the same way."""
    fmt = variant[0]
    m, n = 61, 45
    rng, A, op = complex_items_operator(device, variant, dtype, m, n, density=0.15)
    assert op._impl.supported_block_widths() == (1, 2, 4, 8)
    assert op._impl.block_plan(17) == [(0, 8), (8, 8), (16, 1)]
    block = [BLOCK_KERNEL[fmt]] * 3
    X = cblock(rng, n, 17)
    names, Y = launched_kernels(lambda: op @ X)
    assert names == block
    assert_cclose(Y, A @ X, A, X, dtype)
    Xd = cla.to_device(op.queue, X.astype(dtype))
    names, Yd = launched_kernels(lambda: op @ Xd)
    assert names == block
    assert_cclose(Yd.get(), A @ X, A, X, dtype)
    U = cblock(rng, m, 17)
    Ud = cla.to_device(op.queue, U.astype(dtype))
    AH, AT = A.conj().T.tocsr(), A.T.tocsr()
    op.build_transposed()
    transposed_block = [BLOCK_KERNEL[op.transposed.format]] * 3
    for product, B in ((lambda: op.H @ Ud, AH), (lambda: op.T @ Ud, AT),
                       (lambda: op.rmatmat(U), AH)):
        names, Z = launched_kernels(product)
        assert names == transposed_block
        assert_cclose(Z.get() if isinstance(Z, cla.Array) else Z, B @ U, B, U, dtype)


@pytest.mark.parametrize("dtype", CDTYPES, ids=["c64", "c128"])
@pytest.mark.parametrize("fmt", sorted(BLOCK_FORMATS))
def test_complex_transposed_blocks(device, fmt, dtype):
    """op.H, op.T, rmatmat, X @ op and the linear operator on complex blocks (the
    transposed copy holds A^H; op.T conjugates around it): host and device, complex
    alpha/beta, out= poisoned and given."""
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    m, n = 70, 52
    A = crandom_matrix(rng, m, n, density=0.1)
    params = dict(next(p for f, p in ITEMS_VARIANTS if f == fmt))
    op = psc.SpMV(A, fmt, dtype=dtype, device=device, **params)
    AH, AT = A.conj().T.tocsr(), A.T.tocsr()
    alpha, beta = 2 - 1j, 0.5j
    for k in (3, 17):
        U, Z0 = cblock(rng, m, k), cblock(rng, n, k).astype(dtype)
        assert_cclose(op.H @ U, AH @ U, AH, U, dtype)
        assert_cclose(op.rmatmat(U), AH @ U, AH, U, dtype)
        assert_cclose(op.T @ U, AT @ U, AT, U, dtype)
        assert_cclose((U.T @ op).T, AT @ U, AT, U, dtype)   # U^T A = (A^T U)^T
        for view, B in ((op.H, AH), (op.T, AT)):
            out = poisoned((n, k), dtype)
            assert view.matmat(U, out=out, alpha=alpha) is out
            assert_cclose(out, alpha * (B @ U), B, U, dtype)
            Z = view.matmat(U, out=Z0.copy(), alpha=alpha, beta=beta)
            assert_cclose(Z, alpha * (B @ U) + beta * Z0, B, U, dtype, Z0, beta)
            Ud = cla.to_device(op.queue, U.astype(dtype))
            Zd = cla.to_device(op.queue, poisoned((n, k), dtype))
            view.matmat(Ud, out=Zd, alpha=alpha)
            assert_cclose(Zd.get(), alpha * (B @ U), B, U, dtype)
            Zd = cla.to_device(op.queue, Z0)
            view.matmat(Ud, out=Zd, alpha=alpha, beta=beta)
            assert_cclose(Zd.get(), alpha * (B @ U) + beta * Z0, B, U, dtype, Z0, beta)
        assert_cclose(op.aslinearoperator().rmatmat(U), AH @ U, AH, U, dtype)
    V = cblock(rng, n, 17)
    assert_cclose(op.T.H @ V, A.conj() @ V, A, V, dtype)   # conj(A): op.T.H


def test_complex_block_local_memory(device):
    """Local memory counts a complex value's two parts: csr-vector's row mapping keeps
    a row's partial sums per work-item, so with 2 KiB of local memory and groups of 32,
    complex128 blocks stop at width 4 (32*4*16 B) where float64 ones go to 8, and
    k = 9 takes 4, 4, 1."""
    dtype = np.complex128
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    A = crandom_matrix(rng, 50, 40, density=0.15)
    small = device.override(local_mem_size=2048)
    # The items kernels (the CPU default; a GPU's lanes kernels use no local memory).
    params = {"mapping": "rows", "vector_size": 4, "work_group_size": 32,
              "block_mapping": "items"}
    op = psc.SpMV(A, "csr-vector", dtype=dtype, device=small, **params)
    assert op._impl.block_local_bytes(4, 32) == 32 * 4 * 16 == 2048
    assert op._impl.supported_block_widths() == (1, 2, 4)
    real = psc.SpMV(A.real.tocsr(), "csr-vector", dtype=np.float64, device=small, **params)
    assert real._impl.supported_block_widths() == (1, 2, 4, 8)   # 8-byte values
    X = cblock(rng, 40, 9)
    names, Y = launched_kernels(lambda: op @ X)
    assert names == ["csr_vector_block"] * 3
    assert_cclose(Y, A @ X, A, X, dtype)
