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
