"""The operator does not depend on the caller's host arrays after construction: scipy
changes a CSR matrix's ``indices``/``indptr``/``data`` in place (``A.sort_indices()``,
``A.sum_duplicates()``), and the transposed
products, ``update_values`` and block products must still see the matrix as it was
given (``SpMV._structure``: read back from the device by the CSR kernels, copied at
construction by the other formats; a matrix given on the device: its indices copied
there)."""

import subprocess
import sys

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import FIRST_OF_EACH_TYPE, assert_close, make_operator, poisoned, reference
from matrix_cases import CASES, csr_from_row_lengths

import pyspmv_cl as psc

FORMATS = psc.formats()
# (case, the caller's in-place change): unsorted rows sorted, duplicates summed (which
# shortens the arrays and sorts them too).
CHANGES = [("unsorted_by_hand", "sort_indices"), ("unsorted_indices", "sort_indices"),
           ("duplicates_csr", "sum_duplicates"), ("duplicates_csr_large", "sum_duplicates")]


def with_values(A, data):
    B = A.copy()
    B.data = np.asarray(data, dtype=np.float64).copy()
    return B


def check(y, B, x):
    assert_close(y, reference(B, x), B, x, np.float64)


@pytest.mark.parametrize("given", ["scipy", "triple", "device"])
@pytest.mark.parametrize("case, change", CHANGES, ids=[c for c, _ in CHANGES])
@pytest.mark.parametrize("fmt", FORMATS)
def test_in_place_changes_of_the_callers_matrix_do_not_reach_the_operator(
        fmt, case, change, given, device, rng):
    A = sp.csr_matrix(CASES[case](rng))
    B = A.copy()   # the matrix as given, in arrays of its own
    source = {"scipy": A, "triple": (A.data, A.indices, A.indptr),
              "device": tuple(cla.to_device(device.queue, a)
                              for a in (A.data, A.indices, A.indptr))}[given]
    op = make_operator(source, fmt, dtype=np.float64, device=device,
                       **({} if given == "scipy" else {"shape": A.shape}))
    if op is None:
        pytest.skip(f"{fmt} refuses {case}")
    getattr(A, change)()
    assert not np.array_equal(A.indices[:B.nnz], B.indices)   # the change did change them
    if given == "device":   # the same change to the device arrays (their head)
        source[0][:A.nnz].set(A.data)
        source[1][:A.nnz].set(A.indices)
    m, n = B.shape
    u, x = rng.standard_normal(m), rng.standard_normal(n)
    out = poisoned(n, np.float64)
    op.rmatvec(u, out=out)
    check(out, B.T, u)
    check(op.T @ u, B.T, u)
    check(op.H @ u, B.T, u)
    # New values in the order of the matrix given (and as many: sum_duplicates shortened
    # the caller's arrays), to the operator, its transposed copy and its block copy.
    new = rng.standard_normal(B.nnz)
    op.update_values(new)
    Bn = with_values(B, new)
    out = poisoned(m, np.float64)
    op.matvec(x, out=out)
    check(out, Bn, x)
    check(op.T @ u, Bn.T, u)
    op.build_block_copy()
    X = rng.standard_normal((n, 3))
    Y = op @ X
    for j in range(3):
        check(Y[:, j], Bn, X[:, j])
    new = rng.standard_normal(B.nnz)
    op.update_values(new)   # the block copy made after the first update follows too
    Bn = with_values(B, new)
    Y = op @ X
    for j in range(3):
        check(Y[:, j], Bn, X[:, j])


def test_a_format_switch_of_online_tuning_keeps_the_pattern(device, rng, empty_tuning_db):
    """An operator starting on a CSR kernel (which reads the pattern back from the
    device when needed) that online tuning switches to a format that cannot keeps the
    measurement's snapshot of the pattern: the caller's later sort does not reach it."""
    from pyspmv_cl.formats import FORMATS as CLASSES
    from pyspmv_cl.formats.base import instantiate
    from pyspmv_cl.tuning import tuner

    A = csr_from_row_lengths(rng, rng.integers(0, 30, 400), 300, shuffle=True)
    B = A.copy()
    gpu = device.override(device_type="gpu")   # starts on a CSR kernel

    def fake_measurement(snapshot, should_stop, offer, exclusive):
        cls = CLASSES["coo"]
        features = psc.tuning.MatrixFeatures.from_csr(snapshot)
        impl = instantiate(cls, snapshot, gpu, np.float64,
                           cls.resolve_params(features, gpu.profile, np.float64, {}))
        return tuner.Decision("coo", {}, "fake", "online", impl=impl)

    op = psc.SpMV(A, device=gpu, dtype=np.float64, tune="online")
    assert op._structure_source is None   # nothing kept: the CSR kernel reads it back
    tuning = op.tuning.online
    tuning._run_measurement = fake_measurement
    A.sort_indices()
    tuning.trigger = tuning.calls + 1
    x = rng.standard_normal(B.shape[1])
    check(op @ x, B, x)   # starts the measurement
    assert op.finish_tuning(60) == "done", tuning.error
    assert op.format == "coo" and tuning.structure is None   # dropped once taken
    new = rng.standard_normal(B.nnz)
    op.update_values(new)
    Bn = with_values(B, new)
    check(op @ x, Bn, x)
    u = rng.standard_normal(B.shape[0])
    check(op.T @ u, Bn.T, u)


MISALIGNED = r"""
import sys
import numpy as np, scipy.sparse as sp, pyspmv_cl as psc
dev = psc.get_device(sys.argv[1])

def at(offset, shape, dtype):
    # A C-contiguous array of dtype at 64 * j + offset bytes (numpy calls it aligned
    # when offset is a multiple of 8).
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    return raw[start:start + n].view(dtype).reshape(shape)

rng = np.random.default_rng(int(sys.argv[2]))
for dtype in (np.complex128, np.complex64, np.float64, np.float32):
    A = sp.random(60, 45, density=0.2, format="csr", random_state=rng.integers(1 << 30))
    A = (A + 1j * A if np.dtype(dtype).kind == "c" else A).astype(dtype)
    for fmt in ("csr-scalar", "sell", "coo", "csr5"):
        op = psc.SpMV(A, format=fmt, device=dev)
        for offset in (8, 4, 1):
            for k in (None, 1, 3):
                xs, ys = ((45,), (60,)) if k is None else ((45, k), (60, k))
                x = at(offset, xs, dtype)
                x[...] = rng.standard_normal(xs)
                out = at(offset, ys, dtype)
                out[...] = np.nan
                op.matvec(x, out=out)
                ref = A.astype(np.complex128) @ x.astype(np.complex128)
                tol = 1e-4 if dtype in (np.float32, np.complex64) else 1e-10
                assert np.allclose(out, ref, rtol=tol, atol=tol), (dtype, fmt, offset, k)
                assert np.allclose(op @ x, ref, rtol=tol, atol=tol), (dtype, fmt, offset, k)
                r = at(offset, ys, dtype)
                r[...] = rng.standard_normal(ys)
                back = A.conj().T.astype(np.complex128) @ r.astype(np.complex128)
                assert np.allclose(op.H @ r, back, rtol=tol, atol=tol), (dtype, fmt, offset, k)
print("ok")
"""


@pytest.mark.parametrize("device", [d for d in FIRST_OF_EACH_TYPE if d.profile.is_cpu],
                         ids=lambda d: d.id)
def test_host_arrays_off_their_types_alignment(device, tmp_path, rng):
    """Host x and out at addresses that are not multiples of their item size (a
    complex128 array 8 bytes past a 16-byte boundary, which numpy calls aligned) are
    copied rather than used in place: PoCL's double2 loads there crashed the process.
    In a child process, so that a crash fails this test rather than the run."""
    script = tmp_path / "misaligned.py"
    script.write_text(MISALIGNED)
    proc = subprocess.run([sys.executable, str(script), device.id,
                           str(int(rng.integers(1 << 30)))],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", \
        (proc.returncode, proc.stderr[-3000:])
