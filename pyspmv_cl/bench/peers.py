"""Reference SpMV implementations ("peers") that a user would otherwise call, timed alike.

Peers: ``scipy`` (always), ``torch-csr`` (PyTorch sparse CSR + ``torch.mv``), ``mkl``
(sparse_dot_mkl's ``dot_product_mkl``), ``cusparse`` (cusparseSpMV through CuPy's
bindings, its descriptors made once) and ``cupy-csr`` (CuPy's ``csr_matrix @ x``, which
calls the same cuSPARSE routine but sets it up on every call).  Optional libraries are
imported only inside the functions that need them, so importing this module never
pulls in torch, cupy or MKL, and a missing or broken library only makes its peer
unavailable, with the reason recorded.

Every peer converts the matrix once (``Peer.prepare``), outside the timed region; the
timed callable does only the product. CPU peers are timed by wall clock around each
call; the GPU peers by CUDA events around the products with x already on the device.
"""

from __future__ import annotations

import glob
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

__all__ = ["PEER_NAMES", "Peer", "available_peers", "cuda_sampler", "median_time", "time_peer"]

PEER_NAMES = ("scipy", "torch-csr", "mkl", "cusparse", "cupy-csr")
CUSPARSE_CALLS_PER_SAMPLE = 10
_ALIASES = {"torch": "torch-csr", "sparse_dot_mkl": "mkl", "cupy": "cupy-csr"}


# --------------------------------------------------------------------------- timing


def _sample(warm: Callable[[], None], measure: Callable[[], float], warmup: int, repeats: int,
            min_time: float, max_time: float) -> float:
    """Median of ``measure()`` after ``warmup`` calls of ``warm()``.

    Keeps sampling until both ``repeats`` samples and ``min_time`` wall seconds are
    reached (short calls get many samples, which steadies the median), but stops at
    ``max_time`` so very slow calls still finish; at least one sample is taken.
    """
    if warmup < 0 or repeats < 1:
        raise ValueError("need warmup >= 0 and repeats >= 1")
    for _ in range(warmup):
        warm()
    samples = []
    start = time.perf_counter()
    while True:
        samples.append(measure())
        elapsed = time.perf_counter() - start
        if elapsed >= max_time or (len(samples) >= repeats and elapsed >= min_time):
            break
    return float(statistics.median(samples))


def median_time(fn: Callable[[], None], *, warmup: int = 3, repeats: int = 20,
                min_time: float = 0.2, max_time: float = 5.0) -> float:
    """Median wall time in seconds of ``fn()`` (see ``_sample`` for the stopping rule)."""

    def measure() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return _sample(fn, measure, warmup, repeats, min_time, max_time)


# --------------------------------------------------------------------------- peers


@dataclass
class Peer:
    """One reference implementation of y = A @ x.

    ``device`` is ``"cpu"`` when the prepared callable takes and returns numpy arrays,
    ``"cuda"`` when it takes and returns CuPy device arrays (see ``time_peer``).
    """

    name: str
    available: bool
    reason: str = ""
    device: str = "cpu"
    builder: Callable | None = field(default=None, repr=False, compare=False)

    def prepare(self, A, dtype) -> Callable:
        """Convert ``A`` once for this peer; returns ``f(x) -> y`` doing only the product."""
        if not self.available or self.builder is None:
            raise RuntimeError(f"peer {self.name!r} is unavailable: {self.reason}")
        return self.builder(sp.csr_matrix(A), np.dtype(dtype))


def _as_csr(A, dtype: np.dtype) -> sp.csr_matrix:
    B = A.astype(dtype).tocsr()
    B.sum_duplicates()  # every peer should see the same canonical matrix
    return B


def _tiny():
    """Small non-symmetric test matrix and vector to check that a peer really works."""
    A = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0], [4.0, 0.0, 5.0]]))
    x = np.array([1.0, 2.0, 3.0])
    return A, x, A @ x


# scipy ------------------------------------------------------------------------


def _scipy_builder(A, dtype):
    B = _as_csr(A, dtype)
    return lambda x: B @ x


def _scipy_peer() -> Peer:
    return Peer("scipy", True, builder=_scipy_builder)


# torch ------------------------------------------------------------------------

_torch_threads_set = False


def _torch_builder(A, dtype):
    global _torch_threads_set
    import torch

    if not _torch_threads_set:
        # torch defaults to the physical core count; use every logical CPU, as the
        # OpenCL CPU runtimes do, so both sides get the same machine.
        torch.set_num_threads(os.cpu_count() or 1)
        _torch_threads_set = True
    B = _as_csr(A, dtype)
    # 32-bit indices when they fit: torch's MKL path then uses them as they are, while
    # int64 ones cost ~1.8x the time (poisson2d(1000), 2-core CPU, torch 2.13).
    idx = np.int32 if max(B.nnz, B.shape[1]) < 2**31 else np.int64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        T = torch.sparse_csr_tensor(
            torch.from_numpy(B.indptr.astype(idx)),
            torch.from_numpy(B.indices.astype(idx)),
            torch.from_numpy(B.data),
            size=B.shape,
            check_invariants=False,  # scipy's canonical CSR already satisfies them
        )
    # from_numpy/.numpy() share memory, so the callable times only torch.mv.
    return lambda x: torch.mv(T, torch.from_numpy(x)).numpy()


def _torch_peer() -> Peer:
    import torch  # noqa: F401  (raises if missing or broken)

    A, x, y = _tiny()
    got = _torch_builder(A, np.dtype(np.float64))(x)
    if not np.allclose(got, y):
        raise RuntimeError(f"torch.mv gave {got}, expected {y}")
    return Peer("torch-csr", True, builder=_torch_builder)


# mkl --------------------------------------------------------------------------


def _point_mkl_rt_at_prefix() -> None:
    # pip's `mkl` wheel puts libmkl_rt.so.N in <venv>/lib, which the loader does not
    # search, so sparse_dot_mkl fails with "mkl_rt not found". Its documented MKL_RT
    # variable fixes that; set it only when unset and the library is really there.
    if "MKL_RT" in os.environ:
        return
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        found = sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
        if found:
            os.environ["MKL_RT"] = found[-1]
            return


def _mkl_builder(A, dtype):
    from sparse_dot_mkl import dot_product_mkl

    B = _as_csr(A, dtype)
    return lambda x: dot_product_mkl(B, x)


def _mkl_peer() -> Peer:
    _point_mkl_rt_at_prefix()
    A, x, y = _tiny()
    got = _mkl_builder(A, np.dtype(np.float64))(x)  # imports sparse_dot_mkl, loads MKL
    if not np.allclose(got, y):
        raise RuntimeError(f"dot_product_mkl gave {got}, expected {y}")
    return Peer("mkl", True, builder=_mkl_builder)


# cusparse ---------------------------------------------------------------------


def _cupy_csr_builder(A, dtype):
    import cupyx.scipy.sparse as csp

    B = csp.csr_matrix(_as_csr(A, dtype))  # upload once
    return lambda x_dev: B @ x_dev


def _cusparse_builder(A, dtype):
    return _CuSparseSpMV(_as_csr(A, dtype), np.dtype(dtype))


_CUDA_VALUE_TYPES = {"float32": "CUDA_R_32F", "float64": "CUDA_R_64F",
                     "complex64": "CUDA_C_32F", "complex128": "CUDA_C_64F"}
_CUSPARSE_OPERATIONS = {"N": "CUSPARSE_OPERATION_NON_TRANSPOSE",
                        "T": "CUSPARSE_OPERATION_TRANSPOSE",
                        "H": "CUSPARSE_OPERATION_CONJUGATE_TRANSPOSE"}


class _CuSparseSpMV:
    """cusparseSpMV through CuPy's bindings with the matrix and vector descriptors, the
    output and the work buffer made once, as a CUDA program keeps them: each product is
    one library call.  (``csr_matrix @ x``, the ``cupy-csr`` peer, makes them on every
    call: about 40 us of host work on an H200, more than the kernel of a small matrix.)
    ``operation`` "N", "T" or "H": y = A x, A^T x or A^H x (cuSPARSE's own transposed
    kernels on the same CSR).  The descriptors hold bare device pointers, so this object
    keeps every array they point to alive: the matrix, y, and the x last seen."""

    def __init__(self, csr, dtype, operation="N"):
        import cupy
        import cupyx.scipy.sparse as csp
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusparse as lib
        from cupyx import cusparse

        self._lib, self._cusparse = lib, cusparse
        self.matrix = csp.csr_matrix(csr)   # upload once
        self.handle = device.get_cusparse_handle()
        self.op = getattr(lib, _CUSPARSE_OPERATIONS[operation])
        self.alg = getattr(lib, "CUSPARSE_SPMV_ALG_DEFAULT",
                           getattr(lib, "CUSPARSE_MV_ALG_DEFAULT", 0))
        self.value_type = getattr(cupy.cuda.runtime, _CUDA_VALUE_TYPES[dtype.name])
        self.alpha, self.beta = np.ones(1, dtype), np.zeros(1, dtype)   # host scalars
        self.desc_a = cusparse.SpMatDescriptor.create(self.matrix)
        self.y = cupy.empty(csr.shape[0] if operation == "N" else csr.shape[1], dtype)
        self.desc_y = cusparse.DnVecDescriptor.create(self.y)
        self.x = self.desc_x = self.buffer = None

    def __call__(self, x_dev):
        lib = self._lib
        if x_dev is not self.x:
            import cupy

            desc_x = self._cusparse.DnVecDescriptor.create(x_dev)
            size = lib.spMV_bufferSize(self.handle, self.op, self.alpha.ctypes.data,
                                       self.desc_a.desc, desc_x.desc, self.beta.ctypes.data,
                                       self.desc_y.desc, self.value_type, self.alg)
            self.x, self.desc_x = x_dev, desc_x
            self.buffer = cupy.empty(max(1, size), cupy.int8)
        lib.spMV(self.handle, self.op, self.alpha.ctypes.data, self.desc_a.desc,
                 self.desc_x.desc, self.beta.ctypes.data, self.desc_y.desc, self.value_type,
                 self.alg, self.buffer.data.ptr)
        return self.y


class CuSparseSpMM:
    """cusparseSpMM (C = A B, B of shape n x k) with every descriptor and the work
    buffer made once for one B and C, in row-major (``order="C"``) or column-major
    (``"F"``) layout; ``preprocess`` runs cusparseSpMM_preprocess once where CuPy has
    it.  Used by benchmarks/products.py; keeps B, C and the matrix alive."""

    def __init__(self, csr, dtype, B, order="C"):
        import cupy
        import cupyx.scipy.sparse as csp
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusparse as lib
        from cupyx import cusparse

        dtype = np.dtype(dtype)
        self._lib = lib
        self.matrix = csp.csr_matrix(csr)
        self.handle = device.get_cusparse_handle()
        self.value_type = getattr(cupy.cuda.runtime, _CUDA_VALUE_TYPES[dtype.name])
        self.alpha, self.beta = np.ones(1, dtype), np.zeros(1, dtype)
        n, k = B.shape
        m = csr.shape[0]
        self.B = cupy.asarray(B, dtype=dtype, order=order)
        self.C = cupy.zeros((m, k), dtype=dtype, order=order)
        layout = lib.CUSPARSE_ORDER_ROW if order == "C" else lib.CUSPARSE_ORDER_COL
        self.desc_a = cusparse.SpMatDescriptor.create(self.matrix)
        self.desc_b = lib.createDnMat(n, k, k if order == "C" else n, self.B.data.ptr,
                                      self.value_type, layout)
        self.desc_c = lib.createDnMat(m, k, k if order == "C" else m, self.C.data.ptr,
                                      self.value_type, layout)
        self.op = lib.CUSPARSE_OPERATION_NON_TRANSPOSE
        self.alg = getattr(lib, "CUSPARSE_SPMM_ALG_DEFAULT",
                           getattr(lib, "CUSPARSE_MM_ALG_DEFAULT", 0))
        size = lib.spMM_bufferSize(self.handle, self.op, self.op, self.alpha.ctypes.data,
                                   self.desc_a.desc, self.desc_b, self.beta.ctypes.data,
                                   self.desc_c, self.value_type, self.alg)
        self.buffer = cupy.empty(max(1, size), cupy.int8)

    def __call__(self):
        self._lib.spMM(self.handle, self.op, self.op, self.alpha.ctypes.data,
                       self.desc_a.desc, self.desc_b, self.beta.ctypes.data, self.desc_c,
                       self.value_type, self.alg, self.buffer.data.ptr)
        return self.C

    def __del__(self):
        for desc in ("desc_b", "desc_c"):
            if getattr(self, desc, None) is not None:
                self._lib.destroyDnMat(getattr(self, desc))


def _cuda_peer(name, builder) -> Peer:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
    A, x, y = _tiny()
    got = cupy.asnumpy(builder(A, np.dtype(np.float64))(cupy.asarray(x)))
    if not np.allclose(got, y):
        raise RuntimeError(f"{name} gave {got} on a 3x3 test product, expected {y}")
    return Peer(name, True, device="cuda", builder=builder)


def _cusparse_peer() -> Peer:
    return _cuda_peer("cusparse", _cusparse_builder)


def _cupy_csr_peer() -> Peer:
    return _cuda_peer("cupy-csr", _cupy_csr_builder)


_DETECTORS = {
    "scipy": _scipy_peer,
    "torch-csr": _torch_peer,
    "mkl": _mkl_peer,
    "cusparse": _cusparse_peer,
    "cupy-csr": _cupy_csr_peer,
}


def available_peers(include: Iterable[str] | None = None) -> list[Peer]:
    """Detect the peers (all of ``PEER_NAMES``, or those named in ``include``).

    Returns one ``Peer`` per name, in ``PEER_NAMES`` order; a peer whose library is
    missing, fails to load or computes a wrong tiny product comes back with
    ``available=False`` and the reason -- this never raises for that. Unknown names in
    ``include`` are a caller error (ValueError). Aliases: torch, sparse_dot_mkl, cupy.
    """
    if include is None:
        wanted = set(PEER_NAMES)
    else:
        wanted = {_ALIASES.get(name, name) for name in include}
        unknown = wanted.difference(PEER_NAMES)
        if unknown:
            raise ValueError(f"unknown peers {sorted(unknown)}; known: "
                             f"{', '.join(PEER_NAMES)} (torch for torch-csr, cupy for "
                             "cupy-csr)")
    peers = []
    for name in PEER_NAMES:
        if name not in wanted:
            continue
        try:
            peers.append(_DETECTORS[name]())
        except (Exception, SystemExit) as exc:  # noqa: BLE001  broken installs raise anything
            reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
            peers.append(Peer(name, False, reason))
    return peers


# --------------------------------------------------------------------------- timing a peer


def time_peer(peer: Peer, A, x, dtype, **median_kw) -> tuple[float, np.ndarray]:
    """Median seconds of one y = A @ x with ``peer``, and y as a host numpy array.

    Conversion and uploads happen once, outside the timed region. CPU peers: wall
    time of the callable (``median_time``). CUDA peers: x is uploaded once, and each
    sample is the CUDA-event time of the product alone, synchronised after it.
    ``median_kw`` takes median_time's keywords (warmup, repeats, min_time, max_time).
    """
    dtype = np.dtype(dtype)
    f = peer.prepare(A, dtype)
    xh = np.ascontiguousarray(x, dtype=dtype)
    if peer.device == "cpu":
        y = np.asarray(f(xh))
        return median_time(lambda: f(xh), **median_kw), y

    sample, y = cuda_sampler(f, xh)
    kw = {"warmup": 3, "repeats": 20, "min_time": 0.2, "max_time": 5.0, **median_kw}
    return _sample(sample, sample, kw["warmup"], kw["repeats"], kw["min_time"],
                   kw["max_time"]), y


def cuda_sampler(f, x_host) -> tuple[Callable[[], float], np.ndarray]:
    """For a prepared CUDA peer ``f``: ``sample()`` giving the seconds of one product
    (CUDA events), and y as a host array.  x is uploaded once."""
    import cupy

    x_dev = cupy.asarray(x_host)
    y = cupy.asnumpy(f(x_dev))
    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    def sample() -> float:
        # Several calls back to back between the events, so that the host work of one
        # call overlaps the previous call's kernels instead of being timed as idle GPU
        # time.  Where a product is shorter than that host work (cupy-csr: ~40 us a
        # call on an H200), this is the call rate, not the kernel time.
        start.record()
        for _ in range(CUSPARSE_CALLS_PER_SAMPLE):
            f(x_dev)
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) * 1e-3 / CUSPARSE_CALLS_PER_SAMPLE

    return sample, y
