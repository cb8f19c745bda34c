"""Host arrays used in place as device buffers, for devices that compute in host memory.

On such a device (PoCL's CPU device, integrated GPUs) copying ``x`` into a device buffer
and ``y`` back costs two more commands through the driver's scheduler and two memcpys:
40-60 us of a product's 100-200 us on PoCL, 2 cores, measured.  A buffer made with
``CL_MEM_USE_HOST_PTR`` over the numpy array can be that array.

OpenCL only promises that the host sees what a kernel wrote into such a buffer once it
is mapped, and a map is one more command: 35-55 us on PoCL.  So :func:`in_place_mode`
probes the driver once per device: where a kernel's writes are in the host array as
soon as the kernel's event completes (PoCL's CPU devices work in the host pointer
itself, aligned or not), products only wait for their last event ("direct"); elsewhere
they map the result ("map"), which is right whatever the driver does.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from .cache import get_program
from .launching import poll_event

#: How host arrays are used on a device (see the module's docstring).
COPY, MAP, DIRECT = "copy", "map", "direct"

_PROBE = """
__kernel void pyspmv_cl_in_place_probe(__global float *a, const float s)
{
    a[get_global_id(0)] *= s;
}
"""


def usable_in_place(array: np.ndarray) -> bool:
    """Whether the kernels may work in ``array``'s memory: at an address that is a
    multiple of its item size, the alignment of the OpenCL type they read it as (a
    complex128 value is a double2 of 16 bytes).  numpy calls an array at 8 bytes past
    such an address aligned; PoCL's compiled double2 loads there crashed the process.
    For real types numpy's flag says it all; the address (a ctypes object, about 2 us
    on the 2-core VM) is read for complex ones only, off the common call path."""
    if not array.flags.aligned:
        return False
    return array.dtype.kind != "c" or array.ctypes.data % array.dtype.itemsize == 0


def host_buffer(context: cl.Context, array: np.ndarray, *, writable: bool) -> cl.Buffer:
    """A buffer over ``array``'s memory (C-contiguous, at least one element); pyopencl
    keeps ``array`` alive as long as the buffer."""
    access = cl.mem_flags.READ_WRITE if writable else cl.mem_flags.READ_ONLY
    return cl.Buffer(context, access | cl.mem_flags.USE_HOST_PTR, hostbuf=array)


#: A host product on a CPU device whose kernels run on worker threads (PoCL's pthread
#: driver) polls its event for ``spin_seconds`` before waiting on it: a wait puts the
#: caller to sleep, and waking it took 25-50 us on PoCL (a trivial kernel: 55-90 us
#: waited, 24-40 us polled, 2-core VM).  Only for products guessed at most
#: ``SPIN_MAX_GUESS`` long: polling takes a core from the workers.  sell on that VM:
#: 25-35% faster calls at 65k-243k non-zeros (fe_4elt2 float32 133 -> 89 us), mixed
#: at guesses of 260-440 us, 15-20% slower from 540 us (1.2M non-zeros), and a
#: 5M-non-zero product (1-2 ms) polled for 100 us came out 5-15% slower.
SPIN_MAX_GUESS = 200e-6
SPIN_WAKE_ALLOWANCE = 50e-6


def spin_seconds(guess: float) -> float:
    """How long to poll a product guessed to take ``guess`` seconds (0: just wait)."""
    return 2 * guess + SPIN_WAKE_ALLOWANCE if 0 < guess <= SPIN_MAX_GUESS else 0.0


def wait_and_read(queue: cl.CommandQueue, buf: cl.Buffer, array: np.ndarray,
                  event: cl.Event, mode: str, spin: float = 0.0) -> None:
    """Wait for ``event`` and make what the device wrote into ``buf`` visible in
    ``array``, the host memory behind it: in ``DIRECT`` mode it already is; in ``MAP``
    mode by a blocking map for reading, unmapped at once (the unmap is not waited for;
    later commands on an in-order queue follow it).  ``spin``: seconds to poll the
    event first (``spin_seconds``)."""
    if mode == DIRECT:
        if spin > 0 and poll_event(queue, event, spin) and \
                event.command_execution_status == cl.command_execution_status.COMPLETE:
            return
        event.wait()   # a failed command raises here
        return
    mapped, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ, 0, array.shape,
                                      array.dtype, wait_for=[event], is_blocking=True)
    mapped.base.release(queue)


def in_place_mode(context: cl.Context, device: cl.Device, queue: cl.CommandQueue) -> str:
    """``COPY`` for a device that does not compute in host memory, else ``DIRECT`` when
    a probe kernel's writes into a host array (deliberately misaligned) are there once
    its event completes, else ``MAP``."""
    try:
        unified = bool(device.host_unified_memory)
    except (cl.Error, AttributeError):
        unified = False
    if not unified:
        return COPY
    try:
        kernel = cl.Kernel(get_program(context, device, _PROBE), "pyspmv_cl_in_place_probe")
        backing = np.arange(1, 67, dtype=np.float32)
        array = backing[1:66]          # 4 bytes past numpy's alignment
        expected = array * 3
        buf = host_buffer(context, array, writable=True)
        kernel.set_args(buf, np.float32(3))
        cl.enqueue_nd_range_kernel(queue, kernel, (array.size,), None).wait()
        seen = array.copy()            # before any map
        wait_and_read(queue, buf, array, cl.enqueue_marker(queue), MAP)
        queue.finish()
    except cl.Error:
        return COPY
    return DIRECT if np.array_equal(seen, expected) else MAP
