"""Host vectors on a device that computes in host memory (PoCL): the kernels read x and
write the result in the numpy arrays themselves (``host_buffers``), and the copy path
(staging buffers) stays for other devices.  Both paths must give scipy's results for
every way a user passes x and out; the in-place one must not copy."""

import numpy as np
import pytest
from conftest import assert_cclose, make_operator, poisoned
from matrix_cases import CASES, check_against_scipy, random_csr

import pyspmv_cl.matrix as matrix_module

# One-kernel formats and formats with several kernels or a kernel launched twice.
FORMATS = ["csr-scalar", "csr-vector", "sell", "coo", "hyb", "csr5", "bccoo"]
PATHS = ["direct", "map", "copy"]   # see host_buffers


def operator(A, fmt, device, mode, dtype=np.float32):
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        pytest.skip(f"{fmt} refuses this matrix")
    if mode != "copy" and not device.shares_host_memory:
        pytest.skip("this device does not compute in host memory")
    if mode == "direct" and device.host_arrays != "direct":
        pytest.skip("this device's kernels do not write host arrays directly")
    op._host_mode = mode
    return op


@pytest.mark.parametrize("mode", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_products_and_out(fmt, mode, device, rng):
    A = CASES["power_law"](rng)
    m, n = A.shape
    op = operator(A, fmt, device, mode)
    for _ in range(2):   # new arrays every call: the kernels are pointed at each
        x = rng.standard_normal(n)
        check_against_scipy(op @ x.astype(np.float32), A, x.astype(np.float32),
                            np.float32)
        out = poisoned(m, np.float32)
        assert op.matvec(x.astype(np.float32), out=out) is out
        check_against_scipy(out, A, x.astype(np.float32), np.float32)
        y0 = rng.standard_normal(m).astype(np.float32)
        out = y0.copy()
        op.matvec(x.astype(np.float32), out=out, alpha=-1.5, beta=0.5)
        check_against_scipy(out, A, x.astype(np.float32), np.float32, -1.5, 0.5, y0)


@pytest.mark.parametrize("mode", PATHS)
@pytest.mark.parametrize("fmt", ["csr-scalar", "sell", "coo"])
def test_awkward_arrays(fmt, mode, device, rng):
    """Read-only, strided, 2-D and integer x; out in another dtype, strided, or x
    itself."""
    A = random_csr(rng, 700, 700, 0.02)   # square: out may be x itself
    m, n = A.shape
    op = operator(A, fmt, device, mode)
    x = rng.standard_normal(n).astype(np.float32)
    frozen = x.copy()
    frozen.flags.writeable = False
    check_against_scipy(op @ frozen, A, x, np.float32)
    wide = np.repeat(x, 3)   # x at a stride of 3
    check_against_scipy(op @ wide[::3], A, x, np.float32)
    column = op @ x.reshape(n, 1)
    assert column.shape == (m, 1)
    check_against_scipy(column[:, 0], A, x, np.float32)
    ints = rng.integers(-3, 4, n)
    check_against_scipy(op @ ints, A, ints.astype(np.float32), np.float32)
    out64 = poisoned(m, np.float64)
    op.matvec(x, out=out64)
    check_against_scipy(out64, A, x, np.float32)
    holder = poisoned(2 * m, np.float32)
    op.matvec(x, out=holder[::2])
    check_against_scipy(holder[::2], A, x, np.float32)
    assert np.isnan(holder[1::2]).all()   # the gaps untouched
    y = x.copy()
    op.matvec(y, out=y)   # out is x: x must be read before it is overwritten
    check_against_scipy(y, A, x, np.float32)
    y0 = rng.standard_normal(m).astype(np.float32)
    y = y0.copy()
    op.matvec(y, out=y, alpha=2.0, beta=-1.0)
    check_against_scipy(y, A, y0, np.float32, 2.0, -1.0, y0)


@pytest.mark.parametrize("mode", PATHS)
@pytest.mark.parametrize("case", ["m_x_0", "0_x_n", "all_rows_empty", "1x1"])
def test_degenerate_shapes(case, mode, device, rng):
    A = CASES[case](rng)
    op = operator(A, "csr-scalar", device, mode)
    x = rng.standard_normal(A.shape[1]).astype(np.float32)
    y = op @ x
    assert y.shape == (A.shape[0],) and y.dtype == np.float32
    check_against_scipy(y, A, x, np.float32)
    out = poisoned(A.shape[0], np.float32)
    op.matvec(x, out=out)
    check_against_scipy(out, A, x, np.float32)


@pytest.mark.parametrize("fmt", ["csr-scalar", "sell"])
def test_complex_in_place(fmt, device, rng):
    A = CASES["power_law"](rng)
    A = (A + 1j * A.multiply(rng.standard_normal(A.shape) > 0)).tocsr()
    op = operator(A, fmt, device, device.host_arrays, dtype=np.complex64)
    x = (rng.standard_normal(A.shape[1]) + 1j * rng.standard_normal(A.shape[1]))
    x = x.astype(np.complex64)
    assert_cclose(op @ x, A @ x.astype(np.complex128), A, x, np.complex64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_in_place_copies_nothing(fmt, device, rng, monkeypatch):
    """No enqueue_copy on the in-place path: x and the result are the arrays."""
    if not device.shares_host_memory:
        pytest.skip("this device does not compute in host memory")
    A = CASES["power_law"](rng)
    op = operator(A, fmt, device, device.host_arrays)

    def refuse(*args, **kwargs):
        raise AssertionError("enqueue_copy on the in-place path")

    monkeypatch.setattr(matrix_module.cl, "enqueue_copy", refuse)
    x = rng.standard_normal(A.shape[1]).astype(np.float32)
    out = poisoned(A.shape[0], np.float32)
    op.matvec(x, out=out)
    check_against_scipy(out, A, x, np.float32)


@pytest.mark.parametrize("mode", PATHS)
@pytest.mark.parametrize("fmt", ["csr-scalar", "sell", "coo"])
def test_blocks(fmt, mode, device, rng):
    """op @ X for a host block (block kernels for csr-scalar and sell, columns for coo):
    into a new array, into a poisoned out of either order, with beta, and X as out."""
    A = random_csr(rng, 600, 600, 0.03)
    m, n = A.shape
    op = operator(A, fmt, device, mode)
    ref = A.astype(np.float64)
    for k in (3, 8):
        X = rng.standard_normal((n, k)).astype(np.float32)
        Y = op @ X
        assert Y.shape == (m, k) and Y.dtype == np.float32
        for j in range(k):
            check_against_scipy(Y[:, j], A, X[:, j], np.float32)
        for order in "CF":
            out = np.asarray(poisoned((m, k), np.float32), order=order)
            op.matmat(X, out=out)
            for j in range(k):
                check_against_scipy(out[:, j], A, X[:, j], np.float32)
        Y0 = rng.standard_normal((m, k)).astype(np.float32)
        out = Y0.copy()
        op.matmat(X, out=out, alpha=0.5, beta=2.0)
        for j in range(k):
            check_against_scipy(out[:, j], A, X[:, j], np.float32, 0.5, 2.0, Y0[:, j])
        Z = X.copy()
        op.matmat(Z, out=Z)   # out is X
        np.testing.assert_allclose(Z, ref @ X, rtol=1e-4, atol=1e-4 * np.abs(X).max())


def test_probe_modes(device):
    """The probe's answer is one of the three modes, and a device without host-unified
    memory (here a stand-in object) copies."""
    from pyspmv_cl.host_buffers import COPY, DIRECT, MAP, in_place_mode

    assert device.host_arrays in (COPY, MAP, DIRECT)
    assert device.shares_host_memory == (device.host_arrays != COPY)

    class Discrete:
        host_unified_memory = 0

    assert in_place_mode(device.context, Discrete(), device.queue) == COPY


def test_short_products_poll_their_event(device, rng, monkeypatch):
    """On a CPU device with worker threads (PoCL pthread) a host product guessed short
    polls its event before waiting (host_buffers.spin_seconds); a long one, a device
    running kernels in the caller's thread and a GPU just wait.  Results are the
    same whichever way the wait ends: a poll that runs out (one microsecond) or one
    that outlasts the product."""
    from pyspmv_cl import host_buffers
    from pyspmv_cl.device import runs_in_calling_thread
    assert host_buffers.spin_seconds(0.0) == 0.0
    assert host_buffers.spin_seconds(host_buffers.SPIN_MAX_GUESS * 1.01) == 0.0
    assert host_buffers.spin_seconds(100e-6) == pytest.approx(
        200e-6 + host_buffers.SPIN_WAKE_ALLOWANCE)
    A = random_csr(rng, 300, 200, 0.02)
    op = operator(A, "sell", device, "direct")
    polls = device.profile.is_cpu and not runs_in_calling_thread(device)
    assert (op._host_spin > 0) == polls
    gpu = make_operator(A, "sell", dtype=np.float32,
                        device=device.override(device_type="gpu"))
    assert gpu._host_spin == 0.0
    waits = []
    original = host_buffers.wait_and_read

    def spy(queue, buf, array, event, mode, spin=0.0):
        waits.append(spin)
        return original(queue, buf, array, event, mode, spin)
    monkeypatch.setattr(matrix_module, "wait_and_read", spy)
    for spin in (1e-6, 0.5):
        op.__dict__["_host_spin"] = spin
        x = rng.standard_normal(200).astype(np.float32)
        out = poisoned(300, np.float32)
        assert op.matvec(x, out=out) is out
        check_against_scipy(out, A, x, np.float32)
        X = rng.standard_normal((200, 3)).astype(np.float32)
        Y = op @ X                      # blocks just wait
        for j in range(3):
            check_against_scipy(Y[:, j], A, X[:, j], np.float32)
    assert waits == [1e-6, 0.0, 0.5, 0.0]
