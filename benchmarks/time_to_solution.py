"""Time to solution: what a user waits for ``setup + N products`` on a new matrix.

    python benchmarks/time_to_solution.py --device 0:0 --out benchmarks/results/tts-cpu \\
        poisson2d:1000 random:1000000,10

For every matrix (generator specs or .mtx paths, as ``pyspmv-cl bench`` takes them) and
dtype, each contender is timed as a user calls it, in one process, the contenders taken
in a rotating order in every round:

- **setup**: from the scipy CSR on the host until the first product is done (for
  pyspmv_cl: ``SpMV(A, **kw)`` then one product; for a peer: building its matrix object
  from the scipy CSR, e.g. ``torch.sparse_csr_tensor`` or CuPy's ``csr_matrix``, then
  one product);
- **per product**: the median wall time of one call, with host vectors (``op @ x``,
  numpy in and out) or device vectors (``op.matvec(x_dev, out=y_dev)`` then
  ``queue.finish()``; CUDA peers: the call then a device synchronise).

``T(N) = setup + (N - 1) * per product`` for N = 1, 10, 100, 1,000, 10,000 (the first
product is inside the setup); with ``--direct``, T(N) is measured as N products in a row
after the setup, so an online tuning's switch lands where it would for a user.
pyspmv_cl runs under three states: kernel cache cold (a new, empty cache directory and
no program in memory) or warm (the directory filled by an earlier run, nothing in
memory: a new process), with the tuning database empty, or filled by the run before.
Results: JSON and a markdown table (``--out PREFIX``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import pyspmv_cl as psc
from pyspmv_cl import cache
from pyspmv_cl.bench.generators import replicate_to
from pyspmv_cl.bench.peers import available_peers
from pyspmv_cl.bench.script_args import check_matrices
from pyspmv_cl.formats import builder
from pyspmv_cl.tuning import database

NS = (1, 10, 100, 1000, 10000)
STATES = {"cold-empty": (False, False), "warm-empty": (True, False),
          "warm-filled": (True, True)}


class Environment:
    """Kernel-cache and tuning-database directories for each state."""

    def __init__(self, root):
        self.root = Path(root)
        self.warm_cache = self.root / "warm-cache"
        self.filled_db = self.root / "filled-db"
        self.count = 0

    def enter(self, warm_cache, filled_db):
        self.count += 1
        cache_dir = self.warm_cache if warm_cache else self.root / f"cold-{self.count}"
        db_dir = self.filled_db if filled_db else self.root / f"empty-db-{self.count}"
        os.environ["PYSPMV_CL_CACHE_DIR"] = str(cache_dir)
        os.environ["PYSPMV_CL_TUNING_DIR"] = str(db_dir)
        # A new process: nothing in memory, whatever is on disk.
        cache.clear_memory()
        builder.clear_memo()
        database.clear_memory()


def _sync_cuda():
    import cupy

    cupy.cuda.Device().synchronize()


def ours(A, x, device, dtype, kwargs, vectors):
    """(setup seconds, product callable) for pyspmv_cl with ``kwargs``."""
    if vectors == "device":
        import pyopencl.array as cla

        queue = device.queue
        x_dev = cla.to_device(queue, x.astype(dtype))
        y_dev = cla.empty(queue, A.shape[0], dtype)
        queue.finish()
        t0 = time.perf_counter()
        op = psc.SpMV(A, dtype=dtype, device=device, **kwargs)
        op.matvec(x_dev, out=y_dev)
        queue.finish()
        setup = time.perf_counter() - t0

        def product():
            op.matvec(x_dev, out=y_dev)
            queue.finish()
        return setup, product, op, lambda: y_dev.get()
    t0 = time.perf_counter()
    op = psc.SpMV(A, dtype=dtype, device=device, **kwargs)
    y = op @ x
    setup = time.perf_counter() - t0
    return setup, (lambda: op @ x), op, lambda: y


def peer(p, A, x, dtype):
    """(setup seconds, product callable) for a peer, from the scipy CSR."""
    if p.device == "cuda":
        import cupy

        x_dev = cupy.asarray(x.astype(dtype))
        _sync_cuda()
        t0 = time.perf_counter()
        f = p.builder(A, np.dtype(dtype))
        f(x_dev)
        _sync_cuda()
        setup = time.perf_counter() - t0

        def product():
            f(x_dev)
            _sync_cuda()
        return setup, product, lambda: cupy.asnumpy(f(x_dev))
    xh = x.astype(dtype)
    t0 = time.perf_counter()
    f = p.builder(A, np.dtype(dtype))
    y = f(xh)
    setup = time.perf_counter() - t0
    return setup, (lambda: f(xh)), lambda: np.asarray(y)


def median_wall(fn, min_count=5, min_time=0.2, max_count=200):
    fn()
    out, start = [], time.perf_counter()
    while len(out) < min_count or (time.perf_counter() - start < min_time
                                   and len(out) < max_count):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def relative_error(y, A, x):
    ref = A.astype(np.float64) @ x.astype(np.float64)
    scale = float(np.max(abs(A.astype(np.float64)) @ np.abs(x))) or 1.0
    return float(np.max(np.abs(np.asarray(y, dtype=np.float64) - ref))) / scale


def direct_times(product, n_max):
    """Wall seconds of products 2..N, cumulative, at each N of NS (the first product
    is inside the setup), as one run of ``n_max`` products in a row."""
    cumulative, start = {}, time.perf_counter()
    for i in range(2, n_max + 1):
        product()
        if i in NS:
            cumulative[i] = time.perf_counter() - start
    return cumulative


def run_case(name, A, device, dtype, configs, peers, states, rounds, vectors, env, log,
             direct=False):
    """Rows of one matrix and dtype.  ``direct``: T(N) measured as N products in a row
    after the setup (online tuning switches inside that run as it would for a user);
    otherwise T(N) = setup + (N - 1) x the median product right after the setup."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, A.shape[1])
    # Warm the shared cache and fill the database once per configuration; a format that
    # refuses this matrix (the ELL family on uneven rows) is left out, and said so.
    kept = []
    for label, kwargs in configs:
        env.enter(True, True)
        try:
            ours(A, x, device, dtype, kwargs, vectors)[2].finish_tuning()   # stores it
        except psc.FormatNotSuitableError as exc:
            log(f"  {name} {np.dtype(dtype).name} {label}: refused ({str(exc)[:100]})")
            continue
        kept.append((label, kwargs))
    configs = kept
    contenders = [("ours", label, kwargs, state) for label, kwargs in configs
                  for state in states] + [("peer", p.name, p, None) for p in peers]
    setups = {c[1:2] + (c[3],): [] for c in contenders}
    products, errors, chosen, totals = {}, {}, {}, {}
    for r in range(rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for kind, label, what, state in order:
            key = (label, state)
            op = None
            timed = key not in products   # this round times the products (the first)
            if kind == "ours":
                env.enter(*STATES[state])
                setup, product, op, result = ours(A, x, device, dtype, what, vectors)
                if timed:
                    chosen[key] = (f"{op.format} ({op.tuning.source})" if op.tuning
                                   else op.format)
            else:
                setup, product, result = peer(what, A, x, dtype)
            setups[key].append(setup)
            if timed:
                if direct:
                    cumulative = direct_times(product, NS[-1])
                    totals[key] = cumulative
                    products[key] = ((cumulative[NS[-1]] - cumulative[NS[-2]])
                                     / (NS[-1] - NS[-2]))
                else:
                    products[key] = median_wall(product)
                errors[key] = relative_error(result(), A, x)
            if op is not None and op.tuning is not None and op.tuning.online is not None:
                online = op.tuning.online
                if direct and timed:
                    chosen[key] += "".join(f" -> {fmt} at product {at}"
                                           for at, fmt in online.switches) \
                        or f" ({online.state})"
                op.finish_tuning()   # no tuning thread left running into the next contender
            log(f"  {name} {np.dtype(dtype).name} {label} {state or ''}: setup "
                f"{setup * 1e3:.1f} ms, product {products[key] * 1e6:.1f} us "
                f"{chosen.get(key) or ''}")
    rows = []
    for (label, state), values in setups.items():
        setup, per = statistics.median(values), products[(label, state)]
        if (label, state) in totals:
            cumulative = totals[(label, state)]
            T = {str(n): setup + cumulative.get(n, 0.0) for n in NS}
        else:
            T = {str(n): setup + (n - 1) * per for n in NS}
        rows.append({"matrix": name, "rows": A.shape[0], "nnz": int(A.nnz),
                     "dtype": np.dtype(dtype).name, "impl": label, "state": state,
                     "chosen": chosen.get((label, state)), "setup_seconds": setup,
                     "setup_samples": values, "product_seconds": per,
                     "rel_err": errors[(label, state)], "direct": direct, "T": T})
    return rows


def table(env_info, rows):
    lines = [f"device: {env_info['device']}; vectors: {env_info['vectors']}; "
             f"{env_info['date']}", "",
             "| matrix | nnz | dtype | impl | state | chosen | setup ms | product us | "
             + " | ".join(f"T({n}) ms" for n in NS) + " | best peer T / ours T |",
             "|---|---:|---|---|---|---|---:|---:|" + "---:|" * len(NS) + "---|"]
    for r in rows:
        peers_here = [p for p in rows if p["matrix"] == r["matrix"] and p["dtype"] == r["dtype"]
                      and p["state"] is None]
        ratio = ""
        if r["state"] is not None and peers_here:
            ratio = " ".join(f"{min(p['T'][str(n)] for p in peers_here) / r['T'][str(n)]:.2f}"
                             for n in NS)
        lines.append(
            f"| {r['matrix']} | {r['nnz']} | {r['dtype']} | {r['impl']} | {r['state'] or 'peer'} "
            f"| {r['chosen'] or ''} | {r['setup_seconds'] * 1e3:.1f} | "
            f"{r['product_seconds'] * 1e6:.1f} | "
            + " | ".join(f"{r['T'][str(n)] * 1e3:.1f}" for n in NS) + f" | {ratio} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+", help="generator specs, .mtx(.gz) paths or names "
                    "of the shared matrices (PYSPMV_CL_MATRIX_DIR)")
    ap.add_argument("--device", default=None,
                    help="a selection, or 'default': SpMV(A) chooses, as for a user who "
                    "gives none (with POCL_DEVICES='pthread basic': the driver by size)")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--formats", default="auto",
                    help="comma list: 'auto' (the defaults), 'auto:budget=1.5' (tune_budget="
                         "1.5 s), 'auto:1000' (expected_calls="
                         "1000) or format names")
    ap.add_argument("--peers", default=None, help="comma list (default: every available)")
    ap.add_argument("--states", default="cold-empty,warm-empty,warm-filled")
    ap.add_argument("--vectors", choices=("host", "device"), default="host")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--direct", action="store_true",
                    help="measure T(N) as N products in a row (GPUs: seconds per contender)")
    ap.add_argument("--replicate-to", type=float, default=0,
                    help="replicate each matrix block-diagonally to at least this many "
                         "non-zeros (e.g. 2e7)")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    args = ap.parse_args(argv)
    chooses = args.device == "default"
    if chooses and args.vectors == "device":
        ap.error("--device default multiplies host vectors: device vectors need a device")
    if args.rounds < 1 or not args.replicate_to >= 0:
        ap.error("--rounds must be at least 1 and --replicate-to a count >= 0")
    try:
        device = psc.get_device(None if chooses else args.device)
    except psc.PySpMVError as exc:   # (one line: the devices available are listed on more)
        ap.error(" ".join(str(exc).split()))
    if any(d not in ("float32", "float64") for d in args.dtypes.split(",")):
        ap.error(f"--dtypes {args.dtypes!r}: float32 and/or float64")
    dtypes = [np.dtype(d) for d in args.dtypes.split(",")]
    configs = []
    for item in args.formats.split(","):
        try:
            if item == "auto":
                configs.append(("auto", {}))
            elif item.startswith("auto:budget="):
                configs.append((item, {"tune_budget": float(item[12:])}))
            elif item.startswith("auto:"):
                configs.append((item, {"expected_calls": int(item[5:])}))
            elif item in psc.formats():
                configs.append((item, {"format": item}))
            else:
                raise ValueError
        except ValueError:
            ap.error(f"--formats: {item!r} is none of auto, auto:budget=SECONDS, auto:CALLS "
                     f"or {', '.join(psc.formats())}")
    states = args.states.split(",")
    if not set(states) <= set(STATES):
        ap.error(f"--states: each of {', '.join(STATES)}, not {args.states!r}")
    try:
        detected = available_peers(args.peers.split(",") if args.peers else None)
    except ValueError as exc:
        ap.error(str(exc))
    peers = [p for p in detected if p.available
             and (p.device != "cuda" or device.profile.is_gpu)]
    if args.vectors == "host":
        peers = [p for p in peers if p.device != "cuda"]

    # Every matrix loaded up front: a bad spec is an error before any case runs.
    matrices = check_matrices(ap, args.specs)

    def log(text):
        print(text, file=sys.stderr, flush=True)

    for p in detected:
        if not p.available:
            log(f"peer {p.name} unavailable: {p.reason}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pyspmv-tts-") as root:
        env = Environment(root)
        for label, A in matrices:
            name, A = replicate_to(label, A, args.replicate_to, sep="x")
            for dtype in dtypes:
                if dtype == np.float64 and not device.profile.fp64:
                    continue
                rows += run_case(name, A.astype(dtype), None if chooses else device, dtype,
                                 configs, peers, states,
                                 args.rounds, args.vectors, env, log, direct=args.direct)
                save(args, device, chooses, rows)   # after each case: a cut run keeps them
    print(save(args, device, chooses, rows))


def save(args, device, chooses, rows):
    """Write the results so far (``--out``); returns the markdown table."""
    info = {"device": "SpMV(A)'s choice" if chooses else device.profile.name,
            "vectors": args.vectors,
            "pyspmv_cl": psc.__version__, "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(sys.argv)}
    text = table(info, rows)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps({"environment": info, "results": rows},
                                                       indent=1))
        Path(args.out + ".md").write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
