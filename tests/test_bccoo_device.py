"""``bccoo`` converted on the device (templates/bccoo_convert.mako) from a CSR there,
for 1 x 1 blocks in one slice: every array is identical to the host conversion's
(``formats/values.host_arrays``: the format's own analyse + convert on the host, same
parameters) over tile and group edges (empty rows first, last and in runs, a row over
many tiles, fewer blocks than a tile, exact multiples of a group), every flag width,
transposed or not, with and without column deltas, narrow and wide matrices, 32- and
64-bit indices; the matrix is never read back; products match scipy (float64
reference, poisoned output).  Rows out of order, complex values and other block shapes
are converted on the host; a host matrix goes up as CSR on a GPU profile only when its
rows are in order."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import poisoned, skip_without_fp64
from device_conversion import (
    assert_same_as_host,
    check_product,
    host_input_on_a_gpu,
    on_device,
    refuse_read_back,
)
from matrix_cases import csr_from_row_lengths

import pyspmv_cl as psc
from pyspmv_cl.formats import get_format, values

pytestmark = pytest.mark.skipif("bccoo" not in psc.formats(), reason="no bccoo format")


def matrices(rng, group_blocks):
    """Row-length patterns around tiles and groups of ``group_blocks`` blocks."""
    n = 2 * group_blocks + 7

    def rows(lengths, cols=n):
        return csr_from_row_lengths(rng, np.minimum(np.asarray(lengths, np.int64), cols), cols)

    short = list(rng.integers(0, 5, 40))
    edges = rows([0, 0, 3] + short + [0] * 7 + [group_blocks + 3, 0, 1] + short + [0, 0])
    return {
        "edges": edges,
        "no_empty_rows": rows(rng.integers(1, 6, 60)),
        "alternating": rows([1, 0] * (group_blocks + 2)),
        "long_row": rows([2, 3 * group_blocks + 1, 1, 0], cols=3 * group_blocks + 5),
        "exact": rows(np.full(group_blocks, 2)),     # two groups exactly
        "small": rows([0, 2, 0, 1], cols=5),          # fewer blocks than a tile
        "last_empty": rows([3, 1, 4, 0]),
        "wide": csr_from_row_lengths(rng, rng.integers(0, 4, 50), 70_000),   # int columns
    }


# (tile_size, work_group_size, flag_bits, transpose, col_compress)
LAYOUTS = [(1, 1, 8, False, False), (3, 4, 8, True, False), (8, 4, 8, True, True),
           (16, 8, 16, True, False), (17, 4, 16, False, True), (33, 2, 32, True, True),
           (40, 4, 8, False, False), (16, 64, 16, True, False)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda c: "-".join(map(str, c)))
def test_device_conversion_gives_the_host_arrays(layout, device, rng, monkeypatch):
    T, wg, bits, transpose, compress = layout
    refuse_read_back(monkeypatch)
    for name, A in matrices(rng, T * wg).items():
        op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="bccoo",
                      dtype=np.float32, device=device, tile_size=T, work_group_size=wg,
                      flag_bits=bits, transpose=transpose, col_compress=compress)
        assert op.params["work_group_size"] == wg, name
        host = assert_same_as_host(op, A)
        if name == "wide" and not compress:
            assert host["cols"].dtype == np.int32
        check_product(op, A, rng)


def test_stored_zeros_and_groups_with_every_stop(device, rng, monkeypatch):
    """Stored zeros are kept as -0.0 (multiplied: 0 * Inf is NaN, as scipy's), and a
    group whose threads all stop a row is marked so (rows of one block)."""
    refuse_read_back(monkeypatch)
    A = csr_from_row_lengths(rng, np.ones(64, np.int64), 40)
    A.data[::3] = 0.0
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="bccoo",
                  dtype=np.float32, device=device, tile_size=2, work_group_size=4)
    host = assert_same_as_host(op, A)
    assert host["group_full"].all()
    x = rng.standard_normal(A.shape[1])
    x[A.indices[0]] = np.inf
    out = poisoned(A.shape[0], np.float32)
    op.matvec(x, out=out)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(A @ x))


@pytest.mark.parametrize("index_bits", [32, 64])
def test_double_values_and_index_types(index_bits, device, rng, monkeypatch):
    skip_without_fp64(device, np.float64)
    refuse_read_back(monkeypatch)
    A = matrices(rng, 32)["edges"]
    triple = on_device(device.queue, A, np.int64 if index_bits == 32 else np.int32)
    op = psc.SpMV(triple, shape=A.shape, format="bccoo", dtype=np.float64, device=device,
                  tile_size=8, work_group_size=4, index_bits=index_bits)
    assert op._impl.index_dtype == np.dtype(f"int{index_bits}")
    assert_same_as_host(op, A)
    check_product(op, A, rng)


def test_device_arrays_at_an_offset(device, rng, monkeypatch):
    """The caller's arrays may be views into larger buffers."""
    refuse_read_back(monkeypatch)
    A = matrices(rng, 16)["edges"]
    pad = 5
    whole = [cla.to_device(device.queue, np.concatenate([np.zeros(pad, a.dtype), a]))
             for a in (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))]
    op = psc.SpMV(tuple(w[pad:] for w in whole), shape=A.shape, format="bccoo",
                  dtype=np.float32, device=device, tile_size=4, work_group_size=4)
    assert_same_as_host(op, A)
    check_product(op, A, rng)


@pytest.mark.parametrize("case", ["unsorted", "duplicates"])
def test_rows_out_of_order_convert_on_the_host(case, device, rng):
    """Unsorted columns or duplicates on the device: the check finds them, the matrix is
    read back and converted on the host (duplicates stay apart, as scipy adds them)."""
    A = matrices(rng, 16)["edges"]
    if case == "unsorted":
        A = csr_from_row_lengths(rng, np.diff(A.indptr), A.shape[1], shuffle=True)
        assert not A.has_sorted_indices
    else:
        A = sp.csr_matrix(A, copy=True)
        row = int(np.argmax(np.diff(A.indptr) >= 2))
        A.indices[A.indptr[row] + 1] = A.indices[A.indptr[row]]
        A.has_canonical_format = False
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="bccoo",
                  dtype=np.float32, device=device, tile_size=4, work_group_size=4)
    host = values.host_arrays(op._impl, sp.csr_matrix(A, copy=True), np.float32)
    for name, expected in host.items():
        got = np.empty_like(expected)
        cl.enqueue_copy(op.queue, got, op._impl.buffers[name])
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8), name)
    check_product(op, A, rng)


@pytest.mark.parametrize("params", [{"block_height": 2}, {"slices": 2}, {"dtype": "c8"}],
                         ids=["2x1", "sliced", "complex"])
def test_other_shapes_and_complex_read_back(params, device, rng):
    params = dict(params)
    dtype = np.dtype(params.pop("dtype", np.float32))
    A = matrices(rng, 16)["edges"]
    if dtype.kind == "c":
        A = A + 1j * A
    A = sp.csr_matrix(A)
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="bccoo",
                  dtype=dtype, device=device, tile_size=4, work_group_size=4, **params)
    assert not op._impl.converting_on_device
    x = rng.standard_normal(A.shape[1])
    out = poisoned(A.shape[0], dtype)
    op.matvec(x.astype(dtype), out=out)
    ref = A.astype(np.complex128 if dtype.kind == "c" else np.float64) @ x
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(A).max())


def test_host_matrix_converts_on_a_gpu_when_its_rows_are_in_order(device, rng):
    """A GPU profile uploads a host CSR in canonical form and converts it there (the same
    arrays); an unsorted one, another block shape and a CPU profile stay on the host;
    update_values rewrites the device arrays."""
    A = sp.csr_matrix(matrices(rng, 16)["edges"])
    op, gpu = host_input_on_a_gpu(device, "bccoo", A, rng, tile_size=4, work_group_size=8)
    assert not psc.SpMV(A, format="bccoo", dtype=np.float32, device=gpu, tile_size=4,
                        work_group_size=8, block_height=2)._impl.converting_on_device
    unsorted = csr_from_row_lengths(rng, np.diff(A.indptr), A.shape[1], shuffle=True)
    assert not get_format("bccoo").device_conversion_takes(unsorted, op.params, np.float32)
    assert not psc.SpMV(unsorted, format="bccoo", dtype=np.float32, device=gpu,
                        tile_size=4, work_group_size=8)._impl.converting_on_device
