"""Parameter variants per format, for the sweeps that run every format at once (the
Oclgrind pass, tests/oclgrind_driver.py).

``VARIANTS[name]`` lists parameter dicts mirroring what ``tests/test_format_<name>.py``
sweeps (each swept value at least once, not the full cross product).  The optional key
``PROFILE`` ("_profile") holds ``Device.override`` fields to apply first (ELLR-T's T
needs a SIMD width >= T, for instance).  ``PROFILES`` are run for every format with its
default parameters: the native profile, GPU-shaped ones (warp 32, wavefront 64) and a
CPU-shaped one.  A format missing from ``VARIANTS`` (registered later) gets its
defaults plus the ``PROFILES``: add its row here when its own sweep exists.  An entry
with ``QUICK`` ("_quick") set also runs in the quick Oclgrind pass (the default test
run's), for kernels no format's defaults use (csr-vector's merge mapping).  An entry
with ``POSITIONS64`` ("_positions64") set is built with csr-vector's merge positions in
64 bits (forced as tests/test_csr_vector_merge.py's test_64_bit_positions does: the
driver makes ``fits_int32`` say no while it builds the operator).

``LANE_VARIANTS`` holds the lanes block kernels' own parameters (formats/lanes.py), run
with block products by the driver; ``QUICK`` marks those of the default run.
"""

NO_LIMIT = float("inf")
PROFILE = "_profile"
QUICK = "_quick"
POSITIONS64 = "_positions64"
GPU32 = {"simd_width": 32, "device_type": "gpu"}
GPU64 = {"simd_width": 64, "device_type": "gpu"}
CPU8 = {"device_type": "cpu", "simd_width": 8, "vector_lanes_float32": 8,
        "vector_lanes_float64": 4}

PROFILES = {"gpu32": GPU32, "gpu64": GPU64, "cpu8": CPU8}

DIA_ANY = {"max_fill": NO_LIMIT, "max_diagonals": 10**9}

VARIANTS = {
    "csr-scalar": [{"work_group_size": 1}, {"work_group_size": 96}],
    "csr-vector": [
        {"vector_size": 2, "work_group_size": 2, "reduction": "tree"},
        {"vector_size": 4, "work_group_size": 128, "reduction": "tree"},
        {"vector_size": 8, "work_group_size": 24, "reduction": "serial"},
        {"vector_size": 16, "work_group_size": 64, "reduction": "serial"},
        {"vector_size": 32, "work_group_size": 1024, "reduction": "tree"},
        {"vector_size": 64, "work_group_size": 64, "reduction": "serial"},
        {"mapping": "adaptive", "work_group_size": 4, "items_per_thread": 2, "reduction": "tree"},
        {"mapping": "adaptive", "work_group_size": 16, "items_per_thread": 3,
         "reduction": "serial"},
        {"mapping": "adaptive", "work_group_size": 128, "items_per_thread": 8,
         "reduction": "tree"},
        # 16-bit columns, converted on the device (Oclgrind counts as a GPU, so the
        # defaults' pass, quick included, already runs them in groups of 128).
        {"mapping": "adaptive", "work_group_size": 16, "items_per_thread": 3,
         "col_bits": 16},
        {"mapping": "adaptive", "work_group_size": 8, "items_per_thread": 2,
         "col_bits": 16, "index_bits": 64},
        # The tuner's other adaptive shapes on GPUs (csr_vector.py's candidates): groups
        # of 256 with 4 entries a work-item, and float32's half window (4 of its 8).
        {"mapping": "adaptive", "work_group_size": 256, "items_per_thread": 4},
        {"mapping": "adaptive", "items_per_thread": 4},
        # tests/test_csr_vector_merge.py's GEOMETRIES: small groups make the corpus's
        # rows cross work-items and groups (the carries' scan and the fix-up kernel).
        {"mapping": "merge", "work_group_size": 4, "items_per_thread": 3, "reduction": "tree",
         QUICK: True},
        {"mapping": "merge", "work_group_size": 8, "items_per_thread": 2,
         "reduction": "serial", QUICK: True},
        {"mapping": "merge", "work_group_size": 128, "items_per_thread": 8,
         "reduction": "tree"},
        {"mapping": "merge", "work_group_size": 1, "items_per_thread": 5,
         "reduction": "serial", "index_bits": 64},
        # The CPU default shape (MERGE_DEFAULT_CPU), and merge positions in 64 bits
        # (pos_t long, chosen where m + nnz passes 32 bits) with 32- and 64-bit indices.
        {"mapping": "merge", "work_group_size": 64, "items_per_thread": 32,
         "reduction": "tree"},
        {"mapping": "merge", "work_group_size": 8, "items_per_thread": 4,
         "reduction": "tree", POSITIONS64: True, QUICK: True},
        {"mapping": "merge", "work_group_size": 4, "items_per_thread": 3,
         "reduction": "serial", "index_bits": 64, POSITIONS64: True},
    ],
    "coo": [  # tests/test_format_coo.py GEOMETRIES
        {"work_group_size": wg, "items_per_thread": t, "layout": layout, "scan": scan}
        for wg, t, layout, scan in [(4, 8, "contiguous", "serial"), (8, 3, "interleaved", "tree"),
                                    (5, 7, "interleaved", "serial"),
                                    (24, 2, "contiguous", "tree"),
                                    (1, 16, "contiguous", "serial"),
                                    (32, 1, "interleaved", "tree")]
    ],
    "dia": [{**DIA_ANY, "work_group_size": 1}, {**DIA_ANY, "work_group_size": 96},
            {**DIA_ANY, "index_bits": 64, PROFILE: {"simd_width": 32}}],
    "ell": [{"work_group_size": 1, "max_padding": NO_LIMIT},
            {"work_group_size": 96, "max_padding": NO_LIMIT, "index_bits": 64},
            {"max_padding": NO_LIMIT, PROFILE: {"simd_width": 32}}],
    "ellr-t": [
        {"T": 1, "work_group_size": 1, "max_padding": NO_LIMIT},
        {"T": 2, "work_group_size": 6, "max_padding": NO_LIMIT, PROFILE: GPU32},
        {"T": 4, "max_padding": NO_LIMIT, PROFILE: GPU32},
        {"T": 8, "work_group_size": 256, "max_padding": NO_LIMIT, PROFILE: GPU32},
        {"T": 32, "max_padding": NO_LIMIT, PROFILE: GPU32},
        {"T": 64, "work_group_size": 64, "max_padding": NO_LIMIT, PROFILE: GPU64},
    ],
    "sell": [
        {"slice_height": 1, "sigma": 1, "mapping": "slices", "work_group_size": 16},
        {"slice_height": 2, "sigma": 1, "mapping": "rows", "threads_per_row": 64,
         "work_group_size": 128},
        {"slice_height": 4, "sigma": 4, "mapping": "rows", "work_group_size": 16},
        {"slice_height": 4, "sigma": 32, "mapping": "rows", "threads_per_row": 8,
         "work_group_size": 64},
        {"slice_height": 8, "sigma": 64, "mapping": "slices", "work_group_size": 16},
        {"slice_height": 16, "sigma": 16, "mapping": "rows", "threads_per_row": 2,
         "work_group_size": 32},
        {"slice_height": 32, "sigma": "all", "mapping": "slices", "work_group_size": 16},
        {"slice_height": 8, "sigma": 8, "mapping": "slices", "col_bits": 16,
         "work_group_size": 16},
        {"slice_height": 4, "sigma": 32, "mapping": "rows", "threads_per_row": 2,
         "col_bits": 16, "work_group_size": 16, PROFILE: GPU32},
        {"slice_height": 64, "sigma": "all", "mapping": "rows", "work_group_size": 64},
    ],
    "hyb": [{"ell_width": 0},
            {"ell_width": 3, "layout": "contiguous", "scan": "serial",
             "coo_work_group_size": 8, "items_per_thread": 2},
            {"ell_width": 2, "layout": "interleaved", "scan": "tree",
             "coo_work_group_size": 32, "items_per_thread": 1},
            {"ell_width": 10**6, "coo_work_group_size": 1}],
    "cmrs": [
        {"height": 1, "group_width": 1, "reduction": "serial", "work_group_size": 16},
        {"height": 3, "group_width": 4, "reduction": "tree", "work_group_size": 16},
        {"height": 8, "group_width": 8, "reduction": "serial", "work_group_size": 8},
        {"height": 16, "group_width": 32, "reduction": "tree", "work_group_size": 32},
        {"height": 5, "group_width": 2, "reduction": "tree", "work_group_size": 4,
         "sort_columns": True, "row_in_strip": "separate"},
        {"height": 4, "group_width": 16, "reduction": "serial", "work_group_size": 32,
         "sort_columns": False, "row_in_strip": "packed"},
    ],
    # tests/test_format_csr5.py's GEOMETRIES (omega, sigma, work-group size, segmented sum).
    "csr5": [{"omega": o, "sigma": s, "work_group_size": wg, "segmented_sum": ss}
             for o, s, wg, ss in [(1, 1, 4, "serial"), (1, 7, 1, "scan"), (4, 3, 8, "scan"),
                                  (8, 16, 64, "serial"), (16, 33, 32, "scan"),
                                  (32, 5, 32, "serial"), (64, 2, 128, "scan"),
                                  (4, 70, 16, "serial")]]
    # tests/test_format_csr5.py's test_run_sums: the run-sums pass for long rows.
    + [{"omega": 1, "sigma": 1, "work_group_size": 4, "segmented_sum": "scan",
        "run_group": g} for g in (2, 8)],
    # tests/test_format_bccoo.py's GRID.
    "bccoo": [
        {"strategy": 1, "tile_size": 5, "work_group_size": 4, "flag_bits": 8, "scan": "serial"},
        {"strategy": 2, "tile_size": 7, "work_group_size": 8, "flag_bits": 8, "transpose": True,
         "col_compress": True, "scan": "tree"},
        {"strategy": 2, "tile_size": 3, "work_group_size": 5, "flag_bits": 16, "slices": 2,
         "result_cache": 2, "scan": "tree"},
        {"strategy": 1, "tile_size": 16, "work_group_size": 8, "flag_bits": 16,
         "transpose": True, "slices": 5, "block_height": 2, "block_width": 2},
        {"strategy": 2, "tile_size": 33, "work_group_size": 3, "flag_bits": 32,
         "result_cache": 4, "scan": "serial", "block_height": 3, "block_width": 4,
         "col_compress": True},
        {"strategy": 1, "tile_size": 1, "work_group_size": 1, "flag_bits": 8, "slices": 32,
         "transpose": True, "col_compress": True},
        {"strategy": 1, "tile_size": 40, "work_group_size": 16, "flag_bits": 32,
         "block_height": 4, "block_width": 1, "scan": "tree", "col_compress": True,
         "transpose": True},
        {"strategy": 2, "tile_size": 8, "work_group_size": 32, "flag_bits": 8,
         "block_height": 1, "block_width": 2, "slices": 3, "transpose": True, "scan": "tree"},
    ],
}

# Complex64 variants of the single-vector kernels for the Oclgrind complex pass (which
# runs every complex format's defaults anyway): kernels no default picks.
COMPLEX_VARIANTS = {
    "csr-vector": [{"mapping": "merge", "work_group_size": 4, "items_per_thread": 3,
                    "reduction": "tree"},
                   {"mapping": "merge", "work_group_size": 8, "items_per_thread": 2,
                    "reduction": "serial"}],
}

# Complex64 block-kernel variants for the Oclgrind complex pass: the items kernels (one
# per format, both of sell's mappings and both of csr-vector's reductions; ell's and
# sell's under a CPU profile, since Oclgrind counts as a GPU and complex ell/sell take
# their lanes kernels there) and the lanes kernels (formats/lanes.py).
_CPU = {"device_type": "cpu"}
COMPLEX_BLOCK_VARIANTS = {
    "csr-scalar": [{"work_group_size": 16, "block_mapping": "items"},
                   {"block_mapping": "lanes"}],
    "csr-vector": [{"mapping": "rows", "vector_size": 4, "work_group_size": 16,
                    "reduction": "tree", "block_mapping": "items"},
                   {"mapping": "rows", "vector_size": 2, "work_group_size": 8,
                    "reduction": "serial", "block_mapping": "items"},
                   {"mapping": "adaptive", "block_mapping": "lanes"},
                   {"mapping": "adaptive", "block_mapping": "lanes", "col_bits": 16},
                   {"mapping": "merge", "block_mapping": "lanes"}],
    "ell": [{"max_padding": NO_LIMIT, "work_group_size": 16, PROFILE: _CPU},
            {"max_padding": NO_LIMIT}],
    "sell": [{"slice_height": 4, "sigma": 8, "mapping": "slices", "work_group_size": 8,
              PROFILE: _CPU},
             {"slice_height": 2, "sigma": 1, "mapping": "rows", "threads_per_row": 4,
              "work_group_size": 16, PROFILE: _CPU},
             {"slice_height": 4, "sigma": 8},
             {"slice_height": 4, "sigma": 8, "col_bits": 16}],
}

# The lanes block kernels' own parameters (formats/lanes.py), each with block products
# (k = 3: blocks of 2 and 1; k = 35: 32, 2, 1): the CSR formats' row split among groups
# of lanes (local memory), rows taken longest first in windows (row_order), both, and
# eight columns a work-item (at k = 32); sell's eight columns.  block_mapping="lanes" is
# given: Oclgrind counts as a GPU, where it is the CSR formats' default anyway, but the
# driver once ran these only where it was not (CPUs), so never under Oclgrind.
_LANES = {"block_mapping": "lanes"}
_CSR_LANE_VARIANTS = [{**_LANES, "lane_split": 4, "lane_columns": 2, QUICK: True},
                      {**_LANES, "lane_order": 8, "lane_columns": 8, QUICK: True},
                      {**_LANES, "lane_order": 8, "lane_split": 2},
                      {**_LANES, "lane_columns": 8}]
LANE_VARIANTS = {
    "csr-scalar": _CSR_LANE_VARIANTS,
    "csr-vector": _CSR_LANE_VARIANTS,
    "sell": [{"lane_columns": 8, QUICK: True}],
}

# Reduced-precision value storage (value_bits, formats/storage.py): run in the quick
# pass too, in each dtype (value_bits=32 in float64 only: it is float32's default), with
# block products; the driver compares them with the matrix rounded as stored.  The
# GPU-shaped entries convert on the device (sell's host input goes up as CSR there).
VALUE_BITS_VARIANTS = {
    "csr-scalar": [{"value_bits": 16, "work_group_size": 16},
                   {"value_bits": 32, "block_mapping": "lanes", PROFILE: GPU32}],
    "csr-vector": [{"value_bits": 16, "vector_size": 4, "work_group_size": 16,
                    "reduction": "tree", "block_mapping": "items"},
                   {"value_bits": 16, "mapping": "adaptive", "work_group_size": 16,
                    "items_per_thread": 3, "reduction": "serial", PROFILE: GPU32},
                   {"value_bits": 16, "mapping": "merge", "work_group_size": 16,
                    "items_per_thread": 4, "reduction": "tree"}],
    "sell": [{"value_bits": 16, "slice_height": 4, "sigma": 8, "mapping": "slices",
              "work_group_size": 16},
             {"value_bits": 16, "slice_height": 4, "sigma": 32, "mapping": "rows",
              "threads_per_row": 2, "col_bits": 16, "work_group_size": 16, PROFILE: GPU32},
             {"value_bits": 32, "slice_height": 8, "sigma": 1, "mapping": "rows",
              "work_group_size": 16, PROFILE: GPU32}],
}


# csr-vector's escaped 16-bit columns (the driver's wide_columns: 40 x 70,001, its row
# blocks narrow and too wide in turn, with small groups); "auto" keeps 16 bits there
# (few entries escape).  The first alone, in float32, is the default run's; the last
# two add half values (value_bits=16: the escape with half loads) and the lanes
# kernel's row split (lane_split=4: the wide loop in each group of a row's lanes).
WIDE_COLUMN_VARIANTS = [
    {"mapping": "adaptive", "work_group_size": 4, "items_per_thread": 2, "col_bits": 16},
    {"mapping": "adaptive", "work_group_size": 8, "items_per_thread": 3, "col_bits": "auto"},
    {"mapping": "adaptive", "work_group_size": 4, "items_per_thread": 3, "col_bits": 16,
     "index_bits": 64},
    {"mapping": "adaptive", "work_group_size": 4, "items_per_thread": 2, "col_bits": 16,
     "value_bits": 16},
    {"mapping": "adaptive", "work_group_size": 8, "items_per_thread": 3, "col_bits": 16,
     "block_mapping": "lanes", "lane_split": 4},
]


def variants(name):
    """``(label, device_override, params, all_dtypes, quick)`` for every variant of
    format ``name``: its defaults, its own sweep, then its defaults under each of
    ``PROFILES``, then its ``VALUE_BITS_VARIANTS`` (labels ``bits<i>``, run in the
    quick pass too).  ``all_dtypes`` is False for the sweep's entries: the Oclgrind pass
    runs them in float32 only (the kernels differ from float64 only in the type), the
    defaults and profiles in both.  ``quick``: a sweep entry marked ``QUICK``, or a
    value_bits entry."""
    out = [("default", {}, {}, True, False)]
    for i, entry in enumerate(VARIANTS.get(name, [])):
        # (POSITIONS64 stays in params: the driver takes it out)
        params = {k: v for k, v in entry.items() if k not in (PROFILE, QUICK)}
        if params or entry.get(PROFILE):
            out.append((f"v{i}", dict(entry.get(PROFILE, {})), params, False,
                        bool(entry.get(QUICK))))
    for label, override in PROFILES.items():
        out.append((label, dict(override), {}, True, False))
    for i, entry in enumerate(VALUE_BITS_VARIANTS.get(name, [])):
        params = {k: v for k, v in entry.items() if k != PROFILE}
        out.append((f"bits{i}", dict(entry.get(PROFILE, {})), params, True, True))
    return out
