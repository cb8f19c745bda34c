"""Reduced-precision value storage (``value_bits``, #18): its error against float64 and
its speed, per matrix and format.

For each matrix (generator specs or names of ``shared/matrices/*.mtx.gz``, read from
there; ``--replicate-to`` replicates it block-diagonally) and format, four operators:
float32 (``f32``), float32 with ``value_bits=16`` (``f32/h``: half values, float32
sums), float64 with ``value_bits=32`` (``f64/s``: float32 values, float64 sums), and
float64 (``f64``).  For one x of standard normal entries (the same for all), with
``y64 = A @ x`` computed by scipy in float64 and ``s = |A| |x|`` (entry-wise absolute
values, float64), each operator's ``y`` gives

- ``err``  = max_i |y_i - y64_i| / max_i s_i  (the error relative to the largest row
  magnitude: ``||y - y64||_inf / || |A| |x| ||_inf``), and
- ``rerr`` = max_i |y_i - y64_i| / s_i over rows with s_i > 0  (every row relative to
  its own magnitude: the bound the rounding analysis gives row by row).

Storing a value in p significant bits rounds it by a relative 2^-p at most (half: 2^-11
= 4.9e-4; float32: 2^-24 = 6.0e-8), so ``rerr`` of ``f32/h`` is at most 2^-11 plus
float32's accumulation error (about n_row * 6e-8 at worst, sqrt(n_row) * 6e-8 typically),
unless values fall under half's normal range (6.1e-5, then subnormal, under 3e-8 zero):
the ``subnormal`` column counts the values stored below it.

Times, medians of ``--repeats``: ``kernel_us`` (device time of the product's kernels,
profiling events) and ``wall_us`` (``matvec`` on device vectors, waited for), and the
device bytes of the operator (``MiB``).  For a run on a GPU:

    python benchmarks/value_bits.py --device nvidia --replicate-to 2e7 --json vb.json \\
        cage10 astro-ph wing poisson2d:1000 random:200000,16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pyopencl.array as cla
import scipy.sparse as sp

import pyspmv_cl as psc
from pyspmv_cl.bench.generators import replicate_to
from pyspmv_cl.bench.runner import wall_times
from pyspmv_cl.bench.script_args import check_matrices, device_or_error, positive_int
from pyspmv_cl.launching import launches_seconds

#: The shared matrices beside the checkout (PYSPMV_CL_MATRIX_DIR overrides).
MATRIX_DIR = Path(__file__).resolve().parents[2] / "shared" / "matrices"

#: (label, dtype, value_bits): value_bits None is the dtype's own width.
MODES = (("f32", np.float32, None), ("f32/h", np.float32, 16),
         ("f64/s", np.float64, 32), ("f64", np.float64, None))
HALF_TINY = 2.0**-14   # half's smallest normal value


def errors(y, y64, scale):
    diff = np.abs(np.asarray(y, dtype=np.float64) - y64)
    top = scale.max() if scale.size else 0.0
    rows = scale > 0
    return (float(diff.max() / top) if top > 0 else 0.0,
            float((diff[rows] / scale[rows]).max()) if rows.any() else 0.0)


def bench(A, fmt, dtype, bits, device, x, repeats):
    params = {} if bits is None else {"value_bits": bits}
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device, **params)
    q = op.queue
    xd = cla.to_device(q, x.astype(dtype))
    yd = cla.empty(q, A.shape[0], dtype)

    def product():
        op.matvec(xd, out=yd)

    def waited():
        product()
        q.finish()
    waited()
    kernel = statistics.median(launches_seconds(product) for _ in range(repeats))
    return op, yd.get(), kernel, statistics.median(wall_times(waited, repeats))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("matrices", nargs="+", help="generator specs or shared matrix names")
    ap.add_argument("--device", default=None, help="pyspmv_cl device selection (P:D, ...)")
    ap.add_argument("--formats", default="sell,csr-vector")
    ap.add_argument("--replicate-to", type=float, default=0)
    ap.add_argument("--repeats", type=positive_int, default=11)
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args(argv)
    if not args.replicate_to >= 0:
        ap.error("--replicate-to must be a count >= 0")
    # Bad arguments stop here, one line each, before any measuring.
    matrices = check_matrices(ap, args.matrices, MATRIX_DIR)
    # Kernels are timed by their profiling events: the device's profiling queue.
    device = device_or_error(ap, args.device).profiling_device()
    rng = np.random.default_rng(0)
    print(f"device: {device.profile.name}", flush=True)
    print(f"{'matrix':>22} {'nnz':>9} {'format':>10} {'mode':>6} {'err':>8} {'rerr':>8} "
          f"{'kernel us':>10} {'wall us':>9} {'MiB':>7}", flush=True)
    rows = []
    for name, A in matrices:
        name, A = replicate_to(name, A, args.replicate_to)
        A = sp.csr_matrix(A, dtype=np.float64)
        x = rng.standard_normal(A.shape[1])
        y64 = A @ x
        mags = sp.csr_matrix((np.abs(A.data), A.indices, A.indptr), shape=A.shape)
        scale = mags @ np.abs(x)
        nz = A.data[A.data != 0]
        subnormal = int(np.count_nonzero(np.abs(nz) < HALF_TINY))
        for fmt in args.formats.split(","):
            for label, dtype, bits in MODES:
                if dtype == np.float64 and not device.profile.fp64:
                    continue
                try:
                    op, y, kernel, wall = bench(A, fmt, dtype, bits, device, x, args.repeats)
                except psc.errors.PySpMVError as exc:
                    print(f"{name} {fmt} {label}: {type(exc).__name__}: {exc}"[:200],
                          file=sys.stderr)
                    continue
                err, rerr = errors(y, y64, scale)
                row = {"matrix": name, "nnz": int(A.nnz), "format": fmt, "mode": label,
                       "dtype": np.dtype(dtype).name, "value_bits": op.params.get(
                           "value_bits", 8 * np.dtype(dtype).itemsize),
                       "err": err, "rerr": rerr, "kernel_us": kernel * 1e6,
                       "wall_us": wall * 1e6, "nbytes": int(op.nbytes),
                       "subnormal": subnormal, "params": {k: str(v) for k, v in
                                                          op.params.items()}}
                rows.append(row)
                print(f"{name[:22]:>22} {A.nnz:9d} {fmt:>10} {label:>6} {err:8.1e} "
                      f"{rerr:8.1e} {row['kernel_us']:10.1f} {row['wall_us']:9.1f} "
                      f"{op.nbytes / 2**20:7.2f}", flush=True)
        if subnormal:
            print(f"{'':>22} ({subnormal} values under half's normal range, 6.1e-5)",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.profile.name, "argv": sys.argv, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
