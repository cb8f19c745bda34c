"""``coo``: coordinate format (row, col, value), multiplied by segmented reduction over
fixed-size chunks of non-zeros (Bell & Garland's COO kernel): each work-group takes
``work_group_size * items_per_thread`` consecutive non-zeros, so the load is balanced
whatever the row lengths.  Rows crossing work-groups leave carries that a second
kernel adds up in order: no float atomics, no group waits on another, deterministic.

:class:`COOPart` is the device side (arrays, kernels, launches) that ``hyb`` reuses for
its COO remainder.
"""

import numpy as np
import pyopencl as cl

from .base import Launch, SpMVFormat, pow2_floor

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


def check_coo_params(name, params):
    items = params.get("items_per_thread")
    if not isinstance(items, (int, np.integer)) or isinstance(items, bool) or items < 1:
        raise ValueError(f"{name}: items_per_thread must be a positive integer, not {items!r}")
    params["items_per_thread"] = int(items)
    if params.get("layout") not in LAYOUTS:
        raise ValueError(f"{name}: layout must be one of {LAYOUTS}, not {params.get('layout')!r}")
    if params.get("scan") not in SCANS:
        raise ValueError(f"{name}: scan must be one of {SCANS}, not {params.get('scan')!r}")
    wg = params.get("work_group_size")
    chunk = items * wg if isinstance(wg, (int, np.integer)) else items
    if params["layout"] == "interleaved" and chunk > MAX_INTERLEAVED_CHUNK:
        raise ValueError(f"{name}: the interleaved layout pads the last chunk to "
                         f"work_group_size * items_per_thread = {chunk} entries; keep it at "
                         f"most {MAX_INTERLEAVED_CHUNK} or use layout='contiguous'")


def coo_local_bytes(work_group_size, index_dtype, dtype):
    return work_group_size * (2 * np.dtype(index_dtype).itemsize + np.dtype(dtype).itemsize)


class COOPart:
    """Sorted COO arrays of a CSR matrix and the kernels that multiply them.

    ``owner`` is the SpMVFormat whose device, dtype, index type and ``build_kernels``
    are used; ``params`` holds work_group_size, items_per_thread, layout and scan
    (work_group_size may shrink when the kernels are built, before the arrays are laid
    out).  With ``empty_rows=False`` rows without non-zeros are left untouched, which
    suits adding into a y that another part has already written (``beta == 1``)."""

    def __init__(self, owner, csr, params, *, prefix="", empty_rows=True):
        self.owner = owner
        self.prefix = prefix
        self.params = params
        self.n_rows = csr.shape[0]
        self.nnz = int(csr.nnz)
        self.row_lengths = np.diff(csr.indptr)
        self.n_empty = int(np.count_nonzero(self.row_lengths == 0)) if empty_rows else 0
        self.kernels = {}
        if self.nnz or self.n_empty:
            self._build()
        wg, items = self.params["work_group_size"], self.params["items_per_thread"]
        self.chunk = wg * items
        self.n_groups = -(-self.nnz // self.chunk)
        self._csr = csr

    def _pos_dtype(self, chunk):
        # Positions run up to nnz + CHUNK inside the kernel (start of the last chunk plus
        # the item offsets): 32 bits while that fits.
        owner = self.owner
        if owner.index_dtype == np.int64 or self.nnz + 2 * chunk > 2**31 - 1:
            return np.dtype(np.int64)
        return np.dtype(np.int32)

    def _build(self):
        from .. import codegen

        p = self.params
        self.pos_dtype = self._pos_dtype(p["work_group_size"] * p["items_per_thread"])
        kernels, wg = self.owner.build_kernels(
            "coo.mako", ["coo_chunks", "coo_carries", "coo_empty_rows"], p["work_group_size"],
            items_per_thread=p["items_per_thread"], layout=p["layout"], scan=p["scan"],
            pos_t=codegen.c_type(self.pos_dtype))
        p["work_group_size"] = wg
        self.kernels = kernels

    def host_arrays(self):
        """rows, cols, values in chunk layout (the interleaved layout pads the last
        chunk; padding is never read) and the list of empty rows."""
        csr, owner, p = self._csr, self.owner, self.params
        idx = owner.index_dtype
        rows = np.repeat(np.arange(self.n_rows, dtype=idx), self.row_lengths)
        cols = csr.indices.astype(idx, copy=False)
        values = csr.data.astype(owner.dtype, copy=False)
        if p["layout"] == "interleaved" and self.nnz:
            wg, items = p["work_group_size"], p["items_per_thread"]
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
        del self._csr
        return {self.prefix + k: v for k, v in out.items()}

    def allocate_carries(self):
        """Scratch for the two carries per group; returns its size in bytes."""
        n = max(1, 2 * self.n_groups)
        ctx, rw = self.owner.device.context, cl.mem_flags.READ_WRITE
        index_size, real_size = self.owner.index_dtype.itemsize, self.owner.dtype.itemsize
        self.carry_rows = cl.Buffer(ctx, rw, n * index_size)
        self.carry_values = cl.Buffer(ctx, rw, n * real_size)
        return 2 * self.n_groups * (index_size + real_size)

    def launches(self, buffers, x_buf, y_buf, alpha, beta):
        """The launches of y = alpha * A @ x + beta * y over this part's rows (none when
        there is nothing to do)."""
        b = {k[len(self.prefix):]: v for k, v in buffers.items() if k.startswith(self.prefix)}
        out = []
        if self.n_empty and beta != 1:
            out.append(Launch(self.kernels["coo_empty_rows"],
                              (np.uint64(self.n_empty), b["empty_rows"], y_buf, beta),
                              _round_up(self.n_empty), AUX_WORK_GROUP_SIZE))
        if self.nnz:
            wg = self.params["work_group_size"]
            out.append(Launch(self.kernels["coo_chunks"], (
                self.pos_dtype.type(self.nnz), self.owner.index_dtype.type(self.n_rows),
                b["rows"], b["cols"], b["values"], x_buf, y_buf,
                self.carry_rows, self.carry_values, alpha, beta), self.n_groups * wg, wg))
            n_carries = 2 * self.n_groups
            out.append(Launch(self.kernels["coo_carries"], (
                np.uint64(n_carries), self.carry_rows, self.carry_values, y_buf, alpha, beta),
                _round_up(n_carries), AUX_WORK_GROUP_SIZE))
        return out


def _round_up(n):
    return -(-n // AUX_WORK_GROUP_SIZE) * AUX_WORK_GROUP_SIZE


class COO(SpMVFormat):
    name = "coo"
    template = "coo.mako"
    param_names = ("work_group_size", "items_per_thread", "layout", "scan")

    @classmethod
    def default_params(cls, features, profile, dtype):
        return default_coo_params(features.nnz, profile, dtype)

    def __init__(self, csr, device, dtype, params):
        check_coo_params(self.name, params)
        super().__init__(csr, device, dtype, params)
        self.nbytes += self.part.allocate_carries()

    def _local_bytes(self, work_group_size):
        return coo_local_bytes(work_group_size, self.index_dtype, self.dtype)

    def _convert(self, csr):
        # Kernels first: a work-group size the device shrinks changes the layout.
        self.part = COOPart(self, csr, self.params)
        return self.part.host_arrays()

    def kernel(self):
        return self.part.kernels

    def launches(self, x_buf, y_buf, alpha, beta):
        return self.part.launches(self.buffers, x_buf, y_buf, alpha, beta)
