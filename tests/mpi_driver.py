"""Run under ``mpiexec -n N python tests/mpi_driver.py OUTDIR``: distributed products
and cg on several matrices and partitions, and bad inputs.  Rank 0 writes one ``.npz``
per case (the matrix, x, the gathered results) and ``summary.json``; the checks
against scipy are made by tests/test_distributed_mpi.py with the project's tolerance
helpers.  Any exception aborts every rank (so a failure never becomes a hang)."""

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy.sparse as sp
from mpi4py import MPI

import pyspmv_cl.distributed as psd
from pyspmv_cl.bench import generators

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
OUT = Path(sys.argv[1])
DEVICE = os.environ.get("PYSPMV_CL_MPI_DEVICE") or "node-local"
FAST = {"format": "csr-scalar", "offdiag_format": "csr-scalar", "device": DEVICE}


def lower_banded(n, k=3):
    return sp.diags([np.full(n - d, d + 1.0) for d in range(k + 1)],
                    [-d for d in range(k + 1)], shape=(n, n), format="csr")


def gather(v):
    parts = comm.gather(np.asarray(v), root=0)
    return np.concatenate(parts) if rank == 0 else None


def from_blocks(A, offsets, **kwargs):
    """The primary constructor: each rank passes its own row block."""
    r0, r1 = int(offsets[rank]), int(offsets[rank + 1])
    return psd.SpMV(A[r0:r1], comm, row_start=r0, shape=A.shape, **kwargs)


def product_case(name, A, build, dtype=np.float64):
    op = build()
    rng = np.random.default_rng(11)
    x = rng.standard_normal(A.shape[1])       # same on every rank (same seed)
    y0 = rng.standard_normal(A.shape[0])
    (a, b), (r0, r1) = op.col_range, op.row_range
    y = op @ x[a:b]
    out = y0[r0:r1].copy()
    op.matvec(x[a:b], out=out, alpha=2.0, beta=-0.5)
    y_dev = op.matvec(cla.to_device(op.queue, x[a:b].astype(op.dtype))).get()
    # The transposed product (A^T y): host and device vectors, alpha/beta/out, outputs
    # poisoned with NaN (beta=0 must not read them), and the op.T view.
    yt = rng.standard_normal(A.shape[0])
    x0 = rng.standard_normal(A.shape[1])
    yt_local = yt[r0:r1]
    xt = op.T @ yt_local
    xt_poison = op.rmatvec(yt_local, out=np.full(b - a, np.nan))
    xt_ab = op.rmatvec(yt_local, out=x0[a:b].copy(), alpha=2.0, beta=-0.5)
    yt_dev = cla.to_device(op.queue, yt_local.astype(op.dtype))
    xt_dev = op.T.matvec(yt_dev).get()
    out_dev = cla.to_device(op.queue, x0[a:b].astype(op.dtype))
    op.rmatvec(yt_dev, out=out_dev, alpha=-1.5, beta=0.25)
    poison_dev = cla.to_device(op.queue, np.full(b - a, np.nan, dtype=op.dtype))
    op.H.matvec(yt_dev, out=poison_dev)
    view = op.T
    layout_ok = (view.T is op and op.H is view and view.shape == A.shape[::-1]
                 and view.row_range == op.col_range and view.col_range == op.row_range
                 and view.local_shape == op.local_shape[::-1])
    stats = comm.gather({"rank": rank, "ghosts": int(op.comm_plan.n_ghosts),
                         "send": int(op.comm_plan.n_send), "rows": list(op.row_range),
                         "send_copies": len(op._send_runs or ()),
                         "device": op.device.id, "formats": list(op.format),
                         "nbytes": int(op.nbytes), "y_dtype": str(y.dtype),
                         "xt_dtype": str(xt.dtype), "view_layout": layout_ok}, root=0)
    described = op.describe()
    ys = gather(y), gather(out), gather(y_dev)
    xts = [gather(v) for v in (xt, xt_poison, xt_ab, xt_dev, out_dev.get(),
                               poison_dev.get())]
    if rank == 0:
        A = sp.csr_matrix(A)
        np.savez(OUT / f"{name}.npz", data=A.data, indices=A.indices, indptr=A.indptr,
                 shape=A.shape, x=x, y0=y0, y=ys[0], y_ab=ys[1], y_dev=ys[2],
                 yt=yt, x0=x0, xt=xts[0], xt_poison=xts[1], xt_ab=xts[2], xt_dev=xts[3],
                 xt_dev_ab=xts[4], xt_dev_poison=xts[5], dtype=np.dtype(dtype).name)
        SUMMARY["products"][name] = {"ranks": stats, "describe": described,
                                     "timings": op.timing_summary(),
                                     "rtimings": op.timing_summary(transposed=True)}
    op.free()


def misuse_case(band):
    """cg's M and a complex right-hand side, and matvec's alpha/beta, refused with the
    single-device operator's errors on the rank that passed them (a test drive found
    raw TypeErrors and a silently real solution)."""
    op = psd.SpMV.from_global(band if rank == 0 else None, comm, dtype=np.float64, **FAST)
    op32 = psd.SpMV.from_global(band if rank == 0 else None, comm, dtype=np.float32, **FAST)
    n = op.local_shape[0]
    outcomes = {}
    for name, call in [
            ("matvec32_alpha_huge", lambda: op32.matvec(np.ones(n), alpha=1e300)),
            ("rmatvec32_beta_tiny", lambda: op32.rmatvec(np.ones(n), out=np.ones(n),
                                                          beta=1e-50)),
            ("cg_M_array", lambda: psd.cg(op, np.ones(n), M=np.ones(n))),
            ("cg_complex_b", lambda: psd.cg(op, np.ones(n) * (1 + 1j))),
            ("matvec_alpha_string", lambda: op.matvec(np.ones(n), alpha="2")),
            ("matvec_complex_x", lambda: op.matvec(1j * np.ones(n))),
            ("matvec_beta_none", lambda: op.matvec(np.ones(n), beta=None)),
            ("rmatvec_alpha_string", lambda: op.rmatvec(np.ones(n), alpha="abc")),
            ("cg_maxiter_zero", lambda: psd.cg(op, np.ones(n), maxiter=0)),
            ("cg_tol_string", lambda: psd.cg(op, np.ones(n), tol="1e-8")),
            ("cg_tol_nan", lambda: psd.cg(op, np.ones(n), tol=float("nan"))),
            ("cg_maxiter_differs", lambda: psd.cg(op, np.ones(n), maxiter=5 + rank)),
            ("from_global_bad_root", lambda: psd.SpMV.from_global(None, comm,
                                                                  root=size + 2)),
            # (a sparse or None x and a host out with a device x: the single-device
            # operator's InvalidTypeError, not "must hold numbers, not object")
            ("matvec_sparse_x", lambda: op.matvec(sp.csr_matrix(np.ones((n, 1))))),
            ("matvec_none_x", lambda: op.matvec(None)),
            ("matvec_device_x_host_out", lambda: op.matvec(
                cla.to_device(op.queue, np.ones(n)), out=np.ones(n)))]:
        try:
            call()
            outcomes[name] = None
        except Exception as exc:   # every rank passes the same bad argument
            outcomes[name] = f"{type(exc).__name__}: {exc}"
    y = op.matvec(np.ones(n))   # still works together afterwards
    ok = bool(np.all(np.isfinite(y))) and bool(np.all(np.isfinite(op32.matvec(np.ones(n)))))
    op.free()
    op32.free()
    op32.free()   # a second free does nothing
    # Never transposed before its free: the reverse exchange's buffers were made on
    # the freed communicator (an AttributeError), and cg called MPI on it.
    fresh = psd.SpMV.from_global(band if rank == 0 else None, comm, dtype=np.float64,
                                 **FAST)
    fresh.free()
    for name, call in [("matvec_after_free", lambda: op.matvec(np.ones(n))),
                       ("rmatvec_after_free", lambda: op.rmatvec(np.ones(n))),
                       ("gather_after_free", lambda: op.gather(np.ones(n))),
                       ("fresh_T_after_free", lambda: fresh.T @ np.ones(n)),
                       ("cg_after_free", lambda: psd.cg(fresh, np.ones(n))),
                       ("cg_T_after_free", lambda: psd.cg(fresh.T, np.ones(n)))]:
        try:
            call()
            outcomes[name] = None
        except Exception as exc:
            outcomes[name] = f"{type(exc).__name__}: {exc}"
    gathered = comm.gather((outcomes, ok), root=0)
    if rank == 0:
        SUMMARY["misuse"] = gathered


def error_case(name, call):
    """Every rank must raise the same DistributedInputError."""
    try:
        call()
        message = None
    except psd.DistributedInputError as exc:
        message = str(exc)
    messages = comm.gather(message, root=0)
    if rank == 0:
        SUMMARY["errors"][name] = messages


def refused_product_case(band):
    """The last rank gives a wrong-length vector to a product (then to a transposed
    one): it raises its own error, its neighbours a DistributedInputError naming it,
    the other ranks finish; nobody waits forever, and the next product is right."""
    op = psd.SpMV.from_global(band if rank == 0 else None, comm, partition="rows", **FAST)
    bad = size - 1
    x = np.ones(op.local_shape[1] + (1 if rank == bad else 0))
    y = np.ones(op.local_shape[0] + (1 if rank == bad else 0))
    outcome = {}
    xc = (np.ones(op.local_shape[1]) * (1 + (1j if rank == bad else 0))).astype(
        np.complex128 if rank == bad else np.float64)
    for name, call in (("matvec", lambda: op.matvec(x)), ("rmatvec", lambda: op.rmatvec(y)),
                       ("device", lambda: op.matvec(cla.to_device(op.queue, x))),
                       ("device_complex", lambda: op.matvec(cla.to_device(op.queue, xc)))):
        try:
            call()
            outcome[name] = None
        except Exception as exc:      # noqa: BLE001 - reported to the test
            outcome[name] = f"{type(exc).__name__}: {exc}"
    a, b = op.col_range
    xs = np.random.default_rng(3).standard_normal(band.shape[1])
    after = gather(op @ xs[a:b])
    outcomes = comm.gather(outcome, root=0)
    neighbours = comm.gather([int(q) for q in op.comm_plan.neighbours], root=0)
    if rank == 0:
        SUMMARY["refused"] = {"outcomes": outcomes, "neighbours": neighbours, "bad": bad}
        np.savez(OUT / "refused.npz", x=xs, y=after)
    op.free()


def in_place_case(A, fmt):
    """op.matvec(x, out=x) on device arrays (and on the host): the values sent to the
    neighbours are x's, not the result's being written over it."""
    op = psd.SpMV.from_global(A if rank == 0 else None, comm, format=fmt,
                              offdiag_format=fmt, device=DEVICE)
    a, b = op.col_range
    x = np.random.default_rng(21).standard_normal(A.shape[1])
    x_dev = cla.to_device(op.queue, x[a:b])
    op.matvec(x_dev, out=x_dev)
    x_host = x[a:b].copy()
    op.matvec(x_host, out=x_host)
    ys = gather(x_dev.get()), gather(x_host)
    if rank == 0:
        np.savez(OUT / f"in_place_{fmt}.npz", data=A.data, indices=A.indices,
                 indptr=A.indptr, shape=A.shape, x=x, y_dev=ys[0], y_host=ys[1])
    op.free()


def cg_case():
    A = generators.poisson2d(14)            # 196 unknowns, SPD
    x_true = np.random.default_rng(5).standard_normal(A.shape[0])
    b = A @ x_true
    result = {}
    for M in (None, "jacobi"):
        op = psd.SpMV.from_global(A if rank == 0 else None, comm, dtype=np.float64, **FAST)
        r0, r1 = op.row_range
        x, info = psd.cg(op, b[r0:r1], tol=1e-10, maxiter=500, M=M)
        xs = gather(x)
        # Device-resident right-hand side and x0, on another queue of the operator's
        # context (pyopencl's kernels asserted): the result stays on the device.
        q2 = cl.CommandQueue(op.queue.context)
        x_dev, info_dev = psd.cg(op, cla.to_device(q2, b[r0:r1]), tol=1e-10,
                                 maxiter=500, M=M, x0=cla.zeros(q2, r1 - r0, np.float32))
        xs_dev = gather(x_dev.get())
        x_t, info_t = psd.cg(op.T, b[r0:r1], tol=1e-10, maxiter=500, M=M)   # A = A^T
        xs_t = gather(x_t)
        if rank == 0:
            result[str(M)] = {"x": xs.tolist(), "info": info, "x_dev": xs_dev.tolist(),
                              "info_dev": info_dev, "iterations": op.cg_stats["iterations"],
                              "x_transposed": xs_t.tolist(), "info_transposed": info_t}
        op.free()
    if rank == 0:      # the same solver on one rank (COMM_SELF)
        one = psd.SpMV(A, MPI.COMM_SELF, row_start=0, shape=A.shape, dtype=np.float64,
                       **FAST)
        for M in (None, "jacobi"):
            x1, info1 = psd.cg(one, b, tol=1e-10, maxiter=500, M=M)
            result[str(M)].update(x_one_rank=x1.tolist(), info_one_rank=info1,
                                  iterations_one_rank=one.cg_stats["iterations"])
        one.free()
    # A rank owning no rows (rank 0): cg and a device product into out.  An empty
    # pyopencl array has no buffer: the in-place check raised AttributeError on that
    # rank, and the others waited in cg.
    offsets = [0] + list(psd.plan.even_offsets(A.shape[0], size - 1))
    empty = psd.SpMV.from_global(A if rank == 0 else None, comm, dtype=np.float64,
                                 partition=offsets, **FAST)
    r0, r1 = empty.row_range
    x_e, info_e = psd.cg(empty, b[r0:r1], tol=1e-10, maxiter=500)
    xs_e = gather(x_e)
    y_e = cla.empty(empty.queue, r1 - r0, np.float64)
    empty.matvec(cla.to_device(empty.queue, b[r0:r1]), out=y_e)
    ys_e = gather(y_e.get())
    empty.free()
    if rank == 0:
        result["empty_rank"] = {"info": info_e, "x": xs_e.tolist(), "Ab": ys_e.tolist(),
                                "rows_on_rank0": r1 - r0}
        # Not positive definite: a breakdown (p.Ap <= 0) gives info -1, as documented.
        d = np.where(np.arange(20) % 2, 1.0, -1.0)
        bad = psd.SpMV(sp.diags(d).tocsr(), MPI.COMM_SELF, row_start=0, shape=(20, 20),
                       dtype=np.float64, **FAST)
        result["indefinite_info"] = psd.cg(bad, np.ones(20), maxiter=50)[1]
        bad.free()
        np.savez(OUT / "cg.npz", data=A.data, indices=A.indices, indptr=A.indptr,
                 shape=A.shape, b=b)
        SUMMARY["cg"] = result


def metis_case():
    """partition="metis" on a randomly renumbered grid Laplacian: the product and cg,
    moved between the original numbering and the ranks' scattered rows with
    local_indices/scatter/gather; contiguous row blocks of the same matrix for the
    ghost counts."""
    try:
        import pymetis  # noqa: F401
    except ImportError:
        if rank == 0:
            SUMMARY["metis"] = {"missing": True}
        return
    grid = generators.poisson2d(16)                 # 256 unknowns, SPD
    n = grid.shape[0]
    A = psd.partition.permute_symmetric(grid, np.random.default_rng(3).permutation(n))
    rng = np.random.default_rng(12)
    x = rng.standard_normal(n)                      # same on every rank (same seed)
    b = A @ rng.standard_normal(n)
    op = psd.SpMV.from_global(A if rank == 0 else None, comm, partition="metis",
                              dtype=np.float64, **FAST)
    idx = op.local_indices()
    y_local = op @ x[idx]
    y = op.gather(y_local)                          # original numbering, on rank 0
    by_hand = comm.gather((idx, y_local), root=0)   # y[idx] = y_local, rank by rank
    scattered = op.scatter(x if rank == 0 else None)
    same_perm = comm.gather(op.permutation, root=0)
    x_cg, info = psd.cg(op, b[idx], tol=1e-10, maxiter=500, M="jacobi")
    x_cg = op.gather(x_cg)
    iterations = op.cg_stats["iterations"]
    stats = comm.gather({"rank": rank, "rows": list(op.row_range),
                         "ghosts": int(op.comm_plan.n_ghosts),
                         "scatter_ok": bool(np.array_equal(scattered, x[idx])),
                         "cols_ok": bool(np.array_equal(op.local_indices("cols"), idx)),
                         "repr": repr(op)}, root=0)
    described = op.describe()
    partition, permuted = op.partition, op.permutation is not None
    try:     # the last rank's part one value too long: refused on every rank
        op.gather(np.zeros(len(idx) + (rank == size - 1)))
        gather_error = None
    except psd.DistributedInputError as exc:
        gather_error = str(exc)
    gather_errors = comm.gather(gather_error, root=0)
    op.free()
    nnz = psd.SpMV.from_global(A if rank == 0 else None, comm, dtype=np.float64, **FAST)
    r0, r1 = nnz.row_range
    ghosts_nnz = comm.gather(int(nnz.comm_plan.n_ghosts), root=0)
    described_nnz = nnz.describe()
    nnz_permutation, nnz_indices = nnz.permutation, nnz.local_indices()
    indices_ok = comm.gather(bool(nnz_permutation is None
                                  and np.array_equal(nnz_indices, np.arange(r0, r1))),
                             root=0)
    nnz.free()
    if rank == 0:
        y_hand = np.full(n, np.nan)
        for i, part in by_hand:
            y_hand[i] = part
        np.savez(OUT / "metis.npz", data=A.data, indices=A.indices, indptr=A.indptr,
                 shape=A.shape, x=x, y=y, y_by_hand=y_hand, b=b, x_cg=x_cg)
        SUMMARY["metis"] = {
            "missing": False, "ranks": stats, "describe": described,
            "describe_nnz": described_nnz, "partition": partition, "permuted": permuted,
            "same_permutation": all(np.array_equal(p, same_perm[0]) for p in same_perm),
            "permutation_is_bijection": bool(np.array_equal(np.sort(same_perm[0]),
                                                            np.arange(n))),
            "info": info, "iterations": iterations, "gather_errors": gather_errors,
            "ghosts_nnz": ghosts_nnz, "nnz_indices_ok": all(indices_ok)}


def metis_missing_case():
    """pymetis unimportable on root: every rank raises the same ImportError."""
    saved = sys.modules.get("pymetis", "absent")
    if rank == 0:
        sys.modules["pymetis"] = None       # import pymetis now raises ImportError
    try:
        psd.SpMV.from_global(sp.eye(10, format="csr") if rank == 0 else None, comm,
                             partition="metis", **FAST)
        message = None
    except ImportError as exc:
        message = f"ImportError: {exc}"
    finally:
        if rank == 0:
            if saved == "absent":
                del sys.modules["pymetis"]
            else:
                sys.modules["pymetis"] = saved
    messages = comm.gather(message, root=0)
    if rank == 0:
        SUMMARY["errors"]["metis_missing"] = messages


SUMMARY = {"size": size, "products": {}, "errors": {}}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rnd = generators.random_uniform(300, 300, 6, seed=1)
    product_case("random", rnd, lambda: psd.SpMV.from_global(
        rnd if rank == 0 else None, comm, **FAST))
    band = generators.banded(400, 7, seed=2)
    product_case("banded", band, lambda: psd.SpMV.from_global(
        band if rank == 0 else None, comm, partition="rows", **FAST))
    pl = generators.power_law(500, 6, seed=3)
    product_case("power_law", pl, lambda: psd.SpMV.from_global(
        pl if rank == 0 else None, comm, **FAST))
    lb = lower_banded(200)
    product_case("no_ghosts_on_rank0", lb, lambda: from_blocks(
        lb, psd.plan.even_offsets(200, size), **FAST))
    tiny = sp.csr_matrix(np.arange(1.0, (size - 1) ** 2 + 1).reshape(size - 1, size - 1))
    product_case("more_ranks_than_rows", tiny, lambda: psd.SpMV.from_global(
        tiny if rank == 0 else None, comm, **FAST))
    one = generators.random_uniform(60, 60, 5, seed=6)
    product_case("all_rows_on_rank0", one, lambda: from_blocks(
        one, [0] + [60] * size, **FAST))
    product_case("all_rows_on_last_rank", one, lambda: from_blocks(
        one, [0] * size + [60], **FAST))
    wide = generators.random_uniform(90, 250, 5, seed=4)
    product_case("rect_wide", wide, lambda: from_blocks(
        wide, psd.plan.even_offsets(90, size), **FAST))
    # Rows on rank 0 only, x spread evenly: the other ranks own entries but no rows.
    wide_small = generators.random_uniform(40, 120, 4, seed=9)
    product_case("rect_rows_on_rank0", wide_small, lambda: from_blocks(
        wide_small, [0] + [40] * size, **FAST))
    tall = generators.random_uniform(250, 60, 4, seed=5)
    product_case("rect_tall", tall, lambda: psd.SpMV.from_global(
        tall if rank == 0 else None, comm, **FAST))
    f32 = generators.random_uniform(200, 200, 8, seed=7).astype(np.float32)
    product_case("float32", f32, lambda: psd.SpMV.from_global(
        f32 if rank == 0 else None, comm, **FAST), dtype=np.float32)
    if size == 2:   # format="auto" per block (the rules on small blocks)
        pois = generators.poisson2d(20)
        product_case("auto_formats", pois, lambda: psd.SpMV.from_global(
            pois if rank == 0 else None, comm, device=DEVICE))
    cg_case()
    metis_case()
    for fmt in ("csr-scalar", "sell"):
        in_place_case(band, fmt)

    eye = sp.eye(10, format="csr")
    error_case("shapes_differ", lambda: psd.SpMV(
        sp.csr_matrix((0, 11)) if rank else eye, comm, row_start=0 if rank == 0 else 10,
        shape=(10, 10) if rank == 0 else (10, 11), **FAST))
    error_case("rows_overlap", lambda: psd.SpMV(
        eye[:5], comm, row_start=0, shape=(10, 10), **FAST))
    error_case("rows_missing", lambda: psd.SpMV(
        eye[:1], comm, row_start=rank, shape=(10, 10), **FAST))
    error_case("bad_block_on_last_rank", lambda: psd.SpMV(
        sp.eye(10, 7, format="csr")[:0] if rank == size - 1 else
        (eye if rank == 0 else eye[:0]), comm, row_start=0 if rank == 0 else 10,
        shape=(10, 10), **FAST))
    error_case("bad_partition", lambda: psd.SpMV.from_global(
        eye if rank == 0 else None, comm, partition=[0, 20], **FAST))
    error_case("metis_not_square", lambda: psd.SpMV.from_global(
        sp.eye(10, 12, format="csr") if rank == 0 else None, comm, partition="metis",
        **FAST))
    error_case("metis_col_range", lambda: psd.SpMV.from_global(
        eye if rank == 0 else None, comm, partition="metis",
        col_range=(0, 10) if rank == 0 else (10, 10), **FAST))
    error_case("complex_dtype", lambda: psd.SpMV.from_global(
        eye if rank == 0 else None, comm, dtype=np.complex128, **FAST))
    error_case("complex_matrix", lambda: psd.SpMV.from_global(
        (eye * 1j).tocsr() if rank == 0 else None, comm, **FAST))
    error_case("tuple_of_two_on_last_rank", lambda: psd.SpMV(
        (eye.data[:0], eye.indices[:0]) if rank == size - 1 else
        (eye if rank == 0 else eye[:0]), comm, row_start=0 if rank == 0 else 10,
        shape=(10, 10), **FAST))
    misuse_case(band)
    metis_missing_case()
    refused_product_case(band)
    # After the refusals the ranks still work together.
    product_case("after_errors", band, lambda: psd.SpMV.from_global(
        band if rank == 0 else None, comm, **FAST))
    if rank == 0:
        (OUT / "summary.json").write_text(json.dumps(SUMMARY, indent=1))


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
