"""Device vectors that are views of a larger array (a non-zero offset in their buffer):
products read and write exactly the view, at offsets on the device's base-address
alignment (used in place as sub-buffers) and off it (through temporaries), for x, out,
beta != 0, op.T and 2-D blocks; everything outside the view stays as it was."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, make_operator, reference, skip_without_fp64

from pyspmv_cl.bench import generators

FORMATS = ["csr-scalar", "csr-vector", "sell", "ell", "ellr-t", "coo", "hyb", "csr5",
           "bccoo", "cmrs", "dia"]


def placed(queue, values, start, total):
    """A pyopencl view of ``values`` at element ``start`` of a NaN-filled array of at
    least ``total`` elements (more where the device's alignment puts ``start`` far
    in: 128 float32 elements on NVIDIA)."""
    total = max(total, start + len(values) + 7)
    big = np.full((total,) + values.shape[1:], np.nan, values.dtype)
    big[start:start + len(values)] = values
    whole = cla.to_device(queue, big)
    return whole, whole[start:start + len(values)]


def starts(device, dtype):
    per_align = max(1, device.cl_device.mem_base_addr_align // 8 // np.dtype(dtype).itemsize)
    return {"aligned": 2 * per_align, "unaligned": 3}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_vector_views(device, fmt, dtype, rng):
    skip_without_fp64(device, dtype)
    A = sp.csr_matrix(generators.random_uniform(120, 90, 5, seed=int(rng.integers(99))))
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    at = starts(device, dtype)
    x = rng.uniform(-1, 1, 90)
    y0 = rng.uniform(-1, 1, 120)
    for x_at in at.values():
        for out_at in at.values():
            for beta in (0.0, -0.5):
                x_whole, xv = placed(op.queue, x.astype(dtype), x_at, 300)
                init = y0.astype(dtype) if beta else np.full(120, np.nan, dtype)
                out_whole, outv = placed(op.queue, init, out_at, 400)
                got = op.matvec(xv, out=outv, alpha=2.0, beta=beta)
                assert got is outv
                assert_close(outv.get(), reference(A, x, 2.0, beta, y0), A, x, dtype)
                after = out_whole.get()
                assert np.isnan(np.delete(after, np.s_[out_at:out_at + 120])).all()
                assert np.array_equal(x_whole.get()[x_at:x_at + 90], x.astype(dtype))
    # Without out, and the transposed product from a view into a view.
    _, xv = placed(op.queue, x.astype(dtype), at["unaligned"], 200)
    assert_close((op @ xv).get(), reference(A, x), A, x, dtype)
    yt = rng.uniform(-1, 1, 120)
    _, ytv = placed(op.queue, yt.astype(dtype), at["aligned"], 300)
    out_whole, outv = placed(op.queue, np.full(90, np.nan, dtype), at["unaligned"], 200)
    op.T.matvec(ytv, out=outv)
    assert_close(outv.get(), reference(A.T, yt), A.T, yt, dtype)
    assert np.isnan(np.delete(out_whole.get(), np.s_[3:93])).all()


@pytest.mark.parametrize("fmt", ["csr-scalar", "coo"])
def test_arrays_on_another_queue_through_temporaries(device, fmt, rng):
    """x and out on another queue of the operator's context, where the product goes
    through temporaries: x or out of the other float type (cast on the device) and an
    out view off the alignment (copied back). pyopencl's copy kernel asserted that
    every array was on the operator's queue."""
    import pyopencl as cl
    skip_without_fp64(device, np.float64)
    A = sp.csr_matrix(generators.random_uniform(120, 90, 5, seed=int(rng.integers(99))))
    op = make_operator(A, fmt, dtype=np.float64, device=device)
    q2 = cl.CommandQueue(op.queue.context)
    x = rng.uniform(-1, 1, 90)
    y0 = rng.uniform(-1, 1, 120)
    x32 = x.astype(np.float32)
    assert_close((op @ cla.to_device(q2, x32)).get(), reference(A, x32), A, x, np.float32)
    out = cla.to_device(q2, y0.astype(np.float32))
    assert op.matvec(cla.to_device(q2, x), out=out, alpha=2.0, beta=-0.5) is out
    assert_close(out.get(), reference(A, x, 2.0, -0.5, y0.astype(np.float32)), A, x,
                 np.float32)
    for beta in (0.0, -0.5):
        init = y0 if beta else np.full(120, np.nan)
        whole, outv = placed(q2, init, starts(device, np.float64)["unaligned"], 400)
        assert op.matvec(cla.to_device(q2, x), out=outv, alpha=2.0, beta=beta) is outv
        assert_close(outv.get(), reference(A, x, 2.0, beta, y0), A, x, np.float64)
        assert np.isnan(np.delete(whole.get(), np.s_[3:123])).all()


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell", "coo"])
def test_block_views(device, fmt, rng):
    """A row range of a larger (rows, k) device array is a C-contiguous view at an
    offset: the block product reads and writes just those rows."""
    dtype = np.float32
    A = sp.csr_matrix(generators.random_uniform(70, 50, 4, seed=int(rng.integers(99))))
    op = make_operator(A, fmt, dtype=dtype, device=device)
    X = rng.uniform(-1, 1, (50, 3))
    for x_at, out_at in ((1, 5), (64, 32)):
        _, Xv = placed(op.queue, X.astype(dtype), x_at, 200)
        out_whole, outv = placed(op.queue, np.full((70, 3), np.nan, dtype), out_at, 200)
        op.matmat(Xv, out=outv)
        want = reference(A, X)
        for j in range(3):
            assert_close(outv.get()[:, j], want[:, j], A, X[:, j], dtype)
        rest = np.delete(out_whole.get(), np.s_[out_at:out_at + 70], axis=0)
        assert np.isnan(rest).all()


def test_views_avoid_sub_buffers_on_nvidia(device, rng, monkeypatch):
    """On NVIDIA (whose driver crashed releasing a written sub-buffer once the whole
    buffer had been read back) views of x and out go through temporaries, never
    sub-buffers: right results, nothing outside the views touched.  Elsewhere an
    aligned view is still used in place (a sub-buffer)."""
    import pyspmv_cl as psc
    A = sp.csr_matrix(generators.random_uniform(120, 90, 5, seed=int(rng.integers(99))))
    x, y0 = rng.uniform(-1, 1, 90), rng.uniform(-1, 1, 120)
    seen = []
    original = psc.SpMV._device_buffer

    def spy(self, arr, name):
        seen.append(arr.offset)
        return original(self, arr, name)
    monkeypatch.setattr(psc.SpMV, "_device_buffer", spy)
    for family, in_place in (("nvidia", False), ("pocl", True)):
        dev = device.override(vendor_family=family)
        op = make_operator(A, "csr-scalar", dtype=np.float32, device=dev)
        at = starts(dev, np.float32)["aligned"]
        x_whole, xv = placed(op.queue, x.astype(np.float32), at, 300)
        out_whole, outv = placed(op.queue, y0.astype(np.float32), at, 400)
        seen.clear()
        assert op.matvec(xv, out=outv, alpha=2.0, beta=-0.5) is outv
        # The views (and any sub-buffer of them) go before the whole buffer is read:
        # the "pocl" pass on a real NVIDIA device would otherwise hit the crash.
        op.queue.finish()
        del xv, outv
        after = out_whole.get()
        assert_close(after[at:at + 120], reference(A, x, 2.0, -0.5, y0), A, x, np.float32)
        assert np.isnan(np.delete(after, np.s_[at:at + 120])).all()
        assert np.array_equal(x_whole.get()[at:at + 90], x.astype(np.float32))
        assert (max(seen) > 0) == in_place, (family, seen)
        del op, x_whole, out_whole


@pytest.mark.parametrize("family", ["nvidia", "pocl"])
def test_strided_view_at_an_offset_is_refused_clearly(device, rng, family):
    """A strided device view at an offset is refused as not contiguous, also where
    views go through temporaries (NVIDIA: pyopencl cannot copy a strided array, and
    that RuntimeError reached the caller)."""
    import pyspmv_cl as psc
    A = sp.csr_matrix(generators.random_uniform(20, 6, 2, seed=int(rng.integers(99))))
    op = make_operator(A, "csr-scalar", dtype=np.float32, device=device.override(
        vendor_family=family))
    whole = cla.to_device(op.queue, rng.uniform(-1, 1, 40).astype(np.float32))
    out = cla.to_device(op.queue, np.full(20, np.nan, np.float32))
    with pytest.raises(psc.InvalidInputError, match="x must be contiguous"):
        op.matvec(whole[1:13:2], out=out)
    with pytest.raises(psc.InvalidInputError, match="out must be contiguous"):
        op.matvec(whole[:6], out=cla.to_device(op.queue, np.zeros(41, np.float32))[1:41:2])
    assert np.isnan(out.get()).all()
