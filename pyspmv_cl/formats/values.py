"""New values for the same sparsity pattern (``SpMV.update_values``), written once for
every format.

The first update finds where each CSR entry lands in the format's value arrays: the
format's own ``analyse`` and ``convert`` run once (on a shallow copy of the format) on
the matrix with the values ``1, 2, ..., nnz`` as integers as wide as the value type
(exact, and every size-based decision the same), so every value array then holds, in
each slot, the CSR position it came from (0 for padding).  From then
on an update is the upload of the values in CSR order and one scatter kernel per value
array on the device.  A format whose
conversion does not place each value in exactly one slot (it would merge or drop
entries) is detected, and its updates re-run the host conversion of the values instead.

With ``value_bits`` (formats/storage.py) the new values are rounded to the stored type
on the host, as the construction rounds them (a finite value that overflows it is
refused before anything changes), and moved into place as they are.
"""

from __future__ import annotations

import copy

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy.sparse as sp

from ..codegen import KernelSpec, matrix, scalar, scratch
from ..device_inputs import DeviceCSR
from ..errors import InvalidInputError, PySpMVError, UnsupportedDtypeError
from ..inputs import check_value_range
from .base import upload, upload_all
from .builder import ProgramSpec, build_program
from .storage import to_storage

WORK_GROUP_SIZE = 64
GATHER = KernelSpec("gather_values", (
    scalar("count", "ulong"), scalar("first", "ulong"), matrix("codes", "code_t"),
    matrix("src", "real_t"), scratch("dst", "real_t")))
SCATTER = ProgramSpec("scatter_values.mako", (KernelSpec("scatter_values", (
    scalar("count", "ulong"), matrix("slots", "index_t"), matrix("sources", "index_t"),
    matrix("src", "real_t"), scratch("dst", "real_t"))),))


def host_arrays(fmt, csr, dtype, value_dtype=None) -> dict:
    """The format's host arrays for ``csr`` with values in ``dtype`` (stored in
    ``value_dtype``, by default ``dtype``), from a shallow copy of the format (its
    ``analyse`` then ``convert``: both host-side), so the operator's own state is left
    as it is."""
    twin = copy.copy(fmt)
    twin.dtype = np.dtype(dtype)
    twin.value_dtype = np.dtype(value_dtype or dtype)
    twin.params = dict(fmt.params)
    twin.analyse(csr)
    return twin.convert(csr)


#: Bit patterns of positive normal floats (the smallest normal's, per part width): a
#: position p travels through a device conversion as the value whose bits are base + p,
#: never zero, subnormal or NaN, so copies, comparisons with zero and flushes to zero
#: all leave it as it is.
_CODE_BASE = {4: (np.uint32, 0x0080_0000, 0x7F7F_FFFF),
              8: (np.uint64, 0x0010_0000_0000_0000, 0x7FEF_FFFF_FFFF_FFFF)}


class DeviceCodes:
    """The map of an operator converted on the device: a twin operator made by the
    format's own device conversion from the pattern, each value the code of its CSR
    position (``_CODE_BASE``), whose value arrays are kept (the twin itself is not).
    Each slot's code names its source; 0 marks fill.  The device conversions put each
    entry in exactly one slot (tests/test_update_values.py compares every format's map
    with the host one); ``layout()`` decodes the map on the host, checked, when the
    values must be read back in CSR order."""

    def __init__(self, fmt, twin, bits, first, nnz):
        self.bits, self.first, self.nnz = bits, first, nnz
        self.stride = 2 if fmt.dtype.kind == "c" else 1
        self.arrays = {name: (twin.buffers[name], size)
                       for name, size in fmt.value_array_sizes.items()}
        self.nbytes = sum(size * fmt.dtype.itemsize for _, size in self.arrays.values())

    def layout(self, queue):
        """{array name: (slots, sources)} on the host, or None if the map is not one."""
        layout, seen = {}, 0
        for name, (buf, size) in self.arrays.items():
            stored = np.empty(size * self.stride, dtype=self.bits)
            if size:
                cl.enqueue_copy(queue, stored, buf, is_blocking=True)
            stored = stored[::self.stride]
            slots = np.flatnonzero(stored)
            layout[name] = (slots, stored[slots].astype(np.int64) - self.first)
            seen += slots.size
        return _checked(layout, seen, self.nnz)


def _device_codes(fmt, structure):
    """The :class:`DeviceCodes` of an operator that converted on the device (the host
    conversion of the pattern took 0.5-3 s at 20M non-zeros), or None where that does
    not apply (host conversion, values kept in CSR order, values stored narrower, too
    many entries for the codes, no room on the device for the twin)."""
    if not fmt.converting_on_device or fmt.value_dtype != fmt.dtype:
        return None
    indices, indptr = structure
    nnz = indices.size
    if _csr_order(fmt, nnz) is not None:   # the values stay in CSR order: no map needed
        return None
    part = np.dtype(fmt.dtype.char.lower()) if fmt.dtype.kind == "c" else fmt.dtype
    bits, base, top = _CODE_BASE[part.itemsize]
    if not nnz or base + nnz > top:
        return None
    codes = np.arange(base + 1, base + nnz + 1, dtype=bits).view(part)
    data = np.empty(nnz, fmt.dtype)
    data.real = codes
    if fmt.dtype.kind == "c":
        data.imag = codes
    queue, idx = fmt.device.queue, fmt.index_dtype
    probe = sp.csr_matrix(fmt.shape, dtype=fmt.dtype)
    probe.data, probe.indices, probe.indptr = data, indices, indptr
    try:
        twin = type(fmt)(DeviceCSR.upload(probe, queue, idx, fmt.dtype, owned=True),
                         fmt.device, fmt.dtype, dict(fmt.params))
    except (PySpMVError, cl.Error, MemoryError):   # e.g. no room for a second copy
        return None
    if not twin.converting_on_device or twin.value_array_sizes != fmt.value_array_sizes:
        return None
    return DeviceCodes(fmt, twin, bits, base + 1, nnz)


def _checked(layout, seen, nnz):
    """``layout`` if it puts each of the ``nnz`` values in exactly one slot, else None."""
    if seen != nnz:
        return None
    # nnz sources in [0, nnz) hit every position once exactly when they hit them all (a
    # scatter of flags: np.bincount's counts cost 4x more, 0.2 s at 5M entries).
    hit = np.zeros(nnz, dtype=bool)
    for _, sources in layout.values():
        if sources.size and (sources.min() < 0 or sources.max() >= nnz):
            return None   # (a format that added entries up)
        hit[sources] = True
    return layout if hit.all() else None


def _csr_order(fmt, nnz):
    """The name of the one value array of a format that holds the values in CSR order,
    its first ``nnz`` slots (the CSR kernels: their conversion is a cast), else None."""
    sizes = fmt.value_array_sizes
    if type(fmt).host_conversion_is_cast and len(sizes) == 1 and \
            next(iter(sizes.values())) >= nnz:
        return next(iter(sizes))
    return None


def _layout(fmt, structure):
    """{array name: (slots, sources)} or None when the format's conversion does not
    put each CSR value in exactly one slot."""
    indices, indptr = structure
    nnz = indices.size
    name = _csr_order(fmt, nnz)
    if name is not None:   # no probe needed (at 20M non-zeros it took 0.5-0.8 s)
        every = np.arange(nnz)
        return {name: (every, every)}
    # Positions as integers of the value type's width, so that every size-based
    # decision of the format comes out as it did for the real values.
    pos_dtype = np.dtype(np.int32 if fmt.dtype.itemsize == 4 and nnz < 2**31 - 1
                         else np.int64)
    probe = sp.csr_matrix(fmt.shape, dtype=pos_dtype)
    probe.data = np.arange(1, nnz + 1, dtype=pos_dtype)
    probe.indices, probe.indptr = indices, indptr
    try:
        arrays = host_arrays(fmt, probe, pos_dtype)
    except PySpMVError:   # the format refused the probe: no map
        return None
    expected = fmt.value_array_sizes
    layout, seen = {}, 0
    for name, size in expected.items():
        arr = arrays.get(name)
        if arr is None or arr.size != size or arr.dtype != pos_dtype:
            return None
        slots = np.flatnonzero(arr)
        layout[name] = (slots, arr[slots].astype(np.int64) - 1)
        seen += slots.size
    return _checked(layout, seen, nnz)


class ValueUpdater:
    """Applies new values to one format instance (see the module docstring).
    ``structure``: the ``(indices, indptr)`` of the pattern on the host, or a function
    giving them, called only where the map needs them (``nnz`` then says the count:
    formats holding the values in CSR order need nothing more)."""

    def __init__(self, fmt, structure, nnz=None):
        self.fmt = fmt
        self._structure = structure
        self.nbytes = 0
        self._layout = None
        #: The host map's arrays: those copied straight, and name -> (count, slots,
        #: sources) on the device for the scatter (both empty with codes).
        self.direct, self.device_layout = [], {}
        #: The map kept on the device as codes (an operator converted there), else None.
        self.codes = None
        in_order = _csr_order(fmt, structure[0].size if nnz is None else nnz)
        if in_order is not None:   # copied straight in; the layout made only if read
            # (Before the codes: a CSR kernel given device arrays converts there too,
            # but its map is the identity, known without a second conversion.)
            self.has_map, self.direct = True, [in_order]
            return
        structure = self.structure
        self.codes = _device_codes(fmt, structure)
        if self.codes is not None:
            self.has_map = True
            self.nbytes = self.codes.nbytes
            code_t = "uint" if self.codes.bits == np.uint32 else "ulong"
            program = ProgramSpec("gather_values.mako", (GATHER,),
                                  {"code_t": code_t, "stride": self.codes.stride,
                                   "signed_zeros": bool(type(fmt).signed_stored_zeros)})
            kernels, _ = build_program(fmt.device, program, dtype=fmt.dtype,
                                       index_dtype=fmt.index_dtype,
                                       work_group_size=WORK_GROUP_SIZE)
            self.kernel = kernels["gather_values"]
            return
        self._layout = _layout(fmt, structure)
        #: Whether each value's slot is known (else updates convert the values again).
        self.has_map = self._layout is not None
        if self._layout is None:
            return
        queue, idx = fmt.device.queue, fmt.index_dtype
        # Arrays that hold the values in CSR order, as they are (the CSR kernels',
        # coo's; the first ``size`` of them): an update copies straight into them, no
        # map, no scatter.
        self.direct = [name for name, (slots, sources) in self._layout.items()
                       if slots.size == fmt.value_array_sizes[name]
                       and _is_identity(slots) and _is_identity(sources)]
        for name, (slots, sources) in self._layout.items():
            if name in self.direct:
                continue
            slots_buf, sources_buf = upload_all(
                queue, {"slots": slots.astype(idx), "sources": sources.astype(idx)}).values()
            self.device_layout[name] = (slots.size, slots_buf, sources_buf)
            self.nbytes += 2 * slots.size * idx.itemsize
        if not self.device_layout:
            return
        # The values are rounded to the stored type on the host (update): the kernel
        # moves them as they are (half values as their 16-bit patterns).
        kernels, _ = build_program(fmt.device, SCATTER, dtype=_moved_dtype(fmt.value_dtype),
                                   index_dtype=idx, work_group_size=WORK_GROUP_SIZE)
        self.kernel = kernels["scatter_values"]   # this updater's own kernel object

    @property
    def structure(self):
        """``(indices, indptr)`` of the pattern on the host."""
        if callable(self._structure):
            self._structure = self._structure()
        return self._structure

    @property
    def layout(self):
        """{array name: (slots, sources)} on the host (decoded from the device's codes
        on first use there), or None without a map."""
        if self._layout is None and self.has_map:
            self._layout = self.codes.layout(self.fmt.device.queue) if self.codes \
                else _layout(self.fmt, self.structure)
        return self._layout

    def update(self, queue, data) -> None:
        """Write ``data`` (CSR order, already checked) into the format's value arrays;
        returns when the device holds them."""
        fmt = self.fmt
        data = np.ascontiguousarray(data, dtype=fmt.dtype)
        if self.codes is not None:   # the codes on the device: one gather per array,
            codes = self.codes       # which also marks stored zeros (signed_zeros)
            self._launch_each(queue, GATHER, data, [
                (size, {"first": codes.first, "codes": buf, "dst": fmt.buffers[name]})
                for name, (buf, size) in codes.arrays.items()])
            return
        if type(fmt).signed_stored_zeros:   # as the conversion holds them
            data = mark_stored_zeros(data)
        if fmt.value_dtype != fmt.dtype:   # value_bits: rounded here, overflow refused
            stored = to_storage(fmt.name, data, fmt.dtype, fmt.value_dtype, update=True)
        else:
            stored = data
        if not self.has_map:   # the format's host conversion, values only
            indices, indptr = self.structure
            csr = sp.csr_matrix(fmt.shape, dtype=fmt.dtype)
            csr.data, csr.indices, csr.indptr = data, indices, indptr
            arrays = host_arrays(fmt, csr, fmt.dtype, fmt.value_dtype)
            events = [cl.enqueue_copy(queue, fmt.buffers[name], arrays[name],
                                      is_blocking=False) for name in fmt.value_array_sizes]
            cl.wait_for_events(events)
            return
        # A direct array holds data[:size] (identity slots and sources).
        sizes = fmt.value_array_sizes
        events = [cl.enqueue_copy(queue, fmt.buffers[name], stored[:sizes[name]],
                                  is_blocking=False)
                  for name in self.direct if sizes[name]]
        if not self.device_layout:
            if events:
                cl.wait_for_events(events)
            return
        self._launch_each(queue, SCATTER.kernels[0], stored, [
            (count, {"slots": slots, "sources": sources, "dst": fmt.buffers[name]})
            for name, (count, slots, sources) in self.device_layout.items()], events)

    def _launch_each(self, queue, spec, values, launches, events=()):
        """Upload ``values`` once as ``src`` and run this updater's kernel (``spec``: the
        scatter or the gather) for each ``(count, other arguments)`` of ``launches``, a
        work-item per element; returns when they and ``events`` are done."""
        events = list(events)
        src = upload(queue, values)
        types = self.fmt.scalar_types()
        for count, args in launches:
            if not count:
                continue
            # Arguments are captured at each enqueue: the one kernel object serves all.
            self.kernel.set_args(*spec.bind({"count": count, "src": src, **args}, types))
            groups = -(-count // WORK_GROUP_SIZE)
            events.append(cl.enqueue_nd_range_kernel(
                queue, self.kernel, (groups * WORK_GROUP_SIZE,), (WORK_GROUP_SIZE,)))
        if events:
            cl.wait_for_events(events)
        src.release()


def mark_stored_zeros(values: np.ndarray) -> np.ndarray:
    """``values`` with each zero as -0.0 (a complex one's real part), a new array where
    there is one: the sign bit tells a stored zero from fill (+0.0) in the formats whose
    kernels skip fill by its bits (``signed_stored_zeros``)."""
    zero = values == 0
    if not zero.any():
        return values
    return np.where(zero, values.dtype.type(-0.0), values)


def _moved_dtype(dtype):
    """The type the scatter kernel moves values of ``dtype`` as: half values (which
    OpenCL C cannot load without cl_khr_fp16) as their 16-bit patterns."""
    return np.dtype(np.uint16) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def _is_identity(positions) -> bool:
    return bool(np.array_equal(positions, np.arange(positions.size)))


def check_values(data, nnz: int, complex_ok: bool = False, dtype=None, queue=None):
    """``data`` as a 1-D numpy array of ``nnz`` numbers (real ones unless
    ``complex_ok``: a complex operator), or a clear error; a pyopencl array is checked
    alike and read to the host (``queue``: where it has none), where an update starts
    (rounding, stored zeros' sign, the transposed copy's order).  With ``dtype`` (the
    operator's), finite values that would overflow it are refused."""
    if sp.issparse(data):
        raise InvalidInputError("update_values takes the new values array (CSR order, as "
                                "A.data), not a sparse matrix")
    if isinstance(data, cla.Array):   # checked before the read: no transfer of a wrong one
        _check_kind_and_size(data, nnz, complex_ok)
        if data.size and not data.flags.c_contiguous:   # pyopencl reads contiguous ones
            raise InvalidInputError("update_values takes a contiguous pyopencl array (a "
                                    "strided view cannot be read back): pass view.copy()")
        data = data.get(queue=data.queue if data.queue is not None else queue)
    else:
        data = np.asarray(data)
        _check_kind_and_size(data, nnz, complex_ok)
    if dtype is not None:
        check_value_range(data, dtype, "update_values' data")
    return data


def _check_kind_and_size(data, nnz, complex_ok):
    if data.dtype.kind == "c" and not complex_ok:
        raise UnsupportedDtypeError(
            f"values are complex ({data.dtype}); this operator is real: build it with "
            "dtype=numpy.complex64 or numpy.complex128 to update it with complex values")
    if data.dtype.kind not in "fiubc":
        raise UnsupportedDtypeError(
            f"values must be numbers (a numpy or pyopencl array of {nnz}), not "
            f"{data.dtype}")
    if data.ndim != 1 or data.size != nnz:
        raise InvalidInputError(f"update_values needs {nnz} values (one per stored entry, in "
                                f"the CSR order of the matrix given), got shape {data.shape}")
