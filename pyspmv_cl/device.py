"""Device discovery and the DeviceProfile that tuning and code generation read.

A :class:`Device` wraps one OpenCL device with a lazily created context and in-order
queue (without profiling; timing uses a queue of its own) that every operator on that
device shares, so arrays made by one operator can be passed to another.  Its
:class:`DeviceProfile` can be overridden (``dev.override(simd_width=64, fp64=False)``)
to exercise the code paths of other hardware on whatever device is present; an
override shares the context and queue of the device it came from.
"""

import dataclasses
import os
import re
import threading
import warnings

import numpy as np
import pyopencl as cl

from .cache import get_program, memory_generation
from .codegen import helper
from .errors import (
    DeviceNotFoundError,
    InvalidInputError,
    InvalidTypeError,
    KernelBuildError,
)
from .host_buffers import COPY, in_place_mode
from .kernel_objects import kernel_object

DEVICE_ENV = "PYSPMV_CL_DEVICE"

VENDOR_FAMILIES = ("nvidia", "amd", "intel", "pocl", "apple", "other")

_PROBE_SOURCE = """
__kernel void pyspmv_cl_probe(__global float *a, const float s)
{
    a[get_global_id(0)] *= s;
}
"""


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What tuning needs to know about a device.  Immutable; see :meth:`replace`."""

    name: str
    platform_name: str
    platform_version: str
    driver_version: str
    vendor: str
    vendor_family: str            # one of VENDOR_FAMILIES
    device_type: str              # "gpu", "cpu", "accelerator" or "other"
    compute_units: int
    simd_width: int               # warp/wavefront width, or CPU float lanes
    vector_lanes_float32: int     # preferred vector width per dtype (CPU SIMD lanes)
    vector_lanes_float64: int
    max_work_group_size: int
    local_mem_size: int
    global_mem_size: int
    max_alloc_size: int
    fp64: bool
    int64_atomics: bool
    subgroups: bool
    opencl_c_version: tuple       # (major, minor)
    quirks: tuple = ()

    def replace(self, **changes):
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise InvalidTypeError(
                f"unknown DeviceProfile field(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    @property
    def is_gpu(self):
        return self.device_type == "gpu"

    @property
    def is_cpu(self):
        return self.device_type == "cpu"

    def lanes(self, dtype):
        """SIMD lanes a kernel should fill for ``dtype``: the warp/wavefront on GPUs,
        the vector lanes of that dtype on CPUs."""
        if self.device_type == "cpu":
            double = np.dtype(dtype).itemsize >= 8   # float64, complex64/128
            return max(1, self.vector_lanes_float64 if double else self.vector_lanes_float32)
        return max(1, self.simd_width)

    def identity(self):
        """The strings that identify compiled code for this device (cache keys)."""
        return (self.platform_name, self.platform_version, self.name, self.driver_version)


def _vendor_family(platform, device):
    text = f"{platform.name} {platform.vendor} {device.vendor}".lower()
    # PoCL first: its device vendor is the CPU maker (e.g. "AuthenticAMD").
    if "portable computing language" in text or "pocl" in text:
        return "pocl"
    for family, needles in (("nvidia", ("nvidia",)),
                            ("amd", ("advanced micro devices", "amd")),
                            ("intel", ("intel",)),
                            ("apple", ("apple",))):
        if any(n in text for n in needles):
            return family
    return "other"


def _device_type(device):
    t = device.type
    if t & cl.device_type.GPU:
        return "gpu"
    if t & cl.device_type.CPU:
        return "cpu"
    if t & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "other"


def _opencl_c_version(device):
    match = re.search(r"OpenCL C (\d+)\.(\d+)", device.opencl_c_version or "")
    return (int(match.group(1)), int(match.group(2))) if match else (1, 0)


def _safe_info(device, attr, default):
    try:
        return getattr(device, attr)
    except (cl.Error, AttributeError):
        return default


def nvidia_compute_capability(cl_device):
    """``(major, minor)`` of an NVIDIA GPU (``cl_nv_device_attribute_query``), else
    None: the real device's, whatever a profile override pretends."""
    if "cl_nv_device_attribute_query" not in (_safe_info(cl_device, "extensions", "") or ""):
        return None
    major = _safe_info(cl_device, "compute_capability_major_nv", None)
    minor = _safe_info(cl_device, "compute_capability_minor_nv", 0)
    return None if major is None else (int(major), int(minor))


#: A kernel reading through each of kernels/evict_first.cl's loads (the reads of
#: common.mako's ``streamed_loads``): built once per device (``Device.evict_first_loads``)
#: before any kernel relies on them.
_EVICT_FIRST_PROBE = r"""
__kernel void probe(__global const float *a, __global const double *b,
                    __global const int *c, __global const long *d,
                    __global const ushort *e, __global double *out)
{
    out[0] = (double)evict_first_f32(a) + evict_first_f64(b) + (double)evict_first_s32(c)
             + (double)evict_first_s64(d) + (double)evict_first_u16(e);
}
"""


def _probe_simd_width(context, device, subgroups):
    """SIMD width as the driver reports it for a real kernel, in order of trust: the
    vendor's warp/wavefront attribute (NVIDIA, AMD), the maximum sub-group size of a
    trivial probe kernel (Intel GPUs and other sub-group devices), and the probe's
    preferred work-group size multiple (32 on NVIDIA, 32/64 on AMD, the vector lanes
    on PoCL)."""
    for attr in ("warp_size_nv", "wavefront_width_amd"):
        value = _safe_info(device, attr, None)
        if value:
            return int(value)
    try:
        kernel = kernel_object(get_program(context, device, _PROBE_SOURCE), "pyspmv_cl_probe")
    except Exception as exc:  # a driver that cannot build the probe still gets a profile
        warnings.warn(f"SIMD-width probe failed on {device.name!r}: {exc}", stacklevel=3)
        kernel = None
    if kernel is not None and subgroups:
        try:
            size = kernel.get_sub_group_info(
                device, cl.kernel_sub_group_info.MAX_SUB_GROUP_SIZE_FOR_NDRANGE,
                [min(256, device.max_work_group_size)])
            if size and size > 1:
                return int(size)
        except (cl.Error, AttributeError, TypeError):
            pass  # sub-group queries need OpenCL 2.1+ or cl_khr_subgroups
    if kernel is not None:
        multiple = kernel.get_work_group_info(
            cl.kernel_work_group_info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, device)
        if multiple and multiple > 0:
            return int(multiple)
    return 32 if _device_type(device) == "gpu" else max(1, device.preferred_vector_width_float)


def build_profile(context, device):
    """Query ``device`` (inside ``context``) and return its DeviceProfile."""
    platform = device.platform
    extensions = set((device.extensions or "").split())
    fp64 = bool(_safe_info(device, "double_fp_config", 0)) or "cl_khr_fp64" in extensions
    subgroups = ("cl_khr_subgroups" in extensions or "cl_intel_subgroups" in extensions
                 or _safe_info(device, "max_num_sub_groups", 0) > 0)
    family = _vendor_family(platform, device)
    quirks = []
    if family == "pocl":
        # PoCL runs work-groups as loops on host threads: no forward progress between
        # work-groups, and barriers are costly compared with GPUs.
        quirks += ["no-inter-group-progress", "costly-barriers"]
    return DeviceProfile(
        name=device.name.strip(),
        platform_name=platform.name.strip(),
        platform_version=platform.version.strip(),
        driver_version=(device.driver_version or "").strip(),
        vendor=(device.vendor or "").strip(),
        vendor_family=family,
        device_type=_device_type(device),
        compute_units=int(device.max_compute_units),
        simd_width=_probe_simd_width(context, device, subgroups),
        vector_lanes_float32=int(device.preferred_vector_width_float or 1),
        vector_lanes_float64=int(device.preferred_vector_width_double or 0),
        max_work_group_size=int(device.max_work_group_size),
        local_mem_size=int(device.local_mem_size),
        global_mem_size=int(device.global_mem_size),
        max_alloc_size=int(device.max_mem_alloc_size),
        fp64=fp64,
        int64_atomics="cl_khr_int64_base_atomics" in extensions,
        subgroups=bool(subgroups),
        opencl_c_version=_opencl_c_version(device),
        quirks=tuple(quirks),
    )


class Device:
    """One OpenCL device plus the context and queue pyspmv_cl uses on it.

    Profile fields are readable as attributes (``dev.simd_width``, ``dev.fp64``...).
    """

    def __init__(self, cl_device, platform_index=None, device_index=None, *,
                 context=None, queue=None, profile=None, _base=None, callers_queue=None):
        self.cl_device = cl_device
        self.platform_index = platform_index
        self.device_index = device_index
        self._context = context
        self._queue = queue
        # The caller's when they passed it (not the library's own profiling queue).
        self._callers_queue = queue is not None if callers_queue is None else callers_queue
        self._timing_queue = None
        self._profiling_device = None
        self._evict_first = None
        self._profile = profile
        self._base = _base  # the device an override came from: shares its context
        self._host_arrays = None
        self._threads = threading.local()   # thread_store's dicts

    # -- identity -----------------------------------------------------------------
    @property
    def id(self):
        if self.platform_index is None:
            return "external"
        return f"{self.platform_index}:{self.device_index}"

    @property
    def platform(self):
        return self.cl_device.platform

    def __repr__(self):
        tag = " (overridden profile)" if self._base is not None else ""
        return (f"<pyspmv_cl.Device {self.id} {self.cl_device.name.strip()!r} "
                f"on {self.platform.name.strip()!r}{tag}>")

    # -- lazily created OpenCL objects --------------------------------------------
    @property
    def context(self):
        if self._base is not None:
            return self._base.context
        if self._context is None:
            self._context = cl.Context([self.cl_device])
        return self._context

    @property
    def queue(self):
        if self._base is not None:
            return self._base.queue
        if self._queue is None:
            # No profiling: on NVIDIA it cost each product 1.5 us back to back and 6 us
            # waited for (an H100: 23.7 against 17.8 us on a tiny matrix, cuSPARSE 20.4;
            # BENCHMARKS.md).  Timing runs on profiling_queue.
            self._queue = cl.CommandQueue(self.context, self.cl_device)
        return self._queue

    def thread_store(self) -> dict:
        """A dict of this device's for the calling thread, for kernel objects that a
        thread sets the arguments of and launches at once (csr5's conversion kernels):
        making them anew costs more than a conversion's kernels on a GPU, and two
        threads must not share one.  It goes with its thread or with the device (an
        override shares its base's), and ``cache.clear_memory`` empties it, as it
        forgets the programs."""
        local = (self._base if self._base is not None else self)._threads
        generation = memory_generation()
        if getattr(local, "generation", None) != generation:
            local.store, local.generation = {}, generation
        return local.store

    def thread_cached(self, key, build):
        """``thread_store()[key]``, made by ``build()`` on this thread's first use."""
        store = self.thread_store()
        hit = store.get(key)
        if hit is None:
            hit = store[key] = build()
        return hit

    @property
    def profiling_queue(self):
        """A queue with profiling enabled, on this device's context, for timing (the
        tuner, calibrations): the device's own queue when it has profiling (a user's
        queue may), else a private one; the device's default queue has none."""
        if self._base is not None:
            return self._base.profiling_queue
        queue = self.queue
        if queue.properties & cl.command_queue_properties.PROFILING_ENABLE:
            return queue
        if self._timing_queue is None:
            self._timing_queue = cl.CommandQueue(
                self.context, self.cl_device,
                properties=cl.command_queue_properties.PROFILING_ENABLE)
        return self._timing_queue

    @property
    def evict_first_loads(self) -> bool:
        """Whether kernels may read with PTX's evict-first loads (kernels/evict_first.cl,
        through common.mako's ``streamed_loads``): an NVIDIA GPU of compute capability 7.0+
        (the real device's, whatever a profile override says) whose driver builds a
        probe of every form used; an older driver's PTX without the qualifier would
        refuse the kernels themselves.  Probed once."""
        if self._base is not None:
            return self._base.evict_first_loads
        if self._evict_first is None:
            capability = nvidia_compute_capability(self.cl_device)
            ok = capability is not None and capability >= (7, 0)
            if ok:
                try:
                    get_program(self.context, self.cl_device,
                                helper("evict_first.cl") + _EVICT_FIRST_PROBE)
                except (KernelBuildError, cl.Error) as exc:   # the plain reads serve
                    ok = False
                    warnings.warn(
                        f"{self.cl_device.name.strip()}: the driver does not build PTX's "
                        "evict-first loads; kernels read the matrix without them "
                        f"(a few per cent slower on some matrices): {exc}"[:400],
                        RuntimeWarning, stacklevel=2)
            self._evict_first = ok
        return self._evict_first

    @property
    def callers_queue(self) -> bool:
        """Whether ``queue`` is one the caller passed (a pyopencl ``CommandQueue``)."""
        if self._base is not None:
            return self._base.callers_queue
        return self._callers_queue

    def profiling_device(self):
        """This device on ``profiling_queue``: operators made on it run their products on
        a queue with profiling, so that their kernels can be timed by their events
        (benchmarks, the distributed operator's timings).  The same object each call."""
        queue = self.profiling_queue
        if queue is self.queue:
            return self
        if self._profiling_device is None:
            self._profiling_device = self.on_queue(queue)
        return self._profiling_device

    def on_queue(self, queue):
        """This device with ``queue`` (of its context) as its queue: formats made on it
        upload and convert there (the online measurement's candidates, on a queue of
        their own, so that the caller's products do not wait behind them)."""
        view = Device(self.cl_device, self.platform_index, self.device_index,
                      context=self.context, queue=queue, profile=self.profile,
                      callers_queue=False)
        view._evict_first = self.evict_first_loads   # probed once, as for this device
        return view

    @property
    def profile(self):
        if self._profile is None:
            self._profile = build_profile(self.context, self.cl_device)
        return self._profile

    @property
    def host_arrays(self):
        """How products use host arrays on this device (``host_buffers``): "copy" to and
        from device buffers, or in place where the device computes in host memory
        (``CL_DEVICE_HOST_UNIFIED_MEMORY``: PoCL's CPU devices, integrated GPUs), the
        result then made visible by a "map" or, where a probe found the kernels' writes
        in the host array already, "direct"ly.  Probed on first use."""
        if self._base is not None:
            return self._base.host_arrays
        if self._host_arrays is None:
            self._host_arrays = in_place_mode(self.context, self.cl_device, self.queue)
        return self._host_arrays

    @property
    def shares_host_memory(self):
        """Whether host vectors are multiplied in place (see ``host_arrays``)."""
        return self.host_arrays != COPY

    def override(self, **changes):
        """A Device sharing this one's context and queue, with profile fields replaced
        (for tests: pretend SIMD width 64, no fp64, a small max allocation...)."""
        base = self._base if self._base is not None else self
        return Device(self.cl_device, self.platform_index, self.device_index,
                      profile=self.profile.replace(**changes), _base=base)

    def __getattr__(self, name):
        # Only reached for names not found normally: expose the profile's fields.
        if name.startswith("_") or name not in DeviceProfile.__dataclass_fields__:
            raise AttributeError(name)
        return getattr(self.profile, name)


_ALL_DEVICES = None
_EXTERNAL = {}


def devices():
    """Every OpenCL device on every platform, in platform order."""
    global _ALL_DEVICES
    if _ALL_DEVICES is None:
        found = []
        try:
            platforms = cl.get_platforms()
        except cl.Error:  # no ICD / no platform at all
            platforms = []
        for p_index, platform in enumerate(platforms):
            try:
                platform_devices = platform.get_devices()
            except cl.Error:
                continue
            for d_index, dev in enumerate(platform_devices):
                found.append(Device(dev, p_index, d_index))
        _ALL_DEVICES = found
    return list(_ALL_DEVICES)


def _describe(dev):
    platform = dev.platform
    return (f"{dev.id} {dev.cl_device.name.strip()} "
            f"[{platform.name.strip()} {platform.version.strip()}]")


def _match(spec, candidates):
    spec = spec.strip()
    m = re.fullmatch(r"(\d+):(\d+)", spec)
    if m:
        p, d = int(m.group(1)), int(m.group(2))
        return [c for c in candidates if (c.platform_index, c.device_index) == (p, d)]
    if spec.isdigit():
        i = int(spec)
        return candidates[i:i + 1]
    low = spec.lower()
    if low in ("gpu", "cpu", "accelerator"):
        return [c for c in candidates if _device_type(c.cl_device) == low]
    if low in VENDOR_FAMILIES:
        return [c for c in candidates if _vendor_family(c.platform, c.cl_device) == low]
    # Otherwise a case-insensitive substring of platform name/version or device name.
    return [c for c in candidates
            if low in f"{c.platform.name} {c.platform.version} {c.cl_device.name}".lower()]


def _wrap_external(cl_device, context=None, queue=None):
    """Wrap a user's pyopencl device/context/queue; reuse the wrapper so compiled
    programs and buffers stay shared."""
    key = (cl_device.int_ptr, context.int_ptr if context is not None else None,
           queue.int_ptr if queue is not None else None)
    if key not in _EXTERNAL:
        index = next(((d.platform_index, d.device_index) for d in devices()
                      if d.cl_device == cl_device), (None, None))
        _EXTERNAL[key] = Device(cl_device, *index, context=context, queue=queue)
    return _EXTERNAL[key]


#: Non-zeros (times the vectors per product) up to which the default CPU device is
#: PoCL's ``basic`` driver where PoCL exposes it beside ``pthread``
#: (``POCL_DEVICES="pthread basic"``): ``basic`` runs a kernel on the calling thread,
#: with no worker threads to wake and no wake-up when it is done, so a small product
#: returns 40-100 us sooner on the 2-core development machine; from about a million
#: non-zeros ``pthread``'s threads win (BENCHMARKS.md, "CPU call path").
BASIC_MAX_WORK = 1_000_000


def _pocl_driver(dev):
    """``"basic"`` or ``"pthread"`` for those PoCL devices (their names start with the
    driver's), else None."""
    if "portable computing language" not in dev.platform.name.lower():
        return None
    name = dev.cl_device.name.strip().lower()
    return next((d for d in ("basic", "pthread") if name.startswith(d + "-")), None)


def runs_in_calling_thread(device) -> bool:
    """Whether ``device`` runs commands in the thread that enqueues them: PoCL's
    ``basic`` driver.  PoCL 3.1's deadlocks when two host threads enqueue to it at once
    (each ends up waiting for a lock the other holds, inside clEnqueueNDRangeKernel and
    the command it runs), so nothing may run beside the caller there (online tuning
    measures in the caller's thread instead)."""
    return _pocl_driver(device) == "basic"


def enqueues_from_threads(device) -> bool:
    """Whether host threads of the library's own (a background upload) may enqueue to
    ``device`` beside the caller's: not PoCL's ``basic`` driver (it deadlocks, above),
    nor Oclgrind (its simulator crashed, SIGSEGV, with a copy from another thread
    beside the caller's launches)."""
    if runs_in_calling_thread(device):
        return False
    return "oclgrind" not in device.profile.platform_name.lower()


def _default_cpu(hits, work):
    """The first CPU device, except that where its PoCL platform exposes both drivers,
    ``basic`` for a product of up to ``BASIC_MAX_WORK`` non-zeros and ``pthread``
    otherwise (or when the size is not known)."""
    first = hits[0]
    drivers = {}
    for c in hits:
        if c.platform_index == first.platform_index:
            drivers.setdefault(_pocl_driver(c), c)
    if "basic" in drivers and "pthread" in drivers:
        small = work is not None and work <= BASIC_MAX_WORK
        return drivers["basic" if small else "pthread"]
    return first


def get_device(device=None, *, work=None):
    """Resolve a device selection.

    ``device`` may be a :class:`Device`, a ``pyopencl.Device``/``Context``/
    ``CommandQueue``, an index into :func:`devices`, or a selection string
    (``"gpu"``, ``"cpu"``, ``"nvidia"``, ``"pocl"``, ``"0:1"`` platform:device, or a
    substring of the platform/device name).  ``None`` reads ``PYSPMV_CL_DEVICE``, else
    picks the first GPU, else the first CPU, else the first device.  Where that CPU's
    PoCL exposes both its ``basic`` and ``pthread`` drivers, ``work`` (the non-zeros a
    product reads, times its vectors; ``SpMV`` passes it) picks ``basic`` up to
    ``BASIC_MAX_WORK`` and ``pthread`` above it or when not given.
    """
    if isinstance(device, Device):
        return device
    if isinstance(device, cl.CommandQueue):
        return _wrap_external(device.device, device.context, device)
    if isinstance(device, cl.Context):
        ctx_devices = device.devices
        if len(ctx_devices) != 1:
            raise InvalidInputError("pass a CommandQueue (or a single-device Context): this "
                             f"context holds {len(ctx_devices)} devices")
        return _wrap_external(ctx_devices[0], device)
    if isinstance(device, cl.Device):
        return _wrap_external(device)

    candidates = devices()
    if not candidates:
        raise DeviceNotFoundError(
            "no OpenCL device found. Install an OpenCL driver, e.g. "
            "`pip install pyspmv-cl[pocl]` for the PoCL CPU device.")
    source = "argument"
    if device is None:
        device = os.environ.get(DEVICE_ENV) or None
        source = DEVICE_ENV
    if device is None:
        hits = _match("gpu", candidates)
        if hits:
            return hits[0]
        hits = _match("cpu", candidates)
        if hits:
            return _default_cpu(hits, work)
        return candidates[0]
    if isinstance(device, (int, np.integer)):
        device = str(int(device))
    if not isinstance(device, str):
        raise InvalidTypeError(f"device must be a Device, pyopencl Device/Context/"
                               f"CommandQueue, int or str, not {type(device).__name__}")
    if not device.strip():   # a blank selection would match every device's name
        raise DeviceNotFoundError(f"device selection {device!r} (from {source}) is blank: "
                                  "name a device (e.g. '0:1', gpu, cpu, pocl) or leave it "
                                  "unset for the default")
    hits = _match(device, candidates)
    if not hits:
        listing = "\n  ".join(_describe(c) for c in candidates)
        raise DeviceNotFoundError(
            f"no OpenCL device matches {device!r} (from {source}). Available:\n  {listing}\n"
            "Use platform:device (e.g. '0:1'), gpu, cpu, a vendor (nvidia, amd, intel, "
            "pocl) or part of the device/platform name.")
    return hits[0]
