"""The exchange's two small kernels, called straight through pyopencl's ``Kernel``:
a gather (``out[i] = x[idx[i]]``, the values to send) and a scatter-add
(``y[idx[i]] += v[i]``, the compressed off-diagonal rows into y).

pyopencl's ``array.take`` and ``ElementwiseKernel`` cost 30-50 us of Python per call
(argument checks, queue matching, event bookkeeping); a distributed product made
three such calls before and after the diagonal block's kernels, all on its critical
path.  One program per context and dtype; each caller keeps its own ``Kernel``
objects (their arguments are per object).
"""

import numpy as np
import pyopencl as cl
from pyopencl.tools import dtype_to_ctype

_PROGRAMS = {}
_GROUP = 128

_SOURCE = """
{pragma}
{include}
#define ADD(a, b) {add}
__kernel void pyspmv_gather(const long n, __global const long *idx,
                            __global const T *x, const long x_off, __global T *out)
{{
    const long i = get_global_id(0);
    if (i < n) out[i] = x[x_off + idx[i]];
}}
__kernel void pyspmv_scatter_add(const long n, __global const long *idx,
                                 __global const T *v, __global T *y, const long y_off)
{{
    const long i = get_global_id(0);
    if (i < n) y[y_off + idx[i]] = ADD(y[y_off + idx[i]], v[i]);
}}
"""


def _program(context, dtype):
    key = (context.int_ptr, dtype.name)
    if key not in _PROGRAMS:
        t = dtype_to_ctype(dtype)
        complex_ = dtype.kind == "c"
        source = _SOURCE.format(
            pragma="#pragma OPENCL EXTENSION cl_khr_fp64: enable"
            if dtype in (np.float64, np.complex128) else "",
            include=("#define PYOPENCL_DEFINE_CDOUBLE\n#include <pyopencl-complex.h>"
                     if complex_ else ""),
            add=f"{t[:-2]}_add(a, b)" if complex_ else "((a) + (b))")
        _PROGRAMS[key] = cl.Program(context, f"#define T {t}\n" + source).build()
    return _PROGRAMS[key]


def _size(n):
    return ((int(n) + _GROUP - 1) // _GROUP) * _GROUP


def _where(array):
    """(buffer, offset in elements) of a pyopencl array (views included)."""
    return array.base_data, np.int64(array.offset // array.dtype.itemsize)


class ExchangeKernels:
    """A caller's gather and scatter-add kernels for ``dtype`` on ``context``."""

    def __init__(self, context, dtype):
        self.dtype = np.dtype(dtype)
        program = _program(context, self.dtype)
        self._gather = cl.Kernel(program, "pyspmv_gather")
        self._scatter = cl.Kernel(program, "pyspmv_scatter_add")

    def gather(self, queue, idx, x, out, wait_for=None):
        """``out[i] = x[idx[i]]`` for ``i < idx.size`` (device arrays; ``idx`` int64)."""
        n = idx.size
        if n == 0:
            return None
        buf, off = _where(x)
        return self._gather(queue, (_size(n),), (_GROUP,), np.int64(n), idx.data, buf, off,
                            out.data, wait_for=wait_for)

    def scatter_add(self, queue, idx, v, y, wait_for=None):
        """``y[idx[i]] += v[i]`` for ``i < idx.size`` (distinct ``idx``)."""
        n = idx.size
        if n == 0:
            return None
        buf, off = _where(y)
        return self._scatter(queue, (_size(n),), (_GROUP,), np.int64(n), idx.data, v.data,
                             buf, off, wait_for=wait_for)
