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
(:func:`pyspmv_cl.tuning.ellrt_model`, with one access per half-warp for reading
``rl``) from the row lengths, the device's compute units and SIMD width, over block
sizes 128, 256 and 512 (what fits the device).  On CPU devices, where each barrier
splits the work-item loop (PoCL), ``T`` defaults to 1.
"""

import numpy as np

from .base import SpMVFormat, launch_rows, pow2_floor
from .ell import (
    DEFAULT_MAX_PADDING,
    check_padding,
    ell_stride,
    row_slots,
    validate_max_padding,
)
from .ellrt_model import DEFAULT_BLOCK_SIZES, ellrt_model

# One coalesced read of rl[] per half-warp besides the row's entries (see
# pyspmv_cl.tuning.ellrt: it reproduces the paper's Table 1 rows we can rebuild).
MODEL_OVERHEAD = 1


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


def ellrt_arrays(csr, t, row_align, index_dtype, dtype):
    """``(col_idx, values, row_length, slice)``: the ELLR-T arrays of ``csr`` for ``t``
    work-items per row (padding slots: column -1, value 0; never read), and the distance
    between consecutive iterations."""
    m = csr.shape[0]
    stride = ell_stride(m, row_align)
    rows, position, lengths = row_slots(csr)
    iterations = -(-int(lengths.max(initial=0)) // t)
    slice_ = stride * t
    col_idx = np.full(iterations * slice_, -1, dtype=index_dtype)
    values = np.zeros(iterations * slice_, dtype=dtype)
    slot = (position // t) * slice_ + rows * t + position % t
    col_idx[slot] = csr.indices
    values[slot] = csr.data
    return col_idx, values, lengths.astype(index_dtype), slice_


class ELLRT(SpMVFormat):
    name = "ellr-t"
    template = "ellr_t.mako"
    kernel_name = "ellr_t"
    param_names = ("T", "work_group_size", "max_padding")
    may_refuse = True

    @classmethod
    def default_params(cls, features, profile, dtype):
        # T and the block size need the row lengths: the model runs at conversion.
        return {"T": None, "work_group_size": None, "max_padding": DEFAULT_MAX_PADDING}

    def __init__(self, csr, device, dtype, params):
        params = dict(params)
        profile = device.profile
        params["max_padding"] = validate_max_padding(self.name, params.get("max_padding"))
        t, wg = params.get("T"), params.get("work_group_size")
        limit = max_t(profile)
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer))
                              or t < 1 or t & (t - 1) or t > limit):
            raise ValueError(f"ellr-t: T must be a power of two from 1 to {limit} (the SIMD "
                             f"width of {profile.name}), not {t!r}")
        if isinstance(wg, (int, np.integer)) and t is not None and (wg < t or wg % t):
            raise ValueError(f"ellr-t: work_group_size must be a multiple of T ({t}), "
                             f"not {wg!r}")
        if t is None or wg is None:
            params["work_group_size"], params["T"] = self._model(csr, profile, t, wg)
        params["T"] = int(params["T"])
        super().__init__(csr, device, dtype, params)

    @staticmethod
    def _model(csr, profile, t, wg):
        """``(work_group_size, T)`` by the paper's model, over the candidates the caller
        left open."""
        ts = (t,) if t is not None else t_candidates(profile)
        if wg is not None:
            if not isinstance(wg, (int, np.integer)) or isinstance(wg, bool) or wg < 1:
                return wg, ts[0]  # the base reports the bad value
            ts = tuple(v for v in ts if wg % v == 0) or (1,)
        sizes = (wg,) if wg is not None else block_size_candidates(profile)
        if t is not None and wg is None:
            sizes = tuple(bs for bs in sizes if bs % t == 0) or (max(t, sizes[-1]),)
        return ellrt_model(np.diff(csr.indptr), profile.compute_units, profile.simd_width,
                           block_sizes=sizes, t_values=ts, overhead=MODEL_OVERHEAD)

    def _convert(self, csr):
        t = self.params["T"]
        row_align = pow2_floor(max(1, self.profile.simd_width))
        m = csr.shape[0]
        iterations = -(-int(np.diff(csr.indptr).max(initial=0)) // t) if m else 0
        slots = iterations * ell_stride(m, row_align) * t
        check_padding(self.name, slots, csr.nnz,
                      [slots * self.dtype.itemsize, slots * self.index_dtype.itemsize,
                       m * self.index_dtype.itemsize],
                      self.params["max_padding"], "hyb, sell or csr-vector", self.profile,
                      "ELLPACK-R")
        col_idx, values, row_length, self.slice = ellrt_arrays(
            csr, t, row_align, self.index_dtype, self.dtype)
        return {"col_idx": col_idx, "values": values, "row_length": row_length}

    def _template_params(self):
        return {"T": self.params["T"]}

    def _local_bytes(self, work_group_size):
        return work_group_size * self.dtype.itemsize if self.params["T"] > 1 else 0

    def _min_work_group_size(self):
        return self.params["T"]

    def _kernel_args(self, x_buf, y_buf, alpha, beta):
        b = self.buffers
        return (np.int64(self.shape[0]), np.int64(self.slice), b["col_idx"], b["values"],
                b["row_length"], x_buf, y_buf, alpha, beta)

    def _launch_geometry(self):
        wg = self.params["work_group_size"]
        return launch_rows(self.shape[0], wg // self.params["T"], wg)
