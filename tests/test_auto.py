"""format="auto": the rule (tune=False, the tuner's model-only fallback) picks the
expected format where the answer is clear (through GPU- and CPU-shaped profiles),
explains itself, and auto stays correct on every edge case (small matrices: the rules,
no measuring; the measuring tuner is tested in test_tuner.py)."""

import numpy as np
import pytest
from conftest import DTYPES, poisoned, skip_without_fp64
from matrix_cases import CASES, check_against_scipy

import pyspmv_cl as psc
from pyspmv_cl.bench import generators


def very_uneven():
    """Mostly 4-entry rows and every 50th row of 500 (std/mean > 3, longest < 4096)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(5)
    lengths = np.where(np.arange(5000) % 50 == 0, 500, 4)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = rng.integers(0, 3000, indptr[-1])
    return sp.csr_matrix((rng.standard_normal(indptr[-1]), cols, indptr), shape=(5000, 3000))


GPU = dict(device_type="gpu", simd_width=32, compute_units=80)
CPU = dict(device_type="cpu", compute_units=2, vector_lanes_float32=8, vector_lanes_float64=4)

CHOICES = [
    # (matrix builder, profile, expected format)
    (lambda: generators.poisson2d(60), GPU, "dia"),
    (lambda: generators.banded(3000, 3), GPU, "dia"),
    (lambda: generators.power_law(100000, 8, seed=3), GPU, "coo"),
    (lambda: generators.dense_rows(20000, 2, 8), GPU, "coo"),
    (lambda: generators.random_uniform(5000, 5000, 6, seed=1), GPU, "sell"),
    (lambda: generators.random_uniform(2000, 4000, 40, seed=2), GPU, "csr-vector"),
    (lambda: very_uneven(), GPU, "csr-vector"),
    (lambda: generators.poisson2d(60), CPU, "sell"),
    (lambda: generators.power_law(500000, 8, seed=3), CPU, "sell"),
    (lambda: generators.dense_rows(20000, 2, 8), CPU, "csr-scalar"),
]


def check(op, A, rng, dtype):
    x = rng.standard_normal(A.shape[1])
    y = op.matvec(x, out=poisoned(A.shape[0], dtype))
    check_against_scipy(y, A, x, dtype)


@pytest.mark.parametrize("case", range(len(CHOICES)))
def test_choice(case, device, rng):
    build, override, expected = CHOICES[case]
    A = build()
    op = psc.SpMV(A, format="auto", dtype=np.float32, device=device.override(**override),
                  tune=False)
    assert op.format == expected, op.explanation
    assert op.explanation.startswith("rules only") and op.tuning.source == "model"
    check(op, A, rng, np.float32)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_edge_cases(case, dtype, device, rng):
    skip_without_fp64(device, dtype)
    A = CASES[case](rng)
    for dev in (device, device.override(**GPU)):
        op = psc.SpMV(A, format="auto", dtype=dtype, device=dev)
        assert op.format in psc.formats()
        assert op.tuning.source == "model"   # small: no measuring by default
        check(op, A, rng, dtype)
