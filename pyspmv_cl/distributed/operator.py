"""The distributed operator: one rank per device, PETSc's MATMPIAIJ layout (see
``plan.py``), each local block an ordinary :class:`pyspmv_cl.SpMV`.

mpi4py is imported when an operator is made, not with the package, so the partition
functions (and the rest of pyspmv_cl) work without MPI.
"""

import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import scipy.sparse as sp

from ..adjoint import TransposedView as LocalTransposedView
from ..device import devices, get_device
from ..errors import InvalidInputError, InvalidTypeError, PySpMVError, UnsupportedDtypeError
from ..inputs import as_host_csr, check_real_scalar, check_scalar_range
from ..launching import record_launches
from ..matrix import SpMV as LocalSpMV
from .compressed import CompressedRows
from .exchange_kernels import ExchangeKernels
from .partition import metis_partition, permute_symmetric
from .plan import (
    CommPlan,
    accumulate,
    check_offsets,
    even_offsets,
    make_plan,
    partition_rows,
    requests_to,
    reverse_targets,
    split_block,
)

_TAG = 7519
_RTAG = 7520     # the transposed product's messages (the exchange in reverse)
_FTAG, _RFTAG = 7521, 7522   # the refusal flags of each (see SpMV._refusable)


def mpi():
    """mpi4py's ``MPI`` module, or an ImportError that says how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:   # pragma: no cover - depends on the environment
        raise ImportError("pyspmv_cl.distributed needs mpi4py and an MPI library: "
                          "pip install 'pyspmv-cl[mpi]' (mpi4py and MPICH wheels)") from exc
    return MPI


class DistributedInputError(InvalidInputError):
    """Inconsistent input across ranks (raised on every rank, with the same message)."""


def _agree(comm, error):
    """Collective: every rank learns whether any rank failed (``error`` is this rank's
    message or None) and raises the same error, naming the ranks."""
    errors = comm.allgather(error)
    bad = [(r, e) for r, e in enumerate(errors) if e is not None]
    if bad:
        text = "; ".join(f"rank {r}: {e}" for r, e in bad)
        raise DistributedInputError(f"distributed SpMV refused ({len(bad)} of {comm.size} "
                                    f"ranks): {text}")


def _check_root(root, size):
    """``root`` a rank of the communicator (the same check on every rank: no rank
    is left in a collective the others refused)."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
            or not 0 <= int(root) < size:
        raise InvalidInputError(f"root must be a rank, 0..{size - 1}, not {root!r}")


def node_position(comm):
    """This rank's position among the ranks of its node (collective over ``comm``)."""
    MPI = mpi()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        return local.rank
    finally:
        local.Free()


def node_local_device(position, kind=None):
    """The device of the rank at ``position`` on its node (``node_position``): that
    position modulo the node's devices of ``kind`` ("gpu", "cpu", "accelerator";
    default: GPUs when the node has any, else CPUs).  The same rule serves N GPUs in
    one host and N hosts."""
    found = devices()
    if kind is None:
        kind = "gpu" if any(d.profile.device_type == "gpu" for d in found) else "cpu"
    candidates = [d for d in found if d.profile.device_type == kind]
    if not candidates:
        raise InvalidInputError(f"node-local device choice: no {kind} device on this node "
                                f"({len(found)} OpenCL devices found)")
    return candidates[position % len(candidates)]


def _resolve_device(device, position):
    """The rank's device.  On a queue with profiling (``Device.profiling_device``) unless
    the caller gave a queue of their own (a CommandQueue, or a Device made from one):
    the timings' ``local`` is the diagonal block's kernel time from their events."""
    if isinstance(device, str) and device.startswith("node-local"):
        kind = device.partition(":")[2] or None
        found = node_local_device(position, kind)
    else:
        found = get_device(device)
    return found if found.callers_queue else found.profiling_device()


def _kernel_seconds(queue, events):
    """Device seconds from the first event's start to the last's end (0 without
    events; NaN on a caller's queue without profiling)."""
    if not events:
        return 0.0
    if not queue.properties & cl.command_queue_properties.PROFILING_ENABLE:
        return float("nan")
    return (events[-1].profile.end - events[0].profile.start) * 1e-9


def _hidden(local, before, both):
    """How much of the kernels' ``local`` seconds ran while the host spent ``before``
    (pack and exchange), given that both were done ``both`` seconds in (NaN with
    ``local``)."""
    return local if local != local else max(0.0, local + before - both)


class SpMV:
    """A matrix distributed by contiguous row blocks over the ranks of ``comm``.

    Collective: every rank calls it with its own row block ``A_local`` (any scipy
    sparse matrix or ``(data, indices, indptr)`` triple of shape ``(rows, n)`` with
    *global* column indices, as PETSc's ``MatCreateMPIAIJWithArrays`` takes it),
    ``row_start`` (the global index of its first row) and the global ``shape``.

    ``col_range``: the entries of ``x`` this rank owns, ``(start, end)``; default: the
    row range for a square matrix, PETSc's even split for a rectangular one.  ``x_local``
    and ``y_local`` are the owned parts of ``x`` and ``y``.

    The row block is split into a diagonal block (owned columns) and an off-diagonal
    block (ghost columns, compacted), each an ordinary :class:`pyspmv_cl.SpMV` with
    ``format``/``offdiag_format`` and ``**params`` (tuned on its own with ``"auto"``).
    ``device``: ``"node-local"`` (the rank's position on its node modulo the node's
    GPUs, else CPUs; ``"node-local:cpu"`` picks the kind) or anything
    :func:`pyspmv_cl.get_device` takes.

    ``op @ x_local`` (``matvec``) is the product; ``op.rmatvec(y_local)`` and ``op.T @
    y_local`` the transposed one (A^H for complex values, ``op.H``), the exchange run in
    reverse.

    Inconsistent shapes, row or column ranges, or a rank whose input is refused give
    the same :class:`DistributedInputError` on every rank (one ``allgather`` before
    any other collective: no rank is left waiting).

    Numbering: the operator works in its own global numbering, in which each rank's
    rows are contiguous.  Built by this constructor or by :meth:`from_global` with a
    contiguous partition, that is the matrix's numbering (``op.permutation`` is None).
    With ``from_global(partition="metis")`` rows *and* columns are permuted: rank ``p``
    owns the *scattered* original indices ``op.local_indices()``
    (``op.permutation[op.row_range[0]:op.row_range[1]]``), so
    ``x_local = x[op.local_indices()]`` and ``y[op.local_indices()] = y_local``;
    :meth:`scatter` and :meth:`gather` do that for a vector held on one rank.
    ``op.partition`` names how the rows were split.
    """

    def __init__(self, A_local, comm=None, *, row_start, shape, col_range=None,
                 format="auto", offdiag_format="auto", device="node-local", dtype=None,
                 **params):
        MPI = mpi()
        comm = MPI.COMM_WORLD if comm is None else comm
        rank, size = comm.rank, comm.size
        # 1. Local checks, then one allgather of everything the ranks must agree on.
        info, error, csr = None, None, None
        try:
            shape = tuple(int(s) for s in shape)
            if len(shape) != 2 or min(shape) < 0:
                raise InvalidInputError(f"shape must be two non-negative integers, not {shape}")
            if isinstance(A_local, tuple) and len(A_local) != 3:
                raise InvalidTypeError(
                    f"A_local as a tuple must be (data, indices, indptr) of this rank's "
                    f"rows, not {len(A_local)} items")
            csr = as_host_csr(A_local) if not isinstance(A_local, tuple) else \
                as_host_csr(A_local, (len(A_local[2]) - 1, shape[1]))
            if csr.shape[1] != shape[1]:
                raise InvalidInputError(f"the local block has {csr.shape[1]} columns, the "
                                        f"global shape {shape} has {shape[1]} (give global "
                                        "column indices)")
            cols = None if col_range is None else tuple(int(c) for c in col_range)
            info = (shape, int(row_start), csr.shape[0], cols,
                    None if dtype is None else np.dtype(dtype).name, csr.dtype.name)
        except Exception as exc:   # any: the other ranks must learn of it, not wait
            error = f"{type(exc).__name__}: {exc}"
        gathered = comm.allgather((info, error))
        _agree_gathered(gathered)
        shapes = {g[0][0] for g in gathered}
        if len(shapes) > 1:
            raise DistributedInputError(f"the ranks give different global shapes: "
                                        f"{[g[0][0] for g in gathered]}")
        starts = np.array([g[0][1] for g in gathered], dtype=np.int64)
        counts = np.array([g[0][2] for g in gathered], dtype=np.int64)
        row_offsets = np.concatenate([starts, [starts[-1] + counts[-1]]])
        if (starts[0] != 0 or np.any(starts[1:] != starts[:-1] + counts[:-1])
                or row_offsets[-1] != shape[0]):
            raise DistributedInputError(
                f"row ranges must tile 0..{shape[0]} in rank order; the ranks give "
                + ", ".join(f"rank {r}: rows {s}:{s + c}" for r, (s, c)
                            in enumerate(zip(starts.tolist(), counts.tolist()))))
        col_given = [g[0][3] for g in gathered]
        if all(c is None for c in col_given):
            col_offsets = row_offsets.copy() if shape[0] == shape[1] else \
                even_offsets(shape[1], size)
        elif any(c is None for c in col_given):
            raise DistributedInputError("col_range given on some ranks only: "
                                        f"{col_given}")
        else:
            col_offsets = np.array([c[0] for c in col_given] + [col_given[-1][1]])
            if any(col_given[r][1] != col_offsets[r + 1] for r in range(size)):
                raise DistributedInputError(f"column ranges must be contiguous: {col_given}")
            try:
                col_offsets = check_offsets(col_offsets, shape[1], "column")
            except InvalidInputError as exc:
                raise DistributedInputError(f"column ranges {col_given}: {exc}") from None
        requested_dtypes = {g[0][4] for g in gathered}
        if len(requested_dtypes) > 1:
            raise DistributedInputError(f"the ranks ask for different dtypes: "
                                        f"{[g[0][4] for g in gathered]}")
        if dtype is None:
            common = np.result_type(*[np.dtype(g[0][5]) for g in gathered])
            if common.kind == "c":   # (float64 would drop the imaginary parts)
                raise DistributedInputError(
                    f"the matrix is complex ({common}); the distributed operator takes "
                    "float32 and float64 only for now")
            dtype = common if common in (np.float32, np.float64) else np.float64
        # The same on every rank (checked above): refused on all of them alike.
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise DistributedInputError(
                f"dtype={np.dtype(dtype)}: the distributed operator takes float32 and "
                "float64 only for now")
        self.dtype = np.dtype(dtype)

        # 2. The plan: split the block, one all-to-all of counts and one of ids.
        self.comm = comm.Dup()   # our messages never meet the caller's
        # Always collective (whatever each rank's device argument says).
        self.node_position = node_position(self.comm)
        self.rank, self.size = rank, size
        self.shape = shape
        self.row_offsets, self.col_offsets = row_offsets, col_offsets
        self.row_range = (int(row_offsets[rank]), int(row_offsets[rank + 1]))
        self.col_range = (int(col_offsets[rank]), int(col_offsets[rank + 1]))
        t0 = time.perf_counter()
        diag, offdiag, garray = split_block(csr, *self.col_range)
        ask_counts, ask_ids = requests_to(garray, col_offsets)
        asked_counts = np.empty(size, dtype=np.int64)
        self.comm.Alltoall(ask_counts, asked_counts)
        asked = np.empty(int(asked_counts.sum()), dtype=np.int64)
        displs = lambda c: np.concatenate([[0], np.cumsum(c)[:-1]])  # noqa: E731
        self.comm.Alltoallv([ask_ids, ask_counts, displs(ask_counts), MPI.INT64_T],
                            [asked, asked_counts, displs(asked_counts), MPI.INT64_T])
        ptr = np.concatenate([[0], np.cumsum(asked_counts)])
        self.comm_plan = make_plan(rank, size, garray, col_offsets,
                                   [asked[ptr[q]:ptr[q + 1]] for q in range(size)])
        self.plan_time = time.perf_counter() - t0

        # 3. The local operators, on this rank's device; every rank learns of a failure.
        error = None
        try:
            self.device = _resolve_device(device, self.node_position)
            self.diag = LocalSpMV(diag, format=format, dtype=self.dtype, device=self.device,
                                  **params)
            self.offdiag = None
            if offdiag.nnz:
                def local(block):
                    return LocalSpMV(block, format=offdiag_format, dtype=self.dtype,
                                     device=self.device, **params)
                self.offdiag = CompressedRows.or_plain(offdiag, local, self.device.queue,
                                                       self.dtype)
        except Exception as exc:   # any: the other ranks must learn of it, not wait
            error = f"{type(exc).__name__}: {exc}"
        _agree(self.comm, error)
        self.queue = self.device.queue
        self.local_nnz = (int(diag.nnz), int(offdiag.nnz))
        self._diagonal = _local_diagonal(diag, self.row_range, self.col_range)
        self._buffers()
        self.timings = []          # one dict per product (see matvec)
        self.rtimings = []         # one dict per transposed product (see rmatvec)
        self.keep_timings = 1000   # the most recent products kept
        # How the rows were split, and the global permutation (perm[new] = old, the
        # same array on every rank) when they were permuted; from_global sets both.
        self.partition = "given"
        self.permutation = None
        self._transposed_view = None
        self._adjoint_view = None
        self._freed = False

    # -- descriptive -------------------------------------------------------------------
    @property
    def ghosts(self):
        """Global column ids whose ``x`` values come from other ranks (sorted)."""
        return self.comm_plan.garray

    @property
    def local_shape(self):
        return (self.row_range[1] - self.row_range[0], self.col_range[1] - self.col_range[0])

    @property
    def nbytes(self):
        """This rank's device bytes: both blocks, the send gather list and the work
        vectors (host staging buffers are not counted)."""
        total = self.diag.nbytes + (self.offdiag.nbytes if self.offdiag is not None else 0)
        return total + sum(a.nbytes for a in self._device_work)

    @property
    def format(self):
        return (self.diag.format, self.offdiag.format if self.offdiag is not None else None)

    def local_indices(self, which="rows"):
        """The original global indices of this rank's owned rows (``which="rows"``:
        the entries of ``y``) or entries of ``x`` (``which="cols"``), in the order of
        the local vectors: ``x_local = x[op.local_indices("cols")]``,
        ``y[op.local_indices()] = y_local``.  A contiguous range unless the rows were
        permuted (``partition="metis"``); a square matrix's two are the same."""
        if which not in ("rows", "cols"):
            raise InvalidInputError(f"which must be 'rows' or 'cols', not {which!r}")
        a, b = self.row_range if which == "rows" else self.col_range
        if self.permutation is None:
            return np.arange(a, b, dtype=np.int64)
        return self.permutation[a:b].copy()

    def scatter(self, v, root=0, which="cols"):
        """Collective: the global vector ``v`` held on ``root`` (original numbering;
        other ranks pass None), split into each rank's local part
        (``v[op.local_indices(which)]``); ``which="cols"`` for an ``x``, ``"rows"``
        for a ``y``."""
        if which not in ("rows", "cols"):
            raise InvalidInputError(f"which must be 'rows' or 'cols', not {which!r}")
        self._check_live()
        _check_root(root, self.size)
        offsets = self.row_offsets if which == "rows" else self.col_offsets
        size = self.shape[0] if which == "rows" else self.shape[1]
        pieces, error = None, None
        if self.rank == root:
            try:
                v = np.asarray(v)
                if v.shape != (size,):
                    raise InvalidInputError(f"scatter: v has shape {v.shape}, not "
                                            f"({size},)")
                if self.permutation is not None:
                    v = v[self.permutation]
                pieces = [np.ascontiguousarray(v[offsets[p]:offsets[p + 1]])
                          for p in range(self.size)]
            except (PySpMVError, TypeError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
        error = self.comm.bcast(error, root=root)
        if error is not None:
            raise DistributedInputError(f"scatter refused on root {root}: {error}")
        return self.comm.scatter(pieces, root=root)

    def gather(self, v_local, root=0, which="rows"):
        """Collective: every rank's local part (numpy or pyopencl) put together on
        ``root`` as one global vector in the original numbering (None on the other
        ranks); ``which="rows"`` for a ``y``, ``"cols"`` for an ``x``."""
        if which not in ("rows", "cols"):
            raise InvalidInputError(f"which must be 'rows' or 'cols', not {which!r}")
        self._check_live()
        _check_root(root, self.size)
        if isinstance(v_local, cla.Array):
            v_local = v_local.get()
        v_local = np.asarray(v_local).reshape(-1)
        offsets = self.row_offsets if which == "rows" else self.col_offsets
        expected = int(offsets[self.rank + 1] - offsets[self.rank])
        _agree(self.comm, None if len(v_local) == expected else
               f"gather: {len(v_local)} values, this rank owns {expected} ({which})")
        pieces = self.comm.gather(v_local, root=root)
        if self.rank != root:
            return None
        joined = np.concatenate(pieces) if pieces else np.zeros(0)
        if self.permutation is None:
            return joined
        out = np.empty_like(joined)
        out[self.permutation] = joined
        return out

    def diagonal(self):
        """The owned rows' diagonal entries (duplicates summed), on the host."""
        return self._diagonal.copy()

    def describe(self):
        """Collective: the partition's balance as a table (rows, non-zeros, ghosts,
        values sent, neighbours, device bytes per rank), the same string on every rank."""
        self._check_live()
        mine = (self.rank, self.row_range, self.local_nnz, self.comm_plan.n_ghosts,
                self.comm_plan.n_send, len(self.comm_plan.neighbours), self.nbytes,
                self.format, self.device.cl_device.name.strip())
        rows = self.comm.allgather(mine)
        how = ("row blocks given by the ranks" if self.partition == "given" else
               f"partition {self.partition}")
        if self.permutation is not None:
            how += (" (rows and columns permuted: each rank owns scattered original "
                    "indices, op.local_indices())")
        lines = [f"distributed SpMV {self.shape[0]}x{self.shape[1]}, {self.dtype}, "
                 f"{self.size} ranks, {how}",
                 f"{'rank':>4} {'rows':>17} {'nnz diag':>10} {'nnz off':>9} {'ghosts':>7} "
                 f"{'sent':>7} {'nbrs':>4} {'bytes':>10}  formats / device"]
        for r, (a, b), (nd, no), g, s, nb, by, fmt, dev in rows:
            lines.append(f"{r:>4} {f'{a}:{b}':>17} {nd:>10} {no:>9} {g:>7} {s:>7} {nb:>4} "
                         f"{by:>10}  {fmt[0]}/{fmt[1] or '-'} on {dev}")
        nnz = np.array([nd + no for _, _, (nd, no), *_ in rows], dtype=float)
        nrows = np.array([b - a for _, (a, b), *_ in rows], dtype=float)
        ghosts = np.array([g for *_, g, _, _, _, _, _ in rows], dtype=float)

        def imbalance(v):
            return f"{v.max() / v.mean():.2f}" if v.mean() > 0 else "-"
        lines.append(f"balance (max/mean): rows {imbalance(nrows)}, non-zeros "
                     f"{imbalance(nnz)}, ghosts {imbalance(ghosts)}")
        return "\n".join(lines)

    def __repr__(self):
        permuted = ", permuted" if self.permutation is not None else ""
        return (f"<distributed SpMV rank {self.rank}/{self.size} rows {self.row_range} of "
                f"{self.shape}{permuted}, formats {self.format}, "
                f"{self.comm_plan.n_ghosts} ghosts>")

    # -- products ----------------------------------------------------------------------
    def _buffers(self):
        plan, dtype, queue = self.comm_plan, self.dtype, self.queue
        m, n = self.local_shape
        self._send = _pinned(queue, plan.n_send, dtype)
        self._ghost = _pinned(queue, plan.n_ghosts, dtype)
        self._y_host = np.empty(m, dtype=dtype)
        self._x_dev = cla.empty(queue, n, dtype)
        self._y_dev = cla.empty(queue, m, dtype)
        self._ghost_dev = cla.empty(queue, plan.n_ghosts, dtype)
        # Values to send in a few contiguous runs of x are copied straight from it;
        # only scattered ones need the gather's index and staging arrays.
        self._send_runs = contiguous_runs(plan.send_idx, _MAX_COPY_RUNS)
        gather = plan.n_send and self._send_runs is None
        self._send_idx_dev = (cla.to_device(queue, plan.send_idx.astype(np.int64))
                              if gather else None)
        self._send_dev = cla.empty(queue, plan.n_send, dtype) if gather else None
        self._device_work = [a for a in (self._x_dev, self._y_dev, self._ghost_dev,
                                         self._send_idx_dev, self._send_dev)
                             if a is not None]
        # Persistent point-to-point requests on fixed buffers (see README: why not
        # neighbour collectives).
        requests = []
        for i, q in enumerate(plan.recv_ranks):
            requests.append(self.comm.Recv_init(
                self._ghost[plan.recv_ptr[i]:plan.recv_ptr[i + 1]], int(q), _TAG))
        for i, q in enumerate(plan.send_ranks):
            requests.append(self.comm.Send_init(
                self._send[plan.send_ptr[i]:plan.send_ptr[i + 1]], int(q), _TAG))
        # One flag per message each way: a rank refusing its input still exchanges
        # (see _refusable), and its neighbours learn of it instead of waiting.
        self._flag_in = np.zeros(len(plan.recv_ranks), dtype=np.int32)
        self._flag_out = np.zeros(len(plan.send_ranks), dtype=np.int32)
        for i, q in enumerate(plan.recv_ranks):
            requests.append(self.comm.Recv_init(self._flag_in[i:i + 1], int(q), _FTAG))
        for i, q in enumerate(plan.send_ranks):
            requests.append(self.comm.Send_init(self._flag_out[i:i + 1], int(q), _FTAG))
        self._requests = requests
        self._ghost_upload = None
        self._offdiag_done = None
        # A second in-order queue for the exchange's copies (see _product).
        self._xqueue = cl.CommandQueue(self.queue.context, self.device.cl_device)
        self._kernels = ExchangeKernels(self.queue.context, dtype)
        self._rrequests = None     # the transposed product's, made by its first call

    def _copy_runs(self, x, ready):
        """Enqueue the copies of ``_send_runs`` from ``x`` into ``_send`` on the exchange
        queue after the event ``ready``; the last copy's event (the queue is in order)."""
        item = self.dtype.itemsize
        event = None
        for src, dst, length in self._send_runs:
            event = cl.enqueue_copy(self._xqueue, self._send[dst:dst + length], x.base_data,
                                    src_offset=x.offset + src * item, is_blocking=False,
                                    wait_for=[ready])
        return event

    def _rbuffers(self):
        """The transposed product's buffers and persistent requests (on its first call:
        an operator only multiplied forwards holds none of them).  The messages run
        the forward plan in reverse: the ghosts' contributions go to their owners
        (``recv_ranks``/``recv_ptr``), the owned entries' come from ``send_ranks``
        (``send_ptr``, added at ``send_idx``)."""
        plan, dtype, queue = self.comm_plan, self.dtype, self.queue
        self._rsend = _pinned(queue, plan.n_ghosts, dtype)
        self._rrecv = np.empty(plan.n_send, dtype=dtype)
        targets, self._rinverse = reverse_targets(plan.send_idx)
        self._racc = np.zeros(len(targets), dtype=dtype)
        self._rghost_dev = cla.empty(queue, plan.n_ghosts, dtype)
        self._rtargets_dev = cla.to_device(queue, targets) if len(targets) else None
        self._racc_dev = cla.empty(queue, len(targets), dtype)
        self._rtargets = targets
        self._racc_upload = None
        self._x_host = np.empty(self.local_shape[1], dtype=dtype)
        self._device_work += [a for a in (self._rghost_dev, self._rtargets_dev,
                                          self._racc_dev) if a is not None]
        requests = []
        for i, q in enumerate(plan.send_ranks):
            requests.append(self.comm.Recv_init(
                self._rrecv[plan.send_ptr[i]:plan.send_ptr[i + 1]], int(q), _RTAG))
        for i, q in enumerate(plan.recv_ranks):
            requests.append(self.comm.Send_init(
                self._rsend[plan.recv_ptr[i]:plan.recv_ptr[i + 1]], int(q), _RTAG))
        self._rflag_in = np.zeros(len(plan.send_ranks), dtype=np.int32)
        self._rflag_out = np.zeros(len(plan.recv_ranks), dtype=np.int32)
        for i, q in enumerate(plan.send_ranks):
            requests.append(self.comm.Recv_init(self._rflag_in[i:i + 1], int(q), _RFTAG))
        for i, q in enumerate(plan.recv_ranks):
            requests.append(self.comm.Send_init(self._rflag_out[i:i + 1], int(q), _RFTAG))
        self._rrequests = requests

    def _host_operand(self, v, out, name, size, result_size, where):
        """Check a numpy operand (``size`` owned entries, ``where`` says which) and its
        ``out``; returns the operand as an array and the result's shape."""
        if v is None or sp.issparse(v):   # (numpy would make an object array of it)
            raise InvalidTypeError(f"{name}_local must be a dense vector (numpy or a "
                                   f"pyopencl array), not {type(v).__name__}")
        v = np.asarray(v)
        _check_real_operand(v.dtype, name)
        if v.shape not in ((size,), (size, 1)):
            raise InvalidInputError(f"{name}_local has shape {v.shape}; rank {self.rank} "
                                    f"owns {size} entries of {name} ({where})")
        result_shape = (result_size,) if v.ndim == 1 else (result_size, 1)
        if out is not None:
            if not isinstance(out, np.ndarray) or out.shape != result_shape:
                raise InvalidInputError(f"out must be a numpy array of shape {result_shape}")
            if out.dtype.kind != "f":
                raise UnsupportedDtypeError(f"out must hold floats, not {out.dtype}")
        return v, result_shape

    def _host_result(self, staged, result_shape, out, operand_dtype):
        """The host result from its staging array: into ``out``, or a new array of
        numpy's promoted type."""
        if out is None:
            return staged.reshape(result_shape).astype(
                np.result_type(self.dtype, operand_dtype), copy=True)
        out[...] = staged.reshape(result_shape)
        return out

    def _device_operand(self, v, out, name, size, result_size):
        """Check a device operand and its ``out`` (made when None); returns both, the
        operand flat and in ``op.dtype``."""
        if v.shape not in ((size,), (size, 1)):
            raise InvalidInputError(f"{name}_local has shape {v.shape}; rank {self.rank} "
                                    f"owns {size} entries of {name}")
        if v.context != self.device.context:
            raise InvalidInputError(f"{name}_local lives on another OpenCL context than "
                                    "this rank's operator (use op.queue)")
        _check_real_operand(v.dtype, name)
        v = v.reshape(size)
        if v.dtype != self.dtype:
            v = v.astype(self.dtype)
        if out is None:
            out = cla.empty(self.queue, result_size, self.dtype)
        elif not isinstance(out, cla.Array):   # a host out with a device operand
            raise InvalidTypeError(f"with a device {name}, out must be a pyopencl array "
                                   f"of {result_size} {self.dtype} values, not "
                                   f"{type(out).__name__}")
        elif out.size != result_size or out.dtype != self.dtype:
            raise InvalidInputError(f"with a device {name}, out must be a pyopencl array "
                                    f"of {result_size} {self.dtype} values")
        return v, out

    def _check_live(self):
        if self._freed:
            raise InvalidInputError("this distributed operator was freed (op.free()): its "
                                    "communicator is gone; build another to use one")

    def _refusable(self, product, requests, flag_out, *args):
        """Run ``product``; if this rank refuses its input before the exchange started,
        still take part in the exchange with a refusal flag set, then raise.  The
        neighbours see the flag and raise too, so no rank waits forever for a message
        (ranks that exchange nothing with this one finish their product)."""
        self._check_live()
        self._exchange_started = False
        try:
            return product(*args)
        except Exception:   # any (a driver's error too): the neighbours must not wait
            if not self._exchange_started and requests:
                MPI = mpi()
                flag_out[:] = 1
                try:
                    MPI.Prequest.Startall(requests)
                    MPI.Request.Waitall(requests)
                finally:
                    flag_out[:] = 0
            raise

    def _check_flags(self, flag_in, ranks, what):
        """After an exchange: raise if a neighbour refused its input of this product."""
        if flag_in.any():
            bad = [int(r) for r, f in zip(ranks, flag_in) if f]
            raise DistributedInputError(
                f"{what} refused on rank{'s' if len(bad) > 1 else ''} "
                f"{', '.join(map(str, bad))} (its input; see the error there): this "
                f"rank's result is not computed")

    def __matmul__(self, x):
        return self.matvec(x)

    def dot(self, x):
        return self.matvec(x)

    def matvec(self, x_local, out=None, alpha=1.0, beta=0.0):
        """``alpha * A @ x + beta * y`` on this rank's rows (collective: every rank
        calls it).  ``x_local``: the owned entries of ``x`` (numpy, or a pyopencl array
        on ``op.queue``); ``out``: the owned rows of ``y``, of the same kind.  Without
        ``out`` a numpy result has dtype ``result_type(op.dtype, x.dtype)``; a device
        result is in ``op.dtype``.  The kernels compute in ``op.dtype``.

        Steps: pack the values to send (host take, or device take then a copy to the
        host: MPI cannot read pyopencl buffers), start the exchange, enqueue the
        diagonal block's product, finish the exchange, upload the ghosts into a reused
        buffer, add the off-diagonal product with ``beta=1``.  ``op.timings`` gets one
        dict per product (seconds): ``pack``, ``exchange`` (start to all messages in),
        ``local`` (the diagonal block's kernels, from profiling events), ``offdiag``
        (ghost upload + kernels + result to host), ``total``, and ``hidden``: the part
        of ``local`` and ``exchange`` that overlapped.
        """
        return self._refusable(self._matvec, self._requests, self._flag_out,
                               x_local, out, alpha, beta)

    def _scalars(self, alpha, beta):
        """alpha and beta as floats, refused where the local operators' 32-bit type
        would hold them as inf or 0 (``inputs.check_scalar_range``)."""
        alpha, beta = check_real_scalar("alpha", alpha), check_real_scalar("beta", beta)
        if self.dtype == np.float32:
            check_scalar_range("alpha", alpha, self.dtype)
            check_scalar_range("beta", beta, self.dtype)
        return alpha, beta

    def _matvec(self, x_local, out, alpha, beta):
        alpha, beta = self._scalars(alpha, beta)
        if beta != 0 and out is None:
            raise InvalidInputError("beta != 0 needs out= holding the y to accumulate into")
        m, n = self.local_shape
        on_device = isinstance(x_local, cla.Array)
        if not on_device:
            x, result_shape = self._host_operand(x_local, out, "x", n, m,
                                                 f"columns {self.col_range}")
            times = {}
            t0 = time.perf_counter()
            xc = np.ascontiguousarray(x.reshape(n), dtype=self.dtype)
            np.take(xc, self.comm_plan.send_idx, out=self._send)
            if n:
                cl.enqueue_copy(self.queue, self._x_dev.data, xc, is_blocking=False)
            if beta != 0 and m:
                cl.enqueue_copy(self.queue, self._y_dev.data,
                                np.ascontiguousarray(out.reshape(m), dtype=self.dtype),
                                is_blocking=False)
            self._product(self._x_dev, self._y_dev, alpha, beta, times, t0)
            t = time.perf_counter()
            if m:
                cl.enqueue_copy(self.queue, self._y_host, self._y_dev.data, is_blocking=True)
            else:
                self.queue.finish()   # the upload of x read xc
            times["offdiag"] += time.perf_counter() - t
            times["total"] = time.perf_counter() - t0
            self._record(times)
            return self._host_result(self._y_host, result_shape, out, x.dtype)
        # Device vectors: they stay on the device; only the packed values and the
        # ghosts cross to the host.
        alias = (isinstance(out, cla.Array) and isinstance(x_local, cla.Array)
                 and x_local.dtype == self.dtype and _shares_buffer(x_local, out))
        x, out = self._device_operand(x_local, out, "x", n, m)
        if alias and n and m:
            # out is x (or in its buffer): the values to send are read from x after the
            # diagonal kernels have begun writing out, so they are read from a copy.
            x = x.copy(queue=self.queue)
        times = {}
        t0 = time.perf_counter()
        pack = pack_after = None
        if self._send_runs is not None:
            # The values to send are a few contiguous runs of x (row slabs): copied
            # straight from x on the exchange queue, after whatever wrote x on ours
            # (the marker), enqueued after the diagonal kernels so that these start at
            # once (a gather kernel ahead of them delayed them by ~0.1 ms on NVIDIA).
            ready = cl.enqueue_marker(self.queue)
            def pack_after():
                return self._copy_runs(x, ready)
        elif self.comm_plan.n_send:
            def pack():
                # Gather on our queue (a short kernel ahead of the diagonal block's),
                # copy on the exchange queue while those run.  A gather on the exchange
                # queue waiting for ours started only once the diagonal kernels had
                # left the GPU's cores (NVIDIA: 0.85 ms to pack instead of 0.2).
                gathered = self._kernels.gather(self.queue, self._send_idx_dev, x,
                                                self._send_dev)
                return cl.enqueue_copy(self._xqueue, self._send, self._send_dev.data,
                                       is_blocking=False, wait_for=[gathered])
        self._product(x, out.reshape(m), alpha, beta, times, t0, pack, pack_after)
        times["total"] = time.perf_counter() - t0
        self._record(times)
        return out

    def _product(self, x_dev, y_dev, alpha, beta, times, t0, pack=None, pack_after=None):
        """Exchange, diagonal product, off-diagonal product (device vectors).

        Two queues: ours runs the kernels, ``_xqueue`` the exchange's device work (the
        copy of the values to send: ``pack()`` enqueued before the diagonal kernels,
        ``pack_after()`` after them; the upload of the ghosts), so copies overlap the
        diagonal block's kernels instead of waiting behind them.  The off-diagonal
        kernels wait for the upload through a barrier on ours."""
        MPI = mpi()
        requests = self._requests
        if self._ghost_upload is not None:   # the last product's upload read _ghost
            self._ghost_upload.wait()
            self._ghost_upload = None
        packed = pack() if pack is not None else None
        if packed is not None:
            self._xqueue.flush()
        with record_launches() as events:
            self.diag.matvec(x_dev, out=y_dev, alpha=alpha, beta=beta)
        self.queue.flush()                   # start the kernels before we block below
        if pack_after is not None:
            packed = pack_after()
            self._xqueue.flush()
        if packed is not None:
            packed.wait()
        t_start = time.perf_counter()
        times["pack"] = t_start - t0
        if requests:
            self._exchange_started = True
            MPI.Prequest.Startall(requests)
            MPI.Request.Waitall(requests)
            self._check_flags(self._flag_in, self.comm_plan.recv_ranks, "the product")
        t_exchanged = time.perf_counter()
        exchange = t_exchanged - t_start
        if self.offdiag is not None:
            # The upload must not overwrite ghosts the last off-diagonal product reads.
            wait = [self._offdiag_done] if self._offdiag_done is not None else None
            self._ghost_upload = cl.enqueue_copy(self._xqueue, self._ghost_dev.data,
                                                 self._ghost, is_blocking=False,
                                                 wait_for=wait)
            self._xqueue.flush()
            cl.enqueue_barrier(self.queue, wait_for=[self._ghost_upload])
            self.offdiag.matvec(self._ghost_dev, out=y_dev, alpha=alpha, beta=1.0)
            self._offdiag_done = cl.enqueue_marker(self.queue)
        t = time.perf_counter()
        if events:
            events[-1].wait()
        t_both = time.perf_counter()
        local = _kernel_seconds(self.queue, events)
        times.update(exchange=exchange, local=local,
                     hidden=_hidden(local, t_exchanged - t0, t_both - t0),
                     offdiag=t - t_exchanged)

    # -- transposed products -------------------------------------------------------------
    @property
    def T(self):
        """A^T as a distributed operator: ``op.T @ y_local`` (``op.T.matvec(y_local,
        out, alpha, beta)``) runs ``op.rmatvec``; its ``shape``, ``row_range`` and
        ``col_range`` are ``op``'s swapped, and ``op.T.T is op``."""
        if self._transposed_view is None:
            self._transposed_view = TransposedView(self)
        return self._transposed_view

    @property
    def H(self):
        """A^H, the conjugate transpose: ``op.T`` itself for real values."""
        if np.dtype(self.dtype).kind != "c":
            return self.T
        if self._adjoint_view is None:
            self._adjoint_view = TransposedView(self, conjugate=True)
        return self._adjoint_view

    def rmatvec(self, y_local, out=None, alpha=1.0, beta=0.0):
        """``alpha * A^T @ y + beta * x`` (``A^H`` for complex values) on the entries of
        ``x`` this rank owns (``col_range``); collective.  ``y_local``: this rank's rows
        of ``y`` (``row_range``, numpy or a pyopencl array on ``op.queue``); ``out``: the
        owned entries of ``x``, of the same kind.  Result types and checks as in
        ``matvec``.

        The exchange runs in reverse (PETSc's ``MatMultTranspose``): the off-diagonal
        block's transposed product gives the contributions to the ghost columns, copied
        to the host and sent to their owners (persistent requests on their own
        buffers); meanwhile the diagonal block's transposed product runs into the
        result; the contributions received (several neighbours may add to one entry:
        summed per entry on the host, in rank order) are then added at the owned
        entries the forward plan sends.  Each block's first transposed product builds
        its transposed copy (see :meth:`pyspmv_cl.SpMV.rmatvec`).  ``op.rtimings`` gets
        one dict per product (seconds): ``offdiag`` (the off-diagonal block's product
        and the copy of its result to the host), ``exchange``, ``local`` (the diagonal
        block's kernels), ``hidden`` (their overlap), ``unpack`` (adding what came in,
        the result's copy to the host included) and ``total``.
        """
        self._check_live()   # (before the reverse exchange's buffers are made)
        if self._rrequests is None:
            self._rbuffers()
        return self._refusable(self._rmatvec, self._rrequests, self._rflag_out,
                               y_local, out, alpha, beta)

    def _rmatvec(self, y_local, out, alpha, beta):
        alpha, beta = self._scalars(alpha, beta)
        if beta != 0 and out is None:
            raise InvalidInputError("beta != 0 needs out= holding the x to accumulate into")
        m, n = self.local_shape
        if not isinstance(y_local, cla.Array):
            y, result_shape = self._host_operand(y_local, out, "y", m, n,
                                                 f"rows {self.row_range}")
            times = {}
            t0 = time.perf_counter()
            yc = np.ascontiguousarray(y.reshape(m), dtype=self.dtype)
            if m:
                cl.enqueue_copy(self.queue, self._y_dev.data, yc, is_blocking=False)
            if beta != 0 and n:
                cl.enqueue_copy(self.queue, self._x_dev.data,
                                np.ascontiguousarray(out.reshape(n), dtype=self.dtype),
                                is_blocking=False)
            self._rproduct(self._y_dev, self._x_dev, alpha, beta, times, on_device=False)
            t = time.perf_counter()
            if n:
                cl.enqueue_copy(self.queue, self._x_host, self._x_dev.data, is_blocking=True)
                self._x_host[self._rtargets] += self._racc
            else:
                self.queue.finish()   # the upload of y read yc
            times["unpack"] += time.perf_counter() - t
            times["total"] = time.perf_counter() - t0
            self._record(times, self.rtimings)
            return self._host_result(self._x_host, result_shape, out, y.dtype)
        # Device vectors: only the ghosts' contributions and the received ones cross.
        y, out = self._device_operand(y_local, out, "y", m, n)
        times = {}
        t0 = time.perf_counter()
        self._rproduct(y, out.reshape(n), alpha, beta, times, on_device=True)
        times["total"] = time.perf_counter() - t0
        self._record(times, self.rtimings)
        return out

    def _rproduct(self, y_dev, x_dev, alpha, beta, times, on_device):
        """The transposed product on device vectors: the ghosts' contributions, the
        reverse exchange over the diagonal block's product, the received sum (added on
        the device when ``on_device``, else left in ``_racc`` for the caller)."""
        MPI = mpi()
        requests = self._rrequests
        t0 = time.perf_counter()
        if self.offdiag is not None:
            self.offdiag.rmatvec(y_dev, out=self._rghost_dev, alpha=alpha)
            cl.enqueue_copy(self.queue, self._rsend, self._rghost_dev.data, is_blocking=True)
        if self._racc_upload is not None:   # the last product's upload read _racc
            self._racc_upload.wait()
            self._racc_upload = None
        t_start = time.perf_counter()
        times["offdiag"] = t_start - t0
        if requests:
            self._exchange_started = True
            MPI.Prequest.Startall(requests)
        with record_launches() as events:
            self.diag.rmatvec(y_dev, out=x_dev, alpha=alpha, beta=beta)
        if requests:
            MPI.Request.Waitall(requests)
            self._check_flags(self._rflag_in, self.comm_plan.send_ranks,
                              "the transposed product")
        t_exchanged = time.perf_counter()
        if events:
            events[-1].wait()
        t_both = time.perf_counter()
        local = _kernel_seconds(self.queue, events)
        exchange = t_exchanged - t_start
        times.update(exchange=exchange, local=local,
                     hidden=_hidden(local, exchange, t_both - t_start))
        t = time.perf_counter()
        if len(self._rtargets):
            accumulate(self._rrecv, self._rinverse, len(self._rtargets), out=self._racc)
            if on_device:
                self._racc_upload = cl.enqueue_copy(self.queue, self._racc_dev.data,
                                                    self._racc, is_blocking=False)
                self._kernels.scatter_add(self.queue, self._rtargets_dev,
                                          self._racc_dev, x_dev)
        times["unpack"] = time.perf_counter() - t

    def _record(self, times, into=None):
        into = self.timings if into is None else into
        into.append(times)
        if len(into) > self.keep_timings:
            del into[: len(into) - self.keep_timings]

    def timing_summary(self, transposed=False):
        """Medians over the recorded products (seconds), ``{}`` before any; the
        transposed products' (``rtimings``) with ``transposed=True``."""
        timings = self.rtimings if transposed else self.timings
        if not timings:
            return {}
        return {k: float(np.median([t[k] for t in timings])) for k in timings[0]}

    # -- construction from one rank's matrix --------------------------------------------
    @classmethod
    def from_global(cls, A, comm=None, root=0, partition="nnz", **kwargs):
        """Collective: scatter the scipy matrix ``A`` held on ``root`` (other ranks may
        pass None).  Root's ``partition`` decides:

        - ``"nnz"`` (the default): contiguous row blocks balanced by non-zeros;
        - ``"rows"``: contiguous blocks of equal row counts;
        - explicit offsets (ranks + 1 integers);
        - ``"metis"``: graph partitioning of a square matrix (pymetis, the ``metis``
          extra): METIS splits the graph of ``A + A^T`` (no diagonal; vertices
          weighted by their row's non-zeros, so the parts balance non-zeros) to cut
          few edges, i.e. to need few ghosts; then rows *and* columns are permuted
          symmetrically so that each part is a contiguous row block, and that
          permuted matrix is scattered.  Each rank then owns a *scattered* set of
          original indices: ``op.permutation`` (``perm[new] = old``, the same on every
          rank) and ``op.local_indices()`` say which, ``op.scatter``/``op.gather``
          move whole vectors.  ``col_range`` cannot be given with it.

        The other partitions leave the numbering alone (``op.permutation`` is None).
        A rectangular matrix's ``x`` is split evenly (PETSc's default) unless
        ``kwargs`` give ``col_range``.  Other keywords go to the constructor.  A refusal
        on root (bad partition, non-square matrix for metis...) raises
        :class:`DistributedInputError` on every rank; pymetis missing raises
        ImportError on every rank."""
        MPI = mpi()
        comm = MPI.COMM_WORLD if comm is None else comm
        _check_root(root, comm.size)
        blocks, error, method, perm = None, None, None, None
        if comm.rank == root:
            try:
                csr = as_host_csr(A)
                if isinstance(partition, str) and partition == "metis":
                    if "col_range" in kwargs:
                        raise InvalidInputError(
                            "partition='metis' permutes x with the rows: col_range "
                            "cannot be given with it")
                    perm, offsets = metis_partition(csr, comm.size)
                    csr = permute_symmetric(csr, perm)
                    method = "metis"
                elif isinstance(partition, str):
                    offsets = partition_rows(csr.indptr, comm.size, partition)
                    method = partition
                else:
                    offsets = check_offsets(partition, csr.shape[0], "row")
                    if len(offsets) != comm.size + 1:
                        raise InvalidInputError(f"partition offsets need {comm.size + 1} "
                                                f"entries, not {len(offsets)}")
                    method = "offsets"
                blocks = [(csr[offsets[p]:offsets[p + 1]], int(offsets[p]), csr.shape)
                          for p in range(comm.size)]
            except ImportError as exc:
                error = ("ImportError", str(exc))
            except (PySpMVError, TypeError, ValueError) as exc:
                error = (type(exc).__name__, str(exc))
        error, method, n_perm = comm.bcast(
            (error, method, None if perm is None else len(perm)), root=root)
        if error is not None:
            kind, text = error
            if kind == "ImportError":
                raise ImportError(f"from_global refused on root {root}: {text}")
            raise DistributedInputError(f"from_global refused on root {root}: "
                                        f"{kind}: {text}")
        if n_perm is not None:
            if comm.rank != root:
                perm = np.empty(n_perm, dtype=np.int64)
            comm.Bcast([perm, MPI.INT64_T], root=root)
        local, start, shape = comm.scatter(blocks, root=root)
        op = cls(local, comm, row_start=start, shape=shape, **kwargs)
        op.partition = method
        op.permutation = perm
        return op

    def free(self):
        """Release the MPI requests and the duplicated communicator (collective).
        Products on the operator are refused afterwards; a second call does nothing."""
        if self._freed:
            return
        for r in self._requests + (self._rrequests or []):
            r.Free()
        self._requests, self._rrequests = [], []
        self.comm.Free()
        self._freed = True


class TransposedView(LocalTransposedView):
    """``op.T`` (and ``op.H``) of a distributed operator: A^T (A^H) with the layout
    swapped (``shape``, ``row_range``/``col_range``, ``row_offsets``/``col_offsets``,
    ``local_shape``).  ``matvec`` is ``op.rmatvec`` (conjugated around it for A^T of
    complex values), ``rmatvec`` is ``op.matvec``; ``.T`` (``.H``) gives ``op`` back.
    Collective like ``op``'s products."""

    @property
    def comm(self):
        return self.operator.comm

    @property
    def rank(self):
        return self.operator.rank

    @property
    def size(self):
        return self.operator.size

    @property
    def row_range(self):
        return self.operator.col_range

    @property
    def col_range(self):
        return self.operator.row_range

    @property
    def row_offsets(self):
        return self.operator.col_offsets

    @property
    def col_offsets(self):
        return self.operator.row_offsets

    @property
    def local_shape(self):
        m, n = self.operator.local_shape
        return (n, m)

    @property
    def timings(self):
        return self.operator.rtimings

    def timing_summary(self):
        return self.operator.timing_summary(transposed=True)

    def diagonal(self):
        """The owned rows' diagonal entries: A's, where A's rows and columns share one
        distribution (``cg``'s case)."""
        if self.operator.row_range != self.operator.col_range:
            raise InvalidInputError(
                "the diagonal of A^T on this rank's rows (A's columns "
                f"{self.operator.col_range}) is held by other ranks: rows and columns "
                "are distributed differently")
        return self.operator.diagonal()

    def aslinearoperator(self):
        raise InvalidInputError("a distributed operator has no scipy LinearOperator "
                                "(its products take each rank's part of the vectors)")

    def __repr__(self):
        what = "conjugate-transposed" if self.conjugate else "transposed"
        return (f"<{what} view of the distributed SpMV rank {self.rank}/{self.size}, "
                f"{self.shape[0]}x{self.shape[1]}, rows {self.row_range}>")


def _check_real_operand(dtype, name):
    """A host or device operand's dtype: real numbers (the operator is real)."""
    if dtype.kind == "c":
        raise UnsupportedDtypeError(
            f"{name} is complex ({dtype}): the distributed operator is real; "
            f"multiply {name}.real and {name}.imag separately")
    if dtype.kind not in "fiub":
        raise UnsupportedDtypeError(f"{name} must hold numbers, not {dtype}")


def _shares_buffer(a, b):
    """Whether two pyopencl arrays lie in one buffer (or one's sub-buffer); an empty
    array has none (pyopencl gives it no buffer: a rank owning no rows)."""
    def root(arr):
        buf = arr.base_data
        parent = buf.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)
        return (parent or buf).int_ptr
    if a.base_data is None or b.base_data is None:
        return False
    return root(a) == root(b)


def _pinned(queue, n, dtype):
    """A host array for the exchange's copies: the mapping of an ALLOC_HOST_PTR buffer,
    kept mapped for the operator's life.  Drivers back such buffers with page-locked
    memory (NVIDIA's OpenCL guide recommends exactly this), so copies to and from it
    run by DMA at full bus speed (benchmarks/multigpu.py measures both kinds).  Only
    its host pointer is used (never the buffer in a command), so keeping it mapped is
    within the OpenCL rules; elsewhere it is ordinary host memory."""
    dtype = np.dtype(dtype)
    if n == 0:
        return np.empty(0, dtype=dtype)
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
    buf = cl.Buffer(queue.context, flags, int(n) * dtype.itemsize)
    array, event = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ | cl.map_flags.WRITE,
                                         0, (int(n),), dtype)
    event.wait()
    return array     # its base holds the mapping, which holds the buffer


#: Up to this many contiguous runs of values to send are copied straight from x (one
#: copy command each) instead of gathered by a kernel.
_MAX_COPY_RUNS = 4


def contiguous_runs(idx, max_runs):
    """``idx`` as ``[(start, position, length), ...]``: runs of consecutive indices
    (``idx[position:position + length] == start + arange(length)``), or None when
    there are more than ``max_runs`` of them (or none)."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return None
    cuts = np.flatnonzero(np.diff(idx) != 1) + 1
    if cuts.size + 1 > max_runs:
        return None
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [idx.size]))
    return [(int(idx[a]), int(a), int(b - a)) for a, b in zip(starts, ends)]


def _agree_gathered(gathered):
    bad = [(r, e) for r, (_, e) in enumerate(gathered) if e is not None]
    if bad:
        text = "; ".join(f"rank {r}: {e}" for r, e in bad)
        raise DistributedInputError(f"distributed SpMV refused ({len(bad)} of "
                                    f"{len(gathered)} ranks): {text}")


def _local_diagonal(diag, row_range, col_range):
    """A[i, i] for the owned rows i, from the diagonal block (zero where the diagonal
    falls outside the owned columns or is not stored)."""
    m = diag.shape[0]
    rows = np.arange(row_range[0], row_range[1])
    local_cols = rows - col_range[0]
    inside = (local_cols >= 0) & (local_cols < diag.shape[1])
    out = np.zeros(m, dtype=np.float64)
    if inside.any():
        coo = sp.coo_matrix(diag)
        hit = coo.row + row_range[0] - col_range[0] == coo.col
        # bincount sums duplicates like add.at, several times faster at 10^7 rows.
        out = np.bincount(coo.row[hit], weights=coo.data[hit].astype(np.float64),
                          minlength=m)
    return out


__all__ = ["SpMV", "DistributedInputError", "node_local_device", "node_position", "mpi",
           "CommPlan", "TransposedView"]
