"""Copies between device buffers and ordinary (pageable) host arrays through a small
pinned buffer, for work in a background thread that must not hold up the caller's
products.

On NVIDIA's driver a copy from or to pageable memory holds up the products another
thread enqueues for the copy's whole length: an H100, 160 MB beside a loop of 83 us
products, cost that loop 13-19 ms read back and 18-21 ms uploaded. Through a 4 MB pinned
buffer (a mapped ``ALLOC_HOST_PTR`` buffer, NVIDIA's way to page-lock in OpenCL), in
blocking pieces with a host copy of each, the loop lost 3.5-7 ms (1 MB pieces: 3.6-10;
16 MB: 12-16; BENCHMARKS.md). Pinning the whole array instead costs more than it saves:
page-locking 240-330 MB held the loop up longer than the copy.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

#: Bytes of the pinned buffer, one piece of a copy.
PIECE_BYTES = 4 << 20


class PinnedStaging:
    """A pinned buffer of ``piece_bytes`` on ``queue``'s context, mapped for its
    lifetime; ``read`` and ``write`` copy through it on ``queue``, blocking."""

    def __init__(self, queue: cl.CommandQueue, piece_bytes: int = PIECE_BYTES):
        self.queue = queue
        self.piece = int(piece_bytes)
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                        self.piece)
        self._stage, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ | cl.map_flags.WRITE,
                                               0, (self.piece,), np.uint8, is_blocking=True)

    def read(self, buf: cl.Buffer, host: np.ndarray) -> np.ndarray:
        """Fill the C-contiguous ``host`` from the start of ``buf``; returns ``host``."""
        if not host.flags.c_contiguous:
            raise ValueError("PinnedStaging.read needs a C-contiguous host array")
        raw = host.reshape(-1).view(np.uint8)
        for start in range(0, raw.size, self.piece):
            n = min(self.piece, raw.size - start)
            cl.enqueue_copy(self.queue, self._stage[:n], buf, src_offset=start,
                            is_blocking=True)
            raw[start:start + n] = self._stage[:n]
        return host

    def write(self, buf: cl.Buffer, host: np.ndarray) -> None:
        """Copy the C-contiguous ``host`` to the start of ``buf``."""
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        for start in range(0, raw.size, self.piece):
            n = min(self.piece, raw.size - start)
            self._stage[:n] = raw[start:start + n]
            cl.enqueue_copy(self.queue, buf, self._stage[:n], dst_offset=start,
                            is_blocking=True)

    def to_device(self, host: np.ndarray) -> cla.Array:
        """A new device array on ``queue`` holding ``host`` (as ``cla.to_device``)."""
        host = np.ascontiguousarray(host)
        arr = cla.empty(self.queue, host.shape, host.dtype)
        if host.size:
            self.write(arr.data, host)
        return arr
