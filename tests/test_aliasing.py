"""In-place products (``out`` is ``x``): every format gives the right answer with device
and host arrays, for alpha/beta as well (the kernels must never read x while writing y
in the same buffer).  Also overlapping without being the same array: a buffer and its
sub-buffer, two sub-buffers of one buffer, and host blocks of columns."""

import gc

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, make_operator, reference
from matrix_cases import CASES

import pyspmv_cl as psc


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (2.0, -0.5)])
@pytest.mark.parametrize("fmt", psc.formats())
def test_in_place_device_product(fmt, alpha, beta, device, rng):
    A = sp.csr_matrix(CASES["power_law"](rng))[:1500]   # square
    op = make_operator(A, fmt, dtype=np.float32, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    v0 = rng.standard_normal(A.shape[0])
    v = cla.to_device(op.queue, v0.astype(np.float32))
    assert op.matvec(v, out=v, alpha=alpha, beta=beta) is v
    assert_close(v.get(), reference(A, v0, alpha, beta, v0), A, v0, np.float32)


def test_in_place_host_product(device, rng):
    A = sp.csr_matrix(CASES["power_law"](rng))[:1500]   # square
    op = psc.SpMV(A, format="csr-scalar", device=device)
    v0 = rng.standard_normal(A.shape[0])
    v = v0.copy()
    op.matvec(v, out=v, alpha=2.0, beta=-0.5)
    assert_close(v, reference(A, v0, 2.0, -0.5, v0), A, v0, np.float64)


@pytest.mark.parametrize("shift", [1, -1])
def test_host_columns_overlapping(shift, device, rng):
    """x (n, k) and out (n, k) blocks of one array, one column apart.  Multiplied column
    by column, out's column j was written over x's column j + 1 before that was read
    (shift -1: out starts one column right of x; shift 1 the other way round)."""
    A = sp.csr_matrix(CASES["power_law"](rng))[:1500]   # square
    op = psc.SpMV(A, format="csr-scalar", device=device)
    n, k = A.shape[0], 3
    big = rng.standard_normal((n, k + 1))
    before = big.copy()
    x_cols, out_cols = (slice(1, k + 1), slice(0, k)) if shift == 1 else \
        (slice(0, k), slice(1, k + 1))
    out = big[:, out_cols]
    assert op.matvec(big[:, x_cols], out=out, alpha=2.0, beta=-0.5) is out
    x0, y0 = before[:, x_cols], before[:, out_cols]
    for j in range(k):
        assert_close(out[:, j], reference(A, x0[:, j], 2.0, -0.5, y0[:, j]), A, x0[:, j],
                     np.float64)


@pytest.mark.parametrize("where", ["buffer and its sub-buffer", "two sub-buffers"])
@pytest.mark.parametrize("fmt", ["csr-scalar", "coo"])
def test_sub_buffers_overlapping(fmt, where, device, rng):
    """x and out on one memory through different buffer objects (each at offset 0 of its
    own): the handles differ, so ``out is x`` alone did not see the overlap and the
    kernels read x while writing it (a wrong result)."""
    A = sp.csr_matrix(CASES["power_law"](rng))[:1500]   # square
    op = make_operator(A, fmt, dtype=np.float32, device=device)
    n, queue = A.shape[0], op.queue
    unit = device.cl_device.mem_base_addr_align // 8      # sub-buffer origins: bytes
    v0 = rng.standard_normal(n + unit).astype(np.float32)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=v0)
    if where == "buffer and its sub-buffer":
        x_at, x = 0, cla.Array(queue, n, np.float32, data=buf)
    else:   # x starts one alignment unit after out: out's entries overwrite later x's
        x_at = unit // 4
        x = cla.Array(queue, n, np.float32, data=buf.get_sub_region(unit, 4 * n))
    out = cla.Array(queue, n, np.float32, data=buf.get_sub_region(0, 4 * n))
    assert op.matvec(x, out=out, alpha=2.0, beta=-0.5) is out
    queue.finish()
    # The sub-buffers go before the whole buffer is read: NVIDIA's driver (580.159.04)
    # crashed releasing a written sub-buffer after that read, plain pyopencl too.
    del op, x, out
    gc.collect()
    after = np.empty_like(v0)
    cl.enqueue_copy(queue, after, buf)
    x0 = v0[x_at:x_at + n]
    assert_close(after[:n], reference(A, x0, 2.0, -0.5, v0[:n]), A, x0, np.float32)
    assert np.array_equal(after[n:], v0[n:])
