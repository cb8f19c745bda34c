"""A contributor's first ``python`` in the checkout imports the checkout's sources
(the current directory comes first on sys.path): the templates and helpers must be
found there, not only in an installed package."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEVICES

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import numpy as np, scipy.sparse as sp, pyspmv_cl as m
from pathlib import Path
assert Path(m.__file__).resolve().parent == Path.cwd() / "pyspmv_cl", m.__file__
A = sp.random(40, 30, density=0.2, format="csr", random_state=0)
x = np.arange(30.0)
for fmt in ("csr-scalar", "csr5"):
    y = m.SpMV(A, format=fmt, device="{device}") @ x
    assert np.allclose(y, A @ x), fmt
print("ok")
"""


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_multiply_from_the_checkout_root():
    device = DEVICES[0].id
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(device=device)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
