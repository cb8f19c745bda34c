"""Device-side conversion of ``dia`` (``templates/dia_convert.mako``) from a CSR on the
device.  ``analyse`` runs ``dia_mark`` on the device: one flag per possible diagonal
(``m + n - 1`` bytes) comes back, with whether a row is out of order and whether a
stored value is zero; the host lists the occupied diagonals from the flags and makes
DIA's checks as before.  ``convert_device`` zeroes ``data`` (and the validity
bitmap) and runs ``dia_scatter``.  The arrays are identical to the host conversion's;
rows out of order (duplicates need DIA's layers) are read back and converted on the
host, as is a matrix so wide that the flags would outweigh it."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from ..codegen import KernelSpec, matrix, scalar, scratch
from ..device_inputs import DeviceCSR
from .base import round_up
from .builder import ProgramSpec, build_program

#: Work-group size of the conversion kernels (a work-item per row).
GROUP = 64

CSR_ARGS = (matrix("csr_row_ptr", "index_t"), matrix("csr_col_idx", "index_t"),
            matrix("csr_values", "real_t"))
MARK = KernelSpec("dia_mark", (scalar("n_rows", "long"), *CSR_ARGS,
                               scratch("present", "uchar"), scratch("flags", "int")))
ZERO = KernelSpec("dia_zero", (scalar("n_slots", "long"), scalar("n_words", "long"),
                              scratch("data_out", "real_t"), scratch("mask_out", "uint")))
SCATTER = KernelSpec("dia_scatter", (
    scalar("n_rows", "long"), scalar("stride", "long"), scalar("n_diags", "long"),
    scalar("with_mask", "int"), matrix("offsets", "index_t"), *CSR_ARGS,
    scratch("data_out", "real_t"), scratch("mask_out", "uint")))


def fits(shape, nnz) -> bool:
    """Whether an array over every possible diagonal (``m + n - 1`` of them) is small
    beside the matrix: the device's flags and the host's count (formats/dia.py's
    dia_diagonals) are made only then; the host sorts the offsets otherwise."""
    return nnz > 0 and shape[0] + shape[1] <= 4 * nnz + (1 << 20)


def _program(fmt):
    """``(specs, kernels)`` of the conversion program, built once per specialisation and
    kept per thread (as csr5's: the kernels run at once after their arguments are set)."""
    key = ("dia-convert", fmt.profile, fmt.dtype.str, fmt.index_dtype.str)

    def build():
        spec = ProgramSpec("dia_convert.mako", (MARK, ZERO, SCATTER))
        kernels, _ = build_program(fmt.device, spec, dtype=fmt.dtype,
                                   index_dtype=fmt.index_dtype, work_group_size=GROUP)
        return {k.name: k for k in spec.kernels}, kernels

    return fmt.device.thread_cached(key, build)


class Layout:
    """What ``analyse`` found on the device, kept for ``convert_device``."""

    def __init__(self, offsets, has_mask, csr_buffers):
        self.offsets = offsets            # the occupied diagonals, sorted (int64)
        self.has_mask = has_mask          # a stored value is zero
        self.csr_buffers = csr_buffers    # the CSR as the kernels read it


def analyse(fmt, csr: DeviceCSR) -> Layout | None:
    """The occupied diagonals and whether a stored value is zero, from ``dia_mark`` on
    the device; None when a row's columns do not strictly increase."""
    queue = fmt.device.queue
    m, n = fmt.shape
    specs, kernels = _program(fmt)
    wg = min(GROUP, fmt.profile.max_work_group_size)
    bufs = {"csr_row_ptr": csr.as_type("indptr", fmt.index_dtype, queue),
            "csr_col_idx": csr.as_type("indices", fmt.index_dtype, queue),
            "csr_values": csr.as_type("data", fmt.dtype, queue)}
    present = cla.zeros(queue, m + n - 1, np.uint8)
    flags = cla.zeros(queue, 2, np.int32)
    event = fmt.run_now(queue, [fmt.step(
        "dia_mark", round_up(m, wg), wg, n_rows=m, present=present.base_data,
        flags=flags.base_data, **{k: v.base_data for k, v in bufs.items()})],
        specs=specs, kernels=kernels, finish=False)
    found = np.empty(2, np.int32)
    marks = np.empty(m + n - 1, np.uint8)
    cl.enqueue_copy(queue, found, flags.base_data, wait_for=[event])
    cl.enqueue_copy(queue, marks, present.base_data, is_blocking=True)
    if found[0]:
        return None
    return Layout(np.flatnonzero(marks) - (m - 1), bool(found[1]), bufs)


def convert(fmt, layout: Layout) -> dict:
    """``offsets``, ``data`` and (with stored zeros) ``mask`` on the device, done when
    this returns."""
    queue = fmt.device.queue
    specs, kernels = _program(fmt)
    m = fmt.shape[0]
    slots = fmt.n_diags * fmt.stride
    out = {"offsets": cla.to_device(queue, layout.offsets.astype(fmt.index_dtype)),
           "data": cla.empty(queue, max(1, slots), fmt.dtype)}
    if layout.has_mask:
        out["mask"] = cla.empty(queue, max(1, -(-slots // 32)), np.uint32)
    words = out["mask"].size if layout.has_mask else 0
    mask = (out["mask"] if layout.has_mask else out["data"]).base_data   # else unused
    wg = min(GROUP, fmt.profile.max_work_group_size)
    fmt.run_now(queue, [
        fmt.step("dia_zero", round_up(max(slots, words, 1), wg), wg, n_slots=slots,
                 n_words=words, data_out=out["data"].base_data, mask_out=mask),
        fmt.step("dia_scatter", round_up(m, wg), wg, n_rows=m, stride=fmt.stride,
                 n_diags=fmt.n_diags, with_mask=int(layout.has_mask),
                 offsets=out["offsets"].base_data, data_out=out["data"].base_data,
                 mask_out=mask, **{k: v.base_data for k, v in layout.csr_buffers.items()})],
        specs=specs, kernels=kernels)   # done before any product, whatever the order
    return out
