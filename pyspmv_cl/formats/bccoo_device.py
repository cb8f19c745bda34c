"""Device-side conversion of ``bccoo`` (``templates/bccoo_convert.mako``) from a CSR on
the device, for the GPU default: 1 x 1 blocks in one slice, real values, rows whose
columns strictly increase.  Each entry is then a block of its own and an empty row one
dummy block, so the host needs only ``indptr`` (the empty rows); three kernels check
the rows' order, lay the tiles out and mark the groups whose threads all have a row
stop.  The arrays are identical to the host conversion's (``bccoo_convert.build_blocks``
+ ``layout``); a matrix whose rows are not in order is read back and converted on the
host, as before."""

from __future__ import annotations

import numpy as np
import pyopencl.array as cla

from ..codegen import KernelSpec, matrix, scalar, scratch
from ..device_inputs import DeviceCSR
from .base import round_up
from .bccoo_convert import FLAG_TYPES, build_blocks, tile_geometry
from .builder import ProgramSpec

#: Work-group size of the conversion kernels (a work-item per row, thread or group).
GROUP = 64

CHECK_ROWS = KernelSpec("bccoo_check_rows", (
    scalar("n_rows", "long"), matrix("csr_row_ptr", "index_t"),
    matrix("csr_col_idx", "index_t"), scratch("bad", "int")))


def _convert_spec(col_compress: bool) -> KernelSpec:
    return KernelSpec("bccoo_convert", (
        scalar("n_rows", "long"), scalar("n_blocks", "long"), scalar("n_threads", "long"),
        scalar("group", "long"), matrix("first_block", "pos_t"),
        matrix("csr_row_ptr", "index_t"), matrix("csr_col_idx", "index_t"),
        matrix("csr_values", "real_t"), scratch("flags_out", "flag_t"),
        *((scratch("col_delta_out", "short"),) if col_compress else ()),
        scratch("cols_out", "col_t"), scratch("values_out", "real_t"),
        scratch("first_entry", "pos_t")))


GROUP_FULL = KernelSpec("bccoo_group_full", (
    scalar("n_groups", "long"), scalar("group", "long"),
    scratch("first_entry", "pos_t", read_only=True), scratch("group_full", "uchar")))


def applies(params: dict, dtype) -> bool:
    """Whether these parameters and values convert on the device (the rest: the host)."""
    return (np.dtype(dtype).kind == "f" and params.get("block_height", 1) == 1
            and params.get("block_width", 1) == 1 and params.get("slices", 1) == 1)


def first_blocks(indptr: np.ndarray) -> tuple[int, np.ndarray | None]:
    """``(blocks, first block of each row and one past the last, or None)``: each entry
    a block, one dummy per empty row; None when no row is empty (``indptr`` is then the
    answer, already on the device)."""
    empty = indptr[1:] == indptr[:-1]
    n_empty = int(np.count_nonzero(empty))
    if not n_empty:
        return int(indptr[-1]), None
    first = np.asarray(indptr, dtype=np.int64).copy()
    first[1:] += np.cumsum(empty)
    return int(indptr[-1]) + n_empty, first


def program(fmt) -> ProgramSpec:
    """The conversion program for ``fmt``'s parameters and types."""
    p = fmt.params
    names = fmt.template_params()
    return ProgramSpec("bccoo_convert.mako", (CHECK_ROWS, _convert_spec(p["col_compress"]),
                                              GROUP_FULL), {
        "pos_t": names["pos_t"], "flag_t": names["flag_t"], "col_t": names["col_t"],
        "tile_size": p["tile_size"], "flag_bits": p["flag_bits"],
        "n_words": names["n_words"], "transpose": p["transpose"],
        "col_compress": p["col_compress"]})


def convert(fmt, csr: DeviceCSR, n_blocks: int, first_block) -> dict | None:
    """The format's arrays on the device (name -> pyopencl array, the host layout's
    order), done when this returns, and ``fmt.geometry`` set; None, having launched
    nothing that stays, when a row's columns are not strictly increasing."""
    queue = fmt.device.queue
    p = fmt.params
    idx, pos = fmt.index_dtype, fmt.pos_dtype
    T, wg_layout = p["tile_size"], p["work_group_size"]
    wg = min(GROUP, fmt.profile.max_work_group_size)
    row_ptr = csr.as_type("indptr", idx, queue)
    col_idx = csr.as_type("indices", idx, queue)
    if fmt.run_check(queue, "bccoo_check_rows", round_up(fmt.shape[0], wg), wg,
                     n_rows=fmt.shape[0], csr_row_ptr=row_ptr.base_data,
                     csr_col_idx=col_idx.base_data):
        return None
    values = csr.as_type("data", fmt.dtype, queue)
    if first_block is None and idx == pos:
        first = row_ptr
    else:
        host = csr.indptr if first_block is None else first_block
        first = cla.to_device(queue, np.asarray(host, dtype=pos))
    nb_pad, n_threads, n_groups = tile_geometry(n_blocks, T, wg_layout)
    n_words = -(-T // p["flag_bits"])

    def empty(size, dtype):
        return cla.empty(queue, max(1, size), dtype)

    out = {"flags": empty(n_threads * n_words, FLAG_TYPES[p["flag_bits"]])}
    if p["col_compress"]:
        out["col_delta"] = empty(nb_pad, np.int16)
    out["cols"] = empty(nb_pad, fmt.col_dtype)
    out["values"] = empty(nb_pad, fmt.dtype)
    out["first_entry"] = empty(n_threads + 1, pos)
    out["group_full"] = empty(n_groups, np.uint8)
    delta = {"col_delta_out": out["col_delta"].base_data} if p["col_compress"] else {}
    steps = [
        fmt.step("bccoo_convert", round_up(n_threads + 1, wg), wg, n_rows=fmt.shape[0],
                 n_blocks=n_blocks, n_threads=n_threads, group=wg_layout,
                 first_block=first.base_data, csr_row_ptr=row_ptr.base_data,
                 csr_col_idx=col_idx.base_data, csr_values=values.base_data,
                 flags_out=out["flags"].base_data, cols_out=out["cols"].base_data,
                 values_out=out["values"].base_data,
                 first_entry=out["first_entry"].base_data, **delta),
        fmt.step("bccoo_group_full", round_up(n_groups, wg), wg, n_groups=n_groups,
                 group=wg_layout, first_entry=out["first_entry"].base_data,
                 group_full=out["group_full"].base_data)]
    fmt.run_now(queue, steps)   # done before any product, whatever the queue's order
    fmt.geometry = {"n_blocks_padded": nb_pad, "n_threads": n_threads, "n_groups": n_groups}
    return out


def host_blocks(fmt, csr: DeviceCSR):
    """The blocks of a device matrix read back (rows out of order: the host path)."""
    p = fmt.params
    return build_blocks(csr.to_host(fmt.device.queue), p["block_height"], p["block_width"],
                        p["slices"], fmt.dtype)
