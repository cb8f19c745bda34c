"""pyspmv_cl.distributed under ``mpiexec -n 2`` and ``-n 4`` (tests/mpi_driver.py),
compared with scipy in float64 with the project's tolerance helpers.

One launch per rank count runs every case (starting ranks and compiling kernels is
most of the time); each test below checks one case of its output.  Skipped when
mpi4py or mpiexec is missing, except when CI is set: then they fail.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from conftest import assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl.bench import generators

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "mpi_driver.py"
TIMEOUT = 150      # seconds per launch: a hang fails instead of blocking the run


def _mpiexec():
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _missing():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'pyspmv-cl[mpi]')"
    if _mpiexec() is None:
        return "no mpiexec found (pip install 'pyspmv-cl[mpi]' brings MPICH's)"
    return None


MISSING = _missing()
if MISSING and not os.environ.get("CI"):
    pytestmark = pytest.mark.skip(reason=MISSING)


CASES = ["random", "banded", "power_law", "no_ghosts_on_rank0", "more_ranks_than_rows",
         "all_rows_on_rank0", "all_rows_on_last_rank", "rect_wide", "rect_tall",
         "rect_rows_on_rank0",
         "float32", "after_errors"]
ERRORS = {"shapes_differ": "different global shapes", "rows_overlap": "must tile",
          "rows_missing": "must tile", "bad_block_on_last_rank": "has 7 columns",
          "bad_partition": "from_global refused on root 0",
          "metis_not_square": "needs a square matrix",
          "metis_col_range": "col_range cannot be given",
          "complex_dtype": "float32 and float64 only",
          "complex_matrix": "the matrix is complex",
          "tuple_of_two_on_last_rank": "A_local as a tuple must be (data, indices, indptr)"}


_RUNS = {}


def run_driver(nranks, tmp_path_factory):
    if MISSING:    # only with CI set (else the module is skipped)
        pytest.fail(f"CI is set but the MPI tests cannot run: {MISSING}")
    if nranks in _RUNS:
        return _RUNS[nranks]
    out = tmp_path_factory.mktemp(f"mpi{nranks}")
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT="1",
               # The ranks import the package this test imported (checkout or install).
               PYTHONPATH=os.pathsep.join(filter(None, [
                   str(Path(psc.__file__).resolve().parents[1]),
                   os.environ.get("PYTHONPATH")])))
    selected = os.environ.get("PYSPMV_CL_TEST_DEVICES")
    if selected:
        env["PYSPMV_CL_MPI_DEVICE"] = selected.split(",")[0]
    try:
        run = subprocess.run([_mpiexec(), "-n", str(nranks), sys.executable, str(DRIVER),
                              str(out)], env=env, capture_output=True, text=True,
                             timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec -n {nranks} hung (no result in {TIMEOUT} s): "
                    f"{(exc.stderr or b'')[-3000:]}")
    assert run.returncode == 0, (f"mpiexec -n {nranks} failed ({run.returncode}):\n"
                                 f"{run.stdout[-3000:]}\n{run.stderr[-6000:]}")
    summary = json.loads((out / "summary.json").read_text())
    _RUNS[nranks] = (out, summary)
    return _RUNS[nranks]


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4"])
def mpi_run(request, tmp_path_factory):
    return run_driver(request.param, tmp_path_factory)


def load(out, name):
    f = np.load(out / f"{name}.npz")
    A = sp.csr_matrix((f["data"], f["indices"], f["indptr"]), shape=tuple(f["shape"]))
    return A, f


@pytest.mark.parametrize("case", CASES)
def test_products_match_scipy(mpi_run, case):
    out, summary = mpi_run
    A, f = load(out, case)
    dtype = np.dtype(str(f["dtype"]))
    x, y0 = f["x"], f["y0"]
    assert_close(f["y"], reference(A, x), A, x, dtype)
    assert_close(f["y_ab"], reference(A, x, 2.0, -0.5, y0), A, x, dtype)
    assert_close(f["y_dev"], reference(A, x), A, x, dtype)
    ranks = summary["products"][case]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(summary["size"]))
    # Contiguous row blocks covering the matrix.
    assert ranks[0]["rows"][0] == 0 and ranks[-1]["rows"][1] == A.shape[0]
    assert all(a["rows"][1] == b["rows"][0] for a, b in zip(ranks, ranks[1:]))
    assert all(r["y_dtype"] == "float64" for r in ranks)   # numpy's promotion


def test_contiguous_sends_are_copied_without_a_gather(mpi_run):
    """Row slabs of a banded matrix send a few contiguous runs of x: those go by plain
    copies (checked right in test_products_match_scipy's y_dev); the scattered sends
    of a random matrix by the gather kernel."""
    _, summary = mpi_run
    banded = summary["products"]["banded"]["ranks"]
    assert all(r["send_copies"] in (1, 2) for r in banded if r["send"])
    assert any(r["send"] for r in banded)
    assert all(r["send_copies"] == 0 for r in summary["products"]["random"]["ranks"])


@pytest.mark.parametrize("case", CASES)
def test_transposed_products_match_scipy(mpi_run, case):
    """op.rmatvec / op.T @ y (the exchange in reverse) against scipy's A.T @ y."""
    out, summary = mpi_run
    A, f = load(out, case)
    dtype = np.dtype(str(f["dtype"]))
    At = sp.csr_matrix(A.T)
    yt, x0 = f["yt"], f["x0"]
    for key in ("xt", "xt_poison", "xt_dev", "xt_dev_poison"):
        assert_close(f[key], reference(At, yt), At, yt, dtype)
    assert_close(f["xt_ab"], reference(At, yt, 2.0, -0.5, x0), At, yt, dtype)
    assert_close(f["xt_dev_ab"], reference(At, yt, -1.5, 0.25, x0), At, yt, dtype)
    ranks = summary["products"][case]["ranks"]
    assert all(r["xt_dtype"] == "float64" for r in ranks)   # numpy's promotion
    assert all(r["view_layout"] for r in ranks)


def test_layout_cases(mpi_run):
    out, summary = mpi_run
    p = summary["products"]
    size = summary["size"]
    first = p["no_ghosts_on_rank0"]["ranks"][0]
    assert first["ghosts"] == 0 and first["send"] > 0
    assert any(r["rows"][0] == r["rows"][1] for r in p["more_ranks_than_rows"]["ranks"])
    assert p["all_rows_on_rank0"]["ranks"][0]["rows"] == [0, 60]
    assert p["all_rows_on_last_rank"]["ranks"][-1]["rows"] == [0, 60]
    assert all(r["ghosts"] == 0 for r in p["all_rows_on_rank0"]["ranks"][1:])
    assert all(r["rows"] == [40, 40] and r["send"] > 0
               for r in p["rect_rows_on_rank0"]["ranks"][1:])
    assert "balance (max/mean)" in p["random"]["describe"]
    assert len(p["random"]["describe"].splitlines()) == size + 3
    t = p["random"]["timings"]
    assert set(t) >= {"pack", "exchange", "local", "offdiag", "total", "hidden"}
    assert 0 <= t["hidden"] <= t["total"]
    t = p["random"]["rtimings"]
    assert set(t) >= {"offdiag", "exchange", "local", "unpack", "total", "hidden"}
    assert 0 <= t["hidden"] <= t["total"]


def test_node_local_devices(mpi_run):
    """Without PYSPMV_CL_TEST_DEVICES: rank r (all on one node) gets device r modulo
    the node's devices of the default kind."""
    if os.environ.get("PYSPMV_CL_TEST_DEVICES"):
        pytest.skip("PYSPMV_CL_TEST_DEVICES pins the ranks to one device")
    out, summary = mpi_run
    found = psc.devices()
    kind = "gpu" if any(d.profile.device_type == "gpu" for d in found) else "cpu"
    same_kind = [d.id for d in found if d.profile.device_type == kind]
    got = [r["device"] for r in summary["products"]["random"]["ranks"]]
    assert got == [same_kind[r % len(same_kind)] for r in range(summary["size"])]


def test_a_refused_product_leaves_no_rank_waiting(mpi_run):
    """A rank refusing its vector still exchanges (with a refusal flag): it raises its
    own error, its neighbours name it, the others finish, and the next product on
    every rank is right (the driver's timeout turns a hang into a failure)."""
    out, summary = mpi_run
    refused = summary["refused"]
    bad = refused["bad"]
    own = {"device_complex": ("UnsupportedDtypeError", "x is complex")}
    for r, (outcome, nbrs) in enumerate(zip(refused["outcomes"], refused["neighbours"])):
        assert set(outcome) == {"matvec", "rmatvec", "device", "device_complex"}
        for name, message in outcome.items():
            if r == bad:
                kind, text = own.get(name, ("InvalidInputError", "shape"))
                assert message.startswith(kind) and text in message, (name, message)
            elif bad in nbrs:
                assert message.startswith("DistributedInputError"), (r, name, message)
                assert f"rank {bad}" in message and "refused" in message
            else:
                assert message is None, (r, name, message)
    assert any(bad in nbrs for nbrs in refused["neighbours"][:bad])
    data = np.load(out / "refused.npz")
    band = generators.banded(400, 7, seed=2)
    assert_close(data["y"], reference(band, data["x"]), band, data["x"], np.float64)


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_input_same_error_on_every_rank(mpi_run, case):
    _, summary = mpi_run
    messages = summary["errors"][case]
    assert len(messages) == summary["size"]
    assert messages[0] is not None and ERRORS[case] in messages[0], messages
    assert len(set(messages)) == 1, messages


def test_misuse_refused_with_clear_errors(mpi_run):
    _, summary = mpi_run
    expected = {"matvec32_alpha_huge": ("InvalidInputError", "outside float32's range"),
                "rmatvec32_beta_tiny": ("InvalidInputError", "would round to 0 in float32"),
                "cg_M_array": ("DistributedInputError", "M must be None or 'jacobi'"),
                "cg_maxiter_zero": ("DistributedInputError", "maxiter must be None or an "
                                                             "integer >= 1, not 0"),
                "cg_tol_string": ("DistributedInputError", "tol must be a number, not str"),
                "cg_tol_nan": ("DistributedInputError", "tol must be finite"),
                "cg_maxiter_differs": ("DistributedInputError", "the ranks give different "
                                                                "(tol, atol, maxiter, M)"),
                "from_global_bad_root": ("InvalidInputError", "root must be a rank"),
                "matvec_after_free": ("InvalidInputError", "was freed"),
                "rmatvec_after_free": ("InvalidInputError", "was freed"),
                "gather_after_free": ("InvalidInputError", "was freed"),
                "fresh_T_after_free": ("InvalidInputError", "was freed"),
                "cg_after_free": ("InvalidInputError", "was freed"),
                "cg_T_after_free": ("InvalidInputError", "was freed"),
                "matvec_sparse_x": ("InvalidTypeError", "x_local must be a dense vector"),
                "matvec_none_x": ("InvalidTypeError", "x_local must be a dense vector"),
                "matvec_device_x_host_out": ("InvalidTypeError", "out must be a pyopencl"),
                "cg_complex_b": ("DistributedInputError", "b_local is complex"),
                "matvec_alpha_string": ("InvalidTypeError", "alpha must be a real number"),
                "matvec_complex_x": ("UnsupportedDtypeError",
                                     "x is complex (complex128): the distributed operator"),
                "matvec_beta_none": ("InvalidTypeError", "beta must be a real number"),
                "rmatvec_alpha_string": ("InvalidTypeError", "alpha must be a real number")}
    for outcomes, ok in summary["misuse"]:
        assert ok
        for name, (kind, text) in expected.items():
            message = outcomes[name]
            assert message is not None and message.startswith(kind) and text in message, \
                (name, message)


@pytest.mark.parametrize("M", ["None", "jacobi"])
def test_cg_converges_to_scipy_and_one_rank(mpi_run, M):
    out, summary = mpi_run
    A, f = load(out, "cg")
    b = f["b"]
    exact = spla.spsolve(A.tocsc(), b)
    res = summary["cg"][M]
    assert res["info"] == 0 and res["info_dev"] == 0 and res["info_one_rank"] == 0
    assert res["info_transposed"] == 0   # cg on op.T (A is symmetric), Jacobi included
    assert summary["cg"]["indefinite_info"] == -1
    scale = np.abs(exact).max()
    for key in ("x", "x_dev", "x_one_rank", "x_transposed"):
        assert np.abs(np.array(res[key]) - exact).max() <= 1e-8 * scale, key
    assert np.abs(np.array(res["x"]) - np.array(res["x_one_rank"])).max() <= 1e-9 * scale
    assert abs(res["iterations"] - res["iterations_one_rank"]) <= 2
    empty = summary["cg"]["empty_rank"]   # rank 0 owns no rows
    assert empty["rows_on_rank0"] == 0 and empty["info"] == 0
    assert np.abs(np.array(empty["x"]) - exact).max() <= 1e-8 * scale
    assert np.allclose(empty["Ab"], A @ b, rtol=1e-12, atol=1e-12)
    x_sp, info = spla.cg(A, b, rtol=1e-10, maxiter=500) if _has_rtol() else \
        spla.cg(A, b, tol=1e-10, maxiter=500)
    assert info == 0 and np.abs(np.array(res["x"]) - x_sp).max() <= 1e-8 * scale


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell"])
def test_in_place_products(mpi_run, fmt):
    """op.matvec(x, out=x): on device arrays the values sent to the neighbours were
    read after the diagonal kernels had overwritten x (errors of order 1 on row
    blocks); host arrays too."""
    out, _ = mpi_run
    A, f = load(out, f"in_place_{fmt}")
    x = f["x"]
    assert_close(f["y_dev"], reference(A, x), A, x, np.float64)
    assert_close(f["y_host"], reference(A, x), A, x, np.float64)


def test_metis_partition_in_original_numbering(mpi_run):
    """partition="metis" on a scrambled grid: y gathered back to the original numbering
    (op.gather, and by hand with op.local_indices) is scipy's; cg, gathered the same
    way, converges to scipy's solution; METIS's ranks need fewer ghosts than
    contiguous blocks of the same matrix."""
    out, summary = mpi_run
    res = summary["metis"]
    if res["missing"]:
        if os.environ.get("CI"):
            pytest.fail("CI is set but pymetis is missing (pip install 'pyspmv-cl[metis]')")
        pytest.skip("pymetis is not installed (pip install 'pyspmv-cl[metis]')")
    A, f = load(out, "metis")
    x = f["x"]
    assert_close(f["y"], reference(A, x), A, x, np.float64)
    assert_close(f["y_by_hand"], reference(A, x), A, x, np.float64)
    assert res["partition"] == "metis" and res["permuted"]
    assert res["same_permutation"] and res["permutation_is_bijection"]
    ranks = res["ranks"]
    assert all(r["scatter_ok"] and r["cols_ok"] for r in ranks)
    assert all("permuted" in r["repr"] for r in ranks)
    assert ranks[0]["rows"][0] == 0 and ranks[-1]["rows"][1] == A.shape[0]
    assert "partition metis (rows and columns permuted" in res["describe"]
    assert "partition nnz" in res["describe_nnz"] and res["nnz_indices_ok"]
    errors = res["gather_errors"]
    assert len(set(errors)) == 1 and f"rank {summary['size'] - 1}: gather:" in errors[0]
    metis_ghosts = sum(r["ghosts"] for r in ranks)
    assert metis_ghosts < sum(res["ghosts_nnz"]) / 2, (metis_ghosts, res["ghosts_nnz"])
    exact = spla.spsolve(A.tocsc(), f["b"])
    scale = np.abs(exact).max()
    assert res["info"] == 0 and res["iterations"] > 0
    assert np.abs(f["x_cg"] - exact).max() <= 1e-8 * scale
    x_sp, info = spla.cg(A, f["b"], rtol=1e-10, maxiter=500) if _has_rtol() else \
        spla.cg(A, f["b"], tol=1e-10, maxiter=500)
    assert info == 0 and np.abs(f["x_cg"] - x_sp).max() <= 1e-8 * scale


def test_metis_missing_same_import_error_on_every_rank(mpi_run):
    _, summary = mpi_run
    messages = summary["errors"]["metis_missing"]
    assert len(messages) == summary["size"] and len(set(messages)) == 1, messages
    assert messages[0].startswith("ImportError: from_global refused on root 0")
    assert "pip install 'pyspmv-cl[metis]'" in messages[0], messages


def _has_rtol():
    import inspect
    return "rtol" in inspect.signature(spla.cg).parameters


def test_auto_formats_np2(tmp_path_factory):
    """format="auto" per block (2 ranks only: it compiles the chosen formats)."""
    out, summary = run_driver(2, tmp_path_factory)
    A, f = load(out, "auto_formats")
    assert_close(f["y"], reference(A, f["x"]), A, f["x"], np.float64)
    assert_close(f["y_ab"], reference(A, f["x"], 2.0, -0.5, f["y0"]), A, f["x"],
                 np.float64)
    At = sp.csr_matrix(A.T)
    assert_close(f["xt_dev"], reference(At, f["yt"]), At, f["yt"], np.float64)
    assert_close(f["xt_ab"], reference(At, f["yt"], 2.0, -0.5, f["x0"]), At, f["yt"],
                 np.float64)


def test_readme_example_runs_under_mpiexec(tmp_path):
    """README's "Distributed (MPI)" script, as written, under ``mpiexec -n 2``."""
    if MISSING:
        pytest.fail(f"CI is set but the MPI tests cannot run: {MISSING}")
    text = (HERE.parent / "README.md").read_text(encoding="utf-8")
    script = re.search(r"cat > spmv_mpi.py <<'END'\n(.*?)\nEND\n", text, re.S).group(1)
    (tmp_path / "spmv_mpi.py").write_text(script)
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT="1", PYTHONPATH=os.pathsep.join(
        filter(None, [str(Path(psc.__file__).resolve().parents[1]),
                      os.environ.get("PYTHONPATH")])))
    run = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "spmv_mpi.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "balance (max/mean)" in run.stdout
    finals = [line.split() for line in run.stdout.splitlines() if line[:2] in ("0 ", "1 ")]
    assert len(finals) == 2 and all(f[2] == "0" for f in finals), run.stdout
