"""pyspmv_cl.distributed.model: the loads it derives for the benchmark matrices match
real plans (plan.simulate, no MPI), and its arithmetic does what its text says."""

import numpy as np
import pytest

from pyspmv_cl.bench.generators import poisson3d
from pyspmv_cl.bench.row_blocks import power_law_rows
from pyspmv_cl.distributed import model as dm
from pyspmv_cl.distributed import plan as dp


@pytest.mark.parametrize("n, ranks", [(9, 1), (10, 3), (11, 4), (12, 2), (13, 5)])
def test_stencil_loads_equal_the_plans(n, ranks):
    offsets = np.linspace(0, n**3, ranks + 1).round().astype(np.int64)
    assert dm.stencil_loads(n, ranks) == dm.loads_from_plans(dp.simulate(poisson3d(n), offsets))


def test_stencil_loads_refuse_slabs_thinner_than_a_plane():
    with pytest.raises(ValueError, match="thinner than a plane"):
        dm.stencil_loads(8, 9)


@pytest.mark.parametrize("ranks", [2, 4])
def test_power_law_loads_predict_the_plans(ranks):
    n = 60_000
    seed = int(np.random.default_rng().integers(1000))
    A = power_law_rows(n, 0, n, avg_degree=16, seed=seed)
    offsets = dp.partition_rows(A.indptr, ranks, "nnz")
    real = dm.loads_from_plans(dp.simulate(A, offsets))
    expected = dm.power_law_loads(n, ranks, avg_degree=A.nnz / n)
    for got, want in zip(real, expected):
        assert got.neighbours == want.neighbours == ranks - 1
        # Expectations against one draw: over 25 seeds the largest deviations were
        # 6% (ghosts), 9% (sent) and 7% (off-diagonal entries).
        assert got.n_ghosts == pytest.approx(want.n_ghosts, rel=0.12)
        assert got.n_send == pytest.approx(want.n_send, rel=0.15)
        assert got.nnz_diag + got.nnz_off == pytest.approx(want.nnz_diag + want.nnz_off,
                                                           rel=0.01)
        assert got.nnz_off == pytest.approx(want.nnz_off, rel=0.15)


def test_fit_line_recovers_latency_and_rate():
    sizes = np.array([1e3, 1e5, 1e7])
    assert dm.fit_line(sizes, 2e-5 + 3e-10 * sizes) == pytest.approx((2e-5, 3e-10))
    # A negative intercept (noise) is clipped: a line through the origin instead.
    lat, rate = dm.fit_line([1.0, 2.0], [0.9, 2.0])
    assert lat == 0.0 and rate == pytest.approx((0.9 + 4.0) / 5.0)


RATES = dm.Rates(kernel_latency=1e-5, kernel_per_nnz=1e-10, d2h_latency=2e-5,
                 d2h_per_byte=1e-10, h2d_latency=3e-5, h2d_per_byte=2e-10,
                 mpi_latency=1e-6, mpi_per_byte=1e-10, overhead=4e-5)


def test_predict_adds_the_phases_and_overlaps_the_exchange():
    one = dm.predict([dm.RankLoad(1e8, 0, 0, 0, 0)], RATES)
    assert one["total"] == pytest.approx(4e-5 + 1e-5 + 1e-2)
    assert one["exchange"] == one["pack"] == one["offdiag"] == 0
    load = dm.RankLoad(nnz_diag=1e8, nnz_off=1e5, n_send=1e6, n_ghosts=2e6, neighbours=2)
    t = dm.predict([load, dm.RankLoad(1e3, 0, 0, 0, 0)], RATES, value_bytes=8)
    assert t["pack"] == pytest.approx(2e-5 + 8e6 * 1e-10)
    assert t["exchange"] == pytest.approx(4e-6 + 16e6 * 1e-10)
    assert t["upload"] == pytest.approx(3e-5 + 16e6 * 2e-10)
    assert t["diag"] == pytest.approx(1e-5 + 1e-2)
    chain = t["pack"] + t["exchange"] + t["upload"]
    assert t["hidden"] == pytest.approx(chain)                 # all under the kernels
    assert t["offdiag"] == pytest.approx(1e-5 + 1e5 * 1e-10)
    assert t["total"] == pytest.approx(4e-5 + t["diag"] + t["offdiag"])
    assert t["per_rank"][0] == t["total"] > t["per_rank"][1]
    # A slow network puts the exchange chain on the critical path.
    slow = dm.Rates(**{**RATES.as_dict(), "mpi_per_byte": 1e-8})
    s = dm.predict([load], slow)
    assert s["total"] == pytest.approx(4e-5 + s["pack"] + s["exchange"] + s["upload"]
                                       + s["offdiag"])
    assert s["hidden"] == pytest.approx(s["diag"])
