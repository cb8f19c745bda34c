"""``csr-vector``: CSR read by groups of work-items.

``mapping="rows"`` (the default on CPUs, and on GPUs for rows too long for the
adaptive windows): Bell & Garland's vector kernel, generalised from one warp to
``vector_size`` = 2...64 work-items per row.

``mapping="adaptive"`` (the default on GPUs otherwise): after Greathouse & Daga's
CSR-Adaptive (SC14).  The host cuts
the rows into blocks (``row_blocks``), one work-group each:

- the group reads the block's entries consecutively (coalesced ``values``/``col_idx``,
  and neighbouring entries gather neighbouring ``x``), ``work_group_size *
  items_per_thread`` products at a time, into local memory;
- each row is then added up from there by as many work-items as the group holds per
  row (a power of two: one each for a block of ``work_group_size`` short rows, all of
  them for a row longer than a window, which is a block of its own), and their partial
  sums are combined (``reduction``).

Blocks are cut, without a loop over rows, where a row's first entry enters a new window
of ``work_group_size * items_per_thread`` entries, every ``work_group_size`` rows (one
work-item per row), and around long rows.  One launch; no scratch.
"""

import numpy as np
import pyopencl.array as cla

from ..codegen import PRODUCT_ARGS, KernelSpec, matrix
from ..errors import InvalidParameterError
from . import params as P
from .base import BLOCK_WIDTHS, csr_bytes, launch_rows, pow2_floor
from .csr_common import (
    BLOCK_MAPPING,
    CSR_ARRAYS,
    CSR_ROW_ARGS,
    CSR_ROW_BLOCK_ARGS,
    CSR_VALUE_BITS,
    CSRFormatBase,
    default_block_mapping,
    default_value_bits,
)
from .registry import register

VECTOR_SIZES = (2, 4, 8, 16, 32, 64)
MAPPINGS = ("rows", "adaptive")
MAX_ITEMS_PER_THREAD = 32
ADAPTIVE_MAX_WINDOWS = 8
# The adaptive mapping's default shape (work-group size, entries per work-item; see
# adaptive_shape for values wider than 4 bytes).
ADAPTIVE_DEFAULT = {"work_group_size": 128, "items_per_thread": 8}


def adaptive_shape(dtype):
    """The adaptive mapping's default shape for values of ``dtype``: 8 entries per
    work-item for 4-byte values, 4 for wider ones.  Each entry's product is staged in
    local memory, so 8 entries of complex128 take 4x float32's; on an H200 (astro-ph and
    Groebner_id2003_aug x83-x116) 4 entries ran complex128 in 142-164 us against 211-
    305 us with 8, and float64 within 3% (astro-ph 113 against 118 us), while float32
    kept 8 (70-92 against 81-97 us with 4)."""
    items = ADAPTIVE_DEFAULT["items_per_thread"]
    return {**ADAPTIVE_DEFAULT, "items_per_thread": items if np.dtype(dtype).itemsize <= 4
            else items // 2}


def vector_size_for(mean_row_length, simd_lanes):
    """Smallest power of two covering the mean row length, between 2 and the device's
    SIMD width (64 at most): short rows do not leave most of a group idle, long rows
    use a whole warp/wavefront."""
    upper = max(2, min(64, pow2_floor(max(2, simd_lanes))))
    size = 2
    while size < mean_row_length and size < upper:
        size *= 2
    return size


def adaptive_row_blocks(indptr, rows_per_block, window):
    """First row of each block, then the number of rows (CSR-Adaptive's row blocks).

    A block starts at row 0, where a row's first entry lies in another ``window`` of
    entries than the previous row's, every ``rows_per_block`` rows, and at a row longer
    than ``window`` and the row after it.  So a block of several rows holds at most
    ``rows_per_block`` rows and fewer than ``2 * window`` entries."""
    indptr = np.asarray(indptr)   # int32 or int64 as given: no widening copy
    if indptr.dtype.kind not in "iu":
        indptr = indptr.astype(np.int64)
    m = indptr.size - 1
    if m <= 0:
        return np.zeros(1, dtype=np.int64)
    # Vectorised over rows, in as few passes as possible (5M rows: 75-170 -> 17 ms here):
    # a shift for the usual power-of-two window, a stride for the rows_per_block cuts.
    shift = window.bit_length() - 1 if window & (window - 1) == 0 else None
    windows = indptr[:-1] >> shift if shift is not None else indptr[:-1] // window
    cut = np.empty(m, dtype=bool)
    cut[0] = True
    np.not_equal(windows[1:], windows[:-1], out=cut[1:])
    cut[::rows_per_block] = True
    long = np.diff(indptr) > window
    cut[1:] |= long[1:]
    cut[1:] |= long[:-1]
    return np.append(np.flatnonzero(cut), m)


@register
class CSRVector(CSRFormatBase):
    name = "csr-vector"
    complex_values = True
    order = 1
    template = "csr_vector.mako"
    params = (
        P.Param("vector_size", P.optional(P.one_of(*VECTOR_SIZES)),
                "work-items per row (mapping='rows')"),
        P.work_group_size(),
        P.Param("reduction", P.one_of("tree", "serial"), "how a row's partial sums combine"),
        P.Param("mapping", P.one_of(*MAPPINGS), "'rows' or CSR-Adaptive's row blocks"),
        P.Param("items_per_thread", P.optional(P.integer(1, MAX_ITEMS_PER_THREAD)),
                "entries each work-item reads per window (mapping='adaptive')"),
        BLOCK_MAPPING,
        CSR_VALUE_BITS,
    )

    # Block kernels for mapping="rows" (the adaptive mapping multiplies column by column).
    block_widths = BLOCK_WIDTHS
    block_template = "csr_vector_block.mako"

    @classmethod
    def default_params(cls, features, profile, dtype):
        """The adaptive mapping on GPUs where its windows suit the longest row (see
        ``adaptive_suits``), the row mapping elsewhere."""
        rows = cls._rows_defaults(features, profile, dtype)
        if cls.adaptive_suits(features, profile, adaptive_shape(dtype)):
            return cls._adaptive_defaults(rows, profile, dtype)
        return rows

    @classmethod
    def _rows_defaults(cls, features, profile, dtype):
        vector_size = vector_size_for(features.mean_row_length, profile.lanes(dtype))
        wg = 128 if profile.is_gpu else 64
        wg = max(vector_size, min(wg, profile.max_work_group_size))
        # Barriers are cheap on GPUs (tree) and costly on CPUs (one barrier, serial sum).
        reduction = "serial" if profile.is_cpu else "tree"
        return {"vector_size": vector_size, "work_group_size": wg, "reduction": reduction,
                "mapping": "rows", "items_per_thread": None,
                "block_mapping": default_block_mapping(profile),
                "value_bits": default_value_bits(dtype)}

    @staticmethod
    def _adaptive_defaults(rows, profile, dtype):
        """Adaptive: a group of 128 (at most the device's), 8 entries per work-item (4
        for values wider than 4 bytes: ``adaptive_shape``), no vector size: the best of
        four shapes on an H200 for astro-ph, Groebner_id2003_aug and cage10 (x32)."""
        shape = adaptive_shape(dtype)
        return {**rows, "mapping": "adaptive", "vector_size": None,
                "items_per_thread": shape["items_per_thread"],
                "work_group_size": pow2_floor(min(shape["work_group_size"],
                                                  profile.max_work_group_size))}

    @staticmethod
    def adaptive_suits(features, profile, shape):
        """Whether the adaptive mapping of ``shape`` is a GPU default: the longest row
        takes at most ``ADAPTIVE_MAX_WINDOWS`` windows of one group (a power-law graph's
        hub rows: 1.2-3.7 ms against csr5's 0.13 on an H200).  On an H200 it beat the
        row mapping on 4 of 5 irregular matrices, and halved the time of a product
        waited for on cage10 x133 (86 against 178 us)."""
        if not profile.is_gpu or shape["work_group_size"] > profile.max_work_group_size:
            return False
        window = shape["work_group_size"] * shape["items_per_thread"]
        return features.max_row_length <= ADAPTIVE_MAX_WINDOWS * window

    @classmethod
    def resolve_params(cls, features, profile, dtype, given):
        """The defaults of the mapping asked for: ``mapping="rows"`` or a
        ``vector_size`` asks for the row mapping, ``mapping="adaptive"`` for the
        adaptive one, neither for :meth:`default_params`' choice."""
        rows = cls._rows_defaults(features, profile, dtype)
        mapping = given.get("mapping")
        if mapping is None and given.get("vector_size") is not None:
            mapping = "rows"
        if mapping == "adaptive":
            defaults = cls._adaptive_defaults(rows, profile, dtype)
        elif mapping is None:
            defaults = cls.default_params(features, profile, dtype)
        else:
            defaults = rows
        params = P.resolve(cls.name, cls.params, defaults, given)
        cls.check_params(params, profile)
        return params

    @classmethod
    def check_params(cls, params, profile):
        wg = params["work_group_size"]
        if params["mapping"] == "rows":
            vs = params["vector_size"]
            if vs is None:
                raise InvalidParameterError(
                    f"csr-vector: vector_size must be one of {VECTOR_SIZES}, not None")
            P.check_multiple(cls.name, params, "vector_size", vs)
            if params["items_per_thread"] is not None:
                raise InvalidParameterError(
                    "csr-vector: items_per_thread belongs to mapping='adaptive'")
        else:
            if params["vector_size"] is not None:
                raise InvalidParameterError(
                    "csr-vector: mapping='adaptive' takes no vector_size (the whole "
                    "work-group reads each block)")
            if params["items_per_thread"] is None:
                raise InvalidParameterError(
                    f"csr-vector: items_per_thread must be an integer in 1.."
                    f"{MAX_ITEMS_PER_THREAD}, not None")
            if wg & (wg - 1):
                raise InvalidParameterError(
                    f"csr-vector: mapping='adaptive' needs a power-of-two work_group_size, "
                    f"not {wg}")

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        efficiency = (0.6 if features.mean_row_length >= 32 else
                      0.25 if profile.is_cpu else 0.45)
        return csr_bytes(features, dtype) / efficiency, None

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """The default vector size, half and a quarter of it (at least 2): on an H200,
        rows of 14.5 entries on average (astro-ph) ran in 55 us with 4 work-items per
        row against 73 us with the default 16, the longer rows then taking a few turns.

        GPUs also get the adaptive mapping, in its default shape and with groups of 256
        and 4 entries per work-item (rajat01 x32: 31 against 40 us), unless the longest
        row would take one group more than ``ADAPTIVE_MAX_WINDOWS`` windows (a power-law
        graph's hub rows: 1.2-3.7 ms against csr5's 0.13).  The adaptive default then
        comes first: the tuner's first pass times each format's first candidate only,
        and on an H200 it beat the row mapping on 4 of 5 irregular matrices."""
        vs = cls._rows_defaults(features, profile, dtype)["vector_size"]
        rows = [{"mapping": "rows"}] + [{"mapping": "rows", "vector_size": v}
                                        for v in (vs // 2, vs // 4) if v >= 2]
        adaptive = [{"mapping": "adaptive", **shape}
                    for shape in ({}, {"work_group_size": 256, "items_per_thread": 4})
                    if cls.adaptive_suits(features, profile, {**adaptive_shape(dtype), **shape})]
        if not adaptive:
            return rows
        # Adaptive default, the row default, the other adaptive shape, narrower vectors.
        return adaptive[:1] + rows[:1] + adaptive[1:] + rows[1:]

    @property
    def _adaptive(self):
        return self.params["mapping"] == "adaptive"

    def template_params(self):
        return {**super().template_params(),
                "vector_size": self.params["vector_size"], "reduction": self.params["reduction"],
                "mapping": self.params["mapping"],
                "items_per_thread": self.params["items_per_thread"]}

    def kernel_specs(self):
        if self._adaptive:
            args = (matrix("row_blocks", "index_t"), *CSR_ARRAYS, *PRODUCT_ARGS)
        else:
            args = CSR_ROW_ARGS
        return [KernelSpec("csr_vector", args, fixed_group=True)]

    def local_bytes(self, work_group_size):
        items = self.params["items_per_thread"] if self._adaptive else 1
        return work_group_size * items * self.dtype.itemsize

    def min_work_group_size(self):
        return 1 if self._adaptive else self.params["vector_size"]

    def convert(self, csr):
        return {**super().convert(csr), **self._row_blocks(csr.indptr)}

    def convert_device(self, csr):
        blocks = self._row_blocks(csr.indptr)   # from indptr, which is on the host too
        if blocks:
            blocks["row_blocks"] = cla.to_device(self.device.queue, blocks["row_blocks"])
        return {**super().convert_device(csr), **blocks}

    def _row_blocks(self, indptr):
        """The adaptive mapping's row blocks (nothing for the rows mapping): each holds
        at most one row per work-item of the group as built."""
        if not self._adaptive:
            return {}
        wg = self.params["work_group_size"]
        blocks = adaptive_row_blocks(indptr, wg, wg * self.params["items_per_thread"])
        self.n_blocks = blocks.size - 1
        return {"row_blocks": blocks.astype(self.index_dtype)}

    def launches(self, beta):
        wg = self.params["work_group_size"]
        if not self._adaptive:
            return [self.step("csr_vector", *launch_rows(
                self.shape[0], wg // self.params["vector_size"], wg), n_rows=self.shape[0])]
        if self.n_blocks == 0:   # no rows: nothing to launch
            return []
        return [self.step("csr_vector", self.n_blocks * wg, wg)]

    # -- block kernels (block_mapping="items" needs mapping="rows"; "lanes": any) ------
    def supported_block_widths(self):
        if self._adaptive and not self._lanes:
            return ()
        return super().supported_block_widths()

    def items_block_kernel_specs(self, kb):
        return [KernelSpec("csr_vector_block", CSR_ROW_BLOCK_ARGS, fixed_group=True)]

    def items_block_local_bytes(self, kb, work_group_size):
        return work_group_size * kb * self.dtype.itemsize

    def items_block_launches(self, kb, work_group_size, beta):
        wg = work_group_size
        return [self.step("csr_vector_block", *launch_rows(
            self.shape[0], wg // self.params["vector_size"], wg), n_rows=self.shape[0])]
