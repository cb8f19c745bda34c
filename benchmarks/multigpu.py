"""Distributed SpMV and CG at scale: each rank generates its own rows, one rank per
device; strong and weak scaling, per-phase times, the rates the model needs.

Run once per rank count under MPI, e.g. on a host with 2 GPUs:

    for n in 1 2; do mpiexec -n $n python benchmarks/multigpu.py \\
        stencil:400e6 powerlaw:400e6 --json results.jsonl; done
    python benchmarks/multigpu.py --model results.jsonl     # no MPI: the model

Matrices (``bench.row_blocks``; rows do not depend on the rank count):
``stencil:NNZ`` the 7-point Laplacian on the n^3 grid with about NNZ non-zeros, split
into equal row slabs; ``powerlaw:NNZ[,AVG]`` a power-law graph (mean AVG = 16 entries
per row) split into blocks of equal non-zeros.

Per matrix and rank count: generation and setup (``psd.SpMV(...)`` until the first
product is done), then ``--repeat`` products ``op.matvec(x, out=y)`` with device
vectors and the queue finished (the wall time a solver sees), the slowest rank's
median phases from ``op.timings`` (pack, exchange, local = diagonal kernels from
events, offdiag, hidden = overlap), and ``--cg`` CG iterations on the stencil (SPD).
With one rank on an NVIDIA GPU the same products and CG go through cuSPARSE (CuPy) on
the same matrix, in the same process, interleaved.  ``--rates`` adds what the model
needs beyond the products: host<->device copies and an MPI ping-pong (2+ ranks).
"""

import argparse
import inspect
import json
import os
import platform
import sys
import time

import numpy as np

from pyspmv_cl.bench.script_args import nonnegative_int, positive_int


def parse_matrix(spec):
    kind, _, rest = spec.partition(":")
    args = [float(a) for a in rest.split(",") if a]
    if kind not in ("stencil", "powerlaw") or not args:
        raise SystemExit(f"bad matrix spec {spec!r}: stencil:NNZ or powerlaw:NNZ[,AVG]")
    return kind, args


def layout(kind, args, size, rank):
    """(global n, own row range, generator of the own rows)."""
    from pyspmv_cl.bench.row_blocks import poisson3d_rows, power_law_lengths, power_law_rows
    from pyspmv_cl.distributed.plan import partition_rows

    if kind == "stencil":
        g = max(2, round((args[0] / 7) ** (1 / 3)))
        n = g**3
        offsets = np.linspace(0, n, size + 1).round().astype(np.int64)
        a, b = int(offsets[rank]), int(offsets[rank + 1])
        return n, (a, b), {"grid": g}, lambda: poisson3d_rows(g, a, b)
    avg = args[1] if len(args) > 1 else 16.0
    n = int(args[0] / avg)
    lengths = power_law_lengths(n, np.arange(n), avg, 2.2, 65536)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    offsets = partition_rows(indptr, size, "nnz")
    a, b = int(offsets[rank]), int(offsets[rank + 1])
    return n, (a, b), {"avg_degree": avg}, lambda: power_law_rows(n, a, b, avg_degree=avg)


def timed(fn, queue=None):
    t0 = time.perf_counter()
    out = fn()
    if queue is not None:
        queue.finish()
    return out, time.perf_counter() - t0


def copy_rates(queue, sizes=(1 << 13, 1 << 26), repeat=20):
    """Median seconds of blocking host->device and device->host copies of each size,
    to and from pinned staging arrays (what the operator uses: ``h2d``, ``d2h``) and
    ordinary numpy arrays (``*_pageable``)."""
    import pyopencl as cl

    from pyspmv_cl.distributed.operator import _pinned

    out = {"sizes": list(sizes)}
    for nbytes in sizes:
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, nbytes)
        for suffix, host in (("", _pinned(queue, nbytes, np.uint8)),
                             ("_pageable", np.ones(nbytes, np.uint8))):
            for key, src, dst in (("h2d", host, buf), ("d2h", buf, host)):
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    cl.enqueue_copy(queue, dst, src, is_blocking=True)
                    times.append(time.perf_counter() - t0)
                out.setdefault(key + suffix, []).append(float(np.median(times)))
    return out


def mpi_rates(comm, sizes=(1 << 13, 1 << 26), repeat=20):
    """Ping-pong between ranks 0 and 1: median one-way seconds per size (rank 0)."""
    out = {"sizes": list(sizes), "one_way": []}
    for nbytes in sizes:
        buf = np.ones(nbytes, np.uint8)
        times = []
        for _ in range(repeat):
            comm.Barrier()
            t0 = time.perf_counter()
            if comm.rank == 0:
                comm.Send(buf, 1, 3)
                comm.Recv(buf, 1, 3)
            elif comm.rank == 1:
                comm.Recv(buf, 0, 3)
                comm.Send(buf, 0, 3)
            times.append((time.perf_counter() - t0) / 2)
        out["one_way"].append(float(np.median(times)))
    return out


def run_matrix(spec, args, comm, MPI):
    import pyopencl.array as cla

    import pyspmv_cl.distributed as psd

    kind, margs = parse_matrix(spec)
    rank, size = comm.rank, comm.size
    dtype = np.dtype(args.dtype)
    n, (a, b), info, generate = layout(kind, margs, size, rank)
    comm.Barrier()
    A_local, t_gen = timed(generate)
    A_local.data = A_local.data.astype(dtype, copy=False)
    fmt = args.stencil_format if kind == "stencil" else args.powerlaw_format
    comm.Barrier()
    t0 = time.perf_counter()
    op = psd.SpMV(A_local, comm, row_start=a, shape=(n, n), format=fmt,
                  offdiag_format=args.offdiag_format, dtype=dtype)
    x = cla.to_device(op.queue, np.random.default_rng(rank).uniform(-1, 1, b - a).astype(dtype))
    y = cla.empty(op.queue, b - a, dtype)
    op.matvec(x, out=y)
    op.queue.finish()
    t_setup = time.perf_counter() - t0
    check = _check(A_local, op, x, y, comm, MPI)
    nnz_local = A_local.nnz
    peer = None
    if size == 1 and args.peer:
        peer = _cusparse_peer(A_local, x, dtype)
    del A_local

    def ours():
        op.matvec(x, out=y)
        op.queue.finish()
    walls, peer_walls = [], []
    for _ in range(args.warmup):
        ours()
    op.timings.clear()
    for _ in range(args.repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        ours()
        walls.append(time.perf_counter() - t0)
        if peer is not None:
            t0 = time.perf_counter()
            peer["product"]()
            peer_walls.append(time.perf_counter() - t0)
    anatomy = _anatomy(op, x, y, comm, args.repeat)
    slowest_wall = np.empty(len(walls))
    comm.Allreduce(np.array(walls), slowest_wall, op=MPI.MAX)
    keys = list(op.timings[0])
    mine = np.array([[t[k] for k in keys] for t in op.timings])
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    phases = dict(zip(keys, np.median(slowest, axis=0).tolist()))

    cg = None
    if kind == "stencil" and args.cg:
        b_vec = cla.to_device(op.queue, np.ones(b - a, dtype))
        psd.cg(op, b_vec, tol=0.0, maxiter=3)     # kernels built
        comm.Barrier()
        _, t_cg = timed(lambda: psd.cg(op, b_vec, tol=0.0, maxiter=args.cg), op.queue)
        cg = {"iterations": op.cg_stats["iterations"], "seconds": t_cg,
              "iterations_per_s": op.cg_stats["iterations"] / t_cg}
        if peer is not None:
            try:
                cg["cusparse"] = peer["cg"](args.cg)
            except Exception as exc:   # a peer's failure must not lose our numbers
                cg["cusparse"] = f"failed: {type(exc).__name__}: {exc}"

    plan = op.comm_plan
    load = {"rank": rank, "rows": b - a, "nnz_diag": op.local_nnz[0],
            "nnz_off": op.local_nnz[1], "n_send": int(plan.n_send),
            "n_ghosts": int(plan.n_ghosts), "neighbours": len(plan.neighbours),
            "generate_s": t_gen, "setup_s": t_setup}
    loads = comm.gather(load, root=0)
    nnz = comm.allreduce(nnz_local)
    row = None
    if rank == 0:
        row = {"matrix": spec, "kind": kind, "n": n, **info, "nnz": nnz, "ranks": size,
               "dtype": dtype.name, "format": list(op.format),
               "device": op.device.cl_device.name.strip(),
               "wall_per_product_s": float(np.median(slowest_wall)),
               "wall_p10_p90_s": np.percentile(slowest_wall, [10, 90]).tolist(),
               "gflops": 2 * nnz / float(np.median(slowest_wall)) * 1e-9,
               **{f"{k}_s": v for k, v in phases.items()},
               "setup_s": max(r["setup_s"] for r in loads),
               "generate_s": max(r["generate_s"] for r in loads),
               "max_rel_error": check, "loads": loads, "cg": cg, "anatomy": anatomy}
        if peer is not None:
            row["cusparse_wall_per_product_s"] = float(np.median(peer_walls))
            row["cusparse_setup_s"] = peer["setup_s"]
        print(op.describe() if size > 1 else "", flush=True)
    else:
        op.describe()
    if args.rates:
        rates = {"copies": copy_rates(op.queue)}
        if size > 1:
            rates["mpi"] = mpi_rates(comm)
        if row is not None:
            row["rates"] = rates
    op.free()
    return row


def _anatomy(op, x, y, comm, repeat):
    """Where a product's wall time goes (rank 0's medians, ms): each kernel launched
    through pyspmv_cl as (name, start, end) from the first kernel's start (profiling
    events; the exchange's copies and the scatter-add are not recorded), and the wall
    time of the call with the queue finished."""
    from pyspmv_cl.launching import record_launches

    walls, spans, names = [], [], None
    for _ in range(max(5, repeat // 3)):
        comm.Barrier()
        t0 = time.perf_counter()
        with record_launches(with_names=True) as events:
            op.matvec(x, out=y)
        op.queue.finish()
        walls.append(time.perf_counter() - t0)
        if events:
            first = events[0][1].profile.start
            names = [name for name, _ in events]
            spans.append([((e.profile.start - first) * 1e-6, (e.profile.end - first) * 1e-6)
                          for _, e in events])
    if not spans or any(len(sp_) != len(names) for sp_ in spans):
        return None
    med = np.median(np.array(spans), axis=0)
    return {"wall_ms": float(np.median(walls)) * 1e3,
            "kernels_ms": [[n, round(float(a), 4), round(float(b), 4)]
                           for n, (a, b) in zip(names, med)]}


def _check(A_local, op, x, y, comm, MPI):
    """Largest relative error of this product against scipy in float64 on 1-2% of the
    rows (all rows would double the host time of a 400M run), over all ranks."""
    m = A_local.shape[0]
    rows = np.random.default_rng(comm.rank).choice(m, size=min(m, 200_000), replace=False) \
        if m else np.zeros(0, int)
    xs = np.concatenate(comm.allgather(x.get().astype(np.float64)))
    sub = A_local[rows]
    want = sub.astype(np.float64) @ xs
    scale = abs(sub.astype(np.float64)) @ abs(xs)
    got = y.get()[rows].astype(np.float64)
    err = float(np.max(np.abs(got - want) / np.maximum(scale, 1e-300))) if m else 0.0
    return comm.allreduce(err, op=MPI.MAX)


def _cusparse_peer(csr, x, dtype):
    """cuSPARSE (CuPy) on the same matrix: setup from the host CSR, products, CG."""
    try:
        import cupy
        import cupyx.scipy.sparse.linalg as cla_linalg

        from pyspmv_cl.bench.peers import _cusparse_builder
    except ImportError:
        return None
    xc = cupy.asarray(x.get())
    cupy.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    f = _cusparse_builder(csr, dtype)
    f(xc)
    cupy.cuda.runtime.deviceSynchronize()
    setup = time.perf_counter() - t0

    def product():
        f(xc)
        cupy.cuda.runtime.deviceSynchronize()

    def cg(iters):
        import cupyx.scipy.sparse as csp

        A = csp.csr_matrix(csr)
        b = cupy.ones(csr.shape[0], dtype)
        # CuPy 14 names the tolerance rtol, older releases tol.
        tol = {"rtol": 0.0} if "rtol" in inspect.signature(cla_linalg.cg).parameters \
            else {"tol": 0.0}
        cla_linalg.cg(A, b, maxiter=3, **tol)
        cupy.cuda.runtime.deviceSynchronize()
        t = time.perf_counter()
        count = [0]
        cla_linalg.cg(A, b, maxiter=iters, **tol,
                      callback=lambda _: count.__setitem__(0, count[0] + 1))
        cupy.cuda.runtime.deviceSynchronize()
        seconds = time.perf_counter() - t
        return {"iterations": count[0], "seconds": seconds,
                "iterations_per_s": count[0] / seconds}
    return {"setup_s": setup, "product": product, "cg": cg}


def model_report(path):
    from pyspmv_cl.distributed import model as dm

    rows = [json.loads(line) for line in open(path) if line.strip()]
    rates_rows = [r for r in rows if r.get("rates")]
    if not rates_rows:
        raise SystemExit(f"{path}: no line with measured rates (run with --rates)")
    copies = rates_rows[-1]["rates"]["copies"]
    h2d = dm.fit_line(copies["sizes"], copies["h2d"])
    d2h = dm.fit_line(copies["sizes"], copies["d2h"])
    mpi_rows = [r for r in rates_rows if "mpi" in r["rates"]]
    mpi = dm.fit_line(mpi_rows[-1]["rates"]["mpi"]["sizes"],
                      mpi_rows[-1]["rates"]["mpi"]["one_way"]) if mpi_rows else (0.0, 0.0)
    for kind in ("h2d_pageable", "d2h_pageable"):
        if kind in copies:
            lat, rate = dm.fit_line(copies["sizes"], copies[kind])
            print(f"(not used: {kind} {lat * 1e6:.1f} us + {1e-9 / max(rate, 1e-30):.1f} GB/s)")
    print(f"copies: h2d {h2d[0] * 1e6:.1f} us + {1e-9 / max(h2d[1], 1e-30):.1f} GB/s, "
          f"d2h {d2h[0] * 1e6:.1f} us + {1e-9 / max(d2h[1], 1e-30):.1f} GB/s; MPI "
          f"{mpi[0] * 1e6:.1f} us + {1e-9 / max(mpi[1], 1e-30):.1f} GB/s")
    out = []
    for kind in ("stencil", "powerlaw"):
        ones = [r for r in rows if r["kind"] == kind and r["ranks"] == 1]
        if not ones:
            continue
        lat, per_nnz = dm.fit_line([r["nnz"] for r in ones], [r["local_s"] for r in ones])
        overhead = float(np.median([r["total_s"] - r["local_s"] for r in ones]))
        rates = dm.Rates(kernel_latency=lat, kernel_per_nnz=per_nnz, d2h_latency=d2h[0],
                         d2h_per_byte=d2h[1], h2d_latency=h2d[0], h2d_per_byte=h2d[1],
                         mpi_latency=mpi[0], mpi_per_byte=mpi[1], overhead=overhead)
        vb = np.dtype(ones[0]["dtype"]).itemsize
        print(f"\n{kind}: kernel {lat * 1e6:.0f} us + {per_nnz * 1e12:.2f} ps/nnz, "
              f"overhead {overhead * 1e6:.0f} us")
        print(f"{'matrix':>16} {'ranks':>5} {'measured ms':>11} {'model ms':>9} "
              f"{'exch meas':>9} {'exch model':>10}")
        for r in rows:
            if r["kind"] != kind:
                continue
            loads = [dm.RankLoad(q["nnz_diag"], q["nnz_off"], q["n_send"], q["n_ghosts"],
                                 q["neighbours"]) for q in r["loads"]]
            p = dm.predict(loads, rates, vb)
            print(f"{r['matrix']:>16} {r['ranks']:>5} {r['wall_per_product_s'] * 1e3:>11.3f} "
                  f"{p['total'] * 1e3:>9.3f} {r['exchange_s'] * 1e3:>9.3f} "
                  f"{p['exchange'] * 1e3:>10.3f}")
            out.append({"matrix": r["matrix"], "ranks": r["ranks"],
                        "measured_s": r["wall_per_product_s"], "model_s": p["total"]})
        print(f"prediction, 1e9 non-zeros ({kind}): devices, product ms, speed-up over 1")
        nnz = 1e9
        for p_ranks in (1, 2, 8, 64):
            if kind == "stencil":
                g = round((nnz / 7) ** (1 / 3))
                loads = dm.stencil_loads(g, p_ranks)
            else:
                avg = ones[0].get("avg_degree", 16.0)
                loads = dm.power_law_loads(int(nnz / avg), p_ranks, avg)
            t = dm.predict(loads, rates, vb)
            if p_ranks == 1:
                t1 = t["total"]
            print(f"{p_ranks:>8} {t['total'] * 1e3:>10.3f} {t1 / t['total']:>8.2f}  "
                  f"(exchange {t['exchange'] * 1e3:.3f} ms, ghosts/rank "
                  f"{max(q.n_ghosts for q in loads):.3g})")
            out.append({"prediction": kind, "nnz": nnz, "ranks": p_ranks, "model_s": t["total"],
                        "exchange_s": t["exchange"], "speedup": t1 / t["total"]})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("matrices", nargs="*", default=["stencil:2e6", "powerlaw:2e6"])
    parser.add_argument("--repeat", type=positive_int, default=30)
    parser.add_argument("--warmup", type=nonnegative_int, default=3)
    parser.add_argument("--cg", type=nonnegative_int, default=50,
                        help="CG iterations (0: none)")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--stencil-format", default="sell")
    parser.add_argument("--powerlaw-format", default="csr-vector")
    parser.add_argument("--offdiag-format", default="csr-vector")
    parser.add_argument("--no-peer", dest="peer", action="store_false",
                        help="skip cuSPARSE on one rank")
    parser.add_argument("--rates", action="store_true", help="measure copy and MPI rates")
    parser.add_argument("--json", help="append one JSON line per matrix to this file")
    parser.add_argument("--model", metavar="JSONL", help="print the model against the "
                        "measurements in this file (no MPI) and exit")
    args = parser.parse_args()
    for spec in args.matrices:   # every rank checks them before any MPI call
        parse_matrix(spec)
    if args.model:
        model_report(args.model)
        return
    from mpi4py import MPI

    import pyspmv_cl

    comm = MPI.COMM_WORLD
    for spec in args.matrices:
        row = run_matrix(spec, args, comm, MPI)
        if comm.rank == 0:
            row.update(python=sys.version.split()[0], pyspmv_cl=pyspmv_cl.__version__,
                       mpi=MPI.Get_library_version().splitlines()[0][:60],
                       host=platform.node(), cpus=os.cpu_count())
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items() if k not in ("loads", "rates")),
                  flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
