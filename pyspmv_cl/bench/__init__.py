"""Benchmark tooling on top of the library, behind ``pyspmv-cl bench``: the runner
(:mod:`.runner`), the peer implementations timed alike (:mod:`.peers`) and the test and
benchmark matrices (:mod:`.generators`).  The runtime core never imports it.

The runner's functions are re-exported here (``bench.run``, ``bench.format_table``...).
"""

from .runner import (
    ProgressBar,
    bench_matrix,
    column_notes,
    copy_bandwidth,
    environment,
    format_report,
    format_table,
    min_bytes,
    plot_roofline,
    relative_error,
    run,
    stderr_progress,
    summary_lines,
)

__all__ = ["ProgressBar", "bench_matrix", "column_notes", "copy_bandwidth", "environment",
           "format_report", "format_table", "min_bytes", "plot_roofline", "relative_error",
           "run", "stderr_progress", "summary_lines"]
