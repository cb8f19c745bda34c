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

pyopencl makes that table (``pyopencl.invoker``, imported by :func:`install` and by
pyopencl at its first kernel object) in the user cache directory (``XDG_CACHE_HOME``,
``~/.cache``), and fails where it cannot: a read-only home, a file in its place.  Plain
pyopencl then fails at its first kernel object; :func:`install` turns pyopencl's disk
cache off in that case instead (``PYOPENCL_NO_CACHE=1``, with one warning), so that
the library still works, and leaves the table alone.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

import pyopencl as cl

from .errors import PySpMVError

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


def _import_invoker():
    """``pyopencl.invoker``, or the text of the error that importing it raised.
    pytools' table that failed to open complains as it is collected ("Exception
    ignored ... no attribute 'mutex'"): that noise is left out."""
    previous = sys.unraisablehook

    def quiet(unraisable):
        if str(getattr(unraisable.object, "__module__", None)).startswith("pytools."):
            return
        previous(unraisable)

    sys.unraisablehook = quiet
    try:
        try:
            import pyopencl.invoker as invoker
            return invoker
        except ImportError:
            raise
        except Exception as exc:   # OSError, sqlite3's errors, AttributeError ...
            return f"{type(exc).__name__}: {exc}"
    finally:
        sys.unraisablehook = previous


def _without_pyopencl_cache(why):
    """Turn pyopencl's disk cache off in this process (and its children), as
    ``PYOPENCL_NO_CACHE=1`` does, and import its invoker again; raise a PySpMVError
    where that fails too."""
    os.environ["PYOPENCL_NO_CACHE"] = "1"   # read by a pyopencl imported from here on
    # (pyopencl imported already read the variable: its flag, read by the invoker)
    cl._PYOPENCL_NO_CACHE = True
    invoker = _import_invoker()
    if isinstance(invoker, str):
        raise PySpMVError(
            f"pyopencl cannot set up its kernel argument cache ({why}; without its disk "
            f"cache: {invoker}); setting PYOPENCL_NO_CACHE=1 before importing pyopencl, "
            "or XDG_CACHE_HOME to a writable directory, may help")
    warnings.warn(f"pyspmv_cl: pyopencl cannot use its cache directory ({why}); its disk "
                  "cache is off in this process (PYOPENCL_NO_CACHE=1: set it, or "
                  "XDG_CACHE_HOME to a writable directory, to silence this)",
                  RuntimeWarning, stacklevel=4)


def install() -> bool:
    """Put the dictionary in front of pyopencl's invoker table, once; whether it is
    there.  Where pyopencl cannot make its table (an unusable user cache directory) its
    disk cache is turned off instead, with one warning, and False returned."""
    with _lock:
        try:
            _invoker = _import_invoker()
        except ImportError:   # a pyopencl without this module: nothing to front
            return False
        if isinstance(_invoker, str):
            _without_pyopencl_cache(_invoker)
            return False
        table = getattr(_invoker, "invoker_cache", None)
        if isinstance(table, _MemoryFront):
            return True
        if not all(hasattr(table, m) for m in ("__getitem__", "store_if_not_present")):
            return False
        _invoker.invoker_cache = _MemoryFront(table)
        return True


def kernel_object(program, name):
    """A new kernel object of ``program``'s kernel ``name``.  Not ``all_kernels()``:
    pyopencl (2026.1) retains each kernel it returns once too often, so the driver's
    kernel (and its program) outlived the object: 1-8 kB a discarded operator on PoCL,
    without bound.  Not ``program.name`` either: that attribute lookup probes the
    driver per attribute.  Made from pyopencl's underlying program where it has one: its
    Kernel looks up ``_source`` on the program, which a program built from a binary
    lacks, so pyopencl's attribute lookup asked the driver for a kernel of that name
    (an error Oclgrind's API check reports)."""
    underlying = getattr(type(program), "_get_prg", None)
    return cl.Kernel(program._get_prg() if underlying is not None else program, name)
