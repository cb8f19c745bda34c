"""Tests for pyspmv_cl.bench.generators: structure, canonical CSR, spec parsing, file loading."""

import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from pyspmv_cl.bench import generators as g

MATRICES = Path(__file__).resolve().parents[2] / "shared" / "matrices"


def assert_canonical(A, dtype=np.float64):
    """csr_matrix of the given dtype with strictly increasing columns in every row."""
    assert isinstance(A, sp.csr_matrix)
    assert A.dtype == dtype
    assert A.nnz > 0
    assert A.indptr[0] == 0 and A.indptr[-1] == A.nnz == A.indices.size == A.data.size
    assert np.all(np.diff(A.indptr) >= 0)
    assert A.indices.min() >= 0 and A.indices.max() < A.shape[1]
    # Within a row, consecutive columns must increase strictly (sorted, no repeats).
    steps = np.diff(A.indices.astype(np.int64))
    starts = np.zeros(A.nnz, dtype=bool)
    starts[A.indptr[:-1][A.indptr[:-1] < A.nnz]] = True
    assert np.all(steps[~starts[1:]] > 0)
    assert A.has_canonical_format
    B = A.copy()
    B.sum_duplicates()
    assert B.nnz == A.nnz


def laplacian_1d(n):
    return sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))


def row_lengths(A):
    return np.diff(A.indptr)


# ----------------------------------------------------------------------------- generators


def test_poisson2d_matches_kronsum():
    n = 6
    A = g.poisson2d(n)
    assert_canonical(A)
    assert A.shape == (n * n, n * n)
    assert A.nnz == 5 * n * n - 4 * n  # each grid edge drops one neighbour
    assert (A != A.T).nnz == 0
    np.testing.assert_array_equal(A.diagonal(), 4.0)
    assert set(np.unique(A.data)) == {-1.0, 4.0}
    ref = sp.kronsum(laplacian_1d(n), laplacian_1d(n)).tocsr()
    assert abs(A - ref).max() == 0


def test_poisson3d_matches_kronsum():
    n = 4
    A = g.poisson3d(n)
    assert_canonical(A)
    assert A.shape == (n**3, n**3)
    assert A.nnz == 7 * n**3 - 6 * n**2
    assert (A != A.T).nnz == 0
    np.testing.assert_array_equal(A.diagonal(), 6.0)
    T = laplacian_1d(n)
    ref = sp.kronsum(sp.kronsum(T, T), T).tocsr()
    assert abs(A - ref).max() == 0


def test_poisson_single_point():
    A = g.poisson2d(1)
    assert A.shape == (1, 1) and A.toarray()[0, 0] == 4.0


def test_random_uniform():
    A = g.random_uniform(500, 300, nnz_per_row=7, seed=3)
    assert_canonical(A)
    assert A.shape == (500, 300)
    lengths = row_lengths(A)
    assert lengths.max() <= 7 and lengths.mean() > 6.5
    assert np.all((A.data >= -1.0) & (A.data < 1.0))
    # Reproducible per seed, different across seeds.
    B = g.random_uniform(500, 300, nnz_per_row=7, seed=3)
    assert abs(A - B).max() == 0
    C = g.random_uniform(500, 300, nnz_per_row=7, seed=4)
    assert abs(A - C).max() > 0
    assert g.random_uniform(50).shape == (50, 50)


def test_power_law_has_long_rows():
    A = g.power_law(5000, avg_degree=8, seed=0)
    assert_canonical(A)
    assert A.shape == (5000, 5000)
    lengths = row_lengths(A)
    assert 6 <= lengths.mean() <= 9
    assert lengths.max() > 50 * lengths.mean()
    assert lengths.min() >= 1
    # Most rows are short: the median sits well below the mean.
    assert np.median(lengths) < lengths.mean()


def test_rmat_is_skewed():
    scale, ef = 10, 8
    A = g.rmat(scale, ef, seed=1)
    assert_canonical(A)
    assert A.shape == (1 << scale, 1 << scale)
    assert 0.5 * ef * (1 << scale) < A.nnz <= ef * (1 << scale)
    lengths = row_lengths(A)
    assert lengths.max() > 10 * lengths.mean()
    # a > d puts more edges in low-numbered rows than high-numbered ones.
    half = 1 << (scale - 1)
    assert lengths[:half].sum() > lengths[half:].sum()
    with pytest.raises(ValueError):
        g.rmat(4, a=0.6, b=0.3, c=0.3)


def test_banded():
    n, bw = 50, 3
    A = g.banded(n, bandwidth=bw, seed=2)
    assert_canonical(A)
    assert A.shape == (n, n)
    assert A.nnz == n * (2 * bw + 1) - bw * (bw + 1)
    rows = np.repeat(np.arange(n), row_lengths(A))
    assert np.all(np.abs(rows - A.indices) <= bw)
    assert g.banded(10, bandwidth=0).nnz == 10


def test_dense_rows():
    n = 1000
    A = g.dense_rows(n, n_dense=3, nnz_per_row=5, seed=0)
    assert_canonical(A)
    lengths = row_lengths(A)
    assert np.sum(lengths == n) == 3
    assert np.sort(lengths)[-4] <= 5
    half = row_lengths(g.dense_rows(n, n_dense=2, dense_fraction=0.5, seed=1))
    top = np.sort(half)[-2:]
    assert np.all((top > 0.4 * n) & (top < 0.6 * n))


def test_block_diagonal_equals_kron():
    A = g.random_uniform(7, 5, nnz_per_row=3, seed=9)
    B = g.block_diagonal(A, 4)
    assert_canonical(B)
    assert B.shape == (28, 20)
    ref = sp.kron(sp.identity(4), A, format="csr")
    assert abs(B - ref).max() == 0
    assert abs(g.block_diagonal(A, 1) - A).max() == 0
    with pytest.raises(ValueError):
        g.block_diagonal(A, 0)


def test_poisson2d_large_is_fast():
    # The brief's scale target: 4M rows / 20M nnz in a few seconds.
    import time

    t0 = time.perf_counter()
    A = g.poisson2d(2000)
    assert time.perf_counter() - t0 < 15
    assert A.shape == (4_000_000, 4_000_000) and A.nnz == 5 * 4_000_000 - 8000
    assert A.indices.dtype == np.int32


# ----------------------------------------------------------------------------- files


def write_mtx(path, M, **kw):
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            scipy.io.mmwrite(f, M, **kw)
    else:
        scipy.io.mmwrite(str(path), M, **kw)


@pytest.mark.parametrize("name", ["m.mtx", "m.mtx.gz"])
def test_load_matrix_real_roundtrip(tmp_path, name):
    A = g.random_uniform(40, 30, nnz_per_row=4, seed=5)
    write_mtx(tmp_path / name, A)
    B = g.load_matrix(tmp_path / name)
    assert_canonical(B)
    assert abs(A - B).max() < 1e-12


def test_load_matrix_pattern_integer_complex(tmp_path):
    P = sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0]]))
    write_mtx(tmp_path / "p.mtx", P, field="pattern")
    B = g.load_matrix(tmp_path / "p.mtx")
    assert_canonical(B)
    np.testing.assert_array_equal(B.toarray(), P.toarray().astype(float))

    write_mtx(tmp_path / "i.mtx.gz", P * 3, field="integer")
    C = g.load_matrix(str(tmp_path / "i.mtx.gz"))
    assert C.dtype == np.float64 and C.toarray()[0, 2] == 3.0

    Z = sp.csr_matrix(np.array([[1 + 2j, 0], [0, 3j]]))
    write_mtx(tmp_path / "z.mtx", Z)
    D = g.load_matrix(tmp_path / "z.mtx")
    assert D.dtype.kind == "c"
    np.testing.assert_array_equal(D.toarray(), Z.toarray())


def test_load_matrix_symmetric_is_expanded(tmp_path):
    S = sp.csr_matrix(np.array([[2.0, 1.0], [1.0, 3.0]]))
    write_mtx(tmp_path / "s.mtx", S, symmetry="symmetric")
    np.testing.assert_array_equal(g.load_matrix(tmp_path / "s.mtx").toarray(), S.toarray())


def test_load_shared_1138_bus():
    path = MATRICES / "1138_bus.mtx.gz"
    if not path.exists():
        pytest.skip(f"{path} not present")
    A = g.load_matrix(path)
    assert_canonical(A)
    assert A.shape == (1138, 1138)
    assert A.nnz == 4054  # 2596 stored entries of a symmetric matrix, expanded
    assert abs(A - A.T).max() == 0


# ----------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    ("spec", "name", "shape"),
    [
        ("poisson2d:10", "poisson2d-10", (100, 100)),
        ("poisson3d:5", "poisson3d-5", (125, 125)),
        ("random:200,5", "random-200-5", (200, 200)),
        ("random:200", "random-200", (200, 200)),
        ("powerlaw:1000,8", "powerlaw-1000-8", (1000, 1000)),
        ("powerlaw:1000,8,2.5", "powerlaw-1000-8-2.5", (1000, 1000)),
        ("rmat:8,4", "rmat-8-4", (256, 256)),
        ("banded:100,2", "banded-100-2", (100, 100)),
        ("denserows:200,2", "denserows-200-2", (200, 200)),
        ("poisson2d:10*3", "poisson2d-10x3", (300, 300)),
        (" Poisson2D:4 ", "poisson2d-4", (16, 16)),
    ],
)
def test_from_spec_generators(spec, name, shape):
    got_name, A = g.from_spec(spec)
    assert got_name == name
    assert A.shape == shape
    assert_canonical(A)


def test_from_spec_parameters_reach_generator():
    _, A = g.from_spec("random:300,4")
    assert row_lengths(A).max() <= 4
    _, B = g.from_spec("banded:100,2")
    assert abs(B - g.banded(100, 2)).max() == 0
    _, C = g.from_spec("denserows:200,2")
    assert np.sum(row_lengths(C) == 200) == 2


def test_from_spec_files(tmp_path):
    A = g.random_uniform(20, 20, nnz_per_row=3, seed=1)
    write_mtx(tmp_path / "foo.mtx.gz", A)
    write_mtx(tmp_path / "bar.mtx", A)
    name, B = g.from_spec(str(tmp_path / "foo.mtx.gz"))
    assert name == "foo" and abs(A - B).max() < 1e-12
    name, C = g.from_spec(str(tmp_path / "bar.mtx") + "*8")
    assert name == "barx8" and C.shape == (160, 160)
    assert abs(C - sp.kron(sp.identity(8), A)).max() < 1e-12
    # Any existing file is read as Matrix Market, whatever its suffix.
    write_mtx(tmp_path / "plain.mtx", A)
    (tmp_path / "plain.mtx").rename(tmp_path / "plain.txt")
    name, D = g.from_spec(str(tmp_path / "plain.txt"))
    assert name == "plain.txt" and D.nnz == A.nnz


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "nosuch:5",
        "poisson2d",
        "poisson2d:",
        "poisson2d:abc",
        "poisson2d:1.5",
        "poisson2d:10,2",
        "poisson2d:10*0",
        "poisson2d:10*x",
        "poisson2d:0",
        "rmat:4,4,4",
        "missing_file.mtx",
        "missing_file.mtx.gz*2",
    ],
)
def test_from_spec_rejects(spec):
    with pytest.raises(ValueError) as info:
        g.from_spec(spec)
    message = str(info.value)
    for generator in ("poisson2d", "poisson3d", "random", "powerlaw", "rmat", "banded",
                      "denserows"):
        assert generator in message


@pytest.mark.parametrize("spec, says", [
    ("poisson2d:abc", "N must be an integer, not 'abc', in poisson2d:N"),
    ("random:2.5", "ROWS must be an integer, not '2.5', in random:ROWS[,NNZ_PER_ROW]"),
    ("random:5,x", "NNZ_PER_ROW must be an integer, not 'x'"),
    ("powerlaw:100,nan", "AVG must be a finite number, not 'nan'"),
    ("banded:10:2", "N must be an integer, not '10:2' (parameters are separated by commas)"),
    ("denserows", "denserows takes 1 to 3 parameters, separated by commas "
                  "(denserows:N[,N_DENSE[,NNZ_PER_ROW]]); got 0"),
    ("rmat:4,4,4", "rmat takes 1 to 2 parameters"),
    ("denserows:10,20", "N_DENSE must lie in 0..N (N=10), not 20"),
])
def test_from_spec_names_the_bad_parameter(spec, says):
    """A bad parameter is named as the help writes it, with the generator's form (it
    was numpy's "could not convert string to float")."""
    with pytest.raises(ValueError) as info:
        g.from_spec(spec)
    assert f"bad matrix spec {spec!r}: {says}" in str(info.value)


def test_every_generator_form_names_its_parameters():
    for name, (_, fields, required) in g._GENERATORS.items():
        form = g._FORMS[name]
        assert len(g._labels(form)) == len(fields), name
        assert len(g._labels(form.partition("[")[0])) == required, name


def test_generator_help_lists_everything():
    for word in ("poisson2d:N", "poisson3d:N", "random:ROWS", "powerlaw:N", "rmat:SCALE",
                 "banded:N", "denserows:N", ".mtx.gz", "*K"):
        assert word in g.GENERATOR_HELP


# ------------------------------------------------------------------- row blocks


def test_poisson3d_rows_are_slices_of_the_global_matrix():
    from pyspmv_cl.bench.row_blocks import poisson3d_rows
    A = g.poisson3d(9)
    for start, stop in ((0, 729), (0, 100), (100, 101), (350, 729), (5, 5)):
        B = poisson3d_rows(9, start, stop)
        assert B.shape == (stop - start, 729)
        assert (B != A[start:stop]).nnz == 0
    with pytest.raises(ValueError):
        poisson3d_rows(9, 10, 800)


def test_power_law_rows_do_not_depend_on_the_split():
    import scipy.sparse as sp

    from pyspmv_cl.bench.row_blocks import power_law_rows
    n = 30_000
    whole = power_law_rows(n, 0, n, avg_degree=12, seed=5)
    cut = sp.vstack([power_law_rows(n, a, b, avg_degree=12, seed=5)
                     for a, b in ((0, 7), (7, 12_345), (12_345, n))]).tocsr()
    for name in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(whole, name), getattr(cut, name))
    other_seed = power_law_rows(n, 0, n, avg_degree=12, seed=6)
    assert not np.array_equal(whole.indices, other_seed.indices)
    assert whole.indices.min() >= 0 and whole.indices.max() < n
    assert -1 <= whole.data.min() and whole.data.max() < 1


def test_power_law_rows_have_power_law_rows_and_columns():
    from pyspmv_cl.bench.row_blocks import power_law_rows
    n = 50_000
    A = power_law_rows(n, 0, n, avg_degree=16, exponent=2.2)
    lengths = np.diff(A.indptr)
    assert 14 < lengths.mean() < 18                       # close to avg_degree
    assert lengths.max() > 100 * np.median(lengths)       # hubs
    popularity = np.bincount(A.indices, minlength=n)
    assert popularity.max() > 100 * max(np.median(popularity), 1)
    # Hubs are scrambled over the index range, not all in the first rows/columns.
    top = np.argsort(lengths)[-50:]
    assert top.min() < n / 2 < top.max()
    with pytest.raises(ValueError):
        power_law_rows(n, 0, n, exponent=2.0)


def test_replicate_to_and_resolve_name(tmp_path, monkeypatch):
    A = g.poisson2d(4)                       # 16 rows, 64 non-zeros
    label, B = g.replicate_to("p", A, 200)
    assert label == "p x4" and B.nnz == 4 * A.nnz
    assert (B != g.block_diagonal(A, 4)).nnz == 0
    assert g.replicate_to("p", A, 50, sep="x") == ("p", A)   # one copy is enough
    assert g.replicate_to("p", A, 0)[1] is A
    empty = sp.csr_matrix((3, 3))
    assert g.replicate_to("e", empty, 100)[1] is empty
    (tmp_path / "mine.mtx.gz").write_bytes(b"")
    monkeypatch.setenv("PYSPMV_CL_MATRIX_DIR", str(tmp_path))
    assert g.resolve_name("mine", "/nowhere") == str(tmp_path / "mine.mtx.gz")
    assert g.resolve_name("other", "/nowhere") == "other"
    assert g.resolve_name("poisson2d:10", "/nowhere") == "poisson2d:10"
    monkeypatch.delenv("PYSPMV_CL_MATRIX_DIR")
    assert g.resolve_name("mine", tmp_path) == str(tmp_path / "mine.mtx.gz")


@pytest.mark.parametrize("suffix", [".mtx", ".mtx.gz"])
def test_a_header_too_large_for_memory_is_refused_before_reading(tmp_path, suffix):
    """A header of 1e12 rows (one entry): refused from the header with the memory it
    would need, instead of allocating until the kernel kills the process."""
    import gzip

    text = b"%%MatrixMarket matrix coordinate real general\n1000000000000 3 1\n1 1 1.0\n"
    path = tmp_path / f"huge{suffix}"
    path.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    with pytest.raises(ValueError, match="too large to build in this machine's memory "
                                         r"\(1000000000000 x 3 with 1 entries needs"):
        g.from_spec(str(path))
