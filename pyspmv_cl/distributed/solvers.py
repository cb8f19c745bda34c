"""Krylov solvers over a distributed operator: vectors stay on each rank's device,
dot products are local reductions on the device plus one ``Allreduce``."""

import time

import numpy as np
import pyopencl.array as cla
from pyopencl.elementwise import ElementwiseKernel

from ..errors import InvalidInputError
from .operator import DistributedInputError, mpi

_KERNELS = {}


def _kernels(context, dtype):
    key = (context.int_ptr, np.dtype(dtype).name)
    if key not in _KERNELS:
        t = "float" if np.dtype(dtype) == np.float32 else "double"
        _KERNELS[key] = {
            "step": ElementwiseKernel(
                context, f"{t} a, {t} *x, {t} *r, const {t} *p, const {t} *q",
                "x[i] += a * p[i]; r[i] -= a * q[i]", "pyspmv_cg_step"),
            "scale": ElementwiseKernel(
                context, f"{t} *z, const {t} *d, const {t} *r",
                "z[i] = d[i] * r[i]", "pyspmv_cg_scale"),
            "direction": ElementwiseKernel(
                context, f"{t} *p, const {t} *z, {t} b",
                "p[i] = z[i] + b * p[i]", "pyspmv_cg_direction"),
        }
    return _KERNELS[key]


def _tolerance(name, value):
    """tol/atol: a finite real number >= 0, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                         np.floating)):
        raise InvalidInputError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value) or value < 0:
        raise InvalidInputError(f"{name} must be finite and >= 0, not {value}")
    return value


def _iterations(maxiter):
    """maxiter: None or an integer >= 1."""
    if maxiter is None:
        return None
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) \
            or maxiter < 1:
        raise InvalidInputError(f"maxiter must be None or an integer >= 1, not {maxiter!r}")
    return int(maxiter)


def cg(op, b_local, x0=None, tol=1e-5, maxiter=None, M=None, atol=0.0, callback=None):
    """Conjugate gradients on a symmetric positive definite distributed operator.

    Collective.  ``b_local`` (and ``x0``): this rank's entries (numpy or pyopencl).
    Stops when ``||r|| <= max(tol * ||b||, atol)`` (scipy's rule with ``rtol=tol``) or
    after ``maxiter`` iterations (default ``10 * n``).  ``M``: None or ``"jacobi"`` (the
    inverse of the matrix's diagonal, from the diagonal blocks).

    Every vector lives on the rank's device (``op.queue``); per iteration: one
    distributed product, two device reductions and one ``Allreduce`` of two numbers
    (``r.z`` and ``r.r`` together), plus one for ``p.Ap``.  Returns ``(x_local, info)``
    like scipy (``info`` 0 when converged, the iterations done when ``maxiter`` ran
    out, -1 on a breakdown: ``p.Ap <= 0``, the matrix not positive definite, where
    scipy's cg would go on), ``x_local`` of the
    kind of ``b_local``; ``op.cg_stats`` holds iterations, residual norms and times.
    ``tol`` and ``atol`` are finite numbers >= 0, ``maxiter`` an integer >= 1, and all
    ranks must give the same ``tol``, ``atol``, ``maxiter`` and ``M`` (else
    :class:`DistributedInputError` on every rank: ranks stopping at different
    iterations would leave the others waiting in a product).  ``callback(x)`` gets
    the iterate as this rank's pyopencl array (on ``op.queue``), whatever ``b_local``
    is.
    """
    MPI = mpi()
    base = getattr(op, "operator", op)   # (op.T: a view of the operator)
    if getattr(base, "_freed", False):   # its communicator is gone: nothing collective
        base._check_live()
    comm = op.comm

    def check_operator():   # in the collective check: a rank may differ (row_range)
        if op.shape[0] != op.shape[1] or op.row_range != op.col_range:
            raise InvalidInputError("cg needs a square operator whose rows and x share "
                                    "one distribution (row_range == col_range)")
        if not (M is None or (isinstance(M, str) and M == "jacobi")):
            what = f"{M!r}" if isinstance(M, str) else f"a {type(M).__name__}"
            raise InvalidInputError(f"M must be None or 'jacobi' (the preconditioners this "
                                    f"cg builds on the device), not {what}")
    queue, dtype = op.queue, op.dtype
    n = op.local_shape[0]
    on_device = isinstance(b_local, cla.Array)

    def to_dev(v, name):
        if not isinstance(v, cla.Array):
            v = np.asarray(v)
        if v.dtype.kind == "c":
            raise InvalidInputError(f"{name} is complex ({v.dtype}); this cg solves real "
                                    "systems (its imaginary part would be dropped)")
        if isinstance(v, cla.Array):
            if v.size != n:
                raise InvalidInputError(f"{name} has {v.size} entries; rank owns {n}")
            if v.context != queue.context:
                raise InvalidInputError(f"{name} is on another OpenCL context than the "
                                        "operator's; create it on op.queue")
            if v.queue is not queue:   # another queue of the caller's: its writes first
                v.finish()
                v = v.with_queue(queue)
            return v.reshape(n).astype(dtype) if v.dtype != dtype else v.reshape(n).copy()
        if v.shape not in ((n,), (n, 1)):
            raise InvalidInputError(f"{name} has shape {v.shape}; this rank owns {n} entries")
        return cla.to_device(queue, np.ascontiguousarray(v.reshape(n), dtype=dtype))

    error, settings = None, None
    try:
        check_operator()
        settings = (_tolerance("tol", tol), _tolerance("atol", atol),
                    _iterations(maxiter), M)
        b = to_dev(b_local, "b_local")
        x = to_dev(x0, "x0") if x0 is not None else cla.zeros(queue, n, dtype)
        if M == "jacobi":
            d = op.diagonal()
            if np.any(d == 0):
                raise InvalidInputError("Jacobi preconditioner: zero on the diagonal "
                                        f"(row {op.row_range[0] + int(np.argmin(d != 0))})")
            dinv = cla.to_device(queue, (1.0 / d).astype(dtype))
    except Exception as exc:   # any: the other ranks must learn of it, not wait
        error = f"{type(exc).__name__}: {exc}"
    gathered = comm.allgather((error, settings))
    errors = [e for e, _ in gathered]
    if any(e is not None for e in errors):
        raise DistributedInputError("cg refused: " + "; ".join(
            f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None))
    if len({g for _, g in gathered}) > 1:
        raise DistributedInputError(
            "cg refused: the ranks give different (tol, atol, maxiter, M): "
            + ", ".join(f"rank {r}: {g}" for r, (_, g) in enumerate(gathered)))
    tol, atol = settings[0], settings[1]

    k = _kernels(queue.context, dtype)

    def run(name, *args):
        if n:
            k[name](*args, queue=queue)

    def dots(*pairs):
        local = np.array([float(cla.dot(a, c, queue=queue).get()) if n else 0.0
                          for a, c in pairs], dtype=np.float64)
        total = np.empty_like(local)
        comm.Allreduce(local, total, op=MPI.SUM)
        return total

    t0 = time.perf_counter()
    maxiter = 10 * op.shape[0] if maxiter is None else settings[2]
    r = cla.empty(queue, n, dtype)
    ap = cla.empty(queue, n, dtype)
    op.matvec(x, out=r)                          # r = b - A x
    if n:
        r *= -1
        r += b
    z = cla.empty(queue, n, dtype) if M else r
    if M:
        run("scale", z, dinv, r)
    bb, rr, rz = dots((b, b), (r, r), (r, z))
    bnorm = np.sqrt(bb)
    threshold = max(tol * bnorm, atol)
    norms = [float(np.sqrt(rr))]
    p = z.copy() if n else cla.empty(queue, 0, dtype)
    info, it = maxiter, 0
    if norms[0] <= threshold:
        info = 0
    else:
        while it < maxiter:
            it += 1
            op.matvec(p, out=ap)
            (pap,) = dots((p, ap))
            if pap <= 0:
                info = -1          # not positive definite (or breakdown)
                break
            a = rz / pap
            run("step", dtype.type(a), x, r, p, ap)
            if M:
                run("scale", z, dinv, r)
            rr, rz_new = dots((r, r), (r, z))
            norms.append(float(np.sqrt(rr)))
            if callback is not None:
                callback(x)
            if norms[-1] <= threshold:
                info = 0
                break
            run("direction", p, z, dtype.type(rz_new / rz))
            rz = rz_new
    queue.finish()
    op.cg_stats = {"iterations": it, "residuals": norms, "b_norm": float(bnorm),
                   "seconds": time.perf_counter() - t0, "info": info}
    return (x if on_device else x.get()), info
