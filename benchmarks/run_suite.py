"""Run a benchmark suite and write its results as JSON and a markdown table.

    python benchmarks/run_suite.py --suite cpu --device 0:0 --out benchmarks/results/cpu

Suites list generator specs (see ``pyspmv-cl bench --list-generators``) and shared
matrices (read from PYSPMV_CL_MATRIX_DIR, default ../shared/matrices beside the
checkout; never copied into the repository).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from pyspmv_cl import bench, formats, get_device

MATRIX_DIR = Path(os.environ.get(
    "PYSPMV_CL_MATRIX_DIR", Path(__file__).resolve().parents[2] / "shared" / "matrices"))

# The larger shared matrices (the small ones measure launch overhead, not SpMV).
SHARED = ["wathenSmall", "szdMat", "bayer10", "cage10", "wing", "astro-ph", "fe_4elt2",
          "Groebner_id2003_aug", "gemat12", "rajat01"]

SUITES = {
    # This 2-core machine: matrices of 1-20 MB, larger than its caches.
    "cpu": {
        "generated": ["poisson2d:1000", "poisson3d:100", "random:1000000,10",
                      "powerlaw:500000,8", "banded:1000000,5", "denserows:500000,4"],
        "shared": [(name, 1) for name in SHARED],
    },
    # GPUs: tens of millions of non-zeros, shared matrices replicated to fill the device.
    "gpu": {
        "generated": ["poisson2d:3000", "poisson3d:200", "random:3000000,10",
                      "powerlaw:2000000,8", "rmat:21,16", "banded:5000000,5",
                      "denserows:2000000,4"],
        "shared": [(name, 32) for name in SHARED],
    },
    # The GPU suite in parts, each within one 10-minute call on the lent GPU machine.
    "gpu-regular": {"generated": ["poisson2d:3000", "poisson3d:200", "random:3000000,10",
                                  "banded:5000000,5"], "shared": []},
    "gpu-skewed": {"generated": ["powerlaw:2000000,8", "rmat:21,16", "denserows:2000000,4"],
                   "shared": []},
    "gpu-shared": {"generated": [], "shared": [(name, 32) for name in SHARED]},
    # A quick smoke run.
    "quick": {"generated": ["poisson2d:300", "powerlaw:50000,8"], "shared": []},
}


def suite_specs(name):
    suite = SUITES[name]
    specs = list(suite["generated"])
    for matrix, copies in suite["shared"]:
        path = MATRIX_DIR / f"{matrix}.mtx.gz"
        if path.exists():
            specs.append(f"{path}*{copies}" if copies > 1 else str(path))
        else:
            print(f"skipping {matrix}: {path} not found", file=sys.stderr)
    return specs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="cpu")
    parser.add_argument("--device", default=None)
    parser.add_argument("--formats", default="all,auto",
                        help="comma-separated names; 'all' = every format (default all,auto)")
    parser.add_argument("--dtype", default="both")
    parser.add_argument("--peers", default="all")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--out", required=True, help="output path without extension")
    parser.add_argument("--tune-first", action="store_true",
                        help="run `pyspmv-cl tune` on the suite first, so that auto uses "
                             "measured decisions from the tuning database")
    args = parser.parse_args(argv)

    device = get_device(args.device)
    fmts = [f for name in args.formats.split(",")
            for f in (formats() if name == "all" else [name])]
    dtypes = ["float32", "float64"] if args.dtype == "both" else args.dtype.split(",")
    if not dtypes or any(d not in ("float32", "float64") for d in dtypes):
        parser.error(f"--dtype {args.dtype!r}: float32, float64, a list of them or both")
    peers = None if args.peers == "all" else ([] if args.peers == "none"
                                              else args.peers.split(","))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(env, results):  # after every matrix, so an interrupted run keeps its data
        out.with_suffix(".json").write_text(
            json.dumps({"environment": env, "results": results}, indent=1, default=str) + "\n")
        out.with_suffix(".md").write_text(bench.format_table(env, results) + "\n")

    if args.tune_first:
        from pyspmv_cl.cli import main as cli_main
        # tune takes one dtype or "both": a list of both is "both"
        tune_dtype = "both" if len(set(dtypes)) > 1 else dtypes[0]
        tune_args = ["tune", "--dtype", tune_dtype]
        if args.device:
            tune_args += ["--device", args.device]
        code = cli_main(tune_args + suite_specs(args.suite))
        if code:   # the suite would run on the rules, not on measured decisions
            parser.exit(code, "run_suite.py: --tune-first: pyspmv-cl tune failed (above); "
                              "nothing benchmarked\n")
    env, results = bench.run(suite_specs(args.suite), device, fmts,
                             [np.dtype(d) for d in dtypes], peers, repeats=args.repeat,
                             min_time=args.min_time, progress=bench.ProgressBar(),
                             checkpoint=save)
    save(env, results)
    print(bench.format_report(env, results))


if __name__ == "__main__":
    main()
