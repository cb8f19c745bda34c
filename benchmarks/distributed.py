"""Strong scaling of the distributed product (pyspmv_cl.distributed) on this machine.

Run under MPI, once per rank count, e.g.

    for n in 1 2; do POCL_MAX_PTHREAD_COUNT=1 mpiexec -n $n python benchmarks/distributed.py \
        poisson2d:700 powerlaw:300000,8; done

Per matrix: the global matrix built on rank 0, scattered by ``from_global``
(non-zero balanced), ``--repeat`` products after ``--warmup``; rank 0 prints the
medians over products of the slowest rank's time per phase (``op.timings``: pack,
exchange, local, offdiag, total, hidden).  On a 2-core machine with PoCL ranks
(``POCL_MAX_PTHREAD_COUNT=1`` each) these numbers are noisy: the ranks share the
cores (and the memory bus) with each other and with anything else running.
"""

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI

import pyspmv_cl.distributed as psd
from pyspmv_cl.bench.generators import from_spec
from pyspmv_cl.bench.script_args import nonnegative_int, positive_int, resolve_matrix


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("matrices", nargs="*", default=["poisson2d:700"])
    parser.add_argument("--repeat", type=positive_int, default=50)
    parser.add_argument("--warmup", type=nonnegative_int, default=5)
    parser.add_argument("--format", default="csr-scalar")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="node-local")
    parser.add_argument("--json", help="append one JSON line per matrix to this file")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    for spec in args.matrices:
        A, error = None, None
        if comm.rank == 0:
            try:
                A = from_spec(resolve_matrix(spec))[1]
            except ValueError as exc:   # a bad spec: every rank stops, one message
                error = str(exc).splitlines()[0]
        error = comm.bcast(error, root=0)
        if error is not None:
            if comm.rank == 0:
                print(f"{parser.prog}: error: {error}", file=sys.stderr, flush=True)
            sys.exit(2)
        op = psd.SpMV.from_global(A, comm, dtype=np.dtype(args.dtype), format=args.format,
                                  offdiag_format=args.format, device=args.device)
        x = np.ones(op.local_shape[1], dtype=op.dtype)
        y = np.empty(op.local_shape[0], dtype=op.dtype)
        for _ in range(args.warmup):
            op.matvec(x, out=y)
        op.timings.clear()
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.repeat):
            op.matvec(x, out=y)
        comm.Barrier()
        wall = (time.perf_counter() - t0) / args.repeat
        keys = list(op.timings[0])
        mine = np.array([[t[k] for k in keys] for t in op.timings])
        slowest = np.empty_like(mine)
        comm.Allreduce(mine, slowest, op=MPI.MAX)
        med = dict(zip(keys, np.median(slowest, axis=0).tolist()))
        text = op.describe()
        if comm.rank == 0:
            nnz = op.comm.allreduce(sum(op.local_nnz))
        else:
            op.comm.allreduce(sum(op.local_nnz))
            nnz = None
        if comm.rank == 0:
            row = {"matrix": spec, "ranks": comm.size, "nnz": nnz, "format": args.format,
                   "dtype": args.dtype, "wall_per_product_s": wall,
                   "gflops": 2 * nnz / wall * 1e-9,
                   **{f"{k}_s": v for k, v in med.items()}}
            print(text)
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
        op.free()


if __name__ == "__main__":
    main()
