"""The column path of block products for formats without block kernels
(``formats/columns.py``): the tiled transpose kernel alone (thin, square and odd
shapes, every value type, offsets and leading dimensions, nothing outside the
destination written), then block products through the path (ellr-t, coo: k = 1, 3,
33, beta == 0 into a NaN-poisoned Y, beta != 0, alpha != 1) against scipy in
float64, and the transposes being the only copies (two or three per block)."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from conftest import POISON, assert_close, reference, skip_without_fp64

import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.formats.columns import Transpose
from pyspmv_cl.launching import record_launches

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SHAPES = [(1, 1), (40, 1), (1, 37), (17, 33), (1000, 64), (1000, 3), (3, 1000), (70, 70)]


def values(rng, shape, dtype):
    v = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        v = v + 1j * rng.standard_normal(shape)
    return v.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_transpose(device, shape, dtype, rng):
    skip_without_fp64(device, dtype)
    rows, cols = shape
    queue = device.queue
    transpose = Transpose(device, dtype)
    src = values(rng, shape, dtype)
    dst = cla.to_device(queue, np.full((cols, rows), POISON[np.dtype(dtype)], dtype))
    src_d = cla.to_device(queue, src)
    transpose.enqueue(queue, dst.data, 0, rows, src_d.data, 0, cols, rows, cols).wait()
    assert np.array_equal(dst.get(), src.T)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_offsets_and_leading_dimensions(device, dtype, rng):
    """A rows x cols window at ``src_offset`` of a block with ``src_ld`` columns into
    one at ``dst_offset`` of a block with ``dst_ld`` columns; the rest of dst stays."""
    skip_without_fp64(device, dtype)
    queue = device.queue
    transpose = Transpose(device, dtype)
    for rows, cols, src_ld, dst_ld, src_offset, dst_offset in [
            (17, 33, 40, 20, 5, 7), (300, 3, 4, 333, 2, 1), (3, 300, 301, 5, 0, 11)]:
        src = values(rng, (src_offset + rows * src_ld,), dtype)
        dst = np.full(dst_offset + cols * dst_ld, POISON[np.dtype(dtype)], dtype)
        dst_d, src_d = cla.to_device(queue, dst), cla.to_device(queue, src)
        transpose.enqueue(queue, dst_d.data, dst_offset, dst_ld, src_d.data, src_offset,
                          src_ld, rows, cols).wait()
        got = dst_d.get()
        window = src[src_offset:].reshape(rows, src_ld)[:, :cols]
        written = got[dst_offset:].reshape(cols, dst_ld)
        assert np.array_equal(written[:, :rows], window.T)
        untouched = np.ones(got.shape, bool)
        untouched[dst_offset:] = np.tile(np.arange(dst_ld) >= rows, cols)
        assert np.isnan(got[untouched]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["ellr-t", "coo"])
@pytest.mark.parametrize("k", [1, 3, 33])
def test_block_products_through_the_column_path(device, fmt, k, dtype, rng):
    skip_without_fp64(device, dtype)
    A = generators.random_uniform(150, 130, 6, seed=int(rng.integers(99)))
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device, block_copy=False)
    assert not op.has_block_kernels
    queue = op.queue
    X = rng.standard_normal((130, k))
    X_d = cla.to_device(queue, X.astype(dtype))
    Y_d = cla.to_device(queue, np.full((150, k), np.nan, dtype))   # beta == 0: not read
    with record_launches(with_names=True) as launches:
        op.matmat(X_d, out=Y_d, alpha=-1.5)
    assert_close(Y_d.get(), reference(A, X, -1.5), A, X, dtype)
    names = [name for name, _ in launches]
    assert names.count("transpose") == (2 if k > 1 else 0)
    with record_launches() as single:
        op.matvec(cla.to_device(queue, X[:, 0].astype(dtype)), out=cla.empty(queue, 150, dtype))
    assert len(names) - names.count("transpose") == k * len(single)
    Y0 = rng.standard_normal((150, k))
    Y_d = cla.to_device(queue, Y0.astype(dtype))
    with record_launches(with_names=True) as launches:
        op.matmat(X_d, out=Y_d, alpha=0.5, beta=-2.0)
    assert_close(Y_d.get(), reference(A, X, 0.5, -2.0, Y0.astype(dtype)), A, X, dtype)
    assert [name for name, _ in launches].count("transpose") == (3 if k > 1 else 0)


def test_column_path_on_an_out_of_order_queue(rng):
    """The transposes and the products are ordered by events alone."""
    device = psc.get_device()
    try:
        queue = cl.CommandQueue(device.context, device.cl_device,
                                properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    except cl.Error:
        pytest.skip("no out-of-order queues")
    A = generators.random_uniform(200, 180, 5, seed=1)
    for block_copy in (False, True):   # column by column, and the block copy's kernels
        op = psc.SpMV(A, format="coo", dtype=np.float32, device=queue,
                      block_copy=block_copy)
        op.build_block_copy()
        _products_in_turn(op, queue, rng, A)
        assert (op.block_copy is not None) == block_copy


def _products_in_turn(op, queue, rng, A):
    X = rng.standard_normal((180, 5))
    X_d = cla.to_device(queue, X.astype(np.float32))
    Ys = [cla.to_device(queue, np.full((200, 5), np.nan, np.float32)) for _ in range(3)]
    for Y_d in Ys:   # back to back: each waits for the one before (shared staging)
        op.matmat(X_d, out=Y_d, alpha=2.0)
    for Y_d in Ys:
        assert_close(Y_d.get(), reference(A, X, 2.0), A, X, np.float32)
