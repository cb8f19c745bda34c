"""host_arrays: np.repeat in pieces (so that a background thread lets others run)."""
import threading

import numpy as np
import pytest

from pyspmv_cl import host_arrays


@pytest.mark.parametrize("piece", [1, 3, 7, 1 << 20])
def test_repeat_matches_numpy(monkeypatch, piece):
    """Fresh random values and counts (zeros, one count longer than a piece): the same
    array as np.repeat, in the dtype asked for."""
    monkeypatch.setattr(host_arrays, "PIECE", piece)
    rng = np.random.default_rng()
    for _ in range(50):
        n = int(rng.integers(0, 60))
        counts = rng.integers(0, 6, size=n) * (rng.random(n) < 0.7)
        if n:
            counts[rng.integers(n)] = rng.integers(0, 40)
        values = rng.integers(-1000, 1000, size=n).astype(np.int32)
        got = host_arrays.repeat(values, counts, np.int64)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.repeat(values, counts))
        assert host_arrays.repeat(values, counts).dtype == np.int32


def test_entry_rows(monkeypatch):
    monkeypatch.setattr(host_arrays, "PIECE", 2)
    np.testing.assert_array_equal(host_arrays.entry_rows(np.array([0, 0, 3, 3, 5])),
                                  [1, 1, 1, 3, 3])
    assert host_arrays.entry_rows(np.array([0])).size == 0
    assert host_arrays.entry_rows(np.array([0, 4]), np.int32).dtype == np.int32


@pytest.mark.parametrize("n_rows, nnz", [(100_000, 3), (50_000, 0), (200_000, 40),
                                          (1000, 900), (3, 1)])
def test_entry_rows_of_hypersparse_rows(n_rows, nnz):
    """Far fewer entries than rows take the binary search; both ways agree with numpy's
    repeat, empty rows (at the ends too) and rows of several entries included."""
    rng = np.random.default_rng()
    counts = np.zeros(n_rows, dtype=np.int64)
    np.add.at(counts, rng.integers(0, n_rows, size=nnz), 1)
    if nnz:
        counts[-1] += 1   # an entry in the last row
    indptr = np.concatenate(([0], np.cumsum(counts)))
    for dtype in (np.int64, np.int32):
        got = host_arrays.entry_rows(indptr, dtype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, np.repeat(np.arange(n_rows), counts))


@pytest.mark.parametrize("piece", [1, 3, 1 << 20])
def test_add_in_pieces(monkeypatch, piece):
    """``out += addend`` piece by piece: the same sums as one numpy add, in place,
    lengths on and off a piece boundary (csr-vector's 16-bit columns read back)."""
    monkeypatch.setattr(host_arrays, "PIECE", piece)
    rng = np.random.default_rng()
    for n in (0, 1, 6, 7, 50):
        out = rng.integers(-1000, 1000, size=n).astype(np.int32)
        addend = rng.integers(0, 65536, size=n).astype(np.uint16)
        want = out.astype(np.int64) + addend
        got = host_arrays.add_in_pieces(out, addend)
        assert got is out and got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_repeat_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        host_arrays.repeat(np.arange(3), np.ones(2, dtype=np.int64))


def test_background_threads_yield_between_pieces(monkeypatch):
    """Off the main thread every piece ends with a sleep (the GIL's hand-over); on the
    main thread none."""
    monkeypatch.setattr(host_arrays, "PIECE", 4)
    sleeps = []
    monkeypatch.setattr(host_arrays.time, "sleep", sleeps.append)
    values, counts = np.arange(10), np.full(10, 2)   # 20 entries: 5 pieces
    host_arrays.repeat(values, counts)
    assert sleeps == []
    out = []
    worker = threading.Thread(target=lambda: out.append(host_arrays.repeat(values, counts)))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(out[0], np.repeat(values, counts))
    assert sleeps == [host_arrays.YIELD_SECONDS] * 5


@pytest.mark.parametrize("piece", [1, 3, 1 << 20])
def test_entry_offsets_and_the_passes_built_on_them(monkeypatch, piece):
    """``entry_offsets`` in pieces: column - row of every entry, in order, rows whole
    (empty rows and a row longer than a piece included); the diagonal count (both of
    its ways) and the bandwidth built on it agree with a direct computation on fresh
    random matrices."""
    import scipy.sparse as sp

    from pyspmv_cl.features import MatrixFeatures, bandwidth

    monkeypatch.setattr(host_arrays, "PIECE", piece)
    rng = np.random.default_rng()
    for shape, density in (((40, 30), 0.2), ((7, 500), 0.3), ((1, 50), 0.9),
                           ((30, 30), 0.0), ((5000, 5000), 0.00005)):
        A = sp.random(*shape, density=density, format="csr", random_state=rng)
        pieces = list(host_arrays.entry_offsets(A.indptr, A.indices))
        rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
        expected = A.indices.astype(np.int64) - rows
        got = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
        np.testing.assert_array_equal(got, expected)
        assert all(p.dtype == np.int64 and p.size for p in pieces)
        assert bandwidth(A) == (int(np.abs(expected).max()) if A.nnz else 0)
        features = MatrixFeatures.from_csr(A, count_diagonals=False)
        # regular enough rows for the count; the 5000 x 5000 one takes the unique branch
        features = features.__class__(**{**features.__dict__, "std_row_length": 0.0,
                                         "max_row_length": 1})
        if A.nnz:
            assert features.with_diagonals(A).diagonals == np.unique(expected).size


@pytest.mark.parametrize("parallel_min", [1, 5, 1 << 21])
def test_cast_matches_astype(monkeypatch, parallel_min):
    """``cast`` gives astype's values in the dtype asked for, C-contiguous, split over
    threads or not (``PARALLEL_MIN``), from contiguous and strided inputs; an array
    already in the dtype comes back as itself."""
    monkeypatch.setattr(host_arrays, "PARALLEL_MIN", parallel_min)
    rng = np.random.default_rng()
    for n in (0, 1, 7, 1000):
        doubles = rng.standard_normal(2 * n) * 1e3
        for src, dtype in ((doubles, np.float32), (doubles[::2], np.float32),
                           (rng.integers(-2**40, 2**40, size=n), np.int32),
                           (rng.integers(0, 1000, size=n).astype(np.int32), np.int64),
                           (doubles[:n] + 1j * doubles[n:], np.complex64)):
            got = host_arrays.cast(src, dtype)
            assert got.dtype == np.dtype(dtype) and got.flags.c_contiguous
            np.testing.assert_array_equal(got, src.astype(dtype))
    same = rng.standard_normal(100)
    assert host_arrays.cast(same, np.float64) is same


@pytest.mark.parametrize("parallel_min", [1, 4, 1 << 21])
def test_min_max_matches_numpy(monkeypatch, parallel_min):
    """``min_max`` of fresh random arrays (the extremes anywhere, one element, a
    strided view) equals numpy's min and max."""
    monkeypatch.setattr(host_arrays, "PARALLEL_MIN", parallel_min)
    rng = np.random.default_rng()
    for n in (1, 2, 9, 1001):
        values = rng.integers(-10**6, 10**6, size=n).astype(np.int32)
        for arr in (values, values[::3]):
            assert host_arrays.min_max(arr) == (arr.min(), arr.max())


def test_has_canonical_format_checks_the_arrays(rng):
    """Against a row-by-row check: sorted rows, a duplicate, an unsorted row, empty
    rows at the ends, and a row start at a drop."""
    import scipy.sparse as sp

    from pyspmv_cl.host_arrays import has_canonical_format
    for trial in range(40):
        A = sp.random(12, 9, density=0.3, format="csr", random_state=trial)
        A.sort_indices()
        if trial % 4 == 1 and A.nnz > 2:
            k = int(rng.integers(1, A.nnz))
            A.indices[k] = A.indices[k - 1]   # a duplicate, or a drop at a row start
        elif trial % 4 == 2 and A.nnz > 2:
            A.indices[:] = A.indices[::-1]
        rows = zip(A.indptr[:-1], A.indptr[1:])
        want = all(np.all(np.diff(A.indices[a:b]) > 0) for a, b in rows)
        assert has_canonical_format(A) == want, trial
    assert has_canonical_format(sp.csr_matrix((3, 3)))
