"""The ``pyspmv-cl`` command: ``devices``, ``bench`` and ``tune``."""

import argparse
import contextlib
import errno
import json
import math
import os
import sys
import time
import warnings

import numpy as np
import pyopencl as cl

from . import bench
from ._version import __version__
from .bench.generators import DEFAULT_SPECS, GENERATOR_HELP, from_spec
from .bench.runner import REPORT_WIDTH, clip, clip_left, params_text
from .device import devices, get_device
from .errors import PySpMVError
from .features import MatrixFeatures
from .formats import FORMATS
from .inputs import check_value_range, needs_fp64, resolve_dtype
from .tuning import database, database_dir, select, tuner


def _cmd_devices(args):
    found = devices()
    if not found:
        print("no OpenCL device found (install one, e.g. pip install 'pyspmv-cl[pocl]')")
        return 1
    rows = [("id", "type", "family", "device", "platform", "CUs", "SIMD", "lanes f32/f64",
             "max WG", "local KiB", "global MiB", "max alloc MiB", "fp64", "OpenCL C")]
    for d in found:
        p = d.profile
        rows.append((d.id, p.device_type, p.vendor_family, p.name,
                     f"{p.platform_name} ({p.driver_version})", str(p.compute_units),
                     str(p.simd_width), f"{p.vector_lanes_float32}/{p.vector_lanes_float64}",
                     str(p.max_work_group_size), str(p.local_mem_size // 1024),
                     str(p.global_mem_size >> 20), str(p.max_alloc_size >> 20),
                     "yes" if p.fp64 else "no", "{}.{}".format(*p.opencl_c_version)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    try:
        print(f"\ndefault device: {get_device().id}")
    except Exception as exc:
        print(f"\ndefault device: none ({exc})")
    return 0


def _split(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _cmd_bench(args):
    if args.list_generators:
        print(GENERATOR_HELP)
        return 0
    device = get_device(args.device)
    formats = [f for name in _split(args.formats)
               for f in (list(FORMATS) if name == "all" else [name])]
    unknown = [f for f in formats if f not in FORMATS and f != "auto"]
    if unknown:
        print(f"unknown format(s) {unknown}; available: {', '.join(FORMATS)}, auto, all",
              file=sys.stderr)
        return 2
    if not formats:
        print("--formats names no format: give names, 'all' or 'auto'", file=sys.stderr)
        return 2
    dtypes = ["float32", "float64"] if args.dtype == "both" else _split(args.dtype)
    known = ("float32", "float64", "complex64", "complex128")
    if not dtypes or any(dt not in known for dt in dtypes):
        what = "names no dtype" if not dtypes else f"has an unknown dtype {args.dtype!r}"
        print(f"--dtype {what}: use {', '.join(known)} (comma-separated) or both",
              file=sys.stderr)
        return 2
    if args.repeat < 1 or not 0 <= args.min_time < math.inf:   # (NaN fails both)
        print("--repeat must be at least 1 and --min-time a finite number of seconds "
              ">= 0", file=sys.stderr)
        return 2
    for option, value in (("--json", args.json), ("--plot", args.plot)):
        if value is not None and not value.strip():
            print(f"pyspmv-cl bench: {option} needs a file name"
                  + (" (or - for stdout)" if option == "--json" else ""), file=sys.stderr)
            return 2
    if args.json and args.json != "-":   # before the runs, not after them
        why = _cannot_write(args.json)
        if why:
            print(f"pyspmv-cl bench: cannot write --json {args.json}: {why}", file=sys.stderr)
            return 2
    if "auto" in formats and not _tuner_settings_ok("bench", policy=True):
        return 2
    peers = None if args.peers == "all" else ([] if args.peers == "none" else _split(args.peers))
    specs = args.matrices or list(DEFAULT_SPECS)
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (fail before the runs, not after)
        except ImportError:
            print("pyspmv-cl bench: --plot needs matplotlib: pip install 'pyspmv-cl[bench]' "
                  "(or pip install matplotlib)", file=sys.stderr)
            return 2
    progress = None if args.quiet else bench.ProgressBar()
    try:
        env, results = bench.run(specs, device, formats, [np.dtype(d) for d in dtypes], peers,
                                 repeats=args.repeat, min_time=args.min_time, progress=progress)
    except ValueError as exc:  # bad matrix spec or peer name: a message, not a traceback
        if progress:
            progress.close("failed")
        print(f"pyspmv-cl bench: {exc}", file=sys.stderr)
        return 2
    if progress:
        progress.close()
    code = 0
    payload = json.dumps({"environment": env, "results": results}, indent=1, default=str) \
        if args.json else None
    # The file before the table, the table even when the file fails: a full disk or a
    # closed stdout loses one of them, never both.
    if args.json and args.json != "-":
        try:
            with open(args.json, "w") as fh:
                fh.write(payload + "\n")
        except OSError as exc:
            print(f"pyspmv-cl bench: cannot write --json {args.json}: {exc} (the "
                  "results are in the table)", file=sys.stderr)
            code = 1
    if args.json != "-":
        print(bench.format_report(env, results, verbose=args.verbose), flush=True)
    if args.plot:
        try:
            bench.plot_roofline(env, results, args.plot)
            print(f"roofline chart written to {args.plot}", file=sys.stderr)
        except OSError as exc:
            print(f"pyspmv-cl bench: cannot write --plot {args.plot}: {exc}", file=sys.stderr)
            code = 1
    if args.json == "-":
        print(payload)
    return code


def _resolved(decision):
    """Every parameter of a decision's format as its measurement resolved them (the
    decision's ``params`` hold only those to pass on top of the defaults)."""
    if decision.impl is not None:
        return {k: v for k, v in decision.impl.params.items()
                if isinstance(v, (int, float, str, bool, type(None)))}
    for cand in (decision.entry or {}).get("candidates", ()):
        if cand.get("format") == decision.format and cand.get("params") == decision.params \
                and cand.get("resolved"):
            return dict(cand["resolved"])
    return dict(decision.params)


def _tuner_settings_ok(command, policy):
    """Whether the tuner's settings from the environment (``PYSPMV_CL_TUNE_BUDGET``, and
    ``PYSPMV_CL_TUNE`` with ``policy``) are usable; else says why.  Checked before the
    runs, not after them."""
    try:
        if policy:
            tuner.policy(None)
        tuner.default_budget(0)
    except PySpMVError as exc:
        print(f"pyspmv-cl {command}: {exc}", file=sys.stderr)
        return False
    return True


def _cannot_write(path):
    """Why ``path`` could not be written, or None; creates nothing (an empty file left
    behind by a run refused later was mistaken for its results)."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        return "it is a directory"
    if os.path.exists(target):
        return None if os.access(target, os.W_OK) else "permission denied"
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        return f"no directory {folder}"
    return None if os.access(folder, os.W_OK) else f"cannot create files in {folder}"


def _cmd_tune(args):
    device = get_device(args.device)
    if args.dtype not in ("default", "float32", "float64", "complex64", "complex128", "both"):
        print(f"unknown dtype {args.dtype!r}: use default, float32, float64, complex64, "
              "complex128 or both", file=sys.stderr)
        return 2
    if args.budget is not None and not 0 < args.budget < math.inf:   # (NaN too)
        print("--budget must be positive seconds", file=sys.stderr)
        return 2
    if args.expected_calls is not None and args.expected_calls < 1:
        print("--expected-calls must be a positive integer", file=sys.stderr)
        return 2
    if args.block_size < 1:
        print("--block-size must be a positive integer", file=sys.stderr)
        return 2
    if args.budget is None and not _tuner_settings_ok("tune", policy=False):
        return 2
    jobs = []
    refused = 0   # matrices not tuned: the exit status says so
    for spec in args.matrices:
        try:
            name, A = from_spec(spec)
        except ValueError as exc:
            print(f"pyspmv-cl tune: {exc}", file=sys.stderr)
            return 2
        if A.dtype.kind == "c" and args.dtype in ("float32", "float64", "both"):
            # (a real type drops the imaginary parts)
            print(f"pyspmv-cl tune: {name}: a complex matrix is tuned in a complex type: "
                  "leave --dtype at default or give complex64 or complex128",
                  file=sys.stderr)
            refused += 1
            continue
        dtypes = ([np.float32, np.float64] if args.dtype == "both" else
                  [resolve_dtype(None, A.dtype, device.profile)] if args.dtype == "default"
                  else [np.dtype(args.dtype)])
        jobs += [(name, A, np.dtype(d)) for d in dtypes
                 if not needs_fp64(d) or device.profile.fp64]
    bar = None if args.quiet else bench.ProgressBar(total=len(jobs))
    rows = []
    store_errors = database.stats["errors"]
    for name, A, dtype in jobs:
        csr = A.tocsr()
        try:   # as SpMV(A, dtype=...) refuses: values float32 would hold as inf
            check_value_range(csr.data, dtype, f"matrix {name}")
        except PySpMVError as exc:
            print(f"pyspmv-cl tune: {exc}", file=sys.stderr)
            refused += 1
            continue
        if bar:
            before = bar.done
            bar.show(f"{name} {dtype.name}: fingerprint")

            def progress(k, total, text, label=f"{name} {dtype.name}", before=before):
                bar.show(f"{label}: timing {text}", before + (min(k, total) / total
                                                               if total else 1))
        else:
            progress = None
        start = time.perf_counter()
        decision = select(csr, MatrixFeatures.from_csr(csr), device, dtype,
                          tune="force" if args.force else "measure",
                          expected_calls=args.expected_calls, budget=args.budget,
                          progress=progress, block_size=args.block_size)
        if bar:
            bar.done = before + 1
        rows.append({"matrix": name, "dtype": dtype.name, "block_size": decision.block_size,
                     "format": decision.format,
                     "params": decision.params, "resolved": _resolved(decision),
                     "source": decision.source,
                     "kernel_seconds": decision.kernel_seconds,
                     "seconds": time.perf_counter() - start,
                     "explanation": decision.explanation})
    if bar:
        bar.close()
    if database.stats["errors"] > store_errors:   # (the warning above says why)
        print(f"pyspmv-cl tune: the decisions could not be stored in {database_dir()}: "
              "they were kept in this process's memory only", file=sys.stderr)
        refused += 1
    if args.json:
        folder = database_dir()   # (None: PYSPMV_CL_NO_CACHE, memory only)
        print(json.dumps({"device": device.profile.name,
                          "database": str(folder) if folder is not None else None,
                          "results": rows}, indent=1, default=str))
        return 1 if refused else 0
    print(f"device: {device.profile.name} ({device.id}); tuning database: "
          f"{database_dir() or 'memory only (PYSPMV_CL_NO_CACHE)'}")
    for r in rows:
        kernel = f"{r['kernel_seconds'] * 1e6:.1f} us" if r["kernel_seconds"] else "-"
        k = f" k={r['block_size']}" if r["block_size"] != 1 else ""
        head = f"{r['matrix']} {r['dtype']}{k}: {r['format']}"
        tail = f"[{r['source']}, kernel {kernel}, {r['seconds']:.2f} s]"
        # The parameters are cut to keep the line in 120 columns; -v shows them all.
        params = params_text(r["resolved"], full=True)
        if not args.verbose:
            # (a long matrix name is cut too, keeping its end: the format and type)
            head = clip_left(head, REPORT_WIDTH - len(tail) - 1)
            params = clip(params, REPORT_WIDTH - len(head) - len(tail) - 2)
        print(" ".join(t for t in (head, params, tail) if t))
        if args.verbose:
            print(f"    {r['explanation']}")
    return 1 if refused else 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="pyspmv-cl", description="Sparse matrix-vector multiplication on OpenCL devices.")
    parser.add_argument("--version", action="version", version=f"pyspmv-cl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("devices", help="list OpenCL devices and their profiles")
    p.set_defaults(func=_cmd_devices)

    p = sub.add_parser(
        "bench", help="time SpMV formats against scipy and other peers",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Benchmark SpMV on generated matrices or Matrix Market files.\n"
                    "See --list-generators for the matrix specs.",
        epilog="\n".join(["columns of the table:", *bench.column_notes(width=66)]))
    p.add_argument("matrices", nargs="*",
                   help=f"matrix specs or .mtx(.gz) files (default: {' '.join(DEFAULT_SPECS)})")
    p.add_argument("--formats", default="all,auto",
                   help="comma-separated format names, 'auto', 'all' (every format); "
                        "default all,auto")
    p.add_argument("--dtype", default="both",
                   help="float32, float64, complex64, complex128 (comma-separated) or both "
                        "(default: float32,float64); a complex matrix runs in the complex "
                        "type of each precision")
    p.add_argument("--device", default=None,
                   help="device selection (e.g. 0:1, cpu, gpu, pocl); default as the library")
    p.add_argument("--peers", default="all",
                   help="comma-separated peers (scipy, torch, mkl, cusparse, cupy-csr), "
                        "'all' or 'none'")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per case (median)")
    p.add_argument("--min-time", type=float, default=0.3,
                   help="seconds of timed runs per case at least, unless 50 x --repeat "
                        "samples come first")
    p.add_argument("--json", metavar="FILE", help="also write results as JSON ('-': stdout only)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="full parameters, platform and messages, auto's explanations and "
                        "notes on the columns (lines may be wider than 120 columns)")
    p.add_argument("--list-generators", action="store_true", help="show matrix specs and exit")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw a roofline-style chart (needs matplotlib: the bench extra)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "tune", help="tune format='auto' for matrices and store the decisions",
        description="Measure the candidate formats for each matrix on the device and store "
                    "the decision in the tuning database, so that SpMV(A, format='auto') "
                    "reuses it in any later process without timing.")
    p.add_argument("matrices", nargs="+", help="matrix specs or .mtx(.gz) files")
    p.add_argument("--device", default=None, help="device selection (e.g. 0:1, cpu, gpu)")
    p.add_argument("--dtype", default="default",
                   help="float32, float64, both, or default (what SpMV would use: the "
                        "matrix's float type)")
    p.add_argument("--force", action="store_true",
                   help="re-measure even when a decision is stored (and overwrite it)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="time allowed per matrix, building included (default 1.5 s per "
                        "million non-zeros, at least 1 s)")
    p.add_argument("--expected-calls", type=int, default=None, metavar="N",
                   help="products the application will run: conversion time then counts")
    p.add_argument("--block-size", type=int, default=1, metavar="K",
                   help="vectors per product (op @ X with X of shape (n, K)): candidates are "
                        "timed on block products and the decision stored for K's class "
                        "(1, 2-4, 5-8, 9-16, 17+), as SpMV(A, block_size=K) finds it")
    p.add_argument("--json", action="store_true", help="print the decisions as JSON")
    p.add_argument("--verbose", "-v", action="store_true", help="print each explanation")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_cmd_tune)
    return parser



def _show_warning(message, category, filename, lineno, file=None, line=None):
    """The library's warnings as one line each (not Python's file, line and source);
    pyopencl's note of a driver's build log (correct kernels of its own, e.g. array
    reductions, whose log NVIDIA fills) is left out."""
    if issubclass(category, cl.CompilerWarning):
        return
    text = str(message).removeprefix("pyspmv_cl: ")
    print(f"pyspmv-cl: warning: {text}", file=sys.stderr if file is None else file)


# Errors of writing an output (stdout, a file): no space, quota, I/O error, pipe closed.
_OUTPUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPIPE)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if sys.stdout is None:   # started with stdout closed (>&-): nowhere to put results
        if sys.stderr is not None:
            print("pyspmv-cl: cannot write the output: stdout is closed", file=sys.stderr)
        return 1
    shown, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        code = args.func(args)
        sys.stdout.flush()   # an output that cannot take it fails here, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except PySpMVError as exc:
        print(f"pyspmv-cl: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRORS:
            raise
        # stdout is full, gone or closed (a full disk, `| head`): one line, and what is
        # left in stdout's buffer goes nowhere instead of failing again at exit.
        print(f"pyspmv-cl: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())
