"""Elementwise combinations of pyopencl arrays that keep numpy's answers for inf and
NaN: a scalar of exactly 1 is not multiplied in (README: as BLAS), and complex arrays
are added through real views of their parts, since pyopencl's complex kernels multiply
each term by its scalar, and (inf + 0j) * (1 + 0j) is inf + NaN j."""

import numpy as np
import pyopencl.array as cla


def _parts(arr):
    """A complex array as a real one of twice the length (the same memory)."""
    return arr.view(np.finfo(arr.dtype).dtype) if arr.dtype.kind == "c" else arr


def scale_and_add(out, beta, y, wait_for=None):
    """Enqueue ``out = beta * out + y`` on ``out``'s queue, in ``out``'s type (``y``
    may be narrower), waiting for ``wait_for``; returns the last event.  ``out`` and
    ``y`` are contiguous, of one shape."""
    queue, real = out.queue, out.dtype.type
    if out.dtype.kind != "c":   # (a real multiply by 1 is exact)
        return cla.Array._axpbyz(out, real(beta), out, real(1), y, queue=queue,
                                 wait_for=wait_for or None)
    events = list(wait_for or [])
    if beta != 1:
        events = [cla.Array._axpbz(out, real(beta), out, real(0), queue=queue,
                                   wait_for=events or None)]
    o, t = _parts(out), _parts(y)
    one = o.dtype.type(1)
    return cla.Array._axpbyz(o, one, o, one, t, queue=queue, wait_for=events or None)
