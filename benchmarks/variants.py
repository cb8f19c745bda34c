"""Format and parameter variants of ``Ax`` against cuSPARSE, on device arrays (the
sweeps behind the GPU defaults: which shape of a kernel suits which matrices).  Without
CuPy (a CPU device) the cuSPARSE columns are left empty (None in the JSON).

For each matrix (replicated to ``--replicate-to`` non-zeros) and dtype, every variant of
``--variants`` (a JSON list of ``[format, {param: value}]``; ``"auto"`` is tuned first
with ``finish_tuning``) is timed as ``benchmarks/products.py`` times ``Ax``: the wall
time per product of 20 back-to-back products and one wait, interleaved with cuSPARSE's
``cusparseSpMV``, median of ``--rounds`` rounds, each result checked against scipy.  A
variant the device refuses is reported and skipped.

    python benchmarks/variants.py --device nvidia --dtypes float32,complex128 \\
        --variants '[["auto", {}], ["csr-vector", {"mapping": "adaptive",
        "items_per_thread": 4}]]' --json R.json astro-ph Groebner_id2003_aug
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
import pyopencl.array as cla
from products import MATRIX_DIR, Timer, random_block, with_values

import pyspmv_cl as psc
from pyspmv_cl.bench.generators import replicate_to
from pyspmv_cl.bench.runner import copy_bandwidth, min_bytes
from pyspmv_cl.bench.script_args import (
    check_matrices,
    device_or_error,
    dtypes_or_error,
    positive_int,
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("matrices", nargs="+")
    ap.add_argument("--device", default="nvidia")
    ap.add_argument("--dtypes", default="float32,float64,complex128")
    ap.add_argument("--variants", required=True, help="JSON list of [format, params]")
    ap.add_argument("--replicate-to", type=float, default=2e7,
                    help="replicate each matrix block-diagonally to at least this many "
                         "non-zeros (default 2e7, as in BENCHMARKS.md; 0: as given)")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--bandwidth", action="store_true",
                    help="measure the device's copy bandwidth once and give each row its "
                         "CSR-equivalent GB/s (values, 32-bit columns, row pointers, x read "
                         "once, y written once) and that as a percentage of the copy "
                         "(#18's target for large regular matrices)")
    args = ap.parse_args(argv)
    if not args.replicate_to >= 0:
        ap.error("--replicate-to must be a count >= 0")
    dtypes = [d.name for d in dtypes_or_error(ap, args.dtypes)]
    try:
        variants = json.loads(args.variants)
        if not isinstance(variants, list) or not all(
                isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                and isinstance(v[1], dict) for v in variants):
            raise ValueError("not a list of [format, params]")
    except ValueError as exc:
        ap.error(f"--variants {args.variants!r}: a JSON list of [format, {{params}}] ({exc})")
    matrices = check_matrices(ap, args.matrices, MATRIX_DIR)
    device = device_or_error(ap, args.device)
    copy_gbps = copy_bandwidth(device) if args.bandwidth else None
    if copy_gbps is not None:
        print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    try:   # without CuPy (a CPU device, say) the cuSPARSE columns stay empty
        import cupy

        from pyspmv_cl.bench.peers import _CuSparseSpMV
        sync = cupy.cuda.runtime.deviceSynchronize
    except ImportError:
        cupy = None
        print("CuPy not found: no cuSPARSE timings", file=sys.stderr)

    rng, timer, rows = np.random.default_rng(0), Timer(20), []
    for label, A0 in matrices:
        label, A0 = replicate_to(label, A0, args.replicate_to)
        for dt in dtypes:
            A = with_values(A0, dt, rng)
            x = random_block(rng, A.shape[1], dt)
            want = A.astype(np.complex128) @ x
            peer = x_cuda = None
            if cupy is not None:
                peer, x_cuda = _CuSparseSpMV(A, np.dtype(dt), "N"), cupy.asarray(x)
            for fmt, params in variants:
                try:
                    op = psc.SpMV(A, device=args.device, format=fmt, **params)
                except psc.errors.PySpMVError as exc:
                    print(f"{label} {dt} {fmt} {params}: {type(exc).__name__}: "
                          f"{str(exc)[:160]}", file=sys.stderr)
                    continue
                op.finish_tuning()
                q = op.queue
                xd, yd = cla.to_device(q, x), cla.empty(q, A.shape[0], op.dtype)
                op.matvec(xd, out=yd)
                err = float(np.abs(yd.get() - want).max() / np.abs(want).max())
                ours, cusparse = [], []

                def product(op=op, xd=xd, yd=yd):
                    op.matvec(xd, out=yd)

                def peer_product(peer=peer, x_cuda=x_cuda):
                    peer(x_cuda)

                for _ in range(args.rounds):
                    ours.append(timer(product, q.finish))
                    if peer is not None:
                        cusparse.append(timer(peer_product, sync))
                t = statistics.median(ours)
                c = statistics.median(cusparse) if cusparse else None
                rows.append({"matrix": label, "dtype": dt, "asked": fmt, "given": params,
                             "format": op.format,
                             "params": {k: str(v) for k, v in op.params.items()},
                             "us": t * 1e6, "cusparse_us": None if c is None else c * 1e6,
                             "ratio": None if c is None else c / t, "rel_err": err})
                if copy_gbps is not None:
                    gbps = min_bytes(A, dt) / t / 1e9
                    rows[-1].update(csr_gbps=gbps, copy_gbps=copy_gbps,
                                    copy_pct=100 * gbps / copy_gbps)
                    if c is not None:
                        rows[-1]["cusparse_copy_pct"] = 100 * min_bytes(A, dt) / c / 1e9 / copy_gbps
                peer_text = (f"cuSPARSE {c * 1e6:8.1f} ratio {c / t:5.2f}" if c is not None else
                             "cuSPARSE        - ratio     -")
                share = (f" {rows[-1]['copy_pct']:5.1f}% of copy" if copy_gbps is not None
                         else "")
                print(f"{label} {dt} {fmt:10s} {json.dumps(params):60s} {t * 1e6:8.1f} "
                      f"{peer_text} err {err:.1e}{share}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
