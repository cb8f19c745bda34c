"""The "lanes" block kernels, one design for the formats that have them: k / c
consecutive work-items share a row, each computing c of the block's vectors
(``lane_columns``, by width and format), so that every entry of the row is read once (a
broadcast to the row's lanes) and the k entries of X's row it multiplies are read side
by side (coalesced on GPUs).  The sums are ``real_t``: complex values work.

A format mixes ``LanesBlocks`` in, may say when the lanes kernel is used (``_lanes``), names
its template (``lanes_template``, kernel ``lanes_kernel``) and its matrix arguments
(``lanes_matrix_args()``), and keeps its own block kernels under the ``items_`` names."""

from ..codegen import BLOCK_ARGS, KernelSpec
from . import params as P
from .base import plan_blocks, pow2_floor

#: The lanes kernels' widths (k per launch) and work-group size.
LANES_WIDTHS = (1, 2, 4, 8, 16, 32)
LANES_GROUP = 128
#: The CSR formats' rule at k = 4 and 8: two columns per work-item where the row
#: lengths' spread (std/mean) is at most this for the width, else one (``lane_columns``).
CSR_REGULAR_SPREAD = {4: 1.1, 8: 1.5}
#: ... and from k = 16: four columns where the rows are short and even (mean length and
#: spread at most these), else two.
CSR_SHORT_ROWS = (8.0, 1.1)


#: Declared by the formats with lanes kernels: a fixed column count overrides
#: ``lane_columns``'s rule (the tuner tries the CSR formats' alternative, see
#: ``lane_columns_alternative``).
LANE_COLUMNS = P.Param("lane_columns", P.optional(P.integer(1, 8, power_of_two=True)),
                       "block columns each work-item of the lanes kernel computes (1, 2, "
                       "4 or 8, at most the block's width; None: by width and format)")


#: Declared by the CSR formats: how many groups of a row's lanes share its entries.
LANE_SPLIT = P.Param("lane_split", P.optional(P.integer(1, 32, power_of_two=True)),
                     "groups of lanes of the CSR lanes kernel that share a row's entries, "
                     "each taking every lane_split-th entry, their sums added in local "
                     "memory (1, 2, 4, ... 32; None: by width and rows)")


#: Declared by the CSR formats: rows per window in which the lanes kernel takes the
#: rows longest first (a permutation array, ``row_order``), so that the rows a warp holds
#: have about the same length.
LANE_ORDER = P.Param("lane_order", P.optional(P.integer(2, 2**30, power_of_two=True)),
                     "rows per window in which the CSR lanes kernel takes the rows "
                     "longest first, so that a warp's rows end together (a power of two; "
                     "None: in their order)")


#: Rows long and uneven enough for block tuning to also time a split row at k = 8:
#: mean length and spread (std/mean) at least these.
SPLIT_ROWS = (16.0, 2.0)
#: The split it times: four groups of lanes, two columns each.
SPLIT_CANDIDATE = {"lane_split": 4, "lane_columns": 2}


#: Rows uneven enough (spread, std/mean of their lengths, at least this) for block
#: tuning to also time the CSR lanes kernels with the rows taken longest first
#: (``lane_order``), from k = 8.
ORDER_SPREAD = 1.4
#: The order it times: windows of 256 rows; with the row split, windows of 4096.
ORDER_CANDIDATE = {"lane_order": 256}
SPLIT_ORDER_CANDIDATE = {**SPLIT_CANDIDATE, "lane_order": 4096}


def order_pays(kb: int, row_spread=None) -> bool:
    """Whether block tuning times ``lane_order`` for blocks of ``kb``.  On an H100
    (csr-vector, 20M non-zeros, session 25), windows of 256 rows against the rows in
    their order: astro-ph (spread 1.45) k = 8 254 / 361 us (float32 / float64) against
    257 / 392, k = 32 433 / 686 against 473 / 756; Groebner_id2003_aug (2.78) k = 8 248
    / 363 against 259 / 384, k = 32 376 / 595 against 397 / 614; with the row split at
    k = 8 (windows of 4096) 213 / 289 against 203 / 319.  On the even rows of cage10
    (0.30) and wing (0.07) 5-16% slower."""
    return kb >= 8 and row_spread is not None and row_spread >= ORDER_SPREAD


def split_pays(kb: int, mean_row=None, row_spread=None) -> bool:
    """Whether block tuning times ``SPLIT_CANDIDATE`` for blocks of ``kb``.  On an H100
    at k = 8 (csr-vector, 20M non-zeros, session 24) it ran Groebner_id2003_aug (35
    entries a row, spread 2.8) in 201 / 322 us (float32 / float64) against block
    tuning's 227 / 370, and lost on astro-ph (14.5, 1.45), cage10 and wing, and at k =
    32 everywhere; measured at k = 8 only."""
    return kb == 8 and mean_row is not None and row_spread is not None \
        and mean_row >= SPLIT_ROWS[0] and row_spread >= SPLIT_ROWS[1]


def lane_columns(kb: int, slotted: bool = False, row_spread=None, mean_row=None) -> int:
    """Columns of the block each work-item computes.  Several columns per work-item put
    several rows in a 32-wide warp, so more reads of X's rows are in flight (the
    product waits on them, not on the matrix).

    - CSR (``slotted`` False): one up to k = 2, two from k = 16.  On an H100 (cage10
      x133, wing x83, astro-ph x83, Groebner_id2003_aug x116, 20M non-zeros), against
      one column, two ran k = 32 0-52% faster and k = 16 10-41%.
    - CSR from k = 16: four where the rows are short and even (``mean_row`` and
      ``row_spread`` within ``CSR_SHORT_ROWS``).  On the H100 (ten shared matrices,
      session 18) four against two ran 2-12% faster at k = 16 and 32 on wing, fe_4elt2,
      gemat12 and bayer10 (mean 3.9-7.1, spread 0.07-1.05) in 14 of 16 cases (wing
      float64 k = 32 9% slower, bayer10 float64 k = 16 1%), and 5-41% slower on the
      longer or uneven rows of the other six in most cases (float64 k = 32 on cage10,
      szdMat, wathenSmall: 5-7% faster).
    - CSR at k = 4 and 8: two where the rows' ``row_spread`` (std/mean of their
      lengths, when known) is at most ``CSR_REGULAR_SPREAD[k]``, else one.  On an H100
      (csr-vector, the ten shared matrices at 20M non-zeros, session 18), at spreads of
      0.07-1.05, two ran k = 8 17-28% faster in float32 and 5-12% in float64 and k = 4
      up to 21% faster (wing float64 8% and szdMat float32 1% slower); astro-ph (1.45)
      k = 8 7% faster in float32, 2.5% slower in float64, k = 4 6% slower in float32.
      At 2.78 (Groebner: the warp's rows wait for the longest) two lost up to 28%, at
      4.31 (rajat01) up to 13%.  At k = 2 two columns were mixed or much slower
      (cage10 float64: 233 against 121 us).
    - ell and sell (``slotted``: a row's entries lie a stride apart, so neighbouring
      rows' entries are neighbours and more rows a warp coalesce the matrix's reads):
      two at k <= 8, four from k = 16.  sell on the same H100 (cage10, wing, astro-ph,
      float32 and float64): two against one at k = 8 16-56% faster; four against two
      at k = 32 3-32% faster, at k = 16 0-20% on cage10 and wing (astro-ph 13%
      slower).  ell's k = 8 with one column took 545-639 us, against 312-423 with two.
    """
    if slotted:
        return min(kb, 2 if kb <= 8 else 4)
    known = row_spread is not None
    if kb >= 16:
        short = known and mean_row is not None and mean_row <= CSR_SHORT_ROWS[0] \
            and row_spread <= CSR_SHORT_ROWS[1]
        return 4 if short else 2
    bound = CSR_REGULAR_SPREAD.get(kb)
    return 2 if known and bound is not None and row_spread <= bound else 1


def lane_columns_alternative(kb: int, slotted: bool = False, row_spread=None,
                             mean_row=None):
    """The column count block tuning also times for width ``kb`` (None: none): for the
    CSR formats at k = 4 and 8 the other of one and two, from k = 16 the other of two
    and four.
    csr-vector, 20M non-zeros: on an H100 at k = 32 four columns beat the rule's two on
    wing (rows of 4 entries: 684 against 793 us in float32) and cage10 float64 (558
    against 583), and lost 7-35% on astro-ph, Groebner_id2003_aug and cage10 float32;
    k = 8: ``lane_columns``.  For sell, eight columns lost everywhere on an H200 and
    other counts mostly lost."""
    if slotted or kb < 4:
        return None
    rule = lane_columns(kb, slotted, row_spread, mean_row)
    return 3 - rule if kb < 16 else 6 - rule   # 1 <-> 2, 2 <-> 4


class LanesBlocks:
    """Block-product hooks of ``SpMVFormat`` routed to the lanes kernel when ``_lanes``."""

    lanes_template: str = None
    lanes_kernel: str = None
    #: Whether a row's entries lie a stride apart (ell, sell): ``lane_columns``'s rule.
    lanes_slotted: bool = False
    #: Whether the template splits a row's entries among groups of lanes (``lane_split``).
    lanes_split: bool = False

    @property
    def _lanes(self) -> bool:
        """Whether block products take the lanes kernel.  By default: complex values on
        GPUs (the format's items kernels elsewhere, complex up to 8 vectors); the CSR
        formats decide by their ``block_mapping`` parameter instead."""
        return self.dtype.kind == "c" and self.profile.is_gpu

    @classmethod
    def first_lanes_width(cls, features, profile, dtype, given, k):
        """The width of the first block of ``k`` vectors the lanes kernel of an operator
        built with ``given`` would multiply, or None without a lanes kernel (block
        tuning asks once per format, then its ``lane_*_candidate`` hooks)."""
        probe = cls.bare_instance(features, profile, dtype, given)
        if probe is None or not probe._lanes:
            return None
        widths = probe.supported_block_widths()
        return plan_blocks(k, widths)[0][1] if 1 in widths else None

    @classmethod
    def lane_columns_candidate(cls, features, given, kb):
        """``{"lane_columns": c}`` for block tuning to time besides the parameters
        ``given`` whose lanes kernel's first block is ``kb`` wide
        (``lane_columns_alternative``), or None: none for that width, or the caller
        fixed the count."""
        if given.get("lane_columns") is not None:
            return None
        alt = lane_columns_alternative(kb, cls.lanes_slotted, features.row_spread,
                                       features.mean_row_length)
        return None if alt is None or alt > kb else {"lane_columns": alt}

    @classmethod
    def lane_split_candidate(cls, features, given, kb):
        """``SPLIT_CANDIDATE`` for block tuning to time at first width ``kb`` where the
        rows are long and uneven (``split_pays``), or None: a format whose template
        does not split rows, or the caller fixed the split or the column count."""
        if not cls.lanes_split or given.get("lane_split") is not None \
                or given.get("lane_columns") is not None:
            return None
        return dict(SPLIT_CANDIDATE) \
            if split_pays(kb, features.mean_row_length, features.row_spread) else None

    @classmethod
    def lane_order_candidate(cls, features, given, kb):
        """For block tuning at first width ``kb`` where the rows are uneven
        (``order_pays``): ``SPLIT_ORDER_CANDIDATE`` where the row split is timed too
        (``split_pays``), else ``ORDER_CANDIDATE``; or None: a format whose template
        does not order rows (the CSR one, which splits them too), or the caller fixed
        the order, the split or the column count."""
        if not cls.lanes_split or any(given.get(p) is not None for p in
                                      ("lane_order", "lane_split", "lane_columns")):
            return None
        if not order_pays(kb, features.row_spread):
            return None
        split = split_pays(kb, features.mean_row_length, features.row_spread)
        return dict(SPLIT_ORDER_CANDIDATE if split else ORDER_CANDIDATE)

    def lanes_matrix_args(self):
        raise NotImplementedError

    def lanes_values(self) -> dict:
        """Scalar arguments of the lanes kernel besides the driver's (e.g. n_rows)."""
        return {"n_rows": self.shape[0]}

    def _lane_columns(self, kb) -> int:
        """Columns per work-item of this format's width-``kb`` lanes kernel: what its
        template is rendered with and its launch is sized by (the rule reads the rows'
        spread where ``instantiate`` was given the matrix's features)."""
        fixed = self.params.get("lane_columns")
        return min(kb, fixed) if fixed else lane_columns(
            kb, self.lanes_slotted, self.row_spread, self.mean_row_length)

    def _lane_split(self, kb) -> int:
        """Groups of lanes sharing a row's entries in the width-``kb`` kernel: the
        parameter (1 when not given), at most what a work-group holds of the row's
        lanes."""
        if not self.lanes_split:
            return 1
        columns = self._lane_columns(kb)
        split = self.params.get("lane_split") or 1   # (block tuning proposes others)
        return max(1, min(split, self._lanes_group() // (kb // columns)))

    def block_template_params(self, kb):
        params = super().block_template_params(kb)
        if not self._lanes:
            return params
        extra = {"lane_split": self._lane_split(kb), "lanes_group": self._lanes_group()} \
            if self.lanes_split else {}
        return {**params, "lane_columns": self._lane_columns(kb), **extra}

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
        if self._lanes:   # a split row's sums meet in local memory: one per column
            split = self._lane_split(kb)
            return 0 if split == 1 else \
                self._lanes_group() * self._lane_columns(kb) * self.dtype.itemsize
        return self.items_block_local_bytes(kb, work_group_size)

    def block_launches(self, kb, work_group_size, beta):
        if self._lanes:
            group = self._lanes_group()
            # work-items per row
            items = kb // self._lane_columns(kb) * self._lane_split(kb)
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
