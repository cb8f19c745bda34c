"""The persistent-store helper on its own (no OpenCL): atomic writes leave no
temporary file behind, damaged JSON is ignored with one warning, an unwritable
directory leaves a memory-only store with one warning, the root follows the
environment."""

import errno
import json
import os
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
    # One warning for reading, one for writing (the second says the entries are kept
    # in memory only: it was swallowed by the first, which shared its tag)
    found = runtime_warnings(caught, "unwritable store")
    assert len(found) == 2 and all(str(root) in f for f in found), found
    assert sum("unreadable" in f for f in found) == 1
    assert sum("cannot write" in f for f in found) == 1
    assert s.stats["writes"] == 0 and s.stats["errors"] == 6


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
