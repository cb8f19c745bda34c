"""The persistent-store helper on its own (no OpenCL): atomic writes leave no
temporary file behind, damaged JSON is ignored with one warning, an unwritable
directory leaves a memory-only store with one warning, the root follows the
environment."""

import errno
import json
import os
import stat
import warnings

import pytest

from pyspmv_cl import store


def runtime_warnings(caught, text):
    return [str(w.message) for w in caught
            if issubclass(w.category, RuntimeWarning) and text in str(w.message)]


def make_store(root, label="test store"):
    def valid(entry, key):
        if not isinstance(entry, dict) or entry.get("key") != key:
            return "damaged"
        return "stale" if entry.get("version") != 1 else None
    # A fresh label per store: warnings are once per process and tag.
    return store.JsonStore(lambda: root, valid, label=label, entry_label=f"{label} entry",
                           fallback="recomputing", memory_note="kept in memory only")


KEY = "ab" + "0" * 62


@pytest.mark.parametrize("fail_at", ["create", "write", "rename"])
def test_atomic_write_leaves_no_temporary_on_failure(tmp_path, monkeypatch, fail_at):
    path = tmp_path / "sub" / "entry.bin"
    store.atomic_write(path, b"old contents")

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if fail_at == "create":
        monkeypatch.setattr(store.tempfile, "mkstemp", fail)
    elif fail_at == "write":
        real_fdopen = os.fdopen

        class Full:
            def __init__(self, fh):
                self.fh = fh

            def write(self, data):
                self.fh.write(data[:3])
                fail()

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.fh.close()

        monkeypatch.setattr(store.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    else:
        monkeypatch.setattr(store.os, "replace", fail)
    with pytest.raises(OSError):
        store.atomic_write(path, b"new contents, never seen")
    monkeypatch.undo()
    assert path.read_bytes() == b"old contents"
    assert os.listdir(path.parent) == ["entry.bin"]


def test_write_and_read_json(tmp_path):
    path = tmp_path / "a" / "b.json"
    assert store.read_json(path) is None
    assert store.read_json(path, missing="gone") == "gone"
    store.write_json(path, {"x": [1, 2], "p": tmp_path})
    assert store.read_json(path) == {"x": [1, 2], "p": str(tmp_path)}
    for garbage in (b"", b"{not json", b"\xff\xfe\x00garbage"):
        path.write_bytes(garbage)
        assert store.read_json(path) is None


def test_store_round_trip_and_memory_layer(tmp_path):
    s = make_store(tmp_path, "round-trip store")
    assert s.load(KEY) is None
    path = s.store(KEY, {"key": KEY, "version": 1, "value": 7})
    assert path == tmp_path / "ab" / f"{KEY}.json"
    assert json.loads(path.read_text())["value"] == 7
    path.unlink()
    assert s.load(KEY)["value"] == 7              # served from memory
    s.clear_memory()
    assert s.load(KEY) is None
    s.store(KEY, {"key": KEY, "version": 1, "value": 8})
    s.forget(KEY)
    assert s.load(KEY)["value"] == 8              # read back from the file
    assert s.stats == {"hits": 2, "misses": 2, "writes": 2, "ignored": 0, "errors": 0}


def test_damaged_entries_ignored_with_one_warning(tmp_path):
    s = make_store(tmp_path, "damaged store")
    path = s.store(KEY, {"key": KEY, "version": 1})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for damage in ("{not json", "", json.dumps({"key": "other", "version": 1}), "[1, 2]"):
            path.write_text(damage)
            s.clear_memory()
            assert s.load(KEY) is None
        path.write_text(json.dumps({"key": KEY, "version": 0}))   # stale: silent
        s.clear_memory()
        assert s.load(KEY) is None
    assert len(runtime_warnings(caught, "damaged")) == 1
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert s.stats["ignored"] == 5


def test_unwritable_directory_falls_back_to_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store's directory should be")
    root = blocker / "store"           # mkdir fails even for root
    s = make_store(root, "unwritable store")
    keys = [f"{i:02x}" + "1" * 62 for i in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in keys:
            assert s.load(k) is None   # reading fails too (not a directory)
            assert s.store(k, {"key": k, "version": 1}) is None
        assert all(s.load(k) == {"key": k, "version": 1} for k in keys)
    # One warning, that the entries are kept in memory only (reading under a file
    # finds nothing, as in a missing directory: it warned "unreadable ...;
    # recomputing" too before, which was no news)
    found = runtime_warnings(caught, "unwritable store")
    assert len(found) == 1 and str(root) in found[0], found
    assert "cannot write" in found[0] and "kept in memory only" in found[0]
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert s.stats["writes"] == 0 and s.stats["errors"] == 6


def test_root_that_is_a_file_warns_once(tmp_path):
    """A store whose directory is a regular file (PYSPMV_CL_TUNING_DIR naming one):
    it may hold nothing (no structure hash is spent on a lookup), a lookup is a miss,
    and the first store says, once, that entries stay in memory.  The lookup warned
    "unreadable ...; recomputing" before the store's warning: two, one wrong."""
    root = tmp_path / "file"
    root.write_text("a file, not a directory")
    s = make_store(root, "file-root store")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not s.has_prefix(KEY[:8])
        assert s.load(KEY) is None
        assert s.store(KEY, {"key": KEY, "version": 1}) is None
        assert s.load(KEY) == {"key": KEY, "version": 1}
        assert s.store(KEY[::-1], {"key": KEY[::-1], "version": 1}) is None
    found = [str(w.message) for w in caught]
    assert len(found) == 1 and "cannot write" in found[0] and str(root) in found[0], found
    assert root.read_text() == "a file, not a directory"


def test_unreadable_unwritable_directory_warns_once(tmp_path, monkeypatch):
    """A directory that can be neither read nor written (no search permission): one
    warning that says both."""
    root = tmp_path / "closed"
    s = make_store(root, "closed store")
    s.store(KEY, {"key": KEY, "version": 1})
    s.clear_memory()

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    # (as chmod 0 would do, for root too)
    monkeypatch.setattr(store.Path, "read_bytes", denied)
    monkeypatch.setattr(store.Path, "mkdir", denied)
    monkeypatch.setattr(store.os, "access", lambda *args, **kwargs: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert s.load(KEY) is None
        assert s.store(KEY, {"key": KEY, "version": 1}) is None
    found = [str(w.message) for w in caught]
    assert len(found) == 1 and "cannot read or write" in found[0], found
    assert "recomputing" in found[0] and "kept in memory only" in found[0]


def test_new_files_take_the_mode_the_umask_gives(tmp_path, monkeypatch):
    """Files are written 0o666 less the umask (read once, at import), as open()
    would make them, so that a directory shared between users stays readable; they
    were 0o600 (tempfile.mkstemp's) whatever the umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    path = tmp_path / "a" / "entry.json"
    store.write_json(path, {"x": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    for mode in (0o644, 0o640, 0o664):   # the umask that import read
        monkeypatch.setattr(store, "FILE_MODE", mode)
        store.atomic_write(path, b"again")
        assert stat.S_IMODE(path.stat().st_mode) == mode
        assert path.read_bytes() == b"again"
    assert os.listdir(path.parent) == ["entry.json"]


def test_memory_only_when_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv(store.CACHE_DIR_ENV, str(tmp_path / "c"))
    monkeypatch.delenv(store.NO_CACHE_ENV, raising=False)
    assert store.cache_dir() == tmp_path / "c"
    monkeypatch.setenv(store.NO_CACHE_ENV, "1")
    assert store.cache_dir() is None
    s = store.JsonStore(store.cache_dir, lambda e, k: None, label="off store",
                        entry_label="e", fallback="f", memory_note="m")
    assert s.store(KEY, {"v": 1}) is None and s.load(KEY) == {"v": 1}
    assert not (tmp_path / "c").exists()
