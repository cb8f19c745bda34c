"""In-place products (``out`` is ``x``): every format gives the right answer with device
and host arrays, for alpha/beta as well (the kernels must never read x while writing y
in the same buffer)."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, make_operator, reference
from matrix_cases import CASES

import pyspmv_cl as psc


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (2.0, -0.5)])
@pytest.mark.parametrize("fmt", psc.formats())
def test_in_place_device_product(fmt, alpha, beta, device, rng):
    A = sp.csr_matrix(CASES["power_law"](rng))[:1500]   # square
    op = make_operator(A, fmt, dtype=np.float32, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    v0 = rng.standard_normal(A.shape[0])
    v = cla.to_device(op.queue, v0.astype(np.float32))
    assert op.matvec(v, out=v, alpha=alpha, beta=beta) is v
    assert_close(v.get(), reference(A, v0, alpha, beta, v0), A, v0, np.float32)


def test_in_place_host_product(device, rng):
    A = sp.csr_matrix(CASES["power_law"](rng))[:1500]   # square
    op = psc.SpMV(A, format="csr-scalar", device=device)
    v0 = rng.standard_normal(A.shape[0])
    v = v0.copy()
    op.matvec(v, out=v, alpha=2.0, beta=-0.5)
    assert_close(v, reference(A, v0, 2.0, -0.5, v0), A, v0, np.float64)
