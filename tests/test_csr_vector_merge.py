"""csr-vector's merge mapping (Merrill & Garland's merge-based SpMV): against scipy in
float64 with fresh random data and poisoned outputs, on the structures it splits
differently from the other mappings (empty rows at and across work-item and group
boundaries, a row over many groups, fewer entries than a work-item's items, tiny
shapes), every value type, several group shapes and both carry reductions; the host's
group table, determinism, block products, value updates and the parameter refusals."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_cclose, poisoned, skip_without_fp64
from matrix_cases import CASES, check_against_scipy, check_all, csr_from_row_lengths

import pyspmv_cl as psc
from pyspmv_cl.formats.csr_vector import merge_groups
from pyspmv_cl.launching import record_launches

# (work_group_size, items_per_thread, reduction): single work-items, shapes that are not
# powers of two in items, the GPU default, CPU-like long work-items.
GEOMETRIES = [(1, 1, "tree"), (4, 3, "serial"), (8, 4, "tree"), (32, 5, "serial"),
              (128, 8, "tree"), (64, 32, "serial")]


def merge_op(A, device, dtype=np.float64, **params):
    return psc.SpMV(A, format="csr-vector", device=device, dtype=dtype, mapping="merge",
                    **params)


def structured(rng):
    """Empty rows leading, trailing and in runs longer than a work-item's and a group's
    items (for the geometries above), short random rows, a row over many groups."""
    lengths = rng.integers(0, 12, 900)
    lengths[:40] = 0
    lengths[-60:] = 0
    lengths[200:520] = 0          # 320 row ends: several groups of 4 x 3 ... 32 x 5
    lengths[600] = 3000           # many groups of every geometry but 64 x 32
    lengths[601:604] = 0
    return csr_from_row_lengths(rng, lengths, 3100)


def cases(rng):
    yield "structured", structured(rng)
    yield "hub_first_row", csr_from_row_lengths(rng, [2500] + [1] * 50, 2600)
    yield "few_entries", sp.csr_matrix(([1.5, -2.0], ([0, 2], [1, 0])), shape=(3, 2))
    yield "1x1", sp.csr_matrix(rng.standard_normal((1, 1)))
    yield "1xn", csr_from_row_lengths(rng, [700], 900)
    yield "mx1", sp.csr_matrix(rng.standard_normal((500, 1)))
    yield "no_entries", sp.csr_matrix((37, 11))
    for name in ("row_length_sweep", "power_law", "0x0", "m_x_0", "0_x_n"):
        yield name, CASES[name](rng)


@pytest.mark.parametrize("wg,items,reduction", GEOMETRIES,
                         ids=[f"wg{w}-t{t}-{r}" for w, t, r in GEOMETRIES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_against_scipy(wg, items, reduction, dtype, device, rng):
    """beta == 0 into NaN-poisoned outputs, alpha/beta (beta == 1 and alpha == 0
    too), host and device vectors."""
    skip_without_fp64(device, dtype)
    for name, A in cases(rng):
        op = merge_op(A, device, dtype, work_group_size=wg, items_per_thread=items,
                      reduction=reduction)
        params = op.params
        assert (params["mapping"], params["vector_size"]) == ("merge", None), name
        assert params["items_per_thread"] == items and params["reduction"] == reduction
        assert params["work_group_size"] <= wg
        check_all(op, A, dtype, rng)


def test_rows_across_groups_take_the_fixup(device, rng):
    """A row over many groups is completed by the fix-up kernel; a matrix whose groups
    all start at a row's first entry launches none."""
    A = structured(rng)
    op = merge_op(A, device, work_group_size=8, items_per_thread=4)
    assert op._impl.n_fix > 0
    x = rng.standard_normal(A.shape[1])
    with record_launches(with_names=True) as launches:
        y = op.matvec(x, out=poisoned(A.shape[0], np.float64))
    check_against_scipy(y, A, x, np.float64)
    names = [name for name, _ in launches]
    assert names == ["csr_vector_merge", "csr_vector_merge_fixup"], names
    # Rows of 7 entries (8 merge items each) in groups of 4 x 4: every group starts a row.
    B = csr_from_row_lengths(rng, [7] * 64, 20)
    op = merge_op(B, device, work_group_size=4, items_per_thread=4)
    assert op._impl.n_fix == 0
    with record_launches(with_names=True) as launches:
        check_all(op, B, np.float64, rng)
    assert {name for name, _ in launches} == {"csr_vector_merge"}


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128],
                         ids=["complex64", "complex128"])
def test_complex(dtype, device, rng):
    skip_without_fp64(device, dtype)
    for (wg, items, reduction) in [(4, 3, "serial"), (128, 8, "tree")]:
        for _name, A in cases(rng):
            A = sp.csr_matrix(A)
            A = sp.csr_matrix((A.data * (1 - 0.5j) + 1j * rng.standard_normal(A.nnz),
                               A.indices, A.indptr), shape=A.shape)
            op = merge_op(A, device, dtype, work_group_size=wg, items_per_thread=items,
                          reduction=reduction)
            m, n = A.shape
            x = rng.standard_normal(n) + 1j * rng.standard_normal(n)
            out = poisoned(m, dtype)
            op.matvec(x, out=out, alpha=0.5 - 2j)
            assert_cclose(out, (0.5 - 2j) * (A @ x), A, x, dtype)
            y0 = (rng.standard_normal(m) + 1j * rng.standard_normal(m)).astype(dtype)
            out = op.matvec(x, out=y0.copy(), alpha=1j, beta=-0.25 + 1j)
            assert_cclose(out, 1j * (A @ x) + (-0.25 + 1j) * y0, A, x, dtype, y0,
                          -0.25 + 1j)


def test_deterministic(device, rng):
    """Two products of the same x are bitwise equal (fixed summation order, no
    atomics), for both reductions, with rows over many groups."""
    A = structured(rng)
    x = rng.standard_normal(A.shape[1]).astype(np.float32)
    for reduction in ("tree", "serial"):
        op = merge_op(A, device, np.float32, work_group_size=32, items_per_thread=5,
                      reduction=reduction)
        first = op @ x
        for _ in range(3):
            np.testing.assert_array_equal(op @ x, first)


def test_64_bit_positions(device, rng, monkeypatch):
    """Merge positions in 64 bits (chosen where m + nnz passes 32-bit indices), forced
    on a small matrix, with 32- and 64-bit indices."""
    from pyspmv_cl.formats import csr_vector

    monkeypatch.setattr(csr_vector, "fits_int32", lambda *sizes: False)
    A = structured(rng)
    for bits in (32, 64):
        op = merge_op(A, device, work_group_size=8, items_per_thread=4, index_bits=bits)
        assert op._impl.pos_dtype == np.int64 and op.params["index_bits"] == bits
        check_all(op, A, np.float64, rng)


def test_merge_groups_literal():
    """Rows of 3, 0, 5, 1 entries merge as e e e | | e e e e e | e |: items 0..12, the
    row ends at 3, 4, 10 and 12.  Groups of 4 items start at items 0, 4, 8, 12: in rows
    0, 1 (row 1's end is item 4), 2 (entry 6, the row's fourth) and 3 (its end, after
    entry 8).  Groups 2 and 3 end rows begun in the group before: both need the fix-up;
    group 1 starts at row 1's first item (its end), so it needs none."""
    indptr = np.array([0, 3, 3, 8, 9])
    rows, fix = merge_groups(indptr, 4)
    np.testing.assert_array_equal(rows, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(fix, [2, 3])
    rows, fix = merge_groups(indptr, 100)
    np.testing.assert_array_equal(rows, [0, 4])
    assert fix.size == 0
    rows, fix = merge_groups(np.zeros(1, dtype=np.int32), 8)   # no rows: no groups
    assert rows.tolist() == [0] and fix.size == 0
    rows, fix = merge_groups(np.zeros(6, dtype=np.int32), 2)   # empty rows only
    np.testing.assert_array_equal(rows, [0, 2, 4, 5])
    assert fix.size == 0


def test_device_matrix_blocks_and_updates(device, rng):
    """A matrix given on the device (groups made from its indptr), 2-D products
    (column by column with block_mapping='items', the lanes kernels otherwise) and
    update_values (the CSR values copied straight in)."""
    A = structured(rng)
    m, n = A.shape
    q = device.queue
    triple = (cla.to_device(q, A.data), cla.to_device(q, A.indices),
              cla.to_device(q, A.indptr))
    op = psc.SpMV(triple, shape=A.shape, format="csr-vector", device=device,
                  mapping="merge", work_group_size=16, items_per_thread=6)
    assert op._impl.converting_on_device
    check_all(op, A, np.float64, rng)
    X = rng.standard_normal((n, 3))
    for block_mapping in ("items", "lanes"):
        op = merge_op(A, device, block_mapping=block_mapping, work_group_size=16,
                      items_per_thread=6)
        assert op.has_block_kernels == (block_mapping == "lanes")
        Y = op @ X
        for j in range(3):
            check_against_scipy(Y[:, j], A, X[:, j], np.float64)
    data = rng.standard_normal(A.nnz)
    op.update_values(data)
    B = sp.csr_matrix((data, A.indices, A.indptr), shape=A.shape)
    x = rng.standard_normal(n)
    xd = cla.to_device(op.queue, x)
    check_against_scipy((op @ xd).get(), B, x, np.float64)


@pytest.mark.parametrize("params, match", [
    ({"vector_size": 4}, "mapping='merge' takes no vector_size"),
    ({"items_per_thread": 0}, "items_per_thread"),
    ({"items_per_thread": 33}, "items_per_thread"),
    ({"items_per_thread": 2.5}, "items_per_thread"),
    ({"work_group_size": 96}, "mapping='merge' needs a power-of-two work_group_size"),
])
def test_refusals(params, match, device, rng):
    A = CASES["row_length_sweep"](rng)
    with pytest.raises(ValueError, match=match):
        merge_op(A, device, np.float32, **params)


def test_defaults(device, rng):
    """mapping='merge' alone: groups of 128 (at most the device's) and 8 items on GPUs,
    64 and 32 on CPUs, no vector size; the reduction follows the device type like the
    other mappings'."""
    A = CASES["row_length_sweep"](rng)
    for dev, wg, items, reduction in (
            (device.override(device_type="gpu", simd_width=32), 128, 8, "tree"),
            (device.override(device_type="cpu"), 64, 32, "serial")):
        op = merge_op(A, dev, np.float32)
        p = op.params
        assert (p["items_per_thread"], p["vector_size"], p["reduction"]) == (items, None,
                                                                             reduction)
        assert p["work_group_size"] == min(wg, dev.profile.max_work_group_size)
        check_all(op, A, np.float32, rng)
