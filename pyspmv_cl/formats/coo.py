"""``coo``: coordinate format (row, col, value), multiplied by segmented reduction over
fixed-size chunks of non-zeros (Bell & Garland's COO kernel): each work-group takes
``work_group_size * items_per_thread`` consecutive non-zeros, so the load is balanced
whatever the row lengths.  Rows crossing work-groups leave carries that a second
kernel adds up in order: no float atomics, no group waits on another, deterministic.

:class:`COOPart` is the COO piece (analysis, program, arrays, scratch, launches) that
``coo`` and ``hyb`` (its COO remainder) compose; the format around it builds, uploads
and allocates.
"""

import numpy as np
import pyopencl.array as cla

from ..codegen import (
    ALPHA_ARG,
    BETA_ARG,
    X_ARG,
    Y_ARG,
    KernelSpec,
    c_type,
    matrix,
    scalar,
    scratch,
)
from ..errors import InvalidParameterError
from ..host_arrays import repeat as repeat_in_pieces
from . import params as P
from .base import SpMVFormat, pow2_floor, round_up
from .builder import ProgramSpec
from .registry import register

LAYOUTS = ("interleaved", "contiguous")
SCANS = ("tree", "serial")
# CPUs: items per work-item between these (powers of two), chosen from nnz so that
# there are a few chunks per compute unit.
CPU_ITEMS = (64, 1024)
CPU_WORK_GROUP_SIZE = 8
# The interleaved layout pads the arrays to whole chunks: bound the padding.
MAX_INTERLEAVED_CHUNK = 2**20
# Work-items per launch of the small carry and empty-row kernels.
AUX_WORK_GROUP_SIZE = 64
# Chunk positions inside coo_chunks run up to nnz + 2 chunks (the start of the last
# chunk plus the item offsets), exactly: 32-bit positions up to this bound.
POS_LIMIT = 2**31 - 1

#: The kernels of templates/coo.mako.
COO_KERNELS = (
    KernelSpec("coo_chunks", (
        scalar("nnz", "pos_t"), scalar("n_rows", "index_t"), matrix("rows", "index_t"),
        matrix("cols", "index_t"), matrix("values", "real_t"), X_ARG, Y_ARG,
        scratch("carry_rows", "index_t"), scratch("carry_values", "real_t"), ALPHA_ARG,
        BETA_ARG), fixed_group=True),
    KernelSpec("coo_carries", (
        scalar("n_carries", "ulong"), scratch("carry_rows", "index_t", read_only=True),
        scratch("carry_values", "real_t", read_only=True), Y_ARG, ALPHA_ARG, BETA_ARG)),
    KernelSpec("coo_empty_rows", (
        scalar("n_empty", "ulong"), matrix("empty_rows", "index_t"), Y_ARG, ALPHA_ARG,
        BETA_ARG)),
)

#: The kernels of templates/coo_convert.mako (conversion on the device).
COO_CONVERT_KERNELS = (
    KernelSpec("coo_expand", (
        scalar("n_rows", "long"), scalar("group", "long"), scalar("items", "long"),
        scalar("skip", "long"), matrix("csr_row_ptr", "index_t"),
        matrix("part_row_ptr", "index_t"), matrix("csr_col_idx", "index_t"),
        matrix("csr_values", "real_t"), scratch("rows_out", "index_t"),
        scratch("cols_out", "index_t"), scratch("values_out", "real_t"))),
    KernelSpec("coo_pad", (
        scalar("nnz", "long"), scalar("n_total", "long"), scalar("group", "long"),
        scalar("items", "long"), scalar("last_row", "index_t"), scratch("rows_out", "index_t"),
        scratch("cols_out", "index_t"), scratch("values_out", "real_t"))),
)
#: Work-items per group of the conversion kernels.
CONVERT_GROUP = 64

#: The chunk geometry parameters (``hyb`` declares them too, optional there).
ITEMS_PER_THREAD = P.Param("items_per_thread", P.positive_int(),
                           "consecutive non-zeros each work-item reduces")
LAYOUT = P.Param("layout", P.one_of(*LAYOUTS),
                 "'interleaved' (coalesced, GPUs) or 'contiguous' (one run per work-item)")
SCAN = P.Param("scan", P.one_of(*SCANS),
               "'tree' (log2 steps, GPUs) or 'serial' (one work-item, CPUs)")


def default_coo_params(nnz, profile, dtype):
    """Chunk geometry for this device.  GPUs: a few warps per group, a handful of
    non-zeros per work-item read coalesced (interleaved layout), a tree scan.  CPUs
    (PoCL runs a group's work-items as a loop and barriers split that loop): few
    work-items, each streaming a long contiguous run, one serial scan."""
    if profile.is_gpu:
        lanes = max(1, profile.simd_width)
        wg = min(max(256, lanes), profile.max_work_group_size)
        wg = max(1, wg - wg % lanes) if wg >= lanes else wg
        items = 4 if np.dtype(dtype) == np.float64 else 8
        return {"work_group_size": wg, "items_per_thread": items,
                "layout": "interleaved", "scan": "tree"}
    wg = min(CPU_WORK_GROUP_SIZE, profile.max_work_group_size)
    lo, hi = CPU_ITEMS
    target = nnz // (4 * max(1, profile.compute_units) * wg)  # ~4 chunks per unit
    items = min(hi, max(lo, pow2_floor(max(1, target))))
    return {"work_group_size": wg, "items_per_thread": items,
            "layout": "contiguous", "scan": "serial"}


def check_chunk(name, work_group_size, items_per_thread, layout):
    """The interleaved layout pads the last chunk: refuse chunks over
    MAX_INTERLEAVED_CHUNK entries with it."""
    chunk = work_group_size * items_per_thread
    if layout == "interleaved" and chunk > MAX_INTERLEAVED_CHUNK:
        raise InvalidParameterError(
            f"{name}: the interleaved layout pads the last chunk to work_group_size * "
            f"items_per_thread = {chunk} entries; keep it at most {MAX_INTERLEAVED_CHUNK} "
            f"or use layout='contiguous'")


def coo_local_bytes(work_group_size, index_dtype, dtype):
    return work_group_size * (2 * np.dtype(index_dtype).itemsize + np.dtype(dtype).itemsize)


class COOPart:
    """The COO piece of a format: sorted COO arrays of a CSR matrix and the launches
    that multiply them.  It builds and allocates nothing: its ``owner`` (the format)
    builds :meth:`program`, uploads :meth:`host_arrays`, allocates
    :meth:`scratch_sizes` and launches :meth:`steps`.

    The chunk geometry is read from ``owner.params``: ``items_per_thread``, ``layout``,
    ``scan`` and the work-group size under ``group_param`` (read when needed: the
    build may shrink it, before the arrays are laid out).  Array and scratch names
    carry ``prefix``.  With ``empty_rows=False`` rows without non-zeros are left
    untouched, which suits adding into a y that another part has already written
    (``beta == 1``)."""

    def __init__(self, owner, *, group_param="work_group_size", prefix="", empty_rows=True):
        self.owner = owner
        self.group_param = group_param
        self.prefix = prefix
        self.empty_rows = empty_rows

    # -- analysis ------------------------------------------------------------------------
    def analyse(self, csr):
        """Counts and the position type (before the build: the kernel source uses it)."""
        self.n_rows = int(csr.shape[0])
        self.nnz = int(csr.nnz)
        lengths = getattr(csr, "row_lengths", None)   # hyb's COO part has them
        self.row_lengths = np.diff(csr.indptr) if lengths is None else lengths
        self.n_empty = (int(np.count_nonzero(self.row_lengths == 0)) if self.empty_rows
                        else 0)
        self.pos_dtype = self._pos_dtype(self.work_group_size * self.items_per_thread)

    def _pos_dtype(self, chunk):
        # Positions run up to nnz + 2 chunks inside the kernel: 32 bits while that fits.
        if self.owner.index_dtype == np.int64 or self.nnz + 2 * chunk > POS_LIMIT:
            return np.dtype(np.int64)
        return np.dtype(np.int32)

    @property
    def work_group_size(self):
        return self.owner.params[self.group_param]

    @property
    def items_per_thread(self):
        return self.owner.params["items_per_thread"]

    @property
    def chunk(self):
        return self.work_group_size * self.items_per_thread

    @property
    def n_groups(self):
        return -(-self.nnz // self.chunk)

    @property
    def active(self):
        """Whether there is anything to launch (non-zeros, or empty rows to scale)."""
        return bool(self.nnz or self.n_empty)

    # -- program -------------------------------------------------------------------------
    def program(self):
        p = self.owner.params
        return ProgramSpec("coo.mako", COO_KERNELS, {
            "items_per_thread": p["items_per_thread"], "layout": p["layout"],
            "scan": p["scan"], "pos_t": c_type(self.pos_dtype)}, group_param=self.group_param)

    def conversion_program(self):
        """The program that lays the arrays out on the device (device_arrays)."""
        return ProgramSpec("coo_convert.mako", COO_CONVERT_KERNELS,
                           {"layout": self.owner.params["layout"]})

    def type_names(self):
        return {"pos_t": self.pos_dtype}

    def local_bytes(self, work_group_size):
        return coo_local_bytes(work_group_size, self.owner.index_dtype, self.owner.dtype)

    # -- arrays --------------------------------------------------------------------------
    def host_arrays(self, csr):
        """rows, cols, values in chunk layout (the interleaved layout pads the last
        chunk; padding is never read) and the list of empty rows, names prefixed."""
        owner, p = self.owner, self.owner.params
        idx = owner.index_dtype
        rows = repeat_in_pieces(np.arange(self.n_rows, dtype=idx), self.row_lengths)
        cols = csr.indices.astype(idx, copy=False)
        values = csr.data.astype(owner.dtype, copy=False)
        if p["layout"] == "interleaved" and self.nnz:
            wg, items = self.work_group_size, self.items_per_thread
            pad = self.n_groups * self.chunk - self.nnz
            arrays = []
            for a, fill in ((rows, rows[-1]), (cols, 0), (values, 0)):
                a = np.concatenate([a, np.full(pad, fill, dtype=a.dtype)])
                # logical (group, item, k) -> physical (group, k, item)
                arrays.append(a.reshape(self.n_groups, wg, items).transpose(0, 2, 1).ravel())
            rows, cols, values = arrays
        out = {"rows": rows, "cols": cols, "values": values}
        if self.n_empty:
            out["empty_rows"] = np.flatnonzero(self.row_lengths == 0).astype(idx)
        del self.row_lengths
        return {self.prefix + k: v for k, v in out.items()}

    def device_arrays(self, csr, skip=0, part_indptr=None):
        """The arrays of :meth:`host_arrays`, identical, made on the device from a
        DeviceCSR (only the empty-row list is computed on the host, from indptr).  For
        hyb's COO part: each row's entries after its first ``skip``, which this part
        (analysed with ``part_indptr``, on the host) holds."""
        owner, queue = self.owner, self.owner.device.queue
        idx = owner.index_dtype
        n_total = self.n_groups * self.chunk if owner.params["layout"] == "interleaved" \
            else self.nnz
        out = {name: cla.empty(queue, max(1, n_total), dtype) for name, dtype in
               (("rows", idx), ("cols", idx), ("values", owner.dtype))}
        if self.nnz:
            wg = min(CONVERT_GROUP, owner.profile.max_work_group_size)
            geometry = {"group": self.work_group_size, "items": self.items_per_thread,
                        "rows_out": out["rows"].base_data, "cols_out": out["cols"].base_data,
                        "values_out": out["values"].base_data}
            row_ptr = csr.as_type("indptr", idx, queue)
            part_ptr = row_ptr if part_indptr is None else cla.to_device(
                queue, np.asarray(part_indptr).astype(idx))
            steps = [owner.step(
                "coo_expand", round_up(self.n_rows, wg), wg, n_rows=self.n_rows,
                skip=int(skip), csr_row_ptr=row_ptr.base_data,
                part_row_ptr=part_ptr.base_data,
                csr_col_idx=csr.as_type("indices", idx, queue).base_data,
                csr_values=csr.as_type("data", owner.dtype, queue).base_data, **geometry)]
            if n_total > self.nnz:
                last_row = int(np.flatnonzero(self.row_lengths)[-1])
                steps.append(owner.step("coo_pad", round_up(n_total - self.nnz, wg), wg,
                                        nnz=self.nnz, n_total=n_total, last_row=last_row,
                                        **geometry))
            owner.run_now(queue, steps)   # done before any product
        if n_total == 0:
            out = {name: arr[:0] for name, arr in out.items()}
        if self.n_empty:
            out["empty_rows"] = cla.to_device(
                queue, np.flatnonzero(self.row_lengths == 0).astype(idx))
        del self.row_lengths
        return {self.prefix + k: v for k, v in out.items()}

    def values_in_order(self, queue):
        """This part's values in the order of its CSR: as stored (contiguous layout),
        or each chunk's (item, work-item) order transposed back (interleaved), padding
        dropped (``SpMVFormat.values_in_csr_order``)."""
        owner, name = self.owner, self.prefix + "values"
        if owner.params["layout"] != "interleaved" or not self.nnz:
            return owner._read_values(queue, name, self.nnz)
        wg, items = self.work_group_size, self.items_per_thread
        stored = owner._read_values(queue, name, self.n_groups * self.chunk)
        return stored.reshape(self.n_groups, items, wg).transpose(0, 2, 1).ravel()[:self.nnz]

    def scratch_sizes(self):
        """The two carries (row, value) per group, names prefixed."""
        n = 2 * self.n_groups
        return {self.prefix + "carry_rows": n * self.owner.index_dtype.itemsize,
                self.prefix + "carry_values": n * self.owner.dtype.itemsize}

    # -- launches ------------------------------------------------------------------------
    def steps(self, beta, *, accumulate=False, empty_rows=False):
        """The launches of y = alpha * A @ x + beta * y over this part's rows (none when
        there is nothing to do); ``accumulate``: y += alpha * A @ x whatever the
        product's beta (the part adds into a y another part has written);
        ``empty_rows``: the rows without entries written even where beta is 1."""
        owner, out = self.owner, []
        values = {"beta": owner.dtype.type(1)} if accumulate else {}
        if self.n_empty and (beta != 1 or empty_rows) and not accumulate:
            out.append(owner.step("coo_empty_rows", round_up(self.n_empty, AUX_WORK_GROUP_SIZE),
                                  AUX_WORK_GROUP_SIZE, prefix=self.prefix,
                                  n_empty=self.n_empty))
        if self.nnz:
            wg = self.work_group_size
            out.append(owner.step("coo_chunks", self.n_groups * wg, wg, prefix=self.prefix,
                                  nnz=self.nnz, n_rows=self.n_rows, **values))
            n_carries = 2 * self.n_groups
            out.append(owner.step("coo_carries", round_up(n_carries, AUX_WORK_GROUP_SIZE),
                                  AUX_WORK_GROUP_SIZE, prefix=self.prefix,
                                  n_carries=n_carries, **values))
        return out


@register
class COO(SpMVFormat):
    name = "coo"
    complex_values = True
    order = 2
    template = "coo.mako"
    converts_on_device = True
    host_input_on_device = True   # GPUs: the row expansion and layout on the device
    value_read = "reshape"        # values_in_csr_order: the chunks' order undone
    params = (P.work_group_size(), ITEMS_PER_THREAD, LAYOUT, SCAN)

    @classmethod
    def default_params(cls, features, profile, dtype):
        return default_coo_params(features.nnz, profile, dtype)

    @classmethod
    def check_params(cls, params, profile):
        check_chunk(cls.name, params["work_group_size"], params["items_per_thread"],
                    params["layout"])

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        v, i = np.dtype(dtype).itemsize, 4
        return max(features.nnz, 1) * (v + 2 * i) / 0.7, None

    def analyse(self, csr):
        self.part = COOPart(self)
        self.part.analyse(csr)

    def programs(self):
        if not self.part.active:
            return []
        conversion = [self.part.conversion_program()] if self.converting_on_device else []
        return [self.part.program(), *conversion]

    def local_bytes(self, work_group_size):
        return self.part.local_bytes(work_group_size)

    def type_names(self):
        return self.part.type_names()

    def convert(self, csr):
        return self.part.host_arrays(csr)

    def convert_device(self, csr):
        return self.part.device_arrays(csr)

    def values_in_csr_order(self, queue, indptr):
        return self.part.values_in_order(queue)

    def scratch_sizes(self):
        return self.part.scratch_sizes()

    def launches(self, beta):
        return self.part.steps(beta)

    def launches_for(self, alpha, beta):
        # beta == 1 leaves the rows without entries as they are, unless alpha * 0 is NaN
        # there (alpha inf or NaN), as in every other format and in numpy
        return self.part.steps(beta, empty_rows=not np.isfinite(alpha))
