"""What every storage format shares: parameter resolution, index-type choice,
allocation checks, device upload and building a kernel whose work-group size the
device accepts."""

import typing

import numpy as np
import pyopencl as cl

from .. import codegen
from ..cache import get_program
from ..errors import DeviceMemoryError, IndexOverflowError
from ..launching import enqueue_launch

# Room left below 2**31 so that 32-bit loop counters (j += vector size, ...) never wrap.
_INT32_LIMIT = 2**31 - 1 - 65536


def choose_index_dtype(n_rows, n_cols, nnz, index_bits=None):
    """int32 when every size fits (with margin), else int64; ``index_bits`` forces one."""
    fits32 = max(n_rows, n_cols, nnz) <= _INT32_LIMIT
    if index_bits in (None, "auto"):
        return np.dtype(np.int32 if fits32 else np.int64)
    if index_bits == 64:
        return np.dtype(np.int64)
    if index_bits == 32:
        if not fits32:
            raise IndexOverflowError(
                f"32-bit indices cannot address this matrix ({n_rows}x{n_cols}, nnz={nnz}; "
                f"limit {_INT32_LIMIT}): use index_bits=64 or leave it to the default")
        return np.dtype(np.int32)
    raise ValueError(f"index_bits must be 32, 64 or None, not {index_bits!r}")


def format_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def check_allocations(profile, sizes, extra_bytes=0):
    """Refuse, naming the array and its size, any buffer over the device's maximum
    allocation, or a total (plus ``extra_bytes`` for vectors) over its global memory."""
    for name, size in sizes.items():
        if size > profile.max_alloc_size:
            raise DeviceMemoryError(
                f"array {name!r} needs {format_bytes(size)}, more than the device's maximum "
                f"single allocation of {format_bytes(profile.max_alloc_size)} on {profile.name}")
    total = sum(sizes.values()) + extra_bytes
    if total > profile.global_mem_size:
        raise DeviceMemoryError(
            f"the matrix needs {format_bytes(total)} of device memory, more than the "
            f"{format_bytes(profile.global_mem_size)} of {profile.name}")


def upload(context, array):
    """A read-only device buffer holding ``array`` (one element of padding when empty:
    OpenCL has no zero-size buffers)."""
    array = np.ascontiguousarray(array)
    if array.size == 0:
        array = np.zeros(1, dtype=array.dtype)
    return cl.Buffer(context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                     hostbuf=array)


def program_kernels(program, names):
    """Fresh kernel objects (own argument state) for ``names`` in a built program.
    ``all_kernels`` avoids pyopencl's attribute lookup, which probes the driver for a
    kernel named after each attribute it is asked for."""
    found = {k.function_name: k for k in program.all_kernels()}
    missing = [n for n in names if n not in found]
    if missing:
        raise KeyError(f"kernel(s) {missing} not in the program (has {sorted(found)})")
    return {n: found[n] for n in names}


class Launch(typing.NamedTuple):
    """One 1-D kernel launch of a product: the kernel, its arguments, and its sizes."""
    kernel: cl.Kernel
    args: tuple
    global_size: int
    local_size: int


def launch_rows(n_rows, rows_per_group, work_group_size):
    """(global, local) size of one launch covering ``n_rows`` rows: one work-group per
    block of ``rows_per_group`` consecutive rows, so each group handles a contiguous
    block (streaming on CPUs, coalesced on GPUs)."""
    groups = max(1, -(-int(n_rows) // rows_per_group))
    return groups * work_group_size, work_group_size


def row_per_item_work_group_size(profile):
    """Default group size of the kernels with one work-item per row: a few warps per
    group on GPUs; larger groups on CPUs, where PoCL runs a group as a loop on one
    thread and a bigger one amortises the per-group overhead."""
    return min(128 if profile.is_gpu else 256, profile.max_work_group_size)


def pow2_floor(n):
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 1


class SpMVFormat:
    """Base of the per-format device implementations.

    A single-kernel format sets ``name``, ``template``, ``kernel_name`` and
    ``param_names`` and implements ``default_params``, ``_convert`` (host arrays, which
    the base checks against the device limits and uploads into ``self.buffers``),
    ``_kernel_args`` and ``_launch_geometry``.  A format with several kernels or
    passes overrides ``kernel`` (called once at construction to build eagerly) and
    ``enqueue``, using ``build_kernels``.  ``alpha`` and ``beta`` are kernel arguments
    (see ``store_y`` in templates/common.mako), not specialisations.
    """

    name = None
    template = None
    kernel_name = None
    param_names = ()
    _plan_key = None   # see enqueue

    # -- parameters -------------------------------------------------------------
    @classmethod
    def default_params(cls, features, profile, dtype):
        raise NotImplementedError

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """Parameter sets worth measuring for this matrix and device (the tuner times
        them; ``{}`` means the defaults).  Formats with a model or pruning rule (ELLR-T,
        CSR5's sigma, BCCOO's block shapes) return a few alternatives here; an empty
        list says the format is not worth trying on this matrix.  ``csr`` (the matrix,
        when the caller has it) serves rules that need more than the features."""
        return [{}]

    @classmethod
    def resolve_params(cls, features, profile, dtype, user_params):
        """Defaults for this matrix and device, overridden by the caller's values."""
        allowed = set(cls.param_names) | {"index_bits"}
        unknown = set(user_params) - allowed
        if unknown:
            raise TypeError(f"format {cls.name!r} takes no parameter(s) "
                            f"{', '.join(sorted(unknown))}; it accepts: "
                            f"{', '.join(sorted(allowed))}")
        params = cls.default_params(features, profile, dtype)
        params.update({k: v for k, v in user_params.items() if v is not None})
        return params

    # -- construction ------------------------------------------------------------
    def __init__(self, csr, device, dtype, params):
        self.device = device
        self.profile = device.profile
        self.dtype = np.dtype(dtype)
        self.shape = csr.shape
        self.params = dict(params)
        self.index_dtype = choose_index_dtype(csr.shape[0], csr.shape[1], csr.nnz,
                                              self.params.pop("index_bits", None))
        self.params["index_bits"] = self.index_dtype.itemsize * 8
        self._check_work_group_size()
        self._kernels = {}   # before _convert, which may build (to settle the group size)
        host_arrays = self._convert(csr)
        sizes = {name: arr.nbytes for name, arr in host_arrays.items()}
        vector_bytes = (csr.shape[0] + csr.shape[1]) * self.dtype.itemsize
        check_allocations(self.profile, sizes, vector_bytes)
        self.nbytes = int(sum(sizes.values()))
        self.buffers = {name: upload(device.context, arr) for name, arr in host_arrays.items()}

    def _check_work_group_size(self):
        wg = self.params.get("work_group_size")
        limit = self.profile.max_work_group_size
        if not isinstance(wg, (int, np.integer)) or isinstance(wg, bool) or wg < 1:
            raise ValueError(f"{self.name}: work_group_size must be a positive integer, "
                             f"not {wg!r}")
        if wg > limit:
            raise ValueError(f"{self.name}: work_group_size={wg} exceeds the device's maximum "
                             f"of {limit} on {self.profile.name}")
        local_bytes = self._local_bytes(int(wg))
        if local_bytes > self.profile.local_mem_size:
            raise ValueError(f"{self.name}: work_group_size={wg} needs {local_bytes} B of local "
                             f"memory, more than the device's {self.profile.local_mem_size} B")
        self.params["work_group_size"] = int(wg)

    def _local_bytes(self, work_group_size):
        """Local memory a work-group of this size uses (0 unless a kernel needs some)."""
        return 0

    def _convert(self, csr):
        """Host arrays of this format, as an ordered dict name -> numpy array."""
        raise NotImplementedError

    # -- kernels ------------------------------------------------------------------
    def build_kernels(self, template, kernel_names, work_group_size, *,
                      min_work_group_size=1, **template_params):
        """Render ``template`` with this operator's dtype, index type and device plus
        ``template_params``, build it, and return ``({name: Kernel}, work_group_size)``.

        The work-group size is rendered into the source; if a compiled kernel accepts
        fewer work-items (CL_KERNEL_WORK_GROUP_SIZE: registers, local memory), it is
        shrunk to a power of two that fits and the source is rebuilt."""
        ctx, dev = self.device.context, self.device.cl_device
        wg = int(work_group_size)
        while True:
            source = codegen.render(template, dtype=self.dtype, index_dtype=self.index_dtype,
                                    profile=self.profile, work_group_size=wg,
                                    **template_params)
            program = get_program(ctx, dev, source)
            kernels = program_kernels(program, kernel_names)
            limit = min(k.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev)
                        for k in kernels.values())
            if wg <= limit:
                return kernels, wg
            smaller = pow2_floor(limit)
            if smaller < min_work_group_size:
                raise RuntimeError(
                    f"{self.name}: the compiled kernel allows work-groups of at most {limit} "
                    f"work-items, fewer than the {min_work_group_size} it needs")
            wg = smaller

    def _template_params(self):
        return {}

    def _min_work_group_size(self):
        return 1

    def kernel(self):
        """The kernel of a single-kernel format, built on first use (SpMV calls this
        at construction so build errors surface there)."""
        if self.kernel_name not in self._kernels:
            kernels, wg = self.build_kernels(
                self.template, [self.kernel_name], self.params["work_group_size"],
                min_work_group_size=self._min_work_group_size(), **self._template_params())
            self.params["work_group_size"] = wg
            self._kernels.update(kernels)
        return self._kernels[self.kernel_name]

    def launches(self, x_buf, y_buf, alpha, beta):
        """The kernel launches of one product ``y = alpha*A@x + beta*y``, in order, as
        ``Launch`` tuples (``alpha`` and ``beta`` come in this operator's real type).  A
        single-kernel format gets this from ``_kernel_args`` and ``_launch_geometry``;
        formats with several kernels or passes override it."""
        return [Launch(self.kernel(), tuple(self._kernel_args(x_buf, y_buf, alpha, beta)),
                       *self._launch_geometry())]

    def enqueue(self, queue, x_buf, y_buf, alpha, beta, wait_for=None):
        """Enqueue y = alpha*A@x + beta*y (y not read when beta == 0); returns the event
        of the last launch (a marker when there is nothing to launch).

        Kernel arguments are set only when x, y, alpha or beta change: pyopencl's
        set_args costs 20-120 us a kernel on PoCL, more than a small matrix's product.
        This object owns its kernel objects, so nothing else changes their arguments; it
        keeps x and y referenced while their handles sit in the kernels."""
        key = (queue.int_ptr, x_buf.int_ptr, y_buf.int_ptr, float(alpha), float(beta))
        if key != self._plan_key:
            self._plan_key = None
            real = self.dtype.type
            launches = self.launches(x_buf, y_buf, real(alpha), real(beta))
            kernels = [launch.kernel for launch in launches]
            # A kernel launched twice in one product needs its arguments set each time.
            reused = {id(k) for k in kernels if kernels.count(k) > 1}
            plan = []
            for launch in launches:
                args = launch.args if id(launch.kernel) in reused else None
                if args is None:
                    launch.kernel.set_args(*launch.args)
                plan.append((launch.kernel, args, (int(launch.global_size),),
                             (int(launch.local_size),)))
            # On an in-order queue each launch waits for the one before it anyway.
            in_order = not (queue.properties
                            & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
            self._plan, self._plan_in_order = plan, in_order
            self._plan_refs = (x_buf, y_buf)
            self._plan_key = key
        if not self._plan:
            return cl.enqueue_marker(queue, wait_for=wait_for)
        event = None
        for kernel, args, global_size, local_size in self._plan:
            if args is not None:
                kernel.set_args(*args)
            if event is not None:
                wait_for = None if self._plan_in_order else [event]
            event = enqueue_launch(queue, kernel, global_size, local_size, wait_for=wait_for)
        return event

    def _kernel_args(self, x_buf, y_buf, alpha, beta):
        raise NotImplementedError

    def _launch_geometry(self):
        raise NotImplementedError
