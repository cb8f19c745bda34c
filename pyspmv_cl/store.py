"""The small persistent store shared by the kernel cache, the tuning database and the
CSR5 bounds: the cache root directory, one warning per problem, atomic whole-file
writes, tolerant JSON reads and a JSON key -> entry store with a memory layer.

Writes go to a temporary file in the target directory renamed into place, so readers
in other processes see the old file or the whole new one, never a part; concurrent
writers of one key race and the last rename wins (callers treat entries as caches of
something they can recompute).
"""

import json
import os
import tempfile
import threading
import warnings
from pathlib import Path

import platformdirs

CACHE_DIR_ENV = "PYSPMV_CL_CACHE_DIR"
NO_CACHE_ENV = "PYSPMV_CL_NO_CACHE"

_warned = set()
_warned_lock = threading.Lock()

#: Returned by :func:`read_json` for a missing file when asked to tell it from garbage.
MISSING = object()


def disk_off() -> bool:
    """Whether ``PYSPMV_CL_NO_CACHE`` turns every store on disk off: any value but
    empty, 0, false, no and off (as ``PYSPMV_CL_CACHE_BINARIES`` reads them)."""
    return os.environ.get(NO_CACHE_ENV, "").strip().lower() not in ("", "0", "false", "no",
                                                                     "off")


def cache_dir():
    """The root of every on-disk store, or None when disk storage is disabled."""
    if disk_off():
        return None
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_cache_dir("pyspmv_cl", appauthor=False))


def warn_once(tag, message, stacklevel=3):
    """Emit ``message`` as a RuntimeWarning the first time ``tag`` is seen in this
    process (a damaged directory would otherwise warn once per entry)."""
    with _warned_lock:
        if tag in _warned:
            return
        _warned.add(tag)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def _read_umask():
    """The process's umask.  POSIX offers no way to read it but setting it, so it is
    set and put back at once: read once, when this module is imported (a thread that
    created a file in between would see the umask 0o022 for that moment)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The mode new files get: what ``open()`` would give them (0o666 less the umask read
#: at import), not ``tempfile.mkstemp``'s 0o600, so that a cache or tuning directory
#: shared between users stays readable by those the umask lets read it.
FILE_MODE = 0o666 & ~_read_umask()


def atomic_write(path, data):
    """Write ``data`` (bytes) to ``path`` through a temporary file renamed into place,
    with the mode :data:`FILE_MODE`; on any failure the temporary file is removed and
    the error raised."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            os.chmod(tmp, FILE_MODE)
        except OSError:   # a file system without modes: the file still serves this user
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path, obj):
    """:func:`atomic_write` of ``obj`` as JSON (non-JSON values as their str())."""
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True, default=str).encode("utf-8"))


def read_json(path, missing=None):
    """The JSON value in ``path``; None when it does not parse, ``missing`` when the
    file does not exist.  Other I/O errors (permissions, a file where a directory
    should be) are raised."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return missing
    try:
        return json.loads(data)
    except ValueError:  # includes UnicodeDecodeError
        return None


def _writable_dir(root):
    """Whether ``root`` is a directory this process may create files in."""
    try:
        return os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK)
    except (OSError, ValueError):
        return False


class JsonStore:
    """JSON entries keyed by a hex digest, one file each under ``root()/ab/<key>.json``,
    with a per-process memory layer in front.

    ``root`` is called on each access (the environment may move it) and returns a
    directory or None (memory only).  ``validate(entry, key)`` returns None for a
    usable entry, ``"stale"`` for one to ignore silently (another version wrote it) or
    ``"damaged"`` for one to ignore with a warning.  Damaged entries warn once per
    file; an unreadable or unwritable directory warns once (one warning per root, that
    says what fails: a root that is a file reads as empty, and its first store warns)
    and leaves the memory layer.  ``stats`` counts hits, misses, writes, ignored
    entries and I/O errors.
    """

    def __init__(self, root, validate, *, label, entry_label, fallback, memory_note):
        self._root = root
        self._validate = validate
        self._memory = {}
        self._lock = threading.Lock()
        self.label, self.entry_label = label, entry_label
        self.fallback, self.memory_note = fallback, memory_note
        self.stats = {"hits": 0, "misses": 0, "writes": 0, "ignored": 0, "errors": 0}

    def _count(self, what):
        with self._lock:
            self.stats[what] += 1

    @staticmethod
    def path(root, key):
        return root / key[:2] / f"{key}.json"

    def _mem_key(self, root, key):
        # Per directory, so pointing the store elsewhere never serves another's entries.
        return (None if root is None else str(root), key)

    def load(self, key):
        """The usable entry for ``key``, or None."""
        root = self._root()
        mem_key = self._mem_key(root, key)
        with self._lock:
            entry = self._memory.get(mem_key)
        if entry is not None:
            self._count("hits")
            return entry
        if root is None:
            self._count("misses")
            return None
        path = self.path(root, key)
        try:
            entry = read_json(path, missing=MISSING)
        except NotADirectoryError:
            # A file where the directory (or its ab/ part) should be holds no entry:
            # a miss, as for a missing directory.  Storing fails there too, and says
            # so, once per root: warning here as well made two warnings, this one
            # wrongly promising a fallback ("re-tuning") that the miss causes anyway.
            self._count("errors")
            return None
        except OSError as exc:
            self._count("errors")
            if _writable_dir(root):   # an unreadable entry: the next store replaces it
                warn_once((self.label, "dir", str(root)),
                          f"pyspmv_cl: {self.label} {root} unreadable ({exc}); "
                          f"{self.fallback}", stacklevel=4)
            else:   # neither read nor written: one warning, under store()'s tag
                warn_once((self.label, "write", str(root)),
                          f"pyspmv_cl: cannot read or write the {self.label} in {root} "
                          f"({exc}); {self.fallback}, and {self.memory_note}",
                          stacklevel=4)
            return None
        if entry is MISSING:
            self._count("misses")
            return None
        why = self._validate(entry, key)
        if why is not None:
            self._count("ignored")
            if why == "damaged":
                warn_once((self.label, "bad", str(path)),
                          f"pyspmv_cl: ignoring damaged {self.entry_label} {path}; "
                          f"{self.fallback}", stacklevel=4)
            return None
        self._count("hits")
        with self._lock:
            self._memory[mem_key] = entry
        return entry

    def store(self, key, entry):
        """Remember ``entry`` in memory and, where possible, on disk.  Returns the
        file's path, or None when it stayed in memory."""
        root = self._root()
        with self._lock:
            self._memory[self._mem_key(root, key)] = entry
        if root is None:
            return None
        path = self.path(root, key)
        try:
            write_json(path, entry)
        except OSError as exc:
            self._count("errors")
            # (not the tag of an unreadable entry's warning, which said nothing of
            # decisions that are not stored either; load() warns under this one only
            # when it said that the directory cannot be written)
            warn_once((self.label, "write", str(root)),
                      f"pyspmv_cl: cannot write the {self.label} in {root} ({exc}); "
                      f"{self.memory_note}", stacklevel=4)
            return None
        self._count("writes")
        return path

    def has_prefix(self, prefix):
        """Whether an entry whose key starts with ``prefix`` may exist (in memory, or a
        file in the prefix's directory; an unreadable directory counts as may)."""
        root = self._root()
        where = self._mem_key(root, "")[0]
        with self._lock:
            if any(r == where and k.startswith(prefix) for r, k in self._memory):
                return True
        if root is None:
            return False
        try:
            with os.scandir(self.path(root, prefix).parent) as entries:
                return any(e.name.startswith(prefix) and e.name.endswith(".json")
                           for e in entries)
        except (FileNotFoundError, NotADirectoryError):   # (a file: it holds no entry)
            return False
        except OSError:
            return True

    def forget(self, key):
        """Drop ``key`` from the memory layer (the file, if any, stays)."""
        with self._lock:
            for mem_key in [k for k in self._memory if k[1] == key]:
                del self._memory[mem_key]

    def discard(self, key):
        """Drop ``key`` from memory and its file from disk (an entry known to be unusable:
        otherwise every process would meet it again); a file that cannot be removed
        stays, and is met again."""
        self.forget(key)
        root = self._root()
        if root is None:
            return
        try:
            os.remove(self.path(root, key))
        except OSError:   # gone already, or not ours to remove
            pass

    def clear_memory(self):
        with self._lock:
            self._memory.clear()
