"""``op.update_values(data)`` against its target (#15): at most the upload of the values
plus two products.

For each matrix (replicated block-diagonally to ``--replicate-to`` non-zeros), dtype and
format, medians of ``--repeats`` wall times of:

- ``first``: the first ``update_values`` (it finds where the format stores each entry:
  one host conversion of the pattern), once;
- ``update``: later ``update_values(data)`` calls with fresh host values (returns when the
  device holds them);
- ``upload``: the plain upload of the same values (``enqueue_copy`` of ``nnz`` values
  into a device buffer, waited for), the floor of any update, timed alternately with
  ``update``;
- ``spmv``: one product on device vectors, waited for (``matvec`` then ``finish``).

The target holds when ``update <= upload + 2 * spmv`` (``budget`` column: the ratio of
``update`` to that bound, at most 1 to pass).  Every update is checked: the product after
it against scipy's with the new values.

    python benchmarks/update_values.py --device nvidia --replicate-to 2e7 \\
        --formats sell,csr-vector,coo,hyb,ell,ellr-t,csr5,bccoo --json out.json cage10 wing
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import pyspmv_cl as psc
from pyspmv_cl.bench.generators import replicate_to
from pyspmv_cl.bench.runner import wall_times
from pyspmv_cl.bench.script_args import (
    check_matrices,
    device_or_error,
    dtypes_or_error,
    positive_int,
    reference_dtype,
)

#: The shared matrices beside the checkout (PYSPMV_CL_MATRIX_DIR overrides).
MATRIX_DIR = Path(__file__).resolve().parents[2] / "shared" / "matrices"


def median_s(fn, repeats):
    """Median wall seconds of ``repeats`` calls of ``fn`` (after one warm-up)."""
    return statistics.median(wall_times(fn, repeats))


def bench(A, dtype, fmt, device, repeats, rng):
    A = A.astype(dtype)
    op = psc.SpMV(A, device=device, format=fmt)
    q = op.queue
    x = rng.standard_normal(A.shape[1]).astype(dtype)
    xd, yd = cla.to_device(q, x), cla.empty(q, A.shape[0], op.dtype)

    def spmv():
        op.matvec(xd, out=yd)
        q.finish()
    spmv()
    values = [rng.standard_normal(A.nnz).astype(dtype) for _ in range(2)]
    t0 = time.perf_counter()
    op.update_values(values[0])
    q.finish()
    first = time.perf_counter() - t0
    calls = iter(range(10**9))

    def update():
        op.update_values(values[next(calls) % 2])
    staging = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, max(1, values[0].nbytes))

    def upload():
        cl.enqueue_copy(q, staging, values[0], is_blocking=True)
    # Updates and uploads alternate: the upload's time moves by milliseconds from call
    # to call (pageable host memory), more than the two products the target allows.
    update_t, upload_t = [], []
    update()
    upload()
    for _ in range(repeats):
        for fn, times in ((update, update_t), (upload, upload_t)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    update_s, upload_s = statistics.median(update_t), statistics.median(upload_t)
    spmv_s = median_s(spmv, repeats)
    # The values now held: the last update's; check the product against scipy.
    last = values[(next(calls) - 1) % 2]
    B = A.copy()
    wide = reference_dtype(dtype)   # complex128 for complex values: keep imaginary parts
    B.data = last.astype(wide)
    spmv()
    want = B @ x.astype(wide)
    err = float(np.abs(yd.get().astype(wide) - want).max() / max(np.abs(want).max(), 1e-300))
    return {"format": op.format, "first_s": first, "update_s": update_s,
            "upload_s": upload_s, "spmv_s": spmv_s,
            "budget": update_s / (upload_s + 2 * spmv_s), "rel_err": err}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("matrices", nargs="+")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--formats", default="sell,csr-vector,coo,hyb,ell,csr5,bccoo")
    ap.add_argument("--replicate-to", type=float, default=0)
    ap.add_argument("--repeats", type=positive_int, default=9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not args.replicate_to >= 0:
        ap.error("--replicate-to must be a count >= 0")
    dtypes = [d.name for d in dtypes_or_error(ap, args.dtypes)]
    formats = args.formats.split(",")
    unknown = [f for f in formats if f not in (*psc.formats(), "auto")]
    if unknown:   # (else each case of it failed alone, one stderr line each, exit 0)
        ap.error(f"--formats: {', '.join(map(repr, unknown))} unknown; each of "
                 f"{', '.join(psc.formats())} or auto")
    matrices = check_matrices(ap, args.matrices, MATRIX_DIR)
    device = device_or_error(ap, args.device)
    rng = np.random.default_rng(0)
    print(f"device: {device}", flush=True)
    print(f"{'matrix':>24} {'dtype':>8} {'format':>10} {'first ms':>9} {'update ms':>9} "
          f"{'upload ms':>9} {'spmv ms':>8} {'budget':>6} {'rel err':>8}", flush=True)
    rows = []
    for name, A in matrices:
        name, A = replicate_to(name, A, args.replicate_to)
        for dtype in dtypes:
            for fmt in formats:
                try:
                    row = bench(A, dtype, fmt, device, args.repeats, rng)
                except psc.errors.PySpMVError as exc:
                    print(f"{name} {dtype} {fmt}: {type(exc).__name__}: {exc}"[:200],
                          file=sys.stderr)
                    continue
                row.update(matrix=name, nnz=int(A.nnz), dtype=dtype)
                rows.append(row)
                print(f"{name:>24} {dtype:>8} {row['format']:>10} {row['first_s'] * 1e3:9.2f} "
                      f"{row['update_s'] * 1e3:9.3f} {row['upload_s'] * 1e3:9.3f} "
                      f"{row['spmv_s'] * 1e3:8.3f} {row['budget']:6.2f} {row['rel_err']:8.1e}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "argv": sys.argv, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
