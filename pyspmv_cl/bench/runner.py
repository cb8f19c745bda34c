"""Benchmark runner behind ``pyspmv-cl bench``.

Metrics: GFLOP/s = 2*nnz / t; effective GB/s = minimum bytes (CSR with
32-bit indices + x read once + y written once) / t, also as a percentage of the
device's copy bandwidth measured with our own copy kernel (the roofline).  Kernel
times are medians of device-side profiling events after warm-up; ``call ms`` is the
wall time of a whole host-to-host ``op @ x``.  Peers run in the same process on the
same matrix and report wall time (or CUDA-event time on a GPU).
"""

import math
import os
import platform
import shutil
import statistics
import sys
import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy
import scipy.sparse as sp

from .. import codegen
from .._version import __version__
from ..cache import get_program
from ..formats.base import format_bytes
from ..inputs import needs_fp64
from ..kernel_objects import kernel_object
from ..launching import launch_kernel, launches_seconds
from ..matrix import SpMV
from .generators import from_spec
from .peers import available_peers, cuda_sampler


def min_bytes(csr, dtype):
    """Bytes SpMV must move at least: CSR (values + 32-bit col indices + row pointer),
    x read once, y written once."""
    item = np.dtype(dtype).itemsize
    m, n = csr.shape
    return csr.nnz * (item + 4) + (m + 1) * 4 + n * item + m * item


def _median_seconds(run_once, queue, warmup, repeats, min_time):
    """Median of ``run_once()`` (which enqueues work and returns its device seconds)
    after ``warmup`` calls, over at least ``repeats`` samples and ``min_time``."""
    for _ in range(warmup):
        run_once()
    queue.finish()
    samples = []
    start = time.perf_counter()
    while len(samples) < repeats or time.perf_counter() - start < min_time:
        samples.append(run_once())
        if time.perf_counter() - start > 30 * max(min_time, 0.1):
            break
    return statistics.median(samples)


def copy_bandwidth(device, nbytes=None, repeats=20, min_time=0.2):
    """GB/s of a device-side copy (read + write counted) with our own kernel."""
    profile = device.profile
    if nbytes is None:
        nbytes = min(256 << 20, profile.max_alloc_size // 2, profile.global_mem_size // 8)
    n_vec = max(1, nbytes // 16)
    program = get_program(device.context, device.cl_device, codegen.helper("copy.cl"))
    kernel = kernel_object(program, "copy_float4")
    queue = device.profiling_queue
    src = cl.Buffer(device.context, cl.mem_flags.READ_ONLY, n_vec * 16)
    dst = cl.Buffer(device.context, cl.mem_flags.WRITE_ONLY, n_vec * 16)
    cl.enqueue_fill_buffer(queue, src, np.float32(1), 0, n_vec * 16)
    kernel.set_args(src, dst, np.int64(n_vec))
    wg = min(256, profile.max_work_group_size)
    groups = -(-n_vec // wg)
    seconds = _median_seconds(
        lambda: launches_seconds(lambda: launch_kernel(queue, kernel, groups * wg, wg)),
        queue, 3, repeats, min_time)
    return 2 * n_vec * 16 / seconds / 1e9


def relative_error(y, y_ref, A64, x64):
    """max |y - y_ref| / max(|A| @ |x|): rounding error relative to the magnitudes
    summed (0 for exact results, ~1e-7 for float32 sums); complex results against a
    complex128 reference."""
    scale = float(np.max(abs(A64) @ np.abs(x64))) if A64.nnz else 0.0
    wide = np.complex128 if np.iscomplexobj(y) or np.iscomplexobj(y_ref) else np.float64
    diff = np.abs(np.asarray(y).astype(wide, copy=False) - y_ref)
    if not diff.size:
        return 0.0
    return float(np.max(diff) / scale) if scale > 0 else float(np.max(diff))


def flops_per_product(nnz, dtype) -> float:
    """Real operations of one product: a multiply-add per non-zero, 8 for complex."""
    return (8.0 if np.dtype(dtype).kind == "c" else 2.0) * nnz


def _record(name, csr, dtype, impl, seconds, copy_gbps, rel_err, **extra):
    flops = flops_per_product(csr.nnz, dtype)
    gbps = min_bytes(csr, dtype) / seconds / 1e9
    row = {"matrix": name, "rows": csr.shape[0], "cols": csr.shape[1], "nnz": int(csr.nnz),
           "dtype": np.dtype(dtype).name, "impl": impl, "seconds": seconds,
           "min_bytes": min_bytes(csr, dtype),
           "gflops": flops / seconds / 1e9, "gbps": gbps,
           "pct_copy_bw": 100.0 * gbps / copy_gbps if copy_gbps else None,
           "rel_err": rel_err}
    row.update(extra)
    return row


def bench_matrix(name, A, device, formats, dtypes, peers, *, repeats=30, min_time=0.3,
                 copy_gbps=None, progress=None, rounds=5):
    """Results (list of dicts) for one matrix: each format and each peer, each dtype.

    Every implementation of one dtype is prepared first, then timed in ``rounds``
    interleaved rounds (a slice of the samples each, in turn), so that a change of
    machine load during the run affects all of them alike instead of favouring
    whichever ran in a quiet moment."""
    csr = sp.csr_matrix(A)
    A64 = csr.astype(np.complex128 if csr.dtype.kind == "c" else np.float64)
    rng = np.random.default_rng(12345)
    real_x = rng.uniform(-1.0, 1.0, csr.shape[1])
    complex_x = real_x + 1j * rng.uniform(-1.0, 1.0, csr.shape[1])
    references = {}   # x's kind -> A64 @ x
    results = []

    def failed(dtype, impl, exc):
        results.append({"matrix": name, "dtype": dtype.name, "impl": impl,
                        "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})

    for dtype in dict.fromkeys(in_kind_of(d, csr.dtype) for d in dtypes):
        if needs_fp64(dtype) and not device.profile.fp64:
            continue
        x64 = complex_x if dtype.kind == "c" else real_x
        if dtype.kind not in references:
            references[dtype.kind] = A64 @ x64
        y_ref = references[dtype.kind]
        x_host = x64.astype(dtype)
        timed = []   # (impl, sample() -> seconds, finish(seconds) -> record or None)
        for fmt in formats:
            if progress:
                progress(f"{name} {dtype.name} {fmt}")
            try:
                op = SpMV(csr, format=fmt, dtype=dtype, device=device)
                # 'auto' is timed as tuned: an online tuning is finished first.
                op.finish_tuning()
            except Exception as exc:  # a format refusing a matrix is a result, not a crash
                failed(dtype, fmt, exc)
                continue
            timed.append((fmt, *_operator_timer(op, x_host, name, csr, dtype, fmt, copy_gbps,
                                                (y_ref, A64, x64))))
        for peer in peers:
            if progress:
                progress(f"{name} {dtype.name} {peer.name}")
            # Peers are sampled in the same rounds as the formats, so that a GPU's clock
            # or a CPU's load affects them alike.
            try:
                f = peer.prepare(csr, dtype)
                xh = np.ascontiguousarray(x64, dtype=dtype)
                if peer.device == "cuda":   # CUDA-event times
                    sample, y = cuda_sampler(f, xh)
                else:
                    sample, y = _wall_sample(f, xh), np.asarray(f(xh))
            except Exception as exc:
                failed(dtype, peer.name, exc)
                continue
            timed.append((peer.name, sample, _peer_finish(
                name, csr, dtype, peer.name, copy_gbps, relative_error(y, y_ref, A64, x64))))
        samples = _interleaved(timed, repeats, min_time, rounds)
        for (impl, _, finish), got in zip(timed, samples):
            try:
                results.append(finish(statistics.median(got)))
            except Exception as exc:
                failed(dtype, impl, exc)
    return results


def in_kind_of(dtype, matrix_dtype):
    """The type a matrix is timed in for a requested ``dtype``: a complex matrix in the
    complex type of the same precision (float32 -> complex64), since a real one would
    drop its imaginary parts."""
    dtype = np.dtype(dtype)
    if np.dtype(matrix_dtype).kind == "c" and dtype.kind == "f":
        return np.result_type(dtype, np.complex64)
    return dtype


def _interleaved(timed, repeats, min_time, rounds):
    """Samples of each ``sample()`` in ``timed``: three warm-up calls each, then
    ``rounds`` rounds, each taking ``repeats / rounds`` samples (and ``min_time /
    rounds`` seconds at least) of every implementation in turn."""
    for _, sample, _ in timed:
        for _ in range(3):
            sample()
    per_round = max(1, -(-repeats // rounds))
    slice_time = min_time / rounds
    samples = [[] for _ in timed]
    for _ in range(rounds):
        for k, (_, sample, _) in enumerate(timed):
            start = time.perf_counter()
            taken = 0
            while taken < per_round or (time.perf_counter() - start < slice_time
                                        and taken < 50 * per_round):
                samples[k].append(sample())
                taken += 1
    return samples


def _wall_sample(f, x):
    def sample():
        t = time.perf_counter()
        f(x)
        return time.perf_counter() - t
    return sample


def _peer_finish(name, csr, dtype, impl, copy_gbps, rel_err):
    def finish(seconds):
        return _record(name, csr, dtype, impl, seconds, copy_gbps, rel_err, kind="peer")
    return finish


def kernel_seconds(op, x_dev, y_dev):
    """Device seconds of one product ``y_dev = op @ x_dev`` on the operator's current
    format, all its kernels, from their profiling events on the device's profiling
    queue: the operator's own queue has none, and its calls stay as a user's.  The
    caller makes sure ``x_dev`` is written (that queue is another one)."""
    impl = op._impl
    queue = op.device.profiling_queue
    return launches_seconds(lambda: impl.enqueue(queue, x_dev.data, y_dev.data, 1.0, 0.0))


def _operator_timer(op, x_host, name, csr, dtype, fmt, copy_gbps, reference):
    """(sample, finish) for one operator: ``sample()`` is the device seconds of one
    product on device-resident vectors, all its kernels included, from their profiling
    events on the device's profiling queue (the operator's own queue has no profiling:
    its calls, which ``finish`` times, stay as a user's); ``finish(seconds)`` adds the
    wall time of whole host-to-host calls and the error, and makes the row."""
    x_dev = cla.to_device(op.queue, x_host)
    y_dev = cla.empty(op.queue, op.shape[0], op.dtype)
    op.queue.finish()   # x_dev is written before the timing queue reads it

    def sample():
        return kernel_seconds(op, x_dev, y_dev)

    def finish(seconds):
        wall = statistics.median(wall_times(lambda: op @ x_host, 5, min_time=0.05))
        y = op @ x_host
        extra = {}
        if op.tuning is not None:
            extra = {"explanation": op.explanation, "tuning_source": op.tuning.source,
                     "tuning_seconds": op.tuning.tuning_seconds}
        return _record(
            name, csr, dtype, fmt, seconds, copy_gbps, relative_error(y, *reference),
            kind="pyspmv_cl", format=op.format, params=op.params, nbytes=op.nbytes,
            call_seconds=wall, conversion_seconds=op.conversion_time,
            conversion_spmvs=op.conversion_time / seconds if seconds else None, **extra)
    return sample, finish


def wall_times(fn, count, min_time=0.0, max_count=200):
    """Wall seconds of ``fn()`` after one warm-up: ``count`` samples at least, more
    until ``min_time`` has passed (short calls are noisy)."""
    fn()
    out = []
    start = time.perf_counter()
    while len(out) < count or (time.perf_counter() - start < min_time
                               and len(out) < max_count):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def run(specs, device, formats, dtypes, peer_names=None, *, repeats=30, min_time=0.3,
        progress=None, checkpoint=None):
    """Benchmark every spec; returns (environment dict, results list).  ``checkpoint``
    (optional) is called with (environment, results so far) after each matrix."""
    detected = available_peers(peer_names)  # imports and test-runs each library: once
    peers = [p for p in detected if p.available]
    skipped = {p.name: p.reason for p in detected if not p.available}
    if device.profile.device_type != "gpu":
        peers = [p for p in peers if p.device != "cuda"]
    if progress is not None and hasattr(progress, "total"):
        per_dtype = sum(1 for d in dtypes if not needs_fp64(d) or device.profile.fp64)
        progress.total = 1 + len(specs) * (1 + per_dtype * (len(formats) + len(peers)))
    if progress:
        progress("measuring copy bandwidth")
    copy_gbps = copy_bandwidth(device)
    env = environment(device, copy_gbps, [p.name for p in peers], skipped)
    results = []
    seen = set()   # the matrices' labels so far
    for spec in specs:
        if progress:
            progress(f"building {spec}")
        name, A = from_spec(spec)
        if name in seen:   # two files of one name: the spec as given tells them apart
            name = spec if spec not in seen else f"{spec} #{len(seen) + 1}"
        seen.add(name)
        if not A.nnz or 0 in A.shape:   # nothing to time (and no rate to average)
            results.append({"matrix": name, "impl": "-",
                            "error": f"{A.shape[0]}x{A.shape[1]} with {A.nnz} non-zeros "
                                     "skipped: nothing to time"})
            continue
        results += bench_matrix(name, A, device, formats, dtypes, peers, repeats=repeats,
                                min_time=min_time, copy_gbps=copy_gbps, progress=progress)
        if checkpoint:
            checkpoint(env, results)
    return env, results


def environment(device, copy_gbps, peers, skipped):
    p = device.profile
    return {
        "pyspmv_cl": __version__, "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": os.cpu_count(),
        "device": p.name, "platform": f"{p.platform_name} {p.platform_version}",
        "driver": p.driver_version, "device_type": p.device_type,
        "compute_units": p.compute_units, "pyopencl": cl.VERSION_TEXT,
        "numpy": np.__version__, "scipy": scipy.__version__,
        "copy_gbps": copy_gbps, "peers": peers, "peers_unavailable": skipped,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


#: Width of the terminal report unless verbose.
REPORT_WIDTH = 120

#: One line under the terminal table (and the markdown one): what GB/s and % copy mean.
LEGEND = ("GB/s: CSR-equivalent bytes / time; % copy: GB/s / copy bandwidth, >100% when caches "
          "hold data or the format stores less")

#: Notes on every column: ``bench -v`` prints them under the table, ``bench --help`` too.
COLUMN_NOTES = (
    ("GFLOP/s", "2 * nnz / time (8 * nnz for complex values), the time being 'kernel ms'."),
    ("GB/s", "the bytes a CSR product must move at least (values, 32-bit column indices and "
             "row pointers, x read once, y written once) / time: one count for every "
             "implementation, whatever its format stores."),
    ("% copy", "GB/s as a percentage of the device's copy bandwidth, measured first with "
               "our copy kernel on a buffer of up to 256 MiB (reads and writes counted). Over "
               "100% is possible and no error: a matrix and vectors that fit in a cache stay "
               "there between the timed runs, a format may store fewer bytes than CSR (dia: "
               "no column indices), and a device may read faster than it copies."),
    ("kernel ms", "median device time of one product, all its kernels, vectors on the device "
                  "(profiling events); peers: wall time of a call, or CUDA-event time on a "
                  "GPU."),
    ("call ms", "median wall time of a whole host-to-host op @ x."),
    ("conv", "the conversion from CSR to the format, in units of one product's kernel time."),
    ("rel err", "max |y - y_ref| / max(|A| @ |x|) against scipy in float64 (complex128 "
                "for complex values)."),
    ("nbytes", "the format's device memory."),
    ("params", "the format's parameters; for auto, the format chosen and where the decision "
               "came from (model, measured, database). Cut to fit 120 columns unless -v."),
)


def column_notes(width=88, indent=13):
    """The notes of :data:`COLUMN_NOTES` as lines, wrapped to ``width``."""
    import textwrap
    lines = []
    for name, text in COLUMN_NOTES:
        lines += textwrap.wrap(text, width, initial_indent=f"  {name:<{indent - 2}}",
                               subsequent_indent=" " * indent)
    return lines


def clip(text, width):
    """``text`` cut to ``width`` characters, ending in '...' when cut (None: unchanged)."""
    if width is None or len(text) <= width:
        return text
    return text[:max(0, width - 3)] + "..."


def clip_left(text, width):
    """``text`` cut to ``width`` characters at its start, beginning with '...' when cut
    (what ends it, such as a format after a long matrix name, stays)."""
    if width is None or len(text) <= width:
        return text
    return "..." + text[len(text) - max(0, width - 3):]


def params_text(params, full=False):
    """Format parameters as ``key=value`` words: all with ``full``, else without
    ``index_bits`` and the unset (None) ones."""
    return " ".join(f"{k}={v}" for k, v in (params or {}).items()
                    if full or (k != "index_bits" and v is not None))


def _row_params(r, full):
    """The params cell of a result: for ``auto``, the format chosen and the decision's
    source first, so that cutting the text keeps them."""
    text = params_text(r.get("params"), full)
    if r["impl"] == "auto" and r.get("format"):
        source = f" ({r['tuning_source']})" if r.get("tuning_source") else ""
        return f"{r['format']}{source}: {text}" if text else f"{r['format']}{source}"
    return text


def _cells(r):
    """The numeric cells of a successful result, as strings ('' where not applicable)."""
    def opt(key, fmt):
        return format(r[key], fmt) if r.get(key) is not None else ""
    return [f"{r['gflops']:.2f}", f"{r['gbps']:.1f}", opt("pct_copy_bw", ".0f"),
            f"{r['seconds'] * 1e3:.3f}",
            f"{r['call_seconds'] * 1e3:.3f}" if r.get("call_seconds") is not None else "",
            opt("conversion_spmvs", ".0f"), f"{r['rel_err']:.1e}",
            format_bytes(r["nbytes"]) if r.get("nbytes") is not None else ""]


_NUMERIC = ["GFLOP/s", "GB/s", "% copy", "kernel ms", "call ms", "conv", "rel err", "nbytes"]


def format_table(env, results):
    """The results as a markdown document (full parameters; for files: the ``.md`` of
    ``benchmarks/run_suite.py``).  :func:`format_report` is the terminal's form."""
    lines = [
        f"device: {env['device']} ({env['platform']}), {env['compute_units']} compute units; "
        f"copy bandwidth {env['copy_gbps']:.1f} GB/s",
        "",
        "| matrix | rows | nnz | dtype | impl | " + " | ".join(_NUMERIC) + " | params |",
        "|---|---:|---:|---|---|" + "---:|" * len(_NUMERIC) + "---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['matrix']} | | | {r.get('dtype', '')} | {r['impl']} | "
                         f"refused: {r['error']} |" + " |" * len(_NUMERIC))
            continue
        lines.append(f"| {r['matrix']} | {r['rows']} | {r['nnz']} | {r['dtype']} | {r['impl']} | "
                     + " | ".join(_cells(r)) + f" | {_row_params(r, full=True)} |")
    lines += ["", LEGEND, "", *summary_lines(results)]
    if env.get("peers_unavailable"):
        lines.append("")
        for name, why in env["peers_unavailable"].items():
            lines.append(f"peer {name} unavailable: {why}")
    return "\n".join(lines)


def _aligned(rows, right):
    """Rows of cells as lines of columns two spaces apart (``right[i]``: right-align
    column i)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if ra else c.ljust(w)
                      for c, w, ra in zip(r, widths, right)).rstrip() for r in rows]


def format_report(env, results, verbose=False, width=REPORT_WIDTH):
    """The results for a terminal: per matrix and dtype a title line and a table of the
    implementations, columns aligned, then :data:`LEGEND` and the summary.  Every line
    fits in ``width`` columns (the parameters, long names and messages are cut);
    ``verbose`` cuts nothing and adds auto's explanations and :func:`column_notes`."""
    cut = []   # the texts cut, if any

    def fit(text, w=None if verbose else width):
        out = clip(text, w)
        if out != text:
            cut.append(text)
        return out

    lines = [fit(f"device: {env['device']}, {env['compute_units']} compute units, "
                 f"copy bandwidth {env['copy_gbps']:.1f} GB/s"),
             fit(f"platform: {env['platform']}")]
    header = ["impl", *_NUMERIC, "params"]
    right = [False, *[True] * len(_NUMERIC), False]
    # One set of column widths for every matrix, so that the tables line up; the
    # params column gets what is left of the width.
    fixed = [header[:-1]] + [[r["impl"], *_cells(r)] for r in results if "error" not in r]
    widths = [max(len(row[i]) for row in fixed) for i in range(len(header) - 1)]
    param_width = None if verbose else max(12, width - 2 - sum(w + 2 for w in widths))
    groups = {}
    for r in results:
        groups.setdefault((r["matrix"], r.get("dtype", "")), []).append(r)
    for (matrix, dtype), rows in groups.items():
        title = f"{matrix} {dtype}".strip()
        first = next((r for r in rows if "error" not in r), None)
        if first is not None:
            title += f": {first['rows']} x {first['cols']}, {first['nnz']} non-zeros"
        table = [header]
        for r in rows:
            if "error" in r:
                table.append([r["impl"], f"refused: {r['error']}"])
            else:
                table.append([r["impl"], *_cells(r), fit(_row_params(r, verbose), param_width)])
        lines += ["", fit(title)]
        for cells in table:   # the last cell (params, or a refusal) is not padded
            padded = [c.rjust(w) if ra else c.ljust(w)
                      for c, w, ra in zip(cells[:-1], widths, right)]
            lines.append(fit("  " + "  ".join([*padded, cells[-1]]).rstrip()))
        if verbose:
            lines += [f"  {r['impl']}: {r['explanation']}" for r in rows if r.get("explanation")]
    lines += ["", LEGEND]
    if verbose:
        lines += ["", "columns:", *column_notes()]
    table, ratios = _summary(results)
    if table:
        lines += ["", "geometric mean GFLOP/s of each implementation over the matrices it ran on:"]
        lines += ["  " + line for line in _aligned(
            [["dtype", "implementation", "GFLOP/s", "matrices"], *table],
            [False, False, True, True])]
    if ratios:
        lines += ["", *(fit(line) for line in ratios)]
    if env.get("peers_unavailable"):
        lines.append("")
        lines += [fit(f"peer {name} unavailable: {why}")
                  for name, why in env["peers_unavailable"].items()]
    if cut:
        lines += ["", f"(cut to {width} columns: -v shows everything, --json FILE saves it)"]
    return "\n".join(lines)


def summary_lines(results):
    """Geometric means per dtype over the matrices every implementation ran on:
    GFLOP/s of each implementation, and the speed of our best format per matrix
    relative to each peer (markdown table, then lines)."""
    table, ratios = _summary(results)
    lines = ["| dtype | implementation | geomean GFLOP/s | matrices |", "|---|---|---:|---:|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return lines + [""] + ratios


def _summary(results):
    """(rows of [dtype, implementation, geomean GFLOP/s, matrices], comparison lines)."""
    ok = [r for r in results if "error" not in r and r.get("seconds")]
    table = []
    ratios = []
    for dtype in sorted({r["dtype"] for r in ok}):
        rows = [r for r in ok if r["dtype"] == dtype]
        by_impl = {}
        for r in rows:
            by_impl.setdefault(r["impl"], {})[r["matrix"]] = r["seconds"]
        ours = sorted({r["impl"] for r in rows if r.get("kind") == "pyspmv_cl"})
        best = {}
        for impl in ours:
            for m, t in by_impl[impl].items():
                best[m] = min(best.get(m, math.inf), t)
        flops = {r["matrix"]: flops_per_product(r["nnz"], dtype) for r in rows}
        for impl, times in by_impl.items():
            g = math.exp(sum(math.log(flops[m] / t / 1e9) for m, t in times.items()) / len(times))
            table.append([dtype, impl, f"{g:.2f}", str(len(times))])
        for impl in sorted({r["impl"] for r in rows if r.get("kind") == "peer"}):
            common = [m for m in by_impl[impl] if m in best]
            if common:
                g = math.exp(sum(math.log(by_impl[impl][m] / best[m]) for m in common)
                             / len(common))
                ratios.append(f"{dtype}: the best pyspmv_cl format per matrix vs {impl}: "
                              f"{g:.2f}x the speed (geometric mean, {len(common)} matrices)")
        ratios += _auto_lines(dtype, by_impl, ours, rows)
    return table, ratios


def _auto_lines(dtype, by_impl, ours, rows):
    """How ``auto`` compares with the best single format per matrix and with each peer."""
    auto = by_impl.get("auto")
    singles = [i for i in ours if i != "auto"]
    if not auto or not singles:
        return []
    out = []
    best = {m: min(by_impl[i][m] for i in singles if m in by_impl[i]) for m in auto
            if any(m in by_impl[i] for i in singles)}
    if best:
        slow = {m: auto[m] / best[m] for m in best}
        worst = max(slow, key=slow.get)
        g = math.exp(sum(math.log(v) for v in slow.values()) / len(slow))
        out.append(f"{dtype}: auto's time / the best single format's: geometric mean {g:.2f}x, "
                   f"{sum(v > 1.1 for v in slow.values())} of {len(slow)} over 1.10x, "
                   f"worst {slow[worst]:.2f}x ({worst})")
    for impl in sorted({r["impl"] for r in rows if r.get("kind") == "peer"}):
        common = [m for m in by_impl[impl] if m in auto]
        if common:
            g = math.exp(sum(math.log(by_impl[impl][m] / auto[m]) for m in common)
                         / len(common))
            out.append(f"{dtype}: auto vs {impl}: {g:.2f}x the speed (geometric mean, "
                       f"{len(common)} matrices)")
    return out


class ProgressBar:
    """A progress bar on stderr (no dependency): redrawn in place on a terminal, one
    line per step otherwise (logs).  Call it with the step about to start; set
    ``total`` when known.  ``close()`` ends the line."""

    def __init__(self, total=None, stream=None, width=24):
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr   # (None: stderr closed; nothing shown)
        self.width = width
        self.start = time.perf_counter()
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self._last_len = 0

    def render(self, message):
        elapsed = time.perf_counter() - self.start
        if self.total:
            frac = min(1.0, self.done / self.total)
            filled = int(round(frac * self.width))
            bar = "#" * filled + "." * (self.width - filled)
            return (f"[{bar}] {int(self.done):>{len(str(self.total))}}/{self.total} "
                    f"{100 * frac:3.0f}% {elapsed:6.1f}s  {message}")
        return f"[{self.done}] {elapsed:6.1f}s  {message}"

    def __call__(self, message):
        """Show ``message`` as the step now starting, then count it."""
        self.show(message)
        self.done += 1

    def show(self, message, done=None):
        """Redraw with ``done`` (may be fractional) steps complete."""
        if done is not None:
            self.done = done
        line = self.render(message)
        if self.tty:
            # A line wider than the terminal would wrap, and '\r' would not redraw it.
            line = clip(line, shutil.get_terminal_size().columns - 1)
            pad = max(0, self._last_len - len(line))
            self._write("\r" + line + " " * pad)
            self._last_len = len(line)
        else:
            self._write(line + "\n")

    def close(self, message="done"):
        self.done = self.total or self.done
        line = self.render(message)
        if self.tty:
            line = clip(line, shutil.get_terminal_size().columns - 1)
            self._write("\r" + line + " " * max(0, self._last_len - len(line)) + "\n")
        else:
            self._write(line + "\n")

    def _write(self, text):
        """The first write that fails (a full, closed or missing stderr) turns the bar
        off: it only shows a run, which must go on and print its results."""
        if self.stream is None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError, AttributeError):
            self.stream = None


def stderr_progress(total=None):
    return ProgressBar(total)


def plot_roofline(env, results, path):
    """A roofline-style chart: GFLOP/s against arithmetic intensity (2*nnz flops per
    minimum byte), one marker per implementation, and the
    memory roof at the measured copy bandwidth.  Needs matplotlib (the bench extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'pyspmv-cl[bench]' "
                          "(or pip install matplotlib)") from None
    ok = [r for r in results if "error" not in r and r.get("seconds") and r.get("min_bytes")]
    if not ok:
        raise ValueError("nothing to plot: no successful result")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    impls = sorted({r["impl"] for r in ok}, key=lambda i: (i != "auto", i))
    markers = "o^sDvP*Xh<>pd"
    for k, impl in enumerate(impls):
        for dtype, fill in (("float32", True), ("float64", False)):
            rows = [r for r in ok if r["impl"] == impl and r["dtype"] == dtype]
            if not rows:
                continue
            xs = [2.0 * r["nnz"] / r["min_bytes"] for r in rows]
            ys = [r["gflops"] for r in rows]
            color = f"C{k % 10}"
            ax.scatter(xs, ys, marker=markers[k % len(markers)], s=36, label=f"{impl} {dtype}",
                       facecolors=color if fill else "none", edgecolors=color,
                       alpha=0.85, zorder=3)
    xs_all = [2.0 * r["nnz"] / r["min_bytes"] for r in ok]
    lo, hi = min(xs_all) / 1.5, max(xs_all) * 1.5
    if env.get("copy_gbps"):
        roof = env["copy_gbps"]
        ax.plot([lo, hi], [roof * lo, roof * hi], "k--", lw=1,
                label=f"copy bandwidth roof ({roof:.1f} GB/s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (flop per minimum byte, CSR with 32-bit indices)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"SpMV on {env.get('device', '?')}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
