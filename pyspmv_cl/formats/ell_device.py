"""Device-side conversion of the ELL family (``ell``, ``ellr-t``) from a CSR on the
device (``templates/pad_scatter.mako``): the host computes nothing per non-zero, only
the layout from ``indptr`` (the longest row); two kernels fill the padding and scatter
the entries.  The arrays are identical to the host conversion's (``ell_arrays``,
``ellrt_arrays``)."""

from __future__ import annotations

import pyopencl.array as cla

from ..codegen import KernelSpec, matrix, scalar, scratch
from .base import round_up
from .builder import ProgramSpec

#: Work-group size of the conversion kernels (one work-item per slot or row).
GROUP = 64

PAD_FILL = KernelSpec("pad_fill", (scalar("n_slots", "long"), scratch("col_idx_out", "index_t"),
                                   scratch("values_out", "real_t")))
ROW_SCATTER = KernelSpec("row_scatter", (
    scalar("n_rows", "long"), scalar("slice", "long"), scalar("limit", "long"),
    matrix("csr_row_ptr", "index_t"),
    matrix("csr_col_idx", "index_t"), matrix("csr_values", "real_t"),
    scratch("col_idx_out", "index_t"), scratch("values_out", "real_t")))


def program(t: int) -> ProgramSpec:
    """The conversion program for ``t`` slots per row and iteration (1 for ``ell``)."""
    return ProgramSpec("pad_scatter.mako", (PAD_FILL, ROW_SCATTER), {"T": int(t)})


def scatter(fmt, csr, n_slots: int, slice_: int, limit: int | None = None, prefix=""):
    """``(col_idx, values)``: device arrays of ``n_slots`` slots holding ``csr`` (a
    DeviceCSR) as the program of ``fmt`` lays it out, at most ``limit`` entries of a
    row (None: all); done when this returns.  ``prefix``: of the kernels' step names."""
    queue = fmt.device.queue
    col_idx = cla.empty(queue, max(1, n_slots), fmt.index_dtype)
    values = cla.empty(queue, max(1, n_slots), fmt.dtype)
    wg = min(GROUP, fmt.profile.max_work_group_size)
    steps = [fmt.step("pad_fill", round_up(max(1, n_slots), wg), wg, prefix=prefix,
                      n_slots=n_slots,
                      col_idx_out=col_idx.base_data, values_out=values.base_data)]
    if csr.nnz:
        steps.append(fmt.step(
            "row_scatter", round_up(fmt.shape[0], wg), wg, prefix=prefix,
            n_rows=fmt.shape[0], slice=slice_,
            limit=(1 << 62) if limit is None else int(limit),
            csr_row_ptr=csr.as_type("indptr", fmt.index_dtype, queue).base_data,
            csr_col_idx=csr.as_type("indices", fmt.index_dtype, queue).base_data,
            csr_values=csr.as_type("data", fmt.dtype, queue).base_data,
            col_idx_out=col_idx.base_data, values_out=values.base_data))
    fmt.run_now(queue, steps)   # done before any product, whatever the queue's order
    if n_slots == 0:
        return col_idx[:0], values[:0]
    return col_idx, values
