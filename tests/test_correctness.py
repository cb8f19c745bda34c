"""Correctness of every format against scipy (float64) on every OpenCL device: the
edge-case corpus (tests/matrix_cases.py), alpha/beta, vector shapes, every scipy input
type, device-resident vectors, index widths, csr-vector geometries, GPU-shaped profile
overrides and a conjugate-gradient solve through ``aslinearoperator``."""

import re

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from conftest import DTYPES, assert_close, make_operator, poisoned, skip_without_fp64
from matrix_cases import (
    CASES,
    check_against_scipy,
    csr_from_row_lengths,
    few_wide_blocks,
    magnitudes,
)

import pyspmv_cl as psc
from pyspmv_cl.errors import InvalidParameterError
from pyspmv_cl.formats import get_format

FORMATS = psc.formats()  # read at collection time: new formats are covered automatically

with_formats = pytest.mark.parametrize("fmt", FORMATS)
with_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)


def check_host(op, A, x, dtype, rng, alpha=1.0, beta=0.0):
    """op.matvec with a host out: NaN-poisoned when beta == 0 (must not be read), a
    random finite y0 otherwise; the result is stored into out and compared."""
    m = A.shape[0]
    out_shape = (m,) + x.shape[1:]
    if beta == 0:
        y0 = None
        out = poisoned(out_shape, dtype)
    else:
        y0 = rng.standard_normal(out_shape).astype(dtype)
        out = y0.copy()
    y = op.matvec(x, out=out, alpha=alpha, beta=beta)
    assert y is out
    assert y.shape == out_shape and y.dtype == np.dtype(dtype)
    check_against_scipy(y, A, x, dtype, alpha, beta, y0)
    return y


def check_device(op, A, x, dtype, rng, alpha=1.0, beta=0.0):
    """The same with x and out as pyopencl arrays on the operator's queue."""
    m = A.shape[0]
    out_shape = (m,) + x.shape[1:]
    y0 = None if beta == 0 else rng.standard_normal(out_shape).astype(dtype)
    x_d = cla.to_device(op.queue, np.ascontiguousarray(x, dtype=dtype))
    out_d = cla.to_device(op.queue, poisoned(out_shape, dtype) if y0 is None else y0)
    y_d = op.matvec(x_d, out=out_d, alpha=alpha, beta=beta)
    assert y_d is out_d
    assert isinstance(y_d, cla.Array)
    np.testing.assert_array_equal(x_d.get(), np.asarray(x, dtype=dtype))  # x untouched
    check_against_scipy(y_d.get(), A, x, dtype, alpha, beta, y0)
    return y_d


# ------------------------------------------------------------------------ edge cases


def _arrays(A):
    if sp.issparse(A) and A.format == "coo":
        return [A.data, A.row, A.col]
    return [A.data, A.indices, A.indptr]


@pytest.mark.parametrize("case", list(CASES))
@with_dtypes
@with_formats
def test_edge_case(case, fmt, dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = CASES[case](rng)
    m, n = A.shape
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        return
    assert op.shape == (m, n)
    assert op.dtype == np.dtype(dtype)
    assert op.format == fmt
    assert op.nbytes >= 0

    before = [a.copy() for a in _arrays(A)]
    # Host vectors, out poisoned with NaN.
    check_host(op, A, rng.standard_normal(n), dtype, rng)
    # op @ x allocates the result; fresh values, same operator.
    x = rng.standard_normal(n)
    y = op @ x
    # numpy's promotion: a float64 x gives float64 (computed in dtype, then cast).
    assert isinstance(y, np.ndarray) and y.shape == (m,) \
        and y.dtype == np.result_type(dtype, x.dtype)
    check_against_scipy(y, A, x, dtype)
    # The beta != 0 kernel variant, reading a finite out.
    check_host(op, A, rng.standard_normal(n), dtype, rng, alpha=-1.5, beta=0.75)
    # Device-resident x and out.
    check_device(op, A, rng.standard_normal(n), dtype, rng)
    # The caller's matrix is left as it was (no in-place sorting or summing).
    for a, b in zip(_arrays(A), before):
        np.testing.assert_array_equal(a, b)
    # New values in the same pattern through the one-shot helper.
    A2 = A.copy()
    A2.data = rng.standard_normal(A2.data.size)
    x = rng.standard_normal(n)
    y = psc.spmv(A2, x, format=fmt, dtype=dtype, device=device, out=poisoned(m, dtype))
    check_against_scipy(y, A2, x, dtype)


X_SPECIALS_CASES = ["empty_rows", "explicit_zeros", "one_long_row", "row_length_sweep",
                    "nan_inf_in_matrix", "duplicates_csr_large", "dense_1_x_3000", "1x1"]


@pytest.mark.parametrize("case", X_SPECIALS_CASES)
@with_dtypes
@with_formats
def test_nan_inf_in_x(case, fmt, dtype, device, rng):
    """NaN/Inf in x (and in A) propagate exactly as in scipy: same NaN pattern, same
    infinities (0 * inf is NaN through explicit zeros; +inf + -inf is NaN)."""
    skip_without_fp64(device, dtype)
    A = CASES[case](rng)
    n = A.shape[1]
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        return
    x = rng.standard_normal(n)
    specials = rng.permutation(n)
    k = max(1, n // 20)
    x[specials[:k]] = np.nan if n > 1 else np.inf
    x[specials[k:2 * k]] = np.inf
    x[specials[2 * k:3 * k]] = -np.inf
    check_host(op, A, x, dtype, rng)
    check_host(op, A, x, dtype, rng, alpha=2.0, beta=-1.0)
    check_device(op, A, x, dtype, rng)
    # Only one infinite entry: rows through it are +-inf unless an explicit zero or a
    # NaN in A makes them NaN.
    x = rng.standard_normal(n)
    x[specials[0]] = -np.inf
    check_host(op, A, x, dtype, rng)


# ------------------------------------------------------------------------ alpha / beta

ALPHA_BETA = [(2.5, 0.0), (1.0, -0.5), (2.5, -0.5), (-1.0, 1.0), (0.0, 0.0), (0.0, 2.0),
              (1.0, 1.0)]
ALPHA_BETA_CASES = ["empty_rows", "one_long_row", "row_length_sweep", "all_rows_empty",
                    "m_x_0", "0_x_n", "1x1"]


@pytest.mark.parametrize("alpha,beta", ALPHA_BETA, ids=[f"a{a}-b{b}" for a, b in ALPHA_BETA])
@with_dtypes
@with_formats
def test_alpha_beta(alpha, beta, fmt, dtype, device, rng):
    """y = alpha*A@x + beta*out; with beta == 0 a NaN-poisoned out is never read."""
    skip_without_fp64(device, dtype)
    for case in ALPHA_BETA_CASES:
        A = CASES[case](rng)
        op = make_operator(A, fmt, dtype=dtype, device=device)
        if op is None:
            continue
        n = A.shape[1]
        check_host(op, A, rng.standard_normal(n), dtype, rng, alpha, beta)
        check_device(op, A, rng.standard_normal(n), dtype, rng, alpha, beta)
        # numpy scalar types are accepted as alpha/beta too.
        check_host(op, A, rng.standard_normal(n), dtype, rng, np.float32(alpha),
                   np.float64(beta))


@with_formats
def test_beta_without_out_is_refused(fmt, device, rng):
    A = CASES["empty_rows"](rng)
    op = make_operator(A, fmt, dtype=np.float32, device=device)
    if op is None:
        return
    with pytest.raises(ValueError):
        op.matvec(rng.standard_normal(A.shape[1]), beta=0.5)


# ------------------------------------------------------------------------ vector shapes


@with_dtypes
@with_formats
def test_column_vector_and_multiple_columns(fmt, dtype, device, rng):
    skip_without_fp64(device, dtype)
    for case in ("empty_rows", "one_long_row", "tall_3000x7", "wide_7x3000", "m_x_0"):
        A = CASES[case](rng)
        m, n = A.shape
        op = make_operator(A, fmt, dtype=dtype, device=device)
        if op is None:
            continue
        # x of shape (n, 1) -> (m, 1), with and without out, host and device.
        x = rng.standard_normal((n, 1))
        y = op @ x
        assert y.shape == (m, 1)
        check_against_scipy(y[:, 0], A, x[:, 0], dtype)
        check_host(op, A, x, dtype, rng)
        check_host(op, A, x, dtype, rng, alpha=0.5, beta=-2.0)
        y_d = op.matvec(cla.to_device(op.queue, x.astype(dtype)))
        assert isinstance(y_d, cla.Array) and y_d.shape == (m, 1)
        check_against_scipy(y_d.get()[:, 0], A, x[:, 0], dtype)
        # 2-D x (n, 3): column by column, C and Fortran order, out given or not.
        X = rng.standard_normal((n, 3))
        Y = op @ X
        assert Y.shape == (m, 3) and Y.dtype == np.result_type(dtype, X.dtype)
        for j in range(3):
            check_against_scipy(Y[:, j], A, X[:, j], dtype)
        out = poisoned((m, 3), dtype)
        Y = op.matvec(np.asfortranarray(X), out=out, alpha=2.5)
        assert Y is out
        for j in range(3):
            check_against_scipy(Y[:, j], A, X[:, j], dtype, 2.5)
        Y0 = rng.standard_normal((m, 3)).astype(dtype)
        out = Y0.copy()
        op.matvec(X, out=out, alpha=-1.0, beta=0.5)
        for j in range(3):
            check_against_scipy(out[:, j], A, X[:, j], dtype, -1.0, 0.5, Y0[:, j])


@with_dtypes
@with_formats
def test_strided_and_converted_host_vectors(fmt, dtype, device, rng):
    """Non-contiguous x/out views and x/out of other numeric dtypes are accepted."""
    skip_without_fp64(device, dtype)
    A = CASES["row_length_sweep"](rng)
    m, n = A.shape
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        return
    big_x = rng.standard_normal(3 * n)
    x = big_x[::3]
    big_out = poisoned(2 * m, dtype)
    y = op.matvec(x, out=big_out[1::2])
    check_against_scipy(y, A, x, dtype)
    assert np.isnan(big_out[0::2]).all()  # the entries between stay untouched
    y0 = rng.standard_normal(m).astype(dtype)
    big_out[1::2] = y0
    op.matvec(x, out=big_out[1::2], alpha=0.5, beta=-1.5)
    check_against_scipy(big_out[1::2], A, x, dtype, 0.5, -1.5, y0)
    # Integer x; an out of the other float type.
    x_int = rng.integers(-5, 6, n)
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    out = poisoned(m, other)
    y = op.matvec(x_int, out=out)
    assert y is out
    check_against_scipy(y, A, x_int, np.float32)  # stored in float32 either way
    x32 = rng.standard_normal(n).astype(np.float32)
    check_against_scipy(op @ x32, A, x32, dtype)


# ------------------------------------------------------------------------ input types


def _base_matrix(rng):
    lengths = rng.integers(0, 9, 60)
    lengths[:3] = 0
    lengths[40:45] = 0
    return csr_from_row_lengths(rng, lengths, 40)


SPARSE_TYPES = {
    "csr_matrix": sp.csr_matrix, "csc_matrix": sp.csc_matrix, "coo_matrix": sp.coo_matrix,
    "bsr_matrix": lambda A: sp.bsr_matrix(A, blocksize=(2, 2)),
    "lil_matrix": sp.lil_matrix, "dok_matrix": sp.dok_matrix, "dia_matrix": sp.dia_matrix,
    "csr_array": sp.csr_array, "csc_array": sp.csc_array, "coo_array": sp.coo_array,
    "bsr_array": lambda A: sp.bsr_array(A, blocksize=(3, 4)),
    "lil_array": sp.lil_array, "dok_array": sp.dok_array, "dia_array": sp.dia_array,
    "csr_int64_values": lambda A: sp.csr_matrix(np.round(10 * A.toarray()).astype(np.int64)),
    "csr_float32_values": lambda A: A.astype(np.float32),
    "csr_bool_values": lambda A: A.astype(bool),
    # scipy's constructor takes float16 arrays (not dtype=float16): hyb's split refused
    "csr_float16_values": lambda A: sp.csr_matrix(
        (A.data.astype(np.float16), A.indices, A.indptr), shape=A.shape),
}
TRIPLES = {"triple": (np.int32, None), "triple_int64": (np.int64, None),
           "triple_uint64": (np.uint64, None), "triple_float16": (np.int32, np.float16)}


@pytest.mark.parametrize("kind", list(SPARSE_TYPES) + list(TRIPLES))
@with_dtypes
@with_formats
def test_input_types(kind, fmt, dtype, device, rng):
    """Every scipy.sparse matrix and array class, and the (data, indices, indptr) triple
    with shape=, multiply like the CSR matrix they hold."""
    skip_without_fp64(device, dtype)
    base = _base_matrix(rng)
    if kind in TRIPLES:   # (uint64 indices and float16 values raised scipy's errors)
        itype, vtype = TRIPLES[kind]
        data = base.data.astype(vtype) if vtype else base.data.copy()
        A_in = (data, base.indices.astype(itype), base.indptr.astype(itype))
        op = make_operator(A_in, fmt, dtype=dtype, device=device, shape=base.shape)
        if op is None:
            return
        A = sp.csr_matrix((data.astype(np.float64), base.indices, base.indptr),
                          shape=base.shape)
    else:
        A_in = SPARSE_TYPES[kind](base)
        assert sp.issparse(A_in)
        op = make_operator(A_in, fmt, dtype=dtype, device=device)
        if op is None:
            return
        A = sp.csr_matrix(A_in, dtype=np.float64)
    assert op.shape == base.shape and op.dtype == np.dtype(dtype)
    check_host(op, A, rng.standard_normal(base.shape[1]), dtype, rng)
    check_device(op, A, rng.standard_normal(base.shape[1]), dtype, rng)


# ------------------------------------------------------------------------ device arrays


@with_dtypes
@with_formats
def test_device_arrays(fmt, dtype, device, rng):
    """pyopencl x/out stay on the device; a host x may go with a device out."""
    skip_without_fp64(device, dtype)
    for case in ("empty_rows", "one_long_row", "row_length_sweep", "0x0", "m_x_0", "0_x_n"):
        A = CASES[case](rng)
        m, n = A.shape
        op = make_operator(A, fmt, dtype=dtype, device=device)
        if op is None:
            continue
        # out=None: a new device array comes back.
        x = rng.standard_normal(n)
        y_d = op.matvec(cla.to_device(op.queue, x.astype(dtype)))
        assert isinstance(y_d, cla.Array)
        assert y_d.shape == (m,) and y_d.dtype == np.dtype(dtype)
        assert y_d.context == op.device.context
        check_against_scipy(y_d.get(), A, x, dtype)
        # op @ device x returns a device array too.
        x = rng.standard_normal(n)
        y_d = op @ cla.to_device(op.queue, x.astype(dtype))
        assert isinstance(y_d, cla.Array)
        check_against_scipy(y_d.get(), A, x, dtype)
        # Given out, alpha/beta on the device; then chained products without host trips.
        check_device(op, A, rng.standard_normal(n), dtype, rng, alpha=2.5)
        check_device(op, A, rng.standard_normal(n), dtype, rng, alpha=0.5, beta=-0.5)
        # Mixed: host x, device out (poisoned).
        x = rng.standard_normal(n)
        out_d = cla.to_device(op.queue, poisoned(m, dtype))
        y_d = op.matvec(x, out=out_d)
        assert y_d is out_d
        check_against_scipy(out_d.get(), A, x, dtype)
        y0 = rng.standard_normal(m).astype(dtype)
        out_d = cla.to_device(op.queue, y0)
        op.matvec(x, out=out_d, alpha=3.0, beta=-1.0)
        check_against_scipy(out_d.get(), A, x, dtype, 3.0, -1.0, y0)


@with_dtypes
@with_formats
def test_device_chained_products(fmt, dtype, device, rng):
    """y = A @ (A @ x) entirely on the device (events order the two launches)."""
    skip_without_fp64(device, dtype)
    A = CASES["diagonal_1031"](rng) + CASES["diagonal_1031"](rng)[::-1]
    A = sp.csr_matrix(A)
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        return
    x = rng.standard_normal(A.shape[1])
    x_d = cla.to_device(op.queue, x.astype(dtype))
    z_d = op.matvec(op.matvec(x_d))
    z = z_d.get()
    y_ref = A @ (A @ x)
    assert_close(z, y_ref, magnitudes(A) @ magnitudes(A), x, dtype)


# ------------------------------------------------------------------------ index width


@with_dtypes
@with_formats
def test_index_bits_64_matches_32(fmt, dtype, device, rng):
    skip_without_fp64(device, dtype)
    for case in ("empty_rows", "one_long_row", "power_law", "duplicates_coo", "0x0"):
        A = CASES[case](rng)
        csr = sp.csr_matrix(A)
        x = rng.standard_normal(A.shape[1])
        results = {}
        for bits in (32, 64):
            op = make_operator(A, fmt, dtype=dtype, device=device, index_bits=bits)
            if op is None:  # a refusal does not depend on the index width
                break
            assert op.params["index_bits"] == bits
            results[bits] = check_host(op, A, x, dtype, rng)
            check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng, beta=0.5)
            results[bits, "nbytes"] = op.nbytes
            blocks = op._impl.buffers.get("row_blocks")   # csr-vector's adaptive mapping
            results[bits, "blocks"] = blocks.size if blocks is not None else 0   # bytes
            results[bits, "col_bits"] = op.params.get("col_bits", 32)
        if op is None:
            continue
        assert np.array_equal(np.isnan(results[32]), np.isnan(results[64]))
        if fmt in ("csr-scalar", "csr-vector"):
            # row_ptr, col_idx (and row blocks) double in width; values do not change.
            blocks = results[64, "blocks"] - results[32, "blocks"]
            # (an empty array is a one-byte stand-in buffer in both widths)
            assert blocks == results[32, "blocks"] or results[32, "blocks"] == 1
            assert results[32, "col_bits"] == results[64, "col_bits"]
            # 16-bit columns (csr-vector's adaptive mapping on GPUs): the offsets keep
            # their width; a base per row and one per row block double instead.
            columns = csr.nnz if results[32, "col_bits"] == 32 else \
                csr.shape[0] + max(0, results[32, "blocks"] // 4 - 1)
            assert results[64, "nbytes"] - results[32, "nbytes"] == 4 * (
                csr.shape[0] + 1 + columns) + blocks


# ------------------------------------------------------------------------ csr-vector geometry

# (vector_size, work_group_size, reduction): every vector size with 128-wide groups and
# the tree reduction (the GPU defaults) and with 64-wide groups and the serial reduction
# (the CPU defaults); one row per group (wg == vector_size), groups of 3 rows (wg not a
# power of two), and wide groups.
VECTOR_GEOMETRIES = ([(vs, 128, "tree") for vs in (2, 4, 8, 16, 32, 64)]
                     + [(vs, 64, "serial") for vs in (2, 4, 8, 16, 32, 64)]
                     + [(2, 2, "tree"), (8, 24, "serial"), (32, 1024, "tree")])


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
@pytest.mark.parametrize("vector_size,wg,reduction", VECTOR_GEOMETRIES,
                         ids=[f"vs{v}-wg{w}-{r}" for v, w, r in VECTOR_GEOMETRIES])
@with_dtypes
def test_csr_vector_geometries(vector_size, wg, reduction, dtype, device, rng):
    skip_without_fp64(device, dtype)
    for case in ("row_length_sweep", "one_long_row", "empty_rows", "1x1", "dense_3000_x_1",
                 "0x0"):
        A = CASES[case](rng)
        op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=device,
                      vector_size=vector_size, work_group_size=wg, reduction=reduction)
        params = op.params
        assert params["vector_size"] == vector_size
        assert params["reduction"] == reduction
        # The builder may shrink the group to what the compiled kernel allows.
        assert params["work_group_size"] <= wg
        assert params["work_group_size"] % vector_size == 0
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng, alpha=2.0, beta=-1.0)
        check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng)


# (work_group_size, items_per_thread, reduction) of the adaptive mapping: one-item groups
# (every block a single row), windows of 2..4096 entries, both reductions.
ADAPTIVE_GEOMETRIES = [(1, 1, "tree"), (2, 1, "serial"), (4, 2, "tree"), (8, 3, "serial"),
                       (32, 4, "tree"), (128, 8, "tree"), (256, 4, "serial"),
                       (256, 16, "tree")]


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
@pytest.mark.parametrize("wg,items,reduction", ADAPTIVE_GEOMETRIES,
                         ids=[f"wg{w}-t{t}-{r}" for w, t, r in ADAPTIVE_GEOMETRIES])
@with_dtypes
def test_csr_vector_adaptive(wg, items, reduction, dtype, device, rng):
    """Rows shorter and longer than a window, single-row blocks, empty rows, a dense
    row, random lengths: against scipy, host and device vectors, alpha and beta."""
    skip_without_fp64(device, dtype)
    for case in ("row_length_sweep", "one_long_row", "empty_rows", "power_law", "1x1",
                 "dense_3000_x_1", "0x0", "m_x_0", "0_x_n"):
        A = CASES[case](rng)
        op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=device, mapping="adaptive",
                      work_group_size=wg, items_per_thread=items, reduction=reduction)
        params = op.params
        assert params["mapping"] == "adaptive" and params["vector_size"] is None
        assert params["items_per_thread"] == items and params["reduction"] == reduction
        assert params["work_group_size"] <= wg
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng, alpha=2.0, beta=-1.0)
        check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng)


STREAMED = [("csr-vector", {"mapping": "adaptive"}, (np.float32, np.float64)),
            ("csr5", {}, (np.float32, np.float64)), ("bccoo", {}, (np.float32, np.float64)),
            ("ell", {}, (np.float32, np.float64)), ("hyb", {}, (np.float32, np.float64)),
            ("sell", {"mapping": "rows"}, (np.float32,))]


def _streamed(op):
    """The streamed_loads value of the operator's first program (hyb's ELL part)."""
    return op._impl.programs()[0].params["streamed_loads"]


def _streamed_source(op, device, helper):
    """The operator's first program rendered with streamed_loads on, checked to include
    the evict_first helper once, with STREAMV and STREAMI naming the functions of its
    value and index types."""
    from pyspmv_cl import codegen

    impl, program = op._impl, op._impl.programs()[0]
    source = codegen.render(program.template, dtype=impl.dtype,
                            index_dtype=impl.index_dtype, profile=device.profile,
                            kernels=program.kernels, work_group_size=64,
                            **{**program.params, "streamed_loads": True})
    assert source.count(helper) == 1
    value = "f64" if impl.dtype == np.float64 else "f32"
    index = "s64" if impl.index_dtype == np.int64 else "s32"
    assert f"#define STREAMV(p) evict_first_{value}(p)" in source
    assert f"#define STREAMI(p) evict_first_{index}(p)" in source
    return source


@pytest.mark.parametrize("fmt,params,dtypes", STREAMED, ids=[f for f, _, _ in STREAMED])
def test_streamed_loads_only_on_nvidia_from_volta(fmt, params, dtypes, device, rng):
    """The evict-first loads (PTX asm, common.mako's streamed_loads) are rendered for a
    real NVIDIA GPU of compute capability 7.0+ and real values at full width only: not
    for another device whose profile pretends to be NVIDIA, nor for complex or half
    values, nor where they were measured slower (sell in float64, csr-vector's row
    mapping, csr-scalar).  The products are right either way (the sweeps cover each
    kernel on every device, NVIDIA's included)."""
    from pyspmv_cl.device import nvidia_compute_capability

    if fmt not in FORMATS:
        pytest.skip(f"no {fmt} format")
    capability = nvidia_compute_capability(device.cl_device)
    nvidia = device.evict_first_loads
    assert not nvidia or capability >= (7, 0)
    A = CASES["power_law"](rng) if fmt not in ("ell", "sell") else CASES["row_length_sweep"](rng)
    pretend = device.override(vendor_family="nvidia", device_type="gpu")
    for dev in (device, pretend):
        for dtype in (np.float32, np.float64):
            if not dev.profile.fp64 and dtype == np.float64:
                continue
            op = psc.SpMV(A, format=fmt, dtype=dtype, device=dev, **params)
            assert _streamed(op) is (nvidia and dtype in dtypes)
            check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
            check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
    cls = get_format(fmt)
    if cls.complex_values:
        op = psc.SpMV(A, format=fmt, dtype=np.complex64, device=device, **params)
        assert _streamed(op) is False
    if "value_bits" in {p.name for p in cls.params}:
        op = psc.SpMV(A, format=fmt, dtype=np.float32, device=device, value_bits=16, **params)
        assert _streamed(op) is False
    if fmt == "csr-vector":
        op = psc.SpMV(A, format=fmt, device=device, mapping="rows", vector_size=4)
        assert _streamed(op) is False
        op = psc.SpMV(A, format="csr-scalar", device=device)
        assert "streamed_loads" not in op._impl.programs()[0].params
    if device.profile.vendor_family != "nvidia":
        assert capability is None


@pytest.mark.parametrize("fmt,params,dtypes", STREAMED, ids=[f for f, _, _ in STREAMED])
def test_streamed_loads_render_the_one_helper(fmt, params, dtypes, device, rng):
    """With streamed_loads on (rendered only: the PTX builds on NVIDIA alone), every
    format's source reads through kernels/evict_first.cl, included once, STREAMV and
    STREAMI naming the function of the value and index types (sell's 16-bit columns:
    its u16 read); the same text is the probe Device.evict_first_loads builds."""
    from pyspmv_cl import codegen
    from pyspmv_cl.device import _EVICT_FIRST_PROBE

    if fmt not in FORMATS:
        pytest.skip(f"no {fmt} format")
    helper = codegen.helper("evict_first.cl")
    A = CASES["power_law"](rng) if fmt not in ("ell", "sell") else CASES["row_length_sweep"](rng)
    extra = {"col_bits": 16} if fmt == "sell" else {}
    for dtype in dtypes:
        if not device.profile.fp64 and dtype == np.float64:
            continue
        for index_bits in (32, 64):
            op = psc.SpMV(A, format=fmt, dtype=dtype, device=device, index_bits=index_bits,
                          **params, **extra)
            source = _streamed_source(op, device, helper)
            if fmt == "sell":
                assert "evict_first_u16(col_off + (k))" in source
    for name in ("f32", "f64", "s32", "s64", "u16"):
        assert f"evict_first_{name}(" in _EVICT_FIRST_PROBE
        assert f"evict_first.{name} " in helper


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
@pytest.mark.parametrize("escape", [False, True], ids=["col16", "col16-escape"])
def test_streamed_loads_render_the_column_offsets(escape, device, rng):
    """csr-vector's 16-bit columns with streamed_loads on (rendered only, as
    test_streamed_loads_render_the_one_helper does): a column is the row block's base
    plus its offset read through evict_first_u16, no col_idx; with the escape (a few
    row blocks wider than 16 bits: few_wide_blocks) the kernel takes col_wide, an
    index_t array that the wide loop reads through STREAMI, the index type's function;
    the helper is included once either way."""
    from pyspmv_cl import codegen

    helper = codegen.helper("evict_first.cl")
    A = few_wide_blocks(rng) if escape else CASES["power_law"](rng)
    # (col_wide's type follows index_bits: both with the escape)
    for dtype, index_bits in ((np.float32, 32), (np.float64, 64))[:2 if escape else 1]:
        if not device.profile.fp64 and dtype == np.float64:
            continue
        op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=device, mapping="adaptive",
                      col_bits=16, index_bits=index_bits)
        impl = op._impl
        assert op.params["col_bits"] == 16 and impl.col_escape is escape
        source = _streamed_source(op, device, helper)
        assert "#define COLUMN(j) (block_base + (index_t)evict_first_u16(col_off + (j)))" \
            in source
        assert "#define WIDE(j) STREAMI(col_wide + (j) + wide_at)" in source
        assert "col_idx" not in source
        # The wide loop's array, an index_t one (STREAMI reads index_t): with the escape
        # alone.
        wide_arg = re.search(r"__global\s+const\s+index_t\s*\*\s*(restrict\s+)?col_wide\b",
                             source)
        assert bool(wide_arg) is escape, source[:3000]
        if escape:
            assert impl.buffers["col_wide"].size == impl.n_wide * impl.index_dtype.itemsize


def test_the_evict_first_ptx_is_written_once():
    """kernels/evict_first.cl holds the PTX loads; no template or module repeats them."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    holders = sorted(str(path.relative_to(root)) for folder in ("templates", "kernels",
                                                                "pyspmv_cl")
                     for path in (root / folder).rglob("*")
                     if path.is_file() and path.suffix in (".mako", ".cl", ".py")
                     and "ld.global" in path.read_text(encoding="utf-8"))
    assert holders == ["kernels/evict_first.cl"]


# (work_group_size, items_per_thread, reduction) of the merge mapping (its own sweep:
# tests/test_csr_vector_merge.py): every case of the corpus with small groups, whose
# rows cross work-items and groups, and with the default shape.
MERGE_GEOMETRIES = [(4, 3, "serial"), (128, 8, "tree")]


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
@pytest.mark.parametrize("wg,items,reduction", MERGE_GEOMETRIES,
                         ids=[f"wg{w}-t{t}-{r}" for w, t, r in MERGE_GEOMETRIES])
@with_dtypes
def test_csr_vector_merge_edge_cases(wg, items, reduction, dtype, device, rng):
    """The merge mapping on the whole edge-case corpus (NaN/Inf, duplicates, unsorted
    columns, empty shapes...), host and device vectors, alpha and beta."""
    skip_without_fp64(device, dtype)
    for case in CASES:
        A = CASES[case](rng)
        op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=device, mapping="merge",
                      work_group_size=wg, items_per_thread=items, reduction=reduction)
        assert op.params["mapping"] == "merge" and op.params["vector_size"] is None
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng, alpha=2.0, beta=-1.0)
        check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng)


def test_adaptive_row_blocks_literal():
    """Rows of lengths 3, 1, 0, 9, 2, 2, 1, 5, blocks of at most 4 entries and 3 rows,
    filled greedily: rows 0-2 (4 entries, 3 rows), row 3 alone (9 > 4), rows 4-5 (row 6
    would make 5 entries), row 6 (row 7 would make 6), row 7 alone."""
    from pyspmv_cl.formats.csr_vector import adaptive_row_blocks

    indptr = np.concatenate([[0], np.cumsum([3, 1, 0, 9, 2, 2, 1, 5])])
    np.testing.assert_array_equal(adaptive_row_blocks(indptr, 3, 4), [0, 3, 4, 6, 7, 8])
    np.testing.assert_array_equal(adaptive_row_blocks(np.zeros(1), 3, 4), [0])
    # Empty rows: only the row count cuts.
    np.testing.assert_array_equal(adaptive_row_blocks(np.zeros(8), 3, 4), [0, 3, 6, 7])


def greedy_row_blocks(indptr, per_block, capacity):
    """The greedy row blocks written out row by row (the reference)."""
    m, starts, first = len(indptr) - 1, [0], 0
    while first < m:
        last = first + 1
        while (last < m and last - first < per_block
               and indptr[last + 1] - indptr[first] <= capacity):
            last += 1
        starts.append(last)
        first = last
    return starts


def test_adaptive_row_blocks_greedy():
    """On fresh random row lengths (empty rows, long rows, both index types, several
    row counts and capacities): greedy_walk over all the rows in one piece gives the
    blocks of the walk written out row by row; adaptive_row_blocks (groups taken as
    they are, the rest walked in pieces) gives valid blocks (consecutive rows, at most
    per_block of them and capacity entries, a longer row alone), at most two more a
    piece or run of groups than that walk."""
    from pyspmv_cl.formats.csr_vector import adaptive_row_blocks, greedy_walk

    rng = np.random.default_rng()
    for _ in range(300):
        m = int(rng.integers(1, 400))
        lengths = rng.integers(0, 12, m) * (rng.random(m) < rng.uniform(0.1, 1))
        if rng.random() < 0.3:
            lengths[rng.integers(m, size=3)] = 200
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(
            rng.choice([np.int32, np.int64]))
        per_block, capacity = int(rng.choice([1, 2, 3, 16, 128])), int(rng.choice([4, 8, 24, 1024]))
        want = greedy_row_blocks(indptr, per_block, capacity)
        walked = greedy_walk(indptr, per_block, capacity, np.array([0]), np.array([m]))
        np.testing.assert_array_equal(np.append(walked, m), want)
        steps = int(rng.choice([1, 2, 5, 1 << 30]))
        got = adaptive_row_blocks(indptr, per_block, capacity, steps=steps)
        rows, entries = np.diff(got), np.diff(indptr[got])
        assert got[0] == 0 and got[-1] == m and np.all(rows > 0)
        assert np.all(rows <= per_block)
        assert np.all((entries <= capacity) | (rows == 1))
        pieces = max(1, max(int(indptr[-1]) // capacity, m // per_block) // steps)
        assert got.size - len(want) <= 2 * (pieces + m // per_block + 1)
        groups = np.arange(0, m, per_block)
        fit = indptr[np.minimum(groups + per_block, m)] - indptr[groups] <= capacity
        if fit.all() or (not fit.any() and steps == 1 << 30):   # one walk, or none
            np.testing.assert_array_equal(got, want)


def test_adaptive_capacity():
    """One window of entries for 4-byte values; two for 8-byte ones unless
    work_group_size rows of the mean length fill less than two windows."""
    from pyspmv_cl.formats.csr_vector import adaptive_capacity

    short = np.arange(0, 601, 6)     # 100 rows of 6 entries: 128 * 6 < 2 * 512
    long = np.arange(0, 1001, 10)    # 100 rows of 10: 128 * 10 >= 2 * 512
    assert adaptive_capacity(long, 128, 8, np.float32) == 1024
    assert adaptive_capacity(long, 128, 4, np.float64) == 1024
    assert adaptive_capacity(long, 128, 4, np.complex128) == 1024
    assert adaptive_capacity(short, 128, 4, np.float64) == 512
    assert adaptive_capacity(np.zeros(1), 128, 4, np.float64) == 512



def test_default_block_rows():
    """Half the group where that many rows of the mean length hold the capacity (and
    at least one row), else the whole group; no rows: the group."""
    from pyspmv_cl.formats.csr_vector import default_block_rows

    def rows_of(mean, m=1000):
        return np.arange(0, mean * m + 1, mean)

    assert default_block_rows(rows_of(35), 128, 1024) == 64     # 64 x 35 >= 1024
    assert default_block_rows(rows_of(16), 128, 1024) == 64     # 64 x 16 == 1024
    assert default_block_rows(rows_of(15), 128, 1024) == 128    # 64 x 15 < 1024
    assert default_block_rows(rows_of(15), 128, 512) == 64
    assert default_block_rows(np.zeros(1, dtype=np.int64), 128, 1024) == 128
    assert default_block_rows(rows_of(3), 1, 2) == 1


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
@pytest.mark.parametrize("block_rows", [1, 3, 16, "auto"])
@with_dtypes
def test_csr_vector_block_rows(block_rows, dtype, device, rng):
    """The adaptive mapping with row blocks of at most block_rows rows (short rows
    then get several work-items each) against scipy, host and device vectors, alpha
    and beta, poisoned outputs; "auto" resolves to a number of rows."""
    skip_without_fp64(device, dtype)
    for case in ("row_length_sweep", "one_long_row", "empty_rows", "1x1", "all_equal_rows_64"):
        A = CASES[case](rng)
        op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=device, mapping="adaptive",
                      work_group_size=16, items_per_thread=4, block_rows=block_rows)
        got = op.params["block_rows"]
        assert got == block_rows if block_rows != "auto" else got in (8, 16)
        assert op._impl.n_blocks >= -(-A.shape[0] // got)   # at most `got` rows each
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng, alpha=2.0, beta=-1.0)
        check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng)


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
@pytest.mark.parametrize("unroll", [None, 1, 3, 4])
@with_dtypes
def test_csr_vector_row_unroll(unroll, dtype, device, rng, monkeypatch):
    """The adaptive kernel's row sums with 1-4 products a loop turn (None: the rule,
    2 for 4-byte values) against scipy: rows shorter and longer than a turn, rows
    crossing windows, one long row, empty rows."""
    from pyspmv_cl.formats.csr_vector import CSRVector, row_unroll

    assert row_unroll(np.float32) == 2 and row_unroll(np.float64) == 1
    assert row_unroll(np.complex64) == 1
    skip_without_fp64(device, dtype)
    monkeypatch.setattr(CSRVector, "ROW_UNROLL", unroll)
    for case in ("row_length_sweep", "one_long_row", "empty_rows", "all_equal_rows_64"):
        A = CASES[case](rng)
        for tpr_rows in (16, 2):   # one work-item a row; several
            op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=device,
                          mapping="adaptive", work_group_size=16, items_per_thread=4,
                          block_rows=tpr_rows)
            check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
            check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng, alpha=-0.5,
                         beta=2.0)


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
@pytest.mark.parametrize("given, message", [
    (dict(mapping="adaptive", work_group_size=16, block_rows=32), "exceeds work_group_size"),
    (dict(mapping="rows", block_rows=8), "needs mapping='adaptive'"),
    (dict(mapping="merge", block_rows=8), "needs mapping='adaptive'"),
    (dict(mapping="adaptive", block_rows=0), "block_rows"),
    (dict(mapping="adaptive", block_rows="half"), "block_rows"),
])
def test_csr_vector_block_rows_refused(given, message, device):
    A = CASES["row_length_sweep"](np.random.default_rng(1))
    with pytest.raises(InvalidParameterError, match=message):
        psc.SpMV(A, format="csr-vector", device=device, **given)

@pytest.mark.parametrize("work_group_size", [1, 96, 128])
@with_dtypes
def test_csr_scalar_work_group_sizes(work_group_size, dtype, device, rng):
    if "csr-scalar" not in FORMATS:
        pytest.skip("no csr-scalar format")
    skip_without_fp64(device, dtype)
    for case in ("row_length_sweep", "one_long_row", "empty_rows", "1x1"):
        A = CASES[case](rng)
        op = psc.SpMV(A, format="csr-scalar", dtype=dtype, device=device,
                      work_group_size=work_group_size)
        assert op.params["work_group_size"] <= work_group_size
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng, alpha=2.0, beta=-1.0)


# ------------------------------------------------------------------------ profile overrides

OVERRIDES = {"simd32": dict(simd_width=32),
             "gpu64": dict(simd_width=64, device_type="gpu"),
             "gpu32": dict(simd_width=32, device_type="gpu")}
OVERRIDE_CASES = ["row_length_sweep", "one_long_row", "empty_rows", "all_equal_rows_64",
                  "all_equal_rows_1", "1x1", "0x0", "m_x_0"]


@pytest.mark.parametrize("override", list(OVERRIDES))
@with_dtypes
@with_formats
def test_profile_override(override, fmt, dtype, device, rng):
    """GPU-shaped defaults (from an overridden profile) run correctly on the real device
    and the chosen parameters respect the pretended hardware."""
    skip_without_fp64(device, dtype)
    dev = device.override(**OVERRIDES[override])
    profile = dev.profile
    assert profile.simd_width == OVERRIDES[override]["simd_width"]
    assert dev.context == device.context
    for case in OVERRIDE_CASES:
        A = CASES[case](rng)
        op = make_operator(A, fmt, dtype=dtype, device=dev)
        if op is None:
            continue
        assert op.device.profile.simd_width == profile.simd_width
        params = op.params
        wg = params.get("work_group_size")
        if wg is not None:
            assert 1 <= wg <= profile.max_work_group_size
        if fmt == "csr-vector" and params["mapping"] == "adaptive":
            assert params["vector_size"] is None and profile.is_gpu
        elif fmt == "csr-vector":
            vs = params["vector_size"]
            assert 2 <= vs <= max(2, min(64, profile.simd_width, profile.lanes(dtype)))
            assert wg % vs == 0
            if profile.is_gpu and case == "all_equal_rows_64":
                # Rows of 64 on a GPU profile fill a whole warp/wavefront.
                assert vs == min(64, profile.simd_width)
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng)
        check_host(op, A, rng.standard_normal(A.shape[1]), dtype, rng, alpha=-2.0, beta=0.5)
        check_device(op, A, rng.standard_normal(A.shape[1]), dtype, rng)


# ------------------------------------------------------------------------ LinearOperator


def poisson_2d(k):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    eye = sp.identity(k)
    return sp.csr_matrix(sp.kron(eye, T) + sp.kron(T, eye))


@with_formats
def test_linear_operator_cg(fmt, device, rng):
    skip_without_fp64(device, np.float64)
    A = poisson_2d(24)
    n = A.shape[0]
    op = make_operator(A, fmt, dtype=np.float64, device=device)
    if op is None:
        return
    L = op.aslinearoperator()
    assert isinstance(L, spla.LinearOperator)
    assert L.shape == A.shape and L.dtype == np.float64
    x = rng.standard_normal(n)
    check_against_scipy(L @ x, A, x, np.float64)
    X = rng.standard_normal((n, 2))
    Y = L.matmat(X)
    for j in range(2):
        check_against_scipy(Y[:, j], A, X[:, j], np.float64)

    b = rng.standard_normal(n)
    exact = spla.spsolve(sp.csc_matrix(A), b)
    solution, info = spla.cg(L, b, rtol=1e-10, atol=0.0, maxiter=5 * n)
    assert info == 0
    scipy_solution, scipy_info = spla.cg(A, b, rtol=1e-10, atol=0.0, maxiter=5 * n)
    assert scipy_info == 0
    assert np.linalg.norm(solution - exact) <= 1e-7 * np.linalg.norm(exact)
    assert np.linalg.norm(solution - scipy_solution) <= 1e-7 * np.linalg.norm(exact)


@pytest.mark.skipif("csr-vector" not in FORMATS, reason="no csr-vector format")
def test_csr_vector_default_mapping(device, rng):
    """GPUs default to the adaptive mapping unless the longest row exceeds its windows;
    CPUs, a vector_size or mapping="rows" get the row mapping; each is right."""
    gpu = device.override(device_type="gpu", simd_width=32)
    cpu = device.override(device_type="cpu")
    regular = CASES["row_length_sweep"](rng)
    hub = sp.csr_matrix((np.ones(10_000), (np.zeros(10_000, int), np.arange(10_000))),
                        shape=(50, 20_000)) + sp.random(50, 20_000, density=1e-3,
                                                        random_state=1, format="csr")
    cases = [(gpu, regular, {}, "adaptive"), (cpu, regular, {}, "rows"),
             (gpu, regular, {"vector_size": 4}, "rows"),
             (gpu, regular, {"mapping": "rows"}, "rows"), (gpu, hub, {}, "rows")]
    for dev, A, given, mapping in cases:
        op = psc.SpMV(A, format="csr-vector", device=dev, **given)
        assert op.params["mapping"] == mapping, (dev.profile.device_type, given)
        assert (op.params["vector_size"] is None) == (mapping == "adaptive")
        check_host(op, A, rng.standard_normal(A.shape[1]), np.float64 if dev.profile.fp64
                   else np.float32, rng)
