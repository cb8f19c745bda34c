"""Kernel launches and their timing: every kernel a product runs is enqueued through
:func:`enqueue_launch`, so that :func:`record_launches` can collect the events of one
product for the tuner, the benchmarks and the kernel breakdown (each thread its own:
the online tuner times candidates in a thread of its own)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyopencl as cl

# Per thread: a background tuning thread must not collect the caller's launches.
_local = threading.local()


def _recorders() -> list:
    if not hasattr(_local, "recorders"):
        _local.recorders = []
    return _local.recorders


def enqueue_launch(queue: cl.CommandQueue, kernel: cl.Kernel, global_size: tuple,
                   local_size: tuple, wait_for=None) -> cl.Event:
    """Enqueue one launch of ``kernel`` (arguments already set) and hand its event to
    every active ``record_launches`` block."""
    event = cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size,
                                       wait_for=wait_for)
    for events, with_names in _recorders():
        events.append((kernel.function_name, event) if with_names else event)
    return event


def in_order(queue: cl.CommandQueue) -> bool:
    """Whether ``queue`` runs its commands in order (each waits for the one before)."""
    return not (queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)


def launch_kernel(queue: cl.CommandQueue, kernel: cl.Kernel, global_size: int,
                  local_size: int, wait_for=None) -> cl.Event:
    """Enqueue a 1-D launch of ``kernel`` (for kernels outside a format, e.g. the
    benchmark's copy kernel)."""
    return enqueue_launch(queue, kernel, (int(global_size),), (int(local_size),), wait_for)


@contextlib.contextmanager
def record_launches(with_names: bool = False) -> Iterator[list[Any]]:
    """Collect, in a list, the events of every kernel launched inside the block (as
    ``(kernel name, event)`` pairs with ``with_names``)."""
    events: list[Any] = []
    entry = (events, with_names)
    recorders = _recorders()
    recorders.append(entry)
    try:
        yield events
    finally:
        recorders.remove(entry)


def launches_seconds(enqueue: Callable[[], Any]) -> float:
    """Device seconds of the kernels ``enqueue()`` launches, however many: from the
    start of the first to the end of the last (profiling events; gaps between
    dependent kernels count, host-side queueing before the first does not).  One
    product per sample: timing several back to back from Python measured the host's
    launch overhead instead on short GPU products (an H200: sell on a 3.6M-non-zero
    matrix 10 us alone, 20 us a product back to back)."""
    with record_launches() as events:
        enqueue()
    if not events:
        return 0.0
    events[-1].wait()
    return (events[-1].profile.end - events[0].profile.start) * 1e-9


def poll_event(queue, event, seconds: float, pause: float = 0.0) -> bool:
    """Whether ``event`` ended (completed or failed) within ``seconds``, read from its
    status without blocking in the driver; ``queue``, the event's, is flushed first
    (an unflushed command may never start).  ``pause``: seconds to sleep between
    reads (0: spin)."""
    if queue is not None:
        queue.flush()
    deadline = time.perf_counter() + seconds
    while event.command_execution_status > 0:   # queued, submitted or running
        if time.perf_counter() >= deadline:
            return False
        if pause:
            time.sleep(pause)
    return True
