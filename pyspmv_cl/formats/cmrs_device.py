"""Device-side conversion of ``cmrs`` (``templates/cmrs_convert.mako``) from a CSR on
the device.  The host takes ``strip_ptr`` from its copy of ``indptr`` (one index per
strip); one kernel puts each entry at its slot, with ``sort_columns`` its rank in its
strip's stable sort by column (binary searches in the strip's other rows: each row must
be in order, which a first kernel checks, one number read back).  The arrays are
identical to the host conversion's; a matrix whose rows are out of order is read back
and converted on the host, as before."""

from __future__ import annotations

import numpy as np
import pyopencl.array as cla

from ..codegen import KernelSpec, c_type, matrix, scalar, scratch
from ..device_inputs import DeviceCSR
from .base import round_up
from .builder import ProgramSpec

#: Work-group size of the conversion kernels (a work-item per row or entry).
GROUP = 64

CHECK_ROWS = KernelSpec("cmrs_check_rows", (
    scalar("n_rows", "long"), matrix("csr_row_ptr", "index_t"),
    matrix("csr_col_idx", "index_t"), scratch("bad", "int")))


def _scatter_spec(packed: bool, word: str) -> KernelSpec:
    outputs = (scratch("col_idx_out", word),) if packed else (
        scratch("col_idx_out", "index_t"), scratch("row_in_strip_out", "uchar"))
    return KernelSpec("cmrs_scatter", (
        scalar("n_rows", "long"), scalar("nnz", "long"), scalar("height", "long"),
        matrix("csr_row_ptr", "index_t"), matrix("csr_col_idx", "index_t"),
        matrix("csr_values", "real_t"), *outputs, scratch("values_out", "real_t")))


def _word(index_dtype) -> str:
    """The packed words' type: the index type's unsigned twin (uint / ulong)."""
    return "u" + c_type(index_dtype)


def program(fmt) -> ProgramSpec:
    """The conversion program for ``fmt``'s parameters and types."""
    word = _word(fmt.index_dtype)
    return ProgramSpec("cmrs_convert.mako", (CHECK_ROWS, _scatter_spec(fmt.packed, word)), {
        "packed": fmt.packed, "word_t": word, "row_shift": fmt.row_shift,
        "sort_columns": bool(fmt.params["sort_columns"])})


def convert(fmt, csr: DeviceCSR, strip_ptr: np.ndarray) -> dict | None:
    """The format's arrays on the device (name -> pyopencl array, the host conversion's
    order), done when this returns; None, having launched nothing that stays, when
    ``sort_columns`` meets a row whose columns decrease."""
    queue = fmt.device.queue
    m, nnz = fmt.shape[0], csr.nnz
    wg = min(GROUP, fmt.profile.max_work_group_size)
    row_ptr = csr.as_type("indptr", fmt.index_dtype, queue)
    col_idx = csr.as_type("indices", fmt.index_dtype, queue)
    if fmt.params["sort_columns"] and fmt.run_check(
            queue, "cmrs_check_rows", round_up(m, wg), wg, n_rows=m,
            csr_row_ptr=row_ptr.base_data, csr_col_idx=col_idx.base_data):
        return None
    values = csr.as_type("data", fmt.dtype, queue)
    out = {"strip_ptr": cla.to_device(queue, strip_ptr.astype(fmt.index_dtype))}
    if fmt.packed:
        out["col_idx"] = cla.empty(queue, max(1, nnz), fmt.word_dtype)
        outputs = {"col_idx_out": out["col_idx"].base_data}
    else:
        out["col_idx"] = cla.empty(queue, max(1, nnz), fmt.index_dtype)
        out["row_in_strip"] = cla.empty(queue, max(1, nnz), np.uint8)
        outputs = {"col_idx_out": out["col_idx"].base_data,
                   "row_in_strip_out": out["row_in_strip"].base_data}
    out["values"] = cla.empty(queue, max(1, nnz), fmt.dtype)
    fmt.run_now(queue, [fmt.step(
        "cmrs_scatter", round_up(max(1, nnz), wg), wg, n_rows=m, nnz=nnz,
        height=fmt.params["height"], csr_row_ptr=row_ptr.base_data,
        csr_col_idx=col_idx.base_data, csr_values=values.base_data,
        values_out=out["values"].base_data, **outputs)])   # done before any product
    return out
