"""``PinnedStaging``: copies between device buffers and host arrays through a small
pinned buffer, in pieces; every byte arrives, whatever the size against the piece."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from conftest import DEVICES

from pyspmv_cl.pinned_staging import PinnedStaging

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
PIECE = 64   # bytes: several pieces and a remainder with small arrays


@pytest.fixture
def queue():
    return cl.CommandQueue(DEVICES[0].context)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.complex64])
@pytest.mark.parametrize("size", [0, 1, 16, 100, 1000])
def test_read_write_and_to_device(queue, rng, dtype, size):
    staging = PinnedStaging(queue, PIECE)
    values = (rng.standard_normal(size) * 1000).astype(dtype)
    if np.dtype(dtype).kind == "c":
        values = values + 1j * rng.standard_normal(size).astype(np.float32)
    on_device = cla.to_device(queue, values) if size else None
    # read: device -> host, into a poisoned array
    if size:
        host = np.full(size, 7, dtype)
        assert staging.read(on_device.data, host) is host
        np.testing.assert_array_equal(host, values)
    # write: host -> device, over other contents
    if size:
        target = cla.to_device(queue, np.zeros(size, dtype))
        staging.write(target.data, values)
        np.testing.assert_array_equal(target.get(), values)
    # to_device: a new array
    made = staging.to_device(values)
    assert made.shape == values.shape and made.dtype == values.dtype
    np.testing.assert_array_equal(made.get(), values)


def test_read_refuses_a_strided_host_array(queue):
    staging = PinnedStaging(queue, PIECE)
    buf = cla.to_device(queue, np.arange(10, dtype=np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        staging.read(buf.data, np.empty(20, np.float32)[::2])
