"""numbering.py: how scattered a numbering leaves x's reads, and the operator's hint
to renumber (GPUs only; never a change to what the operator computes)."""

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES

import pyspmv_cl as psc
from pyspmv_cl.numbering import GROUP_ROWS, HINT_LINES, hint, scattered_lines


def mesh(n=60):
    grid = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
    return sp.kronsum(grid, grid).tocsr()


def shuffled(A, seed=0):
    order = np.random.default_rng(seed).permutation(A.shape[0])
    return A[order][:, order].tocsr()


def test_a_local_numbering_reads_few_lines_and_a_random_one_many():
    A, B = mesh(), shuffled(mesh())
    local = scattered_lines(A.indptr, A.indices, 4)
    scattered = scattered_lines(B.indptr, B.indices, 4)
    # a 2-D stencil numbered row by row: a load of 32 rows' k-th entries spans about
    # 32 + 60 columns, 3-4 lines of 32 floats; at random nearly every entry its own line
    assert 1 <= local <= 5 < HINT_LINES < scattered <= GROUP_ROWS
    # wider values, more lines for the same columns
    assert scattered_lines(A.indptr, A.indices, 8) > local
    assert hint(A, 4) == ""
    text = hint(B, 4)
    assert "reverse Cuthill-McKee" in text and f"{scattered:.0f} cache lines" in text


def test_counted_exactly_on_a_small_case():
    # 32 rows: row i holds column 32 * i (each its own line of 32 floats), then column
    # 32 * 40 + i (all 32 in one line): 32 lines for the first load, 1 for the second
    rows = np.arange(32)
    A = sp.csr_matrix((np.ones(64), (np.repeat(rows, 2),
                                     np.stack([32 * rows, 32 * 40 + rows]).T.ravel())),
                      shape=(32, 32 * 41))
    A.sort_indices()
    assert scattered_lines(A.indptr, A.indices, 4) == pytest.approx((32 + 1) / 2)


def test_nothing_to_count():
    assert scattered_lines(np.zeros(20, dtype=np.int64), np.zeros(0, dtype=np.int64), 4) is None
    A = sp.random(31, 31, density=0.5, format="csr", random_state=0)
    assert scattered_lines(A.indptr, A.indices, 4) is None and hint(A, 4) == ""
    empty = sp.csr_matrix((64, 64))
    assert scattered_lines(empty.indptr, empty.indices, 4) is None
    assert hint(sp.random(64, 80, density=0.3, format="csr", random_state=0), 4) == ""


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_the_operator_says_so_on_gpus_only():
    device = DEVICES[0]
    A = shuffled(mesh())
    x = np.random.default_rng(1).standard_normal(A.shape[1])
    gpu = psc.SpMV(A, format="csr-scalar", device=device.override(device_type="gpu"))
    assert "renumbered once" in gpu.explanation
    np.testing.assert_allclose(gpu @ x, A @ x, rtol=1e-12, atol=1e-12)
    assert "renumbered once" not in psc.SpMV(mesh(), format="csr-scalar",
                                             device=device.override(device_type="gpu")).explanation
    cpu = psc.SpMV(A, format="csr-scalar", device=device.override(device_type="cpu"))
    assert "renumbered once" not in cpu.explanation


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_the_hint_outlives_online_tuning(empty_tuning_db):
    """The explanation an online tuning writes when it ends keeps the hint."""
    device = DEVICES[0].override(device_type="gpu")
    A = shuffled(mesh()).astype(np.float32)
    op = psc.SpMV(A, device=device, tune="online")
    assert op.tuning.source == "online" and "renumbered once" in op.explanation
    assert op.finish_tuning() == "done", op.tuning.online.error
    x = np.random.default_rng(2).standard_normal(A.shape[1]).astype(np.float32)
    np.testing.assert_allclose(op @ x, A @ x, rtol=1e-4, atol=1e-4)
    assert op.explanation.startswith("measured online in")
    assert "renumbered once" in op.explanation
