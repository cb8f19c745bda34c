"""``csr-vector``: CSR with a group of ``vector_size`` work-items per row (Bell &
Garland's vector kernel, generalised from one warp to 2...64 work-items)."""

from .base import launch_rows, pow2_floor
from .csr_common import CSRFormatBase

VECTOR_SIZES = (2, 4, 8, 16, 32, 64)


def vector_size_for(mean_row_length, simd_lanes):
    """Smallest power of two covering the mean row length, between 2 and the device's
    SIMD width (64 at most): short rows do not leave most of a group idle, long rows
    use a whole warp/wavefront."""
    upper = max(2, min(64, pow2_floor(max(2, simd_lanes))))
    size = 2
    while size < mean_row_length and size < upper:
        size *= 2
    return size


class CSRVector(CSRFormatBase):
    name = "csr-vector"
    template = "csr_vector.mako"
    kernel_name = "csr_vector"
    param_names = ("vector_size", "work_group_size", "reduction")

    @classmethod
    def default_params(cls, features, profile, dtype):
        vector_size = vector_size_for(features.mean_row_length, profile.lanes(dtype))
        wg = 128 if profile.is_gpu else 64
        wg = max(vector_size, min(wg, profile.max_work_group_size))
        # Barriers are cheap on GPUs (tree) and costly on CPUs (one barrier, serial sum).
        reduction = "serial" if profile.is_cpu else "tree"
        return {"vector_size": vector_size, "work_group_size": wg, "reduction": reduction}

    @classmethod
    def tuning_candidates(cls, features, profile, dtype, csr=None):
        """The default vector size, half and a quarter of it (at least 2): on an H200,
        rows of 14.5 entries on average (astro-ph) ran in 55 us with 4 work-items per
        row against 73 us with the default 16, the longer rows then taking a few turns."""
        vs = cls.default_params(features, profile, dtype)["vector_size"]
        return [{}] + [{"vector_size": v} for v in (vs // 2, vs // 4) if v >= 2]

    def __init__(self, csr, device, dtype, params):
        vs = params.get("vector_size")
        if vs not in VECTOR_SIZES:
            raise ValueError(f"csr-vector: vector_size must be one of {VECTOR_SIZES}, not {vs!r}")
        wg = params.get("work_group_size")
        if isinstance(wg, int) and (wg < vs or wg % vs):
            raise ValueError(f"csr-vector: work_group_size must be a multiple of vector_size "
                             f"({vs}), not {wg!r}")
        if params.get("reduction") not in ("tree", "serial"):
            raise ValueError(f"csr-vector: reduction must be 'tree' or 'serial', not "
                             f"{params.get('reduction')!r}")
        super().__init__(csr, device, dtype, params)

    def _template_params(self):
        return {"vector_size": self.params["vector_size"], "reduction": self.params["reduction"]}

    def _local_bytes(self, work_group_size):
        return work_group_size * self.dtype.itemsize

    def _min_work_group_size(self):
        return self.params["vector_size"]

    def _launch_geometry(self):
        wg = self.params["work_group_size"]
        return launch_rows(self.shape[0], wg // self.params["vector_size"], wg)
