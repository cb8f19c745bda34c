"""Kernel objects made after kernel_objects.install(): pyopencl's argument setters come
from memory after the first fetch, and kernels sharing a setter keep their own
arguments."""

import os
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pyopencl.invoker as invoker
import pytest

from pyspmv_cl import cache, kernel_objects

SOURCE = """
__kernel void fill(__global float *out, float value, int n)
{
    int i = get_global_id(0);
    if (i < n) out[i] = value * (float)(i + 1);
}
"""


class CountingTable:
    """A stand-in for pyopencl's disk table that counts its reads."""

    def __init__(self, items=None):
        self.items = dict(items or {})
        self.reads = 0
        self.stores = 0

    def __getitem__(self, key):
        self.reads += 1
        return self.items[key]

    def store_if_not_present(self, key, value):
        self.stores += 1
        self.items.setdefault(key, value)


def test_front_reads_the_table_once_per_key():
    table = CountingTable({"a": 1})
    front = kernel_objects._MemoryFront(table)
    assert front["a"] == 1 and front["a"] == 1 and front["a"] == 1
    assert table.reads == 1
    with pytest.raises(KeyError):
        front["b"]                  # pyopencl then generates and stores it
    front.store_if_not_present("b", 2)
    assert table.stores == 1 and table.items["b"] == 2
    reads = table.reads
    assert front["b"] == 2 and table.reads == reads   # from memory


def test_installed_by_the_package():
    assert isinstance(invoker.invoker_cache, kernel_objects._MemoryFront)
    assert kernel_objects.install()                     # idempotent
    assert not isinstance(invoker.invoker_cache.table, kernel_objects._MemoryFront)


def test_not_installed_over_an_unknown_table(monkeypatch):
    monkeypatch.setattr(invoker, "invoker_cache", None)
    assert not kernel_objects.install()
    assert invoker.invoker_cache is None


def test_new_kernel_objects_fetch_no_setter_from_disk(device, monkeypatch):
    program = cache.get_program(device.context, device.cl_device, SOURCE)
    program.all_kernels()           # the setter is in memory from here on
    table = CountingTable(invoker.invoker_cache.memory)
    front = kernel_objects._MemoryFront(table)
    front.memory.update(invoker.invoker_cache.memory)
    monkeypatch.setattr(invoker, "invoker_cache", front)
    for _ in range(3):
        program.all_kernels()
    assert table.reads == 0 and table.stores == 0


def test_kernels_sharing_a_setter_keep_their_own_arguments(device):
    program = cache.get_program(device.context, device.cl_device, SOURCE)
    n = 1000
    (first,), (second,) = program.all_kernels(), program.all_kernels()
    bufs = [cl.Buffer(device.context, cl.mem_flags.READ_WRITE, n * 4) for _ in range(2)]
    first.set_args(bufs[0], np.float32(2.0), np.int32(n))
    second.set_args(bufs[1], np.float32(-3.0), np.int32(n // 2))
    queue = device.queue
    # The second kernel writes half its buffer: the rest keeps the poison.
    poison = np.full(n, np.nan, np.float32)
    cl.enqueue_copy(queue, bufs[1], poison)
    for kernel in (first, second):
        cl.enqueue_nd_range_kernel(queue, kernel, (n,), None)
    out = [np.empty(n, np.float32) for _ in range(2)]
    for host, buf in zip(out, bufs):
        cl.enqueue_copy(queue, host, buf)
    queue.finish()
    i = np.arange(1, n + 1, dtype=np.float32)
    np.testing.assert_array_equal(out[0], 2.0 * i)
    np.testing.assert_array_equal(out[1][: n // 2], -3.0 * i[: n // 2])
    assert np.isnan(out[1][n // 2:]).all()


UNUSABLE_CACHE_SCRIPT = """
import os, sys
import numpy as np
import pyopencl as cl
import pyspmv_cl
from pyspmv_cl import cache
device = cl.get_platforms()[0].get_devices()[0]
context = cl.Context([device])
queue = cl.CommandQueue(context)
(kernel,) = cache.get_program(context, device, sys.argv[1]).all_kernels()
out = cl.Buffer(context, cl.mem_flags.READ_WRITE, 16)
kernel(queue, (4,), None, out, np.float32(2), np.int32(4))
host = np.empty(4, np.float32)
cl.enqueue_copy(queue, host, out)
print(host.tolist(), os.environ.get("PYOPENCL_NO_CACHE"))
"""


def test_unusable_user_cache_directory_leaves_the_library_working(tmp_path):
    """The user cache directory (where pyopencl keeps its argument setters) under a
    file: ``import pyspmv_cl`` failed in pytools (NotADirectoryError, then
    AttributeError 'mutex'), even with PYSPMV_CL_NO_CACHE=1, and plain pyopencl fails
    at its first kernel object.  Now pyopencl's disk cache is turned off with one
    warning, and kernels run."""
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    env = {k: v for k, v in os.environ.items() if k != "PYOPENCL_NO_CACHE"}
    # (PoCL's own cache where it was: the kernel compiles once, not every run)
    pocl = os.environ.get("POCL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pocl")
    env.update(XDG_CACHE_HOME=str(blocker / "cache"), PYSPMV_CL_NO_CACHE="1",
               POCL_CACHE_DIR=pocl)
    run = subprocess.run([sys.executable, "-c", UNUSABLE_CACHE_SCRIPT, SOURCE], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("]")[0] == "[2.0, 4.0, 6.0, 8.0" and "] 1" in run.stdout
    assert run.stderr.count("pyopencl cannot use its cache directory") == 1, run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr
