"""Validation and normalisation of user inputs: the matrix (any scipy.sparse type or a
CSR triple) and the value dtype.  Invalid input is refused here, on the host, before
anything reaches a device where a bad index would read out of bounds."""

import numpy as np
import pyopencl.array as cla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .errors import (
    DeviceCapabilityError,
    InvalidInputError,
    InvalidTypeError,
    UnsupportedDtypeError,
)
from .host_arrays import bare_csr, map_pieces, min_max

REAL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
COMPLEX_DTYPES = (np.dtype(np.complex64), np.dtype(np.complex128))
SUPPORTED_DTYPES = REAL_DTYPES + COMPLEX_DTYPES
_SUPPORTED_TEXT = "float32, float64, complex64 and complex128"


def is_complex(dtype) -> bool:
    return np.dtype(dtype).kind == "c"


def needs_fp64(dtype) -> bool:
    """Whether ``dtype`` needs double precision on the device (float64, complex128)."""
    return np.dtype(dtype) in (np.dtype(np.float64), np.dtype(np.complex128))


def check_triple(data, indices, indptr, shape):
    """``(rows, cols)`` of a ``(data, indices, indptr)`` triple with ``shape``, after
    the checks that need no pass over the entries (numpy or pyopencl arrays alike)."""
    if shape is None:   # a missing argument: a TypeError, as Python raises for one
        raise InvalidTypeError("shape=(rows, cols) is required with a (data, indices, indptr) "
                        "triple")
    rows, cols = check_shape(shape)
    for name, arr in (("data", data), ("indices", indices), ("indptr", indptr)):
        if arr.ndim != 1:
            raise InvalidInputError(f"{name} must be one-dimensional, got shape {arr.shape}")
    for name, arr in (("indices", indices), ("indptr", indptr)):
        if arr.size and arr.dtype.kind not in "iu":
            raise UnsupportedDtypeError(f"{name} must hold integers, not {arr.dtype}")
    if indptr.size != rows + 1:
        raise InvalidInputError(
            f"indptr has {indptr.size} entries; a {rows}-row matrix needs {rows + 1}")
    if data.size != indices.size:
        raise InvalidInputError(f"data ({data.size}) and indices ({indices.size}) differ in length")
    return rows, cols


def _csr_from_triple(A, shape):
    if len(A) != 3:
        raise InvalidTypeError("a CSR triple must be (data, indices, indptr)")
    data, indices, indptr = (np.asarray(a) for a in A)
    rows, cols = check_triple(data, indices, indptr, shape)
    # Signed indices: row lengths and keys computed from them must come out signed
    # (uint64 with int64 makes float64); a wrapped value fails validate_csr's checks.
    if indptr.dtype == np.uint64:
        indptr = indptr.astype(np.int64)
    if indices.dtype == np.uint64:
        indices = indices.astype(np.int64)
    # Built without scipy's own checks (validate_csr below checks everything vectorised)
    # nor its value types: float16 values compute as the README says.
    return bare_csr((rows, cols), data, indices, indptr)


def check_shape(shape):
    try:
        rows, cols = (int(s) for s in shape)
        if len(shape) != 2 or any(s != int(s) or isinstance(s, (bool, str)) for s in shape):
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidInputError(f"shape must be a pair of integers, not {shape!r}") from None
    if rows < 0 or cols < 0:
        raise InvalidInputError(f"shape must not be negative: {shape!r}")
    return rows, cols


def validate_csr(csr):
    """Check the CSR structure so no kernel can index outside its arrays."""
    rows, cols = csr.shape
    indptr, indices = csr.indptr, csr.indices
    nnz = indices.size
    if indptr.size != rows + 1:
        raise InvalidInputError(f"indptr has {indptr.size} entries; expected {rows + 1}")
    if indptr[0] != 0 or indptr[-1] != nnz or csr.data.size != nnz:
        raise InvalidInputError(f"indptr must start at 0 and end at nnz={nnz} "
                         f"(got {indptr[0]}..{indptr[-1]}, {csr.data.size} values)")
    if rows and np.any(indptr[1:] < indptr[:-1]):
        raise InvalidInputError("indptr must be non-decreasing")
    if nnz:
        low, high = min_max(indices)
        if low < 0 or high >= cols:
            raise InvalidInputError(f"column indices must lie in [0, {cols}); found "
                                    f"[{low}, {high}]")


def as_host_csr(A, shape=None):
    """Any scipy.sparse matrix/array, or (data, indices, indptr) with ``shape``, as a
    validated ``scipy.sparse.csr_matrix`` (converted once; no copy when already CSR)."""
    if sp.issparse(A):
        if shape is not None and tuple(shape) != tuple(A.shape):
            raise InvalidInputError(f"shape={tuple(shape)} contradicts the matrix shape {A.shape}")
        csr = A.tocsr()
        if not isinstance(csr, sp.csr_matrix):  # sparse arrays -> the matrix class
            csr = sp.csr_matrix(csr)
    elif isinstance(A, tuple):
        csr = _csr_from_triple(A, shape)
    else:
        advice = ("a LinearOperator holds no entries to convert: give the sparse matrix "
                  "it wraps" if isinstance(A, spla.LinearOperator)
                  else "convert dense data with scipy.sparse.csr_matrix first")
        raise InvalidTypeError(
            f"expected a scipy.sparse matrix or array, or (data, indices, indptr) with "
            f"shape=..., not {type(A).__name__} ({advice})")
    if csr.dtype.kind not in "fiubc":
        raise UnsupportedDtypeError(f"matrix dtype {csr.dtype} is not numeric")
    validate_csr(csr)
    return csr


def check_value_range(data, dtype, what="the matrix") -> None:
    """Refuse finite values of ``data`` that overflow the operator's ``dtype`` (float64
    values past float32's 3.4e38 would become inf in a float32 operator), as value_bits'
    storage refuses them (formats/storage.py); Inf and NaN given stay.  Only where
    ``data``'s type reaches further than ``dtype``: one min/max pass on several threads,
    the offending values counted only in a piece that fails it."""
    data = np.asarray(data)
    if data.dtype.kind not in "fc" or not data.size or \
            np.finfo(data.dtype).max <= np.finfo(dtype).max:
        return
    real = np.finfo(dtype).dtype   # (a complex type's part)
    largest = float(np.finfo(real).max)

    def overflows(part):
        def piece(a, b):
            p = part[a:b]
            if -largest <= p.min() and p.max() <= largest:   # (False with NaN or inf)
                return 0, 0.0
            with np.errstate(invalid="ignore", over="ignore"):
                bad = p[np.isinf(p.astype(real)) & np.isfinite(p)]   # rounded to inf
            return bad.size, float(np.abs(bad).max()) if bad.size else 0.0
        return map_pieces(piece, part.size)

    parts = (data.real, data.imag) if data.dtype.kind == "c" else (data,)
    found = [hit for part in parts for hit in overflows(part.reshape(-1))]
    count = sum(n for n, _ in found)
    if count:
        raise overflow_error(count, max(v for _, v in found), dtype, what)


def overflow_error(count, largest_given, dtype, what="the matrix"):
    """The error of ``check_value_range`` (and of its device twin in device_inputs.py):
    ``count`` finite values past ``dtype``'s range, the largest ``largest_given``."""
    wider = {"float32": "float64", "complex64": "complex128"}.get(np.dtype(dtype).name)
    advice = f", or build the operator with dtype=numpy.{wider}" if wider else ""
    largest = float(np.finfo(np.finfo(dtype).dtype).max)
    return InvalidInputError(
        f"{count} finite value(s) of {what} overflow {np.dtype(dtype)} (largest finite "
        f"{largest:.6g}; largest |value| given {largest_given:.6g}) and would be stored "
        f"as inf: scale the values{advice}")


def resolve_dtype(requested, matrix_dtype, profile):
    """The value type the kernels use.  ``None`` keeps float32/float64/complex64/
    complex128 matrices as they are and computes integer/bool/float16 matrices in
    float64 (float32 without fp64), complex256 ones in complex128.  A complex matrix
    with a real ``requested`` dtype is refused (its imaginary parts would be lost)."""
    if requested is None:
        if matrix_dtype in SUPPORTED_DTYPES:
            dtype = matrix_dtype
        elif is_complex(matrix_dtype):
            dtype = np.dtype(np.complex128 if profile.fp64 else np.complex64)
        else:
            dtype = np.dtype(np.float64 if profile.fp64 else np.float32)
    else:
        try:
            dtype = np.dtype(requested)
        except TypeError:
            raise UnsupportedDtypeError(f"dtype {requested!r} is not understood; supported: "
                                        f"{_SUPPORTED_TEXT}") from None
        if dtype not in SUPPORTED_DTYPES:
            raise UnsupportedDtypeError(
                f"dtype {dtype} is not supported; supported value types are {_SUPPORTED_TEXT}")
        if is_complex(matrix_dtype) and not is_complex(dtype):
            raise UnsupportedDtypeError(
                f"the matrix is complex ({matrix_dtype}) but dtype={dtype} is real: its "
                "imaginary parts would be lost; use dtype=numpy.complex64 or "
                "numpy.complex128 (or pass A.real explicitly)")
    if needs_fp64(dtype) and not profile.fp64:
        single = "complex64" if is_complex(dtype) else "float32"
        raise DeviceCapabilityError(
            f"device {profile.name!r} has no double precision (fp64) support: use "
            f"dtype=numpy.{single} or another device")
    return dtype


def check_scalar(name, value, complex_ok):
    """``alpha``/``beta`` as a Python float, or a Python complex when ``complex_ok``
    (a complex operator; a real one takes complex scalars through its host fallback)."""
    if not complex_ok:
        return check_real_scalar(name, value)
    if isinstance(value, (str, bytes)):
        raise InvalidTypeError(f"{name} must be a number, not the string {value!r}")
    try:
        return complex(value)
    except (TypeError, ValueError):
        raise InvalidTypeError(f"{name} must be a number, not {value!r}") from None


def check_scalar_range(name, value, dtype) -> None:
    """Refuse an ``alpha``/``beta`` (a Python float or complex) that the operator's
    ``dtype`` (float32, complex64) would hold as inf or as 0: its kernels compute in
    that type, so 1e300 gave inf and 1e-50 gave 0, with numpy's overflow warning at
    most.  NaN and inf themselves pass (the caller asked for them)."""
    real = np.finfo(dtype)
    largest, smallest = float(real.max), float(real.smallest_subnormal)
    for part in (value.real, value.imag) if isinstance(value, complex) else (value,):
        size = abs(part)
        # What the type rounds the value to decides (a value just past its largest
        # rounds down to it; half its smallest subnormal rounds to 0)
        with np.errstate(over="ignore", under="ignore"):
            held = abs(float(real.dtype.type(size)))
        if held == float("inf") and size < float("inf"):
            raise InvalidInputError(
                f"{name}={value!r} is outside {real.dtype}'s range (largest {largest:.3g}): "
                f"this operator computes in {np.dtype(dtype)}; build one with a 64-bit "
                f"dtype, or scale {name} into range")
        if size > 0 and held == 0:
            raise InvalidInputError(
                f"{name}={value!r} would round to 0 in {np.dtype(dtype)}, the type this "
                f"operator computes in (smallest {smallest:.3g}); build one "
                f"with a 64-bit dtype, or scale {name} into range")


def check_real_scalar(name, value):
    if isinstance(value, (str, bytes)):   # float("2") would take it silently
        raise InvalidTypeError(f"{name} must be a real number, not the string {value!r}")
    if isinstance(value, (complex, np.complexfloating)) and np.imag(value) != 0:
        raise UnsupportedDtypeError(f"{name} must be real, got {value!r}")
    try:
        return float(np.real(value))
    except (TypeError, ValueError):
        raise InvalidTypeError(f"{name} must be a real number, not {value!r}") from None


def check_host_out(out, exact=False):
    """A host ``out``: a numpy array (else an InvalidTypeError: a list, a tuple, a sparse
    matrix...) that can be written (else an InvalidInputError); ``exact``: np.matrix is a
    type error too, and a masked array is refused (its mask would be ignored).  Other
    subclasses (``np.memmap``) are written like any array, as numpy's ``out=`` does."""
    if not isinstance(out, np.ndarray) or (exact and type(out) is np.matrix):
        raise InvalidTypeError(f"out must be a writeable numpy array (or a pyopencl one), "
                               f"not {type(out).__name__}")
    if exact and isinstance(out, np.ma.MaskedArray):
        raise InvalidInputError("out is a masked array, whose mask the product would ignore: "
                                "pass out.data or a plain numpy array")
    if not out.flags.writeable:
        raise InvalidInputError("out must be a writeable numpy array (this one is read-only)")


def refuse_an_operator(name, x):
    """Another operator (an SpMV, a transposed view, a scipy LinearOperator) where a
    vector or block is due: refused by name (numpy made it an object array, refused as a
    "non-numeric dtype object")."""
    if not isinstance(x, (np.ndarray, cla.Array)) and callable(getattr(x, "matvec", None)):
        raise InvalidTypeError(
            f"{name} is an operator ({type(x).__name__}), not a vector or a block: products "
            "of two operators are not formed; compose them as scipy operators, e.g. "
            "op.aslinearoperator() @ other.aslinearoperator(), or multiply a vector by "
            "each in turn")


def refuse_non_dense(x, size):
    """None, a sparse matrix or a string where a dense vector of ``size`` numbers is
    due: refused by type (numpy would make a 0-d object array of it)."""
    if x is None or sp.issparse(x) or isinstance(x, (str, bytes, dict, set)):
        raise InvalidTypeError(f"x must be a dense vector (a numpy or pyopencl array of "
                               f"{size} numbers), not {type(x).__name__}")
