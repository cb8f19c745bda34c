"""Fuzzing where the vectors of a product live and how they alias (hypothesis), and one
operator shared by threads, against scipy.

For every format and dtype (parametrised, so each CI run covers all of them), each
placement example draws a small adversarial matrix (test_fuzz's builder), alpha, beta
and where x and out live: numpy arrays, strided numpy views and views at an offset;
``out`` that is ``x``; ``x`` and ``out`` overlapping views of one larger array, on the
host (1-D, and 2-D blocks of columns) and on the device (slices of one pyopencl array,
sub-buffers of one buffer, or the buffer and a sub-buffer of it); a host ``x`` into a
device ``out``; numpy arrays in the other float type.  Every array the vectors are cut
from is poisoned (NaN) outside them, and ``out`` too when beta == 0; the expected
answer comes from the values as they were before the call, and every entry outside
``out`` must be left bit for bit as it was.

Device arrays may start anywhere in their buffer (views at an offset, aligned or not)
but must be contiguous, and a device ``x`` needs a device ``out``: other device views
are refused with InvalidInputError / TypeError (matrix.py, ``_device_buffer``), which
is checked too, with nothing written.

For every format, each thread example draws a random square matrix (up to 3000 x 3000,
270k non-zeros), an in-order or out-of-order queue for the operator, 2-4 threads and
1-5 products per thread (host or device vectors, on the operator's queue or the
thread's own, in place, alpha/beta per product, results read at once or after the
thread's last product, value updates with the same values); each thread checks each of
its products.  A hang fails the test (daemon threads and a deadline) instead of
blocking CI.

CI runs a fixed, derandomised set of examples (bounded time).  For a longer random
hunt: ``PYSPMV_CL_FUZZ_EXAMPLES=500 PYSPMV_CL_FUZZ_RANDOM=1 pytest tests/test_fuzz_aliasing.py``
(it sets the examples of each test).
"""

import gc
import os
import re
import threading
import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from conftest import DTYPES, make_operator, skip_without_fp64
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from matrix_cases import check_against_scipy, random_csr
from test_fuzz import build

import pyspmv_cl as psc

FORMATS = psc.formats()
EXAMPLES = int(os.environ.get("PYSPMV_CL_FUZZ_EXAMPLES", "30"))
THREAD_EXAMPLES = int(os.environ.get("PYSPMV_CL_FUZZ_EXAMPLES", "8"))
RANDOM = os.environ.get("PYSPMV_CL_FUZZ_RANDOM", "") not in ("", "0")
SETTINGS = {"derandomize": not RANDOM, "deadline": None, "database": None,
            "suppress_health_check": [HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow, HealthCheck.data_too_large]}
THREAD_TIMEOUT = 120          # seconds for all the threads of one example
OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE

SIZES = st.sampled_from([0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 64, 65, 129])
ALPHAS = st.sampled_from([1.0, 0.0, -1.0, 2.5, -0.75])
BETAS = st.sampled_from([0.0, 1.0, -1.0, 0.5, -2.0])

# test_fuzz's structure keys (its builder), smaller sizes, native profile.
structures = st.fixed_dictionaries({
    "m": SIZES,
    "n": SIZES,
    "lengths": st.sampled_from(["boundaries", "sparse", "equal", "zero"]),
    "empty_lead": st.sampled_from([0, 0, 1, 5]),
    "empty_trail": st.sampled_from([0, 0, 1, 7]),
    "huge_row": st.booleans(),
    "one_column": st.booleans(),
    "duplicates": st.booleans(),
    "explicit_zeros": st.booleans(),
    "unsorted": st.booleans(),
    "x_specials": st.booleans(),
    "seed": st.integers(0, 2**32 - 1),
})

# Where x and out live (SQUARE: out is x, which needs m == n).  The aliasing layouts are
# listed twice: drawn twice as often.
LAYOUTS = [
    "host",              # x, out: numpy views (offset, step) of two arrays; out may be None
    "host-shared",       # x, out: numpy views of one array, overlapping or not
    "host-same",         # out is x (numpy)
    "host-columns",      # x (n, k), out (m, k): blocks of one 2-D numpy array
    "host-x-device-out",  # x numpy view, out a slice of a pyopencl array
    "device",            # x, out: slices of two pyopencl arrays; out may be None
    "device-shared",     # x, out: slices of one pyopencl array, overlapping or not
    "device-same",       # out is x (pyopencl)
    "device-strided",    # x: a strided slice of a pyopencl array
    "sub-buffers",       # x, out: one buffer and sub-buffers of it, overlapping or not
    "device-x-host-out",  # refused: a device x needs a device out
]
ALIASING = ["host-shared", "host-same", "host-columns", "device-shared", "device-same",
            "sub-buffers"]
SQUARE = {"host-same", "device-same"}

placements = st.fixed_dictionaries({
    "layout": st.sampled_from(LAYOUTS + ALIASING),
    "x_at": st.sampled_from([0, 0, 1, 2, 5, 33]),      # elements (rows for columns)
    "out_at": st.sampled_from([0, 0, 1, 3, 7, 40]),
    "x_step": st.sampled_from([1, 1, 2, 3, -1]),
    "out_step": st.sampled_from([1, 1, 2, -2]),
    "x_sub": st.sampled_from([None, 0, 1, 2]),          # sub-buffer origin in alignment
    "out_sub": st.sampled_from([None, 0, 1, 3]),        # units; None: the buffer itself
    "columns": st.integers(2, 3),
    "column_shift": st.sampled_from([-1, 0, 1]),        # -1: out one column right of x
    "device_offsets": st.sampled_from([False, False, True]),  # device slices at x_at..
    "out_none": st.booleans(),                          # with beta == 0
    "host_dtype_other": st.booleans(),                  # numpy arrays in the other float
})


def bits(a):
    """The array's bytes as unsigned integers: compares NaN payloads too."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.itemsize}")


class Pool:
    """An array that vectors are cut from, modelled on the host: NaN everywhere, then
    out's initial values, then x's (x wins where they overlap)."""

    def __init__(self, shape, dtype):
        self.model = np.full(shape, np.nan, dtype=dtype)
        self.out_mask = np.zeros(self.model.shape, dtype=bool)
        self.read = None    # () -> the array as it is after the product

    def host(self):
        arr = self.model.copy()
        self.read = lambda: arr
        return arr

    def device(self, queue):
        arr = cla.to_device(queue, self.model)
        self.read = lambda: arr.get()
        return arr

    def buffer(self, queue):
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=self.model)

        def read():
            back = np.empty_like(self.model)
            cl.enqueue_copy(queue, back, buf)
            return back
        self.read = read
        return buf


def strided(start, step, count):
    """A slice taking ``count`` elements from ``start`` by ``step`` (negative: down)."""
    if step < 0:
        start += -step * max(count - 1, 0)
        stop = start + step * count
        return slice(start, None if stop < 0 else stop, step)
    return slice(start, start + step * count, step)


def place(p, m, n, queue, dtype, host_dtype, align):
    """Where x and out go: (pool of x, key, pool of out, key, make), ``make()`` giving
    the arrays x and out (out may be x) once the pools' models are filled."""
    layout = p["layout"]
    if layout == "host-columns":
        k = p["columns"]
        c_x, c_out = max(p["column_shift"], 0), max(-p["column_shift"], 0)
        x_key = (slice(p["x_at"], p["x_at"] + n), slice(c_x, c_x + k))
        out_key = (slice(p["out_at"], p["out_at"] + m), slice(c_out, c_out + k))
        pool = Pool((max(p["x_at"] + n, p["out_at"] + m) + 2, k + 2), host_dtype)

        def make():
            arr = pool.host()
            return arr[x_key], arr[out_key]

        return pool, x_key, pool, out_key, make

    if layout == "sub-buffers":
        # Origins in units of the device's base address alignment (sub-buffers need it).
        unit = max(align // np.dtype(dtype).itemsize, 1)
        x_start = 0 if p["x_sub"] is None else p["x_sub"] * unit
        out_start = 0 if p["out_sub"] is None else p["out_sub"] * unit
        x_key, out_key = slice(x_start, x_start + n), slice(out_start, out_start + m)
        pool = Pool(max(x_start + n, out_start + m) + 3, dtype)
        itemsize = np.dtype(dtype).itemsize

        def on(buf, sub, start, count):
            if count == 0:
                return cla.empty(queue, 0, dtype)
            if sub is not None:   # a sub-buffer (at origin 0 too: its own handle)
                buf = buf.get_sub_region(start * itemsize, count * itemsize)
            return cla.Array(queue, (count,), dtype, data=buf)

        def make():
            buf = pool.buffer(queue)
            return on(buf, p["x_sub"], x_start, n), on(buf, p["out_sub"], out_start, m)

        return pool, x_key, pool, out_key, make

    host_x = layout.startswith("host")
    host_out = (host_x and layout != "host-x-device-out") or layout == "device-x-host-out"
    if host_x:
        x_key = strided(p["x_at"], p["x_step"], n)
    elif layout == "device-strided":
        x_key = slice(p["x_at"], p["x_at"] + 2 * n, 2)
    else:                 # device slices: contiguous (pyopencl has no negative steps)
        x_key = slice(p["x_at"], p["x_at"] + n)
    if host_out:
        out_key = strided(p["out_at"], p["out_step"], m)
    else:
        out_key = slice(p["out_at"], p["out_at"] + m)
    if not p["device_offsets"]:      # device slices at offset 0 (the ones accepted)
        x_key = x_key if host_x else slice(0, x_key.stop - x_key.start, x_key.step)
        out_key = out_key if host_out else slice(0, m)
    same = layout in SQUARE
    if same:
        out_key = x_key
    extent = max(p["x_at"], p["out_at"]) + 3 * max(m, n) + 3
    x_pool = Pool(extent, host_dtype if host_x else dtype)
    shared = same or layout in ("host-shared", "device-shared")
    out_pool = x_pool if shared else Pool(extent, host_dtype if host_out else dtype)

    def make():
        x_arr = x_pool.host() if host_x else x_pool.device(queue)
        if shared:
            out_arr = x_arr
        else:
            out_arr = out_pool.host() if host_out else out_pool.device(queue)
        x = x_arr[x_key]
        return x, (x if same else out_arr[out_key])

    return x_pool, x_key, out_pool, out_key, make


def refusals(x, out):
    """The documented refusals a placement may get, as (exception type, message regex)
    pairs (a call breaking two rules may name either)."""
    found = []
    for arr, name in ((x, "x"), (out, "out")):
        if not isinstance(arr, cla.Array) or not arr.size:
            continue
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            found.append((psc.InvalidInputError, f"{name} must be contiguous on the device"))
    if isinstance(x, cla.Array) and out is not None and not isinstance(out, cla.Array):
        found.append((TypeError, "out must be a pyopencl array too"))
    return found


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(spec=structures, p=placements, alpha=ALPHAS, beta=BETAS)
def test_fuzz_placement(spec, p, alpha, beta, fmt, dtype, device):
    skip_without_fp64(device, dtype)
    layout = p["layout"]
    if layout in SQUARE:
        spec = {**spec, "n": spec["m"]}
    A, x_values = build(spec)
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        event("format refused the matrix")
        return
    m, n = A.shape
    queue = op.queue
    other = np.float32 if np.dtype(dtype) == np.float64 else np.float64
    host_dtype = np.dtype(other if p["host_dtype_other"] else dtype)
    tol_dtype = np.float32 if np.float32 in (np.dtype(dtype), host_dtype) else np.float64
    align = device.cl_device.mem_base_addr_align // 8
    rng = np.random.default_rng(spec["seed"])
    columns = layout == "host-columns"
    k = p["columns"]
    x0 = np.column_stack([x_values, rng.standard_normal((n, k - 1))]) if columns \
        else x_values
    y0 = rng.standard_normal((m, k) if columns else m)

    x_pool, x_key, out_pool, out_key, make = place(p, m, n, queue, dtype, host_dtype,
                                                   align)
    pools = [x_pool] if out_pool is x_pool else [x_pool, out_pool]
    out_none = p["out_none"] and beta == 0 and layout in ("host", "device")
    if beta != 0:
        out_pool.model[out_key] = y0
    x_pool.model[x_key] = x0
    x_before = x_pool.model[x_key].astype(np.float64)
    y_before = out_pool.model[out_key].astype(np.float64) if beta != 0 else None
    if not out_none:
        out_pool.out_mask[out_key] = True
    snapshots = [pool.model.copy() for pool in pools]
    x, out = make()
    if out_none:
        out = None

    expected_errors = refusals(x, out)
    event(f"{layout}: {'refused' if expected_errors else 'product'}")
    if expected_errors:
        with pytest.raises(tuple(e for e, _ in expected_errors)) as info:
            op.matvec(x, out=out, alpha=alpha, beta=beta)
        assert any(isinstance(info.value, e) and re.search(text, str(info.value))
                   for e, text in expected_errors), f"unexpected refusal: {info.value!r}"
        for pool, before in zip(pools, snapshots):
            assert np.array_equal(bits(pool.read()), bits(before)), "a refused call wrote"
        return
    result = op.matvec(x, out=out, alpha=alpha, beta=beta)
    if layout == "sub-buffers":
        # The sub-buffers go before their whole buffer is read: NVIDIA's driver
        # (580.159.04) crashed releasing a written sub-buffer after that read, plain
        # pyopencl too (README "Aliasing").  (out is never None in this layout.)
        assert result is out
        queue.finish()
        del x, out, result
        gc.collect()
        y = out_pool.read()[out_key]
    elif out is not None:
        assert result is out
        y = out_pool.read()[out_key]
    else:
        assert isinstance(result, cla.Array if isinstance(x, cla.Array) else np.ndarray)
        # numpy's promotion of the operator's and x's types (README "type rules")
        assert result.dtype == np.result_type(op.dtype, x.dtype) and result.shape == (m,)
        y = result.get() if isinstance(result, cla.Array) else result
    for pool, before in zip(pools, snapshots):
        after = pool.read()
        keep = ~pool.out_mask
        assert np.array_equal(bits(after[keep]), bits(before[keep])), \
            f"{np.sum(bits(after[keep]) != bits(before[keep]))} entries outside out changed"
    if columns:
        for j in range(k):
            check_against_scipy(y[:, j], A, x_before[:, j], tol_dtype, alpha, beta,
                                None if y_before is None else y_before[:, j])
    else:
        check_against_scipy(y, A, x_before, tol_dtype, alpha, beta, y_before)


# -- one operator, several threads -------------------------------------------------------

PRODUCT_KINDS = [
    "host",               # numpy x into a numpy out (pre-filled when beta != 0)
    "matmul",             # op @ x
    "host-same",          # numpy out is x
    "device",             # pyopencl x and out
    "device-same",        # pyopencl out is x
    "host-x-device-out",  # numpy x into a pyopencl out
    "update-values",      # op.update_values with the values it has (same products)
]
# own_queue: the pyopencl arrays on the thread's own queue, else on the operator's;
# read_later: a device result is read after the thread's last product, not at once.
products = st.fixed_dictionaries({"kind": st.sampled_from(PRODUCT_KINDS), "alpha": ALPHAS,
                                  "beta": BETAS, "own_queue": st.booleans(),
                                  "read_later": st.booleans()})


def run_threads(work, count, timeout=THREAD_TIMEOUT):
    """``work(i)`` in ``count`` daemon threads started together; re-raise the first
    failure; fail (instead of hanging CI) when they are not all done in ``timeout``
    seconds.  Daemon threads: a hung one cannot keep the process alive either."""
    errors = []
    barrier = threading.Barrier(count, timeout=timeout)

    def run(i):
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001  re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    hung = sum(t.is_alive() for t in threads)
    if hung:
        pytest.fail(f"{hung} of {count} threads still running after {timeout} s (a hang)")
    if errors:
        raise errors[0]


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=THREAD_EXAMPLES, **SETTINGS)
@given(size=st.sampled_from([1, 65, 1000, 3000]), density=st.sampled_from([0.002, 0.03]),
       seed=st.integers(0, 2**32 - 1), out_of_order=st.booleans(),
       plans=st.lists(st.lists(products, min_size=1, max_size=5), min_size=2, max_size=4))
def test_fuzz_threads(size, density, seed, out_of_order, plans, fmt, device):
    """One operator shared by 2-4 threads, each running its own mix of products (float32:
    what is shared does not depend on the value type; the placement test draws both).
    Square (products in place), and up to 270k non-zeros: products long enough to
    overlap on the device."""
    dtype = np.float32
    A = random_csr(np.random.default_rng(seed), size, size, density)
    queue = device.queue
    if out_of_order:
        try:
            queue = cl.CommandQueue(device.context, device.cl_device, properties=OUT_OF_ORDER)
        except cl.Error:
            event("no out-of-order queues")
    op = make_operator(A, fmt, dtype=dtype, device=queue)
    if op is None:
        event("format refused the matrix")
        return
    event(f"{len(plans)} threads, {'out-of-order' if out_of_order else 'in-order'} queue")
    m, n = A.shape
    values = A.data.copy()

    def work(i):
        rng = np.random.default_rng([seed, i])
        own = cl.CommandQueue(op.device.context, op.device.cl_device)
        later = []
        for product in plans[i]:
            kind, alpha, beta = product["kind"], product["alpha"], product["beta"]
            on = own if product["own_queue"] else op.queue
            if kind == "update-values":
                op.update_values(values)
                continue
            x0 = rng.standard_normal(n)
            # out holds x (in place), y to accumulate into, or NaN (beta == 0: not read)
            y0 = (x0 if kind.endswith("same") else rng.standard_normal(m) if beta
                  else np.full(m, np.nan)).astype(dtype)
            x_in = x0.astype(dtype)
            if kind == "matmul":
                alpha, beta = 1.0, 0.0
                y = op @ x_in
            elif kind == "host":
                y = op.matvec(x_in, out=y0.copy(), alpha=alpha, beta=beta)
            elif kind == "host-same":
                v = x_in.copy()
                assert op.matvec(v, out=v, alpha=alpha, beta=beta) is v
                y = v
            elif kind == "host-x-device-out":
                out = cla.to_device(on, y0)
                assert op.matvec(x_in, out=out, alpha=alpha, beta=beta) is out
                y = out.get()
            else:
                x = cla.to_device(on, x_in)
                out = x if kind == "device-same" else cla.to_device(on, y0)
                assert op.matvec(x, out=out, alpha=alpha, beta=beta) is out
                if product["read_later"]:
                    later.append((out, x_in, alpha, beta, y0))
                    continue
                y = out.get()
            check_against_scipy(y, A, x_in, dtype, alpha, beta, y0)
        for out, x_in, alpha, beta, y0 in later:
            check_against_scipy(out.get(), A, x_in, dtype, alpha, beta, y0)

    run_threads(work, len(plans))
