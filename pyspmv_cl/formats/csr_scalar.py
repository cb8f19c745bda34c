"""``csr-scalar``: CSR with one work-item per row (Bell & Garland's scalar kernel).

Best for short rows and on CPUs, where one work-item streams a whole row."""

from .base import launch_rows, row_per_item_work_group_size
from .csr_common import CSRFormatBase


class CSRScalar(CSRFormatBase):
    name = "csr-scalar"
    template = "csr_scalar.mako"
    kernel_name = "csr_scalar"
    param_names = ("work_group_size",)

    @classmethod
    def default_params(cls, features, profile, dtype):
        return {"work_group_size": row_per_item_work_group_size(profile)}

    def _launch_geometry(self):
        wg = self.params["work_group_size"]
        return launch_rows(self.shape[0], wg, wg)
