"""Block products column by column, for formats without block kernels: the tiled
transpose kernel (``kernels/transpose.cl``) and the column loop around a single-vector
product.  X (n x k, row-major) is transposed once into a staging block Xt whose column
j (X's column j, contiguous) starts at ``j * ldx``; each of the k single-vector
products reads column j of Xt and writes column j of a staging Yt; one transpose moves
Yt into Y (m x k, row-major), after one of Y into Yt when ``beta != 0``.  (A strided
copy per column, before, made each element of X and Y a memory transaction of its
own: 0.4 ms per column for 20M non-zeros on an H100, 3x the product.)  The
operator's device block products (``SpMV._device_columns`` in matrix.py) and the
tuner's timing of a block product (``_Bench`` in tuning/tuner.py) both run
``columns_product``, so the tuner times what the operator runs."""

from __future__ import annotations

import math

import numpy as np
import pyopencl as cl

from .. import codegen
from ..cache import get_program
from ..inputs import needs_fp64
from ..kernel_objects import kernel_object
from ..launching import enqueue_launch


def _pow2_at_least(count):
    return 1 << max(0, int(count) - 1).bit_length()


class Transpose:
    """The tiled transpose kernel for one device and value type (one program per tile
    shape, built on first use).  Each user keeps its own (a kernel object holds its
    arguments: two threads must not share one)."""

    def __init__(self, device, dtype):
        self.device = device
        self.dtype = dtype = np.dtype(dtype)
        self._prefix = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
                        if needs_fp64(dtype) and codegen.needs_fp64_pragma(
                            device.profile.opencl_c_version) else "")
        self._prefix += f"typedef {codegen.c_type(dtype)} real_t;\n"
        # Values per tile: 1024 (4-8 KB for 4-8-byte values), 512 of 16 bytes, fewer
        # where local memory is small (the rows are padded to an odd stride).
        local = int(device.cl_device.local_mem_size) or 16384
        self.tile = 1024 if dtype.itemsize <= 8 else 512
        while self.tile > 1 and self.tile * 3 // 2 * dtype.itemsize > local // 2:
            self.tile //= 2
        self._kernels = {}   # (TC, TR) -> (kernel, work-group size)

    def tile_shape(self, rows, cols):
        """``(TC, TR)``: the tile's columns and rows of src for a rows x cols block."""
        tile = self.tile
        side = 1 << (tile.bit_length() - 1) // 2   # ~sqrt(tile): 32 for 1024, 16 for 512
        if cols < side:
            tc = _pow2_at_least(cols)
            return tc, tile // tc
        if rows < side:
            tr = _pow2_at_least(rows)
            return tile // tr, tr
        return tile // side, side

    def _kernel(self, tc, tr):
        found = self._kernels.get((tc, tr))
        if found is None:
            device = self.device
            source = (f"{self._prefix}#define TC {tc}\n#define TR {tr}\n"
                      f"#define TC_LOG {tc.bit_length() - 1}\n"
                      f"#define TR_LOG {tr.bit_length() - 1}\n"
                      + codegen.helper("transpose.cl"))
            kernel = kernel_object(get_program(device.context, device.cl_device, source),
                                   "transpose")
            fits = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE,
                                              device.cl_device)
            # 256 work-items on GPUs (4 values each); 64 on CPUs (16 each), where PoCL
            # ran the 256-item groups half as fast.
            wanted = 64 if device.profile.is_cpu else 256
            group = max(1, min(wanted, tc * tr, int(device.profile.max_work_group_size),
                               int(fits)))
            found = self._kernels[(tc, tr)] = (kernel, group)
        return found

    def enqueue(self, queue, dest, dest_offset, dest_ld, src, src_offset, src_ld, rows,
                cols, wait_for=None):
        """``dest[c*dest_ld + r + dest_offset] = src[r*src_ld + c + src_offset]`` for
        ``r < rows``, ``c < cols`` (offsets and leading dimensions in values); returns
        the launch's event."""
        tc, tr = self.tile_shape(rows, cols)
        kernel, group = self._kernel(tc, tr)
        row_tiles, col_tiles = -(-rows // tr), -(-cols // tc)
        rows_first = row_tiles >= col_tiles
        i64 = np.int64
        kernel.set_args(src, i64(src_offset), i64(src_ld), dest, i64(dest_offset),
                        i64(dest_ld), i64(rows), i64(cols), np.int32(rows_first))
        long, short = (row_tiles, col_tiles) if rows_first else (col_tiles, row_tiles)
        return enqueue_launch(queue, kernel, (int(long) * group, int(short)), (group, 1),
                              wait_for=wait_for or None)


def column_major_only(arr):
    """Whether a 2-D device array is stored column by column (F order) and not also
    row by row (a single column or row is both, and needs no transpose)."""
    return arr.ndim == 2 and arr.size > 0 and arr.flags.f_contiguous and \
        not arr.flags.c_contiguous


def relayout(transpose, queue, dest, src, wait_for=None):
    """Copy the 2-D device array ``src`` into ``dest`` of the same shape and type but
    the other order (C to F or F to C), both contiguous at any offset, with the tiled
    transpose kernel ``transpose`` (a :class:`Transpose` of their type).  Returns the
    launch's event."""
    item = src.dtype.itemsize
    if column_major_only(src):   # src is the row-major (k, n) block of its columns
        rows, cols = src.shape[1], src.shape[0]
    else:
        rows, cols = src.shape
    return transpose.enqueue(queue, dest.base_data, dest.offset // item, rows,
                             src.base_data, src.offset // item, cols, rows, cols,
                             wait_for)


class StagingBlocks:
    """Device buffers by role that only grow: ``blocks(role, count)`` is a buffer of at
    least ``count`` values, the one held for ``role`` unless it is too small.  The
    operator's block staging and the tuner's column path both keep one."""

    def __init__(self, context, dtype):
        self.context, self.itemsize = context, np.dtype(dtype).itemsize
        self._buffers = {}

    def __call__(self, role, count):
        nbytes = max(1, int(count)) * self.itemsize
        buf = self._buffers.get(role)
        if buf is None or buf.size < nbytes:
            buf = self._buffers[role] = cl.Buffer(self.context, cl.mem_flags.READ_WRITE,
                                                  nbytes)
        return buf


class ColumnPath:
    """What a user of :func:`columns_product` keeps: the transpose kernel and the
    sub-buffers of the staging blocks' columns (made once per staging buffer, shape
    and k)."""

    def __init__(self, device, dtype):
        self.transpose = Transpose(device, dtype)
        self.itemsize = np.dtype(dtype).itemsize
        align = max(1, int(device.cl_device.mem_base_addr_align) // 8)
        # Column starts on the sub-buffer alignment, in values.
        self.align = math.lcm(align, self.itemsize) // self.itemsize
        self._columns = {}   # role -> (key, list of sub-buffers)

    def leading(self, count):
        """The distance between two columns of a staging block of ``count``-long
        columns (rounded up to the sub-buffer alignment)."""
        return max(1, -(-int(count) // self.align) * self.align)

    def columns(self, role, buf, count, k):
        """The k ``count``-long column sub-buffers of staging block ``buf``."""
        key = (buf.int_ptr, count, k)
        cached = self._columns.get(role)
        if cached is not None and cached[0] == key:
            return cached[1]
        ld, size = self.leading(count), self.itemsize
        subs = [buf.get_sub_region(j * ld * size, count * size) if count else buf
                for j in range(k)]
        self._columns[role] = (key, subs)
        return subs


def columns_product(path, queue, product, x_buf, y_buf, staging, shape, k, beta,
                    wait_for=None):
    """``Y = alpha * A @ X + beta * Y`` for the row-major blocks ``x_buf`` (n x k) and
    ``y_buf`` (m x k) at offset 0, one column at a time: one transpose of X into the
    staging block Xt (and of Y into Yt when ``beta != 0``; Y is not read otherwise),
    ``product(x_column, y_column, wait_for)`` per column (a single-vector product with
    the caller's alpha and beta on column j of Xt and Yt, returning its event), and one
    transpose of Yt into Y.  ``path`` is a :class:`ColumnPath`; ``staging(role,
    count)`` returns a buffer of at least ``count`` values for ``role`` ("Xt", "Yt");
    ``shape`` is A's ``(m, n)`` (m > 0).  The first launches wait for ``wait_for``,
    each later one for the one before (the products share the format's scratch).
    Returns the last event.  k == 1 needs no transpose: one product on X and Y."""
    m, n = shape
    if k == 1:
        return product(x_buf, y_buf, list(wait_for or ()))
    transpose = path.transpose
    ldx, ldy = path.leading(n), path.leading(m)
    xt, yt = staging("Xt", ldx * k), staging("Yt", ldy * k)
    x_columns, y_columns = path.columns("Xt", xt, n, k), path.columns("Yt", yt, m, k)
    waits = []
    if n:
        waits.append(transpose.enqueue(queue, xt, 0, ldx, x_buf, 0, k, n, k, wait_for))
    if beta != 0:
        waits.append(transpose.enqueue(queue, yt, 0, ldy, y_buf, 0, k, m, k, wait_for))
    waits = waits or list(wait_for or ())
    for j in range(k):
        waits = [product(x_columns[j], y_columns[j], waits)]
    return transpose.enqueue(queue, y_buf, 0, k, yt, 0, ldy, k, m, waits)
