"""Block products column by column, for formats without block kernels: the strided copy
kernel (``kernels/strided_copy.cl``) that moves one column of a row-major block to or
from a vector, and the column loop around a single-vector product.  The operator's
device block products (``SpMV._device_columns`` in matrix.py) and the tuner's timing of
a block product (``_Bench`` in tuning/tuner.py) both run ``columns_product``, so the
tuner times what the operator runs."""

from __future__ import annotations

import numpy as np

from .. import codegen
from ..cache import get_program
from ..inputs import needs_fp64
from ..launching import launch_kernel


class ColumnCopy:
    """The strided copy kernel for one device and value type.  Each user keeps its own
    (a kernel object holds its arguments: two threads must not share one)."""

    def __init__(self, device, dtype):
        dtype = np.dtype(dtype)
        source = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
                  if needs_fp64(dtype) and codegen.needs_fp64_pragma(
                      device.profile.opencl_c_version) else "")
        source += f"typedef {codegen.c_type(dtype)} real_t;\n"
        program = get_program(device.context, device.cl_device,
                              source + codegen.helper("strided_copy.cl"))
        self.kernel = program.all_kernels()[0]
        self.group = min(64, device.profile.max_work_group_size)

    def enqueue(self, queue, dest, dest_stride, dest_offset, src, src_stride, src_offset,
                count, wait_for=None):
        """``dest[i*dest_stride + dest_offset] = src[i*src_stride + src_offset]`` for
        ``i < count`` (a kernel rather than clEnqueueCopyBufferRect, whose writes
        Oclgrind does not see as initialising); returns the launch's event."""
        i64 = np.int64
        self.kernel.set_args(src, i64(src_stride), i64(src_offset), dest, i64(dest_stride),
                             i64(dest_offset), i64(count))
        return launch_kernel(queue, self.kernel, -(-count // self.group) * self.group,
                             self.group, wait_for=wait_for or None)


def columns_product(copy, queue, product, x_buf, y_buf, x_column, y_column, shape, k,
                    beta, wait_for=None):
    """``Y = alpha * A @ X + beta * Y`` for the row-major blocks ``x_buf`` (n x k) and
    ``y_buf`` (m x k), one column at a time: column j of X is copied into the vector
    ``x_column`` (and of Y into ``y_column`` when ``beta != 0``),
    ``product(x_column, y_column, wait_for)`` enqueues one single-vector product (with
    the caller's alpha and beta) and returns its event, and ``y_column`` is copied into
    column j of Y.  ``copy`` is a :class:`ColumnCopy`; ``shape`` is A's ``(m, n)``
    (m > 0).  Every column waits for the one before; the first for ``wait_for``.
    Returns the last event."""
    m, n = shape
    event = None
    for j in range(k):
        waits = list(wait_for or ()) if event is None else [event]
        copies = []
        if n:
            copies.append(copy.enqueue(queue, x_column, 1, 0, x_buf, k, j, n, waits))
        if beta != 0:
            copies.append(copy.enqueue(queue, y_column, 1, 0, y_buf, k, j, m, waits))
        event = product(x_column, y_column, copies or waits)
        event = copy.enqueue(queue, y_buf, k, j, y_column, 1, 0, m, [event])
    return event
