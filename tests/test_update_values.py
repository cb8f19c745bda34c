"""``SpMV.update_values``: new values for the same pattern, in every format, without
re-conversion; products after an update use the new values (host and device vectors),
and bad input is refused clearly."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, make_operator, poisoned, reference, skip_without_fp64
from matrix_cases import CASES, banded_with_holes

import pyspmv_cl as psc

FORMATS = psc.formats()
# Edge cases where a format's storage differs most from CSR order (padding, sorting,
# tiles, duplicates kept apart, explicit zeros, empty rows and matrices).
SHAPES = ["empty_rows", "row_length_sweep", "power_law", "duplicates_csr", "explicit_zeros",
          "0x0"]


def with_values(A, data):
    B = A.copy()
    B.data = np.asarray(data, dtype=np.float64).copy()
    return B


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_update_values_matches_scipy(fmt, case, dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = sp.csr_matrix(CASES[case](rng) if callable(CASES[case]) else CASES[case])
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses {case}")
    for _ in range(2):   # the second update reuses the map
        data = rng.standard_normal(A.nnz)
        op.update_values(data)
        B = with_values(A, data)
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(B, x), B, x, dtype)
        out = poisoned(A.shape[0], dtype)
        op.matvec(x, out=out)
        assert_close(out, reference(B, x), B, x, dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_update_values_orders_with_device_products(fmt, device, rng):
    """Products enqueued before an update see the old values, after it the new ones."""
    dtype = np.float32
    A = sp.csr_matrix(CASES["power_law"](rng))
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    x = rng.standard_normal(A.shape[1])
    x_dev = cla.to_device(op.queue, x.astype(dtype))
    before = op.matvec(x_dev)
    data = rng.standard_normal(A.nnz)
    op.update_values(data)
    after = op.matvec(x_dev)
    assert_close(before.get(), reference(A, x), A, x, dtype)
    B = with_values(A, data)
    assert_close(after.get(), reference(B, x), B, x, dtype)


def test_update_values_for_a_coo_input_uses_csr_order(device, rng):
    """A COO matrix's values are taken in the order of ``A.tocsr().data``."""
    A = sp.random(200, 150, density=0.05, format="coo", random_state=7)
    op = psc.SpMV(A, format="csr-scalar", device=device)
    csr = A.tocsr()
    data = rng.standard_normal(csr.nnz)
    op.update_values(data)
    B = with_values(csr, data)
    x = rng.standard_normal(150)
    assert_close(op @ x, reference(B, x), B, x, np.float64)


def test_update_values_counts_its_map_in_nbytes(device, rng):
    A = sp.csr_matrix(CASES["power_law"](rng))
    op = psc.SpMV(A, format="sell", device=device)
    before = op.nbytes
    op.update_values(A.data * 2)
    if op._updater.codes is not None:   # converted on the device: a code per slot
        size = op._impl.value_array_sizes["values"]
        assert op.nbytes == before + size * 8   # float64 codes, padding included
        return
    slots = op._updater.device_layout["values"][0]   # padding excluded: one per entry
    assert slots == A.nnz
    assert op.nbytes == before + 2 * slots * 4   # slots and sources, 32-bit


@pytest.mark.parametrize("fmt, params", [
    # (coo's contiguous layout: its GPU default, interleaved, needs a map)
    ("csr-scalar", {}), ("csr-vector", {}), ("coo", {"layout": "contiguous"}),
    ("csr-vector", {"mapping": "merge", "work_group_size": 8, "items_per_thread": 3})],
    ids=["csr-scalar", "csr-vector", "coo", "csr-vector-merge"])
def test_update_values_in_csr_order_copies_without_a_map(fmt, params, device, rng):
    """Formats that keep the values in CSR order get them copied straight in: no map
    on the device (nbytes unchanged), no scatter kernel; products right after.  (Under
    a CPU profile: on a GPU coo converts on the device and finds its map there.)"""
    A = sp.csr_matrix(CASES["power_law"](rng))
    op = psc.SpMV(A, format=fmt, device=device.override(device_type="cpu"), **params)
    before = op.nbytes
    for _ in range(2):
        data = rng.standard_normal(A.nnz)
        op.update_values(data)
        assert op._updater.direct and not op._updater.device_layout
        assert op.nbytes == before
        B = with_values(A, data)
        x = rng.standard_normal(A.shape[1])
        out = poisoned(A.shape[0], np.float64)
        op.matvec(x, out=out)
        assert_close(out, reference(B, x), B, x, np.float64)


@pytest.mark.parametrize("bad, error, match", [
    (np.ones(3), psc.InvalidInputError, "needs 45 values"),
    (np.ones((45, 1)), psc.InvalidInputError, "needs 45 values"),
    (np.ones(45, dtype=complex), psc.UnsupportedDtypeError, "complex"),
    (np.array(["a"] * 45), psc.UnsupportedDtypeError, "numbers"),
    (sp.eye(45, format="csr"), psc.InvalidInputError, "not a sparse matrix"),
])
def test_update_values_refuses_bad_input(bad, error, match, device):
    A = sp.random(30, 30, density=0.05, format="csr", random_state=3)
    assert A.nnz == 45
    op = psc.SpMV(A, format="csr-scalar", device=device)
    with pytest.raises(error, match=match):
        op.update_values(bad)
    x = np.arange(30.0)
    assert_close(op @ x, reference(A, x), A, x, np.float64)   # unchanged


@pytest.mark.parametrize("fmt", FORMATS)
def test_update_values_uses_the_device_map(fmt, device, rng):
    """Every format places each value in one slot, so its updates are an upload and a
    scatter (no host conversion per update)."""
    A = sp.csr_matrix(CASES["row_length_sweep"](rng))
    op = make_operator(A, fmt, dtype=np.float32, device=device, max_padding=None) \
        if fmt in ("ell", "ellr-t") else make_operator(A, fmt, dtype=np.float32, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    op.update_values(A.data)
    assert op._updater.layout is not None


def test_update_values_without_a_map_reconverts_the_values(device, rng, monkeypatch):
    """The fallback for a format whose conversion would merge or drop entries (no map):
    its host conversion of the values, still right."""
    from pyspmv_cl.formats import values

    monkeypatch.setattr(values, "_layout", lambda fmt, structure: None)
    monkeypatch.setattr(values, "_device_codes", lambda fmt, structure: None)
    A = sp.csr_matrix(CASES["power_law"](rng))
    op = psc.SpMV(A, format="sell", dtype=np.float64, device=device)
    for _ in range(2):
        data = rng.standard_normal(A.nnz)
        op.update_values(data)
        assert op._updater.layout is None
        B = with_values(A, data)
        x = rng.standard_normal(A.shape[1])
        assert_close(op @ x, reference(B, x), B, x, np.float64)


@pytest.mark.parametrize("fmt, params", [
    ("csr5", {}), ("csr5", {"omega": 4, "sigma": 3}), ("coo", {"layout": "contiguous"}),
    ("coo", {"layout": "interleaved", "work_group_size": 8, "items_per_thread": 3}),
    ("ell", {"max_padding": float("inf")}), ("ellr-t", {"max_padding": float("inf")}),
    ("ellr-t", {"T": 4, "work_group_size": 64, "max_padding": float("inf")}),
    ("hyb", {}), ("hyb", {"ell_width": 2, "layout": "interleaved",
                          "coo_work_group_size": 8, "items_per_thread": 3})],
    ids=["csr5", "csr5-4x3", "coo-contiguous", "coo-interleaved", "ell", "ellr-t",
         "ellr-t-4", "hyb", "hyb-2-interleaved"])
@pytest.mark.parametrize("case", ["duplicates_csr", "unsorted_indices", "empty_rows",
                                  "explicit_zeros", "power_law"])
def test_values_read_without_a_slot_map(fmt, params, case, device, rng):
    """Formats that know their values' order read them back in CSR order directly
    (the transposed and block copies use it): the same values the slot map reads,
    before and after update_values, for a host and a device CSR."""
    from pyspmv_cl.adjoint import read_values
    from pyspmv_cl.formats.values import _layout
    A = sp.csr_matrix(CASES[case](rng) if callable(CASES[case]) else CASES[case])
    dtype = np.float64 if device.fp64 else np.float32
    triple = tuple(cla.to_device(device.queue, a) for a in
                   (A.data.astype(dtype), A.indices.astype(np.int32),
                    A.indptr.astype(np.int32)))
    for source, kwargs in ((A, {}), (triple, {"shape": A.shape})):
        op = psc.SpMV(source, format=fmt, dtype=dtype, device=device, **kwargs, **params)
        for step in range(2):
            impl = op._impl
            direct = impl.values_in_csr_order(op.queue, op._structure[1])
            assert direct is not None and direct.shape == (A.nnz,)
            mapped = read_values(impl, op._structure, _layout(impl, op._structure),
                                 op.queue)
            np.testing.assert_array_equal(direct, mapped)
            if step == 0:
                op.update_values(rng.standard_normal(A.nnz))


def test_formats_say_how_they_read_values(device, rng):
    """value_read (what the block copy's cost guess reads) says which formats answer
    values_in_csr_order ("gather", "reshape") and which need the slot map ("map")."""
    A = sp.csr_matrix(CASES["power_law"](rng))
    for fmt in psc.formats():
        op = make_operator(A, fmt, dtype=np.float32, device=device)
        if op is None:
            continue
        got = op._impl.values_in_csr_order(op.queue, op._structure[1])
        assert (got is not None) == (type(op._impl).value_read != "map"), fmt


@pytest.mark.parametrize("dtype", [np.float32, np.complex64], ids=["float32", "complex64"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_device_converted_operators_find_their_map_on_the_device(fmt, dtype, device, rng,
                                                                 monkeypatch):
    """An operator converted on the device (a GPU profile) finds where each value goes
    by its own device conversion of position codes, kept on the device: decoded, the
    same map as the host conversion of the pattern, which no longer runs; updates then
    match scipy (the fill keeps its zeros: poisoned x would show it)."""
    from pyspmv_cl.formats import get_format, values

    if np.dtype(dtype).kind == "c" and not get_format(fmt).complex_values:
        pytest.skip(f"{fmt} takes no complex values")
    gpu = device.override(device_type="gpu")
    A = banded_with_holes(rng)
    if np.dtype(dtype).kind == "c":
        A = sp.csr_matrix(A + 1j * sp.csr_matrix(
            (rng.standard_normal(A.nnz), A.indices, A.indptr), shape=A.shape))
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=gpu, **(
        {"max_padding": None} if fmt in ("ell", "ellr-t") else {}))
    impl = op._impl
    structure = (A.indices, A.indptr)
    codes = values._device_codes(impl, structure)
    if not impl.converting_on_device or (fmt == "bccoo" and np.dtype(dtype).kind == "c") \
            or type(impl).host_conversion_is_cast:
        # converted on the host: the host map; the CSR kernels' values stay in CSR order
        assert codes is None
    else:
        assert codes is not None, fmt
        found = codes.layout(op.queue)
        host = values._layout(impl, structure)
        assert found is not None and set(found) == set(host)
        for name in host:
            for got, want in zip(found[name], host[name]):
                np.testing.assert_array_equal(got, want, err_msg=f"{fmt} {name}")
        # The update takes the device codes (the host conversion must not run).
        monkeypatch.setattr(values, "host_arrays", lambda *a, **k: pytest.fail(
            "the host conversion ran"))
    new = rng.standard_normal(A.nnz) + (1j * rng.standard_normal(A.nnz)
                                        if np.dtype(dtype).kind == "c" else 0)
    op.update_values(new)
    assert (op._updater.codes is not None) == (codes is not None)
    assert op.nbytes_parts["value_map"] == op._updater.nbytes
    if codes is not None:   # one code per stored slot
        assert op._updater.nbytes == sum(size * np.dtype(dtype).itemsize
                                         for size in impl.value_array_sizes.values())
    B = A.copy()
    B.data = new
    x = rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], dtype)
    op.matvec(x.astype(dtype), out=out)
    ref = sp.csr_matrix(B, dtype=np.complex128 if np.dtype(dtype).kind == "c"
                        else np.float64) @ x
    tol = 1e-4 * (np.abs(B).astype(np.float64) @ np.abs(x) + 1e-30)
    assert np.all(np.abs(out - ref) <= tol), fmt
    # A^T's copy reads the updated values back through the map (decoded on the host).
    y = rng.standard_normal(A.shape[0])
    ref_t = sp.csr_matrix(B.T, dtype=ref.dtype) @ y
    tol_t = 1e-4 * (np.abs(B.T).astype(np.float64) @ np.abs(y) + 1e-30)
    assert np.all(np.abs(op.T @ y.astype(dtype) - ref_t) <= tol_t), fmt


def _operator_or_skip(A, fmt, dtype, device, **kwargs):
    op = make_operator(A, fmt, dtype=dtype, device=device, **kwargs, **(
        {"max_padding": None} if fmt in ("ell", "ellr-t") else {}))
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    return op


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64],
                         ids=["float32", "float64", "complex64"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_zeros_set_by_an_update_still_multiply_inf(fmt, dtype, profile, device, rng):
    """An entry that update_values sets to +0.0 is a stored entry: x's Inf there makes
    its row NaN, as scipy's product (and an operator built with that zero) has it.  dia
    and bccoo tell fill from stored entries by the sign of zero: the update must write
    the same -0.0 their conversions write, on every path (host map, device codes, the
    transposed copy, block products column by column and on the block copy)."""
    from pyspmv_cl.formats import get_format

    skip_without_fp64(device, dtype)
    if np.dtype(dtype).kind == "c" and not get_format(fmt).complex_values:
        pytest.skip(f"{fmt} takes no complex values")
    A = banded_with_holes(rng)   # no stored zero: dia without its bitmap
    if np.dtype(dtype).kind == "c":
        A = A + 1j * sp.csr_matrix((rng.standard_normal(A.nnz), A.indices, A.indptr),
                                   shape=A.shape)
    A = sp.csr_matrix(A)
    has_row, has_col = np.diff(A.indptr) > 0, np.bincount(A.indices, minlength=A.shape[1]) > 0
    c = int(rng.choice(np.flatnonzero(has_row & has_col)))
    dev = device.override(device_type=profile)
    op = _operator_or_skip(A, fmt, dtype, dev, block_copy=False)
    op_copies = _operator_or_skip(A, fmt, dtype, dev)
    op_copies.build_transposed()   # copies made before the update, kept in step by it
    op_copies.build_block_copy()
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    new = A.data * (2 + rng.random(A.nnz))
    new[(A.indices == c) | (rows == c)] = 0   # row c and column c: +0.0
    new[rng.random(A.nnz) < 0.2] = 0
    B = A.copy()
    B.data = new
    x = rng.standard_normal(A.shape[1])
    x[c] = np.inf
    X = np.column_stack([x, rng.standard_normal(A.shape[1])])
    X[c, 1] = np.nan
    for current in (op, op_copies):
        current.update_values(new)
        out = poisoned(A.shape[0], dtype)
        current.matvec(x, out=out)
        assert np.isnan(out[rows[A.indices == c]]).all(), f"{fmt}: zeros in column {c} skipped"
        _assert_matches(out, B, x, dtype)
        _assert_matches(current.T @ x, B.T, x, dtype)
        Y = current @ X
        for j in range(2):
            _assert_matches(Y[:, j], B, X[:, j], dtype)


def _assert_matches(y, B, x, dtype):
    if np.dtype(dtype).kind == "c":
        ref = sp.csr_matrix(B, dtype=np.complex128) @ x
        y = np.asarray(y, dtype=np.complex128)
        assert np.array_equal(np.isnan(y), np.isnan(ref)), "NaN pattern differs from scipy"
        finite = np.isfinite(ref)
        scale = abs(B).astype(np.float64) @ np.where(np.isfinite(x), np.abs(x), 0)
        assert np.all(np.abs(y[finite] - ref[finite]) <= 1e-4 * scale[finite] + 1e-30)
        return
    assert_close(y, reference(B, x), B, x, dtype)


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell", "dia"])
def test_update_values_takes_a_pyopencl_array(fmt, device, rng):
    """New values already on the device (a pyopencl array, any real type, a view at an
    offset included) are read to the host and applied as a numpy array would be; the
    transposed copy follows; a wrong length or a strided view is refused, naming what
    to pass, and changes nothing."""
    A = sp.csr_matrix(banded_with_holes(rng))
    dtype = np.float64 if device.fp64 else np.float32
    op = _operator_or_skip(A, fmt, dtype, device)
    op.build_transposed()
    x = rng.standard_normal(A.shape[1])
    for new_dtype, offset in ((dtype, 0), (np.float32, 3)):
        new = rng.standard_normal(A.nnz).astype(new_dtype)
        buffer = cla.to_device(op.queue, np.concatenate([np.zeros(offset, new_dtype), new]))
        op.update_values(buffer[offset:])
        B = with_values(A, new)
        out = poisoned(A.shape[0], dtype)
        op.matvec(x, out=out)
        assert_close(out, reference(B, x), B, x, dtype)
        assert_close(op.T @ x, reference(B.T, x), B.T, x, dtype)
    for bad, match in ((cla.to_device(op.queue, np.ones(A.nnz - 1)), f"needs {A.nnz} values"),
                       (cla.to_device(op.queue, np.ones(2 * A.nnz))[::2], "contiguous"),
                       (cla.to_device(op.queue, np.ones(A.nnz, np.complex64)), "complex")):
        with pytest.raises(psc.PySpMVError, match=match):
            op.update_values(bad)
    out = poisoned(A.shape[0], dtype)
    op.matvec(x, out=out)
    assert_close(out, reference(B, x), B, x, dtype)   # unchanged


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell", "bccoo"])
def test_update_values_refuses_values_past_float32(fmt, device, rng):
    """A float32 operator refuses new float64 values that float32 would hold as inf,
    naming the largest, and keeps its values; Inf and NaN given are taken as they are."""
    A = sp.csr_matrix(banded_with_holes(rng))
    op = _operator_or_skip(A, fmt, np.float32, device)
    new = rng.standard_normal(A.nnz)
    new[rng.integers(A.nnz)] = -1e39
    with pytest.raises(psc.InvalidInputError, match=r"overflow float32.*1e\+39.*float64"):
        op.update_values(new)
    x = rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], np.float32)
    op.matvec(x, out=out)
    assert_close(out, reference(A, x), A, x, np.float32)   # unchanged
    new[new == -1e39] = -np.inf
    new[0] = np.nan
    op.update_values(new)
    B = with_values(A, new)
    assert_close(op @ x, reference(B, x), B, x, np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_refuses_bad_values_and_keeps_its_own(fmt, device, rng):
    """The checks of update_values (shared by every format, so each is built once):
    a wrong length or shape, complex or non-numeric values, a sparse matrix, values
    past float32, as numpy and as pyopencl arrays (and a strided view), are refused
    with the error naming what to pass, before and after a first update; the values
    held stay (poisoned products against scipy), and a good update still works."""
    A = sp.csr_matrix(banded_with_holes(rng))
    nnz = A.nnz
    op = _operator_or_skip(A, fmt, np.float32, device)
    q = op.queue
    bad = [
        (np.ones(nnz - 1), psc.InvalidInputError, f"needs {nnz} values"),
        (np.ones(nnz + 1, np.float32), psc.InvalidInputError, f"needs {nnz} values"),
        (np.ones((nnz, 1)), psc.InvalidInputError, f"needs {nnz} values"),
        (np.float64(1.0), psc.InvalidInputError, f"needs {nnz} values"),
        (np.ones(nnz, np.complex128), psc.UnsupportedDtypeError, "complex"),
        (np.array(["1"] * nnz), psc.UnsupportedDtypeError, "numbers"),
        (np.full(nnz, None), psc.UnsupportedDtypeError, "numbers"),
        (A, psc.InvalidInputError, "not a sparse matrix"),
        (np.full(nnz, 1e39), psc.InvalidInputError, "overflow float32"),
        (cla.to_device(q, np.ones(nnz - 1, np.float32)), psc.InvalidInputError,
         f"needs {nnz} values"),
        (cla.to_device(q, np.ones((nnz, 2), np.float32)), psc.InvalidInputError,
         f"needs {nnz} values"),
        (cla.to_device(q, np.ones(nnz, np.complex64)), psc.UnsupportedDtypeError, "complex"),
        (cla.to_device(q, np.ones(2 * nnz))[::2], psc.InvalidInputError, "contiguous"),
        (cla.to_device(q, np.full(nnz, -1e39)), psc.InvalidInputError, "overflow float32"),
    ]
    x = rng.standard_normal(A.shape[1])
    held = A
    for step in range(2):
        for data, error, match in bad:
            with pytest.raises(error, match=match):
                op.update_values(data)
        out = poisoned(A.shape[0], np.float32)
        op.matvec(x, out=out)
        assert_close(out, reference(held, x), held, x, np.float32)   # unchanged
        if step == 0:
            held = with_values(A, rng.standard_normal(nnz))
            op.update_values(held.data)
