"""Graph partitioning of a square matrix for the distributed layout: METIS (through
pymetis, an optional dependency) assigns each row to a part, then the rows and the
columns are permuted symmetrically so that each part becomes a contiguous row block,
the layout ``plan.py`` and the operator expect.  Pure functions of scipy/numpy arrays,
no MPI; pymetis is imported only when a partition is computed.

Why a library rather than a hand-written partitioner: multilevel k-way partitioning
(coarsening, initial partition, Kernighan-Lin/Fiduccia-Mattheyses refinement) is what
makes the cut small on irregular meshes, and METIS is the reference implementation
that PETSc (``MatPartitioning``), Trilinos and hypre call too.  pymetis ships manylinux
wheels with METIS inside, so nothing needs compiling.

Convention: ``perm[new] = old``.  The permuted matrix is ``B = A[perm][:, perm]``, so
``(B @ x[perm]) == (A @ x)[perm]``; the rank owning permuted rows ``r0:r1`` owns the
original indices ``perm[r0:r1]``.
"""

import numpy as np
import scipy.sparse as sp

from ..errors import InvalidInputError
from .plan import partition_rows

__all__ = ["METIS_HINT", "adjacency_graph", "vertex_weights", "metis_parts",
           "permutation_from_parts", "metis_partition", "permute_symmetric"]

METIS_HINT = ("partition='metis' needs pymetis: pip install 'pyspmv-cl[metis]' "
              "(or pip install pymetis)")


def _square_csr(A):
    csr = sp.csr_matrix(A)
    if csr.shape[0] != csr.shape[1]:
        raise InvalidInputError(f"graph partitioning needs a square matrix (rows and x "
                                f"permuted together), not {csr.shape[0]}x{csr.shape[1]}")
    return csr


def adjacency_graph(A):
    """The undirected graph of a square matrix's pattern: ``A + A^T`` without the
    diagonal, each edge once per direction, as ``(xadj, adjncy)`` (CSR of the graph,
    int64).  Stored entries count whatever their value (a stored zero is an edge)."""
    csr = _square_csr(A)
    n = csr.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(csr.indptr))
    cols = csr.indices.astype(np.int64)
    off = rows != cols
    r = np.concatenate([rows[off], cols[off]])
    c = np.concatenate([cols[off], rows[off]])
    # coo -> csr sums the duplicates (an edge stored both ways, or twice): one entry each.
    graph = sp.coo_matrix((np.ones(len(r), dtype=np.int8), (r, c)), shape=(n, n)).tocsr()
    graph.sort_indices()
    return graph.indptr.astype(np.int64), graph.indices.astype(np.int64)


def vertex_weights(A):
    """Each row's weight: its stored non-zeros plus one, as ``partition_rows(by="nnz")``
    weighs rows (a row also costs its pointer and its entry of ``y``)."""
    csr = sp.csr_matrix(A)
    return (np.diff(csr.indptr) + 1).astype(np.int64)


def _import_pymetis():
    try:
        import pymetis
    except ImportError as exc:
        raise ImportError(METIS_HINT) from exc
    return pymetis


def metis_parts(A, nparts, seed=0):
    """The part (``0..nparts-1``) of every row of the square matrix ``A``: METIS on
    :func:`adjacency_graph`, vertices weighted by :func:`vertex_weights` (so the parts
    balance non-zeros, within METIS's default 3 % imbalance for k-way, 0.1 % for
    recursive bisection), fixed ``seed`` (the same matrix gives the same parts).

    Without METIS: one part (all zeros); a graph without edges (nothing to cut) or at
    most ``nparts`` rows get a contiguous split by weight (``partition_rows``'s rule).
    pymetis missing raises ImportError saying how to install it."""
    csr = _square_csr(A)
    n, nparts = csr.shape[0], int(nparts)
    if nparts < 1:
        raise InvalidInputError(f"need at least one part, not {nparts}")
    pymetis = _import_pymetis()     # checked even where METIS is not needed: say so early
    xadj, adjncy = adjacency_graph(csr)
    if nparts == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    if len(adjncy) == 0 or n <= nparts:
        offsets = partition_rows(csr.indptr, nparts, "nnz")
        return (np.searchsorted(offsets, np.arange(n), side="right") - 1).astype(np.int64)
    graph = (pymetis.CSRAdjacency(xadj, adjncy) if hasattr(pymetis, "CSRAdjacency")
             else None)
    options = pymetis.Options(seed=int(seed))
    if graph is not None:
        result = pymetis.part_graph(nparts, graph, vweights=vertex_weights(csr),
                                    options=options)
    else:   # pragma: no cover - pymetis before CSRAdjacency (2023)
        result = pymetis.part_graph(nparts, xadj=xadj, adjncy=adjncy,
                                    vweights=vertex_weights(csr), options=options)
    parts = np.asarray(result[1], dtype=np.int64)
    if parts.shape != (n,) or (n and (parts.min() < 0 or parts.max() >= nparts)):
        raise InvalidInputError(f"METIS returned an invalid partition ({parts.shape}, "
                                f"parts {parts.min()}..{parts.max()} of {nparts})")
    return parts


def permutation_from_parts(parts, nparts):
    """``(perm, offsets)`` that make each part a contiguous block in part order:
    ``perm[new] = old`` (rows of a part keep their original order), ``offsets``
    (``nparts + 1``) where part ``p`` is ``perm[offsets[p]:offsets[p+1]]``."""
    parts = np.asarray(parts, dtype=np.int64)
    nparts = int(nparts)
    if parts.ndim != 1 or (parts.size and (parts.min() < 0 or parts.max() >= nparts)):
        raise InvalidInputError(f"parts must be a 1-D array of values 0..{nparts - 1}")
    perm = np.argsort(parts, kind="stable").astype(np.int64)
    offsets = np.zeros(nparts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=nparts), out=offsets[1:])
    return perm, offsets


def metis_partition(A, nparts, seed=0):
    """METIS's parts of the square matrix ``A`` as ``(perm, offsets)``
    (:func:`metis_parts`, then :func:`permutation_from_parts`)."""
    return permutation_from_parts(metis_parts(A, nparts, seed), nparts)


def permute_symmetric(A, perm):
    """``A[perm][:, perm]`` as CSR, entries of each row in their original order
    (duplicates stay apart): rows gathered, column indices renumbered by the inverse
    permutation, then sorted within each row (stable)."""
    csr = _square_csr(A)
    n = csr.shape[0]
    perm = np.asarray(perm, dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n, dtype=np.int64)
    lengths = np.diff(csr.indptr)[perm]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    # Source position of every entry of the permuted matrix, row by row.
    start = np.repeat(csr.indptr[perm].astype(np.int64) - indptr[:-1], lengths)
    source = start + np.arange(indptr[-1], dtype=np.int64)
    rows = np.repeat(np.arange(n, dtype=np.int64), lengths)
    cols = inverse[csr.indices[source]]
    order = np.lexsort((cols, rows))       # stable: duplicates keep their order
    index_dtype = np.int32 if max(n, indptr[-1]) < 2**31 else np.int64
    return sp.csr_matrix((csr.data[source][order], cols[order].astype(index_dtype),
                          indptr.astype(index_dtype)), shape=(n, n))
