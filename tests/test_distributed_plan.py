"""The distributed layout's partition and communication plan, without MPI: every rank
simulated in one process (pyspmv_cl.distributed.plan), compared with scipy."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import assert_close, reference

from pyspmv_cl.bench import generators
from pyspmv_cl.distributed import plan as dp
from pyspmv_cl.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[1]


def lower_banded(n, k=3):
    """Row i holds columns i-k..i: the first rank needs no ghosts (it only sends)."""
    return sp.diags([np.full(n - d, d + 1.0) for d in range(k + 1)],
                    [-d for d in range(k + 1)], shape=(n, n), format="csr")


def matrices():
    yield "random", generators.random_uniform(300, 300, 6, seed=1)
    yield "banded", generators.banded(400, 7, seed=2)
    yield "power_law", generators.power_law(500, 6, seed=3)
    yield "lower_banded", lower_banded(200)
    yield "rect_wide", generators.random_uniform(90, 250, 5, seed=4)
    yield "rect_tall", generators.random_uniform(250, 60, 4, seed=5)
    yield "empty_rows", sp.csr_matrix((np.ones(3), ([0, 50, 99], [99, 0, 50])),
                                      shape=(100, 100))


MATRICES = dict(matrices())


def offsets_for(A, nparts, how):
    if how == "all_on_first":
        return np.array([0] + [A.shape[0]] * nparts)
    if how == "all_on_last":
        return np.array([0] * nparts + [A.shape[0]])
    return dp.partition_rows(A.indptr, nparts, how)


def simulated(A, nparts, how):
    """Every rank's blocks and plan, the row offsets and the column offsets (the rows'
    for a square matrix, PETSc's even split otherwise)."""
    offsets = offsets_for(A, nparts, how)
    m, n = A.shape
    col_offsets = offsets if m == n else dp.even_offsets(n, nparts)
    return dp.simulate(A, offsets), offsets, col_offsets


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nparts", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("how", ["nnz", "rows", "all_on_first", "all_on_last"])
def test_simulated_product_matches_scipy(name, nparts, how, rng):
    A = MATRICES[name]
    parts, offsets, col_offsets = simulated(A, nparts, how)
    x = rng.standard_normal(A.shape[1])
    y = dp.simulate_product(parts, x, offsets, col_offsets)
    assert_close(y, reference(A, x), A, x, np.float64)
    # Every entry lands in exactly one block.
    assert sum(d.nnz + o.nnz for d, o, _ in parts) == A.nnz


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nparts", [1, 2, 4, 7])
@pytest.mark.parametrize("how", ["nnz", "rows", "all_on_first", "all_on_last"])
def test_simulated_transposed_product_matches_scipy(name, nparts, how, rng):
    """The exchange in reverse (as the operator's rmatvec runs it) gives A.T @ y."""
    A = MATRICES[name]
    parts, offsets, col_offsets = simulated(A, nparts, how)
    y = rng.standard_normal(A.shape[0])
    At = sp.csr_matrix(A.T)
    x = dp.simulate_rproduct(parts, y, offsets, col_offsets)
    assert_close(x, reference(At, y), At, y, np.float64)


def test_simulated_adjoint_of_complex_matrix(rng):
    """Complex values: the reverse exchange gives A^H y (each block conjugated)."""
    A = generators.random_uniform(120, 120, 5, seed=8)
    A = sp.csr_matrix((A.data * np.exp(1j * rng.uniform(0, 6, A.nnz)), A.indices,
                       A.indptr), shape=A.shape)
    offsets = dp.partition_rows(A.indptr, 4, "nnz")
    y = rng.standard_normal(120) + 1j * rng.standard_normal(120)
    x = dp.simulate_rproduct(dp.simulate(A, offsets), y, offsets, offsets)
    expected = A.conj().T @ y
    assert np.all(np.abs(x - expected) <= 1e-12 * (abs(A).T @ np.abs(y)))
    assert np.abs(x - A.T @ y).max() > 1e-3     # A^T y would differ: conjugated


def test_reverse_targets_sum_duplicates_in_order():
    """An owned entry asked for by several neighbours: its contributions are summed
    once per entry, in the packed (rank) order."""
    send_idx = np.array([4, 1, 7, 1, 4, 2, 4])     # three neighbours' requests, packed
    targets, inverse = dp.reverse_targets(send_idx)
    assert targets.tolist() == [1, 2, 4, 7]
    assert np.array_equal(targets[inverse], send_idx)
    received = np.array([1.0, 10.0, 100.0, 1000.0, 1e4, 1e5, 1e6])
    acc = dp.accumulate(received, inverse, len(targets))
    assert acc.tolist() == [1010.0, 1e5, 1.0 + 1e4 + 1e6, 100.0]
    reused = np.full(4, np.nan)
    assert dp.accumulate(received, inverse, 4, out=reused) is reused
    assert reused.tolist() == acc.tolist()
    empty_targets, empty_inverse = dp.reverse_targets(np.zeros(0, dtype=np.int64))
    assert empty_targets.size == 0 and empty_inverse.size == 0
    assert dp.accumulate(np.zeros(0), empty_inverse, 0).size == 0


def test_reverse_exchange_has_duplicate_targets():
    """The random matrix on 4 ranks asks some owned entries from several neighbours:
    the MPI tests' transposed products exercise the summation of duplicates."""
    A = MATRICES["random"]
    parts = dp.simulate(A, dp.partition_rows(A.indptr, 4, "nnz"))
    assert any(len(dp.reverse_targets(p.send_idx)[0]) < p.n_send for _, _, p in parts)


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nparts", [2, 4, 5])
def test_plans_are_consistent(name, nparts):
    A = MATRICES[name]
    offsets = dp.partition_rows(A.indptr, nparts, "nnz")
    m, n = A.shape
    cols = offsets if m == n else dp.even_offsets(n, nparts)
    parts = dp.simulate(A, offsets)
    for p, (diag, offdiag, plan) in enumerate(parts):
        g = plan.garray
        assert np.all(np.diff(g) > 0), "ghosts sorted and unique"
        assert not np.any((g >= cols[p]) & (g < cols[p + 1])), "no owned column is a ghost"
        assert diag.shape == (offsets[p + 1] - offsets[p], cols[p + 1] - cols[p])
        assert offdiag.shape == (diag.shape[0], len(g))
        # Each receive slice is owned by its sender; the sender sends exactly it.
        for i, q in enumerate(plan.recv_ranks):
            ids = g[plan.recv_ptr[i]:plan.recv_ptr[i + 1]]
            assert np.all((ids >= cols[q]) & (ids < cols[q + 1]))
            sender = parts[q][2]
            j = int(np.flatnonzero(sender.send_ranks == p)[0])
            sent = sender.send_idx[sender.send_ptr[j]:sender.send_ptr[j + 1]] + cols[q]
            assert np.array_equal(sent, ids)
        # Send and receive sizes are each other's transpose.
        for q, count in plan.sizes()["send"].items():
            assert parts[q][2].sizes()["recv"][p] == count
    # The row block rebuilt from both blocks is the original.
    for p, (diag, offdiag, plan) in enumerate(parts):
        rebuilt = sp.hstack([diag, offdiag]).tocsr()
        cols_global = np.concatenate([np.arange(cols[p], cols[p + 1]), plan.garray])
        block = sp.csr_matrix((rebuilt.data, cols_global[rebuilt.indices], rebuilt.indptr),
                              shape=(diag.shape[0], n))
        diff = block - A[offsets[p]:offsets[p + 1]]
        assert abs(diff).sum() == 0


def test_rank_without_ghosts():
    A = lower_banded(200)
    parts = dp.simulate(A, dp.partition_rows(A.indptr, 4, "rows"))
    first = parts[0][2]
    assert first.n_ghosts == 0 and first.n_send > 0 and parts[0][1].nnz == 0
    assert all(p.n_ghosts > 0 for _, _, p in parts[1:])


def test_empty_ranks_more_ranks_than_rows(rng):
    A = sp.csr_matrix(rng.standard_normal((3, 3)))
    offsets = dp.partition_rows(A.indptr, 5, "nnz")
    assert offsets[0] == 0 and offsets[-1] == 3 and np.all(np.diff(offsets) >= 0)
    assert np.count_nonzero(np.diff(offsets) == 0) == 2
    parts = dp.simulate(A, offsets)
    x = rng.standard_normal(3)
    assert_close(dp.simulate_product(parts, x, offsets, offsets), reference(A, x), A, x,
                 np.float64)
    for (d, _o, plan), size in zip(parts, np.diff(offsets)):
        if size == 0:
            assert d.shape == (0, 0) and plan.n_ghosts == 0 and plan.n_send == 0


def test_owner_of_skips_empty_ranks():
    offsets = np.array([0, 0, 4, 4, 4, 9, 9])
    assert dp.owner_of([0, 3, 4, 8], offsets).tolist() == [1, 1, 4, 4]


def test_partition_by_rows_is_petsc_split():
    assert dp.even_offsets(10, 4).tolist() == [0, 3, 6, 8, 10]
    indptr = np.arange(11)
    assert dp.partition_rows(indptr, 4, "rows").tolist() == [0, 3, 6, 8, 10]


def test_partition_by_nnz_balances():
    A = generators.power_law(20000, 8, seed=7)
    weight = np.diff(A.indptr) + 1
    longest = weight.max()
    for nparts in (2, 3, 8):
        offsets = dp.partition_rows(A.indptr, nparts, "nnz")
        per = np.add.reduceat(weight, offsets[:-1]) if nparts else None
        target = weight.sum() / nparts
        # Each boundary is within one row of its target: parts within 2 rows' weight.
        assert np.all(np.abs(per - target) <= 2 * longest), (per, target, longest)
    by_rows = dp.partition_rows(A.indptr, 8, "rows")
    by_nnz = dp.partition_rows(A.indptr, 8, "nnz")
    nnz_rows = np.add.reduceat(np.diff(A.indptr), by_rows[:-1])
    nnz_nnz = np.add.reduceat(np.diff(A.indptr), by_nnz[:-1])
    assert nnz_nnz.max() / nnz_nnz.mean() <= nnz_rows.max() / nnz_rows.mean() + 1e-9


def test_partition_edge_cases():
    assert dp.partition_rows(np.zeros(1, dtype=int), 3).tolist() == [0, 0, 0, 0]
    one_heavy = np.array([0, 1000, 1001, 1002, 1003])   # row 0 holds nearly everything
    offsets = dp.partition_rows(one_heavy, 2)
    assert offsets.tolist()[0] == 0 and offsets[-1] == 4 and np.all(np.diff(offsets) >= 0)
    with pytest.raises(InvalidInputError, match="partition='metis' permutes the matrix"):
        dp.partition_rows(one_heavy, 2, "metis")
    with pytest.raises(InvalidInputError, match="'nnz', 'rows' or 'metis' .* not 'bogus'"):
        dp.partition_rows(one_heavy, 2, "bogus")
    with pytest.raises(InvalidInputError, match="rise from 0"):
        dp.simulate(sp.eye(4, format="csr"), [0, 3, 2, 4])
    with pytest.raises(InvalidInputError, match="at least one"):
        dp.partition_rows(one_heavy, 0)


def test_split_block_keeps_duplicates_and_order():
    # Two entries at (0, 5) and one owned, one ghost column per row.
    block = sp.csr_matrix((np.array([1.0, 2.0, 3.0, 4.0]), np.array([5, 0, 5, 2]),
                           np.array([0, 3, 4])), shape=(2, 8))
    diag, off, garray = dp.split_block(block, 2, 4)
    assert garray.tolist() == [0, 5]
    assert diag.toarray().tolist() == [[0, 0], [4.0, 0]]
    assert off.indices.tolist() == [1, 0, 1] and off.data.tolist() == [1.0, 2.0, 3.0]


def test_split_block_without_ghosts_shifts_and_keeps_the_input():
    """A block whose columns are all owned (one rank, a block diagonal) takes the short
    path: the same entries, columns shifted, no off-diagonal part, the input intact."""
    rng = np.random.default_rng()
    inner = sp.random(30, 50, density=0.1, format="csr", random_state=rng)
    block = sp.hstack([sp.csr_matrix((30, 100)), inner, sp.csr_matrix((30, 20))]).tocsr()
    before = [a.copy() for a in (block.data, block.indices, block.indptr)]
    diag, off, garray = dp.split_block(block, 100, 150)
    assert diag.shape == (30, 50) and off.shape == (30, 0) and off.nnz == 0
    assert garray.size == 0
    np.testing.assert_array_equal(diag.toarray(), inner.toarray())
    for a, b in zip(before, (block.data, block.indices, block.indptr)):
        np.testing.assert_array_equal(a, b)


def test_split_block_both_ghost_paths_agree():
    """split_block finds the ghosts with a table over all columns, or by sorting when
    the columns vastly outnumber the ghosts: both give the same blocks."""
    rng = np.random.default_rng()
    block = sp.random(40, 5000, density=0.02, format="csr", random_state=rng)
    block.indices[::7] = 17        # repeated ghost columns
    table = dp.split_block(block, 1000, 2000)
    wide = sp.csr_matrix((block.data, block.indices, block.indptr), shape=(40, 50_000_000))
    sorted_path = dp.split_block(wide, 1000, 2000)
    np.testing.assert_array_equal(table[2], sorted_path[2])
    assert table[2].tolist() == sorted(set(block.indices[(block.indices < 1000)
                                                         | (block.indices >= 2000)]))
    for a, b in zip(table[:2], sorted_path[:2]):
        assert a.shape == b.shape
        for name in ("data", "indices", "indptr"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    off = table[1]
    np.testing.assert_array_equal(table[2][off.indices],
                                  block.indices[(block.indices < 1000) | (block.indices >= 2000)])


def test_package_imports_without_mpi4py():
    """pyspmv_cl and pyspmv_cl.distributed (the plan functions) import and work with
    mpi4py unavailable; making an operator then says how to install it."""
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"
        "import numpy as np, scipy.sparse as sp\n"
        "import pyspmv_cl, pyspmv_cl.distributed as psd\n"
        "A = sp.eye(6, format='csr')\n"
        "parts = psd.plan.simulate(A, psd.partition_rows(A.indptr, 2))\n"
        "assert len(parts) == 2\n"
        "try:\n"
        "    psd.SpMV(A, row_start=0, shape=(6, 6))\n"
        "except ImportError as exc:\n"
        "    assert 'pyspmv-cl[mpi]' in str(exc), exc\n"
        "    print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_core_does_not_import_mpi4py():
    code = ("import sys, pyspmv_cl, pyspmv_cl.distributed\n"
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_contiguous_runs():
    from pyspmv_cl.distributed.operator import contiguous_runs

    idx = np.array([5, 6, 7, 20, 21, 3])
    runs = contiguous_runs(idx, 4)
    assert runs == [(5, 0, 3), (20, 3, 2), (3, 5, 1)]
    rebuilt = np.concatenate([start + np.arange(n) for start, _, n in runs])
    assert np.array_equal(rebuilt, idx)
    assert contiguous_runs(idx, 2) is None
    assert contiguous_runs(np.zeros(0, np.int64), 4) is None
    assert contiguous_runs(np.arange(10, 1000), 1) == [(10, 0, 990)]
