"""Every Python snippet of README.md runs as written (in order, in one namespace, as a
reader pasting them would), on the first device found."""

import re
from pathlib import Path

import pytest
from conftest import DEVICES

from pyspmv_cl.tuning import database

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_snippets():
    assert len(BLOCKS) >= 3


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_readme_snippets_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PYSPMV_CL_DEVICE", DEVICES[0].id)
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("PYSPMV_CL_TUNE_BUDGET", "0.5")   # the snippets' tuning, quickly
    database.clear_memory()
    namespace = {}
    try:
        for i, block in enumerate(BLOCKS):
            code = compile(block, f"README.md python block {i}", "exec")
            exec(code, namespace)
    finally:
        database.clear_memory()


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_readme_snippets_with_imports_run_alone(tmp_path, monkeypatch):
    """A snippet that imports what it uses is pasted alone by a reader: it must run in
    a namespace of its own (the renumbering example used psc without importing it,
    which the run in one namespace above hid)."""
    monkeypatch.setenv("PYSPMV_CL_DEVICE", DEVICES[0].id)
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("PYSPMV_CL_TUNE_BUDGET", "0.5")
    database.clear_memory()
    alone = [(i, b) for i, b in enumerate(BLOCKS) if re.search(r"^import numpy", b, re.M)]
    assert len(alone) >= 2
    try:
        for i, block in alone:
            exec(compile(block, f"README.md python block {i}", "exec"), {})
    finally:
        database.clear_memory()
