"""``cmrs`` converted on the device (templates/cmrs_convert.mako) from a CSR there: every
array is identical to the host conversion's (``formats/values.host_arrays``: the
format's own analyse + convert on the host, same parameters), with and without the
strips' column sort, packed and separate rows in the strip, heights 1 to 16, empty rows
and strips, duplicate columns (kept in CSR order), real and complex values, 32- and
64-bit indices; the matrix is never read back; products match scipy (float64
reference, poisoned output).  Rows out of order under sort_columns are converted on the
host; a host matrix goes up as CSR on a GPU profile only when that cannot happen."""

import numpy as np
import pyopencl as cl
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

pytestmark = pytest.mark.skipif("cmrs" not in psc.formats(), reason="no cmrs format")


def matrices(rng):
    def rows(lengths, cols=60):
        return csr_from_row_lengths(rng, np.minimum(np.asarray(lengths, np.int64), cols), cols)

    lengths = [0, 3, 0, 0] + list(rng.integers(0, 8, 70)) + [0] * 20 + [40, 1, 0, 2]
    duplicates = sp.csr_matrix(rows(rng.integers(2, 7, 50)), copy=True)
    starts = duplicates.indptr[:-1][::3]
    duplicates.indices[starts + 1] = duplicates.indices[starts]   # rows stay in order
    duplicates.has_canonical_format = False
    return {"edges": rows(lengths), "dense_strips": rows(np.full(33, 12), cols=20),
            "one_row": rows([25]), "last_empty": rows([2, 0, 5, 0, 0]),
            "duplicates": duplicates}


@pytest.mark.parametrize("sort_columns", [True, False], ids=["sorted", "csr-order"])
@pytest.mark.parametrize("row_in_strip", ["packed", "separate"])
@pytest.mark.parametrize("height,group_width", [(1, 1), (3, 4), (16, 8), (5, 1)])
def test_device_conversion_gives_the_host_arrays(sort_columns, row_in_strip, height,
                                                 group_width, device, rng, monkeypatch):
    refuse_read_back(monkeypatch)
    for A in matrices(rng).values():
        op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="cmrs",
                      dtype=np.float32, device=device, height=height,
                      group_width=group_width, work_group_size=max(8, group_width),
                      sort_columns=sort_columns, row_in_strip=row_in_strip)
        assert_same_as_host(op, A)
        check_product(op, A, rng)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.complex128],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("index_bits", [32, 64])
def test_value_and_index_types(dtype, index_bits, device, rng, monkeypatch):
    skip_without_fp64(device, dtype)
    refuse_read_back(monkeypatch)
    A = matrices(rng)["edges"]
    if np.dtype(dtype).kind == "c":
        A = sp.csr_matrix(A + 1j * sp.csr_matrix(
            (rng.standard_normal(A.nnz), A.indices, A.indptr), shape=A.shape))
    triple = on_device(device.queue, A, np.int64 if index_bits == 32 else np.int32)
    op = psc.SpMV(triple, shape=A.shape, format="cmrs", dtype=dtype, device=device,
                  height=4, group_width=4, sort_columns=True, index_bits=index_bits)
    assert op._impl.index_dtype == np.dtype(f"int{index_bits}")
    host = assert_same_as_host(op, A)
    assert host["col_idx"].dtype == np.dtype(f"uint{index_bits}")   # packed
    check_product(op, A, rng)


def test_rows_out_of_order_convert_on_the_host(device, rng):
    """sort_columns needs rows in order: the device check finds one that is not, and the
    matrix is read back and converted on the host; without the sort it stays."""
    lengths = np.diff(matrices(rng)["edges"].indptr)
    A = csr_from_row_lengths(rng, lengths, 60, shuffle=True)
    for sort_columns in (True, False):
        op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="cmrs",
                      dtype=np.float32, device=device, height=4, group_width=4,
                      sort_columns=sort_columns)
        host = values.host_arrays(op._impl, sp.csr_matrix(A, copy=True), np.float32)
        for name, expected in host.items():
            got = np.empty_like(expected)
            cl.enqueue_copy(op.queue, got, op._impl.buffers[name])
            np.testing.assert_array_equal(got, expected, err_msg=name)
        check_product(op, A, rng)


def test_no_entries(device, rng):
    A = sp.csr_matrix((7, 5), dtype=np.float32)
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="cmrs",
                  dtype=np.float32, device=device)
    assert not op._impl.converting_on_device
    out = poisoned(7, np.float32)
    op.matvec(np.ones(5), out=out)
    np.testing.assert_array_equal(out, np.zeros(7))


def test_host_matrix_converts_on_a_gpu_when_it_can(device, rng):
    A = sp.csr_matrix(matrices(rng)["edges"])
    op, gpu = host_input_on_a_gpu(device, "cmrs", A, rng)
    assert op.params["sort_columns"]
    cls = get_format("cmrs")
    unsorted = csr_from_row_lengths(rng, np.diff(A.indptr), A.shape[1], shuffle=True)
    assert not cls.device_conversion_takes(unsorted, op.params, np.float32)
    assert cls.device_conversion_takes(unsorted, dict(op.params, sort_columns=False),
                                       np.float32)
    assert not psc.SpMV(unsorted, format="cmrs", dtype=np.float32,
                        device=gpu)._impl.converting_on_device
