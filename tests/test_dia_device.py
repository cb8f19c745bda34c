"""``dia`` converted on the device (templates/dia_convert.mako) from a CSR there: every
array is identical to the host conversion's (``formats/values.host_arrays``: the
format's own analyse + convert on the host, same parameters), for stencils, bands with
holes, stored zeros (the validity bitmap), empty rows, the extreme diagonals of tall and
wide matrices, real and complex values, 32- and 64-bit indices; the matrix is never
read back; products match scipy (float64 reference, poisoned output).  DIA's refusals
come the same way; unsorted rows and duplicates (layers) are converted on the host; a
host matrix goes up as CSR on a GPU profile only when it has no duplicates."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import skip_without_fp64
from device_conversion import (
    assert_same_as_host,
    check_product,
    host_input_on_a_gpu,
    on_device,
    refuse_read_back,
)
from matrix_cases import band, csr_from_row_lengths, with_holes

import pyspmv_cl as psc
from pyspmv_cl.formats import get_format

pytestmark = pytest.mark.skipif("dia" not in psc.formats(), reason="no dia format")

NO_LIMITS = dict(max_fill=float("inf"), max_diagonals=10**9)


def matrices(rng):
    n = 400
    full = band(rng, n, 4)
    holes = with_holes(rng, full, 0.4)
    holes = sp.vstack([holes[:100], sp.csr_matrix((20, n)), holes[120:]]).tocsr()  # empty rows
    zeros = full.copy()
    zeros.data[::7] = 0.0        # stored zeros: multiplied, so the bitmap
    tall = sp.csr_matrix(([1.0, 2.0, 3.0, 4.0], ([0, 59, 30, 59], [9, 0, 5, 9])),
                         shape=(60, 10))
    wide = sp.csr_matrix(([1.0, 2.0, 3.0], ([0, 4, 2], [79, 0, 40])), shape=(5, 80))
    line = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (30, 30))
    stencil = sp.csr_matrix(sp.kronsum(line, line))
    return {"band": full, "holes": holes, "zeros": zeros, "tall": tall, "wide": wide,
            "stencil": stencil}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_device_conversion_gives_the_host_arrays(dtype, device, rng, monkeypatch):
    skip_without_fp64(device, dtype)
    refuse_read_back(monkeypatch)
    seen_mask = False
    for name, A in matrices(rng).items():
        if np.dtype(dtype).kind == "c":
            A = sp.csr_matrix(A + 1j * sp.csr_matrix(
                (rng.standard_normal(A.nnz), A.indices, A.indptr), shape=A.shape))
            if name == "zeros":
                A.data[::7] = 0
        op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="dia",
                      dtype=dtype, device=device, **NO_LIMITS)
        host = assert_same_as_host(op, A)
        seen_mask |= "mask" in host
        assert ("mask" in host) == (name == "zeros"), name
        check_product(op, A, rng)
    assert seen_mask


@pytest.mark.parametrize("index_bits", [32, 64])
def test_index_types_and_offset_views(index_bits, device, rng, monkeypatch):
    refuse_read_back(monkeypatch)
    A = matrices(rng)["holes"]
    pad = 3
    whole = [cla.to_device(device.queue, np.concatenate([np.zeros(pad, a.dtype), a]))
             for a in (A.data, A.indices.astype(np.int64), A.indptr.astype(np.int64))]
    op = psc.SpMV(tuple(w[pad:] for w in whole), shape=A.shape, format="dia",
                  dtype=np.float32, device=device, index_bits=index_bits)
    assert op._impl.index_dtype == np.dtype(f"int{index_bits}")
    assert_same_as_host(op, A)
    check_product(op, A, rng)


def test_refusals_on_the_device(device, rng, monkeypatch):
    """Too many diagonals: refused as on the host, without reading the matrix back."""
    refuse_read_back(monkeypatch)
    A = csr_from_row_lengths(rng, np.full(3000, 6), 3000)
    with pytest.raises(psc.FormatNotSuitableError, match="max_diagonals=512"):
        psc.SpMV(on_device(device.queue, A), shape=A.shape, format="dia",
                 dtype=np.float32, device=device)


@pytest.mark.parametrize("case", ["unsorted", "duplicates"])
def test_rows_out_of_order_convert_on_the_host(case, device, rng):
    A = sp.csr_matrix(matrices(rng)["band"], copy=True)
    if case == "unsorted":
        A.indices[A.indptr[5]:A.indptr[6]] = A.indices[A.indptr[5]:A.indptr[6]][::-1].copy()
        A.has_sorted_indices = False
    else:
        A.indices[A.indptr[7] + 1] = A.indices[A.indptr[7]]
        A.has_canonical_format = False
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="dia",
                  dtype=np.float32, device=device, **NO_LIMITS)
    assert_same_as_host(op, A, on_device=False)
    check_product(op, A, rng)


def test_host_matrix_converts_on_a_gpu_without_duplicates(device, rng):
    A = matrices(rng)["zeros"]
    op, gpu = host_input_on_a_gpu(device, "dia", A, rng)
    dup = sp.csr_matrix(A, copy=True)
    dup.indices[dup.indptr[3] + 1] = dup.indices[dup.indptr[3]]
    dup.has_canonical_format = False
    assert not get_format("dia").device_conversion_takes(dup, op.params, np.float32)
    assert not psc.SpMV(dup, format="dia", dtype=np.float32,
                        device=gpu)._impl.converting_on_device
