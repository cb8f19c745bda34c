"""Property tests: random shapes, densities and row-length distributions, every format,
both dtypes, every device, against scipy in float64."""

import numpy as np
import pyopencl.array as cla
import pytest
from conftest import DTYPES, make_operator, poisoned, skip_without_fp64
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matrix_cases import check_against_scipy, csr_from_row_lengths

import pyspmv_cl as psc

FORMATS = psc.formats()  # read at collection time: new formats are covered automatically

DISTRIBUTIONS = ("uniform", "power_law", "many_empty", "equal")


def row_lengths(rng, distribution, m, n, density):
    """Row lengths (each <= n) of a given shape of distribution."""
    if m == 0 or n == 0:
        return np.zeros(m, dtype=np.int64)
    if distribution == "uniform":
        lengths = rng.binomial(n, density, m)
    elif distribution == "power_law":
        lengths = np.floor(rng.pareto(1.1, m) * max(1.0, density * n)).astype(np.int64)
        # A few rows of (nearly) full length, as in power-law graphs' hubs.
        hubs = rng.choice(m, min(m, 1 + m // 100), replace=False)
        lengths[hubs] = n - rng.integers(0, max(1, n // 10), hubs.size)
    elif distribution == "many_empty":
        lengths = rng.binomial(n, min(1.0, 4 * density), m)
        lengths[rng.random(m) < 0.85] = 0
    else:  # every row the same length
        lengths = np.full(m, rng.binomial(n, density))
    return np.clip(lengths, 0, n)


matrix_specs = st.fixed_dictionaries({
    "m": st.integers(0, 300),
    "n": st.integers(0, 300),
    "density": st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.2, 0.6, 1.0]),
    "distribution": st.sampled_from(DISTRIBUTIONS),
    "shuffle": st.booleans(),
    "seed": st.integers(0, 2**32 - 1),
    "alpha_beta": st.sampled_from([(1.0, 0.0), (2.5, 0.0), (-1.0, 0.5), (0.5, -2.0)]),
    "on_device": st.booleans(),
})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=matrix_specs)
def test_matches_scipy(spec, fmt, dtype, device):
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng(spec["seed"])
    m, n = spec["m"], spec["n"]
    lengths = row_lengths(rng, spec["distribution"], m, n, spec["density"])
    A = csr_from_row_lengths(rng, lengths, n, shuffle=spec["shuffle"])
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        return
    assert op.shape == (m, n) and op.format == fmt

    x = rng.standard_normal(n)
    alpha, beta = spec["alpha_beta"]
    y0 = rng.standard_normal(m).astype(dtype) if beta else None
    start = poisoned(m, dtype) if y0 is None else y0.copy()
    if spec["on_device"]:
        out = cla.to_device(op.queue, start)
        result = op.matvec(cla.to_device(op.queue, x.astype(dtype)), out=out, alpha=alpha,
                           beta=beta)
        assert result is out
        y = out.get()
    else:
        y = op.matvec(x, out=start, alpha=alpha, beta=beta)
        assert y is start
    check_against_scipy(y, A, x, dtype, alpha, beta, y0)
