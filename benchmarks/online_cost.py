"""What an online measurement costs the caller's products, and where (#15).

For each matrix (generator spec or .mtx path, replicated block-diagonally to
``--replicate-to`` non-zeros) and dtype: an operator with the defaults on a new matrix
(tuning database empty, kernel cache warm: a first run fills it, then the programs in
memory are forgotten, as in a new process), then ``--products`` products on device
vectors, each waited for as in a solver loop.  The background measurement is made to
start after product ``--trigger`` (instead of the ski-rental rule's 12,000-19,000 at
20M non-zeros), so that it runs inside the loop.

Reported per case:

- ``base_us``: median product before the trigger; ``after_us``: median of the last 500;
- ``excess_ms``: what the products from the trigger on took beyond ``base_us`` each
  (the measurement's cost to the caller, before the gain of a switch);
- ``phases``: the same excess split by the measurement's steps (the snapshot's read
  back, the ranking, each candidate's build and timing, the finalists' re-timing, the
  rest of ``measure``, storing), with each step's wall time and the products in it;
- ``switches``, ``final`` and the candidates' kernel times as the measurement saw them.

    python benchmarks/online_cost.py --device nvidia --replicate-to 2e7 \\
        --json out.json astro-ph cage10 Groebner_id2003_aug wing
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyopencl.array as cla

import pyspmv_cl as psc
from pyspmv_cl import cache
from pyspmv_cl.bench.generators import replicate_to
from pyspmv_cl.bench.script_args import (
    check_matrices,
    device_or_error,
    dtypes_or_error,
    reference_dtype,
)
from pyspmv_cl.formats import builder
from pyspmv_cl.tuning import database, online, tuner


class Marks:
    """perf_counter stamps of the measurement's start and end and of its storing."""

    def __init__(self):
        self.stamps = {}
        measure, store = tuner.measure, tuner._store_decision

        def timed_measure(*args, **kwargs):
            self.stamps["measure called"] = time.perf_counter()
            try:
                return measure(*args, **kwargs)
            finally:
                self.stamps["measure returned"] = time.perf_counter()

        def timed_store(*args, **kwargs):
            try:
                return store(*args, **kwargs)
            finally:
                self.stamps["stored"] = time.perf_counter()

        tuner.measure, tuner._store_decision = timed_measure, timed_store


def phases(stamps, entry, trigger_time, times, walls, base):
    """The excess of the products in each step of the measurement."""
    began = stamps.get("measure called")
    if began is None:
        return []
    bounds = [("trigger", trigger_time), ("read-back+snapshot", began)]
    bounds += [(what, began + at) for what, at in (entry or {}).get("steps", [])]
    bounds += [("measure returned", stamps.get("measure returned", began)),
               ("stored", stamps.get("stored", began))]
    out = []
    for (_, a), (what, b) in zip(bounds, bounds[1:]):
        inside = (times >= a) & (times < b)
        out.append({"phase": what, "ms": round((b - a) * 1e3, 1),
                    "products": int(inside.sum()),
                    "excess_ms": round(float((walls[inside] - base).sum()) * 1e3, 1)})
    return out


def run_case(name, A, device, dtype, products, trigger, marks):
    queue = device.queue
    x = cla.to_device(queue, np.random.default_rng(0).uniform(-1, 1, A.shape[1]).astype(dtype))
    y = cla.empty(queue, A.shape[0], dtype)
    dirs = [tempfile.mkdtemp(prefix="pyspmv-online-cost-") for _ in range(2)]
    os.environ["PYSPMV_CL_TUNING_DIR"] = dirs[0]
    database.clear_memory()
    # tune="online": a matrix under the size where SpMV(A) measures is tuned online too.
    warm = psc.SpMV(A, device=device, tune="online")   # fills the kernel cache
    warm.matvec(x, out=y)
    warm.finish_tuning()
    del warm
    os.environ["PYSPMV_CL_TUNING_DIR"] = dirs[1]
    cache.clear_memory()
    builder.clear_memo()
    database.clear_memory()
    marks.stamps.clear()
    queue.finish()
    t0 = time.perf_counter()
    op = psc.SpMV(A, device=device, tune="online")
    op.matvec(x, out=y)
    queue.finish()
    setup = time.perf_counter() - t0
    times, walls = np.empty(products), np.empty(products)
    for i in range(products):
        t = time.perf_counter()
        op.matvec(x, out=y)
        queue.finish()
        times[i], walls[i] = t, time.perf_counter() - t
    tuning = op.tuning.online
    op.finish_tuning()
    for d in dirs:   # (the decisions are in the row)
        shutil.rmtree(d, ignore_errors=True)
    wide = reference_dtype(dtype)   # complex128 for complex values: keep imaginary parts
    ref = A.astype(wide) @ x.get().astype(wide)
    scale = float(np.max(abs(A).astype(np.float64) @ np.abs(x.get()))) or 1.0
    error = float(np.max(np.abs(y.get().astype(wide) - ref))) / scale
    base = float(np.median(walls[:trigger]))
    entry = tuning.decision.entry if tuning.decision is not None else None
    return {"matrix": name, "dtype": np.dtype(dtype).name, "nnz": int(A.nnz),
            "setup_ms": setup * 1e3, "base_us": base * 1e6,
            "after_us": float(np.median(walls[-500:])) * 1e6,
            "excess_ms": float((walls[trigger:] - base).sum()) * 1e3,
            "phases": phases(marks.stamps, entry, times[trigger - 1], times, walls, base),
            "switches": tuning.switches, "final": tuning.decision.format
            if tuning.decision is not None else None, "error": tuning.error,
            "rel_err": error,
            "candidates": [(c["format"], c["kernel_seconds"] * 1e6, c["conversion_seconds"])
                           for c in (entry or {}).get("candidates", [])],
            "skipped": (entry or {}).get("skipped")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+", help="generator specs, .mtx(.gz) paths or "
                    "names of the shared matrices")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--replicate-to", type=float, default=2e7,
                    help="replicate each matrix block-diagonally to at least this many "
                         "non-zeros (default 2e7, as in BENCHMARKS.md; 0: as given)")
    ap.add_argument("--products", type=int, default=10_000)
    ap.add_argument("--trigger", type=int, default=300,
                    help="product after which the measurement starts")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not 1 <= args.trigger < args.products - 500:
        ap.error("--trigger must leave at least 500 products after it")
    if not args.replicate_to >= 0:
        ap.error("--replicate-to must be a count >= 0")
    dtypes = dtypes_or_error(ap, args.dtypes)
    matrices = check_matrices(ap, args.specs)
    device = device_or_error(ap, args.device)
    online.trigger_calls = lambda *a, **k: args.trigger
    marks = Marks()
    rows = []
    for name, A in matrices:
        name, A = replicate_to(name, A, args.replicate_to, sep="x")
        for dtype in dtypes:
            row = run_case(name, A.astype(dtype), device, dtype, args.products,
                           args.trigger, marks)
            rows.append(row)
            print(f"{name} {dtype.name}: base {row['base_us']:.1f} us, after "
                  f"{row['after_us']:.1f}, excess {row['excess_ms']:.0f} ms, switches "
                  f"{row['switches']}, candidates "
                  + " ".join(f"{f} {k:.1f}" for f, k, _ in row["candidates"]),
                  flush=True)
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump({"device": device.profile.name, "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
