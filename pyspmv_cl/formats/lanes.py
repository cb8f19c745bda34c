"""The "lanes" block kernels, one design for the formats that have them: k / c
consecutive work-items share a row, each computing c of the block's vectors
(``lane_columns``: 1 up to k = 8, 2 from k = 16), so that every entry of the row is
read once (a broadcast to the row's lanes) and the k entries of X's row it multiplies
are read side by side (coalesced on GPUs).  The sums
are ``real_t``: complex values work.

A format mixes ``LanesBlocks`` in, may say when the lanes kernel is used (``_lanes``), names
its template (``lanes_template``, kernel ``lanes_kernel``) and its matrix arguments
(``lanes_matrix_args()``), and keeps its own block kernels under the ``items_`` names."""

from ..codegen import BLOCK_ARGS, KernelSpec
from .base import pow2_floor

#: The lanes kernels' widths (k per launch) and work-group size.
LANES_WIDTHS = (1, 2, 4, 8, 16, 32)
LANES_GROUP = 128


def lane_columns(kb: int) -> int:
    """Columns of the block each work-item computes: two from k = 16, so that a
    32-wide warp holds two rows at k = 32 and keeps more reads of X's rows in flight
    (the product waits on them, not on the matrix); one below.  On an H100 (cage10
    x133, wing x83, astro-ph x83, Groebner_id2003_aug x116, 20M non-zeros; csr-scalar,
    csr-vector and sell), against one column per work-item, two ran k = 32 0-52%
    faster and k = 16 10-41% (Groebner not measured).  At k = 8 two columns (8 rows
    a warp) gained 0-26% on the regular matrices but lost 3% on astro-ph and 26% on
    Groebner (a warp waits for its longest row).  Four columns at k = 32 were 4-6%
    faster than two on the regular float64 matrices but 14-15% slower on the
    irregular ones, and slower in float32 on 2 of 3 matrices; eight were slower
    everywhere."""
    return 2 if kb >= 16 else 1


class LanesBlocks:
    """Block-product hooks of ``SpMVFormat`` routed to the lanes kernel when ``_lanes``."""

    lanes_template: str = None
    lanes_kernel: str = None

    @property
    def _lanes(self) -> bool:
        """Whether block products take the lanes kernel.  By default: complex values on
        GPUs (the format's items kernels elsewhere, complex up to 8 vectors); the CSR
        formats decide by their ``block_mapping`` parameter instead."""
        return self.dtype.kind == "c" and self.profile.is_gpu

    def lanes_matrix_args(self):
        raise NotImplementedError

    def lanes_values(self) -> dict:
        """Scalar arguments of the lanes kernel besides the driver's (e.g. n_rows)."""
        return {"n_rows": self.shape[0]}

    def block_template_params(self, kb):
        params = super().block_template_params(kb)
        return {**params, "lane_columns": lane_columns(kb)} if self._lanes else params

    def _lanes_group(self) -> int:
        return min(LANES_GROUP, pow2_floor(self.profile.max_work_group_size))

    def supported_block_widths(self):
        if self._lanes:
            return tuple(kb for kb in LANES_WIDTHS if kb <= self._lanes_group())
        return super().supported_block_widths()

    @property
    def has_block_kernels(self) -> bool:
        if self._lanes:   # one real_t sum per work-item: complex values too
            return 1 in self.supported_block_widths()
        return super().has_block_kernels

    def block_template_for(self, kb):
        return self.lanes_template if self._lanes else self.block_template

    def block_kernel_specs(self, kb):
        if self._lanes:
            return [KernelSpec(self.lanes_kernel, (*self.lanes_matrix_args(), *BLOCK_ARGS),
                               fixed_group=True, group_size=self._lanes_group())]
        return self.items_block_kernel_specs(kb)

    def block_local_bytes(self, kb, work_group_size):
        return 0 if self._lanes else self.items_block_local_bytes(kb, work_group_size)

    def block_launches(self, kb, work_group_size, beta):
        if self._lanes:
            group = self._lanes_group()
            items = kb // lane_columns(kb)   # work-items per row
            groups = max(1, -(-self.shape[0] * items // group))
            return [self.step(self.lanes_kernel, groups * group, group,
                              **self.lanes_values())]
        return self.items_block_launches(kb, work_group_size, beta)

    def items_block_kernel_specs(self, kb):
        raise NotImplementedError

    def items_block_local_bytes(self, kb, work_group_size):
        return 0

    def items_block_launches(self, kb, work_group_size, beta):
        raise NotImplementedError
