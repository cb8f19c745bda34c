"""What ``y = op @ x`` costs as a user calls it on a CPU (#18): numpy in, numpy out,
against PyTorch CSR and scipy in the same process, interleaved.

For each matrix and dtype, one operator (``--format``, default ``auto``, whose online
tuning is finished first with ``op.finish_tuning()``), then ``--rounds`` rounds; in each
round every contender runs ``--calls`` calls in turn.  Medians over all calls:

- ``ours``: ``op @ x`` with host arrays, the library's default path (on a device that
  computes in host memory the kernels use the numpy arrays in place);
- ``ours-wait``: the same without polling the event before waiting on it (what
  ``ours`` did before ``host_buffers.spin_seconds``; the same where it does not poll);
- ``ours-copy``: the same through device buffers (``op._host_mode = "copy"``: the path
  before the in-place one, and still the path of discrete GPUs);
- ``device``: ``op.matvec(x_dev, out=y_dev)`` then ``queue.finish()``;
- ``kernel``: the kernels' profiling-event time of one product: kernel-only, not what a
  user waits for;
- ``torch`` (``torch.mv`` on a CSR tensor, every logical CPU), ``mkl`` (sparse_dot_mkl)
  and ``scipy``; "best peer / ours" takes the fastest of them.

Every contender's result is checked against scipy's float64 product first.

    python benchmarks/call_path.py --device 0:0 --json R.json cage10 astro-ph \\
        poisson2d:1000

With ``POCL_DEVICES="pthread basic" ... --device default`` each operator takes the
device ``SpMV(A)`` chooses by the matrix's size (``device`` in each row).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy

import pyspmv_cl as psc
from pyspmv_cl.bench.peers import available_peers
from pyspmv_cl.bench.runner import kernel_seconds
from pyspmv_cl.bench.script_args import (
    check_matrices,
    device_or_error,
    dtypes_or_error,
    reference_dtype,
    tolerance,
)

MATRIX_DIR = Path(__file__).resolve().parents[2] / "shared" / "matrices"

#: The suite of #18: the shared matrices of 50k-2M non-zeros, and generated ones of 4M+.
SHARED = ["wathenSmall", "szdMat", "bayer10", "cage10", "wing", "astro-ph", "fe_4elt2",
          "Groebner_id2003_aug"]
GENERATED = ["poisson2d:1000", "poisson3d:100", "random:1000000,10", "powerlaw:500000,8",
             "banded:1000000,5", "denserows:500000,4"]


def measure(label, A, dtype, args, peers, rng):
    A = A.astype(dtype)
    t0 = time.perf_counter()
    # "default": no device given, SpMV chooses (by size where PoCL exposes two drivers).
    device = None if args.device == "default" else args.device
    op = psc.SpMV(A, device=device, format=args.format)
    op.finish_tuning()
    setup = time.perf_counter() - t0
    x = rng.standard_normal(A.shape[1]).astype(dtype)
    wide = reference_dtype(dtype)   # complex128 for complex values: keep imaginary parts
    reference = A.astype(wide) @ x.astype(wide)
    q = op.queue
    x_dev, y_dev = cla.to_device(q, x), cla.empty(q, A.shape[0], op.dtype)
    default_mode = op._host_mode
    spin = op._host_spin

    def ours():
        op._host_mode = default_mode
        op.__dict__["_host_spin"] = spin
        return op @ x

    def ours_wait():   # without polling the event first (host_buffers.spin_seconds)
        op._host_mode = default_mode
        op.__dict__["_host_spin"] = 0.0
        return op @ x

    def ours_copy():
        op._host_mode = "copy"
        return op @ x

    def device():
        op.matvec(x_dev, out=y_dev)
        q.finish()
        return y_dev   # .get() in the check only

    contenders = {"ours": ours, "ours-wait": ours_wait, "ours-copy": ours_copy,
                  "device": device}
    for peer in peers:
        f = peer.prepare(A, dtype)
        contenders[peer.name.replace("-csr", "")] = (lambda f=f: f(x))
    scale = np.abs(A).astype(np.float64) @ np.abs(x).astype(np.float64) + 1e-30
    tol = tolerance(dtype, 1e-4, 1e-10)
    for name, f in contenders.items():
        y = f()
        y = y.get() if isinstance(y, cla.Array) else y
        err = np.max(np.abs(np.asarray(y, dtype=wide) - reference) / scale)
        if not err < tol:
            raise AssertionError(f"{label} {dtype}: {name} is off by {err:.2e}")
    samples = {name: [] for name in contenders}
    samples["kernel"] = []
    for _ in range(args.rounds):
        for name, f in contenders.items():
            for _ in range(args.calls):
                t = time.perf_counter()
                f()
                samples[name].append(time.perf_counter() - t)
        q.finish()   # x_dev written before kernel_seconds' queue reads it
        samples["kernel"] += [kernel_seconds(op, x_dev, y_dev) for _ in range(args.calls)]
    op._host_mode = default_mode
    op.__dict__["_host_spin"] = spin
    row = {"matrix": label, "spin_us": spin * 1e6, "dtype": np.dtype(dtype).name, "nnz": int(A.nnz),
           "format": op.format, "host_mode": default_mode, "setup_s": setup,
           "device": op.device.cl_device.name.strip()}
    for name, values in samples.items():
        row[name + "_us"] = statistics.median(values) * 1e6
        row[name + "_p10_us"] = float(np.percentile(values, 10) * 1e6)
        row[name + "_p90_us"] = float(np.percentile(values, 90) * 1e6)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("matrices", nargs="*",
                        help="shared matrix names or generator specs (default: the suite)")
    parser.add_argument("--device", default="0:0",
                        help="a selection, or 'default': SpMV(A) chooses (with "
                        "POCL_DEVICES='pthread basic', by the matrix's size)")
    parser.add_argument("--format", default="auto")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--peers", default="torch-csr,mkl,scipy")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    names = [] if args.peers.strip() == "none" else \
        [p.strip() for p in args.peers.split(",") if p.strip()]
    try:
        found = available_peers(names)
    except ValueError as exc:
        parser.error(str(exc))
    peers = [p for p in found if p.available]
    for p in found:
        if not p.available:   # (a missing library: its columns stay out)
            print(f"peer {p.name} left out: {p.reason}", file=sys.stderr)
    dtypes = dtypes_or_error(parser, args.dtypes)
    if args.device != "default":
        device_or_error(parser, args.device)
    rng = np.random.default_rng(0)
    matrices = check_matrices(parser, args.matrices or SHARED + GENERATED, MATRIX_DIR)
    rows = []
    for label, A in matrices:
        for dtype in dtypes:
            row = measure(label, A, dtype, args, peers, rng)
            rows.append(row)
            best = min(row.get(f"{name}_us", np.inf) for name in ("torch", "mkl", "scipy"))
            best = best if best < np.inf else np.nan   # (no peer)
            print(f"{label:24s} {row['dtype']:8s} {row['format']:11s} "
                  f"{row['device'].split('-')[0]:8s}"
                  f"ours {row['ours_us']:8.0f}  wait {row['ours-wait_us']:8.0f}  "
                  f"copy {row['ours-copy_us']:8.0f}  "
                  f"device {row['device_us']:8.0f}  kernel {row['kernel_us']:8.0f}  "
                  f"torch {row.get('torch_us', float('nan')):8.0f}  "
                  f"mkl {row.get('mkl_us', float('nan')):8.0f}  "
                  f"scipy {row.get('scipy_us', float('nan')):8.0f}  "
                  f"best peer / ours {best / row['ours_us']:.2f}", flush=True)
    if args.json:
        device = psc.get_device(None if args.device == "default" else args.device)
        meta = {"device": device.cl_device.name.strip() if args.device != "default"
                else "chosen per matrix (rows' 'device')",
                "platform": device.platform.version.strip(),
                "python": platform.python_version(), "numpy": np.__version__,
                "scipy": scipy.__version__, "pyopencl": cl.VERSION_TEXT,
                "cpus": os.cpu_count(), "argv": sys.argv[1:],
                "env": {k: v for k, v in os.environ.items() if k.startswith("POCL")}}
        try:
            import torch
            meta["torch"] = torch.__version__
        except ImportError:
            pass
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
