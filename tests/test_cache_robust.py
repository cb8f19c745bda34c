"""The kernel cache under abuse: several processes compiling the same and different
keys at once, a read-only or full file system (simulated by failing the writes, so the
tests also hold when run as root), damaged and foreign files of every kind, entries
of another package version.  Each time the library keeps working, never loads a wrong
binary and warns once (tests/test_cache.py covers the ordinary behaviour)."""

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pyopencl as cl
import pytest
import scipy.sparse as sp
from conftest import DEVICES, assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl import cache, store

SOURCE = """
__kernel void scale_add(__global float *a, const float b)
{
    const size_t i = get_global_id(0);
    a[i] = a[i] * SCALE + b;
}
"""


def source(scale):
    """A distinct program (and cache key) per scale, whose result says which it is."""
    return f"#define SCALE {float(scale)!r}f\n" + SOURCE


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    for dev in psc.devices():
        _ = dev.profile  # probe kernels built before the cache directory changes
    root = tmp_path / "kernel-cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(root))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    monkeypatch.setenv(cache.BINARIES_ENV, "1")   # conftest turns binaries off
    cache.clear_memory()
    yield root
    cache.clear_memory()


def entries(root):
    return sorted(p for p in root.rglob("*.bin") if not p.name.startswith(".tmp-")) \
        if root.exists() else []


def temporaries(root):
    return sorted(root.rglob(".tmp-*")) if root.exists() else []


def get(device, scale):
    return cache.get_program(device.context, device.cl_device, source(scale))


def run_kernel(device, program, scale):
    """The program computes a * scale + 0.5: checks it is the right binary, working."""
    a = np.arange(32, dtype=np.float32)
    buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=a)
    kernel = program.all_kernels()[0]
    kernel(device.queue, (a.size,), None, buf, np.float32(0.5))
    out = np.empty_like(a)
    cl.enqueue_copy(device.queue, out, buf)
    np.testing.assert_allclose(out, a * np.float32(scale) + 0.5, rtol=1e-6)


def recorded():
    ctx = warnings.catch_warnings(record=True)
    record = ctx.__enter__()
    warnings.simplefilter("always")
    return ctx, record


def runtime_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


# ---------------------------------------------------------------- several processes

CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import pyopencl as cl
    import pyspmv_cl as psc
    from pyspmv_cl import cache
    import warnings
    warnings.simplefilter("always")
    index, start_at, device_id = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    dev = psc.get_device(device_id)
    _ = dev.profile
    base = dict(cache.stats)  # the probe kernel's build is not counted
    src = open(sys.argv[4]).read()
    while time.time() < start_at:
        time.sleep(0.001)
    ok = True
    with warnings.catch_warnings(record=True) as record:
        # Rounds of: the shared keys (every process), a key of its own, and the shared
        # keys again from disk (memory cleared), racing the other writers.
        for rnd in range(3):
            for scale in (2, 3, 100 + index):
                cache.clear_memory()
                prog = cache.get_program(dev.context, dev.cl_device,
                                         f"#define SCALE {float(scale)!r}f\\n" + src)
                a = np.arange(32, dtype=np.float32)
                buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE
                                | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
                prog.all_kernels()[0](dev.queue, (32,), None, buf, np.float32(0.5))
                out = np.empty_like(a)
                cl.enqueue_copy(dev.queue, out, buf)
                ok &= bool(np.allclose(out, a * scale + 0.5))
    stats = {k: v - base[k] for k, v in cache.stats.items()}
    print(json.dumps({"ok": ok, "stats": stats,
                      "warnings": [str(w.message) for w in record]}))
""")


@pytest.mark.parametrize("n_procs", [4])
def test_processes_compile_same_and_different_keys_at_once(device, tmp_path, cache_root,
                                                           n_procs):
    if device is not DEVICES[0]:
        pytest.skip("file-system behaviour: the first device is enough")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    kernel_source = tmp_path / "kernel.cl"
    kernel_source.write_text(SOURCE)
    env = dict(os.environ, POCL_KERNEL_CACHE="0")
    env[cache.CACHE_DIR_ENV] = str(cache_root)
    env.pop(cache.NO_CACHE_ENV, None)
    start_at = time.time() + 4.0  # after every child has imported and probed
    procs = [subprocess.Popen([sys.executable, str(script), str(i), repr(start_at), device.id,
                               str(kernel_source)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(n_procs)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for report in reports:
        assert report["ok"], report
        assert report["stats"]["disk_errors"] == 0, report
        assert not report["warnings"], report
        assert report["stats"]["builds"] + report["stats"]["disk_hits"] == 9
    # 2 shared keys + one per process (+ the SIMD-width probe kernel), every file whole
    # and loadable, no temporaries.
    files = entries(cache_root)
    scales = (2, 3, *(100 + i for i in range(n_procs)))
    expected = {cache._entry_path(cache_root, cache.program_key(source(s), (),
                                                                device.cl_device))
                for s in scales}
    assert expected <= set(files) and len(set(files) - expected) <= 1
    assert not temporaries(cache_root)
    for path in files:
        assert cache._read_entry(path, path.stem)
    cache.clear_memory()
    before = dict(cache.stats)
    for scale in scales:
        run_kernel(device, get(device, scale), scale)
    assert cache.stats["disk_hits"] - before["disk_hits"] == 2 + n_procs
    assert cache.stats["builds"] == before["builds"]


# ------------------------------------------------------- unwritable and full disks


def failing_write(monkeypatch, error_number, after_bytes=None):
    """Make the cache's writes fail with ``error_number``: at once (read-only file
    system: creating the temporary file fails) or after ``after_bytes`` bytes of it
    were written (disk full part-way through)."""
    if after_bytes is None:
        def mkstemp(*args, **kwargs):
            raise OSError(error_number, os.strerror(error_number))
        monkeypatch.setattr(store.tempfile, "mkstemp", mkstemp)
        return

    real_fdopen = os.fdopen

    class Filling:
        def __init__(self, fh):
            self.fh, self.left = fh, after_bytes

        def write(self, data):
            if len(data) > self.left:
                self.fh.write(data[:self.left])
                self.left = 0
                raise OSError(error_number, os.strerror(error_number))
            self.left -= len(data)
            return self.fh.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(store.os, "fdopen", lambda fd, mode: Filling(real_fdopen(fd, mode)))


@pytest.mark.parametrize("failure", ["read-only", "full-at-once", "full-part-way"])
def test_unwritable_cache_keeps_working_and_warns_once(device, cache_root, monkeypatch,
                                                       failure):
    # A valid entry from before the disk filled up / was remounted read-only.
    run_kernel(device, get(device, 2), 2)
    (old,) = entries(cache_root)
    cache.clear_memory()
    if failure == "read-only":
        failing_write(monkeypatch, errno.EROFS)
    elif failure == "full-at-once":
        failing_write(monkeypatch, errno.ENOSPC, after_bytes=0)
    else:
        failing_write(monkeypatch, errno.ENOSPC, after_bytes=cache._HEADER.size + 100)
    ctx, record = recorded()
    try:
        before = dict(cache.stats)
        run_kernel(device, get(device, 2), 2)          # still served from disk
        for scale in (3, 4, 5):                        # new keys: built, not stored
            run_kernel(device, get(device, scale), scale)
        cache.clear_memory()
        for scale in (3, 4):                           # and built again, still fine
            run_kernel(device, get(device, scale), scale)
    finally:
        ctx.__exit__(None, None, None)
    found = runtime_warnings(record)
    assert len(found) == 1, found
    assert "in-memory cache only" in found[0] and str(cache_root) in found[0]
    assert cache.stats["disk_hits"] - before["disk_hits"] == 1
    assert cache.stats["builds"] - before["builds"] == 5
    # Nothing half-written is left where a reader could find it.
    assert entries(cache_root) == [old] and not temporaries(cache_root)


def test_full_disk_under_spmv(device, cache_root, monkeypatch, rng):
    failing_write(monkeypatch, errno.ENOSPC, after_bytes=cache._HEADER.size)
    A = sp.random(200, 150, density=0.05, format="csr", random_state=rng, dtype=np.float32)
    x = rng.standard_normal(150).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="in-memory cache only") as record:
        for fmt in ("csr-vector", "coo", "hyb"):
            if fmt in psc.formats():
                y = psc.SpMV(A, format=fmt, device=device) @ x
                assert_close(y, reference(A, x), A, x, np.float32)
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1
    assert not entries(cache_root) and not temporaries(cache_root)


def test_unreadable_entries(device, cache_root, monkeypatch):
    """An I/O error reading an entry (EIO, EACCES): rebuilt, one warning."""
    run_kernel(device, get(device, 2), 2)
    run_kernel(device, get(device, 3), 3)
    cache.clear_memory()
    real_open = open

    def failing_open(path, *args, **kwargs):
        if str(path).endswith(".bin") and "rb" in args:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cache, "open", failing_open, raising=False)
    ctx, record = recorded()
    try:
        run_kernel(device, get(device, 2), 2)
        run_kernel(device, get(device, 3), 3)
    finally:
        ctx.__exit__(None, None, None)
    found = runtime_warnings(record)
    assert len(found) == 1 and "unusable" in found[0], found
    assert len(entries(cache_root)) == 2


# ------------------------------------------------------------ damaged, foreign files


def test_directory_of_garbage(device, cache_root, rng):
    """Every entry damaged in a different way, plus foreign files: all replaced, the
    results right, one warning for the whole directory, none the next time."""
    scales = [2, 3, 4, 5, 6, 7]
    for s in scales:
        get(device, s)
    paths = {s: cache._entry_path(cache_root, cache.program_key(
        source(s), (), device.cl_device)) for s in scales}
    header = cache._HEADER.size
    blob = paths[2].read_bytes()
    paths[2].write_bytes(b"")                                      # empty
    paths[3].write_bytes(paths[3].read_bytes()[: header // 2])     # truncated header
    paths[4].write_bytes(paths[4].read_bytes()[:-7])               # truncated binary
    paths[5].write_bytes(os.urandom(4096))                         # garbage
    paths[6].write_bytes(blob)            # another key's whole, valid entry (a wrong binary)
    paths[7].unlink()
    paths[7].mkdir()                      # a directory where the entry should be
    # Foreign files: a crashed writer's temporary, stray names, a file as a fan-out dir.
    (paths[2].parent / ".tmp-crashed.bin").write_bytes(blob[: len(blob) // 3])
    (cache_root / "kernels-v1" / "README").write_text("not ours")
    (cache_root / "kernels-v1" / "zz").write_bytes(b"a file, not a directory")
    cache.clear_memory()
    ctx, record = recorded()
    try:
        for s in scales:
            run_kernel(device, get(device, s), s)
    finally:
        ctx.__exit__(None, None, None)
    found = runtime_warnings(record)
    # One warning for all the damaged entries, the directory among them.
    assert len(found) == 1, found
    assert any("discarding unusable cached kernel" in w for w in found)
    for s in scales:
        assert cache._read_entry(paths[s], paths[s].stem)  # rewritten, valid
    cache.clear_memory()
    ctx, record = recorded()
    try:
        for s in scales:
            run_kernel(device, get(device, s), s)
    finally:
        ctx.__exit__(None, None, None)
    assert not runtime_warnings(record)


def test_discard_spares_a_fresh_entry_renamed_in_meanwhile(device, cache_root, monkeypatch):
    """Process A reads a damaged entry; before A discards it, process B renames a good
    one into place.  A must not delete B's file."""
    run_kernel(device, get(device, 2), 2)
    (path,) = entries(cache_root)
    good = path.read_bytes()
    path.write_bytes(good[:50])
    real_load = cache._load_entry

    def load_then_race(p, key):
        try:
            return real_load(p, key)
        finally:
            tmp = p.with_name(".tmp-other-process.bin")
            tmp.write_bytes(good)
            os.replace(tmp, p)     # the other process's atomic write lands now

    monkeypatch.setattr(cache, "_load_entry", load_then_race)
    # A does not store its own rebuild, so only B's file can be there afterwards.
    monkeypatch.setattr(cache, "_write_entry", lambda *args: None)
    cache.clear_memory()
    with pytest.warns(RuntimeWarning, match="discarding"):
        run_kernel(device, get(device, 2), 2)
    monkeypatch.setattr(cache, "_load_entry", real_load)
    assert path.exists() and path.read_bytes() == good
    cache.clear_memory()
    before = dict(cache.stats)
    run_kernel(device, get(device, 2), 2)
    assert cache.stats["disk_hits"] - before["disk_hits"] == 1


def test_entries_of_another_package_version(device, cache_root, monkeypatch):
    """Entries written by another version are never loaded (the version is part of the
    key), are not mistaken for damage (no warning, not deleted: that version may still
    be in use), and this version's own entries sit beside them."""
    monkeypatch.setattr(cache, "__version__", "0.0.1-old")
    run_kernel(device, get(device, 2), 2)
    (old,) = entries(cache_root)
    old_bytes = old.read_bytes()
    monkeypatch.undo()
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(cache_root))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    monkeypatch.setenv(cache.BINARIES_ENV, "1")
    cache.clear_memory()
    ctx, record = recorded()
    try:
        before = dict(cache.stats)
        run_kernel(device, get(device, 2), 2)
    finally:
        ctx.__exit__(None, None, None)
    assert not runtime_warnings(record)
    assert cache.stats["builds"] - before["builds"] == 1
    assert cache.stats["disk_hits"] == before["disk_hits"]
    assert old.read_bytes() == old_bytes
    assert len(entries(cache_root)) == 2
    # Even an old entry copied under this version's name is refused (its header
    # holds the old key), with a warning, and replaced.
    new_path = cache._entry_path(cache_root, cache.program_key(source(2), (),
                                                               device.cl_device))
    new_path.write_bytes(old_bytes)
    cache.clear_memory()
    with pytest.warns(RuntimeWarning, match="wrong magic or key"):
        run_kernel(device, get(device, 2), 2)
    assert cache._read_entry(new_path, new_path.stem)
