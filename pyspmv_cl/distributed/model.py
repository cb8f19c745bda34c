"""A model of the distributed product's time from measured rates (no MPI needed).

One product on a rank (``operator.SpMV.matvec`` with device vectors) runs two chains
at once, the device's kernels and the exchange:

    diag      the diagonal block's kernels                          (kernel queue)
    pack      gather the values to send, copy them to the host      } exchange
    exchange  MPI messages to and from the neighbours               } chain
    upload    copy the received ghosts to the device                }
    offdiag   the off-diagonal block's kernels, after both chains

so ``t = overhead + max(diag, pack + exchange + upload) + offdiag``, and the product
takes the slowest rank's time.  Each step is ``latency + size * seconds per unit``
with the rates of one machine (``Rates``), measured by ``benchmarks/multigpu.py``:
kernels from one-device products at two sizes, copies (to and from the pinned
staging arrays the operator uses) and messages from two sizes each.

``stencil_loads`` and ``power_law_loads`` give each rank's sizes for the two benchmark
matrices (``bench.row_blocks``) under the contiguous non-zero balanced partition,
without building the matrix, so the model can predict 8 or 64 devices at a billion
non-zeros; ``loads_from_plans`` reads them off real plans (``plan.simulate`` or the
operators' ``comm_plan``) to check those formulas.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Rates", "RankLoad", "fit_line", "loads_from_plans", "power_law_loads",
           "power_law_weights", "predict", "stencil_loads"]


@dataclass(frozen=True)
class Rates:
    """Seconds per unit and fixed seconds per step, of one machine and matrix kind."""
    kernel_latency: float        # per block product (launches, waits)
    kernel_per_nnz: float        # seconds per non-zero of a block product
    d2h_latency: float
    d2h_per_byte: float
    h2d_latency: float
    h2d_per_byte: float
    mpi_latency: float           # per message (one per neighbour and direction)
    mpi_per_byte: float          # per byte a rank sends or receives, the larger of both
    overhead: float = 0.0        # Python and bookkeeping per distributed product

    def as_dict(self):
        return asdict(self)


@dataclass(frozen=True)
class RankLoad:
    """What one rank multiplies and exchanges per product."""
    nnz_diag: float
    nnz_off: float
    n_send: float        # values sent (all neighbours)
    n_ghosts: float      # values received
    neighbours: int


def fit_line(sizes, seconds):
    """(latency, seconds per unit) of a least-squares line through the measurements,
    latency clipped at zero (two sizes suffice; more average the noise)."""
    sizes = np.asarray(sizes, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    if sizes.size == 1 or np.ptp(sizes) == 0:
        return 0.0, float(seconds.mean() / max(sizes.mean(), 1.0))
    slope, intercept = np.polyfit(sizes, seconds, 1)
    if intercept < 0:
        return 0.0, float(np.dot(sizes, seconds) / np.dot(sizes, sizes))
    return float(intercept), float(max(slope, 0.0))


def _rank_time(load: RankLoad, r: Rates, value_bytes: int) -> dict:
    send_bytes = load.n_send * value_bytes
    ghost_bytes = load.n_ghosts * value_bytes
    pack = (r.d2h_latency + send_bytes * r.d2h_per_byte) if load.n_send else 0.0
    exchange = (2 * load.neighbours * r.mpi_latency
                + max(send_bytes, ghost_bytes) * r.mpi_per_byte) if load.neighbours else 0.0
    upload = (r.h2d_latency + ghost_bytes * r.h2d_per_byte) if load.n_ghosts else 0.0
    chain = pack + exchange + upload
    diag = r.kernel_latency + load.nnz_diag * r.kernel_per_nnz
    offdiag = (r.kernel_latency + load.nnz_off * r.kernel_per_nnz) if load.nnz_off else 0.0
    total = r.overhead + max(diag, chain) + offdiag
    return {"pack": pack, "exchange": exchange, "upload": upload, "diag": diag,
            "offdiag": offdiag, "hidden": min(diag, chain), "total": total}


def predict(loads, rates: Rates, value_bytes: int = 8) -> dict:
    """The modelled product: the slowest rank's phases (seconds), plus ``per_rank``
    totals.  ``loads``: one ``RankLoad`` per rank."""
    times = [_rank_time(load, rates, value_bytes) for load in loads]
    slowest = max(times, key=lambda t: t["total"])
    return {**slowest, "per_rank": [t["total"] for t in times]}


def loads_from_plans(parts) -> list[RankLoad]:
    """Loads from ``(diag, offdiag, plan)`` triples, as ``plan.simulate`` returns them."""
    return [RankLoad(nnz_diag=diag.nnz, nnz_off=off.nnz, n_send=plan.n_send,
                     n_ghosts=plan.n_ghosts, neighbours=len(plan.neighbours))
            for diag, off, plan in parts]


def stencil_loads(n: int, ranks: int) -> list[RankLoad]:
    """Loads of the 7-point Laplacian on an n^3 grid (``bench.row_blocks.poisson3d_rows``)
    split into ``ranks`` contiguous row blocks of equal size: slabs of planes.  A rank
    needs the n^2 rows on each side of its slab (fewer at the grid's ends), and its
    +-1 and +-n couplings add a few entries where a cut falls mid-plane.  Exact for
    slabs at least one plane thick (a ValueError otherwise: the model is for slabs)."""
    N, plane = n**3, n * n
    offsets = np.linspace(0, N, ranks + 1).round().astype(np.int64)
    if np.diff(offsets).min() < plane:
        raise ValueError(f"{ranks} slabs of a {n}^3 grid are thinner than a plane")
    loads = []
    for r in range(ranks):
        a, b = int(offsets[r]), int(offsets[r + 1])
        ghosts = min(plane, a) + min(plane, N - b)
        off = ghosts + _short_crossings(n, a, b)
        nnz = 7 * (b - a) - _missing_at_faces(n, a, b)
        loads.append(RankLoad(nnz_diag=nnz - off, nnz_off=off, n_send=ghosts,
                              n_ghosts=ghosts, neighbours=int(r > 0) + int(r < ranks - 1)))
    return loads


def _rows_with_coord(x, stride, n, c):
    """How many rows i < x have coordinate (i // stride) % n == c."""
    period = stride * n
    return (x // period) * stride + min(max(x % period - c * stride, 0), stride)


def _missing_at_faces(n, a, b):
    """Couplings that rows a..b-1 of the n^3 grid lack at the grid's faces."""
    return sum(_rows_with_coord(b, s, n, c) - _rows_with_coord(a, s, n, c)
               for s in (1, n, n * n) for c in (0, n - 1))


def _short_crossings(n, a, b):
    """Entries of rows a..b-1 coupling through +-1 or +-n to a row outside them."""
    low = np.arange(a, min(b, a + n), dtype=np.int64)
    high = np.arange(max(a, b - n), b, dtype=np.int64)
    x_low, y_low = low % n, (low // n) % n
    x_high, y_high = high % n, (high // n) % n
    return int(np.sum((low - 1 < a) & (x_low > 0)) + np.sum((low - n < a) & (y_low > 0))
               + np.sum((high + 1 >= b) & (x_high < n - 1))
               + np.sum((high + n >= b) & (y_high < n - 1)))


def power_law_weights(n: int, exponent: float) -> np.ndarray:
    """The normalised rank-ordered weights p_r ∝ (r + 1) ** -(1 / (exponent - 1)) of
    ``bench.row_blocks.power_law_rows`` (before its scrambling)."""
    beta = 1.0 / (exponent - 1.0)
    w = np.arange(1, n + 1, dtype=np.float64) ** -beta
    return w / w.sum()


def power_law_loads(n: int, ranks: int, avg_degree: float = 16.0, exponent: float = 2.2,
                    chunk: int = 1 << 22) -> list[RankLoad]:
    """Expected loads of ``bench.row_blocks.power_law_rows`` split into ``ranks``
    blocks of equal non-zeros.  Columns are scrambled over the index range, so a
    rank's m entries fall on other ranks' columns with probability (p - 1) / p, and
    it needs sum over their columns j of 1 - exp(-m p_j) distinct ghosts (Poisson
    approximation of sampling with replacement); by symmetry it sends as many.
    Every rank exchanges with every other (hubs are everywhere)."""
    nnz = n * avg_degree
    m = nnz / ranks
    p = power_law_weights(n, exponent)
    distinct = 0.0
    for lo in range(0, n, chunk):
        distinct += float(np.sum(-np.expm1(-m * p[lo:lo + chunk])))
    share = (ranks - 1) / ranks
    ghosts = share * distinct
    return [RankLoad(nnz_diag=m * (1 - share), nnz_off=m * share, n_send=ghosts,
                     n_ghosts=ghosts, neighbours=ranks - 1) for _ in range(ranks)]
