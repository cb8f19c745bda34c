"""Compiled-kernel cache: a memory layer per (context, device, key) and a disk layer of
program binaries.

Key = SHA-256 of (rendered source, build options, platform name and version, device
name, driver version, package version).  Disk entries live under the user cache
directory (``PYSPMV_CL_CACHE_DIR`` moves it, ``PYSPMV_CL_NO_CACHE=1`` bypasses the
disk layer, ``PYSPMV_CL_CACHE_BINARIES=0`` too, for this cache only).  Each file holds
a header with the key and a digest of the binary; writes go to a temporary file
renamed into place (``store.atomic_write``), so concurrent processes only ever see
whole files.  A file that is truncated, corrupt, another key's or rejected by the
driver is discarded and rebuilt (one warning per cache directory, however many such
files it holds); the discard spares a fresh entry that another process renamed into
place meanwhile.  An unwritable, read-only or full directory degrades to a memory-only
cache with one warning, leaving no partial file.
"""

import hashlib
import os
import shutil
import struct
import threading
import warnings

import pyopencl as cl

from . import kernel_objects
from ._version import __version__
from .errors import KernelBuildError
from .store import CACHE_DIR_ENV as CACHE_DIR_ENV  # re-exported: callers name them here
from .store import NO_CACHE_ENV as NO_CACHE_ENV
from .store import atomic_write, cache_dir, warn_once

#: "0": compiled kernels are neither stored on disk nor read from there (tuning decisions
#: still are).  The tests set it: each run has a cache directory of its own, where a
#: stored binary is never read again, and PoCL compiles every kernel of a program once
#: more, for any work-group size, to hand out its binary (a cold csr5 operator on the
#: 2-core VM: 3.3-3.6 s with the binary, 2.2-2.8 s without).  Users keep the binaries:
#: PoCL's own cache, warm, gave that operator in 0.25 s against 0.12 s from a binary.
BINARIES_ENV = "PYSPMV_CL_CACHE_BINARIES"

_MAGIC = b"PSCLBIN1"
_HEADER = struct.Struct("<8s32s32sQ")  # magic, key digest, binary digest, binary length

_memory = {}
_lock = threading.Lock()
kernel_objects.install()   # every kernel object made from these programs: no disk read

#: Counters for tests and diagnostics.
stats = {"memory_hits": 0, "disk_hits": 0, "builds": 0, "disk_errors": 0}


def device_identity(device):
    platform = device.platform
    return (platform.name.strip(), platform.version.strip(), device.name.strip(),
            (device.driver_version or "").strip())


def program_key(source, options, device):
    """Hex digest identifying one build of ``source`` for ``device``."""
    h = hashlib.sha256()
    for part in (source, "\0".join(options), *device_identity(device), __version__):
        h.update(part.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def _entry_path(root, key):
    return root / "kernels-v1" / key[:2] / f"{key}.bin"


_derived = []   # memos of programs kept above this module (formats/builder.py)
_generation = 0   # bumped by clear_memory: stores keyed on it (Device.thread_store) reset


def register_memory(memo):
    """Have ``clear_memory`` also empty ``memo`` (a dict of programs kept elsewhere)."""
    _derived.append(memo)


def clear_memory():
    """Forget every in-memory program (tests use this to reach the disk layer)."""
    global _generation
    with _lock:
        _memory.clear()
        for memo in _derived:
            memo.clear()
        _generation += 1


def memory_generation() -> int:
    """How many times ``clear_memory`` ran: a store of kernels built from the memoised
    programs empties itself when this changes."""
    return _generation


def _load_entry(path, key):
    """``(binary, stat)`` of the entry at ``path`` for ``key``; ``(None, None)`` if
    absent.  Raises ``DamagedEntry`` (with the file's stat) if it is truncated, corrupt
    or another key's, and OSError if it cannot be read."""
    try:
        with open(path, "rb") as fh:
            stat = os.fstat(fh.fileno())
            blob = fh.read()
    except FileNotFoundError:
        return None, None
    except IsADirectoryError:   # not an entry at all: replace it like a damaged one
        raise DamagedEntry("a directory where the entry belongs", os.stat(path)) from None
    if len(blob) < _HEADER.size:
        raise DamagedEntry("truncated header", stat)
    magic, key_digest, bin_digest, length = _HEADER.unpack_from(blob)
    binary = blob[_HEADER.size:]
    if magic != _MAGIC or key_digest != bytes.fromhex(key):
        raise DamagedEntry("wrong magic or key", stat)
    if length != len(binary) or hashlib.sha256(binary).digest() != bin_digest:
        raise DamagedEntry("truncated or corrupt binary", stat)
    return binary, stat


def _read_entry(path, key):
    """The binary stored at ``path`` for ``key``; None if absent, raises ValueError if
    the file is damaged."""
    return _load_entry(path, key)[0]


class DamagedEntry(ValueError):
    """A cache file that must not be loaded; ``stat`` identifies the file that was read."""

    def __init__(self, reason, stat=None):
        super().__init__(reason)
        self.stat = stat


def _write_entry(path, key, binary):
    header = _HEADER.pack(_MAGIC, bytes.fromhex(key), hashlib.sha256(binary).digest(),
                          len(binary))
    atomic_write(path, header + binary)  # readers see the old file or the whole new one


def _same_file(a, b):
    return a is not None and b is not None and (a.st_dev, a.st_ino, a.st_size,
                                                a.st_mtime_ns) == (b.st_dev, b.st_ino,
                                                                   b.st_size, b.st_mtime_ns)


def _discard(path, stat=None):
    """Remove the damaged file at ``path`` -- unless another process has meanwhile
    renamed a fresh entry into its place (``stat`` is the damaged file's)."""
    try:
        if stat is not None and not _same_file(os.stat(path), stat):
            return
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass


def _build_from_source(context, device, source, options):
    # The raw program type bypasses pyopencl's own binary cache: this module is the cache.
    program = cl._cl._Program(context, source)
    try:
        # Drivers (NVIDIA's among them) print informational build logs for correct
        # kernels; pyopencl would turn each into a CompilerWarning for the user.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            program.build(" ".join(options).encode(), [device])
    except cl.Error as exc:
        try:
            log = program.get_build_info(device, cl.program_build_info.LOG)
        except cl.Error:
            log = ""
        raise KernelBuildError(
            f"OpenCL build failed on {device.name.strip()!r}: {exc}", build_log=log or str(exc),
            source=source, options=options) from None
    return cl.Program(program)


def _build_from_binary(context, device, binary, options):
    program = cl.Program(context, [device], [binary])
    with warnings.catch_warnings():   # (build logs, as in _build_from_source)
        warnings.simplefilter("ignore", cl.CompilerWarning)
        program.build(" ".join(options), [device])
    return program


def get_program(context, device, source, options=()):
    """A built ``pyopencl.Program`` for ``source`` on ``device``, from memory, disk, or
    a fresh build (which is then stored)."""
    options = tuple(options)
    key = program_key(source, options, device)
    mem_key = (context.int_ptr, device.int_ptr, key)
    with _lock:
        program = _memory.get(mem_key)
        if program is not None:
            stats["memory_hits"] += 1
            return program

    # (off as PYSPMV_CL_NO_CACHE is on: 0, false, no, off; "false" stored them before)
    binaries = os.environ.get(BINARIES_ENV, "").strip().lower() not in ("0", "false", "no",
                                                                         "off")
    root = cache_dir() if binaries else None
    path = _entry_path(root, key) if root is not None else None
    program = None
    if path is not None:
        stat = None
        try:
            binary, stat = _load_entry(path, key)
            if binary is not None:
                program = _build_from_binary(context, device, binary, options)
                stats["disk_hits"] += 1
        except (ValueError, cl.Error) as exc:
            stats["disk_errors"] += 1
            warn_once(("kernel cache", "bad", str(root)),
                      f"pyspmv_cl: discarding unusable cached kernel {path} ({exc}); "
                      "rebuilding (further damaged entries in this cache are replaced "
                      "silently)")
            _discard(path, getattr(exc, "stat", None) or stat)
            program = None
        except OSError as exc:
            stats["disk_errors"] += 1
            warn_once(("kernel cache", "dir", str(root)),
                      f"pyspmv_cl: kernel cache {root} unusable ({exc}); kernels "
                      "it cannot serve are kept in the in-memory cache only (said once "
                      "for this folder)")

    if program is None:
        program = _build_from_source(context, device, source, options)
        stats["builds"] += 1
        if path is not None:
            try:
                binaries = program.get_info(cl.program_info.BINARIES)
                if binaries and binaries[0]:
                    _write_entry(path, key, bytes(binaries[0]))
            except (OSError, cl.Error) as exc:
                stats["disk_errors"] += 1
                warn_once(("kernel cache", "dir", str(root)),
                          f"pyspmv_cl: cannot write the kernel cache in {root} ({exc}); "
                          "kernels it cannot take are kept in the in-memory cache only "
                          "(said once for this folder)")

    with _lock:
        # Keep the context alive with the program so its int_ptr cannot be reused.
        _memory.setdefault(mem_key, program)
        return _memory[mem_key]
