"""Per-kernel device time of one product, for formats that launch several kernels
(csr5's compute / run-sums / calibrate, coo's carries, bccoo's passes): which pass a
matrix spends its time in.

    python benchmarks/kernel_breakdown.py powerlaw:2000000,8 --formats csr5,bccoo \\
        --device nvidia --set csr5:run_group=0

Prints, per matrix and format, the median device time of each kernel (profiling
events) and of the whole product (first start to last end, gaps included).
"""

import argparse
import statistics
from collections import defaultdict

import numpy as np
import pyopencl.array as cla

import pyspmv_cl as psc
from pyspmv_cl.bench.script_args import (
    check_matrices,
    device_or_error,
    dtypes_or_error,
    positive_int,
)
from pyspmv_cl.launching import record_launches


def parse_settings(items):
    """``FORMAT:KEY=VALUE`` items -> {format: {key: value}} (ints and True/False where
    they parse)."""
    out = defaultdict(dict)
    for item in items:
        fmt, _, assignment = item.partition(":")
        key, _, value = assignment.partition("=")
        if not (fmt and key and value):
            raise SystemExit(f"--set takes FORMAT:KEY=VALUE, not {item!r}")
        try:
            out[fmt][key] = int(value)
        except ValueError:
            out[fmt][key] = {"True": True, "False": False}.get(value, value)
    return out


def breakdown(op, x_dev, y_dev, repeats):
    """{kernel name: median seconds} and the median seconds of the whole product."""
    per_kernel, spans = defaultdict(list), []
    for i in range(repeats + 3):
        with record_launches(with_names=True) as launches:
            op.matvec(x_dev, out=y_dev)
        events = [ev for _, ev in launches]
        events[-1].wait()
        if i < 3:           # warm-up
            continue
        for name, ev in launches:
            per_kernel[name].append((ev.profile.end - ev.profile.start) * 1e-9)
        spans.append((events[-1].profile.end - events[0].profile.start) * 1e-9)
    return ({name: statistics.median(t) for name, t in per_kernel.items()},
            statistics.median(spans))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("matrices", nargs="+", help="generator specs, .mtx(.gz) files "
                        "or names of the shared matrices")
    parser.add_argument("--formats", default="csr5,bccoo,coo")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeat", type=positive_int, default=20)
    parser.add_argument("--set", action="append", default=[], metavar="FORMAT:KEY=VALUE",
                        help="a format parameter (repeatable)")
    args = parser.parse_args(argv)
    if "," in args.dtype:
        parser.error(f"--dtype {args.dtype!r}: one value type")
    dtype = dtypes_or_error(parser, args.dtype, "--dtype")[0]
    matrices = check_matrices(parser, args.matrices)
    # Kernels are timed by their profiling events: the device's profiling queue.
    device = device_or_error(parser, args.device).profiling_device()
    settings = parse_settings(args.set)
    for name, A in matrices:
        x = np.random.default_rng(0).standard_normal(A.shape[1]).astype(dtype)
        for fmt in args.formats.split(","):
            try:
                op = psc.SpMV(A, format=fmt, dtype=dtype, device=device, **settings[fmt])
            except psc.PySpMVError as exc:
                print(f"{name} {fmt}: refused: {exc}")
                continue
            x_dev = cla.to_device(op.queue, x)
            y_dev = cla.empty(op.queue, A.shape[0], dtype)
            kernels, span = breakdown(op, x_dev, y_dev, args.repeat)
            parts = "  ".join(f"{k} {t * 1e6:.1f}" for k, t in kernels.items())
            params = " ".join(f"{k}={v}" for k, v in op.params.items())
            print(f"{name} {dtype.name} {op.format}: total {span * 1e6:.1f} us  [{parts}]  "
                  f"({params})", flush=True)


if __name__ == "__main__":
    main()
