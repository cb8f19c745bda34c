"""``benchmarks/online_cost.py`` runs end to end on a small matrix: the measurement
starts where it is told, its steps are accounted for, and the products stay right."""

import sys
from pathlib import Path

import pytest
from conftest import DEVICES

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def test_online_cost_script(tmp_path, monkeypatch):
    import online_cost

    from pyspmv_cl.tuning import online, tuner

    for module, name in ((online, "trigger_calls"), (tuner, "measure"),
                         (tuner, "_store_decision")):   # the script patches them
        monkeypatch.setattr(module, name, getattr(module, name))
    # The script points these at directories of its own: restored afterwards.
    monkeypatch.setenv("PYSPMV_CL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYSPMV_CL_TUNING_DIR", str(tmp_path / "tuning"))
    rows = online_cost.main(["--device", DEVICES[0].id, "--replicate-to", "1.2e5",
                             "--products", "800", "--trigger", "50", "--dtypes", "float32",
                             "--json", str(tmp_path / "out.json"),
                             "random:20000,6"])
    (row,) = rows
    assert row["rel_err"] < 1e-5 and row["error"] is None
    assert row["phases"][0]["phase"] == "read-back+snapshot"
    assert row["phases"][-1]["phase"] == "stored"
    assert row["candidates"] and (tmp_path / "out.json").exists()
