"""The products solvers need (#16) against cuSPARSE, on device arrays, as a user calls them.

For each matrix (replicated block-diagonally to ``--replicate-to`` non-zeros), dtype and
format, on device vectors already on the GPU, the wall time per product of ``--calls``
products back to back followed by one wait (``queue.finish()``; for CuPy a device
synchronise), the contenders interleaved, median of ``--rounds`` rounds:

- ``Ax``: ``op.matvec(x, out=y)``; cuSPARSE ``cusparseSpMV`` (descriptors made once);
- ``ATx``: ``op.T.matvec(x, out=y)`` (``op.H`` for complex values; its transposed copy is
  built before the timing, and that build's time is reported as ``transpose_setup_s``);
  cuSPARSE ``cusparseSpMV`` with ``CUSPARSE_OPERATION_TRANSPOSE`` (conjugate transpose
  for complex) on the same CSR;
- ``AX k``: ``op.matmat(X, out=Y)`` with X of shape (n, k), row-major; cuSPARSE
  ``cusparseSpMM`` with row-major and with column-major B and C (both timed, the faster
  kept as cuSPARSE's time).  ``k_singles`` is k times our ``Ax`` time: the block
  product's throughput against k single products is ``k_singles / AX``.  The summary
  prints it against the same operator's ``Ax`` (``xk``) and against the best ``Ax`` of
  the formats in the run (``xk/best``, #16's ratio; ``best_Ax_s`` in the JSON): an
  operator tuned for blocks may be slow at one vector.

Every result is checked against scipy in float64 (complex128) once (``rel_err``).

    python benchmarks/products.py --device nvidia --replicate-to 2e7 \\
        --dtypes float32,float64,complex128 --formats sell,csr-vector --ks 8,32 \\
        --json out.json astro-ph cage10 Groebner_id2003_aug wing

Without CuPy the cuSPARSE columns are left empty (a PoCL check of the script).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import pyspmv_cl as psc
from pyspmv_cl.bench.generators import from_spec, replicate_to, resolve_name

#: The shared matrices beside the checkout (PYSPMV_CL_MATRIX_DIR overrides).
MATRIX_DIR = Path(__file__).resolve().parents[2] / "shared" / "matrices"


def with_values(A, dtype, rng):
    """A in ``dtype``; complex values get a random imaginary part (a real matrix's
    pattern, fresh complex values)."""
    A = A.tocsr().astype(np.float64)
    if np.dtype(dtype).kind == "c":
        A = A.astype(np.complex128)
        A.data = A.data + 1j * rng.standard_normal(A.nnz)
    return A.astype(dtype)


def random_block(rng, shape, dtype):
    X = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        X = X + 1j * rng.standard_normal(shape)
    return np.ascontiguousarray(X.astype(dtype))


def rel_err(got, want):
    got = np.asarray(got, dtype=np.complex128)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


class Timer:
    """Per-product wall time of ``calls`` back-to-back calls and one wait."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, fn, wait):
        fn()
        wait()
        start = time.perf_counter()
        for _ in range(self.calls):
            fn()
        wait()
        return (time.perf_counter() - start) / self.calls


def cuda_contenders(A, dtype, x, xt, ks, rng_blocks):
    """cuSPARSE's callables (name -> (fn, result getter)); {} without CuPy."""
    try:
        import cupy

        from pyspmv_cl.bench.peers import CuSparseSpMM, _CuSparseSpMV
    except ImportError:
        return {}, None
    dt = np.dtype(dtype)
    out = {}
    xd, xtd = cupy.asarray(x), cupy.asarray(xt)
    mv = _CuSparseSpMV(A, dt, "N")
    out["Ax"] = (lambda: mv(xd), lambda: cupy.asnumpy(mv.y))
    tmv = _CuSparseSpMV(A, dt, "H" if dt.kind == "c" else "T")
    out["ATx"] = (lambda: tmv(xtd), lambda: cupy.asnumpy(tmv.y))
    for k in ks:
        for order in ("C", "F"):
            mm = CuSparseSpMM(A, dt, rng_blocks[k], order)
            out[f"AX{k}{order}"] = (mm, lambda mm=mm: cupy.asnumpy(mm.C))
    return out, cupy.cuda.runtime.deviceSynchronize


def bench_matrix(name, A64, args, device, rng):
    rows = []
    m, n = A64.shape
    for dtype in args.dtypes:
        A = with_values(A64, dtype, rng)
        Aref = A.astype(np.complex128)
        case = {"x": random_block(rng, n, dtype), "xt": random_block(rng, m, dtype),
                "blocks": {k: random_block(rng, (n, k), dtype) for k in args.ks}}
        want = {"Ax": Aref @ case["x"], "ATx": Aref.conj().T @ case["xt"]}
        want.update({f"AX{k}": Aref @ X for k, X in case["blocks"].items()})
        peer, sync = cuda_contenders(A, dtype, case["x"], case["xt"], args.ks, case["blocks"])
        dtype_rows = []
        for fmt in args.formats:
            try:
                row = bench_format(A, fmt, case, peer, sync, args, device)
            except psc.errors.PySpMVError as exc:
                print(f"{name} {dtype} {fmt}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            row.update({"matrix": name, "shape": [m, n], "nnz": int(A.nnz), "dtype": dtype})
            for key, res in row.pop("results").items():
                base = key.rstrip("CF") if key.startswith(("AX", "cusparse AX")) else key
                row[key]["rel_err"] = rel_err(res, want[base.replace("cusparse ", "")])
            dtype_rows.append(row)
        # #16's ratio counts k single products of the best contender for one vector (a
        # format tuned for blocks may be slow at one): known once every format has run.
        best = min((r["Ax"]["s"] for r in dtype_rows), default=None)
        for row in dtype_rows:
            row["best_Ax_s"] = best
            print(summary_line(row, args.ks), flush=True)
        rows += dtype_rows
    return rows


def bench_format(A, fmt, case, peer, sync, args, device):
    """One format's row: setups, then every product timed, interleaved with cuSPARSE."""
    m, n = A.shape
    asked = fmt
    fmt, _, spec = fmt.partition(":")   # "sell" or "csr-vector:block_mapping=items"
    params = {key: int(value) if value.isdigit() else   # "auto:block_size=8"
              {"True": True, "False": False}.get(value, value)   # "coo:block_copy=False"
              for key, value in (item.split("=", 1) for item in spec.split(",") if item)}
    t0 = time.perf_counter()
    op = psc.SpMV(A, device=device, format=fmt, **params)
    op.finish_tuning()   # "auto": measure the format its tuning picks (setup includes it)
    q = op.queue
    xd, yd = cla.to_device(q, case["x"]), cla.empty(q, m, op.dtype)
    op.matvec(xd, out=yd)
    q.finish()
    setup = time.perf_counter() - t0
    T = op.H if op.is_complex else op.T
    t0 = time.perf_counter()
    xtd, ytd = cla.to_device(q, case["xt"]), cla.empty(q, n, op.dtype)
    T.matvec(xtd, out=ytd)
    op.transposed.finish_tuning()   # "auto" tunes A^T's copy too: not beside the timing
    q.finish()
    tsetup = time.perf_counter() - t0
    if args.ks:   # the steady state of block products: the block copy of a format
        op.build_block_copy()   # without block kernels made now (None otherwise)
    ours = {"Ax": (lambda: op.matvec(xd, out=yd), yd.get),
            "ATx": (lambda: T.matvec(xtd, out=ytd), ytd.get)}
    for k, X in case["blocks"].items():
        Xd, Yd = cla.to_device(q, X), cla.empty(q, (m, k), op.dtype)
        ours[f"AX{k}"] = (lambda Xd=Xd, Yd=Yd: op.matmat(Xd, out=Yd), Yd.get)
    contenders = {**{key: (fn, get, q.finish) for key, (fn, get) in ours.items()},
                  **{f"cusparse {key}": (fn, get, sync) for key, (fn, get) in peer.items()}}
    timer = Timer(args.calls)
    times = {key: [] for key in contenders}
    for _ in range(args.rounds):
        for key, (fn, _, wait) in contenders.items():
            times[key].append(timer(fn, wait))
    row = {"format": op.format + (f":{spec}" if spec else ""), "asked": asked,
           "params": op.params,
           "setup_s": setup,
           "transpose_setup_s": tsetup, "transposed_format": op.transposed.format,
           "block_kernels": bool(op.has_block_kernels),
           # The CSR copy the first block product made (a format without block kernels).
           "block_copy": op.block_copy.format if op.block_copy is not None else None,
           "block_copy_s": op._block_copy.seconds if op._block_copy is not None else None,
           "results": {key: get() for key, (_, get, _) in contenders.items()}}
    for key, samples in times.items():
        row[key] = {"s": statistics.median(samples), "spread": [min(samples), max(samples)]}
    return row


def summary_line(row, ks):
    """One line: our time, cuSPARSE's, in us, and the ratios (cuSPARSE / ours)."""
    def us(v):
        return f"{v * 1e6:8.1f}"

    label = row['format'] if row.get('asked') != 'auto' else 'auto:' + row['format']
    parts = [f"{row['matrix']:>22} {row['dtype']:>10} {label:>16}"]
    for key in ["Ax", "ATx"] + [f"AX{k}" for k in ks]:
        ours = row[key]["s"]
        cus = [row[c]["s"] for c in (f"cusparse {key}", f"cusparse {key}C", f"cusparse {key}F")
               if c in row]
        text = f"{key} {us(ours)}"
        if cus:
            text += f" /cu {min(cus) / ours:4.2f}"
        if key.startswith("AX"):
            k = int(key[2:])
            text += f" xk {k * row['Ax']['s'] / ours:4.1f}"
            if row.get("best_Ax_s"):
                text += f" xk/best {k * row['best_Ax_s'] / ours:4.1f}"
        parts.append(text)
    errs = [v["rel_err"] for v in row.values() if isinstance(v, dict) and "rel_err" in v]
    parts.append(f"err {max(errs):.1e}")
    return " | ".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("matrices", nargs="+", help="matrix specs (names under the matrix "
                    "directory, or generator specs such as poisson2d:300)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtypes", default="float32,float64,complex128")
    ap.add_argument("--formats", default="sell,csr-vector",
                    help="comma-separated; parameters after a colon, joined by '+': "
                    "csr-vector:block_mapping=items")
    ap.add_argument("--ks", default="8,32")
    ap.add_argument("--replicate-to", type=float, default=0)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.dtypes = args.dtypes.split(",")
    kinds = ("float32", "float64", "complex64", "complex128")
    if any(d not in kinds for d in args.dtypes):
        ap.error(f"--dtypes {','.join(args.dtypes)!r}: each of {', '.join(kinds)}")
    args.formats = [f.replace("+", ",") for f in args.formats.split(",")]
    try:
        args.ks = [int(k) for k in args.ks.split(",") if k]
    except ValueError:
        args.ks = []
    if not args.ks or min(args.ks) < 1 or args.calls < 1 or args.rounds < 1 \
            or not args.replicate_to >= 0:
        ap.error("--ks must list integers >= 1, --calls and --rounds be at least 1 and "
                 "--replicate-to a count >= 0")
    try:
        device = psc.get_device(args.device)
    except psc.PySpMVError as exc:
        ap.error(str(exc))
    rng = np.random.default_rng(args.seed)
    print(f"device: {device}, pyopencl {cl.VERSION_TEXT}, numpy {np.__version__}, "
          f"python {platform.python_version()}", flush=True)
    rows = []
    for spec in args.matrices:
        try:
            name, A = replicate_to(*from_spec(resolve_name(spec, MATRIX_DIR)),
                                   args.replicate_to)
        except ValueError as exc:   # (a bad spec: the generators' help is in exc)
            ap.error(str(exc).splitlines()[0])
        rows += bench_matrix(name, A, args, device, rng)
        if args.json:   # after each matrix: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"device": str(device), "argv": sys.argv, "rows": rows}, f,
                          indent=1, default=str)


if __name__ == "__main__":
    main()
