"""The user-facing SpMV operator: y = alpha * A @ x + beta * y on one OpenCL device."""

import functools
import math
import threading
import weakref

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy.sparse as sp

from . import host_arrays
from .adjoint import (
    TransposedCopy,
    TransposedView,
    check_block,
    check_operands,
    linear_operator,
    rmatmul,
)
from .array_ops import scale_and_add
from .block_copy import BlockCopy, copy_seconds, saved_seconds, wants_copy
from .device import get_device, runs_in_calling_thread
from .device_inputs import (
    DeviceCSR,
    as_device_csr,
    check_contiguous,
    check_device_value_range,
    is_device_triple,
)
from .errors import (
    DeviceCapabilityError,
    InvalidInputError,
    InvalidParameterError,
    InvalidTypeError,
    PySpMVError,
    UnknownParameterError,
    UnsupportedDtypeError,
    UnsupportedLayoutError,
)
from .features import MatrixFeatures, product_bytes
from .formats import FORMATS, get_format
from .formats import params as P
from .formats.base import instantiate
from .formats.columns import (
    ColumnPath,
    StagingBlocks,
    Transpose,
    column_major_only,
    columns_product,
    relayout,
)
from .formats.storage import refuse_reduced_auto
from .formats.values import ValueUpdater, check_values
from .host_buffers import COPY, host_buffer, spin_seconds, usable_in_place, wait_and_read
from .inputs import (
    as_host_csr,
    check_host_out,
    check_scalar,
    check_scalar_range,
    check_value_range,
    is_complex,
    needs_fp64,
    refuse_an_operator,
    refuse_non_dense,
    resolve_dtype,
)
from .launching import in_order
from .numbering import hint as numbering_hint
from .tuning.online import CPU_BYTES_PER_SECOND
from .tuning.tuner import select


def _is_device_array(obj):
    return isinstance(obj, cla.Array)


def _memory_root(buf):
    """The buffer a sub-buffer was cut from, else the buffer itself (OpenCL has no
    sub-buffers of sub-buffers): two arrays on one root may share memory."""
    return buf.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) or buf


class SpMV:
    """A sparse matrix stored on an OpenCL device in one format, ready to multiply.

    Parameters
    ----------
    A : scipy.sparse matrix or array, or (data, indices, indptr)
        The matrix; a CSR triple needs ``shape``.  Converted once, at construction.
    format : str
        A name from :func:`pyspmv_cl.formats`, or ``"auto"`` to let the library choose.
    dtype : float32 or float64, optional
        Value type on the device.  Default: the matrix's own float type (integer
        matrices are computed in float64, or float32 on devices without fp64).
    device : optional
        See :func:`pyspmv_cl.get_device` (a Device, a pyopencl Device/Context/
        CommandQueue, an index or a selection string).  Default: ``PYSPMV_CL_DEVICE``,
        else the first GPU, else the first CPU.
    tune : None, True, False or "force"
        With ``format="auto"``: ``None`` (default; ``PYSPMV_CL_TUNE`` changes it) reuses
        a decision from the tuning database, else measures candidates on the device when
        that pays off (at least 100k non-zeros, or ``expected_calls`` large enough),
        else uses the rules; ``True`` measures unless a decision is stored; ``"force"``
        re-measures and overwrites it; ``False`` uses the rules only.
    expected_calls : int, optional
        How many products the caller will run: the tuner then minimises kernel time x
        calls + conversion time, and measures only when that can repay the tuning.
    tune_budget : float, optional
        Seconds the measurement may take, building included (default 1.5 s per million
        non-zeros, at least 1 s; ``PYSPMV_CL_TUNE_BUDGET`` sets the per-million rate).
    block_size : int, optional
        With ``format="auto"``: the vectors per product the caller will multiply
        (``op @ X`` with X of shape (n, k)); default 1.  Above 1, candidates are timed
        on products of that many vectors (block kernels, or one product per vector for
        formats without them), and the decision is stored apart for its class of k
        (1, 2-4, 5-8, 9-16, 17+; ``op.tuning.block_size`` says which k).
    block_copy : bool, default True
        Whether block products of a format without block kernels (coo, hyb, csr5,
        bccoo, cmrs, ellr-t, dia) run on a CSR copy with block kernels, made once the
        block products run column by column have paid for it, or by
        ``build_block_copy()`` (``block_copy.py``: the memory of a second matrix), when
        the operator was not tuned for blocks; ``False`` keeps them column by column.
    **params
        Format parameters (e.g. ``vector_size=8``, ``work_group_size=128``,
        ``index_bits=64``); unknown names are refused.

    Attributes: ``format``, ``params``, ``explanation`` (with ``format="auto"``: what
    was chosen and why, with the measured times), ``tuning`` (the tuner's decision:
    ``source`` is "model", "measured" or "database"; ``tuning_seconds``), ``nbytes``
    (device footprint: the matrix, plus the value map of ``update_values``, the
    transposed copy and the block copy once made; ``nbytes_parts`` splits it),
    ``shape``, ``dtype``,
    ``device``, ``conversion_time`` (seconds spent converting and uploading),
    ``build_time`` (seconds spent getting the compiled kernel: near zero from the
    kernel cache), ``T`` and ``H`` (A^T and A^H as operators; the same for real
    values), ``transposed`` (the operator of A^T once a transposed product made it),
    ``block_copy`` (the CSR operator of block products, once made).

    Result types follow numpy's promotion: ``op @ x`` has dtype
    ``numpy.result_type(op.dtype, x.dtype)`` (float64 for a float64 or int32/int64
    ``x`` with a float32 operator), computed by the operator's kernel in ``op.dtype``
    (``x`` rounded to it first) and cast; see ``matvec``.

    One operator may be shared by several threads: its products and value updates
    run one at a time (a lock per operator), as they would on the device's queue.
    """

    def __init__(self, A, format="auto", dtype=None, device=None, *, shape=None, tune=None,
                 expected_calls=None, tune_budget=None, block_size=None, block_copy=True,
                 **params):
        if not isinstance(block_copy, bool):
            raise InvalidInputError(f"block_copy must be True or False, not {block_copy!r}")
        self._allow_block_copy = block_copy
        # The caller's request, for the transposed copy's format (adjoint.py).
        self._request = {"format": format, "params": dict(params), "tune": tune,
                         "expected_calls": expected_calls, "tune_budget": tune_budget,
                         "block_size": block_size, "block_copy": block_copy}
        on_device = is_device_triple(A)
        if on_device and device is None and A[0].queue is not None:
            device = A[0].queue   # the arrays' own queue, not the default device
        host_csr = None if on_device else as_host_csr(A, shape)
        # The product's size picks PoCL's driver where both are exposed (get_device).
        work = None
        if host_csr is not None:
            k = block_size if isinstance(block_size, int) and block_size > 1 else 1
            work = host_csr.nnz * k
        self.device = get_device(device, work=work)
        profile = self.device.profile
        csr = as_device_csr(A, shape, self.queue) if on_device else host_csr
        self.shape = (int(csr.shape[0]), int(csr.shape[1]))
        self.dtype = resolve_dtype(dtype, csr.dtype, profile)
        # float64 values past float32's range: refused, not stored as inf
        if host_csr is not None:
            check_value_range(host_csr.data, self.dtype)
        else:
            check_device_value_range(csr.data, self.dtype, self.device)
        # The diagonal count (a pass over the non-zeros) only where the choice reads it.
        features = MatrixFeatures.from_csr(csr, count_diagonals=False)
        self.tuning = None
        impl = None
        if format == "auto":
            refuse_reduced_auto(params, self.dtype)
            self.tuning = select(csr, features, self.device, self.dtype, params, tune=tune,
                                 expected_calls=expected_calls, budget=tune_budget,
                                 block_size=block_size)
            format, impl = self.tuning.format, self.tuning.impl
            params = {**params, **self.tuning.params}
            self.explanation = self.tuning.explanation
            self.tuning.impl = None  # the operator owns it now
            fmt_cls = get_format(format)
        else:
            fmt_cls = get_format(format)   # an unknown name is said so first ("auto " too)
            if tune is not None or expected_calls is not None or tune_budget is not None \
                    or block_size is not None:
                raise InvalidInputError("tune, expected_calls, tune_budget and block_size "
                                        "apply to format='auto' only")
            self.explanation = "format chosen by the caller"
        if impl is not None and self.tuning.source == "database":   # built now
            self._impl = impl
            self.conversion_time = impl.conversion_seconds
            self.build_time = impl.build_seconds
        elif impl is not None:  # built and timed by the tuner: keep it
            self._impl = impl
            self.conversion_time = self.tuning.entry and next(
                (c["conversion_seconds"] for c in self.tuning.entry["candidates"]
                 if c["format"] == format and c["params"] == self.tuning.params), 0.0)
            self.build_time = 0.0
        else:
            try:
                resolved = fmt_cls.resolve_params(features, profile, self.dtype, params)
            except UnknownParameterError as exc:
                if self.tuning is None:
                    raise
                raise _not_for_the_chosen_format(params, format, self.explanation) from exc
            self._impl = instantiate(fmt_cls, csr, self.device, self.dtype, resolved,
                                     features=features)
            self.conversion_time = self._impl.conversion_seconds
            self.build_time = self._impl.build_seconds
        self.format = format
        # A hint to renumber a scattered matrix (GPUs; sampled, about a millisecond),
        # kept for the explanation an online tuning writes later.
        self._numbering_hint = numbering_hint(host_csr, self.dtype.itemsize) \
            if profile.is_gpu and host_csr is not None else ""
        self.explanation += self._numbering_hint
        self._staging = {}
        # Block staging (grow-only, by role): copies of X and Y, the column path's blocks.
        self._block_staging = StagingBlocks(self.device.context, self.dtype)
        # Host vectors multiplied in place on devices that compute in host memory.
        self._host_mode = self.device.host_arrays
        self._lock = threading.RLock()
        self._queue_in_order = in_order(self.queue)   # a driver query: once, not per call
        # On an out-of-order queue: the last event of the latest product, which the next
        # one waits for (products share the staging buffers and the formats' scratch).
        self._previous = None
        # The pattern, for update_values and the transposed and block copies: the
        # operator's own, never the caller's host arrays (_kept_pattern).
        self._nnz = int(csr.nnz)
        self._structure_source = _kept_pattern(csr, A, self._impl, self.queue)
        self._updater = None
        self._values_version = 0
        self._latest_values = None   # kept while an online tuning may still switch
        self._host_values = None     # the last update's values, for a format without map
        self._online = self.tuning.online if self.tuning is not None else None
        self._transposed = None      # adjoint.TransposedCopy, made by the first A^T product
        # What this operator is of another one that keeps it in step ("the transposed
        # copy", "the block copy"), else None: then its own update_values refuses.
        self._copy_of = None
        self._transposed_view = None
        self._adjoint_view = None    # op.H of a complex operator
        self._column_path = None     # formats/columns.py's ColumnPath, of _device_columns
        self._transposes = {}        # dtype -> Transpose, for column-major device blocks
        # (x, out, x's buffer, out's buffer, block) of the last device product whose
        # arrays passed every check (_matvec_device_again).
        self._device_memo = None
        self._block_copy = None      # block_copy.BlockCopy, once block products paid for it
        self._block_copy_error = None   # why it could not be made (then: column by column)
        self._block_rent = 0.0       # seconds the column path's products are guessed to
        #                              have lost to the copy so far (block_copy.py)

    # -- descriptive ---------------------------------------------------------------
    @property
    def params(self):
        return dict(self._impl.params)

    @property
    def queue(self):
        return self.device.queue

    @property
    def nbytes_parts(self) -> dict:
        """Device bytes by what they hold: ``matrix`` (the format's arrays and scratch;
        for a matrix given on the device in a format other than the CSR kernels', the
        copy of its column indices the operator keeps: ``_kept_pattern``),
        ``value_map`` (``update_values``' slot map, made by the first update) and
        ``transposed`` (the copy of A^T made by the first transposed product, its own
        value map included) and ``blocks`` (the CSR copy behind the block products of a
        format without block kernels, once made: ``block_copy``)."""
        updater = self._updater
        copy = self._transposed
        blocks = self._block_copy
        source = self._structure_source
        kept = source.indices.nbytes if isinstance(source, DeviceCSR) else 0
        return {"matrix": self._impl.nbytes + kept,
                "value_map": updater.nbytes if updater is not None
                and updater.fmt is self._impl else 0,
                "transposed": copy.operator.nbytes if copy is not None else 0,
                "blocks": blocks.operator.nbytes if blocks is not None else 0}

    @property
    def nbytes(self) -> int:
        """Device bytes this operator holds (the sum of ``nbytes_parts``)."""
        return sum(self.nbytes_parts.values())

    def __repr__(self):
        m, n = self.shape
        return (f"<pyspmv_cl.SpMV {m}x{n} {self.dtype} format={self.format!r} "
                f"params={self.params} on {self.device.profile.name!r}>")

    # An operator owns device buffers, kernels bound to them and a queue: a shallow copy
    # would share them (an update_values through the copy changed the original), and
    # none of them can be pickled.  Refused with the way to get another operator.
    def _not_copyable(self, *args):
        raise InvalidTypeError(
            "a pyspmv_cl SpMV operator cannot be copied or pickled (it owns buffers on its "
            "device): build another from the matrix, e.g. SpMV(A, format=op.format, "
            "**op.params) for the same choice")

    __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = __getstate__ = _not_copyable

    # -- multiplication --------------------------------------------------------------
    __array_ufunc__ = None   # numpy defers to us: x @ op comes to __rmatmul__

    def __matmul__(self, x):
        return self.matvec(x)

    def __mul__(self, other):
        raise InvalidTypeError(
            "op * x is not defined for an operator (nor np.dot(op, x), which numpy "
            "computes with *): the product is op @ x (or op.matvec(x, alpha=...) for a "
            "scaled one)")

    __rmul__ = __mul__

    def __rmatmul__(self, x):
        """``x @ op``: ``op.T @ x`` for a vector, ``(op.T @ x.T).T`` for rows."""
        return rmatmul(self, x)

    def dot(self, x):
        return self.matvec(x)

    def matvec(self, x, out=None, alpha=1.0, beta=0.0):
        """Return ``alpha * A @ x + beta * out`` (stored into ``out`` when given).

        ``x`` and ``out`` may be numpy arrays (host) or pyopencl arrays on this
        operator's context, contiguous, at any offset in their buffer (views of a
        larger array: a view on the device's base-address alignment is used in place,
        another goes through a temporary), and they stay on the device; the call then
        returns without waiting, ordered by the arrays' events.  ``out`` may be ``x``
        or overlap it.  With ``beta == 0`` the old contents of ``out`` are never read.
        ``x`` may be 1-D or ``(n, 1)``; an ``x`` of shape ``(n, k)`` is a block of
        vectors (see ``matmat``).

        Types (numpy's promotion): without ``out`` the result has dtype
        ``numpy.result_type(op.dtype, x.dtype)``.  The kernel always computes in
        ``op.dtype``: ``x`` is rounded to it first and the result cast, so a float64
        ``x`` with a float32 operator gives a float64 array of float32 accuracy (build
        the operator with ``dtype=numpy.float64`` for float64 accuracy).  A given
        ``out`` may be any float type (host) and receives the result cast, as numpy's
        ``out=`` does.  Device arrays must be float32 or float64: one of the other
        type is cast on the device (a temporary and one copy kernel per call; keep
        them in ``op.dtype`` to avoid it).
        """
        refuse_an_operator("x", x)
        alpha, beta = self._scalar("alpha", alpha), self._scalar("beta", beta)
        if beta != 0 and out is None:
            raise InvalidInputError("beta != 0 needs out= holding the y to accumulate into")
        # One product at a time per operator: host vectors go through its staging
        # buffers, and its kernels keep their arguments between products.  Products
        # share the device's queue anyway; the lock costs well under a microsecond.
        with self._lock:
            if _is_device_array(x):
                self._check_real_device(x, out, alpha, beta)
                return self._matvec_device(x, out, alpha, beta)
            if self._needs_split(x, out, alpha, beta):
                return self._matvec_split(x, out, alpha, beta)
            return self._matvec_host(x, out, alpha, beta)

    def matmat(self, X, out=None, alpha=1.0, beta=0.0):
        """``alpha * A @ X + beta * out`` for a 2-D ``X`` of shape ``(n, k)`` (``op @ X``
        does the same).  Types and arguments as in ``matvec``.

        Formats with block kernels (``op.has_block_kernels``: csr-scalar, csr-vector
        with ``mapping="rows"``, ell, sell) read the matrix once per block of up to 16
        vectors (``k`` is cut into blocks of 16, 8, 4, 2, 1; of 8 at most for complex
        values), from a row-major ``n x k`` copy of X on the device: a host ``X`` of
        any order, a view included, is copied into one (and the result read back from
        a row-major ``m x k`` block);
        a device ``X`` and ``out`` are pyopencl arrays at any offset, row-major (used
        in place) or column-major (transposed on the device through row-major
        temporaries); strided views raise ``UnsupportedLayoutError``.  Other formats
        multiply column by column (device arrays through a column copy on the
        device)."""
        refuse_an_operator("X", X)
        check_block(X, "matmat")
        return self.matvec(X, out=out, alpha=alpha, beta=beta)

    # -- transposed products -----------------------------------------------------------
    @property
    def T(self):
        """A^T as an operator (``op.T @ x``, ``op.T.matvec(x, out, alpha, beta)``,
        ``op.T.T is op``).  Its products run on the transposed copy (see
        ``rmatvec``)."""
        # Held weakly: the view holds the operator, and an operator holding its view
        # made a cycle that kept the matrix and its transposed copy on the device until
        # a full garbage collection (an operator a time step piled up).
        view = self._transposed_view and self._transposed_view()
        if view is None:
            view = TransposedView(self)
            self._transposed_view = weakref.ref(view)
        return view

    @property
    def H(self):
        """A^H, the conjugate transpose (``op.T`` itself for real values): its products
        are ``rmatvec``'s, on the transposed copy, which holds A^H for complex values
        (``op.T`` then conjugates around it)."""
        if not self.is_complex:
            return self.T
        view = self._adjoint_view and self._adjoint_view()   # (weakly: see T)
        if view is None:
            view = TransposedView(self, conjugate=True)
            self._adjoint_view = weakref.ref(view)
        return view

    @property
    def transposed(self):
        """The operator of A^T (A^H for complex values; an ``SpMV``: ``format``,
        ``params``, ``nbytes``, ``explanation``) once a transposed product made it, else None."""
        copy = self._transposed
        return copy.operator if copy is not None else None

    def build_transposed(self):
        """Make the transposed copy (A^T; A^H for complex values) now rather than at the
        first transposed product, and return its operator (see ``rmatvec``)."""
        with self._lock:
            if self._transposed is None:
                self._transposed = TransposedCopy(self, type(self))
            return self._transposed.operator

    def rmatvec(self, x, out=None, alpha=1.0, beta=0.0):
        """Return ``alpha * A^H @ x + beta * out`` (``A^T`` for real values), with the
        arguments, device arrays and types of ``matvec``; ``x`` has ``m`` entries.

        The first call builds a transposed copy: the operator's values are read back
        from the device, A^T is made on the host by a stable sort of the column indices
        and converted into a second operator on the same device and dtype, in the
        caller's format when it fixed one that takes A^T (else ``format="auto"``).
        That costs one conversion and the memory of a second matrix (``nbytes`` grows;
        ``nbytes_parts["transposed"]``); products then run as fast as ``matvec`` and
        stay deterministic (no atomics).  ``update_values`` keeps the copy in step.
        """
        return self._rproduct(x, out, alpha, beta, "rmatvec")

    def rmatmat(self, X, out=None, alpha=1.0, beta=0.0):
        """``alpha * A^H @ X + beta * out`` for a 2-D ``X`` of shape ``(m, k)``: the
        transposed copy's ``matmat`` (block kernels where its format has them; see
        ``matmat`` and ``rmatvec``)."""
        check_block(X, "rmatmat")
        return self._rproduct(X, out, alpha, beta, "rmatmat")

    def _rproduct(self, x, out, alpha, beta, name):
        """rmatvec/rmatmat (``name``: what their errors are labelled)."""
        refuse_an_operator("x", x)   # before the transposed copy is built for it
        alpha, beta = self._scalar("alpha", alpha), self._scalar("beta", beta)
        check_operands(self.H, x, out, beta, name)
        with self._lock:   # A and A^T in step: update_values holds it as well
            return self.build_transposed().matvec(x, out=out, alpha=alpha, beta=beta)

    # -- helpers -------------------------------------------------------------------------
    def _scalar(self, name, value):
        """alpha/beta: a complex for a complex operator, a float where the value is real
        (a real operator given a complex one computes through ``_matvec_split``)."""
        if type(value) is float:   # the usual 1.0 and 0.0: what the checks would return
            if value not in (0.0, 1.0) and self._narrow_scalars:
                check_scalar_range(name, value, self.dtype)
            return complex(value) if self.is_complex else value
        if isinstance(value, (complex, np.complexfloating)):   # numpy's rule goes by type:
            value = complex(value)                             # complex even if 1+0j
        else:
            value = check_scalar(name, value, complex_ok=self.is_complex)
        # (a real operator applies complex scalars on the host, in the complex result's
        # type: _matvec_split)
        if self._narrow_scalars and (self.is_complex or not isinstance(value, complex)):
            check_scalar_range(name, value, self.dtype)
        return value

    @functools.cached_property
    def _narrow_scalars(self) -> bool:
        """Whether alpha and beta go to the kernels in 32 bits (float32, complex64)."""
        return self.dtype in (np.float32, np.complex64)

    @functools.cached_property
    def _host_spin(self) -> float:
        """Seconds a host product polls its event before waiting on it
        (``host_buffers.spin_seconds``): on CPU devices whose kernels run on worker
        threads, for products guessed short from their bytes."""
        if not self.device.profile.is_cpu or runs_in_calling_thread(self.device):
            return 0.0
        nbytes = product_bytes(self._nnz, *self.shape, self.dtype)
        return spin_seconds(nbytes / CPU_BYTES_PER_SECOND)

    @functools.cached_property
    def is_complex(self) -> bool:
        """Whether the operator's values are complex (complex64/complex128)."""
        return is_complex(self.dtype)

    def _needs_split(self, x, out, alpha, beta):
        """A real operator with complex host operands (x, out or the scalars)."""
        if self.is_complex:
            return False
        kinds = [getattr(np.asarray(x) if not isinstance(x, (str, bytes, dict, set))
                         and x is not None and not sp.issparse(x) else x, "dtype", None),
                 getattr(out, "dtype", None)]
        return (isinstance(alpha, complex) or isinstance(beta, complex)
                or any(k is not None and k.kind == "c" for k in kinds))

    def _matvec_split(self, x, out, alpha, beta):
        """A real operator times complex host operands (numpy's promotion): two real
        products, of the real and the imaginary parts of x, computed in ``op.dtype``;
        alpha, beta and out applied on the host."""
        x = np.asarray(x)
        self._check_x_shape(x.shape)
        expected = self._out_shape(x.shape)
        base = np.result_type(self.dtype, x.dtype)
        result_dtype = base if base.kind == "c" else np.result_type(base, np.complex64)
        if out is not None:
            if _is_device_array(out):
                raise UnsupportedDtypeError(self._real_device_message())
            check_host_out(out)
            self._check_out(out, expected)
            if out.dtype.kind != "c":   # numpy's out= refuses complex -> real too
                raise UnsupportedDtypeError(
                    f"the result is complex ({result_dtype}) but out is {out.dtype}: give "
                    "a complex out")
        # Parts assembled and scaled apart where the scalar is real: a complex multiply
        # by alpha + 0j, and 1j times a real part, would turn an inf into inf + NaN j.
        z = np.zeros(expected, dtype=result_dtype)
        z.real = self._matvec_host(np.real(x), None, 1.0, 0.0)
        if x.dtype.kind == "c":
            z.imag = self._matvec_host(np.imag(x), None, 1.0, 0.0)
        with np.errstate(all="ignore"):   # (inf and NaN as the kernels give them)
            if isinstance(alpha, complex):
                z *= alpha
            elif alpha != 1:   # each real product scaled, as a real operator does
                z.real *= alpha
                if x.dtype.kind == "c":
                    z.imag *= alpha
            if beta != 0:   # numpy's beta * out; 1 not multiplied in (README)
                z += out if beta == 1 else beta * out
        if out is None:
            return z
        out[...] = z
        return out

    def _real_device_message(self):
        return (f"this operator is real ({self.dtype}): it multiplies complex device "
                "arrays (or complex alpha/beta with device arrays) only as a complex "
                "operator: build it with SpMV(A, dtype=numpy.complex64 or "
                "numpy.complex128), or multiply x.real and x.imag separately (host "
                "arrays are split that way automatically)")

    def _check_real_device(self, x, out, alpha, beta):
        if self.is_complex:
            return
        if isinstance(alpha, complex) or isinstance(beta, complex) or x.dtype.kind == "c" \
                or (out is not None and getattr(out, "dtype", None) is not None
                    and out.dtype.kind == "c"):
            raise UnsupportedDtypeError(self._real_device_message())

    def _finer(self, dtype) -> bool:
        """Whether an out of ``dtype`` holds more precision than the operator computes
        in (float64 for a float32 operator, complex128 for complex64)."""
        dtype = np.dtype(dtype)
        return dtype.kind in "fc" and np.finfo(dtype).bits > np.finfo(self.dtype).bits

    def _check_vector_dtype(self, name, dtype):
        if dtype.kind not in "fiubc":
            raise UnsupportedDtypeError(f"{name} has non-numeric dtype {dtype}")

    def _check_x_shape(self, shape):
        n = self.shape[1]
        if len(shape) not in (1, 2) or shape[0] != n:
            raise InvalidInputError(f"x has shape {shape}; this {self.shape[0]}x{n} matrix needs "
                             f"({n},) or ({n}, k)")

    def _out_shape(self, x_shape):
        return (self.shape[0],) + tuple(x_shape[1:])

    def _check_out(self, out, expected_shape):
        if tuple(out.shape) != expected_shape:
            raise InvalidInputError(f"out has shape {tuple(out.shape)}, expected {expected_shape}")

    def _staging_buffer(self, role, n):
        buf = self._staging.get(role)
        if buf is None:
            nbytes = max(1, n) * self.dtype.itemsize
            buf = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, nbytes)
            self._staging[role] = buf
        return buf

    def _after_previous(self, wait_for):
        """``wait_for`` plus, on an out-of-order queue, the previous product's end: it
        may still read the staging buffers or the format's scratch arrays (carries
        between kernels) that this product writes."""
        if self._previous is None:
            return wait_for
        return [*(wait_for or ()), self._previous]

    def _launch(self, x_buf, y_buf, alpha, beta, wait_for=None, block=None):
        """One product: a vector (``block`` None), or ``block`` = k vectors as
        row-major blocks (the format's block kernels)."""
        if self._online is not None:
            self._poll_online()
            if block is not None and not self._impl.has_block_kernels:
                # Switched here, inside a block product its caller routed to block
                # kernels, to a format without them: its own path (the block copy, or
                # column by column), whose products come back here one by one.
                return self._device_product(x_buf, y_buf, alpha, beta, wait_for, block)
        online = self._online
        if online is not None and online.gates_products:
            with online.product_slot():   # not during a timing burst of the measurement
                event = self._enqueue(x_buf, y_buf, alpha, beta, wait_for, block)
                online.note_call(self._impl, self._values_version, self.queue, event,
                                 block or 1)
            return event
        # Otherwise no gate: its context manager costs about a microsecond a product.
        event = self._enqueue(x_buf, y_buf, alpha, beta, wait_for, block)
        if online is not None:
            online.note_call(self._impl, self._values_version, self.queue, event, block or 1)
        return event

    def _enqueue(self, x_buf, y_buf, alpha, beta, wait_for, block):
        if block is None:
            event = self._impl.enqueue(self.queue, x_buf, y_buf, alpha, beta,
                                       wait_for=self._after_previous(wait_for))
        else:
            event = self._impl.enqueue_block(self.queue, x_buf, y_buf, block, block, block,
                                             alpha, beta,
                                             wait_for=self._after_previous(wait_for))
        if not self._queue_in_order:
            self._previous = event
        return event

    # -- online tuning ----------------------------------------------------------------------
    def _poll_online(self):
        """Switch to the online tuner's winner once it is ready (here, in the caller's
        thread, between two products: no implementation is used by two threads)."""
        tuning = self._online
        if tuning.state == "waiting":
            return
        done = tuning.state != "running"   # read first: take() then sees the final state
        taken = tuning.take()
        if taken is not None:
            fmt, impl = taken
            # Built on the measurement's own queue (done there); from now on this
            # operator's: its later uploads (update_values' maps) go on the operator's.
            impl.device = self.device
            if self._structure_source is None and not _reads_pattern_back(impl):
                # The start format could read the pattern back, the new one cannot:
                # the measurement's snapshot of it (read from the device) is kept.
                self._structure_source = _Pattern(*tuning.structure)
            if tuning.values_version != self._values_version:
                # Values updated after the snapshot the candidates were built from.
                ValueUpdater(impl, self._structure_getter(), self._nnz).update(
                    self.queue, self._latest_values)
            self._impl = impl
            self.format = fmt
            self._updater = None
            if impl.has_block_kernels:   # blocks run on the new format: copy not needed
                self._block_copy = None
            if not done:
                self.explanation += (f"; switched to {fmt} after {tuning.calls} products, "
                                     "still measuring")
        if not done:
            return
        if tuning.state == "done":
            final = tuning.decision
            self.explanation = final.explanation + self._numbering_hint
            # op.tuning tells the decision taken (a test drive found it still naming the
            # start format); its source ("online") and online record stay.
            for name in ("format", "params", "explanation", "entry", "kernel_seconds",
                         "tuning_seconds"):
                setattr(self.tuning, name, getattr(final, name))
        elif tuning.state == "failed":
            self.explanation += f" (online tuning failed: {tuning.error}; kept the start format)"
        self._online = None
        self._latest_values = None
        tuning.structure = None

    def finish_tuning(self, timeout=None) -> str:
        """With online tuning (``format="auto"`` on a matrix the tuning database does not
        know): start the background measurement now if it has not started, wait for it
        (at most ``timeout`` seconds) and switch to the winner.  Returns the tuning's
        state ("done", "failed", "running" when the timeout passed, or "none" when this
        operator does not tune online)."""
        if timeout is not None:   # checked before anything starts
            try:
                seconds = P.number()(timeout)
            except P.Invalid:   # not a number at all: a TypeError
                raise InvalidTypeError(f"timeout must be None or seconds >= 0, not "
                                       f"{timeout!r}") from None
            if not seconds >= 0:   # a number out of range (NaN too): a ValueError
                raise InvalidParameterError(f"timeout must be None or seconds >= 0, not "
                                            f"{timeout!r}")
            if seconds == math.inf:   # no limit (Thread.join(inf) overflows)
                timeout = None
        tuning = self.tuning.online if self.tuning is not None else None
        if tuning is None:
            return "none"
        with self._lock:
            if self._online is not None and tuning.state == "waiting":
                tuning.start_at_next()
                tuning.note_call(self._impl, self._values_version)
        tuning.wait(timeout)   # products of other threads go on meanwhile
        with self._lock:
            if self._online is not None and tuning.state not in ("waiting", "running"):
                self._poll_online()
        return tuning.state

    @property
    def block_copy(self):
        """The CSR operator (csr-scalar) that runs this operator's block products when
        its format has no block kernels and it was not tuned for blocks, once block
        products have paid for it or ``build_block_copy`` made it (``block_copy.py``),
        else None."""
        copy = self._block_copy
        return copy.operator if copy is not None else None

    def build_block_copy(self):
        """Make the block copy now rather than once block products have paid for it
        (see ``block_copy``), and return its operator; None where this operator
        multiplies blocks itself (its format has block kernels, it was tuned for
        blocks, ``block_copy=False``) or the copy could not be made."""
        with self._lock:
            copy = self._blocks_for(2, now=True)
            return copy.operator if copy is not None else None

    def _blocks_for(self, k, now=False):
        """The block copy for a product of ``k`` vectors (made now if the column path's
        products have paid for it, ``block_copy.py``, or ``now``); None where the
        operator multiplies this block itself: its block kernels, or column by column
        (the copy not paid for yet or not possible, tuned for blocks, not wanted)."""
        if not wants_copy(self, k):
            return None
        copy = self._block_copy
        if copy is None and self._block_copy_error is None:
            if not now:
                self._block_rent += saved_seconds(self, k)
                if self._block_rent < copy_seconds(self):
                    return None
            try:
                copy = BlockCopy(self, type(self))
            except (PySpMVError, cl.Error, MemoryError) as exc:
                # E.g. no device memory for a second matrix: column by column instead.
                self._block_copy_error = f"{type(exc).__name__}: {exc}"
                return None
            if not copy.usable:
                self._block_copy_error = "the copy has no block kernels either"
                return None
            self._block_copy = copy
        return copy

    @property
    def has_block_kernels(self) -> bool:
        """Whether the current format multiplies a block of vectors with kernels that
        read the matrix once per block (else ``matmat`` runs one product per column)."""
        return self._impl.has_block_kernels

    def _matmat_host(self, X, out, alpha, beta, result_dtype):
        """Host block product: X as a row-major ``n x k`` block on the device, one
        block product, Y read back (see ``matmat``)."""
        (m, n), k = self.shape, X.shape[1]
        result = out if out is not None else np.empty((m, k), dtype=result_dtype)
        if m == 0 or k == 0:
            return result
        queue = self.queue
        x_host = np.ascontiguousarray(X, dtype=self.dtype)   # row-major, op.dtype
        if self._host_mode != COPY:
            self._in_place(x_host, result, alpha, beta, block=k)
            return result
        x_buf = self._block_staging("X", n * k)
        y_buf = self._block_staging("Y", m * k)
        uploads = []
        if n:
            uploads.append(cl.enqueue_copy(queue, x_buf, x_host, is_blocking=False))
        if beta != 0:
            uploads.append(cl.enqueue_copy(
                queue, y_buf, np.ascontiguousarray(out, dtype=self.dtype), is_blocking=False))
        event = self._launch(x_buf, y_buf, alpha, beta, wait_for=uploads, block=k)
        direct = result.dtype == self.dtype and result.flags.c_contiguous
        y_host = result if direct else np.empty((m, k), dtype=self.dtype)
        cl.enqueue_copy(queue, y_host, y_buf, wait_for=[event], is_blocking=True)
        if not direct:
            result[...] = y_host
        return result

    def _in_place(self, x_host, target, alpha, beta, block=None):
        """One product on a device that computes in host memory (``host_buffers``): the
        kernels read ``x_host`` (C-contiguous, ``op.dtype``) where it lies and write
        ``target`` itself when it is C-contiguous, in ``op.dtype`` and apart from x,
        else a temporary (holding target's values when beta != 0) copied into it."""
        if x_host.size and not usable_in_place(x_host):
            x_host = x_host.copy()   # (numpy allocates at 16 bytes or more)
        direct = (target.dtype == self.dtype and target.flags.c_contiguous
                  and not np.may_share_memory(target, x_host)
                  and usable_in_place(target))
        y_host = target if direct else np.empty(target.shape, dtype=self.dtype)
        if beta != 0 and not direct:
            y_host[...] = target
        context = self.device.context
        x_buf = (host_buffer(context, x_host, writable=False) if x_host.size
                 else self._staging_buffer("x", 0))
        y_buf = host_buffer(context, y_host, writable=True)
        event = self._launch(x_buf, y_buf, alpha, beta, block=block)
        wait_and_read(self.queue, y_buf, y_host, event, self._host_mode,
                      spin=self._host_spin if block is None else 0.0)
        if not direct:
            target[...] = y_host

    def _device_columns(self, x_buf, y_buf, k, alpha, beta, wait_for):
        """A device block product for a format without block kernels: one transpose of
        the row-major X into the staging block "Xt" (and of Y into "Yt" when beta !=
        0), one product per column of Xt into the column of Yt, and one transpose of Yt
        into Y (``formats/columns.py``, which the tuner times too)."""
        if self._column_path is None:
            self._column_path = ColumnPath(self.device, self.dtype)

        def product(x_column, y_column, waits):
            return self._launch(x_column, y_column, alpha, beta, wait_for=waits)

        event = columns_product(self._column_path, self.queue, product, x_buf, y_buf,
                                self._block_staging, self.shape, k, beta,
                                self._after_previous(wait_for))
        if not self._queue_in_order:
            self._previous = event
        return event

    def _matvec_host(self, x, out, alpha, beta):
        refuse_non_dense(x, self.shape[1])
        x = np.asarray(x)
        self._check_vector_dtype("x", x.dtype)
        self._check_x_shape(x.shape)
        expected = self._out_shape(x.shape)
        result_dtype = np.result_type(self.dtype, x.dtype)   # numpy's promotion
        if out is not None:
            if _is_device_array(out):
                return self._matvec_device(cla.to_device(self.queue, np.ascontiguousarray(
                    x, dtype=self.dtype)), out, alpha, beta)
            check_host_out(out, exact=True)
            if out.dtype.kind not in ("fc" if self.is_complex else "f"):
                raise UnsupportedDtypeError(f"out must hold floats, not {out.dtype}")
            if self.is_complex and out.dtype.kind != "c":
                raise UnsupportedDtypeError(
                    f"out is {out.dtype}, but this operator's products are complex "
                    f"({self.dtype}): give a complex out")
            self._check_out(out, expected)
            if beta != 0 and self._finer(out.dtype):
                # beta * out in out's own precision (numpy's rule), not rounded to
                # op.dtype first; the product computed in op.dtype as ever (x read
                # before out is written: they may overlap)
                y = self._matvec_host(x, None, alpha, 0.0)
                with np.errstate(all="ignore"):   # (inf and NaN as the kernels give them)
                    if beta != 1:   # (1 not multiplied in: README)
                        np.multiply(out, beta, out=out)
                    np.add(out, y.reshape(expected), out=out)
                return out
        if x.ndim == 2 and x.shape[1] != 1 and self.has_block_kernels:
            return self._matmat_host(x, out, alpha, beta, result_dtype)
        copy = self._blocks_for(x.shape[1]) if x.ndim == 2 else None
        if copy is not None:
            return copy.operator._matvec_host(x, out, alpha, beta)
        if x.ndim == 2 and x.shape[1] != 1:
            if out is not None and np.may_share_memory(x, out):
                # Column j of out is written before column j + 1 of x is read: a view
                # of out overlapping x's later columns would change them first.
                x = x.copy()
            result = out if out is not None else np.empty(expected, dtype=result_dtype)
            for j in range(x.shape[1]):  # one SpMV per column
                self._matvec_host(x[:, j], result[:, j], alpha, beta)
            return result

        m, n = self.shape
        if m == 0:
            return out if out is not None else np.empty(expected, dtype=result_dtype)
        if self._host_mode != COPY:
            x_host = np.ascontiguousarray(x.reshape(n), dtype=self.dtype)
            if out is not None:
                self._in_place(x_host, out.reshape(m), alpha, beta)
                return out
            y_host = np.empty(m, dtype=self.dtype)
            self._in_place(x_host, y_host, alpha, beta)
            return y_host.reshape(expected).astype(result_dtype, copy=False)
        y_host = np.empty(m, dtype=self.dtype)
        x_buf = self._staging_buffer("x", n)
        y_buf = self._staging_buffer("y", m)
        queue = self.queue
        # Events order the copies and the product on out-of-order queues too.
        uploads = []
        if n:
            uploads.append(cl.enqueue_copy(
                queue, x_buf, np.ascontiguousarray(x.reshape(n), dtype=self.dtype),
                is_blocking=False))
        if beta != 0:
            uploads.append(cl.enqueue_copy(
                queue, y_buf, np.ascontiguousarray(out.reshape(m), dtype=self.dtype),
                is_blocking=False))
        event = self._launch(x_buf, y_buf, alpha, beta, wait_for=uploads)
        cl.enqueue_copy(queue, y_host, y_buf, wait_for=[event], is_blocking=True)
        if out is None:
            return y_host.reshape(expected).astype(result_dtype, copy=False)
        out[...] = y_host.reshape(expected)
        return out

    def _check_device_dtype(self, arr, name):
        dtype = arr.dtype
        if dtype == self.dtype:   # the operator's own type is always allowed
            return
        kinds = "fc" if self.is_complex and name == "x" else ("c" if self.is_complex else "f")
        if dtype.kind not in kinds or dtype not in (np.float32, np.float64, np.complex64,
                                                    np.complex128):
            allowed = {"f": "float32 or float64", "c": "complex64 or complex128",
                       "fc": "float32, float64, complex64 or complex128"}[kinds]
            raise UnsupportedDtypeError(
                f"device-resident {name} has dtype {dtype}; here it must be {allowed} "
                f"(the operator computes in {self.dtype}): convert it on the "
                f"device with {name}.astype(numpy.{self.dtype})")
        if needs_fp64(dtype) and not self.device.profile.fp64:
            raise DeviceCapabilityError(
                f"device-resident {name} is float64, but {self.device.profile.name!r} has "
                "no double precision to convert it: use float32 arrays")

    def _check_context(self, arr, name):
        if arr.context != self.device.context:
            raise InvalidInputError(f"{name} lives on another OpenCL context than this operator "
                             f"({self.device!r}); create it with op.queue or op.device.context")

    def _device_buffer(self, arr, name):
        self._check_context(arr, name)
        check_contiguous(arr, name)
        if arr.size == 0 or arr.base_data is None:
            return self._staging_buffer("dummy", 1)
        if arr.offset:
            # A view: the sub-buffer of the root buffer it covers (_matvec_device has
            # moved views off the alignment sub-buffers need to temporaries).
            return _memory_root(arr.base_data).get_sub_region(self._root_offset(arr),
                                                              arr.nbytes)
        return arr.base_data

    def _device_product(self, x_buf, y_buf, alpha, beta, wait_for, block):
        """The product on device buffers: a vector (``block`` None) or a row-major
        block of ``block`` vectors (block kernels, else column by column)."""
        if block is None or self._impl.has_block_kernels:
            return self._launch(x_buf, y_buf, alpha, beta, wait_for=wait_for, block=block)
        copy = self._blocks_for(block)
        if copy is not None:   # (the copy's own staging and order; always under our lock)
            return copy.operator._launch(x_buf, y_buf, alpha, beta,
                                         wait_for=self._after_previous(wait_for),
                                         block=block)
        return self._device_columns(x_buf, y_buf, block, alpha, beta, wait_for)

    def _matvec_device(self, x, out, alpha, beta):
        """Device arrays at any offset: a view starting on the device's base-address
        alignment is passed as a sub-buffer (no copy; not on NVIDIA:
        ``_no_sub_buffers``); another one goes through a temporary at offset 0 (x copied
        in; out copied in when beta reads it, and the result copied back into the view),
        which OpenCL's sub-buffers cannot avoid."""
        memo = self._device_memo
        if memo is not None and memo[0] is x and memo[1] is out and \
                memo[2] is x.base_data and memo[3] is out.base_data and \
                not (x.offset or out.offset):
            return self._matvec_device_again(x, out, alpha, beta, memo[4])
        if column_major_only(x) or (_is_device_array(out) and column_major_only(out)):
            return self._matvec_device_column_major(x, out, alpha, beta)
        x_moved = self._needs_temporary(x)
        out_moved = _is_device_array(out) and self._needs_temporary(out)
        if not (x_moved or out_moved):
            return self._matvec_device_aligned(x, out, alpha, beta)
        if x_moved:
            x = x.copy(queue=self.queue)
        if not out_moved:
            return self._matvec_device_aligned(x, out, alpha, beta)
        work = out.copy(queue=self.queue) if beta != 0 else \
            cla.empty(self.queue, out.shape, out.dtype, order="F" if (
                out.flags.f_contiguous and not out.flags.c_contiguous) else "C")
        self._matvec_device_aligned(x, work, alpha, beta)
        # (a view of out on this queue: out may be on another of the caller's)
        out.add_event(cla.Array._copy(out.with_queue(self.queue), work, queue=self.queue,
                                      wait_for=[*out.events, *work.events] or None))
        return out

    def _matvec_device_column_major(self, x, out, alpha, beta):
        """A column-major (F-ordered) device block X or out: the block kernels and the
        column path take row-major blocks, so X is transposed on the device into a
        row-major temporary, and the product made into one that is transposed into
        out (out transposed into it first when beta reads it).  Each transpose reads
        and writes the block once."""
        self._check_x_shape(x.shape)
        queue = self.queue
        if column_major_only(x):
            self._check_device_dtype(x, "x")
            self._check_context(x, "x")
            row_major = cla.empty(queue, x.shape, x.dtype)
            row_major.add_event(self._relayout(row_major, x))
            x = row_major
        if not (_is_device_array(out) and column_major_only(out)):
            return self._matvec_device(x, out, alpha, beta)
        self._check_out(out, self._out_shape(x.shape))
        self._check_device_dtype(out, "out")
        self._check_context(out, "out")
        work = cla.empty(queue, out.shape, out.dtype)
        if beta != 0:
            work.add_event(self._relayout(work, out))
        self._matvec_device(x, work, alpha, beta)
        out.add_event(self._relayout(out, work))
        return out

    def _relayout(self, dest, src):
        """``dest`` (other order) = ``src`` on this queue, after both arrays' events."""
        transpose = self._transposes.get(src.dtype)
        if transpose is None:
            transpose = self._transposes[src.dtype] = Transpose(self.device, src.dtype)
        wait_for = self._after_previous([*src.events, *dest.events] or None)
        return relayout(transpose, self.queue, dest, src, wait_for)

    def _needs_temporary(self, arr):
        """Whether a device array is used through a temporary rather than in place: a
        contiguous view off the sub-buffer alignment, or any contiguous view where
        sub-buffers are avoided.  (A strided view is left to _device_buffer, which
        refuses it: a temporary would be a copy pyopencl cannot make.)"""
        if not arr.offset or arr.base_data is None or arr.size == 0 or not (
                arr.flags.c_contiguous or arr.flags.f_contiguous):
            return False
        return self._no_sub_buffers or self._root_offset(arr) % self._base_align != 0

    @functools.cached_property
    def _no_sub_buffers(self):
        """Whether views of x and out must go through temporaries instead of sub-buffers
        of their buffers: NVIDIA's OpenCL (driver 580.159.04, H200) crashed releasing a
        sub-buffer that had been written once the whole buffer had been read back (plain
        pyopencl does it too).  There x is copied and the result copied back by
        pyopencl's copy kernel, which reads and writes the views at their offsets."""
        return self.device.profile.vendor_family == "nvidia"

    @property
    def _base_align(self):
        return max(1, self.device.cl_device.mem_base_addr_align // 8)

    @staticmethod
    def _root_offset(arr):
        """The array's byte offset in its root buffer (a sub-buffer's own offset too)."""
        buf = arr.base_data
        inner = buf.get_info(cl.mem_info.OFFSET) if \
            buf.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) else 0
        return arr.offset + inner

    def _matvec_device_aligned(self, x, out, alpha, beta):
        self._check_x_shape(x.shape)
        block = x.shape[1] if x.ndim == 2 and x.shape[1] != 1 else None
        if block is not None:
            _check_row_major(x, "x")
            if out is not None and _is_device_array(out):
                _check_row_major(out, "out")
        expected = self._out_shape(x.shape)
        self._check_device_dtype(x, "x")
        x_buf = self._device_buffer(x, "x")
        given_out = out is not None
        if out is None:
            out = cla.empty(self.queue, expected, np.result_type(self.dtype, x.dtype))
        elif not _is_device_array(out):
            raise InvalidTypeError("with a device-resident x, out must be a pyopencl array "
                                   "too")
        self._check_out(out, expected)
        self._check_device_dtype(out, "out")
        y_buf = self._device_buffer(out, "out")
        if self.shape[0] == 0 or block == 0:
            return out
        if x.dtype != self.dtype or out.dtype != self.dtype:
            return self._matvec_device_cast(x, out, alpha, beta, block)
        # out is x (in place), or x and out are a buffer and its sub-buffer, or two
        # sub-buffers of one buffer: the kernels would read x while writing it (and
        # OpenCL leaves a kernel writing a buffer and reading its sub-buffer undefined).
        alias = bool(x.size) and (x_buf.int_ptr == y_buf.int_ptr or
                                  _memory_root(x_buf).int_ptr == _memory_root(y_buf).int_ptr)
        if not alias and given_out and x.size and not (x.offset or out.offset):
            # Checked, at offset 0 (their own buffers), apart: the same two arrays
            # again skip the checks (_matvec_device_again).
            self._device_memo = (x, out, x_buf, y_buf, block)
        return self._ordered_product(x, out, x_buf, y_buf, alpha, beta, block, alias)

    def _matvec_device_again(self, x, out, alpha, beta, block):
        """The product on the two device arrays of an earlier call, which passed every
        check (the same objects on the same buffers at offset 0: their shapes and
        types are unchanged, pyopencl arrays do not change them in place)."""
        return self._ordered_product(x, out, x.base_data, out.base_data, alpha, beta,
                                     block)

    def _ordered_product(self, x, out, x_buf, y_buf, alpha, beta, block, alias=False):
        """The product on the checked device arrays ``x`` and ``out`` (buffers ``x_buf``
        and ``y_buf``), after their events and leaving its event on them, but on this
        in-order queue; ``alias``: x shares memory with out, so a copy of x (which
        starts at its buffer's start) is multiplied instead."""
        ordered = self._queue_in_order
        x_ordered = ordered and x.queue is self.queue
        out_ordered = ordered and out.queue is self.queue
        wait_for = (([] if x_ordered else list(x.events))
                    + ([] if out_ordered else list(out.events))) or None
        if alias:
            copy = self._block_staging("x_alias", x.size)
            wait_for = [cl.enqueue_copy(self.queue, copy, x_buf, byte_count=x.nbytes,
                                        wait_for=self._after_previous(wait_for))]
            x_buf = copy
        event = self._device_product(x_buf, y_buf, alpha, beta, wait_for, block)
        # Arrays on this in-order queue need no event: whatever comes next on it waits
        # anyway, and pyopencl's add_event blocks on older events every few calls (it
        # made a product on device arrays 3x slower than its kernel launch on PoCL).
        if not out_ordered:
            out.add_event(event)
        if not x_ordered:
            x.add_event(event)
        return out

    def _matvec_device_cast(self, x, out, alpha, beta, block=None):
        """The device product with x or out of the other float type: through
        temporaries in the operator's dtype, cast by pyopencl's copy kernel."""
        queue, events = self.queue, []

        def cast(dest, src, wait_for):
            if dest.size:   # (views on this queue: the caller's arrays may be on another)
                event = cla.Array._copy(dest.with_queue(queue), src.with_queue(queue),
                                        queue=queue, wait_for=wait_for or None)
                events.append(event)
                return [event]
            return list(wait_for)

        x_work, wait_for = x, list(x.events)
        if x.dtype != self.dtype:
            x_work = cla.empty(queue, x.shape, self.dtype)
            wait_for = cast(x_work, x, x.events)
        y_work = out
        # An out finer than op.dtype keeps its own precision in beta * out (numpy's
        # rule): the product goes to the temporary alone, and out = beta*out + it.
        finer = beta != 0 and self._finer(out.dtype)
        if out.dtype != self.dtype:
            y_work = cla.empty(queue, out.shape, self.dtype)
            if beta != 0 and not finer:
                wait_for += cast(y_work, out, out.events)
        else:
            wait_for += list(out.events)
        event = self._device_product(self._device_buffer(x_work, "x"),
                                     self._device_buffer(y_work, "out"), alpha,
                                     0.0 if finer else beta, wait_for or None, block)
        if finer:
            event = scale_and_add(out.with_queue(queue), beta, y_work,
                                  wait_for=[event, *out.events])
        elif y_work is not out:
            event = cast(out, y_work, [event] + list(out.events))[0]
        out.add_event(event)
        x.add_event(event)   # a later write to x waits for the reads here
        return out

    def _structure_getter(self):
        """``_structure`` read later, through a weak reference: the updater that keeps
        it belongs to this operator (a closure over self made a cycle)."""
        ref = weakref.ref(self)
        return lambda: ref()._structure

    @property
    def _structure(self):
        """(indices, indptr) of the matrix given, on the host: the operator's own
        (``_kept_pattern``), read back once where the device holds them."""
        source = self._structure_source
        if source is None:
            self._structure_source = source = _read_pattern(self._impl, self.queue)
        elif isinstance(source, DeviceCSR):
            self._structure_source = source = source.to_host(self.queue)
        return source.indices, source.indptr

    # -- new values, same pattern ---------------------------------------------------------
    def update_values(self, data) -> None:
        """Replace the matrix's values, keeping its sparsity pattern (Newton steps, time
        stepping): ``data`` holds one value per stored entry, in the CSR order of the
        matrix given at construction (``A.data`` for a CSR matrix; for other scipy types,
        ``A.tocsr().data``).  No re-conversion and no re-tuning: the first call finds
        where the format stores each entry (one host conversion of the pattern) and
        keeps that map on the device (``nbytes`` grows by two indices per entry); every
        call then costs the upload of the values and one scatter kernel (formats holding
        the values in CSR order: the upload straight into place, no map).  An operator
        converted on the device finds the map by converting the pattern there again
        (values coding their positions) and keeps those codes, one per stored slot, as
        the map.  Returns when
        the device holds the new values (products enqueued afterwards use them)."""
        if self._copy_of is not None:
            raise InvalidInputError(
                f"this operator is {self._copy_of} of another operator, which keeps it in "
                "step: call update_values on that operator (this copy updated alone would "
                "disagree with it)")
        self._update_as_copy(data)

    def _update_as_copy(self, data):
        """update_values without the refusal of a copy (its owner's call)."""
        data = check_values(data, self._nnz, complex_ok=self.is_complex, dtype=self.dtype,
                            queue=self.queue)
        with self._lock:
            self._update_values(data)

    def _update_values(self, data):
        if self._previous is not None:   # out-of-order queue: products before the update
            self._previous.wait()        # must not see the new values
        self._values_version += 1
        if self._online is not None:   # the winner will need these values too
            self._latest_values = np.array(data, dtype=self.dtype)
        if self._updater is None or self._updater.fmt is not self._impl:
            # (The pattern only if the map needs it: the CSR kernels' does not.)
            self._updater = ValueUpdater(self._impl, self._structure_getter(), self._nnz)
        self._updater.update(self.queue, data)
        if self._block_copy is not None:
            self._block_copy.update_values(data)
        if self._transposed is not None:
            self._transposed.update_values(data)
        elif not self._updater.has_map:   # no map to read them back with later
            self._host_values = np.array(data, dtype=self.dtype)

    # -- interoperability -----------------------------------------------------------------
    def aslinearoperator(self):
        """A ``scipy.sparse.linalg.LinearOperator`` of dtype ``op.dtype`` whose
        ``matvec``, ``rmatvec``, ``matmat``, ``rmatmat``, adjoint (``.H``) and transpose
        (``.T``) run on the device: every scipy solver works on it (``cg``, ``gmres``,
        ``bicg``, ``bicgstab``, ``lsqr``, ``lsmr``, ``eigsh``...).  The transposed
        products build the transposed copy on first use (see ``rmatvec``)."""
        return linear_operator(self)


class _Pattern:
    """The pattern the operator keeps on the host (``data``: the values given, where
    kept; None when read back)."""

    def __init__(self, indices, indptr, data=None):
        self.indices, self.indptr, self.data = indices, indptr, data


def _reads_pattern_back(impl) -> bool:
    """Whether ``impl`` holds the CSR arrays on the device as given (the CSR kernels:
    their conversion is a cast), so ``read_csr`` gives the pattern back in its order."""
    return type(impl).host_conversion_is_cast


def _kept_pattern(csr, given, impl, queue):
    """What the operator keeps of the pattern (``_structure``): nothing where the
    device holds it (read back when first needed: no cost at setup); else indices and
    indptr of its own, copied here where they are the caller's arrays (``given``'s),
    which the caller may change in place later (``A.sort_indices()``,
    ``A.sum_duplicates()``): host memory of 4-8 bytes per non-zero, a copy beside a
    conversion that does more.  A matrix given on the device: its column indices copied
    there (no transfer; ``indptr`` is on the host already), read back when needed.
    (``data`` stays the caller's: only a format without a slot map would read it, and
    every format has one.)"""
    if _reads_pattern_back(impl):
        return None
    if isinstance(csr, DeviceCSR):
        indices = csr.indices.copy(queue=queue)
        indices.finish()   # before the caller's next change, on whatever queue
        return DeviceCSR(csr.data, indices, None, csr.indptr, csr.shape, owned=True)
    theirs = [a for a in (given if isinstance(given, tuple) else
                          (getattr(given, "indices", None), getattr(given, "indptr", None)))
              if isinstance(a, np.ndarray)]
    indices, indptr = csr.indices, csr.indptr
    if any(np.may_share_memory(mine, a) for mine in (indices, indptr) for a in theirs):
        indices, indptr = host_arrays.copy(indices), host_arrays.copy(indptr)
    return _Pattern(indices, indptr, csr.data)


def _read_pattern(impl, queue) -> _Pattern:
    """The pattern read back from the device arrays of ``impl`` (``_reads_pattern_back``)."""
    (indptr, indices, _), events = impl.read_csr(queue)
    if events:
        cl.wait_for_events(events)
    return _Pattern(indices, indptr)


def _check_row_major(arr, name):
    """A device block must be C-contiguous (row-major: a row's vectors side by side)."""
    if arr.size and not arr.flags.c_contiguous:
        raise UnsupportedLayoutError(
            f"device-resident {name} of shape {tuple(arr.shape)} is not C-contiguous "
            f"(row-major): block products take row-major device arrays; make one with "
            f"cla.empty(queue, shape, dtype) (order 'C'), or pass a host array")


def _not_for_the_chosen_format(params, chosen, why):
    """format="auto" chose a format that does not take a parameter the caller gave:
    name the formats it belongs to."""
    unknown = sorted(set(params) - set(FORMATS[chosen].parameter_names()))
    owners = {name: [f for f, cls in FORMATS.items() if name in cls.parameter_names()]
              for name in unknown}
    belongs = "; ".join(f"{name} belongs to {', '.join(fmts) or 'no format'}"
                        for name, fmts in owners.items())
    return UnknownParameterError(
        f"format='auto' chose {chosen!r}, which takes no {', '.join(unknown)} ({belongs}); "
        f"pass format= one of those to use it, or leave the parameter out. The choice: "
        f"{why}")


def spmv(A, x, *, out=None, alpha=1.0, beta=0.0, **kwargs):
    """One-shot ``alpha * A @ x + beta * out``; ``kwargs`` go to :class:`SpMV`.
    Builds the operator each call (compiled kernels are cached): for repeated products
    keep an :class:`SpMV`."""
    return SpMV(A, **kwargs).matvec(x, out=out, alpha=alpha, beta=beta)
