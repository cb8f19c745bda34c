"""The rule-based format choice: rules over row-length statistics and the device type,
read off the benchmark runs recorded in BENCHMARKS.md (an H100 through NVIDIA's
OpenCL; PoCL on a 2-core CPU).  The tuner uses it when measuring would not pay
(``tune=False``, small matrices), as its first candidate when it measures, and when no
candidate could be measured.

GPUs:
- few diagonals with little padding (stencils): ``dia`` reads no column indices;
- very skewed rows (power-law graphs, a few dense rows): ``coo`` splits the work by
  non-zeros, so no single row serialises a warp (the CSR kernels were 40-100x slower);
- long rows (mean >= 32) or very uneven ones (std/mean >= 3, circuit matrices):
  ``csr-vector``, a group of work-items per row (rajat01: 2.5x cuSPARSE, while sell
  padded its slices to 0.6x);
- otherwise ``sell``: as fast as csr-scalar or faster on every regular matrix measured
  (2x on random columns in float64), its sorting absorbing moderately uneven rows.

CPUs: ``sell`` (one work-item walks a slice of SIMD-width rows, vectorised), unless one
slice holding the longest row would be a large share of a thread's work; then
``csr-scalar``.

Complex values: the same rules among the formats that take them (``complex_values``);
a choice that does not (csr5, bccoo) becomes ``csr-vector``.

Block products (``block_size`` k > 1): a format without block kernels reads the matrix
once per vector, so ``dia`` becomes ``sell`` (regular rows) and ``coo`` becomes
``csr-vector`` (a group of work-items per row absorbs the long rows); ``block_params``
then gives the choice parameters with block kernels where its defaults (with the
caller's parameters) have none (csr-vector's row mapping when the caller asked for
``block_mapping="items"`` on a GPU, whose default mapping may be the adaptive one).
"""

import numpy as np

from ..formats import FORMATS

LONG_ROWS = 32.0
VERY_UNEVEN_ROWS = 3.0
DIA_MAX_DIAGONALS = 64
DIA_MAX_FILL = 1.5
SKEWED_ROW_FACTOR = 16      # longest row >= this many times the mean ...
SKEWED_ROW_MIN = 4096       # ... and at least this long
CPU_SLICE_SHARE = 1.0       # C * longest row / (nnz per compute unit)


#: For block products: a choice without block kernels -> (format, why) with them.
BLOCK_SUBSTITUTES = {
    "dia": ("sell", "sell's block kernels read it once per block of vectors"),
    "coo": ("csr-vector", "csr-vector (a group of work-items per row) has block kernels"),
}


def choose_format(features, profile, dtype, block_size=1):
    """Return (format name, explanation), for products of ``block_size`` vectors."""
    name, why = _choose_format(features, profile, dtype)
    if np.dtype(dtype).kind == "c" and not FORMATS[name].complex_values:
        name, why = ("csr-vector", f"{why}; {name} takes no complex values: csr-vector, a "
                                   "group of work-items per row, instead")
    if block_size > 1 and name in BLOCK_SUBSTITUTES and not FORMATS[name].block_widths:
        substitute, because = BLOCK_SUBSTITUTES[name]
        name, why = substitute, (f"{why}; but {name} has no block kernels and would read "
                                 f"the matrix {block_size} times: {because}")
    return name, why


def block_sets_first(cls, features, profile, dtype, candidates, given=None):
    """``candidates`` (parameter sets of the format ``cls``) with those that give it
    block kernels, with the caller's parameters ``given``, first (stable)."""
    given = dict(given or {})
    return sorted(candidates, key=lambda p: 1 not in cls.block_widths_for(
        features, profile, dtype, {**given, **p}))


def block_params(name, features, profile, dtype, block_size, given=None):
    """Parameters to add to the rules' choice ``name`` so that products of
    ``block_size`` vectors run on block kernels where its defaults with the caller's
    parameters ``given`` would not: the first of its tuning candidates that has them
    and keeps ``given`` ({} when none does, or none is needed)."""
    cls, given = FORMATS[name], dict(given or {})
    if block_size == 1 or not cls.block_widths or \
            1 in cls.block_widths_for(features, profile, dtype, given):
        return {}
    for params in cls.tuning_candidates(features, profile, dtype):
        if any(k in given and given[k] != v for k, v in params.items()):
            continue   # the caller's own parameters stand
        if 1 in cls.block_widths_for(features, profile, dtype, {**given, **params}):
            return dict(params)
    return {}


def _choose_format(features, profile, dtype):
    mean, longest = features.mean_row_length, features.max_row_length
    spread = features.row_spread
    if profile.is_cpu:
        per_unit = features.nnz / max(1, profile.compute_units)
        share = profile.lanes(dtype) * longest / per_unit if per_unit else 0.0
        if share > CPU_SLICE_SHARE:
            return ("csr-scalar", f"CPU: the longest row ({longest}) would make one sell "
                                  "slice a large share of a thread's work")
        return ("sell", "CPU: slices of SIMD-width rows walked by one vectorised work-item")
    if features.diagonals >= 0 and features.diagonals <= DIA_MAX_DIAGONALS \
            and features.diagonal_fill <= DIA_MAX_FILL:
        return ("dia", f"{features.diagonals} diagonals, {features.diagonal_fill:.2f} slots "
                       "per non-zero: no column indices to read")
    if longest >= max(SKEWED_ROW_MIN, SKEWED_ROW_FACTOR * mean):
        return ("coo", f"skewed rows (longest {longest}, mean {mean:.1f}): chunks of "
                       "non-zeros balance the work")
    if mean >= LONG_ROWS:
        return ("csr-vector", f"mean row length {mean:.1f} fills a group of work-items per row")
    if spread >= VERY_UNEVEN_ROWS:
        return ("csr-vector", f"very uneven rows (std/mean {spread:.1f}): a group of "
                              "work-items per row")
    return ("sell", f"rows of mean {mean:.1f} (std/mean {spread:.1f}): slices of "
                    "warp-width rows, sorted by length where that saves padding")
