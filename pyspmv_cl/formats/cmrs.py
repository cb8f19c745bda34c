"""``cmrs``: Compressed Multi-Row Storage (Koza, Matyka, Szkodra, Mirosław).

CSR with rows grouped into strips of ``height`` consecutive rows: ``strip_ptr`` over
strips replaces ``row_ptr`` (``strip_ptr[s] = row_ptr[s * height]``), and every entry
carries its row's number inside the strip (``row % height``, 0...15).  That number
is packed into the top 4 bits of the column index when the columns fit in the rest
(28 bits with 32-bit indices, the paper's ``cmrs_bits``); otherwise it goes to a
separate ``row_in_strip`` byte array.

Kernel: one SIMD group of ``group_width`` work-items per strip (Bell & Garland's
vector kernel with rows replaced by strips).  Work-item ``lane`` walks entries
``strip_ptr[s] + lane, + group_width, ...`` and adds each product into its own slot
``buf[r][lane]`` of a per-strip local buffer of ``height x group_width`` sums, so
entries of any row may come in any order; then the buffer is reduced per row behind
barriers.  Nothing is padded: every stored entry multiplies x once, no other does.

``sort_columns`` (the paper's "reordering", on by default on GPUs as the paper advises)
sorts each strip's entries by column (stable), so the group reads x in increasing
addresses; products then meet in another order, so float results may differ from
the unsorted layout by rounding only.
"""

import numpy as np
import pyopencl.array as cla

from .. import host_arrays
from ..codegen import PRODUCT_ARGS, KernelSpec, c_type, matrix, scalar
from ..device_inputs import DeviceCSR
from ..errors import InvalidParameterError
from . import cmrs_device
from . import params as P
from .base import SpMVFormat, pow2_floor
from .registry import register

MAX_HEIGHT = 16                     # 4 bits of row-in-strip
GROUP_WIDTHS = (1, 2, 4, 8, 16, 32, 64)
ROW_IN_STRIP = ("auto", "packed", "separate")
REDUCTIONS = ("tree", "serial")
ROW_BITS = 4

# Work-items a GPU compute unit keeps resident (2048 on NVIDIA since Kepler; AMD GCN
# has more): the paper's occupancy argument divides the local memory among them.
GPU_RESIDENT_WORK_ITEMS = 2048
GPU_WORK_GROUP = 128                # the paper's optimal block size
# PoCL (poisson2d:1000, powerlaw:200000,8, float32): one work-item per strip beats a
# group of 4 or 8 per strip by 1.2-2x (no barrier, no local buffer); heights 4-16 are
# within the noise of a shared machine, 1-2 slower; 64 strips per group.  Sorting the
# strips' columns only slowed a lone work-item (its running row sum flushes on every
# row change), so CPUs keep CSR order.
CPU_GROUP_WIDTH = 1
CPU_WORK_GROUP = 64
CPU_HEIGHT = 4


def occupancy_height(profile, dtype):
    """The paper's rule: each resident work-item needs ``height`` sums of local memory,
    so the largest height that keeps a GPU compute unit fully occupied is
    local memory / (resident work-items * value size) (48 KiB: 6 float, 3 double)."""
    itemsize = np.dtype(dtype).itemsize
    return max(1, min(MAX_HEIGHT, profile.local_mem_size
                      // (GPU_RESIDENT_WORK_ITEMS * itemsize)))


def default_height(features, profile, dtype, group_width):
    """GPUs: the occupancy height, but no more rows than it takes for a strip to give
    every work-item of its group ~2 entries (the model's gain saturates once
    height * mean row length exceeds the group; long rows need no strips).
    CPUs: CPU_HEIGHT (no occupancy limit)."""
    if profile.is_cpu:
        return CPU_HEIGHT
    height = occupancy_height(profile, dtype)
    mean = max(features.mean_row_length, 1e-9)
    return max(1, min(height, int(np.ceil(2 * group_width / mean))))


def default_group_width(profile, features):
    """CPUs: CPU_GROUP_WIDTH.  GPUs: about half the mean row length, from 4 up to one
    warp/wavefront (64 at most).  The paper gives a strip a whole warp; on an H200 a
    narrow group per strip ran 4x faster on 5-entry rows (poisson2d: 81 us with 4
    work-items, 318 us with 32) and no slower on 10-entry rows: a warp's worth of
    work-items over a strip of ~12 entries idles most of them through the reduction."""
    if profile.is_cpu:
        return CPU_GROUP_WIDTH
    warp = max(1, min(64, pow2_floor(max(1, profile.simd_width))))
    return max(1, min(warp, max(4, pow2_floor(max(1, int(features.mean_row_length // 2))))))


def row_bits_shift(index_dtype):
    """Bit position of the row-in-strip number in a packed column index."""
    return np.dtype(index_dtype).itemsize * 8 - ROW_BITS


def fits_packed(n_cols, index_dtype):
    return n_cols <= 1 << row_bits_shift(index_dtype)


@register
class CMRS(SpMVFormat):
    name = "cmrs"
    complex_values = True
    order = 8
    template = "cmrs.mako"
    # formats/cmrs_device.py; with sort_columns, rows out of order are read back.
    converts_on_device = True
    host_input_on_device = True
    params = (
        P.Param("height", P.integer(1, MAX_HEIGHT),
                f"rows per strip (1 to {MAX_HEIGHT}: 4 bits of row-in-strip)"),
        P.Param("group_width", P.one_of(*GROUP_WIDTHS), "work-items per strip"),
        P.work_group_size(),
        P.Param("sort_columns", P.boolean(), "sort each strip's entries by column"),
        P.Param("row_in_strip", P.one_of(*ROW_IN_STRIP),
                "row-in-strip packed into the column index's top bits, a separate byte "
                "array, or 'auto' (packed where the columns fit)"),
        P.Param("reduction", P.one_of(*REDUCTIONS), "how a strip's partial sums combine"),
    )

    @classmethod
    def default_params(cls, features, profile, dtype):
        gw = default_group_width(profile, features)
        wg = (CPU_WORK_GROUP if profile.is_cpu else GPU_WORK_GROUP)
        wg = max(gw, min(wg, pow2_floor(profile.max_work_group_size)))
        return {"height": default_height(features, profile, dtype, gw), "group_width": gw,
                "work_group_size": wg, "sort_columns": profile.is_gpu, "row_in_strip": "auto",
                # Barriers are cheap on GPUs (tree), costly on CPUs (one, then a serial sum).
                "reduction": "serial" if profile.is_cpu else "tree"}

    @classmethod
    def resolve_params(cls, features, profile, dtype, given):
        """The default work-group size follows a caller's group width and height: whole
        strips per group, and a local buffer that fits the device."""
        params = P.resolve(cls.name, cls.params, cls.default_params(features, profile, dtype),
                           given)
        given = {k for k, v in given.items() if v is not None}
        gw = params["group_width"]
        if "group_width" in given and "height" not in given:
            params["height"] = default_height(features, profile, dtype, gw)
        h = params["height"]
        if "work_group_size" not in given:
            wg = max(params["work_group_size"], gw)
            wg -= wg % gw
            itemsize = np.dtype(dtype).itemsize
            while wg > gw and gw > 1 and wg * h * itemsize > profile.local_mem_size:
                wg //= 2
            params["work_group_size"] = wg
        cls.check_params(params, profile)
        return params

    @classmethod
    def check_params(cls, params, profile):
        P.check_multiple(cls.name, params, "group_width", params["group_width"])

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """The default height, half and twice it (within 1...16): the paper found the
        best height varies around the occupancy choice from matrix to matrix."""
        gw = default_group_width(profile, features)
        h = default_height(features, profile, dtype, gw)
        heights = [x for x in (max(1, h // 2), min(MAX_HEIGHT, 2 * h)) if x != h]
        return [{}] + [{"height": x} for x in dict.fromkeys(heights)]

    # -- analysis: strips, row-in-strip encoding -------------------------------------------
    def analyse(self, csr):
        m, n = self.shape
        self.n_strips = -(-m // self.params["height"])
        self.nnz_stored = int(csr.nnz)
        mode = self.params["row_in_strip"]
        packable = fits_packed(n, self.index_dtype)
        if mode == "packed" and not packable:
            raise InvalidParameterError(
                f"cmrs: {n} columns do not fit in the {row_bits_shift(self.index_dtype)} "
                f"bits left beside the row-in-strip number: use row_in_strip='separate' "
                f"or index_bits=64")
        self.packed = mode == "packed" or (mode == "auto" and packable)
        self.params["row_in_strip"] = "packed" if self.packed else "separate"
        self.row_shift = row_bits_shift(self.index_dtype)
        #: The packed words' type: the index type's unsigned twin.
        self.word_dtype = np.dtype(self.index_dtype.str.replace("i", "u"))
        if isinstance(csr, DeviceCSR) and not csr.nnz:   # nothing to convert there:
            self.converting_on_device = False            # convert reads it back

    @classmethod
    def device_conversion_takes(cls, csr, params, dtype):
        """A host matrix goes up as CSR unless ``sort_columns`` would meet a row out of
        order (scipy's sorted-indices flag), or it has no entries."""
        return csr.nnz > 0 and (not params.get("sort_columns", True) or
                                bool(getattr(csr, "has_sorted_indices", True)))

    def programs(self):
        conversion = [cmrs_device.program(self)] if self.converting_on_device else []
        return [*super().programs(), *conversion]

    # -- kernel ---------------------------------------------------------------------------
    def template_params(self):
        p = self.params
        return {"height": p["height"], "group_width": p["group_width"],
                "packed": self.packed, "row_shift": self.row_shift,
                "reduction": p["reduction"]}

    def kernel_specs(self):
        args = (scalar("n_rows", "long"), scalar("n_strips", "long"),
                matrix("strip_ptr", "index_t"))
        if self.packed:
            # The packed words: the index type's unsigned twin (uint / ulong).
            args += (matrix("col_idx", "u" + c_type(self.index_dtype)),)
        else:
            args += (matrix("col_idx", "index_t"), matrix("row_in_strip", "uchar"))
        args += (matrix("values", "real_t"), *PRODUCT_ARGS)
        return [KernelSpec("cmrs", args, fixed_group=True)]

    def local_bytes(self, work_group_size):
        if self.params["group_width"] == 1:
            return 0  # one work-item per strip: private sums, no local buffer
        return work_group_size * self.params["height"] * self.dtype.itemsize

    def min_work_group_size(self):
        return self.params["group_width"]

    # -- conversion --------------------------------------------------------------------
    def _strip_ptr(self, indptr):
        """strip_ptr[s] = row_ptr[s * height], strip_ptr[-1] = nnz (int64)."""
        rows = np.minimum(np.arange(self.n_strips + 1) * self.params["height"], self.shape[0])
        return np.asarray(indptr, dtype=np.int64)[rows]

    def convert_device(self, csr):
        arrays = cmrs_device.convert(self, csr, self._strip_ptr(csr.indptr))
        if arrays is None:   # a row out of order: the host conversion, uploaded
            arrays = {name: cla.to_device(self.device.queue, arr)
                      for name, arr in self.convert(csr.to_host(self.device.queue)).items()}
        return arrays

    def convert(self, csr):
        if isinstance(csr, DeviceCSR):   # no entries (analyse): nothing to read but indptr
            csr = csr.to_host(self.device.queue)
        m, n = self.shape
        h = self.params["height"]
        indptr = csr.indptr.astype(np.int64)
        row_lengths = np.diff(indptr)
        strip_ptr = self._strip_ptr(indptr)
        row_in_strip = host_arrays.repeat((np.arange(m) % h).astype(np.uint8), row_lengths)
        cols = csr.indices
        values = csr.data
        if self.params["sort_columns"] and csr.nnz:
            # One stable sort by (strip, column): ties (duplicates) keep their CSR order.
            key = host_arrays.repeat(np.arange(self.n_strips, dtype=np.int64) * max(n, 1),
                                     np.diff(strip_ptr)) + cols
            if np.any(key[1:] < key[:-1]):  # else already in order (height 1, sorted CSR)
                order = np.argsort(key, kind="stable")
                cols, values, row_in_strip = cols[order], values[order], row_in_strip[order]

        arrays = {"strip_ptr": strip_ptr.astype(self.index_dtype)}
        if self.packed:
            word = self.word_dtype
            arrays["col_idx"] = (cols.astype(word)
                                 | (row_in_strip.astype(word) << word.type(self.row_shift)))
        else:
            arrays["col_idx"] = cols.astype(self.index_dtype)
            arrays["row_in_strip"] = row_in_strip
        arrays["values"] = values.astype(self.dtype)
        return arrays

    # -- launching ---------------------------------------------------------------------------
    def launches(self, beta):
        if self.n_strips == 0:   # no rows: nothing to launch
            return []
        wg = self.params["work_group_size"]
        groups = -(-self.n_strips // (wg // self.params["group_width"]))
        return [self.step("cmrs", groups * wg, wg, n_rows=self.shape[0],
                          n_strips=self.n_strips)]
