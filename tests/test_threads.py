"""One operator shared by several threads (as under a thread pool): every product is
right in every format, with host arrays and with each thread's own device arrays."""

import threading

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import assert_close, make_operator, reference
from matrix_cases import CASES

import pyspmv_cl as psc

THREADS = 8
PRODUCTS = 12


def hammer(work):
    """Run ``work(i)`` in THREADS threads at once; re-raise the first failure."""
    errors = []
    barrier = threading.Barrier(THREADS)

    def run(i):
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001  reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("fmt", psc.formats())
def test_threads_share_one_operator(fmt, device):
    rng = np.random.default_rng(0)
    A = sp.csr_matrix(CASES["power_law"](rng))
    op = make_operator(A, fmt, dtype=np.float32, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")

    def work(i):
        local = np.random.default_rng(i)
        x_dev = cla.empty(op.queue, A.shape[1], np.float32)
        for k in range(PRODUCTS):
            x = local.standard_normal(A.shape[1])
            if k % 2:
                y0 = local.standard_normal(A.shape[0]).astype(np.float32)
                out = y0.copy()
                op.matvec(x, out=out, alpha=2.0, beta=0.5)
                assert_close(out, reference(A, x, 2.0, 0.5, y0), A, x, np.float32)
            else:
                x_dev.set(x.astype(np.float32))
                y = op.matvec(x_dev).get()
                assert_close(y, reference(A, x), A, x, np.float32)

    hammer(work)
