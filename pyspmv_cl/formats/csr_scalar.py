"""``csr-scalar``: CSR with one work-item per row (Bell & Garland's scalar kernel).

Best for short rows and on CPUs, where one work-item streams a whole row."""

from .csr_common import CSRFormatBase


class CSRScalar(CSRFormatBase):
    name = "csr-scalar"
    template = "csr_scalar.mako"
    kernel_name = "csr_scalar"
    param_names = ("work_group_size",)

    @classmethod
    def default_params(cls, features, profile, dtype):
        # GPUs: a few warps per group.  CPUs (PoCL): groups are loops on one thread,
        # so a larger group amortises the per-group overhead.
        wg = 128 if profile.is_gpu else 256
        return {"work_group_size": min(wg, profile.max_work_group_size)}

    def _launch_geometry(self):
        wg = self.params["work_group_size"]
        return self._groups_for(wg) * wg, wg
