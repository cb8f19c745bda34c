"""The persistent tuning database: one JSON file per (device, matrix, dtype) key.

Location: ``PYSPMV_CL_TUNING_DIR`` if set, else ``tuning-v1/`` inside the kernel cache
directory (``PYSPMV_CL_CACHE_DIR`` or the user cache directory; ``PYSPMV_CL_NO_CACHE=1``
turns the disk layer off, leaving a per-process memory layer).

The key hashes the device identity (platform, device, driver and every profile field,
so an overridden profile is a different device), the matrix fingerprint (shape, nnz,
row-length statistics, a hash of indptr/indices; for products of k > 1 vectors the
class of k, ``block_class``, which the tuner adds only then, so a single-vector key is
the one entries had before block sizes) and the dtype.  An entry stores every
candidate measured (kernel and conversion seconds), so a caller with another
``expected_calls`` re-decides from it without timing anything.

Entries are kept by :class:`pyspmv_cl.store.JsonStore`: files are written to a
temporary file renamed into place, so concurrent processes only ever see whole files
(the last writer of a key wins).  An entry that does not parse,
has another key, or comes from another package version or format set is ignored
(damaged ones with one warning) and re-tuned; an unwritable directory leaves the
memory layer only, with one warning.
"""

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

from .._version import __version__
from ..formats import FORMATS
from ..store import JsonStore, cache_dir, disk_off

TUNING_DIR_ENV = "PYSPMV_CL_TUNING_DIR"
SCHEMA = 1


def database_dir():
    """The directory of the tuning database, or None when the disk layer is off
    (``PYSPMV_CL_NO_CACHE`` wins over ``PYSPMV_CL_TUNING_DIR``, as README says)."""
    if disk_off():
        return None
    configured = os.environ.get(TUNING_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    root = cache_dir()
    return root / "tuning-v1" if root is not None else None


def device_identity(profile):
    """Strings naming the device and everything the choice depends on."""
    fields = dataclasses.asdict(profile)
    return [*profile.identity(), json.dumps(fields, sort_keys=True, default=str)]


def format_set():
    return sorted(FORMATS)


def _digest(parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def prefix_key(profile, fingerprint, dtype):
    """The first part of an entry's key: device, dtype and the fingerprint without its
    structure hash.  Entries sharing it lie side by side (see :func:`may_hold`)."""
    cheap = {k: v for k, v in fingerprint.items() if k != "structure_sha256"}
    return _digest([*device_identity(profile), json.dumps(cheap, sort_keys=True),
                    str(dtype), str(SCHEMA)])[:16]


def entry_key(profile, fingerprint, dtype):
    """``<prefix>-<hash of everything>``: the key of one (device, matrix, dtype)."""
    full = _digest([*device_identity(profile), json.dumps(fingerprint, sort_keys=True),
                    str(dtype), str(SCHEMA)])
    return f"{prefix_key(profile, fingerprint, dtype)}-{full}"


def may_hold(prefix):
    """False when no entry's key starts with ``prefix``: the database then cannot hold
    the matrix, and its structure need not be hashed to look it up."""
    return _store.has_prefix(prefix + "-")


def _valid(entry, key):
    """None when ``entry`` is usable for ``key``, else why not."""
    if not isinstance(entry, dict) or entry.get("key") != key:
        return "damaged"
    if entry.get("schema") != SCHEMA or entry.get("package") != __version__:
        return "stale"
    if entry.get("formats") != format_set():
        return "stale"
    candidates = entry.get("candidates")
    # Every candidate, not only one: a later pick compares them all (one null time
    # raised a TypeError in every process until the file was deleted).
    if not isinstance(candidates, list) or not candidates or not all(
            isinstance(c, dict) and _seconds(c.get("kernel_seconds"))
            and isinstance(c.get("format"), str) and isinstance(c.get("params"), dict)
            and _seconds(c.get("conversion_seconds"), zero=True)   # (expected_calls adds it)
            and isinstance(c.get("resolved", {}), dict)
            and isinstance(c.get("product", ""), str)
            for c in candidates):
        return "damaged"
    # The entry's other fields that a lookup reads (a wrong type raised a TypeError in
    # every process that looked the matrix up, as a candidate's did)
    block_size = entry.get("block_size", 1)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        return "damaged"
    skipped = entry.get("skipped", [])
    if not isinstance(skipped, list) or not all(
            isinstance(s, (list, tuple)) and len(s) == 2
            and all(isinstance(part, str) for part in s) for s in skipped):
        return "damaged"
    if entry.get("tuning_seconds") is not None and \
            not _seconds(entry["tuning_seconds"], zero=True):
        return "damaged"
    return None


def _seconds(value, zero=False) -> bool:
    """Whether ``value`` is a time a stored entry may hold: a finite number, positive
    (or zero where ``zero``), not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        return False
    return value >= 0 if zero else value > 0


_store = JsonStore(database_dir, _valid, label="tuning database", entry_label="tuning entry",
                   fallback="re-tuning", memory_note="decisions are kept in memory only")

#: Counters for tests and diagnostics (hits, misses, writes, ignored, errors).
stats = _store.stats
clear_memory = _store.clear_memory


def load(key):
    """The stored entry for ``key`` (a dict), or None."""
    return _store.load(key)


def store(key, entry):
    """Remember ``entry`` in memory and, where possible, on disk (atomically).  Returns
    the file's path, or None when it is kept in memory only."""
    entry = dict(entry, key=key, schema=SCHEMA, package=__version__, formats=format_set())
    return _store.store(key, entry)


def discard(key):
    """Drop ``key`` from memory and from disk (a stored choice that cannot be used)."""
    _store.discard(key)


def forget(key):
    """Drop ``key`` from the memory layer (a forced re-tune then overwrites the file)."""
    _store.forget(key)
