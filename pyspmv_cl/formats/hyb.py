"""``hyb``: hybrid ELL + COO (Bell & Garland, section 3.4).  The first ``K`` entries of
every row go to an ELL part (``ell``'s arrays and kernel), the rest of the longer rows
to a COO part (``coo``'s segmented reduction).  Two launches: ELL computes
``y = alpha*A_ell@x + beta*y`` for every row (with ``K == 0`` it only scales y), then
COO adds ``alpha*A_coo@x`` (beta = 1: rows without COO entries are not touched).
HYB never refuses a matrix.

Choice of ``K`` from the row-length histogram: Bell & Garland take ELL to be about three
times faster than COO, so a K-th ELL column pays when at least a third of the rows hold K
or more entries; their reference implementation (CUSP,
``compute_optimal_entries_per_row(relative_speed=3, breakeven_threshold=4096)``) also
requires at least 4096 such rows, below which ELL cannot fill the GPU.  Hence: ``K`` is the
largest value such that at least ``max(breakeven_threshold, rows / relative_speed)``
rows have ``K`` or more entries (0 when none).  ``ell_width`` sets ``K`` directly.

``params`` reports ``ell_width`` (K as used: at most the longest row), ``ell_nnz`` and
``coo_nnz`` besides the parameters.
"""

import math

import numpy as np
import scipy.sparse as sp

from .base import SpMVFormat
from .coo import COOPart, check_coo_params, coo_local_bytes, default_coo_params
from .ell import ELL, row_slots

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
    # At least `needed` rows have length >= K  <=>  the needed-th longest row has >= K.
    return int(np.partition(row_lengths, m - needed)[m - needed])


def split_csr(csr, width):
    """(ELL part, COO part): the first ``width`` entries of each row, and the others."""
    _, position, lengths = row_slots(csr)
    m, n = csr.shape
    parts = []
    for mask, part_lengths in ((position < width, np.minimum(lengths, width)),
                               (position >= width, np.maximum(lengths - width, 0))):
        indptr = np.zeros(m + 1, dtype=csr.indptr.dtype)
        np.cumsum(part_lengths, out=indptr[1:])
        part = sp.csr_matrix((m, n), dtype=csr.dtype)
        part.data, part.indices, part.indptr = csr.data[mask], csr.indices[mask], indptr
        parts.append(part)
    return parts


def _check_int(name, key, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}: {key} must be an integer >= {low}, not {value!r}")
    return int(value)


class HYB(SpMVFormat):
    name = "hyb"
    param_names = ("ell_width", "relative_speed", "breakeven_threshold", "work_group_size",
                   "coo_work_group_size") + COO_KEYS

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

    def __init__(self, csr, device, dtype, params):
        params = dict(params)
        if params.get("ell_width") is not None:
            params["ell_width"] = _check_int(self.name, "ell_width", params["ell_width"], 0)
        speed = params.get("relative_speed")
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise ValueError(f"{self.name}: relative_speed must be a number > 0, not {speed!r}")
        params["breakeven_threshold"] = _check_int(
            self.name, "breakeven_threshold", params.get("breakeven_threshold"), 0)
        super().__init__(csr, device, dtype, params)
        self.nbytes += self.ell.nbytes + self.coo.allocate_carries()

    def _convert(self, csr):
        p = self.params
        lengths = np.diff(csr.indptr)
        width = p["ell_width"]
        if width is None:
            width = hyb_width(lengths, p["relative_speed"], p["breakeven_threshold"])
        width = min(width, int(lengths.max(initial=0)))
        ell_csr, coo_csr = split_csr(csr, width)

        # The COO part: defaults for its own nnz, validated like coo's.
        coo_params = default_coo_params(coo_csr.nnz, self.profile, self.dtype)
        if p["coo_work_group_size"] is not None:
            coo_params["work_group_size"] = p["coo_work_group_size"]
        coo_params.update({k: p[k] for k in COO_KEYS if p[k] is not None})
        self._check_coo_work_group_size(coo_params)
        check_coo_params(self.name, coo_params)
        self.coo = COOPart(self, coo_csr, coo_params, prefix="coo_", empty_rows=False)

        self.ell = ELL(ell_csr, self.device, self.dtype,
                       {"work_group_size": p["work_group_size"], "max_padding": None,
                        "index_bits": p["index_bits"]})
        p.update(ell_width=self.ell.width, ell_nnz=int(ell_csr.nnz), coo_nnz=int(coo_csr.nnz),
                 coo_work_group_size=coo_params["work_group_size"],
                 **{k: coo_params[k] for k in COO_KEYS})
        return self.coo.host_arrays()

    def _check_coo_work_group_size(self, coo_params):
        wg = coo_params["work_group_size"]
        if isinstance(wg, bool) or not isinstance(wg, (int, np.integer)) or wg < 1:
            raise ValueError(f"{self.name}: coo_work_group_size must be a positive integer, "
                             f"not {wg!r}")
        if wg > self.profile.max_work_group_size:
            raise ValueError(f"{self.name}: coo_work_group_size={wg} exceeds the device's "
                             f"maximum of {self.profile.max_work_group_size}")
        local = coo_local_bytes(int(wg), self.index_dtype, self.dtype)
        if local > self.profile.local_mem_size:
            raise ValueError(f"{self.name}: coo_work_group_size={wg} needs {local} B of local "
                             f"memory, more than the device's {self.profile.local_mem_size} B")
        coo_params["work_group_size"] = int(wg)

    def kernel(self):
        kernel = self.ell.kernel()
        self.params["work_group_size"] = self.ell.params["work_group_size"]
        self.params["coo_work_group_size"] = self.coo.params["work_group_size"]
        return kernel

    def launches(self, x_buf, y_buf, alpha, beta):
        return (self.ell.launches(x_buf, y_buf, alpha, beta)
                + self.coo.launches(self.buffers, x_buf, y_buf, alpha, self.dtype.type(1)))
