"""Transposed and conjugate-transposed products (``op.T``, ``op.H``, ``op.rmatvec``,
``op.rmatmat``) and the scipy ``LinearOperator`` of an :class:`~pyspmv_cl.SpMV`.

One design for every format: a transposed copy, built on first use.  The first
transposed product reads the operator's current values back from the device (in CSR
order, through the same slot map that ``update_values`` uses), transposes the CSR on
the host with a stable sort of the column indices, and builds a second operator for
A^T on the same device, queue and dtype.  Its format follows the caller's choice for
A: the same format and parameters when the caller fixed one and it accepts A^T, else
``format="auto"``.  The sort's permutation (A's CSR order -> A^T's CSR order) is kept on
the host, so ``update_values`` hands each new value array on to the copy permuted.

Why a copy and not a scatter kernel with atomics (y[col] += a * x[row] over A's
entries): atomics make the summation order depend on scheduling, so results would no
longer be deterministic; float atomics are missing on many OpenCL devices (and
emulating them with compare-and-swap loops is slow under contention); and every
format would need a second kernel.  The copy costs one conversion and the device memory
of a second matrix (``op.nbytes`` counts it, ``op.nbytes_parts["transposed"]`` says how
much) and then runs at the speed of an ordinary product.

A matrix given as device arrays is read back once for this (its structure, like
``update_values`` does, and the values the operator holds); the transpose itself runs
on the host.

Complex values: the copy holds A^H (the transposed values conjugated), since the
adjoint is what solvers and scipy's ``rmatvec`` ask for.  ``op.H`` and ``op.rmatvec``
run on it directly; ``op.T`` (A^T, not conjugated) runs as
``conj(A^H conj(x))`` (with ``alpha``, ``beta`` and ``out`` conjugated around it), one
extra pass over the vectors, no second copy.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import host_arrays
from .device_inputs import DeviceCSR, check_contiguous
from .errors import (
    FormatNotSuitableError,
    InvalidInputError,
    InvalidParameterError,
    InvalidTypeError,
    UnsupportedLayoutError,
)
from .formats.values import _layout
from .inputs import check_host_out, refuse_an_operator, refuse_non_dense


def transpose_structure(indices, indptr, n_cols):
    """``(perm, t_indices, t_indptr)`` of the transpose of the CSR pattern
    ``(indices, indptr)`` with ``n_cols`` columns: entry ``k`` of A^T in CSR order is
    entry ``perm[k]`` of A.  A stable sort of the column indices, so each row of A^T
    lists its columns (A's rows) in increasing order, and duplicate entries stay apart
    in their original order."""
    indices = np.asarray(indices)
    indptr = np.asarray(indptr, dtype=np.int64)
    n_rows, nnz = indptr.size - 1, indices.size
    wide = max(n_rows, n_cols, nnz) >= 2**31 - 1
    idx = np.dtype(np.int64 if wide else np.int32)
    perm = np.argsort(indices, kind="stable").astype(idx, copy=False)
    rows = host_arrays.repeat(np.arange(n_rows, dtype=idx), np.diff(indptr))
    t_indptr = np.zeros(n_cols + 1, dtype=idx)
    np.cumsum(np.bincount(indices, minlength=n_cols), out=t_indptr[1:])
    return perm, rows[perm], t_indptr


def read_values(impl, structure, layout, queue) -> np.ndarray:
    """The values ``impl`` computes with, in the CSR order of ``structure``, read from
    the device through ``layout`` (``{array: (slots, sources)}``, as
    ``formats.values`` makes it)."""
    indices, _ = structure
    values = np.empty(indices.size, dtype=impl.dtype)
    reads = []
    for name in layout:
        # The stored type (value_bits may hold fewer bits than impl.dtype).
        host = np.empty(impl.value_array_sizes[name], dtype=impl.value_dtype)
        if host.size:
            cl.enqueue_copy(queue, host, impl.buffers[name], is_blocking=True)
        reads.append((name, host))
    for name, host in reads:
        slots, sources = layout[name]
        values[sources] = host[slots]
    return values


def current_values(op) -> np.ndarray:
    """The operator's values in the CSR order of the matrix given (updates included),
    read from the device: the caller's arrays may have changed since."""
    impl = op._impl
    updater = op._updater
    if updater is not None and updater.fmt is impl:
        layout = updater.layout
    else:
        direct = impl.values_in_csr_order(op.queue, op._structure[1])   # no slot map
        if direct is not None:
            return direct.astype(op.dtype, copy=False)
        layout = _layout(impl, op._structure)
    if layout is not None:
        return read_values(impl, op._structure, layout, op.queue)
    # A format whose conversion merges or drops entries has no slot map: the values
    # given last (update_values keeps a copy for such a format) or at construction.
    if op._host_values is not None:
        return op._host_values
    source = op._structure_source
    if isinstance(source, DeviceCSR):
        return source.data.get(op.queue).astype(op.dtype)
    if source is None or source.data is None:   # a format that reads its CSR back
        (_, _, data), events = impl.read_csr(op.queue)
        if events:
            cl.wait_for_events(events)
        return data.astype(op.dtype, copy=False)
    return np.asarray(source.data, dtype=op.dtype)


class TransposedCopy:
    """The operator of A^T, and the permutation that keeps its values in step with A's
    (see the module docstring)."""

    def __init__(self, op, make):
        start = time.perf_counter()
        m, n = op.shape
        structure = op._structure
        values = current_values(op)
        self.perm, t_indices, t_indptr = transpose_structure(structure[0], structure[1], n)
        t_data = np.conj(values[self.perm]) if values.dtype.kind == "c" else values[self.perm]
        #: Seconds spent reading the values back and transposing on the host.
        self.transpose_seconds = time.perf_counter() - start
        request = op._request
        triple, common = (t_data, t_indices, t_indptr), {
            "dtype": op.dtype, "device": op.device, "shape": (n, m),
            "block_copy": request.get("block_copy", True)}
        fmt = request["format"]
        if fmt == "auto":
            self.operator = make(triple, "auto", tune=request["tune"],
                                 expected_calls=request["expected_calls"],
                                 tune_budget=request["tune_budget"],
                                 block_size=request.get("block_size"), **common,
                                 **request["params"])
            why = f"format='auto' for A^T: {self.operator.explanation}"
        else:
            try:
                self.operator = make(triple, fmt, **common, **request["params"])
                why = f"{fmt}, the format given for A"
            except (FormatNotSuitableError, InvalidParameterError) as exc:
                self.operator = make(triple, "auto", **common)
                why = (f"{fmt} refuses A^T ({exc}); format='auto' chose {self.operator.format}: "
                       f"{self.operator.explanation}")
        self.operator._copy_of = "the transposed copy (A^T; A^H for complex values)"
        self.operator.explanation = (
            f"transposed copy of a {m}x{n} operator, built on first use "
            f"(read-back and host transpose {self.transpose_seconds:.3f} s, conversion "
            f"{self.operator.conversion_time or 0.0:.3f} s); {why}")
        #: Seconds the whole build took (read-back, transpose, conversion, upload).
        self.seconds = time.perf_counter() - start
        # A's values stored in fewer bits (value_bits) than the copy's (its format
        # refused A^T, and "auto" stores at full width): the copy got the stored values
        # read back, and gets later ones rounded alike.
        stored, own = op._impl.value_dtype, self.operator._impl.value_dtype
        self._rounding = (op.dtype, stored) if stored != own else None

    def update_values(self, data) -> None:
        """New values of A (CSR order, checked) -> A^H's (A^T's for real values)."""
        data = np.asarray(data)[self.perm]
        if self._rounding is not None:
            dtype, stored = self._rounding
            data = data.astype(dtype).astype(stored).astype(dtype)
        self.operator._update_as_copy(np.conj(data) if data.dtype.kind == "c" else data)


def check_operands(op, x, out, beta, name):
    """The checks a product makes before it does anything (here: before a transposed
    copy is built for a call that would fail anyway)."""
    if beta != 0 and out is None:
        raise InvalidInputError("beta != 0 needs out= holding the y to accumulate into")
    shape = getattr(x, "shape", None)
    if shape is None:
        return   # not an array yet: the product's own checks name the problem
    m, n = op.shape
    if len(shape) not in (1, 2) or shape[0] != n:
        raise InvalidInputError(f"{name}: x has shape {tuple(shape)}; this {m}x{n} operator "
                                f"needs ({n},) or ({n}, k)")


def rmatmul(op, x):
    """``x @ op`` for a vector (``op^T x``) or a block of rows (``(op^T x^T)^T``).
    Shapes are checked here, in the caller's terms (the transposed product would name
    x.T and a transposed operator)."""
    if not isinstance(x, cla.Array):
        x = np.asarray(x)
    m, n = op.shape
    if x.ndim not in (1, 2) or x.shape[-1] != m:
        raise InvalidInputError(f"x @ op: x has shape {tuple(x.shape)}; this {m}x{n} "
                                f"operator needs ({m},) or (k, {m})")
    if x.ndim == 1:
        return op.T.matvec(x)
    if isinstance(x, cla.Array):   # device blocks are row-major: x.T made so, on the
        if not (x.flags.c_contiguous or x.flags.f_contiguous):   # host (a copy)
            raise UnsupportedLayoutError(
                f"x @ op: the device block x of shape {tuple(x.shape)} is a strided view; "
                "give a contiguous array (x.copy())")
        queue = x.queue if x.queue is not None else op.queue
        x = cla.to_device(queue, np.ascontiguousarray(x.get(queue=queue).T))
        # the result row-major too (as block products take it), through the host alike
        y = op.T.matmat(x).get(queue=queue)
        return cla.to_device(queue, np.ascontiguousarray(y.T))
    return op.T.matmat(x.T).T


def check_block(X, name):
    shape = getattr(X, "shape", None)
    if shape is not None and len(shape) != 2:
        raise InvalidInputError(f"{name} takes a 2-D block (one vector per column), not "
                                f"shape {tuple(shape)}; use matvec/rmatvec for a vector")


def _conj(a):
    """The conjugate of a host or device array (a new array).  On the device, after
    ``a``'s pending events and leaving its own on the result: pyopencl's ``conj`` waits
    for none, and on an out-of-order queue it ran before the product writing ``a``."""
    if not isinstance(a, cla.Array):
        return np.conj(a)
    if a.dtype.kind != "c":
        return a
    result = cla.empty_like(a)
    result.add_event(cla.Array._conj(result, a, wait_for=list(a.events) or None))
    return result


def _conjugated_product(op, product, x, out, alpha, beta):
    """``alpha * conj(B) @ x + beta * out`` from ``product`` (B's, with the same
    arguments; a product of ``op``): ``conj(conj(alpha) * B @ conj(x) + conj(beta) *
    conj(out))``."""
    # The product's own checks of x, alpha and beta first: x is turned into an array and
    # the scalars conjugated here (a sparse x became a 0-d object array, beta without out
    # was dropped, a string alpha taken as a number)
    refuse_an_operator("x", x)
    refuse_non_dense(x, op.shape[1] if product == op.matvec else op.shape[0])
    alpha, beta = op._scalar("alpha", alpha), op._scalar("beta", beta)
    if beta != 0 and out is None:
        raise InvalidInputError("beta != 0 needs out= holding the y to accumulate into")
    x = x if isinstance(x, cla.Array) else np.asarray(x)
    # The checks the product would make on x and out, before they are conjugated here
    # (pyopencl's conj of a strided view, numpy's of a read-only out, raised their own)
    for name, a in (("x", x), ("out", out)):
        if isinstance(a, cla.Array):
            check_contiguous(a, name)
    if isinstance(out, np.ndarray):
        check_host_out(out)
    if x.dtype.kind == "c":
        x = _conj(x)
    alpha, beta = np.conj(alpha), np.conj(beta)
    if out is None:
        return _conj(product(x, out=None, alpha=alpha, beta=0.0))
    if isinstance(out, cla.Array):
        work = _conj(out) if beta != 0 else cla.empty_like(out)
        result = _conj(product(x, out=work, alpha=alpha, beta=beta))
        out.add_event(cla.Array._copy(out, result, queue=out.queue,
                                      wait_for=[*result.events, *out.events] or None))
        return out
    if out.dtype.kind == "c":
        np.conjugate(out, out=out)
        try:
            product(x, out=out, alpha=alpha, beta=beta)
        finally:   # conjugated back: the result, or out as given when refused
            np.conjugate(out, out=out)
        return out
    return product(x, out=out, alpha=alpha, beta=beta)   # a real out: refused there


class TransposedView:
    """``op.T`` (and ``op.H``): A^T or A^H as an operator (the same for real values).
    Its products run on ``op``'s transposed copy (built by the first one), which holds
    A^H for complex values (see the module docstring); ``.T`` and ``.H`` give ``op``
    back (``op.T.H`` and ``op.H.T`` are the conjugate of A).  ``nbytes`` is ``op``'s
    (the copy included once built)."""

    __array_ufunc__ = None   # x @ op.T with a numpy x comes to __rmatmul__

    def __init__(self, op, conjugate=False):
        self.operator = op
        #: A^H rather than A^T (only meaningful for complex values).
        self.conjugate = bool(conjugate) and np.dtype(op.dtype).kind == "c"

    @property
    def shape(self):
        m, n = self.operator.shape
        return (n, m)

    @property
    def dtype(self):
        return self.operator.dtype

    @property
    def device(self):
        return self.operator.device

    @property
    def queue(self):
        return self.operator.queue

    @property
    def nbytes(self):
        return self.operator.nbytes

    @property
    def T(self):
        if self.conjugate:
            return ConjugateView(self.operator)
        return self.operator

    @property
    def H(self):
        if np.dtype(self.operator.dtype).kind == "c" and not self.conjugate:
            return ConjugateView(self.operator)
        return self.operator

    def matvec(self, x, out=None, alpha=1.0, beta=0.0):
        """``alpha * A^T @ x + beta * out`` (A^H for ``op.H``): ``op.rmatvec``, which
        computes A^H (conjugated around it for A^T of complex values)."""
        if self.conjugate or np.dtype(self.operator.dtype).kind != "c":
            return self.operator.rmatvec(x, out=out, alpha=alpha, beta=beta)
        return _conjugated_product(self.operator, self.operator.rmatvec, x, out, alpha, beta)

    def rmatvec(self, x, out=None, alpha=1.0, beta=0.0):
        """``alpha * B^H @ x + beta * out`` for this view's B: ``op.matvec`` (A for
        ``op.H``; conj(A) for ``op.T`` of complex values)."""
        if self.conjugate or np.dtype(self.operator.dtype).kind != "c":
            return self.operator.matvec(x, out=out, alpha=alpha, beta=beta)
        return _conjugated_product(self.operator, self.operator.matvec, x, out, alpha, beta)

    def matmat(self, X, out=None, alpha=1.0, beta=0.0):
        check_block(X, "matmat")
        return self.matvec(X, out=out, alpha=alpha, beta=beta)

    def rmatmat(self, X, out=None, alpha=1.0, beta=0.0):
        check_block(X, "rmatmat")
        return self.rmatvec(X, out=out, alpha=alpha, beta=beta)

    def __matmul__(self, x):
        return self.matvec(x)

    def __rmatmul__(self, x):
        return rmatmul(self, x)

    def dot(self, x):
        return self.matvec(x)

    def aslinearoperator(self):
        return linear_operator(self)

    def __repr__(self):
        m, n = self.shape
        what = "conjugate-transposed" if self.conjugate else "transposed"
        return f"<{what} view ({m}x{n}) of {self.operator!r}>"


class ConjugateView(TransposedView):
    """conj(A) for a complex operator (``op.T.H``, ``op.H.T``): products as
    ``conj(A @ conj(x))``; ``.T`` is ``op.H``, ``.H`` is ``op.T``."""

    def __init__(self, op):
        super().__init__(op, conjugate=False)

    @property
    def shape(self):
        return self.operator.shape

    @property
    def T(self):
        return self.operator.H

    @property
    def H(self):
        return self.operator.T

    def matvec(self, x, out=None, alpha=1.0, beta=0.0):
        return _conjugated_product(self.operator, self.operator.matvec, x, out, alpha, beta)

    def rmatvec(self, x, out=None, alpha=1.0, beta=0.0):
        """``alpha * A^T @ x + beta * out``."""
        return self.operator.T.matvec(x, out=out, alpha=alpha, beta=beta)

    def __repr__(self):
        return f"<conjugate view of {self.operator!r}>"


@functools.cache
def _linear_operator_class():
    # scipy.sparse.linalg costs ~0.15 s to import: only when asked for.
    from scipy.sparse.linalg import LinearOperator

    class DeviceLinearOperator(LinearOperator):
        """A scipy LinearOperator whose products run on an OpenCL device."""

        def __init__(self, op):
            self.operator = op
            super().__init__(dtype=op.dtype, shape=op.shape)

        def _matvec(self, x):
            return self.operator.matvec(x)

        def _rmatvec(self, x):
            return self.operator.rmatvec(x)

        def _matmat(self, X):
            return self.operator.matmat(X)

        def _rmatmat(self, X):
            return self.operator.rmatmat(X)

        def _adjoint(self):
            return DeviceLinearOperator(self.operator.H)

        def _transpose(self):
            return DeviceLinearOperator(self.operator.T)

        def __copy__(self):   # another wrapper of the same operator
            return DeviceLinearOperator(self.operator)

        # pickle and deepcopy: the operator's refusal (pickle would fail first on this
        # class, local to a function, with an error that says nothing of why).
        def __reduce_ex__(self, protocol):
            raise InvalidTypeError(
                "a pyspmv_cl LinearOperator cannot be pickled or deep-copied: its operator "
                "owns buffers on its device; build another operator from the matrix, e.g. "
                "SpMV(A, format=op.format, **op.params).aslinearoperator()")

        __deepcopy__ = __reduce__ = __reduce_ex__

    return DeviceLinearOperator


def linear_operator(op):
    """``op`` as a ``scipy.sparse.linalg.LinearOperator`` (matvec, rmatvec, matmat,
    rmatmat, adjoint and transpose all run on the device)."""
    return _linear_operator_class()(op)
