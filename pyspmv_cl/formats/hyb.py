"""``hyb``: hybrid ELL + COO (Bell & Garland, section 3.4).  The first ``K`` entries of
every row go to an ELL part (``ell``'s arrays and kernel), the rest of the longer rows
to a COO part (``coo``'s segmented reduction: :class:`~.coo.COOPart`).  Two programs
(``ell.mako`` with ``work_group_size``, ``coo.mako`` with ``coo_work_group_size``); the
ELL arrays are named ``ell_*``, the COO ones ``coo_*``.  Launches: ELL computes
``y = alpha*A_ell@x + beta*y`` for every row (with ``K == 0`` it only scales y), then
COO adds ``alpha*A_coo@x`` (beta = 1: rows without COO entries are not touched).  An
``alpha`` beyond 1 in magnitude (or NaN) runs both parts unscaled into a scratch vector
and scales once (``enqueue``, one more pass over y): applied to each part, inf times a
part's empty sum gave NaN where scipy's ``alpha * (A @ x)`` gives inf, and 1e300 times
a row's two parts of 1e10 and -1e10 overflowed where the row's sum is 0.
HYB never refuses a matrix.

Choice of ``K`` from the row-length histogram: Bell & Garland take ELL to be about three
times faster than COO, so a K-th ELL column pays when at least a third of the rows hold K
or more entries; their reference implementation (CUSP,
``compute_optimal_entries_per_row(relative_speed=3, breakeven_threshold=4096)``) also
requires at least 4096 such rows, below which ELL cannot fill the GPU.  Hence: ``K`` is the
largest value such that at least ``max(breakeven_threshold, rows / relative_speed)``
rows have ``K`` or more entries (0 when none).  ``ell_width`` sets ``K`` directly.

``params`` reports ``ell_width`` (K as used: at most the longest row), ``ell_nnz`` and
``coo_nnz`` besides the parameters.  Those two are accepted and ignored as input (they
follow from the split), so that ``SpMV(A, format="hyb", **op.params)`` builds the same
operator again.
"""

import math

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from ..array_ops import scale_and_add
from ..host_arrays import bare_csr
from . import ell_device
from . import params as P
from .base import SpMVFormat, csr_bytes, launch_rows
from .builder import ProgramSpec
from .coo import ITEMS_PER_THREAD, LAYOUT, SCAN, COOPart, check_chunk, default_coo_params
from .ell import ELL, ELL_KERNEL, check_padding, ell_arrays, ell_geometry, ell_slots, row_slots
from .registry import register

RELATIVE_SPEED = 3.0
BREAKEVEN_THRESHOLD = 4096
COO_KEYS = ("items_per_thread", "layout", "scan")


def hyb_width(row_lengths, relative_speed=RELATIVE_SPEED,
              breakeven_threshold=BREAKEVEN_THRESHOLD):
    """The largest K such that at least max(breakeven_threshold, rows / relative_speed)
    rows hold K or more entries (0 when there are not that many rows)."""
    row_lengths = np.asarray(row_lengths)
    m = row_lengths.size
    needed = max(1, int(breakeven_threshold), math.ceil(m / relative_speed))
    if needed > m:
        return 0
    # At least `needed` rows have length >= K  <=>  the needed-th longest row has >= K:
    # the (m - needed)-th smallest length, from a histogram of the lengths (one pass,
    # no copy: 5.1M rows on a 2-core VM, 39 -> 18 ms), or a partition where rows are
    # very long.
    longest = int(row_lengths.max())
    if longest < 1 << 22:
        at_most = np.cumsum(np.bincount(row_lengths, minlength=longest + 1))
        return int(np.searchsorted(at_most, m - needed, side="right"))
    return int(np.partition(row_lengths, m - needed)[m - needed])


class _Structure:
    """The shape and row pointers of one part (what the layouts read), without arrays:
    a matrix on the device is split only there."""

    def __init__(self, shape, lengths):
        self.shape = tuple(shape)
        self.row_lengths = lengths   # COOPart.analyse's, without a pass over indptr
        self.indptr = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.indptr[1:])
        self.nnz = int(self.indptr[-1])


def coo_structure(lengths, shape, width):
    """The COO part of :func:`split_csr` (what rows keep past ``width``), shape and row
    pointers only, from the row lengths: a matrix on the device is split only there.
    The ELL part needs no row pointers (its entries: nnz less the COO part's)."""
    rest = np.subtract(lengths, width)
    return _Structure(shape, np.maximum(rest, 0, out=rest))


def split_csr(csr, width):
    """(ELL part, COO part): the first ``width`` entries of each row, and the others."""
    _, position, lengths = row_slots(csr.indptr)
    m, n = csr.shape
    parts = []
    for mask, part_lengths in ((position < width, np.minimum(lengths, width)),
                               (position >= width, np.maximum(lengths - width, 0))):
        indptr = np.zeros(m + 1, dtype=csr.indptr.dtype)
        np.cumsum(part_lengths, out=indptr[1:])
        parts.append(bare_csr((m, n), csr.data[mask], csr.indices[mask], indptr))
    return parts


@register
class HYB(SpMVFormat):
    name = "hyb"
    complex_values = True
    order = 7
    converts_on_device = True
    host_input_on_device = True   # GPUs: split and laid out on the device
    value_read = "gather"         # values_in_csr_order: the ELL slots, then the COO part
    params = (
        P.Param("ell_width", P.optional(P.integer(0)),
                "K, the ELL part's width (None: the Bell & Garland / CUSP rule)"),
        P.Param("relative_speed", P.number(greater_than=0),
                "how much faster ELL is taken to be than COO (the rule)"),
        P.Param("breakeven_threshold", P.integer(0),
                "rows that must hold K entries or more (the rule)"),
        P.work_group_size("work-items per work-group of the ELL part"),
        P.Param("coo_work_group_size", P.optional(P.positive_int()),
                "work-items per work-group of the COO part (None: coo's default for its nnz)"),
        *(P.Param(q.name, P.optional(q.check), f"{q.doc} (COO part; None: coo's default)")
          for q in (ITEMS_PER_THREAD, LAYOUT, SCAN)),
    )

    #: What the conversion reports in ``params`` besides the parameters.
    REPORTED = ("ell_nnz", "coo_nnz")

    @classmethod
    def resolve_params(cls, features, profile, dtype, given):
        """The declared parameters; ``REPORTED`` keys (from an operator's ``params``)
        are dropped: the split they count follows from ``ell_width``."""
        given = {k: v for k, v in given.items() if k not in cls.REPORTED}
        return super().resolve_params(features, profile, dtype, given)

    @classmethod
    def default_params(cls, features, profile, dtype):
        # work_group_size is the ELL part's; the COO part's geometry depends on its nnz,
        # known after the split (None: chosen then).
        params = {"ell_width": None, "relative_speed": RELATIVE_SPEED,
                  "breakeven_threshold": BREAKEVEN_THRESHOLD,
                  "work_group_size": ELL.default_params(features, profile, dtype)
                  ["work_group_size"], "coo_work_group_size": None}
        params.update(dict.fromkeys(COO_KEYS))
        return params

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        return csr_bytes(features, dtype) * 1.2 / 0.7, None

    # -- analysis ------------------------------------------------------------------------
    def analyse(self, csr):
        p = self.params
        lengths = np.diff(csr.indptr)
        width = p["ell_width"]
        if width is None:
            width = hyb_width(lengths, p["relative_speed"], p["breakeven_threshold"])
        width = min(width, int(lengths.max(initial=0)))
        coo_csr = coo_structure(lengths, csr.shape, width)
        ell_nnz = int(csr.indptr[-1]) - coo_csr.nnz

        # The ELL part: K columns of stride rows (never refused for padding).
        self.row_align, self.stride = ell_geometry(csr.shape[0], self.profile)
        self.width = width
        slots = self.width * self.stride
        check_padding(self.name, slots, ell_nnz,
                      [slots * self.dtype.itemsize, slots * self.index_dtype.itemsize],
                      None, "csr-vector", self.profile, "ELL")

        # The COO part: coo's defaults for its own nnz, overridden by the caller's values.
        coo_params = default_coo_params(coo_csr.nnz, self.profile, self.dtype)
        if p["coo_work_group_size"] is not None:
            coo_params["work_group_size"] = p["coo_work_group_size"]
        p["coo_work_group_size"] = coo_params.pop("work_group_size")
        p.update({k: v for k, v in coo_params.items() if p[k] is None})
        check_chunk(self.name, p["coo_work_group_size"], p["items_per_thread"], p["layout"])
        self.coo = COOPart(self, group_param="coo_work_group_size", prefix="coo_",
                           empty_rows=False)
        self.check_group_size("coo_work_group_size", self.coo.local_bytes)
        self.coo.analyse(coo_csr)
        p.update(ell_width=self.width, ell_nnz=ell_nnz, coo_nnz=int(coo_csr.nnz))
        self._coo_indptr = coo_csr.indptr

    def programs(self):
        ell = [ProgramSpec("ell.mako", (ELL_KERNEL,),
                           {"streamed_loads": self.streamed_loads_ok()})]
        coo = [self.coo.program()] if self.coo.active else []
        if self.converting_on_device:
            ell.append(ell_device.program(1))
            coo += [self.coo.conversion_program()] if self.coo.active else []
        return ell + coo

    def type_names(self):
        return self.coo.type_names()

    # -- arrays and launches -------------------------------------------------------------
    def convert(self, csr):
        ell_csr, coo_csr = split_csr(csr, self.width)
        col_idx, values = ell_arrays(ell_csr, self.width, self.row_align, self.index_dtype,
                                     self.dtype)
        return {"ell_col_idx": col_idx, "ell_values": values,
                **self.coo.host_arrays(coo_csr)}

    def convert_device(self, csr):
        """The same arrays made on the device: a row's first K entries scattered to the
        ELL part (ell_device, limited to K), the rest to the COO part (coo_convert,
        skipping K) at positions from the COO part's row pointers (host, from indptr)."""
        col_idx, values = ell_device.scatter(self, csr, self.width * self.stride,
                                             self.stride, limit=self.width)
        return {"ell_col_idx": col_idx, "ell_values": values,
                **self.coo.device_arrays(csr, skip=self.width, part_indptr=self._coo_indptr)}

    def values_in_csr_order(self, queue, indptr):
        """A row's first K entries from the ELL part (slot j * stride + i), the rest, in
        order, from the COO part."""
        rows, position, _ = row_slots(indptr)
        in_ell = position < self.width
        out = np.empty(rows.size, self.value_dtype)
        stored = self._read_values(queue, "ell_values", self.width * self.stride)
        out[in_ell] = stored[ell_slots(rows[in_ell], position[in_ell], self.stride)]
        out[~in_ell] = self.coo.values_in_order(queue)
        return out

    def scratch_sizes(self):
        return self.coo.scratch_sizes()

    def enqueue(self, queue, x_buf, y_buf, alpha, beta, wait_for=None):
        if abs(alpha) <= 1 or not self.shape[0]:   # (parts scaled apart cannot overflow)
            return super().enqueue(queue, x_buf, y_buf, alpha, beta, wait_for)
        m, scalar = self.shape[0], self.dtype.type
        unscaled = getattr(self, "_unscaled", None)
        if unscaled is None:   # (kept: a caller giving inf once may give it again)
            unscaled = self._unscaled = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE,
                                                  m * self.dtype.itemsize)
        event = super().enqueue(queue, x_buf, unscaled, 1.0, 0.0, wait_for)
        t = cla.Array(queue, m, self.dtype, data=unscaled)
        y = cla.Array(queue, m, self.dtype, data=y_buf)
        if beta == 0:   # y not read (it may hold NaN)
            return cla.Array._axpbz(y, scalar(alpha), t, scalar(0), queue=queue,
                                    wait_for=[event])
        if self.dtype.kind != "c":
            return cla.Array._axpbyz(y, scalar(alpha), t, scalar(beta), y, queue=queue,
                                     wait_for=[event])
        # complex: alpha * t first, then beta * y + it without multiplying by 1 + 0j
        event = cla.Array._axpbz(t, scalar(alpha), t, scalar(0), queue=queue,
                                 wait_for=[event])
        return scale_and_add(y, beta, t, wait_for=[event])

    def launches(self, beta):
        wg = self.params["work_group_size"]
        ell = self.step("ell", *launch_rows(self.shape[0], wg, wg), prefix="ell_",
                        n_rows=self.shape[0], stride=self.stride, width=self.width)
        return [ell, *self.coo.steps(beta, accumulate=True)]
