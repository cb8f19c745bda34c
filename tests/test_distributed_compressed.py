"""The off-diagonal block on its non-empty rows (distributed/compressed.py), without
MPI: it adds alpha * B @ x into y at those rows and leaves the other rows as they
were; its transposed product reads only those rows of y."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, reference, skip_without_fp64

import pyspmv_cl as psc
from pyspmv_cl.distributed.compressed import CompressedRows


def boundary_block(rng, m=500, g=40, nonempty=30):
    """An m x g block whose entries sit in a few scattered rows (as a slab's)."""
    rows = np.sort(rng.choice(m, nonempty, replace=False))
    dense = np.zeros((m, g))
    dense[rows] = rng.uniform(-1, 1, (nonempty, g)) * (rng.random((nonempty, g)) < 0.3)
    dense[rows, 0] += 1.0             # every chosen row non-empty
    return sp.csr_matrix(dense)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["csr-vector", "sell"])
def test_compressed_rows_add_into_their_rows_only(device, dtype, fmt, rng):
    skip_without_fp64(device, dtype)
    B = boundary_block(rng)
    made = []

    def make(block):
        made.append(block.shape)
        return psc.SpMV(block, format=fmt, dtype=dtype, device=device)
    op = CompressedRows.or_plain(B, make, device.queue, dtype)
    assert isinstance(op, CompressedRows) and made == [(30, 40)]
    assert op.shape == B.shape and op.format == fmt
    x = rng.uniform(-1, 1, B.shape[1])
    y0 = rng.uniform(-1, 1, B.shape[0])
    y = cla.to_device(device.queue, y0.astype(dtype))
    op.matvec(cla.to_device(device.queue, x.astype(dtype)), out=y, alpha=-0.5)
    assert_close(y.get(), reference(B, x, alpha=-0.5, beta=1.0, y0=y0), B, x, dtype)
    with pytest.raises(ValueError, match="beta=1"):
        op.matvec(cla.to_device(device.queue, x.astype(dtype)), out=y, beta=0.0)
    # Transposed: alpha * B^T y, every output entry written (poisoned first).
    yt = rng.uniform(-1, 1, B.shape[0])
    out = cla.to_device(device.queue, np.full(B.shape[1], np.nan, dtype))
    op.rmatvec(cla.to_device(device.queue, yt.astype(dtype)), out=out, alpha=2.0)
    assert_close(out.get(), reference(B.T, yt, alpha=2.0), B.T, yt, dtype)


def test_mostly_full_blocks_stay_plain(device, rng):
    B = sp.random(100, 30, density=0.2, format="csr", random_state=rng)
    B = B + sp.csr_matrix((np.ones(100), (np.arange(100), np.zeros(100, int))),
                          shape=B.shape)
    op = CompressedRows.or_plain(B.tocsr(), lambda b: ("plain", b.shape), device.queue,
                                 np.float32)
    assert op == ("plain", (100, 30))


def test_rank_timings_need_a_profiling_queue(device, rng):
    """The distributed operator's ``local`` time comes from profiling events: its own
    devices run on the profiling queue; a caller's queue without profiling gives NaN
    (and NaN ``hidden``) instead of pyopencl's error."""
    import pyopencl as cl

    from pyspmv_cl.distributed.operator import _hidden, _kernel_seconds, _resolve_device
    from pyspmv_cl.launching import record_launches

    A = sp.random(200, 200, density=0.05, format="csr", random_state=rng, dtype=np.float32)
    x = rng.standard_normal(200).astype(np.float32)
    own = _resolve_device(device.id, 0)
    assert own.queue.properties & cl.command_queue_properties.PROFILING_ENABLE
    assert _resolve_device(device, 0).queue is own.queue   # the library's Device: timed
    plain = cl.CommandQueue(device.context, device.cl_device)
    assert _resolve_device(plain, 0).queue is plain
    assert _resolve_device(psc.get_device(plain), 0).queue is plain   # the caller's queue
    for queue, timed in ((own.queue, True), (plain, False)):
        op = psc.SpMV(A, format="csr-scalar", device=queue)
        x_dev = cla.to_device(queue, x)
        with record_launches() as events:
            y_dev = op.matvec(x_dev)
        queue.finish()
        assert_close(y_dev.get(), reference(A, x), A, x, np.float32)
        seconds = _kernel_seconds(queue, events)
        if timed:
            assert seconds > 0 and _hidden(seconds, 1.0, 1.0) == pytest.approx(seconds)
            assert _hidden(seconds, 0.0, 1.0) == 0.0
        else:
            assert np.isnan(seconds) and np.isnan(_hidden(seconds, 1.0, 1.0))
    assert _kernel_seconds(plain, []) == 0.0
