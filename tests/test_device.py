"""The device-query layer: discovery, profiles, selection, overrides and the CLI."""

import dataclasses
import importlib
import os
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl.device import VENDOR_FAMILIES
from pyspmv_cl.launching import launches_seconds


def small_problem(rng, shape=(50, 40), density=0.15, dtype=np.float32):
    A = sp.random(*shape, density=density, format="csr", random_state=rng, dtype=dtype)
    return A, rng.standard_normal(shape[1]).astype(dtype)


# ------------------------------------------------------------------------------ discovery


def test_devices_match_pyopencl():
    found = psc.devices()
    expected = [(p, d, dev) for p, platform in enumerate(cl.get_platforms())
                for d, dev in enumerate(platform.get_devices())]
    assert len(found) == len(expected)
    for dev, (p, d, cl_dev) in zip(found, expected):
        assert dev.cl_device == cl_dev
        assert (dev.platform_index, dev.device_index) == (p, d)
        assert dev.id == f"{p}:{d}"
        assert isinstance(dev, psc.Device)
    assert [d.id for d in psc.devices()] == [d.id for d in found]  # stable order


def test_profile_fields_are_sane(device):
    prof = device.profile
    assert isinstance(prof, psc.DeviceProfile)
    assert prof.name == device.cl_device.name.strip()
    assert prof.vendor_family in VENDOR_FAMILIES
    assert set(VENDOR_FAMILIES) == {"nvidia", "amd", "intel", "pocl", "apple", "other"}
    assert prof.device_type in ("gpu", "cpu", "accelerator", "other")
    assert isinstance(prof.simd_width, int) and prof.simd_width >= 1
    assert isinstance(prof.compute_units, int) and prof.compute_units >= 1
    assert isinstance(prof.fp64, bool)
    assert isinstance(prof.int64_atomics, bool)
    assert isinstance(prof.subgroups, bool)
    v = prof.opencl_c_version
    assert isinstance(v, tuple) and len(v) == 2 and all(isinstance(i, int) for i in v)
    assert v >= (1, 0)
    assert prof.max_work_group_size >= 1
    assert 0 < prof.max_alloc_size <= prof.global_mem_size
    assert prof.local_mem_size > 0
    for dtype in (np.float32, np.float64):
        lanes = prof.lanes(dtype)
        assert isinstance(lanes, int) and lanes >= 1
    assert isinstance(prof.quirks, tuple)
    assert prof.identity() == (prof.platform_name, prof.platform_version, prof.name,
                               prof.driver_version)
    # Profile fields are readable on the Device itself.
    assert device.simd_width == prof.simd_width
    assert device.fp64 == prof.fp64
    with pytest.raises(AttributeError):
        device.no_such_field  # noqa: B018


def test_profile_matches_driver(device):
    prof, cl_dev = device.profile, device.cl_device
    assert prof.compute_units == cl_dev.max_compute_units
    assert prof.max_work_group_size == cl_dev.max_work_group_size
    assert prof.max_alloc_size == cl_dev.max_mem_alloc_size
    assert prof.global_mem_size == cl_dev.global_mem_size
    if prof.vendor_family == "pocl":
        assert "portable computing language" in cl_dev.platform.name.lower()
    expected_type = ("gpu" if cl_dev.type & cl.device_type.GPU else
                     "cpu" if cl_dev.type & cl.device_type.CPU else None)
    if expected_type:
        assert prof.device_type == expected_type


def test_profile_is_cached_and_immutable(device):
    assert device.profile is device.profile
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.profile.simd_width = 3


# ------------------------------------------------------------------------------ selection


def test_get_device_platform_colon_device(device):
    assert psc.get_device(device.id) is device
    assert psc.get_device(f" {device.id} ") is device


def test_get_device_by_index():
    for i, dev in enumerate(psc.devices()):
        assert psc.get_device(i) is dev
        assert psc.get_device(np.int64(i)) is dev
        assert psc.get_device(str(i)) is dev


def test_get_device_instance_passes_through(device):
    assert psc.get_device(device) is device
    pretend = device.override(simd_width=64)
    assert psc.get_device(pretend) is pretend


@pytest.mark.parametrize("spec", ["cpu", "gpu", "accelerator", "CPU"])
def test_get_device_by_type(spec):
    wanted = [d for d in psc.devices() if d.profile.device_type == spec.lower()]
    if wanted:
        assert psc.get_device(spec) is wanted[0]
    else:
        with pytest.raises(psc.DeviceNotFoundError, match=spec):
            psc.get_device(spec)


@pytest.mark.parametrize("family", ["pocl", "nvidia", "amd", "intel", "apple", "POCL"])
def test_get_device_by_vendor(family):
    wanted = [d for d in psc.devices() if d.profile.vendor_family == family.lower()]
    if wanted:
        assert psc.get_device(family) is wanted[0]
    else:
        with pytest.raises(psc.DeviceNotFoundError, match="Available"):
            psc.get_device(family)


def test_get_device_by_name_substring(device):
    name = device.cl_device.name.strip()
    expected = next(d for d in psc.devices()
                    if name.lower() in f"{d.platform.name} {d.platform.version} "
                                       f"{d.cl_device.name}".lower())
    assert psc.get_device(name) is expected
    assert psc.get_device(name.upper()) is expected
    # The platform version string tells platforms apart (e.g. two PoCL installs).
    version = device.platform.version.strip()
    first_on_platform = next(d for d in psc.devices()
                             if version.lower() in d.platform.version.lower())
    assert psc.get_device(version) is first_on_platform


def test_get_device_default_prefers_gpu(monkeypatch):
    monkeypatch.delenv("PYSPMV_CL_DEVICE", raising=False)
    devices = psc.devices()
    gpus = [d for d in devices if d.profile.device_type == "gpu"]
    cpus = [d for d in devices if d.profile.device_type == "cpu"]
    expected = (gpus or cpus or devices)[0]
    assert psc.get_device() is expected
    assert psc.get_device(None) is expected


def test_env_var_selects_device(device, monkeypatch, rng):
    monkeypatch.setenv("PYSPMV_CL_DEVICE", device.id)
    assert psc.get_device() is device
    A, x = small_problem(rng)
    op = psc.SpMV(A)
    assert op.device is device
    assert_close(op @ x, reference(A, x), A, x, np.float32)
    # An explicit argument wins over the environment.
    other = psc.devices()[-1 if device is psc.devices()[0] else 0]
    assert psc.SpMV(A, device=other.id).device is other


def test_env_var_bad_selection(monkeypatch, rng):
    monkeypatch.setenv("PYSPMV_CL_DEVICE", "no-such-device-xyz")
    with pytest.raises(psc.DeviceNotFoundError, match="PYSPMV_CL_DEVICE"):
        psc.get_device()
    A, _ = small_problem(rng)
    with pytest.raises(psc.DeviceNotFoundError, match="no-such-device-xyz"):
        psc.SpMV(A)


def test_empty_env_var_means_default(monkeypatch):
    monkeypatch.delenv("PYSPMV_CL_DEVICE", raising=False)
    default = psc.get_device()
    monkeypatch.setenv("PYSPMV_CL_DEVICE", "")
    assert psc.get_device() is default


@pytest.mark.parametrize("spec", ["nvidia-gtx-9999", "7:0", "0:99", "1000"])
def test_bad_selection(spec):
    with pytest.raises(psc.DeviceNotFoundError, match="no OpenCL device matches") as info:
        psc.get_device(spec)
    for dev in psc.devices():
        assert dev.id in str(info.value)


def test_select_pyopencl_device(device, rng):
    wrapped = psc.get_device(device.cl_device)
    assert wrapped.cl_device == device.cl_device
    assert wrapped.id == device.id
    assert psc.get_device(device.cl_device) is wrapped  # one wrapper per device
    A, x = small_problem(rng)
    op = psc.SpMV(A, device=device.cl_device)
    assert op.device.cl_device == device.cl_device
    assert_close(op @ x, reference(A, x), A, x, np.float32)


def test_select_pyopencl_context(device, rng):
    ctx = cl.Context([device.cl_device])
    A, x = small_problem(rng)
    op = psc.SpMV(A, device=ctx)
    assert op.device.context == ctx
    assert op.device.cl_device == device.cl_device
    # Arrays made by the caller on another queue of that context are accepted.
    user_queue = cl.CommandQueue(ctx)
    x_dev = cla.to_device(user_queue, x)
    y_dev = op.matvec(x_dev)
    assert isinstance(y_dev, cla.Array) and y_dev.context == ctx
    assert_close(y_dev.get(), reference(A, x), A, x, np.float32)
    out = cla.empty(user_queue, A.shape[0], np.float32)
    assert op.matvec(x_dev, out=out) is out
    assert_close(out.get(user_queue), reference(A, x), A, x, np.float32)


def test_select_pyopencl_queue(device, rng):
    ctx = cl.Context([device.cl_device])
    queue = cl.CommandQueue(ctx)
    A, x = small_problem(rng)
    op = psc.SpMV(A, device=queue)
    assert op.device.queue == queue
    assert op.queue == queue
    assert op.device.context == ctx
    x_dev = cla.to_device(queue, x)
    y_dev = op.matvec(x_dev)
    assert y_dev.queue == queue
    assert_close(y_dev.get(), reference(A, x), A, x, np.float32)
    # Host vectors still work on that queue's context.
    assert_close(op @ x, reference(A, x), A, x, np.float32)
    # Arrays on the library's own default context are a different context: refused.
    foreign = cla.to_device(device.queue, x)
    with pytest.raises(ValueError, match="context"):
        op.matvec(foreign)


PROFILING = cl.command_queue_properties.PROFILING_ENABLE


def test_default_queue_has_no_profiling_and_timing_has_its_own(device, rng):
    """Operators run on a queue without profiling (it cost NVIDIA products time); the
    tuner and benchmarks time on ``profiling_queue``/``profiling_device``, which share
    the context, so arrays pass between them."""
    assert not device.queue.properties & PROFILING
    timing = device.profiling_queue
    assert timing is not device.queue and timing.properties & PROFILING
    assert timing.context == device.context
    timed = device.profiling_device()
    assert timed is device.profiling_device()   # one object, its programs shared
    assert timed.queue is timing and timed.context == device.context
    assert timed.profile is device.profile
    assert not device.callers_queue and not timed.callers_queue
    A, x = small_problem(rng)
    op = psc.SpMV(A, format="csr-scalar", device=timed)
    assert op.queue is timing
    x_dev = cla.to_device(device.queue, x)        # an array of the default queue
    y_dev = cla.empty(timing, A.shape[0], np.float32)
    y_dev.fill(np.nan)
    seconds = launches_seconds(lambda: op.matvec(x_dev, out=y_dev))
    assert seconds > 0
    assert_close(y_dev.get(), reference(A, x), A, x, np.float32)
    # An override times on its base's queue, with its own profile.
    pretend = device.override(compute_units=7)
    assert pretend.profiling_queue is timing
    assert pretend.profiling_device().compute_units == 7
    assert pretend.profiling_device().queue is timing


def test_evict_first_loads_need_a_real_nvidia_gpu_whose_driver_builds_them(device,
                                                                           monkeypatch):
    """``Device.evict_first_loads`` (common.mako's streamed_loads): False on any other
    device, also under a profile that pretends NVIDIA; and where the capability says
    yes but the driver cannot build the PTX (here: PoCL told it is an H100), False
    instead of a kernel that fails to build."""
    from pyspmv_cl import device as device_module

    capability = device_module.nvidia_compute_capability(device.cl_device)
    real = capability is not None and capability >= (7, 0)
    assert device.evict_first_loads is real
    assert device.override(vendor_family="nvidia", device_type="gpu").evict_first_loads is real
    if real:
        return
    monkeypatch.setattr(device_module, "nvidia_compute_capability", lambda d: (9, 0))
    fresh = psc.Device(device.cl_device, context=device.context)
    with pytest.warns(RuntimeWarning, match="evict-first"):
        assert fresh.evict_first_loads is False
    assert fresh.evict_first_loads is False   # probed once: no second warning
    A = sp.random(60, 50, density=0.2, format="csr", random_state=1, dtype=np.float32)
    x = np.arange(50, dtype=np.float32)
    op = psc.SpMV(A, format="csr5", device=fresh)
    assert op._impl.programs()[0].params["streamed_loads"] is False
    assert_close(op @ x, reference(A, x), A, x, np.float32)


def test_a_users_profiling_queue_is_its_own_timing_queue(device):
    queue = cl.CommandQueue(device.context, device.cl_device, properties=PROFILING)
    dev = psc.get_device(queue)
    assert dev.callers_queue and dev.override(compute_units=3).callers_queue
    assert dev.profiling_queue is queue
    assert dev.profiling_device() is dev


def test_multi_device_context_refused():
    for platform in cl.get_platforms():
        devs = platform.get_devices()
        if len(devs) > 1:
            ctx = cl.Context(devs)
            with pytest.raises(ValueError, match="CommandQueue"):
                psc.get_device(ctx)
            return
    pytest.skip("no platform with several devices")


# ------------------------------------------------------------------------------ overrides


def test_override_shares_context_and_queue(device):
    pretend = device.override(simd_width=64, fp64=False)
    assert pretend.context is device.context
    assert pretend.queue is device.queue
    assert pretend.cl_device == device.cl_device
    assert pretend.id == device.id
    again = pretend.override(compute_units=99)  # an override of an override: same base
    assert again.context is device.context and again.queue is device.queue
    assert again.simd_width == 64 and again.compute_units == 99 and again.fp64 is False
    assert "overridden" in repr(pretend)


def test_override_changes_only_named_fields(device):
    before = dataclasses.asdict(device.profile)
    pretend = device.override(simd_width=64, max_alloc_size=4096, vendor_family="amd")
    after = dataclasses.asdict(pretend.profile)
    changed = {k for k in before if before[k] != after[k]}
    assert changed <= {"simd_width", "max_alloc_size", "vendor_family"}
    assert (after["simd_width"], after["max_alloc_size"], after["vendor_family"]) == \
        (64, 4096, "amd")
    assert dataclasses.asdict(device.profile) == before  # the original is untouched
    assert pretend.profile.lanes(np.float32) == (
        64 if pretend.device_type != "cpu" else device.profile.lanes(np.float32))


def test_override_rejects_unknown_fields(device):
    with pytest.raises(TypeError, match="warp_sizee"):
        device.override(warp_sizee=32)
    with pytest.raises(TypeError):
        device.profile.replace(simd_width=32, bogus=1)


@pytest.mark.parametrize("fmt", ["csr-scalar", "csr-vector", "auto"])
def test_small_max_work_group_size_is_respected(device, rng, fmt):
    small = device.override(max_work_group_size=16)
    A, x = small_problem(rng, shape=(300, 200), density=0.03)
    op = psc.SpMV(A, format=fmt, device=small)
    assert op.params["work_group_size"] <= 16
    assert op.device is small
    assert_close(op @ x, reference(A, x), A, x, np.float32)
    y0 = rng.standard_normal(300).astype(np.float32)
    out = y0.copy()
    op.matvec(x, out=out, alpha=0.5, beta=2.0)
    assert_close(out, reference(A, x, 0.5, 2.0, y0), A, x, np.float32)


def test_pretend_wide_simd_still_correct(device, rng):
    """AMD-like (wavefront 64) parameterisation on whatever device is present."""
    wide = device.override(simd_width=64, device_type="gpu", vendor_family="amd",
                           vector_lanes_float32=64)
    A, x = small_problem(rng, shape=(120, 300), density=0.3)
    op = psc.SpMV(A, format="csr-vector", device=wide)
    assert_close(op @ x, reference(A, x), A, x, np.float32)


# ------------------------------------------------------------------------------------ CLI


def test_cli_devices_lists_every_device():
    try:
        importlib.import_module("pyspmv_cl.cli")
    except ModuleNotFoundError as exc:
        if exc.name != "pyspmv_cl.cli":
            raise
        pytest.skip("pyspmv_cl.cli is not written yet (ModuleNotFoundError)")
    env = dict(os.environ)
    env.pop("PYSPMV_CL_DEVICE", None)
    result = subprocess.run([sys.executable, "-m", "pyspmv_cl.cli", "devices"],
                            capture_output=True, text=True, timeout=120, env=env, cwd="/tmp")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    devices = psc.devices()
    assert devices, "no device to list"
    for dev in devices:
        assert dev.id in out, out
        assert dev.cl_device.name.strip() in out, out
    # A table: at least a header plus one line per device.
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) >= len(devices) + 1, out


# -------------------------------------------------- PoCL's basic and pthread drivers

BOTH_DRIVERS = """
import sys
import numpy as np
import scipy.sparse as sp
import pyspmv_cl as psc
from pyspmv_cl.device import BASIC_MAX_WORK

names = [d.cl_device.name for d in psc.devices()]
if not any(n.startswith("basic-") for n in names):
    print("SKIP: no basic PoCL device:", names)
    sys.exit(0)
driver = lambda dev: dev.cl_device.name.split("-")[0]
rng = np.random.default_rng(int(sys.argv[1]))
small = sp.random(300, 200, density=0.05, format="csr", random_state=rng)
n = BASIC_MAX_WORK // 3 + 2            # a tridiagonal matrix just over the bound
big = sp.diags([rng.standard_normal(n - 1), rng.standard_normal(n),
                rng.standard_normal(n - 1)], [-1, 0, 1], format="csr")
assert big.nnz > BASIC_MAX_WORK
picked = []
for A in (small, big):
    op = psc.SpMV(A, "csr-scalar")
    x = rng.standard_normal(A.shape[1])
    y = np.full(A.shape[0], np.nan)
    op.matvec(x, out=y)
    assert np.allclose(y, A @ x, rtol=1e-4, atol=1e-4), driver(op.device)
    picked.append(driver(op.device))
picked += [driver(psc.get_device(work=w)) for w in (BASIC_MAX_WORK, BASIC_MAX_WORK + 1, None)]
print(" ".join(picked))
"""


def run_with_both_drivers(source, tmp_path, env_changes=None) -> str:
    """Run ``source`` (given a random seed) in a fresh process with
    POCL_DEVICES="pthread basic", which PoCL reads when OpenCL starts; its stdout.
    Skips when it prints SKIP (no basic device); ``env_changes``: None unsets."""
    script = tmp_path / "both_drivers.py"
    script.write_text(source)
    env = dict(os.environ, POCL_DEVICES="pthread basic")
    for name, value in {"PYSPMV_CL_DEVICE": None, **(env_changes or {})}.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    seed = str(np.random.SeedSequence().entropy % 2**32)
    result = subprocess.run([sys.executable, str(script), seed], capture_output=True,
                            text=True, timeout=300, env=env, cwd="/tmp")
    assert result.returncode == 0, result.stderr[-3000:]
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    return result.stdout


def test_default_cpu_device_by_size_with_both_pocl_drivers(tmp_path):
    """With POCL_DEVICES="pthread basic" (read when OpenCL starts: a fresh process), a
    default SpMV(A) takes PoCL's basic driver for a product up to BASIC_MAX_WORK
    non-zeros and pthread above it; get_device() without a size keeps pthread.  Both
    products are checked against scipy."""
    out = run_with_both_drivers(BOTH_DRIVERS, tmp_path)
    assert out.split() == ["basic", "pthread", "basic", "pthread", "pthread"], out


ONLINE_ON_BASIC = """
import sys
import threading
import numpy as np
import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.device import runs_in_calling_thread

if not any(d.cl_device.name.startswith("basic-") for d in psc.devices()):
    print("SKIP: no basic PoCL device")
    sys.exit(0)
rng = np.random.default_rng(int(sys.argv[1]))
A = generators.random_uniform(40_000, nnz_per_row=3, seed=int(sys.argv[1]))
op = psc.SpMV(A.astype(np.float32), tune="online")
assert runs_in_calling_thread(op.device), op.device
tuning = op.tuning.online
assert tuning.inline
tuning.trigger = 3
for i in range(40):
    x = rng.standard_normal(A.shape[1])
    y = op @ x
    assert np.allclose(y, A @ x, rtol=1e-4, atol=1e-4), (i, op.format)
assert tuning.state == "done" and tuning._thread is None, (tuning.state, tuning.error)
assert threading.active_count() == 1 or all(
    t.name != "pyspmv_cl-online-tuning" for t in threading.enumerate())
print(op.format)
"""


def test_online_tuning_on_pocls_basic_driver_stays_in_the_callers_thread(tmp_path):
    """PoCL 3.1's basic driver deadlocked when the online measurement enqueued from its
    thread while the caller's products ran (a hang in clEnqueueNDRangeKernel): there
    the measurement runs in the caller's thread, and 40 products around it finish, each
    checked against scipy (a fresh process: POCL_DEVICES is read when OpenCL starts)."""
    from pyspmv_cl.tuning import database
    run_with_both_drivers(ONLINE_ON_BASIC, tmp_path, {
        database.TUNING_DIR_ENV: str(tmp_path / "tuning"),   # empty: tunes online
        "PYSPMV_CL_TUNE": None})


def test_default_cpu_device_without_both_drivers_is_the_first_cpu():
    """Without both PoCL drivers on the first CPU's platform (this process: no
    POCL_DEVICES), a size changes nothing: the first CPU device, as before."""
    cpus = [d for d in psc.devices() if d.profile.device_type == "cpu"]
    if not cpus or os.environ.get("PYSPMV_CL_DEVICE") or \
            any(d.profile.device_type == "gpu" for d in psc.devices()):
        pytest.skip("needs a CPU as the default device")
    from pyspmv_cl.device import _pocl_driver
    drivers = {_pocl_driver(d) for d in cpus if d.platform_index == cpus[0].platform_index}
    if {"basic", "pthread"} <= drivers:
        pytest.skip("this process sees both PoCL drivers")
    for work in (None, 1, 10**9):
        assert psc.get_device(work=work) is cpus[0]


def test_thread_store_is_per_thread_shared_by_overrides_and_cleared_with_the_programs(
        device):
    """Device.thread_store (csr5's conversion kernels live there): one dict per thread,
    the same for an override of the device, emptied by cache.clear_memory."""
    import threading

    from pyspmv_cl import cache

    store = device.thread_store()
    store["probe"] = 1
    assert device.thread_store() is store
    assert device.override(simd_width=64).thread_store() is store
    seen = []
    worker = threading.Thread(target=lambda: seen.append(device.thread_store()))
    worker.start()
    worker.join()
    assert seen[0] is not store and "probe" not in seen[0]
    cache.clear_memory()
    assert "probe" not in device.thread_store()
