"""The persistent tuning database: one JSON file per (device, matrix, dtype) key.

Location: ``PYSPMV_CL_TUNING_DIR`` if set, else ``tuning-v1/`` inside the kernel cache
directory (``PYSPMV_CL_CACHE_DIR`` or the user cache directory; ``PYSPMV_CL_NO_CACHE=1``
turns the disk layer off, leaving a per-process memory layer).

The key hashes the device identity (platform, device, driver and every profile field,
so an overridden profile is a different device), the matrix fingerprint (shape, nnz,
row-length statistics, a hash of indptr/indices) and the dtype.  An entry stores every
candidate measured (kernel and conversion seconds), so a caller with another
``expected_calls`` re-decides from it without timing anything.

Files are written to a temporary file renamed into place, so concurrent processes only
ever see whole files (the last writer of a key wins).  An entry that does not parse,
has another key, or comes from another package version or format set is ignored
(damaged ones with one warning) and re-tuned; an unwritable directory leaves the
memory layer only, with one warning.
"""

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

from .. import cache
from .._version import __version__

TUNING_DIR_ENV = "PYSPMV_CL_TUNING_DIR"
SCHEMA = 1

_memory = {}
_lock = threading.Lock()

#: Counters for tests and diagnostics.
stats = {"hits": 0, "misses": 0, "writes": 0, "ignored": 0, "errors": 0}


def database_dir():
    """The directory of the tuning database, or None when the disk layer is off."""
    configured = os.environ.get(TUNING_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    root = cache.cache_dir()
    return root / "tuning-v1" if root is not None else None


def device_identity(profile):
    """Strings naming the device and everything the choice depends on."""
    fields = dataclasses.asdict(profile)
    return [*profile.identity(), json.dumps(fields, sort_keys=True, default=str)]


def format_set():
    from ..formats import FORMATS
    return sorted(FORMATS)


def entry_key(profile, fingerprint, dtype):
    h = hashlib.sha256()
    for part in (*device_identity(profile), json.dumps(fingerprint, sort_keys=True),
                 str(dtype), str(SCHEMA)):
        h.update(part.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def _path(root, key):
    return root / key[:2] / f"{key}.json"


def clear_memory():
    with _lock:
        _memory.clear()


def _valid(entry, key):
    """None when ``entry`` is usable for ``key``, else why not."""
    if not isinstance(entry, dict) or entry.get("key") != key:
        return "damaged"
    if entry.get("schema") != SCHEMA or entry.get("package") != __version__:
        return "stale"
    if entry.get("formats") != format_set():
        return "stale"
    candidates = entry.get("candidates")
    if not isinstance(candidates, list) or not any(
            isinstance(c, dict) and isinstance(c.get("kernel_seconds"), (int, float))
            and isinstance(c.get("format"), str) and isinstance(c.get("params"), dict)
            for c in candidates):
        return "damaged"
    return None


def load(key):
    """The stored entry for ``key`` (a dict), or None."""
    with _lock:
        entry = _memory.get(key)
    if entry is not None:
        stats["hits"] += 1
        return entry
    root = database_dir()
    if root is None:
        stats["misses"] += 1
        return None
    path = _path(root, key)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        stats["misses"] += 1
        return None
    except OSError as exc:
        stats["errors"] += 1
        cache._warn_once(("tuning-dir", str(root)),
                         f"pyspmv_cl: tuning database {root} unreadable ({exc}); tuning anew")
        return None
    try:
        entry = json.loads(text)
    except ValueError:
        entry = None
    why = _valid(entry, key)
    if why is not None:
        stats["ignored"] += 1
        if why == "damaged":
            cache._warn_once(("tuning-bad", str(path)),
                             f"pyspmv_cl: ignoring damaged tuning entry {path}; re-tuning")
        return None
    stats["hits"] += 1
    with _lock:
        _memory[key] = entry
    return entry


def store(key, entry):
    """Remember ``entry`` in memory and, where possible, on disk (atomically)."""
    entry = dict(entry, key=key, schema=SCHEMA, package=__version__, formats=format_set())
    with _lock:
        _memory[key] = entry
    root = database_dir()
    if root is None:
        return None
    path = _path(root, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(entry, fh, indent=1, sort_keys=True, default=str)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        stats["errors"] += 1
        cache._warn_once(("tuning-dir", str(root)),
                         f"pyspmv_cl: cannot write the tuning database in {root} ({exc}); "
                         "decisions are kept in memory only")
        return None
    stats["writes"] += 1
    return path


def forget(key):
    """Drop ``key`` from the memory layer (a forced re-tune then overwrites the file)."""
    with _lock:
        _memory.pop(key, None)
