"""The partition and the communication plan of a distributed matrix: pure functions of
numpy arrays, no MPI (the operator runs the one all-to-all they need; tests simulate
the ranks in one process).

The layout is PETSc's MATMPIAIJ: rank ``p`` owns the contiguous rows
``row_offsets[p]:row_offsets[p+1]`` and the entries of ``x`` (columns)
``col_offsets[p]:col_offsets[p+1]``.  Its row block splits into

- the *diagonal block*: the entries in owned columns, with local column indices
  (``col - col_offsets[p]``), multiplied by the rank's own ``x``;
- the *off-diagonal block*: the other entries, with their columns compacted to
  ``0..len(garray)-1``, where ``garray`` (sorted global column ids) lists the ghosts
  whose ``x`` values come from other ranks.

Since ``garray`` is sorted and ownership is contiguous, the ghosts owned by one rank are
a contiguous slice of it: each neighbour's message lands directly in its slice of the
ghost vector, no unpacking.  The sender packs its values with one ``take``.

The transposed product (A^T y, A^H y for complex values) runs the same plan in
reverse, as PETSc's ``MatMultTranspose`` does: each rank computes the off-diagonal
block's contributions to its ghost columns and sends each owner its slice of them (what
it receives in the forward product), and adds what it receives at the ``send_idx``
positions (what it sends in the forward product).  Several neighbours may contribute
to one owned entry, so the received values are first summed per distinct index
(``reverse_targets``, ``accumulate``), in a fixed order.
"""

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..errors import InvalidInputError

__all__ = ["partition_rows", "even_offsets", "split_block", "ghost_owners",
           "CommPlan", "make_plan", "simulate", "owner_of", "reverse_targets",
           "accumulate", "simulate_product", "simulate_rproduct"]


def even_offsets(n, nparts):
    """PETSc's PETSC_DECIDE split of ``n`` items over ``nparts``: the first ``n %
    nparts`` parts get one more.  Returns ``nparts + 1`` offsets."""
    n, nparts = int(n), int(nparts)
    if nparts < 1:
        raise InvalidInputError(f"need at least one part, not {nparts}")
    sizes = np.full(nparts, n // nparts, dtype=np.int64)
    sizes[: n % nparts] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def partition_rows(indptr, nparts, by="nnz"):
    """Contiguous row blocks for ``nparts`` ranks as ``nparts + 1`` offsets.

    ``by="rows"``: equal row counts (``even_offsets``).  ``by="nnz"``: balanced by
    non-zeros, each row weighted by its non-zeros plus one (a row also costs its
    pointer and its entry of ``y``, and empty rows are then spread too rather than
    all falling to one rank).  Boundary ``k`` is the row where the cumulative weight is
    nearest to ``k/nparts`` of the total.  A row is never split, so a row holding most
    of the non-zeros leaves the ranks unbalanced (graph partitioning would not help
    there either).  ``indptr`` is the CSR row pointer of the whole matrix.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    m = len(indptr) - 1
    nparts = int(nparts)
    if nparts < 1:
        raise InvalidInputError(f"need at least one part, not {nparts}")
    if by == "rows":
        return even_offsets(m, nparts)
    if by == "metis":   # (it permutes rows and columns: the operator's own step)
        raise InvalidInputError("partition='metis' permutes the matrix: SpMV.from_global "
                                "takes it; here only 'nnz' or 'rows'")
    if by != "nnz":
        raise InvalidInputError(f"partition must be 'nnz', 'rows' or 'metis' (or offsets), "
                                f"not {by!r}")
    if m == 0:
        return np.zeros(nparts + 1, dtype=np.int64)
    cumulative = indptr - indptr[0] + np.arange(m + 1, dtype=np.int64)   # nnz + rows
    total = cumulative[-1]
    targets = np.arange(1, nparts, dtype=np.float64) * (total / nparts)
    right = np.searchsorted(cumulative, targets, side="left")            # first >= target
    left = np.maximum(right - 1, 0)
    nearer_left = (targets - cumulative[left]) <= (cumulative[np.minimum(right, m)] - targets)
    inner = np.where(nearer_left, left, right)
    inner = np.maximum.accumulate(np.clip(inner, 0, m))
    return np.concatenate([[0], inner, [m]]).astype(np.int64)


def check_offsets(offsets, n, what="row"):
    """Offsets that tile ``0..n`` contiguously in rank order, as int64."""
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or len(offsets) < 2 or offsets.dtype.kind not in "iu":
        raise InvalidInputError(f"{what} offsets must be a 1-D integer array of ranks + 1 "
                                f"entries, not {offsets!r}")
    offsets = offsets.astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise InvalidInputError(f"{what} offsets {offsets.tolist()} must rise from 0 to {n}")
    return offsets


def owner_of(ids, offsets):
    """The rank owning each global index (empty ranks own nothing)."""
    return np.searchsorted(offsets, np.asarray(ids, dtype=np.int64), side="right") - 1


def split_block(csr, col_start, col_end):
    """Split a rank's row block (a CSR with global column indices) into the diagonal
    block (columns ``col_start:col_end``, local indices) and the off-diagonal block
    (columns compacted to the ghost list).  Returns ``(diag, offdiag, garray)``; the
    entries keep their order within each row (duplicates stay apart)."""
    csr = sp.csr_matrix(csr)
    m, n_cols = csr.shape
    indices = csr.indices
    own = (indices >= col_start) & (indices < col_end)
    if own.all():
        # Every column owned (one rank, or a block diagonal): the block itself, its
        # column indices shifted, no pass beyond the check.
        index_dtype = np.int32 if max(m, col_end - col_start, csr.nnz) < 2**31 else np.int64
        shifted = indices - index_dtype(col_start) if col_start else indices
        diag = sp.csr_matrix((csr.data, shifted.astype(index_dtype, copy=False),
                              csr.indptr.astype(index_dtype, copy=False)),
                             shape=(m, col_end - col_start), copy=False)
        empty = sp.csr_matrix((m, 0), dtype=csr.dtype)
        return diag, empty, np.zeros(0, dtype=np.int64)
    other = ~own
    # Row pointers of both blocks from one running count of the ghost entries (no
    # per-entry row ids): off_ptr[i] = ghost entries before row i.
    running = np.zeros(csr.nnz + 1, dtype=np.int64)
    np.cumsum(other, out=running[1:])
    off_ptr = running[csr.indptr]
    del running
    diag_ptr = csr.indptr.astype(np.int64) - off_ptr
    ghost_cols = indices[other]
    if n_cols <= 8 * ghost_cols.size + (1 << 20):
        # A mark and a lookup table over all columns: two linear passes, where a sort
        # (np.unique) and a binary search per entry take tens of seconds at 10^8 entries.
        seen = np.zeros(n_cols, dtype=bool)
        seen[ghost_cols] = True
        garray = np.flatnonzero(seen)
        del seen
        lookup = np.empty(n_cols, dtype=np.int64)
        lookup[garray] = np.arange(garray.size)
        compact = lookup[ghost_cols]
        del lookup
    else:   # few ghosts among very many columns
        garray = np.unique(ghost_cols)
        compact = np.searchsorted(garray, ghost_cols)
    index_dtype = np.int32 if max(m, col_end - col_start, len(garray), csr.nnz) < 2**31 \
        else np.int64
    diag = sp.csr_matrix((csr.data[own], (indices[own] - col_start).astype(index_dtype),
                          diag_ptr.astype(index_dtype)), shape=(m, col_end - col_start))
    del own
    offdiag = sp.csr_matrix((csr.data[other], compact.astype(index_dtype),
                             off_ptr.astype(index_dtype)), shape=(m, len(garray)))
    return diag, offdiag, garray


def ghost_owners(garray, col_offsets):
    """How many of the sorted ghosts ``garray`` each rank owns (an array of ranks'
    length): the counts a rank sends in the plan's all-to-all."""
    owners = owner_of(garray, col_offsets)
    return np.bincount(owners, minlength=len(col_offsets) - 1).astype(np.int64)


@dataclass
class CommPlan:
    """One rank's halo exchange.

    Receives: from ``recv_ranks[i]`` the ghosts ``garray[recv_ptr[i]:recv_ptr[i+1]]``,
    straight into that slice of the ghost vector.  Sends: to ``send_ranks[i]`` the
    values ``x_local[send_idx[send_ptr[i]:send_ptr[i+1]]]`` (local indices), packed in
    that order into one buffer.
    """

    rank: int
    size: int
    garray: np.ndarray
    recv_ranks: np.ndarray
    recv_ptr: np.ndarray
    send_ranks: np.ndarray
    send_ptr: np.ndarray
    send_idx: np.ndarray
    extra: dict = field(default_factory=dict)

    @property
    def n_ghosts(self):
        return len(self.garray)

    @property
    def n_send(self):
        return len(self.send_idx)

    @property
    def neighbours(self):
        """Every rank this one exchanges with (either way), sorted."""
        return sorted(set(self.recv_ranks.tolist()) | set(self.send_ranks.tolist()))

    def sizes(self):
        """Values per neighbour: ``{"recv": {rank: count}, "send": {rank: count}}``."""
        return {"recv": {int(r): int(n) for r, n in zip(self.recv_ranks,
                                                        np.diff(self.recv_ptr))},
                "send": {int(r): int(n) for r, n in zip(self.send_ranks,
                                                        np.diff(self.send_ptr))}}

    def __repr__(self):
        s = self.sizes()
        return (f"CommPlan(rank {self.rank}/{self.size}: {self.n_ghosts} ghosts from "
                f"{s['recv']}, {self.n_send} values to {s['send']})")


def make_plan(rank, size, garray, col_offsets, requested):
    """The plan of ``rank`` once the all-to-all is done: ``requested[q]`` is the array
    of global column ids rank ``q`` asked this rank for (sorted, all owned here)."""
    col_offsets = np.asarray(col_offsets, dtype=np.int64)
    counts = ghost_owners(garray, col_offsets)
    recv_ranks = np.flatnonzero(counts)
    recv_ptr = np.concatenate([[0], np.cumsum(counts[recv_ranks])]).astype(np.int64)
    send_counts = np.array([len(requested[q]) for q in range(size)], dtype=np.int64)
    send_ranks = np.flatnonzero(send_counts)
    send_ptr = np.concatenate([[0], np.cumsum(send_counts[send_ranks])]).astype(np.int64)
    wanted = (np.concatenate([np.asarray(requested[q], dtype=np.int64) for q in send_ranks])
              if len(send_ranks) else np.zeros(0, dtype=np.int64))
    start, end = col_offsets[rank], col_offsets[rank + 1]
    if wanted.size and (wanted.min() < start or wanted.max() >= end):
        raise InvalidInputError(f"rank {rank} was asked for columns it does not own")
    return CommPlan(rank=int(rank), size=int(size), garray=np.asarray(garray, np.int64),
                    recv_ranks=recv_ranks.astype(np.int64), recv_ptr=recv_ptr,
                    send_ranks=send_ranks.astype(np.int64), send_ptr=send_ptr,
                    send_idx=wanted - start)


def requests_to(garray, col_offsets):
    """Split the sorted ghosts by owner: ``(counts, ids)`` to send in the all-to-all
    (``ids`` is ``garray`` itself, already grouped by owner)."""
    return ghost_owners(garray, col_offsets), np.asarray(garray, dtype=np.int64)


def reverse_targets(send_idx):
    """Where the transposed product's received contributions go: ``(targets,
    inverse)``, the distinct local indices of ``send_idx`` (sorted) and, for each
    packed position, the position of its index in ``targets``.  An index asked for by
    several neighbours appears once in ``targets`` (its contributions are summed by
    ``accumulate`` before the one add into the result)."""
    targets, inverse = np.unique(np.asarray(send_idx, dtype=np.int64), return_inverse=True)
    return targets, np.asarray(inverse, dtype=np.int64).reshape(-1)


def accumulate(received, inverse, n_targets, out=None):
    """The received contributions (packed in ``send_idx`` order, neighbours in
    ascending rank order) summed per target: ``out[inverse[k]] += received[k]`` in
    that order (deterministic, duplicates included)."""
    received = np.asarray(received)
    if out is None:
        out = np.zeros(n_targets, dtype=received.dtype)
    else:
        out[...] = 0
    np.add.at(out, inverse, received)
    return out


def simulate(A, row_offsets, col_offsets=None):
    """Every rank's blocks and plan for the global matrix ``A``, in one process (the
    all-to-all done by hand): a list of ``(diag, offdiag, plan)`` per rank.  For tests
    and for reasoning about a partition without MPI."""
    csr = sp.csr_matrix(A)
    m, n = csr.shape
    row_offsets = check_offsets(row_offsets, m, "row")
    size = len(row_offsets) - 1
    col_offsets = (row_offsets if col_offsets is None and m == n
                   else even_offsets(n, size) if col_offsets is None
                   else check_offsets(col_offsets, n, "column"))
    blocks = []
    for p in range(size):
        local = csr[row_offsets[p]:row_offsets[p + 1]]
        blocks.append(split_block(local, col_offsets[p], col_offsets[p + 1]))
    # The all-to-all: requested[p][q] = the ids rank q asks rank p for.
    requested = [[None] * size for _ in range(size)]
    for q, (_, _, garray) in enumerate(blocks):
        counts, ids = requests_to(garray, col_offsets)
        ptr = np.concatenate([[0], np.cumsum(counts)])
        for p in range(size):
            requested[p][q] = ids[ptr[p]:ptr[p + 1]]
    return [(d, o, make_plan(p, size, g, col_offsets, requested[p]))
            for p, (d, o, g) in enumerate(blocks)]


def simulate_product(parts, x, row_offsets, col_offsets):
    """``A @ x`` from the simulated parts with numpy/scipy (the exchange as the
    operator runs it: pack, deliver each message into the receiver's ghost slice)."""
    size = len(parts)
    xs = [x[col_offsets[p]:col_offsets[p + 1]] for p in range(size)]
    sent = {}
    for p, (_, _, plan) in enumerate(parts):
        packed = xs[p][plan.send_idx]
        for i, q in enumerate(plan.send_ranks):
            sent[(p, int(q))] = packed[plan.send_ptr[i]:plan.send_ptr[i + 1]]
    ys = []
    for p, (diag, offdiag, plan) in enumerate(parts):
        ghosts = np.empty(plan.n_ghosts, dtype=x.dtype)
        for i, q in enumerate(plan.recv_ranks):
            ghosts[plan.recv_ptr[i]:plan.recv_ptr[i + 1]] = sent[(int(q), p)]
        ys.append(diag @ xs[p] + offdiag @ ghosts)
    return np.concatenate(ys) if ys else np.zeros(0)


def simulate_rproduct(parts, y, row_offsets, col_offsets):
    """``A^H @ y`` (``A^T @ y`` for real values) from the simulated parts, the exchange
    run in reverse as the operator's ``rmatvec`` runs it: each rank sends the
    off-diagonal block's contributions for its ghosts to their owners, each owner adds
    what it receives at its ``send_idx`` positions."""
    size = len(parts)
    ys = [y[row_offsets[p]:row_offsets[p + 1]] for p in range(size)]
    sent = {}
    for p, (_, offdiag, plan) in enumerate(parts):
        contributions = offdiag.conj().T @ ys[p]
        for i, q in enumerate(plan.recv_ranks):
            sent[(p, int(q))] = contributions[plan.recv_ptr[i]:plan.recv_ptr[i + 1]]
    xs = []
    for p, (diag, _, plan) in enumerate(parts):
        x = diag.conj().T @ ys[p]
        if plan.n_send:
            received = np.concatenate([sent[(int(q), p)] for q in plan.send_ranks])
            targets, inverse = reverse_targets(plan.send_idx)
            x[targets] += accumulate(received, inverse, len(targets))
        xs.append(x)
    return np.concatenate(xs) if xs else np.zeros(0)
