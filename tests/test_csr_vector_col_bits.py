"""csr-vector's 16-bit columns (``col_bits``, adaptive mapping): the host and device
conversions against a direct computation, products against scipy (poisoned outputs,
alpha/beta, complex values, block products through the lanes kernel), the escape of
blocks too wide (``col_wide``) and "auto"'s fall-back to 32 bits when they hold most
entries, the read-back as CSR, value updates and transposed products, the defaults and
the parameter checks."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DTYPES, assert_cclose, poisoned, skip_without_fp64
from matrix_cases import CASES, check_against_scipy, check_all, read_back

import pyspmv_cl as psc
from pyspmv_cl.errors import InvalidParameterError
from pyspmv_cl.formats.csr_vector import (
    AUTO_MAX_WIDE_SHARE,
    MAX_BLOCK_SPAN,
    adaptive_capacity,
    adaptive_row_blocks,
)

GPU = dict(simd_width=32, device_type="gpu")
ADAPTIVE = {"mapping": "adaptive", "work_group_size": 16, "items_per_thread": 3}
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)


def banded(rng, n, half_width, density=0.3):
    """Columns within ``half_width`` of the diagonal, shuffled values, some rows
    empty: every row block spans little more than its rows."""
    A = sp.random(n, n, density=density, random_state=rng, format="csr")
    A = sp.triu(sp.tril(A, half_width), -half_width).tocsr()
    return (A + sp.eye(n, format="csr")).tocsr()


def wide(rng, n=70_000):
    """A row block spanning more than 16 bits: row 0 holds columns 0 and n - 1."""
    A = banded(rng, n, 3, density=0.0001).tolil()
    A[0, n - 1] = 2.5
    return A.tocsr()


def few_wide(rng, n=70_000):
    """Banded, but a few row blocks span more than 16 bits: far columns in the first
    and last rows, in two neighbouring rows, and in a long row (a block of its own),
    with empty rows around them."""
    A = banded(rng, n, 3, density=0.0001).tolil()
    A[0, n - 1] = 2.5
    A[n - 1, 0] = -1.5
    A[5000, 69_000] = 0.5
    A[5001, 100] = 0.25
    A[40_000, :] = 0.0
    A[40_000, ::97] = rng.standard_normal(len(range(0, n, 97)))
    for r in (39_998, 39_999, 40_001):
        A[r, :] = 0.0
    return A.tocsr()


def mostly_wide(rng, rows=3000, n=70_000):
    """Random columns over 70,000: every row block spans more than 16 bits."""
    return sp.random(rows, n, density=0.002, random_state=rng, format="csr")


def on_device(device, A, dtype):
    q = device.queue
    return (cla.to_device(q, A.data.astype(dtype)), cla.to_device(q, A.indices),
            cla.to_device(q, A.indptr))


def make(device, A, dtype, where, **params):
    if where == "host":
        return psc.SpMV(A, format="csr-vector", device=device, dtype=dtype, **params)
    return psc.SpMV(on_device(device, A, dtype), shape=A.shape, format="csr-vector",
                    device=device, dtype=dtype, **params)


def expected_columns(A, wg, items, dtype):
    """col_base, row_base, col_off and col_wide computed block by block from the row
    blocks: a block spanning more than MAX_BLOCK_SPAN columns appends its columns to
    col_wide, and its base (a row's) is -1 - where its first column went there."""
    blocks = adaptive_row_blocks(A.indptr, wg, adaptive_capacity(A.indptr, wg, items, dtype))
    col_base = np.zeros(blocks.size - 1, np.int64)
    row_base = np.zeros(A.shape[0], np.int64)
    offsets = np.zeros(A.nnz, np.int64)
    col_wide = []
    for b in range(blocks.size - 1):
        lo, hi = A.indptr[blocks[b]], A.indptr[blocks[b + 1]]
        cols = A.indices[lo:hi]
        if hi > lo and cols.max() - cols.min() > MAX_BLOCK_SPAN:
            at = len(col_wide)
            col_base[b] = -1 - at
            for r in range(blocks[b], blocks[b + 1]):
                row_base[r] = -1 - (at + A.indptr[r] - lo)
            col_wide.extend(cols)
            continue
        base = cols.min() if hi > lo else 0
        col_base[b] = base
        row_base[blocks[b]:blocks[b + 1]] = base
        offsets[lo:hi] = cols - base
    return col_base, row_base, offsets, np.array(col_wide, np.int64)


@pytest.mark.parametrize("where", ["host", "device"])
@with_dtypes
def test_arrays_and_products(device, dtype, where):
    """Host and device conversions write the bases and offsets a direct computation
    gives (no col_idx kept), and the products match scipy."""
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng(3)
    A = banded(rng, 3000, 40)
    op = make(device, A, dtype, where, col_bits=16, **ADAPTIVE)
    assert op.params["col_bits"] == 16
    arrays = read_back(op, types={"col_off": np.uint16})
    assert "col_idx" not in arrays and "col_wide" not in arrays
    col_base, row_base, offsets, _ = expected_columns(A, 16, 3, dtype)
    np.testing.assert_array_equal(arrays["col_base"][:col_base.size], col_base)
    np.testing.assert_array_equal(arrays["row_base"][:A.shape[0]], row_base)
    np.testing.assert_array_equal(arrays["col_off"][:A.nnz], offsets)
    check_all(op, A, dtype, rng)


@pytest.mark.parametrize("case", ["empty_rows", "one_long_row", "power_law", "all_rows_empty",
                                  "1x1", "duplicates_csr", "unsorted_indices"])
@pytest.mark.parametrize("where", ["host", "device"])
def test_edge_cases(device, case, where):
    """The shared edge cases (empty blocks, a block of one long row, duplicates,
    unsorted columns) with col_bits=16 on both conversion paths."""
    rng = np.random.default_rng(5)
    A = CASES[case](rng) if callable(CASES[case]) else CASES[case]
    A = sp.csr_matrix(A)
    op = make(device, A, np.float32, where, col_bits=16, **ADAPTIVE)
    check_all(op, A, np.float32, rng)


@pytest.mark.parametrize("where", ["host", "device"])
def test_complex_and_wide_index(device, where):
    """complex64 values and 64-bit indices read the same 16-bit offsets."""
    rng = np.random.default_rng(7)
    A = banded(rng, 2000, 25)
    Z = A.astype(np.complex64)
    Z.data += 1j * rng.standard_normal(Z.nnz).astype(np.float32)
    op = make(device, Z, np.complex64, where, col_bits=16, **ADAPTIVE)
    x = rng.standard_normal(2000) + 1j * rng.standard_normal(2000)
    y = op.matvec(x, out=poisoned(2000, np.complex64))
    assert_cclose(y, Z.astype(np.complex128) @ x, Z, x, np.complex64)
    op64 = make(device, A, np.float32, where, col_bits=16, index_bits=64, **ADAPTIVE)
    assert op64._impl.index_dtype == np.int64
    check_all(op64, A, np.float32, rng)


@pytest.mark.parametrize("k", [1, 3, 8, 32])
def test_block_products_lanes(device, k):
    """The lanes block kernel reads each row's base and the offsets (GPU-shaped
    profile: block_mapping="lanes")."""
    rng = np.random.default_rng(11)
    A = banded(rng, 1500, 30)
    dev = device.override(**GPU)
    op = make(dev, A, np.float32, "device", col_bits=16, block_mapping="lanes", **ADAPTIVE)
    X = rng.standard_normal((1500, k))
    Y = op.matmat(X, out=poisoned((1500, k), np.float32))
    for j in range(k):
        check_against_scipy(Y[:, j], A, X[:, j], np.float32)


@pytest.mark.parametrize("where", ["host", "device"])
@with_dtypes
def test_wide_blocks_escape(device, dtype, where):
    """A few blocks spanning more than 16 bits keep 32-bit columns in col_wide: "auto"
    takes 16 bits, the arrays match a direct computation, and single products, block
    products (the lanes kernel, on a GPU-shaped profile), the read-back as CSR,
    update_values and A^T are right."""
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng(13)
    A = few_wide(rng)
    col_base, row_base, offsets, col_wide = expected_columns(A, 16, 3, dtype)
    assert 0 < col_wide.size < AUTO_MAX_WIDE_SHARE * A.nnz and (col_base >= 0).any()
    op = make(device, A, dtype, where, col_bits="auto", **ADAPTIVE)
    assert op.params["col_bits"] == 16 and op._impl.col_escape
    arrays = read_back(op, types={"col_off": np.uint16})
    assert "col_idx" not in arrays
    np.testing.assert_array_equal(arrays["col_base"][:col_base.size], col_base)
    np.testing.assert_array_equal(arrays["row_base"][:A.shape[0]], row_base)
    np.testing.assert_array_equal(arrays["col_off"][:A.nnz], offsets)
    np.testing.assert_array_equal(arrays["col_wide"][:col_wide.size], col_wide)
    check_all(op, A, dtype, rng)
    (indptr, indices, data), _ = op._impl.read_csr(op.queue)
    np.testing.assert_array_equal(indices, A.indices)
    new = rng.standard_normal(A.nnz)
    op.update_values(new.astype(dtype))
    B = sp.csr_matrix((new, A.indices, A.indptr), shape=A.shape)
    check_all(op, B, dtype, rng)
    x = rng.standard_normal(A.shape[0])
    check_against_scipy(op.T.matvec(x, out=poisoned(A.shape[1], dtype)), B.T.tocsr(), x,
                        dtype)
    lanes = make(device.override(**GPU), A, dtype, where, col_bits=16,
                 block_mapping="lanes", **ADAPTIVE)
    assert lanes._impl.col_escape
    X = rng.standard_normal((A.shape[1], 5))
    Y = lanes.matmat(X, out=poisoned((A.shape[0], 5), dtype))
    for j in range(5):
        check_against_scipy(Y[:, j], A, X[:, j], dtype)


@pytest.mark.parametrize("where", ["host", "device"])
def test_mostly_wide_auto_takes_32(device, where):
    """Blocks spanning more than 16 bits hold most entries: "auto" takes 32-bit columns
    (no col_off); col_bits=16 escapes every such block and is right too."""
    rng = np.random.default_rng(31)
    A = mostly_wide(rng)
    op = make(device, A, np.float32, where, col_bits="auto", **ADAPTIVE)
    assert op.params["col_bits"] == 32 and not op._impl.col_escape
    assert "col_idx" in op._impl.buffers and "col_off" not in op._impl.buffers
    check_all(op, A, np.float32, rng)
    narrow = make(device, A, np.float32, where, col_bits=16, **ADAPTIVE)
    assert narrow.params["col_bits"] == 16 and narrow._impl.n_wide > A.nnz // 2
    check_all(narrow, A, np.float32, rng)
    (indptr, indices, data), _ = narrow._impl.read_csr(narrow.queue)
    np.testing.assert_array_equal(indices, A.indices)


def test_one_wide_block_escapes_not_refused(device):
    """A single wide block (row 0 spans the matrix) no longer refuses col_bits=16 or
    turns "auto" to 32 bits: it escapes, host and device alike."""
    rng = np.random.default_rng(37)
    A = wide(rng)
    for where in ("host", "device"):
        for bits in (16, "auto"):
            op = make(device, A, np.float32, where, col_bits=bits, **ADAPTIVE)
            assert op.params["col_bits"] == 16 and op._impl.col_escape
            assert 0 < op._impl.n_wide < 100
            check_all(op, A, np.float32, rng)


def test_span_limit_is_inclusive(device):
    """A block spanning exactly MAX_BLOCK_SPAN columns fits (offset 65535), one more
    does not (the only block: "auto" takes 32 bits)."""
    rng = np.random.default_rng(17)
    for span, fits in ((MAX_BLOCK_SPAN, True), (MAX_BLOCK_SPAN + 1, False)):
        A = sp.csr_matrix((np.array([1.0, 2.0, 3.0]), np.array([0, span, 1]),
                           np.array([0, 2, 3])), shape=(2, span + 1))
        for where in ("host", "device"):
            op = make(device, A, np.float64 if device.profile.fp64 else np.float32, where,
                      col_bits="auto", **ADAPTIVE)
            assert op.params["col_bits"] == (16 if fits else 32)
            check_all(op, A, op.dtype, rng)


@pytest.mark.parametrize("where", ["host", "device"])
def test_read_csr_update_values_transpose(device, where):
    """The read-back as CSR (online tuning's snapshot) puts the columns back together;
    update_values and A^T work on a 16-bit operator."""
    rng = np.random.default_rng(19)
    A = banded(rng, 2500, 60)
    op = make(device, A, np.float32, where, col_bits=16, **ADAPTIVE)
    (indptr, indices, data), events = op._impl.read_csr(op.queue)
    assert not events
    np.testing.assert_array_equal(indptr, A.indptr)
    np.testing.assert_array_equal(indices, A.indices)
    np.testing.assert_array_equal(data, A.data.astype(np.float32))
    new = rng.standard_normal(A.nnz)
    op.update_values(new.astype(np.float32))
    B = sp.csr_matrix((new, A.indices, A.indptr), shape=A.shape)
    check_all(op, B, np.float32, rng)
    x = rng.standard_normal(2500)
    check_against_scipy(op.T.matvec(x, out=poisoned(2500, np.float32)), B.T.tocsr(), x,
                        np.float32)


def test_defaults_and_checks(device):
    """GPUs take col_bits="auto" with the adaptive mapping (16 where it fits), CPUs
    and the other mappings 32; 16 or "auto" with another mapping is refused."""
    rng = np.random.default_rng(23)
    A = banded(rng, 4000, 20)
    gpu = psc.SpMV(A, format="csr-vector", device=device.override(**GPU), dtype=np.float32)
    assert gpu.params["mapping"] == "adaptive" and gpu.params["col_bits"] == 16
    cpu = psc.SpMV(A, format="csr-vector", device=device.override(device_type="cpu"),
                   dtype=np.float32, mapping="adaptive")
    assert cpu.params["col_bits"] == 32
    rows = psc.SpMV(A, format="csr-vector", device=device.override(**GPU), dtype=np.float32,
                    mapping="rows")
    assert rows.params["col_bits"] == 32
    for mapping in ("rows", "merge"):
        for bits in (16, "auto"):
            with pytest.raises(InvalidParameterError, match="needs mapping='adaptive'"):
                psc.SpMV(A, format="csr-vector", device=device, mapping=mapping,
                         col_bits=bits)
    with pytest.raises(InvalidParameterError):
        psc.SpMV(A, format="csr-vector", device=device, mapping="adaptive", col_bits=8)


def test_nbytes_counts_the_narrow_arrays(device):
    """op.nbytes: 2 bytes an entry for the columns, plus the bases."""
    rng = np.random.default_rng(29)
    A = banded(rng, 3000, 40)
    wide_op = make(device, A, np.float32, "host", col_bits=32, **ADAPTIVE)
    narrow = make(device, A, np.float32, "host", col_bits=16, **ADAPTIVE)
    n_blocks = narrow._impl.n_blocks
    assert narrow.nbytes == wide_op.nbytes - 2 * A.nnz + 4 * (n_blocks + A.shape[0])
