"""The format choice for ``format="auto"`` until the measuring tuner lands: a rule
over row-length statistics and the device type.

Measured on an H100 through NVIDIA's OpenCL (BENCHMARKS.md): one work-item per row
(csr-scalar) wins on regular rows, even 20 long, because neighbouring rows share cache
lines of x; a group per row (csr-vector) wins once rows are long (mean >= 32) or very
uneven (coefficient of variation >= 1.5), where one slow row would stall a warp.  On
CPUs (PoCL) csr-scalar streams rows without the barrier costs of csr-vector.
"""

LONG_ROWS = 32.0
UNEVEN_ROWS = 1.5


def choose_format(features, profile, dtype):
    """Return (format name, explanation)."""
    mean = features.mean_row_length
    spread = features.std_row_length / mean if mean > 0 else 0.0
    if profile.is_cpu:
        return ("csr-scalar",
                "CPU device: one work-item streaming each row avoids barrier costs")
    if mean >= LONG_ROWS:
        return ("csr-vector", f"mean row length {mean:.1f} fills a group of work-items per row")
    if spread >= UNEVEN_ROWS and mean >= 2:
        return ("csr-vector", f"uneven rows (std/mean {spread:.1f}): a group per row keeps "
                              "long rows from stalling their neighbours")
    return ("csr-scalar", f"regular rows (mean {mean:.1f}, std/mean {spread:.1f}): one "
                          "work-item per row")
