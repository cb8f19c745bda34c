"""The benchmark scripts of #15 (``benchmarks/time_to_solution.py``,
``update_values.py``, ``csr5_conversion.py``) run end to end on a tiny matrix on the
first device: the JSON they write has the fields the tables are made from, with sane
values (times positive, results checked against scipy), and a bad argument is one
error line (argparse's exit status 2, no traceback) before any work."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import DEVICES

import pyspmv_cl as psc

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

TINY = "random:300,4"   # 300 x 300, about 1,200 non-zeros


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """The kernel cache and the tuning database in directories of the test's (the
    time-to-solution script points them at its own; restored afterwards)."""
    monkeypatch.setenv("PYSPMV_CL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYSPMV_CL_TUNING_DIR", str(tmp_path / "tuning"))
    return tmp_path


def assert_clean_error(main, argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert ": error: " in last and re.search(match, last), err


def test_time_to_solution_script(isolated, capsys):
    import time_to_solution as tts

    out = isolated / "tts"
    tts.main(["--device", DEVICES[0].id, "--dtypes", "float32", "--formats",
              "auto,csr-scalar", "--states", "warm-filled,cold-empty", "--rounds", "1",
              "--peers", "scipy", "--vectors", "device", "--out", str(out), TINY])
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["environment"]["device"] == DEVICES[0].profile.name
    assert report["environment"]["vectors"] == "device"
    rows = report["results"]
    assert sorted((r["impl"], r["state"] or "") for r in rows) == [
        ("auto", "cold-empty"), ("auto", "warm-filled"), ("csr-scalar", "cold-empty"),
        ("csr-scalar", "warm-filled"), ("scipy", "")]
    for r in rows:
        assert r["matrix"] == "random-300-4" and r["rows"] == 300 and r["dtype"] == "float32"
        assert r["rel_err"] < 1e-5, r
        assert r["setup_seconds"] > 0 and r["product_seconds"] > 0
        assert len(r["setup_samples"]) == 1 and not r["direct"]
        T = [r["T"][str(n)] for n in tts.NS]
        assert T[0] == r["setup_seconds"] and all(a < b for a, b in zip(T, T[1:]))
        if r["impl"] == "csr-scalar":
            assert r["chosen"] == "csr-scalar"
        elif r["impl"] == "auto":
            assert r["chosen"].split()[0] in psc.formats()
    table = out.with_suffix(".md").read_text()
    assert table.count("| random-300-4 |") == len(rows)


@pytest.mark.exhaustive
def test_time_to_solution_script_direct(isolated):
    """``--direct``: T(N) measured as N products in a row after the setup (host
    vectors, kernel cache warm, database filled)."""
    import time_to_solution as tts

    out = isolated / "tts"
    tts.main(["--device", DEVICES[0].id, "--dtypes", "float32", "--formats", "csr-scalar",
              "--states", "warm-filled", "--rounds", "1", "--peers", "scipy", "--direct",
              "--out", str(out), TINY])
    rows = json.loads(out.with_suffix(".json").read_text())["results"]
    assert sorted(r["impl"] for r in rows) == ["csr-scalar", "scipy"]
    for r in rows:
        assert r["direct"] and r["rel_err"] < 1e-5 and r["product_seconds"] > 0
        T = [r["T"][str(n)] for n in tts.NS]
        assert T[0] == r["setup_seconds"] and all(a < b for a, b in zip(T, T[1:]))


@pytest.mark.parametrize("argv, match", [
    (["--rounds", "0", TINY], "--rounds must be at least 1"),
    (["--formats", "auto,bogus", TINY], "--formats: 'bogus'"),
    (["--states", "hot", TINY], "--states"),
    (["--dtypes", "float16", TINY], "--dtypes 'float16'"),
    (["--device", "9:9", TINY], "no OpenCL device matches '9:9'.*Available"),
    (["--device", "default", "--vectors", "device", TINY], "device vectors need a device"),
    ([TINY, "nosuch:3"], "nosuch"),   # the second spec: refused before the first runs
])
def test_time_to_solution_script_refuses_bad_arguments(argv, match, isolated, capsys):
    import time_to_solution as tts

    assert_clean_error(tts.main, ["--peers", "scipy", "--rounds", "1", "--out",
                                  str(isolated / "tts"), *argv], match, capsys)
    assert not (isolated / "tts.json").exists()   # (written after each case)


def test_update_values_script(isolated, capsys):
    import update_values

    out = isolated / "uv.json"
    update_values.main(["--device", DEVICES[0].id, "--dtypes", "float32",
                        "--formats", "csr-scalar,sell,coo", "--repeats", "2",
                        "--json", str(out), TINY])
    rows = json.loads(out.read_text())["rows"]
    assert [r["format"] for r in rows] == ["csr-scalar", "sell", "coo"]
    for r in rows:
        assert r["matrix"] == "random-300-4" and r["dtype"] == "float32" and r["nnz"] > 0
        assert r["rel_err"] < 1e-5, r
        for key in ("first_s", "update_s", "upload_s", "spmv_s"):
            assert r[key] > 0, (key, r)
        assert r["budget"] == pytest.approx(r["update_s"] / (r["upload_s"] + 2 * r["spmv_s"]))
    assert "error" not in capsys.readouterr().err.lower()


@pytest.mark.parametrize("argv, match", [
    (["--formats", "sell,bogus", TINY], "--formats: 'bogus' unknown"),
    (["--repeats", "0", TINY], "--repeats"),
    (["--dtypes", "float16", TINY], "--dtypes 'float16'"),
    (["--replicate-to", "-1", TINY], "--replicate-to"),
    (["--device", "9:9", TINY], "no OpenCL device matches '9:9'"),
    ([TINY, "nosuch:3"], "nosuch"),
])
def test_update_values_script_refuses_bad_arguments(argv, match, isolated, capsys):
    import update_values

    assert_clean_error(update_values.main, ["--json", str(isolated / "uv.json"), *argv],
                       match, capsys)
    assert not (isolated / "uv.json").exists()


def test_csr5_conversion_script(isolated, capsys):
    import csr5_conversion

    out = isolated / "csr5.json"
    assert csr5_conversion.main(["--device", DEVICES[0].id, "--repeat", "1",
                                 "--set", "omega=4", "--json", str(out), TINY]) == 0
    report = json.loads(out.read_text())
    assert report["meta"]["dtype"] == "float32" and report["meta"]["repeat"] == 1
    assert report["meta"]["device_type"] == DEVICES[0].profile.device_type
    (row,) = report["rows"]
    assert row["matrix"] == "random-300-4" and row["rows"] == 300 and row["nnz"] > 0
    assert row["params"]["omega"] == 4
    assert all(row[c] > 0 for c in csr5_conversion.COLUMNS), row
    b = row["breakdown"]
    assert b["launches"] == len(b["kernels"]) > 0
    assert all(name.startswith("csr5_") and t >= 0 for name, t in b["kernels"])
    assert b["kernel_sum"] == pytest.approx(sum(t for _, t in b["kernels"]))
    assert 0 <= b["analyse"] <= b["total"] and np.isfinite(b["rest"])


@pytest.mark.parametrize("argv, match", [
    (["--dtype", "float32,float64", TINY], "one value type"),
    (["--dtype", "float16", TINY], "--dtype 'float16'"),
    (["--repeat", "0", TINY], "--repeat"),
    (["--set", "bogus=1", TINY], "--set: .*bogus"),
    (["--set", "omega=abc", TINY], "--set: .*omega"),
    (["--device", "9:9", TINY], "no OpenCL device matches '9:9'"),
    ([TINY, "nosuch:3"], "nosuch"),
])
def test_csr5_conversion_script_refuses_bad_arguments(argv, match, isolated, capsys):
    import csr5_conversion

    assert_clean_error(csr5_conversion.main, ["--json", str(isolated / "csr5.json"), *argv],
                       match, capsys)
    assert not (isolated / "csr5.json").exists()
