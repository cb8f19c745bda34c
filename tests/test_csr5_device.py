"""``csr5`` converted on the device (templates/csr5_convert.mako) from a CSR there: every
array is identical to the host conversion's (``formats/values.host_arrays``: the format's
own analyse + convert on the host, same parameters), over tile edge cases (leading,
trailing and long runs of empty rows, tiles whose rows are nearly all empty, a row over
many tiles, nnz below one tile, exact multiples of a tile, an incomplete last tile),
omega/sigma from 1 to several descriptor words, real and complex values, 32- and
64-bit indices; the matrix is never read back; products match scipy (float64
reference, poisoned output).  A host matrix goes up as CSR and converts there under a
GPU profile (``host_input_on_device``), not under a CPU one."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, reference, skip_without_fp64
from device_conversion import assert_same_as_host, check_product, on_device, refuse_read_back
from matrix_cases import csr_from_row_lengths

import pyspmv_cl as psc
from pyspmv_cl.device_inputs import DeviceCSR
from pyspmv_cl.formats import base, get_format, values

pytestmark = pytest.mark.skipif("csr5" not in psc.formats(), reason="no csr5 format")


def matrices(rng, omega, sigma):
    """Row-length patterns around tiles of omega * sigma entries."""
    tile = omega * sigma
    n = 4 * tile + 3

    def rows(lengths, cols=n):
        return csr_from_row_lengths(rng, np.minimum(np.asarray(lengths, np.int64), cols), cols)

    # Leading empty rows, short rows, a run of empty rows over several tiles' worth of
    # rows, a row ending exactly on a tile boundary followed by empty rows, a row over
    # three tiles, trailing empty rows; an incomplete last tile.
    short = list(rng.integers(0, 4, 25))
    lengths = [0, 0, 0] + short + [0] * (3 * tile + 5) + [2, 1]
    lengths += [(-sum(lengths)) % tile or tile] + [0] * 4 + [3 * tile + 1] + [0, 1, 0]
    lengths += list(rng.integers(0, 6, 40)) + [0] * 6
    edges = rows(lengths)
    # One entry per row, an empty row between any two: every tile holds empty rows and
    # as many segments as it can.
    sparse = rows([1, 0] * (2 * tile + 1) + [0])
    # One row over many tiles, between short rows.
    long_row = rows([1, 2, 0, 9 * tile + 5, 0, 1, 3], cols=10 * tile + 5)
    # Exact multiples of a tile: no incomplete tile, with and without empty rows after.
    exact = rows(np.full(3 * tile, 1))
    exact_trailing = rows([tile, 0, 2 * tile - 1, 1, 0, 0])
    # Fewer entries than a tile (only the incomplete tile), and none at all.
    small = rows([0, min(2, tile - 1), 0, 0, max(0, tile - 3), 0], cols=max(3, tile))
    return {"edges": edges, "sparse": sparse, "long_row": long_row, "exact": exact,
            "exact_trailing": exact_trailing, "small": small, "no_entries": sp.csr_matrix((9, 5)),
            "no_rows": sp.csr_matrix((0, 4))}


# (omega, sigma): omega = 1 and a warp; sigma 1, odd and large; one descriptor word per
# column, two (16, 33), three (4, 70) and seventeen (4, 512).
GEOMETRIES = [(1, 1), (1, 7), (2, 5), (4, 3), (8, 16), (16, 33), (32, 5), (64, 2), (4, 70),
              (4, 512)]


@pytest.mark.parametrize("omega,sigma", GEOMETRIES, ids=lambda g: str(g))
def test_device_conversion_gives_the_host_arrays(omega, sigma, device, rng, monkeypatch):
    refuse_read_back(monkeypatch)
    seen = set()
    for name, A in matrices(rng, omega, sigma).items():
        A = sp.csr_matrix(A)
        op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="csr5",
                      dtype=np.float32, device=device, omega=omega, sigma=sigma,
                      work_group_size=max(omega, 4 * omega if omega <= 64 else omega))
        host = assert_same_as_host(op, A)
        seen.add(name if "empty_offset" not in host else name + "+empty_offset")
        check_product(op, A, rng)
    # The edge cases reach what they are meant to.
    assert "edges+empty_offset" in seen and "sparse+empty_offset" in seen


@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.complex128],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("index_bits", [32, 64])
def test_value_and_index_types(dtype, index_bits, device, rng, monkeypatch):
    """Complex and double values and 64-bit indices (cast on the device from the
    caller's types: float64 values, int32 or int64 indices)."""
    skip_without_fp64(device, dtype)
    refuse_read_back(monkeypatch)
    omega, sigma = 4, 6
    for name in ("edges", "small", "exact_trailing"):
        A = matrices(rng, omega, sigma)[name]
        if np.dtype(dtype).kind == "c":
            A = A + 1j * sp.csr_matrix((rng.standard_normal(A.nnz), A.indices, A.indptr),
                                       shape=A.shape)
        A = sp.csr_matrix(A)
        triple = on_device(device.queue, A, np.int64 if index_bits == 32 else np.int32)
        op = psc.SpMV(triple, shape=A.shape, format="csr5", dtype=dtype, device=device,
                      omega=omega, sigma=sigma, index_bits=index_bits)
        assert op._impl.index_dtype == np.dtype(f"int{index_bits}")
        host = assert_same_as_host(op, A)
        assert host["tile_ptr"].dtype == np.dtype(f"uint{index_bits}")
        check_product(op, A, rng)


@pytest.mark.parametrize("run_group", [0, 4])
@pytest.mark.parametrize("segmented_sum", ["scan", "serial"])
def test_defaults_and_run_sums(run_group, segmented_sum, device, rng, monkeypatch):
    """The device's default omega/sigma, both segmented sums, with the run-sums pass
    (rows over many tiles) and without."""
    refuse_read_back(monkeypatch)
    A = sp.csr_matrix(matrices(rng, 4, 4)["edges"])
    op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="csr5",
                  dtype=np.float32, device=device, run_group=run_group,
                  segmented_sum=segmented_sum)
    assert op.params["run_group"] == run_group
    assert_same_as_host(op, A)
    check_product(op, A, rng)


def test_host_matrix_converts_on_a_gpu_only(device, rng):
    """A GPU uploads a host CSR and converts it there (the same arrays); a CPU converts
    on the host; update_values and the CSR read back work on the device's arrays."""
    A = sp.csr_matrix(matrices(rng, 8, 4)["edges"])
    gpu = device.override(device_type="gpu", simd_width=8)
    cpu = device.override(device_type="cpu")
    assert base.converts_on_the_device(get_format("csr5"), A, gpu)
    assert not base.converts_on_the_device(get_format("csr5"), A, cpu)
    op = psc.SpMV(A, format="csr5", dtype=np.float32, device=gpu)
    assert op.params["omega"] == 8
    assert_same_as_host(op, A)
    check_product(op, A, rng)
    assert not psc.SpMV(A, format="csr5", dtype=np.float32, device=cpu,
                        **op.params)._impl.converting_on_device
    back = op._impl.to_csr()
    np.testing.assert_array_equal(back.indptr, A.indptr)
    np.testing.assert_array_equal(back.indices, A.indices)
    np.testing.assert_array_equal(back.data, A.data.astype(np.float32))
    B = A.copy()
    B.data = rng.standard_normal(A.nnz)
    op.update_values(B.data)
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(B, x), B, x, np.float32)


def test_device_arrays_at_an_offset(device, rng, monkeypatch):
    """The caller's arrays may be views into larger buffers."""
    refuse_read_back(monkeypatch)
    A = sp.csr_matrix(matrices(rng, 4, 3)["edges"])
    pad = 5
    whole = [cla.to_device(device.queue, np.concatenate([np.zeros(pad, a.dtype), a]))
             for a in (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))]
    triple = tuple(w[pad:] for w in whole)
    op = psc.SpMV(triple, shape=A.shape, format="csr5", dtype=np.float64
                  if device.profile.fp64 else np.float32, device=device, omega=4, sigma=3)
    assert_same_as_host(op, A)
    check_product(op, A, rng)


def test_analysis_never_reads_indptr_on_the_host(device, rng):
    """The layout comes from the device's indptr: the host copy a ``DeviceCSR`` holds is
    not looked at (nor the matrix read back), and the arrays are the host conversion's;
    the transposition's local-memory path and its register path (no local memory to
    stage tiles in) give the same arrays."""
    from pyspmv_cl.formats import csr5

    cls = get_format("csr5")
    for omega, sigma in ((4, 3), (8, 5), (1, 4)):
        for name, A in matrices(rng, omega, sigma).items():
            A = sp.csr_matrix(A)
            if not A.nnz:
                continue
            params = cls.resolve_params(psc.features.MatrixFeatures.from_csr(A),
                                        device.profile, np.float32,
                                        {"omega": omega, "sigma": sigma})
            for budget in (csr5.CONVERT_LOCAL_BYTES, 0):
                dcsr = DeviceCSR.upload(A, device.queue, np.int32, np.float32)
                dcsr.indptr = None   # any look at it fails
                dcsr.to_host = None
                old = csr5.CONVERT_LOCAL_BYTES
                csr5.CONVERT_LOCAL_BYTES = budget
                try:
                    impl = cls(dcsr, device, np.float32, params)
                finally:
                    csr5.CONVERT_LOCAL_BYTES = old
                host = values.host_arrays(impl, A, impl.dtype)
                assert set(impl.buffers) == set(host)
                for key, expected in host.items():
                    if expected.size:
                        got = np.empty_like(expected)
                        cl.enqueue_copy(device.queue, got, impl.buffers[key])
                        np.testing.assert_array_equal(got, expected, err_msg=f"{name} {key}")


@pytest.mark.parametrize("extra", [0, 1])
def test_long_rows_decided_on_the_device(extra, device, rng, monkeypatch):
    """run_group="auto": the device's analysis finds a row longer than LONG_RUN_TILES
    tiles as the host's does (one entry more switches the run-sums pass on)."""
    from pyspmv_cl.formats.csr5 import LONG_RUN_TILES

    refuse_read_back(monkeypatch)
    # A GPU converts a host CSR on the device too: the first operator is the host's.
    monkeypatch.setattr(get_format("csr5"), "host_input_on_device", False)
    omega, sigma = 2, 2
    long = LONG_RUN_TILES * omega * sigma + extra
    A = csr_from_row_lengths(rng, np.array([0, 3, long, 0, 1, 0]), long + 1)
    ops = [psc.SpMV(B, shape=A.shape, format="csr5", dtype=np.float32, device=device,
                    omega=omega, sigma=sigma) for B in (A, on_device(device.queue, A))]
    assert not ops[0]._impl.converting_on_device and ops[1]._impl.converting_on_device
    assert ops[0].params["run_group"] == ops[1].params["run_group"]
    assert bool(ops[1].params["run_group"]) == bool(extra)
    assert_same_as_host(ops[1], A)
    check_product(ops[1], A, rng)


def test_many_tiles_of_empty_rows_and_a_row_over_many_tiles(device, rng, monkeypatch):
    """Runs of empty rows inside tiles and between them at every distance from the tile
    edges, and a row over many tiles right after empty rows, with 64-bit indices."""
    refuse_read_back(monkeypatch)
    omega, sigma = 4, 4
    tile = omega * sigma
    lengths = []
    for k in range(3 * tile):
        lengths += [int(rng.integers(1, 4))] + [0] * int(rng.integers(0, 3 * tile)) * (k % 3 == 0)
    lengths += [0, 0, 40 * tile + 3, 0, 2] + [0] * (2 * tile)
    A = csr_from_row_lengths(rng, np.array(lengths), 41 * tile)
    for bits in (32, 64):
        op = psc.SpMV(on_device(device.queue, A), shape=A.shape, format="csr5",
                      dtype=np.float32, device=device, omega=omega, sigma=sigma,
                      index_bits=bits)
        host = assert_same_as_host(op, A)
        assert "empty_offset" in host
        check_product(op, A, rng)
