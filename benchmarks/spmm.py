"""Multi-vector products (SpMM): ``op @ X`` for k = 1, 4, 16, 64 against the column loop
(one SpMV per column, as formats without block kernels run) and scipy.

For each matrix, format and k, the median of ``--repeats`` wall-clock times of:

- ``block host``: ``op @ X`` with a host X (upload of X, the block kernels, read-back);
- ``loop host``: ``op @ X[:, j]`` for each column (k SpMVs, each with its transfers);
- ``block dev`` / ``loop dev``: the same on device-resident arrays (``op @ Xd``, and
  ``op.matvec(xd_j, out=yd_j)`` on k separate device vectors), waited for;
- ``scipy``: ``A @ X`` on the host (scipy's CSR x dense block, one thread).

    python benchmarks/spmm.py [--device 0:0] [--dtype float32] [--repeats 9]
        [--matrix random:200000,10 --matrix poisson2d:450] [--format csr-scalar ...]

Prints one table row per (matrix, format, k) in milliseconds, and the JSON with
``--json``.
"""

import argparse
import json
import statistics

import numpy as np
import pyopencl.array as cla

import pyspmv_cl as psc
from pyspmv_cl.bench.runner import wall_times
from pyspmv_cl.bench.script_args import check_matrices, device_or_error, positive_int

KS = (1, 4, 16, 64)


def median_ms(fn, repeats):
    """Median wall milliseconds of ``repeats`` calls after one warm-up (which builds
    the block widths and grows the staging buffers)."""
    return statistics.median(wall_times(fn, repeats)) * 1e3


def bench_k(op, A, k, dtype, repeats, rng):
    """The timings of one k (see the module docstring)."""
    m, n = A.shape
    queue = op.queue
    X = rng.standard_normal((n, k)).astype(dtype)
    Xd = cla.to_device(queue, X)
    Yd = cla.empty(queue, (m, k), dtype)
    xs = [cla.to_device(queue, np.ascontiguousarray(X[:, j])) for j in range(k)]
    ys = [cla.empty(queue, m, dtype) for _ in range(k)]
    Y = op @ X
    err = float(np.abs(Y - A @ X.astype(np.float64)).max() / max(1e-30, np.abs(Y).max()))
    A_host = A.astype(dtype)

    def loop_host():
        out = np.empty((m, k), dtype)
        for j in range(k):
            out[:, j] = op @ X[:, j]
        return out

    def block_dev():
        op.matmat(Xd, out=Yd)
        queue.finish()

    def loop_dev():
        for x, y in zip(xs, ys):
            op.matvec(x, out=y)
        queue.finish()

    return {
        "k": k, "format": op.format, "params": op.params,
        "block_kernels": op.has_block_kernels, "relative_error": err,
        "block_host_ms": median_ms(lambda: op @ X, repeats),
        "loop_host_ms": median_ms(loop_host, repeats),
        "block_dev_ms": median_ms(block_dev, repeats),
        "loop_dev_ms": median_ms(loop_dev, repeats),
        "scipy_ms": median_ms(lambda: A_host @ X, repeats),
    }


def bench(A, fmt, dtype, device, repeats, ks):
    op = psc.SpMV(A, fmt, dtype=dtype, device=device)
    rng = np.random.default_rng(0)
    return [bench_k(op, A, k, dtype, repeats, rng) for k in ks]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=positive_int, default=9)
    parser.add_argument("--matrix", action="append")
    parser.add_argument("--format", action="append")
    parser.add_argument("--k", type=positive_int, action="append")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    matrices = check_matrices(parser, args.matrix or ["random:200000,10", "poisson2d:450"])
    device = device_or_error(parser, args.device)
    dtype = np.dtype(args.dtype)
    formats = args.format or ["csr-scalar", "sell", "csr-vector", "ell"]
    ks = tuple(args.k or KS)
    print(f"device: {device.profile.name}, dtype {dtype}, medians of {args.repeats} (ms)")
    print(f"{'matrix':28} {'format':11} {'k':>3} {'block host':>10} {'loop host':>10} "
          f"{'block dev':>10} {'loop dev':>10} {'scipy':>8} {'dev speed-up':>12}")
    results = []
    for name, A in matrices:
        for fmt in formats:
            try:
                rows = bench(A, fmt, dtype, device, args.repeats, ks)
            except psc.FormatNotSuitableError as exc:
                print(f"{name:28} {fmt:11} refused: {exc}")
                continue
            for r in rows:
                r.update(matrix=name, nnz=int(A.nnz), shape=list(A.shape))
                print(f"{name:28} {fmt:11} {r['k']:>3} {r['block_host_ms']:>10.2f} "
                      f"{r['loop_host_ms']:>10.2f} {r['block_dev_ms']:>10.2f} "
                      f"{r['loop_dev_ms']:>10.2f} {r['scipy_ms']:>8.2f} "
                      f"{r['loop_dev_ms'] / r['block_dev_ms']:>11.1f}x")
            results.extend(rows)
    if args.json:
        print(json.dumps({"device": device.profile.name, "dtype": str(dtype),
                          "results": results}))


if __name__ == "__main__":
    main()
