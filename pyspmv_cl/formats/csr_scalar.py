"""``csr-scalar``: CSR with one work-item per row (Bell & Garland's scalar kernel).

Best for short rows and on CPUs, where one work-item streams a whole row."""

from ..codegen import KernelSpec
from . import params as P
from .base import (
    BLOCK_WIDTHS,
    csr_bytes,
    launch_rows,
    row_per_item_work_group_size,
    skewed_rows,
)
from .csr_common import (
    BLOCK_PARAMS,
    CSR_ROW_ARGS,
    CSR_ROW_BLOCK_ARGS,
    CSRFormatBase,
    default_block_mapping,
)
from .registry import register
from .storage import VALUE_BITS, full_bits


@register
class CSRScalar(CSRFormatBase):
    name = "csr-scalar"
    complex_values = True
    order = 0
    template = "csr_scalar.mako"
    params = (P.work_group_size(), *BLOCK_PARAMS, VALUE_BITS)
    block_widths = BLOCK_WIDTHS
    block_template = "csr_scalar_block.mako"

    @classmethod
    def default_params(cls, features, profile, dtype):
        return {"work_group_size": row_per_item_work_group_size(profile),
                "block_mapping": default_block_mapping(profile),
                "value_bits": full_bits(dtype)}

    @classmethod
    def estimate_cost(cls, features, profile, dtype):
        efficiency = 0.9 if profile.is_cpu else 0.5 if skewed_rows(features) else 0.8
        return csr_bytes(features, dtype) / efficiency, None

    def kernel_specs(self):
        return [KernelSpec("csr_scalar", CSR_ROW_ARGS, fixed_group=True)]

    def launches(self, beta):
        wg = self.params["work_group_size"]
        return [self.step("csr_scalar", *launch_rows(self.shape[0], wg, wg),
                          n_rows=self.shape[0])]

    def items_block_kernel_specs(self, kb):
        return [KernelSpec("csr_scalar_block", CSR_ROW_BLOCK_ARGS, fixed_group=True)]

    def items_block_launches(self, kb, work_group_size, beta):
        wg = work_group_size
        return [self.step("csr_scalar_block", *launch_rows(self.shape[0], wg, wg),
                          n_rows=self.shape[0])]
