"""The edge-case corpus every storage format must pass (ARCHITECTURE.md, Tests).

``CASES`` maps a case name to a function ``make(rng) -> matrix`` that draws fresh random
values from ``rng`` (a ``numpy.random.Generator``).  The matrix is a scipy.sparse matrix,
possibly non-canonical on purpose (unsorted column indices, duplicates, explicit zeros)
or a COO matrix with duplicates; scipy's own product on it is the reference.

``random_csr``, ``csr_from_row_lengths``, ``band`` and ``with_holes`` are the builders,
reusable by other tests.
"""

import numpy as np
import scipy.sparse as sp


def csr_from_row_lengths(rng, row_lengths, n_cols, *, values=None, shuffle=False):
    """A CSR matrix with ``row_lengths[i]`` distinct random columns in row ``i``
    (sorted unless ``shuffle``), values standard normal unless given.

    Vectorised over all non-zeros: row i draws L_i integers in [0, n_cols - L_i],
    sorts them and adds 0, 1, ..., L_i - 1, which makes them distinct and increasing."""
    row_lengths = np.asarray(row_lengths, dtype=np.int64)
    m = row_lengths.size
    if m and row_lengths.max(initial=0) > n_cols:
        raise ValueError("a row cannot hold more distinct columns than the matrix has")
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=indptr[1:])
    nnz = int(indptr[-1])
    row_of = np.repeat(np.arange(m, dtype=np.int64), row_lengths)
    position = np.arange(nnz, dtype=np.int64) - indptr[:-1][row_of]
    draws = rng.integers(0, n_cols - row_lengths[row_of] + 1) if nnz else row_of
    keys = np.sort(row_of * (n_cols + 1) + draws)
    indices = keys - row_of * (n_cols + 1) + position
    if shuffle and nnz:
        indices = indices[np.lexsort((rng.random(nnz), row_of))]
    data = rng.standard_normal(nnz) if values is None else np.asarray(values, dtype=np.float64)
    A = sp.csr_matrix((data, indices.astype(np.int32), indptr.astype(np.int32)),
                      shape=(m, n_cols))
    if shuffle:
        A.has_sorted_indices = False
    return A


def band(rng, n, half_width):
    """An n x n CSR band: the diagonals -half_width..half_width, random values."""
    offsets = list(range(-half_width, half_width + 1))
    return sp.diags([rng.standard_normal(n - abs(k)) for k in offsets], offsets,
                    format="csr")


def with_holes(rng, A, share):
    """A copy of ``A`` without about ``share`` of its entries (drawn at random)."""
    B = A.copy()
    B.data[rng.random(B.nnz) < share] = 0.0
    B.eliminate_zeros()
    return B


def banded_with_holes(rng, n=300):
    """A band of five diagonals with random holes and a run of empty rows: every format
    takes it (dia too), and it exercises padding, dummies and empty rows."""
    A = with_holes(rng, band(rng, n, 2), 0.3)
    return sp.vstack([A[:100], sp.csr_matrix((15, n)), A[115:]]).tocsr()


def few_wide_blocks(rng, rows=600, n=70_000):
    """csr-vector's escape (col_bits=16): row r's few columns lie within 110 of
    ``110 * r``, so that row blocks span less than 16 bits, but rows 0, 1, 300 and the
    last reach across the matrix: their blocks escape (32-bit columns in col_wide).
    Some rows are empty; values around 3 (half holds them)."""
    lengths = rng.integers(0, 6, rows)
    lengths[[2, 299, 301]] = 0
    cols = [110 * r + rng.choice(110, k, replace=False) for r, k in enumerate(lengths)]
    r_idx = np.concatenate([np.repeat(np.arange(rows), lengths), [0, 1, 300, rows - 1]])
    c_idx = np.concatenate([*cols, [n - 1, 5, n - 7, 0]])
    values = 3.0 * rng.standard_normal(r_idx.size)
    return sp.csr_matrix((values, (r_idx, c_idx)), shape=(rows, n))


def random_csr(rng, m, n, density):
    """Uniformly random CSR with standard-normal values."""
    return sp.random(m, n, density=density, format="csr", random_state=rng,
                     data_rvs=rng.standard_normal)


def _empty(m, n):
    return lambda rng: sp.csr_matrix((m, n), dtype=np.float64)


def _empty_rows(rng):
    m, n = 300, 170
    lengths = rng.integers(1, 12, m)
    lengths[:17] = 0                    # leading empty rows
    lengths[-23:] = 0                   # trailing empty rows
    lengths[100:163] = 0                # a long run in the middle
    lengths[200:202] = 0                # a short run
    lengths[rng.choice(np.arange(20, 270), 15, replace=False)] = 0  # scattered
    return csr_from_row_lengths(rng, lengths, n)


def _only_first_and_last_rows(rng):
    lengths = np.zeros(129, dtype=np.int64)
    lengths[0], lengths[-1] = 5, 40
    return csr_from_row_lengths(rng, lengths, 64)


def _one_long_row(rng):
    m, n = 600, 6000
    lengths = rng.integers(0, 6, m)
    lengths[237] = 5000
    return csr_from_row_lengths(rng, lengths, n)


def _long_first_and_last_rows(rng):
    m, n = 300, 2500
    lengths = rng.integers(0, 4, m)
    lengths[0] = 2500
    lengths[-1] = 1999
    return csr_from_row_lengths(rng, lengths, n)


def _all_equal_rows(length, m, n):
    return lambda rng: csr_from_row_lengths(rng, np.full(m, length), n)


def _one_by_one(rng):
    return sp.csr_matrix(rng.standard_normal((1, 1)))


def _one_by_one_empty(rng):
    return sp.csr_matrix((1, 1), dtype=np.float64)


def _dense(m, n):
    return lambda rng: sp.csr_matrix(rng.standard_normal((m, n)))


def _row_length_sweep(rng):
    """Rows of every length 0..130 (twice, shuffled): crosses every vector/tile size."""
    lengths = np.concatenate([np.arange(131), np.arange(131)])
    rng.shuffle(lengths)
    return csr_from_row_lengths(rng, lengths, 300)


def _power_law(rng):
    m, n = 2000, 1500
    lengths = np.minimum(np.floor(rng.pareto(1.2, m)).astype(np.int64), n)
    lengths[rng.choice(m, 3, replace=False)] = [n, 900, 700]
    return csr_from_row_lengths(rng, lengths, n)


def _unsorted_indices(rng):
    A = csr_from_row_lengths(rng, rng.integers(0, 40, 250), 120, shuffle=True)
    # Make sure the construction really is unsorted somewhere.
    indptr = A.indptr
    starts = np.zeros(A.nnz, dtype=bool)
    starts[indptr[:-1][indptr[:-1] < A.nnz]] = True
    assert np.any(np.diff(A.indices)[~starts[1:]] < 0)
    return A


def _unsorted_by_hand(rng):
    """A small CSR written out by hand: descending columns, a long reversed row."""
    indptr = np.array([0, 3, 3, 5, 5, 37, 38], dtype=np.int32)
    indices = np.concatenate([[7, 2, 5], [9, 0], np.arange(39, 7, -1), [3]]).astype(np.int32)
    data = rng.standard_normal(indices.size)
    A = sp.csr_matrix((data, indices, indptr), shape=(6, 40))
    A.has_sorted_indices = False
    return A


def _duplicates_csr(rng):
    """CSR with repeated columns inside rows (scipy sums them in its product)."""
    indptr = np.array([0, 4, 4, 9, 10, 16], dtype=np.int32)
    indices = np.array([3, 3, 1, 3,             # row 0: column 3 three times
                        0, 0, 0, 0, 0,          # row 2: column 0 five times
                        6,                      # row 3
                        5, 2, 5, 2, 5, 1],      # row 4: interleaved repeats
                       dtype=np.int32)
    data = rng.standard_normal(indices.size)
    A = sp.csr_matrix((data, indices, indptr), shape=(5, 8))
    A.has_canonical_format = False
    A.has_sorted_indices = False
    return A


def _duplicates_csr_large(rng):
    """A larger CSR where every row repeats some of its columns."""
    base = csr_from_row_lengths(rng, rng.integers(1, 30, 200), 50)
    rows = np.repeat(np.arange(200), np.diff(base.indptr))
    dup_rows = np.concatenate([rows, rows[::3]])
    dup_cols = np.concatenate([base.indices, base.indices[::3]])
    order = np.argsort(dup_rows, kind="stable")
    indptr = np.zeros(201, dtype=np.int32)
    np.cumsum(np.bincount(dup_rows, minlength=200), out=indptr[1:])
    A = sp.csr_matrix((rng.standard_normal(order.size), dup_cols[order].astype(np.int32),
                       indptr), shape=(200, 50))
    A.has_canonical_format = False
    return A


def _duplicates_coo(rng):
    """COO input with duplicate (row, column) pairs: they add up on conversion."""
    m, n, nnz = 90, 70, 700
    rows = rng.integers(0, m, nnz)
    cols = rng.integers(0, n, nnz)
    rows = np.concatenate([rows, rows[:200], rows[:50]])
    cols = np.concatenate([cols, cols[:200], cols[:50]])
    return sp.coo_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(m, n))


def _explicit_zeros(rng):
    A = csr_from_row_lengths(rng, rng.integers(0, 20, 150), 100)
    A.data[rng.random(A.nnz) < 0.3] = 0.0
    A.data[A.indptr[5]:A.indptr[6]] = 0.0  # one row of stored zeros only
    return A


def _nan_inf_in_matrix(rng):
    A = csr_from_row_lengths(rng, rng.integers(0, 16, 200), 90)
    nz_rows = np.flatnonzero(np.diff(A.indptr))
    specials = rng.choice(nz_rows, 40, replace=False)
    first = A.indptr[specials]
    A.data[first[:10]] = np.nan
    A.data[first[10:20]] = np.inf
    A.data[first[20:30]] = -np.inf
    # Rows holding both +inf and -inf (NaN result), where the row has room.
    for row in specials[30:]:
        lo, hi = A.indptr[row], A.indptr[row + 1]
        if hi - lo >= 2:
            A.data[lo], A.data[hi - 1] = np.inf, -np.inf
    return A


def _prime_nnz(nnz, m, n):
    def make(rng):
        flat = rng.choice(m * n, nnz, replace=False)
        A = sp.csr_matrix((rng.standard_normal(nnz), (flat // n, flat % n)), shape=(m, n))
        assert A.nnz == nnz
        return A
    return make


def _diagonal(rng):
    n = 1031
    return sp.csr_matrix(sp.diags(rng.standard_normal(n)))


CASES = {
    "0x0": _empty(0, 0),
    "m_x_0": _empty(7, 0),
    "large_m_x_0": _empty(1000, 0),
    "0_x_n": _empty(0, 9),
    "all_rows_empty": _empty(333, 41),
    "empty_rows": _empty_rows,
    "only_first_and_last_rows": _only_first_and_last_rows,
    "one_long_row": _one_long_row,
    "long_first_and_last_rows": _long_first_and_last_rows,
    "all_equal_rows_7": _all_equal_rows(7, 512, 300),
    "all_equal_rows_64": _all_equal_rows(64, 130, 200),
    "all_equal_rows_1": _all_equal_rows(1, 1000, 1000),
    "1x1": _one_by_one,
    "1x1_empty": _one_by_one_empty,
    "dense_1_x_3000": _dense(1, 3000),
    "dense_3000_x_1": _dense(3000, 1),
    "dense_33x33": _dense(33, 33),
    "tall_3000x7": lambda rng: random_csr(rng, 3000, 7, 0.4),
    "wide_7x3000": lambda rng: random_csr(rng, 7, 3000, 0.4),
    "row_length_sweep": _row_length_sweep,
    "power_law": _power_law,
    "unsorted_indices": _unsorted_indices,
    "unsorted_by_hand": _unsorted_by_hand,
    "duplicates_csr": _duplicates_csr,
    "duplicates_csr_large": _duplicates_csr_large,
    "duplicates_coo": _duplicates_coo,
    "explicit_zeros": _explicit_zeros,
    "nan_inf_in_matrix": _nan_inf_in_matrix,
    "prime_nnz_997": _prime_nnz(997, 101, 89),
    "prime_nnz_4099": _prime_nnz(4099, 257, 263),
    "diagonal_1031": _diagonal,
}


# ------------------------------------------------------------------------ comparison


def magnitudes(A):
    """|A| as a new canonical float64 CSR: duplicates add their magnitudes, so the error
    bound of ``assert_close`` is not shrunk by cancellation between duplicate entries."""
    C = sp.csr_matrix(A, dtype=np.float64, copy=True)
    C.data = np.abs(C.data)
    C.sum_duplicates()
    return C


def check_against_scipy(y, A, x, dtype, alpha=1.0, beta=0.0, y0=None):
    """``conftest.assert_close`` against ``conftest.reference``, on copies of ``A``.

    The conftest helpers wrap ``A`` with ``sp.csr_matrix(A, dtype=float64)``, which
    shares A's arrays, and ``abs()`` of that sums duplicates *in place*: a
    non-canonical ``A`` (duplicates) would be corrupted for the next use."""
    from conftest import assert_close, reference

    y_ref = reference(sp.csr_matrix(A, dtype=np.float64, copy=True), x, alpha, beta, y0)
    assert_close(y, y_ref, magnitudes(A), x, dtype)


def check_all(op, A, dtype, rng):
    """The operator against scipy: beta == 0 into a NaN-poisoned out, beta != 0,
    beta == 1 (accumulate), alpha == 0, and device-resident vectors."""
    import pyopencl.array as cla
    from conftest import poisoned

    m, n = A.shape
    x = rng.standard_normal(n)
    check_against_scipy(op.matvec(x, out=poisoned(m, dtype)), A, x, dtype)
    for alpha, beta in ((-1.5, 0.75), (2.0, 1.0), (0.0, -3.0)):
        y0 = rng.standard_normal(m).astype(dtype)
        y = op.matvec(x, out=y0.copy(), alpha=alpha, beta=beta)
        check_against_scipy(y, A, x, dtype, alpha, beta, y0)
    x = rng.standard_normal(n)
    x_d = cla.to_device(op.queue, x.astype(dtype))
    y_d = op.matvec(x_d, out=cla.to_device(op.queue, poisoned(m, dtype)), alpha=0.5)
    check_against_scipy(y_d.get(), A, x, dtype, 0.5)


def read_back(op, types=None, sizes=None):
    """The operator's device arrays as numpy arrays: ``values`` in the value type, the
    rest in the index type unless ``types`` names another; ``sizes`` trims arrays."""
    import pyopencl as cl

    impl = op._impl
    types = dict(types or {})
    out = {}
    for name, buf in impl.buffers.items():
        dtype = np.dtype(types.get(name, impl.dtype if name == "values" else impl.index_dtype))
        host = np.empty(buf.size // dtype.itemsize, dtype=dtype)
        cl.enqueue_copy(op.queue, host, buf)
        out[name] = host[:(sizes or {}).get(name, host.size)]
    return out


def check_then_update(op, A, rng):
    """op @ x against scipy (float64, NaN-poisoned out), then new values through
    update_values and the product again."""
    m, n = A.shape
    x = rng.standard_normal(n)
    check_against_scipy(op.matvec(x, out=np.full(m, np.nan, op.dtype)), A, x, op.dtype)
    new = rng.standard_normal(A.nnz)
    op.update_values(new)
    B = sp.csr_matrix((new, A.indices, A.indptr), shape=A.shape)
    check_against_scipy(op @ x, B, x, op.dtype)
