"""Kernel objects without a disk read each.

pyopencl gives every new ``Kernel`` object an argument setter generated from the
kernel's name and argument count, and it keeps these setters only on disk
(``pyopencl.invoker.invoker_cache``: a sqlite table, unpickled per fetch, no copy in
memory by design, pyopencl#694).  An operator owns its kernel objects (their arguments
are its own), so each operator built paid that read per kernel: 80 us a kernel on an
H100's host, 60 us on this project's 2-core VM, against 8 us with a copy in memory
(BENCHMARKS.md, "csr5's conversion: the host's share").  A device conversion on a GPU
takes a few hundred microseconds of kernels, so this was a visible part of setup.

:func:`install` puts a dictionary in front of pyopencl's table: the first fetch of a
key reads the table, the next ones the dictionary.  The setters are functions of the
kernel they are given, so sharing one between kernel objects shares no state.  Nothing
changes where pyopencl has no such table (``PYOPENCL_NO_CACHE``) or a table of another
shape (a later pyopencl): the wrapper is put only in front of an object with the two
methods it uses.
"""

from __future__ import annotations

import threading

import pyopencl.invoker as _invoker

_lock = threading.Lock()


class _MemoryFront:
    """pyopencl's invoker table with a dictionary in front (same two methods)."""

    def __init__(self, table):
        self.table = table
        self.memory: dict = {}

    def __getitem__(self, key):
        try:
            return self.memory[key]
        except KeyError:
            pass
        value = self.table[key]   # KeyError when pyopencl has to generate it
        self.memory[key] = value
        return value

    def store_if_not_present(self, key, value):
        self.table.store_if_not_present(key, value)
        self.memory.setdefault(key, value)


def install() -> bool:
    """Put the dictionary in front of pyopencl's invoker table, once; whether it is
    there."""
    with _lock:
        table = getattr(_invoker, "invoker_cache", None)
        if isinstance(table, _MemoryFront):
            return True
        if not all(hasattr(table, m) for m in ("__getitem__", "store_if_not_present")):
            return False
        _invoker.invoker_cache = _MemoryFront(table)
        return True
