"""A short calibration of CSR5's sigma bounds <r, s, t, u> for the device at hand
(:mod:`.csr5_model` holds the rule and the remembered bounds it reads).

It times the CSR5 format class itself on its own generated matrices: it sits with the
formats, below the SpMV operator, the tuner and the benchmark tooling, and needs none
of them.  SpMV never runs it implicitly.
"""

import statistics

import numpy as np
import pyopencl.array as cla
import scipy.sparse as sp

from ..device import get_device
from ..errors import InvalidParameterError
from ..features import MatrixFeatures
from ..inputs import resolve_dtype
from ..launching import launches_seconds
from .csr5 import CSR5
from .csr5_model import fit_bounds, remember_bounds

# Sigma candidates and generated matrices spanning the rule's regimes (short rows -> r,
# medium -> s, long rows -> u), about 2**18 non-zeros each.
CALIBRATION_SIGMAS = (4, 8, 16, 32)
CALIBRATION_ROW_LENGTHS = (3, 12, 40, 600)
CALIBRATION_NNZ = 2**18


def fixed_length_matrix(rows, cols, length, seed):
    """A ``rows`` x ``cols`` CSR matrix with exactly ``length`` distinct random columns
    in every row (``length <= cols``) and values in [-1, 1)."""
    rng = np.random.default_rng(seed)
    # Sorted draws from [0, cols - length] plus 0..length-1 are strictly increasing:
    # distinct, sorted columns without a per-row loop or rejection.
    cols_drawn = np.sort(rng.integers(0, cols - length + 1, size=(rows, length)), axis=1)
    indices = (cols_drawn + np.arange(length)).ravel().astype(np.int32)
    indptr = np.arange(rows + 1, dtype=np.int64) * length
    data = rng.uniform(-1.0, 1.0, indices.size)
    return sp.csr_matrix((data, indices, indptr), shape=(rows, cols))


def _median_seconds(impl, queue, x_buf, y_buf, repeats):
    times = [launches_seconds(lambda: impl.enqueue(queue, x_buf, y_buf, 1.0, 0.0))
             for _ in range(repeats + 1)]
    return statistics.median(times[1:])   # the first run warms up


def calibrate_bounds(device=None, dtype=np.float32, *, row_lengths=CALIBRATION_ROW_LENGTHS,
                     sigmas=CALIBRATION_SIGMAS, nnz=CALIBRATION_NNZ, repeats=5, remember=True):
    """Measure the bounds <r, s, t, u> for ``device`` and ``dtype``: time CSR5 with each
    of ``sigmas`` on generated matrices with the given mean ``row_lengths``, fit the
    bounds to the fastest sigma of each (:func:`.csr5_model.fit_bounds`) and, with
    ``remember``, store them so that the sigma rule uses them from then on.  Takes a few
    seconds (mostly kernel builds on first use).  Returns ``(bounds, best_sigma)``."""
    device = get_device(device)
    dtype = resolve_dtype(dtype, np.dtype(np.float64), device.profile)
    row_lengths = sorted({int(n) for n in row_lengths})
    if len(row_lengths) < 2:
        raise InvalidParameterError("calibrate_bounds needs at least two row lengths")
    best = {}
    omega = None
    queue = device.profiling_queue
    for length in row_lengths:
        rows = max(1, nnz // length)
        csr = fixed_length_matrix(rows, max(rows, length), length, seed=length)
        features = MatrixFeatures.from_csr(csr)
        rng = np.random.default_rng(length)
        x_dev = cla.to_device(queue, rng.uniform(-1, 1, csr.shape[1]).astype(dtype))
        y_dev = cla.empty(queue, csr.shape[0], dtype)
        timings = {}
        for sigma in sigmas:
            params = CSR5.resolve_params(features, device.profile, dtype, {"sigma": int(sigma)})
            impl = CSR5(csr, device, dtype, params)
            omega = impl.params["omega"]
            timings[int(sigma)] = _median_seconds(impl, queue, x_dev.data, y_dev.data, repeats)
            del impl   # its buffers go before the next sigma's are made
        best[length] = min(timings, key=timings.get)
    bounds = fit_bounds(best)
    if remember:
        remember_bounds(device.profile, dtype, omega, bounds)
    return bounds, best
