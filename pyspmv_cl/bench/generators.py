"""Test and benchmark matrices: synthetic generators, Matrix Market loading, spec strings.

Every generator returns a ``scipy.sparse.csr_matrix`` of float64 in canonical form (sorted
column indices, no duplicates). Random values and structures come from
``numpy.random.default_rng(seed)`` so a given call is reproducible. Everything is
vectorised over rows/non-zeros; the only Python loops run over a few stencil offsets,
diagonals or R-MAT bit levels.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

__all__ = [
    "DEFAULT_SPECS",
    "GENERATOR_HELP",
    "banded",
    "block_diagonal",
    "dense_rows",
    "from_spec",
    "load_matrix",
    "poisson2d",
    "poisson3d",
    "power_law",
    "random_uniform",
    "replicate_to",
    "resolve_name",
    "rmat",
]

#: What `pyspmv-cl bench` runs when given no matrix: 1M rows, 5M non-zeros.
DEFAULT_SPECS = ("poisson2d:1000",)

GENERATOR_HELP = """\
Matrix specs (optional parameters in brackets):
  poisson2d:N                  5-point Laplacian on an N x N grid (N^2 rows)
  poisson3d:N                  7-point Laplacian on an N x N x N grid (N^3 rows)
  random:ROWS[,NNZ_PER_ROW]    uniform random columns, about NNZ_PER_ROW per row (10)
  powerlaw:N[,AVG[,EXPONENT]]  power-law row lengths, mean AVG (8), exponent (2.1)
  rmat:SCALE[,EDGE_FACTOR]     R-MAT graph, 2^SCALE vertices, EDGE_FACTOR edges/vertex (16)
  banded:N[,BANDWIDTH]         diagonals -BANDWIDTH..BANDWIDTH (5)
  denserows:N[,N_DENSE[,NNZ_PER_ROW]]  random rows (8 nnz) plus N_DENSE (4) dense rows
  PATH.mtx | PATH.mtx.gz       a Matrix Market file (any existing file is read as one)
  SPEC*K                       any of the above replicated K times block-diagonally"""


# --------------------------------------------------------------------------- helpers


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    # Uniform in [-1, 1): signed values exercise cancellation, no structural zeros in
    # practice.
    return rng.uniform(-1.0, 1.0, size=n)


def _csr_from_masked_columns(cols: np.ndarray, valid: np.ndarray, shape) -> sp.csr_matrix:
    """CSR pattern from a (rows, k) table of per-row column candidates.

    ``cols`` must already be increasing along each row, so dropping the invalid
    entries (row-major boolean indexing) yields sorted, duplicate-free CSR directly,
    without a COO sort. Data is left as ones for the caller to overwrite.
    """
    counts = valid.sum(axis=1)
    indptr = np.zeros(shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = cols[valid]
    return _csr(np.ones(indices.size), indices, indptr, shape)


def _csr(data, indices, indptr, shape) -> sp.csr_matrix:
    # Hand the arrays over without scipy re-validating/copying; 32-bit indices when
    # they fit, as scipy itself would pick and OpenCL kernels want.
    idx_dtype = np.int32 if max(shape[1], indices.size) < 2**31 else np.int64
    A = sp.csr_matrix(
        (data, indices.astype(idx_dtype, copy=False), indptr.astype(idx_dtype, copy=False)),
        shape=shape,
        copy=False,
    )
    A.has_sorted_indices = True
    A.has_canonical_format = True
    return A


def _csr_from_coo_unique(rows, cols, shape, rng: np.random.Generator) -> sp.csr_matrix:
    """Canonical CSR from (possibly repeated) coordinates; repeats are dropped.

    Dropping (rather than summing) keeps every value in the same distribution. One
    sort of a combined int64 key both orders by (row, col) and finds the repeats.
    """
    nrows, ncols = shape
    key = np.asarray(rows, dtype=np.int64) * ncols + np.asarray(cols, dtype=np.int64)
    # Sort + neighbour compare rather than np.unique: numpy >= 2.3's hash-based unique
    # is several times slower than a plain sort on tens of millions of int64 keys.
    key.sort()
    if key.size:
        first = np.empty(key.size, dtype=bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        key = key[first]
    r, c = np.divmod(key, ncols)
    indptr = np.zeros(nrows + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=nrows), out=indptr[1:])
    return _csr(_values(rng, key.size), c, indptr, shape)


def _grid_laplacian(n: int, dim: int, start: int = 0, stop: int | None = None) -> sp.csr_matrix:
    """(2*dim+1)-point Laplacian on an n^dim grid, Dirichlet boundary (values 2*dim / -1):
    rows ``start:stop`` of it (all by default), with global column indices."""
    if n < 1:
        raise ValueError("grid size must be >= 1")
    N = n**dim
    stop = N if stop is None else int(stop)
    if not 0 <= start <= stop <= N:
        raise ValueError(f"rows {start}:{stop} outside the grid's {N} rows")
    idx_dtype = np.int32 if N < 2**31 else np.int64
    row = np.arange(start, stop, dtype=idx_dtype)
    k = 2 * dim + 1
    cols = np.empty((row.size, k), dtype=idx_dtype)
    valid = np.ones((row.size, k), dtype=bool)
    cols[:, dim] = row
    # Column slots in increasing column order: -n^(dim-1) .. -1, 0, +1 .. +n^(dim-1),
    # so the masked table is already sorted CSR.
    for axis in range(dim):
        stride = n**axis
        coord = (row // stride) % n
        lo, hi = dim - 1 - axis, dim + 1 + axis
        cols[:, lo] = row - stride
        cols[:, hi] = row + stride
        valid[:, lo] = coord > 0
        valid[:, hi] = coord < n - 1
        del coord
    A = _csr_from_masked_columns(cols, valid, (row.size, N))
    # The diagonal sits after the valid lower neighbours of each row.
    A.data[:] = -1.0
    A.data[A.indptr[:-1] + valid[:, :dim].sum(axis=1)] = 2.0 * dim
    return A


# --------------------------------------------------------------------------- generators


def poisson2d(n: int) -> sp.csr_matrix:
    """5-point finite-difference Laplacian on an n x n grid: n^2 rows, values 4 / -1."""
    return _grid_laplacian(int(n), 2)


def poisson3d(n: int) -> sp.csr_matrix:
    """7-point finite-difference Laplacian on an n x n x n grid: n^3 rows, values 6 / -1."""
    return _grid_laplacian(int(n), 3)


def random_uniform(rows: int, cols: int | None = None, nnz_per_row: int = 10,
                   seed=0) -> sp.csr_matrix:
    """Each row gets ``nnz_per_row`` uniformly random columns (repeats dropped)."""
    rows = int(rows)
    cols = rows if cols is None else int(cols)
    if rows < 1 or cols < 1 or nnz_per_row < 1:
        raise ValueError("rows, cols and nnz_per_row must be >= 1")
    rng = _rng(seed)
    k = min(int(nnz_per_row), cols)
    r = np.repeat(np.arange(rows, dtype=np.int64), k)
    c = rng.integers(0, cols, size=r.size)
    return _csr_from_coo_unique(r, c, (rows, cols), rng)


def power_law(n: int, avg_degree: float = 8, exponent: float = 2.1, seed=0) -> sp.csr_matrix:
    """Square matrix whose row lengths follow a power law P(len) ~ len^-exponent.

    Lengths are Pareto draws (x_min = 1) capped at n and rescaled to mean ~avg_degree;
    with exponent near 2 the tail is heavy, so large n gives a few rows thousands of
    times longer than the mean -- the load-imbalance case for row-parallel kernels.
    """
    n = int(n)
    if n < 1 or avg_degree <= 0 or exponent <= 1:
        raise ValueError("need n >= 1, avg_degree > 0, exponent > 1")
    rng = _rng(seed)
    # Inverse-CDF Pareto: (1-u)^(-1/(exponent-1)) >= 1; 1-u in (0, 1] avoids inf.
    raw = np.minimum((1.0 - rng.random(n)) ** (-1.0 / (exponent - 1.0)), n)
    lengths = np.clip(np.rint(raw * (avg_degree / raw.mean())), 1, n).astype(np.int64)
    r = np.repeat(np.arange(n, dtype=np.int64), lengths)
    c = rng.integers(0, n, size=r.size)
    return _csr_from_coo_unique(r, c, (n, n), rng)


def rmat(scale: int, edge_factor: int = 16, a: float = 0.57, b: float = 0.19,
         c: float = 0.19, seed=0) -> sp.csr_matrix:
    """R-MAT (Graph500-style) graph adjacency with 2^scale vertices, repeats dropped.

    Each edge picks one of the four quadrants per bit level with probabilities
    a, b, c, 1-a-b-c; all edges are drawn together, one loop step per level.
    """
    scale, edge_factor = int(scale), int(edge_factor)
    if scale < 1 or scale > 40 or edge_factor < 1:
        raise ValueError("need 1 <= scale <= 40 and edge_factor >= 1")
    if min(a, b, c) < 0 or a + b + c > 1:
        raise ValueError("need a, b, c >= 0 and a + b + c <= 1")
    rng = _rng(seed)
    n = 1 << scale
    m = edge_factor * n
    row = np.zeros(m, dtype=np.int64)
    col = np.zeros(m, dtype=np.int64)
    for _ in range(scale):
        u = rng.random(m, dtype=np.float32)  # float32 halves the per-level temporary
        # Quadrants: [0,a) top-left, [a,a+b) top-right, [a+b,a+b+c) bottom-left, rest
        # bottom-right.
        rbit = u >= a + b
        cbit = ((u >= a) & (u < a + b)) | (u >= a + b + c)
        row <<= 1
        col <<= 1
        row |= rbit
        col |= cbit
    del u, rbit, cbit
    return _csr_from_coo_unique(row, col, (n, n), rng)


def banded(n: int, bandwidth: int = 5, seed=0) -> sp.csr_matrix:
    """Random values on diagonals -bandwidth..bandwidth of an n x n matrix."""
    n, bandwidth = int(n), int(bandwidth)
    if n < 1 or bandwidth < 0:
        raise ValueError("need n >= 1 and bandwidth >= 0")
    rng = _rng(seed)
    offsets = np.arange(-bandwidth, bandwidth + 1, dtype=np.int64)
    row = np.arange(n, dtype=np.int64)[:, None]
    cols = row + offsets[None, :]  # increasing along each row: already CSR order
    valid = (cols >= 0) & (cols < n)
    A = _csr_from_masked_columns(cols, valid, (n, n))
    A.data[:] = _values(rng, A.nnz)
    return A


def dense_rows(n: int, n_dense: int = 4, nnz_per_row: int = 8, dense_fraction: float = 1.0,
               seed=0) -> sp.csr_matrix:
    """Sparse random n x n matrix in which ``n_dense`` random rows are (nearly) dense.

    Each dense row keeps each column with probability ``dense_fraction``: a worst case
    for one-thread-per-row kernels and a test of long-row splitting.
    """
    n, n_dense = int(n), int(n_dense)
    if n < 1:
        raise ValueError(f"N must be >= 1, not {n}")
    if not 0 <= n_dense <= n:
        raise ValueError(f"N_DENSE must lie in 0..N (N={n}), not {n_dense}")
    if not 0 < dense_fraction <= 1:
        raise ValueError(f"dense_fraction must lie in (0, 1], not {dense_fraction}")
    rng = _rng(seed)
    k = min(int(nnz_per_row), n)
    r = np.repeat(np.arange(n, dtype=np.int64), k)
    c = rng.integers(0, n, size=r.size)
    dense = rng.choice(n, size=n_dense, replace=False)
    # Replace, not add to, the chosen rows' sparse entries.
    keep = ~np.isin(r, dense)
    mask = rng.random((n_dense, n)) < dense_fraction
    dr, dc = np.nonzero(mask)
    r = np.concatenate([r[keep], dense[dr]])
    c = np.concatenate([c[keep], dc])
    return _csr_from_coo_unique(r, c, (n, n), rng)


def block_diagonal(A, copies: int) -> sp.csr_matrix:
    """``copies`` copies of A on the diagonal (== kron(identity(copies), A)), as CSR.

    Built directly from A's arrays: for large replicated files this avoids kron's
    COO round trip and keeps the result canonical.
    """
    copies = int(copies)
    if copies < 1:
        raise ValueError("copies must be >= 1")
    A = sp.csr_matrix(A)
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()
    nrows, ncols = A.shape
    nnz = A.nnz
    k = np.arange(copies, dtype=np.int64)[:, None]
    indptr = np.empty(copies * nrows + 1, dtype=np.int64)
    indptr[:-1] = (A.indptr[None, :-1].astype(np.int64) + k * nnz).ravel()
    indptr[-1] = copies * nnz
    indices = (A.indices[None, :].astype(np.int64) + k * ncols).ravel()
    return _csr(np.tile(A.data, copies), indices, indptr, (copies * nrows, copies * ncols))


def replicate_to(label: str, A, nnz: float, sep: str = " x"):
    """``(label, A)`` with A replicated block-diagonally (``block_diagonal``) until it
    holds at least ``nnz`` non-zeros, and the copies counted in the label (``sep`` +
    copies); unchanged when ``nnz`` is 0, A is empty or one copy is enough (the
    benchmarks' ``--replicate-to``)."""
    if not nnz or not A.nnz:
        return label, A
    copies = int(np.ceil(nnz / A.nnz))
    if copies == 1:
        return label, A
    return f"{label}{sep}{copies}", block_diagonal(A, copies)


# --------------------------------------------------------------------------- files


def resolve_name(spec: str, default_dir) -> str:
    """A bare matrix name (``cage10``) as the path of ``<name>.mtx.gz`` in
    ``PYSPMV_CL_MATRIX_DIR`` (else ``default_dir``) when that file exists; any other
    spec (a generator spec, a path) unchanged, for ``from_spec``."""
    folder = Path(os.environ.get("PYSPMV_CL_MATRIX_DIR", default_dir))
    path = folder / f"{spec}.mtx.gz"
    return str(path) if ":" not in spec and path.is_file() else spec


def load_matrix(path) -> sp.csr_matrix:
    """Read a Matrix Market file (``.mtx`` or gzip-compressed ``.mtx.gz``) as canonical CSR.

    Real, integer and pattern matrices become float64 (pattern entries are 1.0);
    complex matrices keep their complex dtype for the caller to decide about.
    Symmetric storage is expanded by mmread.
    """
    path = Path(path)
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            _check_fits(scipy.io.mminfo(f))
            f.seek(0)   # (back to the header: a gzip stream rewinds)
            M = scipy.io.mmread(f)
    else:
        _check_fits(scipy.io.mminfo(str(path)))
        M = scipy.io.mmread(str(path))
    A = sp.csr_matrix(M)
    if A.dtype.kind != "c":
        A = A.astype(np.float64, copy=False)
    A.sum_duplicates()  # also sorts indices
    return A


#: Bytes per stored entry and per row while a file is read into CSR (scipy's COO
#: triplets, then the CSR arrays; the row pointers and their counts and sums), rough
#: bounds for _check_fits.
_READ_BYTES_PER_ENTRY = 48
_READ_BYTES_PER_ROW = 24


def _physical_memory():
    """The machine's memory in bytes, or None where it cannot be asked."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # not a POSIX system
        return None


def _check_copies_fit(A, copies) -> None:
    """Refuse ``SPEC*K`` whose block-diagonal copy needs more memory than the machine
    has (its arrays grow until the kernel kills the process, without a MemoryError)."""
    rows = A.shape[0] * copies
    entries = A.nnz * copies
    # The result's values and 64-bit indices, and as much again while it is built.
    need = 2 * (entries * (A.data.itemsize + 8) + 8 * (rows + 1))
    have = _physical_memory()
    if have is not None and need > have:
        raise MemoryError(f"{copies} copies of {A.shape[0]} x {A.shape[1]} with {A.nnz} "
                          f"non-zeros need about {need / 2**30:.1f} GiB, more than this "
                          f"machine's {have / 2**30:.1f} GiB")


def _check_fits(info) -> None:
    """Refuse a file whose header asks for more memory than the machine has (a header of
    3e9 rows got the process killed by the kernel, with no message: Linux grants the
    allocation and kills later, so numpy raises no MemoryError)."""
    rows, cols, entries, _, _, symmetry = info
    copies = 1 if symmetry == "general" else 2
    need = _READ_BYTES_PER_ROW * (int(rows) + 1) + \
        _READ_BYTES_PER_ENTRY * copies * int(entries)
    have = _physical_memory()
    if have is not None and need > have:
        raise MemoryError(f"{rows} x {cols} with {entries} entries needs about "
                          f"{need / 2**30:.1f} GiB, more than this machine's "
                          f"{have / 2**30:.1f} GiB")


def _matrix_stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".mtx.gz", ".mtx", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


# --------------------------------------------------------------------------- specs


def _number(text: str, kind: type):
    """int or float from a spec field; ints accept '1e6' or '1_000_000' if integral."""
    value = float(text.replace("_", ""))
    if not np.isfinite(value):
        raise ValueError(f"{text!r} is not finite")
    if kind is int:
        if not value.is_integer():
            raise ValueError(f"{text!r} is not an integer")
        return int(value)
    return value


# name -> (generator, ((keyword, type), ...), number of required parameters)
_GENERATORS: dict[str, tuple[Callable[..., sp.csr_matrix], tuple, int]] = {
    "poisson2d": (poisson2d, (("n", int),), 1),
    "poisson3d": (poisson3d, (("n", int),), 1),
    "random": (random_uniform, (("rows", int), ("nnz_per_row", int)), 1),
    "powerlaw": (power_law, (("n", int), ("avg_degree", float), ("exponent", float)), 1),
    "rmat": (rmat, (("scale", int), ("edge_factor", int)), 1),
    "banded": (banded, (("n", int), ("bandwidth", int)), 1),
    "denserows": (dense_rows, (("n", int), ("n_dense", int), ("nnz_per_row", int)), 1),
}


#: Each generator's form as GENERATOR_HELP writes it, for messages.
_FORMS = {line.split()[0].split(":")[0]: line.split()[0]
          for line in GENERATOR_HELP.splitlines()[1:] if ":" in line.split()[0]}


def _labels(form: str) -> list:
    """The parameters' names in a form: ``random:ROWS[,NNZ_PER_ROW]`` -> ROWS, ..."""
    return re.findall(r"[A-Z][A-Z_]*", form.partition(":")[2])


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"bad matrix spec {spec!r}: {why}\n{GENERATOR_HELP}")


def from_spec(spec: str) -> tuple[str, sp.csr_matrix]:
    """Build the matrix a spec string names; returns ``(label, csr_matrix)``.

    See ``GENERATOR_HELP`` for the forms. Labels are short and file-name safe, e.g.
    ``poisson2d-1000``, ``random-100000-10``, ``1138_bus``, ``poisson2d-100x8``.
    A file that cannot be read (missing, not gzip, cut short, not Matrix Market) or a
    matrix too large for memory is a ValueError naming the spec, as a bad spec is: the
    command line prints it instead of a traceback.
    """
    try:
        return _from_spec(spec)
    except MemoryError as exc:
        why = f" ({exc})" if str(exc) else ""
        raise ValueError(f"{spec!r}: too large to build in this machine's memory{why}") \
            from None
    except (OSError, EOFError, zlib.error, OverflowError) as exc:
        # (OverflowError: scipy's reader on an integer value past int64)
        raise ValueError(f"{spec!r}: cannot read it ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:
        if str(spec) in str(exc):   # (already named)
            raise
        raise ValueError(f"{spec!r}: {exc}") from None


def _from_spec(spec):
    if not isinstance(spec, str) or not spec.strip():
        raise _bad(str(spec), "empty spec")
    spec = spec.strip()
    base, copies = spec, 1
    # A trailing '*K' replicates; only treat it so when K is an integer, so that odd
    # file names containing '*' still work.
    head, star, tail = spec.rpartition("*")
    if star:
        try:
            copies = int(tail)
        except ValueError:
            if not os.path.isfile(spec):
                raise _bad(spec, f"replication count {tail!r} is not an integer") from None
        else:
            if copies < 1:
                raise _bad(spec, "replication count must be >= 1")
            base = head.strip()

    if os.path.isfile(base) or base.endswith((".mtx", ".mtx.gz")):
        if os.path.isdir(base):
            raise _bad(spec, f"{base!r} is a directory, not a Matrix Market file")
        if not os.path.isfile(base):
            raise _bad(spec, f"no such file {base!r}")
        name, A = _matrix_stem(base), load_matrix(base)
    else:
        gen_name, _, params = base.partition(":")
        gen_name = gen_name.strip().lower()
        if gen_name not in _GENERATORS:
            raise _bad(spec, f"unknown generator {gen_name!r}")
        fn, fields, required = _GENERATORS[gen_name]
        values = [p.strip() for p in params.split(",")] if params.strip() else []
        form = _FORMS[gen_name]
        if not required <= len(values) <= len(fields):
            raise _bad(spec, f"{gen_name} takes {required} to {len(fields)} parameters, "
                             f"separated by commas ({form}); got {len(values)}")
        kwargs = {}
        for (key, kind), label, v in zip(fields, _labels(form), values):
            try:
                kwargs[key] = _number(v, kind)
            except ValueError:
                what = "an integer" if kind is int else "a finite number"
                hint = " (parameters are separated by commas)" if ":" in v else ""
                raise _bad(spec, f"{label} must be {what}, not {v!r}{hint}, in "
                                 f"{form}") from None
        try:
            A = fn(**kwargs)
        except ValueError as exc:
            raise _bad(spec, str(exc)) from None
        name = "-".join([gen_name] + values)

    if copies > 1:
        _check_copies_fit(A, copies)
        A = block_diagonal(A, copies)
        name = f"{name}x{copies}"
    return name, A
