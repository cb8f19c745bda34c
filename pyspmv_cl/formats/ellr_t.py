"""``ellr-t``: ELLPACK-R with ``T`` work-items per row (Vázquez, Fernández and
Garzón, "Automatic tuning of the sparse matrix vector product on GPUs based on the
ELLR-T approach", section 3.2).

ELLPACK-R is ELL plus ``rl``, the length of every row, so a row's loop ends at its own
length and padding is never read.  Entry ``j`` of row ``i`` is read by work-item
``j % T`` of the row in iteration ``j // T``; it lives at
``(j // T) * stride * T + i * T + j % T`` (``stride``: the row count rounded up to the
SIMD width), so in every iteration the ``T`` work-items of consecutive rows read
consecutive addresses (the paper's figure 2a).  The ``T`` partial sums of a row are
reduced in local memory with barriers (a tree of ``log2 T`` steps; none for ``T =
1``, plain ELLPACK-R).

Parameters: ``T`` (1, 2, 4, ... up to the SIMD width, 64 at most), ``work_group_size``
(the paper's ``BS``, a multiple of ``T``) and ``max_padding`` (as ``ell``: refuse when
the padded arrays exceed that many times the non-zeros, default 20, unless under
1 MiB).  ``T`` and ``BS`` left out are chosen by the paper's model
(:func:`pyspmv_cl.formats.ellrt_model.ellrt_model`, with one access per half-warp for reading
``rl``) from the row lengths, the device's compute units and SIMD width, over block
sizes 128, 256 and 512 (what fits the device).  On CPU devices, where each barrier
splits the work-item loop (PoCL), ``T`` defaults to 1.
"""

import numpy as np
import pyopencl.array as cla

from ..codegen import PRODUCT_ARGS, KernelSpec, matrix, scalar
from ..errors import InvalidParameterError
from . import ell_device
from . import params as P
from .base import SpMVFormat, launch_rows, pow2_floor
from .ell import (
    DEFAULT_MAX_PADDING,
    MAX_PADDING,
    TUNING_MAX_PADDING,
    check_padding,
    ell_stride,
    row_slots,
)
from .ellrt_model import DEFAULT_BLOCK_SIZES, ellrt_model
from .registry import register

# One coalesced read of rl[] per half-warp besides the row's entries (see
# pyspmv_cl.formats.ellrt_model: it reproduces the paper's Table 1 rows we can rebuild).
MODEL_OVERHEAD = 1
# The tuner times ELLR-T only when padding every row to the longest costs at most this
# many slots per non-zero.


def max_t(profile):
    """The largest T a device takes: its SIMD width (a power of two, 64 at most)."""
    return pow2_floor(max(1, min(64, profile.simd_width)))


def t_candidates(profile):
    if profile.is_cpu:
        return (1,)
    return tuple(1 << k for k in range(max_t(profile).bit_length()))


# GPU drivers compile this kernel for at most 256 work-items (CL_KERNEL_WORK_GROUP_SIZE
# on an H100 through NVIDIA's OpenCL), so the model only weighs block sizes that run.
GPU_MAX_BLOCK = 256


def block_size_candidates(profile):
    """The paper's block sizes that this device runs the kernel with."""
    cap = profile.max_work_group_size
    if profile.is_gpu:
        cap = min(cap, GPU_MAX_BLOCK)
    fitting = tuple(bs for bs in DEFAULT_BLOCK_SIZES if bs <= cap)
    return fitting or (pow2_floor(cap),)


def ellrt_slots(rows, position, t, slice_):
    """Where the ELLR-T arrays keep entry ``position`` of row ``rows``: iteration
    ``position // t`` of work-item ``position % t`` of the row."""
    return (position // t) * slice_ + rows * t + position % t


def ellrt_arrays(csr, t, row_align, index_dtype, dtype):
    """``(col_idx, values, row_length, slice)``: the ELLR-T arrays of ``csr`` for ``t``
    work-items per row (padding slots: column -1, value 0; never read), and the distance
    between consecutive iterations."""
    m = csr.shape[0]
    stride = ell_stride(m, row_align)
    rows, position, lengths = row_slots(csr.indptr)
    iterations = -(-int(lengths.max(initial=0)) // t)
    slice_ = stride * t
    col_idx = np.full(iterations * slice_, -1, dtype=index_dtype)
    values = np.zeros(iterations * slice_, dtype=dtype)
    slot = ellrt_slots(rows, position, t, slice_)
    col_idx[slot] = csr.indices
    values[slot] = csr.data
    return col_idx, values, lengths.astype(index_dtype), slice_


@register
class ELLRT(SpMVFormat):
    name = "ellr-t"
    complex_values = True
    order = 5
    template = "ellr_t.mako"
    may_refuse = True
    converts_on_device = True
    host_input_on_device = True   # GPUs: 20M non-zeros, 1.2 s on the H200's host
    value_read = "gather"         # values_in_csr_order: ELLR-T's slot of entry j, row i
    params = (
        P.Param("T", P.optional(P.integer(1, 64, power_of_two=True)),
                "work-items per row, up to the SIMD width (None: the model's choice)"),
        P.Param("work_group_size", P.optional(P.positive_int()),
                "the paper's block size BS, a multiple of T (None: the model's choice)"),
        MAX_PADDING,
    )

    @classmethod
    def default_params(cls, features, profile, dtype):
        # T and the block size need the row lengths: the model runs in analyse.
        return {"T": None, "work_group_size": None, "max_padding": DEFAULT_MAX_PADDING}

    @classmethod
    def check_params(cls, params, profile):
        t = params["T"]
        limit = max_t(profile)
        if t is not None and t > limit:
            raise InvalidParameterError(
                f"ellr-t: T must be a power of two from 1 to {limit} (the SIMD width of "
                f"{profile.name}), not {t!r}")
        if t is not None:
            P.check_multiple(cls.name, params, "T", t)

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        m, nnz = features.n_rows, max(features.nnz, 1)
        padding = features.max_row_length * m / nnz
        if padding > TUNING_MAX_PADDING:
            return None, f"padding {padding:.1f}x > {TUNING_MAX_PADDING:g}"
        return m * features.max_row_length * (np.dtype(dtype).itemsize + 4) / 0.85, None

    def analyse(self, csr):
        """``T`` and ``work_group_size`` left open are chosen by the model; then the
        padded arrays are checked before anything is built."""
        t, wg = self.params["T"], self.params["work_group_size"]
        # The row lengths once (5.1M rows: each pass 6-9 ms), kept for convert_device.
        self._lengths = lengths = np.diff(csr.indptr)
        if t is None or wg is None:
            wg, t = self._model(lengths, self.profile, t, wg)
        self.params["work_group_size"], self.params["T"] = int(wg), int(t)
        t = self.params["T"]
        self.row_align = pow2_floor(max(1, self.profile.simd_width))
        m = csr.shape[0]
        iterations = -(-int(lengths.max(initial=0)) // t) if m else 0
        slots = iterations * ell_stride(m, self.row_align) * t
        check_padding(self.name, slots, csr.nnz,
                      [slots * self.dtype.itemsize, slots * self.index_dtype.itemsize,
                       m * self.index_dtype.itemsize],
                      self.params["max_padding"], "hyb, sell or csr-vector", self.profile,
                      "ELLPACK-R")

    @staticmethod
    def _model(lengths, profile, t, wg):
        """``(work_group_size, T)`` by the paper's model, over the candidates the caller
        left open."""
        ts = (t,) if t is not None else t_candidates(profile)
        if wg is not None:
            ts = tuple(v for v in ts if wg % v == 0) or (1,)
        sizes = (wg,) if wg is not None else block_size_candidates(profile)
        if t is not None and wg is None:
            sizes = tuple(bs for bs in sizes if bs % t == 0) or (max(t, sizes[-1]),)
        return ellrt_model(lengths, profile.compute_units, profile.simd_width,
                           block_sizes=sizes, t_values=ts, overhead=MODEL_OVERHEAD)

    def programs(self):
        conversion = [ell_device.program(self.params["T"])] if self.converting_on_device \
            else []
        return [*super().programs(), *conversion]

    def convert(self, csr):
        self.__dict__.pop("_lengths", None)   # analyse's, for convert_device only
        col_idx, values, row_length, self.slice = ellrt_arrays(
            csr, self.params["T"], self.row_align, self.index_dtype, self.dtype)
        return {"col_idx": col_idx, "values": values, "row_length": row_length}

    def convert_device(self, csr):
        """The same arrays made on the device (ell_device); the row lengths come from
        ``indptr``, which is on the host too."""
        t = self.params["T"]
        lengths = self.__dict__.pop("_lengths", None)
        if lengths is None:
            lengths = np.diff(np.asarray(csr.indptr))
        iterations = -(-int(lengths.max(initial=0)) // t)
        self.slice = ell_stride(self.shape[0], self.row_align) * t
        col_idx, values = ell_device.scatter(self, csr, iterations * self.slice, self.slice)
        row_length = cla.to_device(self.device.queue,
                                  lengths.astype(self.index_dtype, copy=False))
        return {"col_idx": col_idx, "values": values, "row_length": row_length}

    def values_in_csr_order(self, queue, indptr):
        """Entry j of row i sits at slot (j // T) * slice + i * T + j % T."""
        t = self.params["T"]
        rows, position, lengths = row_slots(indptr)
        iterations = -(-int(lengths.max(initial=0)) // t)
        stored = self._read_values(queue, "values", iterations * self.slice)
        return stored[ellrt_slots(rows, position, t, self.slice)]

    def template_params(self):
        return {"T": self.params["T"]}

    def local_bytes(self, work_group_size):
        return work_group_size * self.dtype.itemsize if self.params["T"] > 1 else 0

    def min_work_group_size(self):
        return self.params["T"]

    def kernel_specs(self):
        args = (scalar("n_rows", "long"), scalar("slice", "long"),
                matrix("col_idx", "index_t"), matrix("values", "real_t"),
                matrix("row_length", "index_t"), *PRODUCT_ARGS)
        return [KernelSpec("ellr_t", args, fixed_group=True)]

    def launches(self, beta):
        wg = self.params["work_group_size"]
        return [self.step("ellr_t", *launch_rows(self.shape[0], wg // self.params["T"], wg),
                          n_rows=self.shape[0], slice=self.slice)]
