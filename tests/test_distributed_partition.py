"""Graph partitioning for the distributed layout (pyspmv_cl.distributed.partition),
without MPI: the graph, the permutation, the balance, and fewer ghosts than contiguous
blocks on a scrambled mesh (every rank simulated with plan.simulate).

The METIS tests are skipped when pymetis is missing, except when CI is set: then they
fail.  The graph, permutation and import-error tests need no pymetis."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import assert_close, reference

from pyspmv_cl.bench import generators
from pyspmv_cl.distributed import partition as gp
from pyspmv_cl.distributed import plan as dp
from pyspmv_cl.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[1]

try:
    import pymetis  # noqa: F401
    METIS_MISSING = None
except ImportError:
    METIS_MISSING = "pymetis is not installed (pip install 'pyspmv-cl[metis]')"

needs_metis = pytest.mark.skipif(bool(METIS_MISSING) and not os.environ.get("CI"),
                                 reason=str(METIS_MISSING))


def scrambled_grid(k, seed=0):
    """A k x k grid Laplacian with its unknowns randomly renumbered (symmetrically):
    contiguous row blocks of it are scattered over the mesh."""
    A = generators.poisson2d(k)
    perm = np.random.default_rng(seed).permutation(A.shape[0])
    return gp.permute_symmetric(A, perm)


def ghosts(A, offsets):
    return sum(plan.n_ghosts for _, _, plan in dp.simulate(A, offsets))


def test_adjacency_is_symmetric_pattern_without_diagonal():
    # Entry (0, 1) one way only, (2, 2) diagonal only, (1, 3) stored twice, (3, 1) too,
    # and a stored zero at (0, 3): an edge all the same.
    A = sp.csr_matrix((np.array([1.0, 5.0, 0.0, 2.0, 2.0, 3.0, 4.0]),
                       np.array([1, 0, 3, 3, 3, 2, 1]), np.array([0, 3, 5, 6, 7])),
                      shape=(4, 4))
    assert A.nnz == 7                                # the duplicate (1, 3) kept apart
    xadj, adjncy = gp.adjacency_graph(A)
    G = sp.csr_matrix((np.ones(len(adjncy)), adjncy, xadj), shape=(4, 4)).toarray()
    expected = np.array([[0, 1, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 0]])
    assert np.array_equal(G, expected)          # one entry per edge and direction
    assert xadj.dtype == np.int64 and adjncy.dtype == np.int64
    assert gp.vertex_weights(A).tolist() == [4, 3, 2, 2]


def test_permutation_from_parts():
    parts = np.array([2, 0, 2, 1, 0, 2])
    perm, offsets = gp.permutation_from_parts(parts, 4)
    assert perm.tolist() == [1, 4, 3, 0, 2, 5]      # part order, original order within
    assert offsets.tolist() == [0, 2, 3, 6, 6]      # part 3 is empty
    for p in range(4):
        assert np.all(parts[perm[offsets[p]:offsets[p + 1]]] == p)
    with pytest.raises(InvalidInputError, match="parts must be"):
        gp.permutation_from_parts([0, 4], 4)


def test_permute_symmetric_matches_fancy_indexing_and_keeps_duplicates(rng):
    A = generators.random_uniform(80, 80, 5, seed=3)
    perm = rng.permutation(80)
    B = gp.permute_symmetric(A, perm)
    assert abs(B - A[perm][:, perm]).sum() == 0
    x = rng.standard_normal(80)
    assert_close(B @ x[perm], reference(A, x)[perm], A, x, np.float64)
    dup = sp.csr_matrix((np.array([1.0, 2.0, 3.0]), np.array([1, 1, 0]),
                         np.array([0, 2, 3])), shape=(2, 2))
    swapped = gp.permute_symmetric(dup, np.array([1, 0]))
    assert swapped.indptr.tolist() == [0, 1, 3]
    assert swapped.indices.tolist() == [1, 0, 0] and swapped.data.tolist() == [3.0, 1.0, 2.0]
    with pytest.raises(InvalidInputError, match="square"):
        gp.permute_symmetric(sp.csr_matrix((3, 4)), np.arange(3))


def test_missing_pymetis_says_how_to_install():
    """With pymetis unimportable, a METIS partition raises ImportError naming the
    extra (run in a subprocess: no test's pymetis is disturbed)."""
    code = ("import sys; sys.modules['pymetis'] = None\n"
            "import scipy.sparse as sp\n"
            "from pyspmv_cl.distributed import partition as gp\n"
            "try:\n"
            "    gp.metis_partition(sp.eye(4, format='csr'), 2)\n"
            "except ImportError as exc:\n"
            "    assert \"pip install 'pyspmv-cl[metis]'\" in str(exc), exc\n"
            "    assert 'pymetis' in str(exc), exc\n"
            "    print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_non_square_is_refused():
    with pytest.raises(InvalidInputError, match="square"):
        gp.metis_partition(sp.csr_matrix((4, 5)), 2)


@needs_metis
@pytest.mark.parametrize("nparts", [1, 2, 3, 4, 7])
def test_metis_partition_is_a_balanced_bijection(nparts):
    A = scrambled_grid(30)                        # 900 rows
    n = A.shape[0]
    perm, offsets = gp.metis_partition(A, nparts)
    assert np.array_equal(np.sort(perm), np.arange(n)), "perm is a bijection"
    assert offsets[0] == 0 and offsets[-1] == n and np.all(np.diff(offsets) >= 0)
    assert len(offsets) == nparts + 1
    # Non-zeros (plus one per row, the weight METIS balances) within 5 % of the mean.
    weight = gp.vertex_weights(A)[perm]
    per = np.add.reduceat(weight, offsets[:-1])
    assert per.sum() == weight.sum()
    assert per.max() <= 1.05 * weight.sum() / nparts, per
    nnz = np.add.reduceat(np.diff(A.indptr)[perm], offsets[:-1])
    assert nnz.max() <= 1.06 * A.nnz / nparts, nnz
    # Deterministic: the same matrix gives the same partition.
    again, offsets2 = gp.metis_partition(A, nparts)
    assert np.array_equal(again, perm) and np.array_equal(offsets2, offsets)


@needs_metis
@pytest.mark.parametrize("nparts", [2, 4, 8])
def test_metis_needs_fewer_ghosts_than_contiguous_blocks(nparts, rng):
    """On a scrambled grid, contiguous row blocks touch most of the mesh; METIS's
    parts are compact, their boundary ~ sqrt of their size: far fewer ghosts.  The
    permuted matrix's product, simulated rank by rank, is A's, permuted."""
    A = scrambled_grid(40, seed=nparts)           # 1600 rows
    contiguous = ghosts(A, dp.partition_rows(A.indptr, nparts, "nnz"))
    perm, offsets = gp.metis_partition(A, nparts)
    B = gp.permute_symmetric(A, perm)
    metis = ghosts(B, offsets)
    # An 40x40 grid cut into 8 compact pieces has a few hundred boundary nodes at most.
    assert metis < contiguous / 4, (metis, contiguous)
    assert metis <= 2 * 40 * nparts, metis
    x = rng.standard_normal(A.shape[0])
    y = dp.simulate_product(dp.simulate(B, offsets), x[perm], offsets, offsets)
    assert_close(y, reference(A, x)[perm], A, x, np.float64)


@needs_metis
def test_metis_edge_cases():
    # One part: identity, no METIS call.
    perm, offsets = gp.metis_partition(generators.poisson2d(5), 1)
    assert perm.tolist() == list(range(25)) and offsets.tolist() == [0, 25]
    # No off-diagonal entries (nothing to cut): contiguous blocks by weight.
    perm, offsets = gp.metis_partition(sp.eye(10, format="csr"), 3)
    assert perm.tolist() == list(range(10)) and offsets[-1] == 10
    assert np.diff(offsets).tolist() == np.diff(
        dp.partition_rows(sp.eye(10, format="csr").indptr, 3)).tolist()
    # More parts than rows: some parts empty, every row placed once.
    A = generators.poisson2d(2)
    perm, offsets = gp.metis_partition(A, 6)
    assert np.array_equal(np.sort(perm), np.arange(4)) and offsets[-1] == 4
    assert np.count_nonzero(np.diff(offsets) == 0) == 2
    # An empty matrix.
    perm, offsets = gp.metis_partition(sp.csr_matrix((0, 0)), 3)
    assert perm.size == 0 and offsets.tolist() == [0, 0, 0, 0]
    with pytest.raises(InvalidInputError, match="at least one"):
        gp.metis_partition(A, 0)
