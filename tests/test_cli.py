"""The `pyspmv-cl bench` command: results as JSON, clear errors for bad arguments."""

import json
import subprocess
import sys
import tempfile

import pytest
from conftest import DEVICES


def run_cli(*args):
    # From outside the checkout: `-m` puts the working directory first on sys.path.
    return subprocess.run([sys.executable, "-m", "pyspmv_cl", *args], capture_output=True,
                          text=True, timeout=300, cwd=tempfile.gettempdir())


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_bench_json():
    device = DEVICES[0].id
    proc = run_cli("bench", "--device", device, "--formats", "csr-scalar,sell,auto",
                   "--peers", "scipy", "--dtype", "float32", "--repeat", "3",
                   "--min-time", "0.01", "--json", "-", "--quiet", "poisson2d:30",
                   "powerlaw:2000,6")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["environment"]["copy_gbps"] > 0
    rows = data["results"]
    assert {(r["matrix"], r["impl"]) for r in rows} == {
        (m, i) for m in ("poisson2d-30", "powerlaw-2000-6")
        for i in ("csr-scalar", "sell", "auto", "scipy")}
    for r in rows:
        assert r["gflops"] > 0 and r["gbps"] > 0
        assert r["rel_err"] < 1e-5, r
        if r["impl"] == "auto":
            assert r["format"] in ("csr-scalar", "sell", "dia", "coo", "csr-vector")


def test_bench_table_output():
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "--formats", "csr-vector",
                   "--peers", "none", "--dtype", "float64", "--repeat", "2",
                   "--min-time", "0.01", "--quiet", "banded:500,2")
    assert proc.returncode == 0, proc.stderr
    assert "| banded-500-2 |" in proc.stdout and "copy bandwidth" in proc.stdout
    assert "| nbytes |" in proc.stdout and " KiB |" in proc.stdout


def test_bench_progress_bar_and_nbytes():
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "--formats", "csr-scalar,auto",
                   "--peers", "scipy", "--dtype", "float32", "--repeat", "2",
                   "--min-time", "0.01", "--json", "-", "poisson2d:20")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()   # not a terminal: one line per step
    assert lines[0].startswith("[....") and " 0/5 " in lines[0]
    assert lines[-1].startswith("[" + "#" * 24 + "] 5/5 100%")
    rows = {r["impl"]: r for r in json.loads(proc.stdout)["results"]}
    import scipy.sparse as sp

    from pyspmv_cl.bench import generators
    A = generators.poisson2d(20)
    assert rows["csr-scalar"]["nbytes"] == A.nnz * 8 + (A.shape[0] + 1) * 4
    assert rows["auto"]["tuning_source"] == "model" and rows["auto"]["explanation"]
    assert rows["scipy"]["min_bytes"] == (A.nnz * 8 + (A.shape[0] + 1) * 4 + 2 * A.shape[0] * 4)
    for r in rows.values():   # the derived columns agree with the raw ones
        assert abs(r["gflops"] - 2 * A.nnz / r["seconds"] / 1e9) < 1e-9 * r["gflops"] + 1e-12
        assert abs(r["gbps"] - r["min_bytes"] / r["seconds"] / 1e9) < 1e-9 * r["gbps"] + 1e-12
    assert sp.issparse(A)


def test_progress_bar_rendering():
    import io

    from pyspmv_cl.bench import ProgressBar
    stream = io.StringIO()
    bar = ProgressBar(total=4, stream=stream, width=8)
    bar("one")
    bar("two")
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[........] 0/4   0%") and lines[0].endswith("one")
    assert lines[1].startswith("[##......] 1/4  25%") and lines[1].endswith("two")
    assert lines[2].startswith("[########] 4/4 100%")


def test_bench_plot(tmp_path):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    target = tmp_path / "roofline.png"
    proc = run_cli("bench", "--device", DEVICES[0].id, "--formats", "csr-scalar",
                   "--peers", "scipy", "--dtype", "float32", "--repeat", "2",
                   "--min-time", "0.01", "--quiet", "--plot", str(target), "poisson2d:20")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert proc.returncode == 2 and "needs matplotlib" in proc.stderr
        assert "Traceback" not in proc.stderr and not target.exists()
        pytest.skip("matplotlib not installed (the clear error was checked)")
    assert proc.returncode == 0, proc.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--formats", "nosuch"], "unknown format"),
    (["--dtype", "float16"], "unknown dtype"),
    (["notagenerator:5"], "bad matrix spec"),
    (["--peers", "nosuchpeer"], "unknown peers"),
])
def test_bench_bad_arguments(args, message):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "--quiet", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_version(capsys):
    from pyspmv_cl import __version__
    from pyspmv_cl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyspmv-cl {__version__}"


@pytest.mark.parametrize("argv, match", [
    (["--json", "/nonexistent/dir/x.json"], "cannot write --json"),
    (["--repeat", "0"], "--repeat must be at least 1"),
    (["--min-time", "-1"], "--min-time at least 0"),
    (["--formats="], "--formats names no format"),
    (["--dtype="], "--dtype names no dtype"),
])
def test_bench_refuses_bad_options_before_running(argv, match, capsys):
    from pyspmv_cl.cli import main

    assert main(["bench", "--quiet", *argv, "poisson2d:10"]) == 2
    assert match in capsys.readouterr().err


def test_tune_exits_non_zero_on_a_complex_matrix(tmp_path, capsys):
    import scipy.io
    import scipy.sparse as sp

    from pyspmv_cl.cli import main

    path = tmp_path / "complex.mtx"
    scipy.io.mmwrite(str(path), sp.random(20, 20, density=0.2, random_state=0) * (1 + 1j))
    assert main(["tune", "--quiet", str(path)]) == 1
    assert "complex matrices are not supported" in capsys.readouterr().err
