"""Every format, every variant of tests/format_variants.py, both dtypes, on a corpus of
tiny edge-case matrices: the script tests/test_oclgrind.py runs under

    PYSPMV_CL_NO_CACHE=1 oclgrind --data-races --uninitialized --check-api \
        python tests/oclgrind_driver.py

Formats are read from ``pyspmv_cl.formats()`` at run time, so formats registered later
are covered.  Each product is compared with scipy as the other tests do; Oclgrind's own
findings go to its log, which test_oclgrind.py parses.  Prints one JSON line (counts,
refusals, failures); exits 1 when a product is wrong or an operator cannot be built.

y is a fresh, never-written device buffer for the beta == 0 products, so a kernel that
reads y when it must not (or leaves rows unwritten for a later pass to read) shows up
as an uninitialised-value report.

Besides each variant's products, the corpus loop runs, with each format's defaults,
transposed products, device blocks column by column (formats without block kernels)
and the lanes kernels' own parameters (LANE_VARIANTS).  Passes of their own:
``--only-complex`` (``--complex-dtype complex128`` too), ``--wide-columns`` and
``--in-place`` (the USE_HOST_PTR host path, to be run without --uninitialized);
``--quick`` reduces each to the default test run's share.

Every OpenCL object made here is kept alive until the end: Oclgrind 21.10 does not free
the uninitialised-value shadow of a released buffer, and a later buffer that reuses the
id inherits that shadow, with the old buffer's size: a kernel writing the new buffer
beyond the old size leaves it "uninitialised" and the next kernel reading it is reported
(a false positive; see test_oclgrind.py).  Never releasing buffers avoids it.
"""

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyopencl as cl  # noqa: E402
import pyopencl.array as cla  # noqa: E402
from conftest import assert_close, reference  # noqa: E402
from format_variants import (  # noqa: E402
    COMPLEX_BLOCK_VARIANTS,
    COMPLEX_VARIANTS,
    LANE_VARIANTS,
    POSITIONS64,
    PROFILE,
    QUICK,
    WIDE_COLUMN_VARIANTS,
    variants,
)
from matrix_cases import csr_from_row_lengths, magnitudes  # noqa: E402

import pyspmv_cl as psc  # noqa: E402
import pyspmv_cl.matrix as matrix_module  # noqa: E402
from pyspmv_cl.formats import csr_vector, get_format  # noqa: E402
from pyspmv_cl.host_buffers import MAP  # noqa: E402
from pyspmv_cl.launching import record_launches  # noqa: E402


class _Keep(list):
    """Every operator and device array: never released (see the docstring).
    PYSPMV_CL_OCLGRIND_RELEASE=1 releases them instead, to see the Oclgrind bug."""

    def append(self, obj):
        if not os.environ.get("PYSPMV_CL_OCLGRIND_RELEASE"):
            super().append(obj)

    def extend(self, objs):
        for obj in objs:
            self.append(obj)


KEEP = _Keep()


#: The quick pass (the default test run): each format's defaults on the real device and
#: under a GPU-shaped profile (which also converts on the device), and the sweep entries
#: format_variants.py marks QUICK; the full pass adds the other profiles and every
#: format's own sweep.
QUICK_VARIANTS = ("default", "gpu32")
# Formats with both block mappings (block_mapping: "lanes" on GPUs, "items" on CPUs):
# their block products run with each.
LANES_FORMATS = ("csr-scalar", "csr-vector")


def _keep_device_temporaries():
    """Device-side conversions make temporary pyopencl arrays (the CSR uploaded as it
    is, cast copies, layout arrays): keep those too, or a later buffer reusing one's id
    would inherit its stale shadow (hyb's COO part read "uninitialised" y and values
    until this was added)."""
    def keeping(make):
        def made(*args, **kwargs):
            arr = make(*args, **kwargs)
            KEEP.append(arr)
            return arr
        return made

    for name in ("to_device", "empty", "zeros"):
        setattr(cla, name, keeping(getattr(cla, name)))
    cla.Array.astype = keeping(cla.Array.astype)

    # Every buffer, however made: a matrix given on the device is validated by pyopencl
    # reductions whose temporaries come from none of the above, and the conversion's
    # buffers that reused their ids read "uninitialised" in the product kernels (sell's
    # col_idx after sell_scatter: "Uninitialized address" on x[col], a false positive
    # that keeping the reductions' buffers removes).
    class KeptBuffer(cl.Buffer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            KEEP.append(self)

    cl.Buffer = KeptBuffer


def corpus(rng):
    """Tiny matrices (<= 40 rows) with the structures formats trip on."""
    # Empty leading/trailing rows and a run of them, one full row, unsorted columns, a
    # duplicate entry and an explicit zero.
    lengths = rng.integers(0, 9, 37)
    lengths[:3] = 0
    lengths[-4:] = 0
    lengths[15:19] = 0
    lengths[10] = 29
    edges = csr_from_row_lengths(rng, lengths, 29, shuffle=True)
    start = edges.indptr[5]
    edges.indices[start + 1] = edges.indices[start]       # duplicate column in row 5
    edges.data[edges.indptr[6]] = 0.0                     # explicit zero in row 6
    edges.has_canonical_format = False
    # Row lengths around every power-of-two tile / vector / warp size.
    sweep = np.array([0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 0, 63 % 40,
                      6, 12, 24, 0, 1, 39, 2])
    rng.shuffle(sweep)
    return {
        "edges_37x29": edges,
        "sweep_25x40": csr_from_row_lengths(rng, sweep, 40),
        "1x1": sp.csr_matrix(rng.standard_normal((1, 1))),
        "no_nnz_9x13": sp.csr_matrix((9, 13)),
        "m_x_0": sp.csr_matrix((7, 0)),
        "one_col_40x3": sp.csr_matrix((rng.standard_normal(40), (np.arange(40),
                                                                  np.ones(40, int))),
                                      shape=(40, 3)),
    }


def wide_columns(rng):
    """40 rows over 70,001 columns: each row's columns within 1,700 of ``1700 * row``,
    so groups of a few rows span less than 16 bits, but rows 0, 21 and 39 reach across
    the matrix (their row blocks too wide for csr-vector's 16-bit offsets: escaped)."""
    rows, n = 40, 70_001
    lengths = rng.integers(0, 6, rows)
    lengths[7], lengths[30] = 0, 12
    cols = [1700 * r + rng.choice(1700, k, replace=False) for r, k in enumerate(lengths)]
    r_idx = np.concatenate([np.repeat(np.arange(rows), lengths), [0, 21, 39]])
    c_idx = np.concatenate([*cols, [n - 1, 3, 0]])
    return sp.csr_matrix((rng.standard_normal(r_idx.size), (r_idx, c_idx)),
                         shape=(rows, n))


def wide_columns_pass(device, dtypes, rng, summary, quick=False):
    """csr-vector's escape (col_wide): device conversion (compress, then widen), single
    and block products (the lanes kernel, k = 4 and 8 with two columns a work-item and
    k = 16 with four among them) and a value update, each variant and dtype.
    ``quick`` (the default run's): the first variant in the first dtype, k = 4 and 16."""
    A = wide_columns(rng)
    t0 = time.perf_counter()
    wide_variants = WIDE_COLUMN_VARIANTS[:1] if quick else WIDE_COLUMN_VARIANTS
    widths = ((4, 2), (16, 4)) if quick else ((4, 2), (8, 2), (16, 4))
    for params in wide_variants:
        for dtype in dtypes[:1] if quick else dtypes:
            if dtype == np.float64 and not device.profile.fp64:
                continue
            where = f"csr-vector/wide-columns/{dtype.name} {params}"
            try:
                op = psc.SpMV(A, format="csr-vector", dtype=dtype, device=device, **params)
                KEEP.append(op)
                assert op._impl.col_escape and op.params["col_bits"] == 16, where
                if "lane_split" in params:
                    assert op._impl._lane_split(4) == params["lane_split"], where
                summary["operators"] += 1
                if op._impl.converting_on_device:   # (Oclgrind is a GPU: compress, widen)
                    tally(summary["device_conversions"], "csr-vector")
                As = as_stored(A, op)   # (value_bits: the values rounded as stored)
                summary["products"] += products(op, As, dtype, rng, full=True, blocks=False)
                # k = 4 and 8: the lanes kernel with two columns a work-item (regular
                # rows), k = 16 with four (short, even rows)
                for k, columns in widths:
                    assert op._impl._lane_columns(k) == columns, where
                    X = rng.standard_normal((A.shape[1], k))
                    Y_d = cla.empty(op.queue, (A.shape[0], k), dtype)
                    KEEP.append(Y_d)
                    op.matmat(X.astype(dtype), out=Y_d)
                    check(Y_d.get(), As, X, dtype)
                summary["products"] += len(widths) + value_update(op, A, dtype, rng)
            except Exception:
                summary["failures"].append(f"{where}: " + traceback.format_exc(limit=3))
    summary["per_format_s"]["csr-vector/wide-columns"] = round(time.perf_counter() - t0, 2)


def in_place_pass(device, names, dtypes, matrices, rng, summary, quick=False):
    """Host products in place (host_buffers.py): x and y as USE_HOST_PTR buffers over
    the numpy arrays themselves, the result made visible by a map: the path of devices
    that compute in host memory (PoCL's CPU devices).  Oclgrind reports no unified
    memory, so each operator is switched to it as tests/test_host_in_place.py does
    (``_host_mode``).  Vectors with beta == 0 (out given or not) and beta != 0, and a
    block of 3 with beta != 0 (block kernels in place; column by column through a
    temporary for the other formats).  Every product is checked to have made host
    buffers.  ``quick``: the first matrix only (else the two structured ones).  Run
    without --uninitialized: Oclgrind 21.10 reports every read of a USE_HOST_PTR
    buffer as uninitialised (test_oclgrind.py's test_use_host_ptr_false_positive)."""
    made = []
    real = matrix_module.host_buffer

    def counting(*args, **kwargs):
        buf = real(*args, **kwargs)
        made.append(buf)
        return buf

    matrix_module.host_buffer = counting
    try:
        for name in names:
            t0 = time.perf_counter()
            for dtype in dtypes:
                if dtype == np.float64 and not device.profile.fp64:
                    continue
                for mname, A in list(matrices.items())[:1 if quick else 2]:
                    where = f"{name}/in-place/{dtype.name}/{mname}"
                    try:
                        op = built_or_refused(summary, where, name, psc.SpMV, A,
                                              format=name, dtype=dtype, device=device)
                        if op is None:
                            continue
                        op._host_mode = MAP
                        summary["products"] += in_place_products(op, A, dtype, rng, made)
                        tally(summary["in_place"], name)
                    except Exception:
                        summary["failures"].append(f"{where}: "
                                                   + traceback.format_exc(limit=3))
            summary["per_format_s"][name + "/in-place"] = round(time.perf_counter() - t0, 2)
    finally:
        matrix_module.host_buffer = real


def in_place_products(op, A, dtype, rng, made):
    """The products of :func:`in_place_pass`, each checked to have gone in place."""
    m, n = A.shape
    x = rng.standard_normal(n).astype(dtype)
    y0 = rng.standard_normal(m).astype(dtype)
    X = rng.standard_normal((n, 3)).astype(dtype)
    Y0 = rng.standard_normal((m, 3)).astype(dtype)

    def in_place(product):
        before = len(made)
        result = product()
        assert len(made) >= before + 2, "no host buffers: not the in-place path"
        return result

    check(in_place(lambda: op.matvec(x)), A, x, dtype)
    out = np.full(m, np.nan, dtype)
    in_place(lambda: op.matvec(x, out=out, alpha=0.5))
    check(out, A, x, dtype, 0.5)
    out = y0.copy()
    in_place(lambda: op.matvec(x, out=out, alpha=2.0, beta=-0.5))
    check(out, A, x, dtype, 2.0, -0.5, y0)
    out = Y0.copy()
    in_place(lambda: op.matmat(X, out=out, alpha=-1.5, beta=0.5))
    check(out, A, X, dtype, -1.5, 0.5, Y0)
    return 4


@contextlib.contextmanager
def timed(summary, key):
    """Adds the seconds the block takes to ``summary["extra_s"][key]``, and its CPU
    seconds (this process: Python, pyopencl and Oclgrind's simulation) to
    ``summary["extra_cpu_s"][key]``: what each addition to the corpus loop costs."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        for field, spent in (("extra_s", time.perf_counter() - t0),
                             ("extra_cpu_s", time.process_time() - c0)):
            extra = summary.setdefault(field, {})
            extra[key] = round(extra.get(key, 0.0) + spent, 2)


def tally(counts, name):
    counts[name] = counts.get(name, 0) + 1


def built_or_refused(summary, where, name, build, *args, **kwargs):
    """``build(*args, **kwargs)``'s operator, kept alive (KEEP) and counted; or None
    where format ``name`` refuses the matrix and may (recorded in ``summary["refused"]``
    under ``where``; a refusal by a format that never refuses is raised)."""
    try:
        op = build(*args, **kwargs)
    except psc.FormatNotSuitableError as exc:
        if not get_format(name).may_refuse:
            raise
        summary["refused"].append(f"{where}: {exc}"[:200])
        return None
    KEEP.append(op)
    summary["operators"] += 1
    return op


def make(A, name, dtype, dev, params):
    """``psc.SpMV`` with a variant's parameters; ``POSITIONS64`` (format_variants.py)
    builds csr-vector's merge mapping with 64-bit positions, as
    tests/test_csr_vector_merge.py's test_64_bit_positions forces them: ``fits_int32``
    saying no while the operator is built."""
    params = dict(params)
    if not params.pop(POSITIONS64, False):
        return psc.SpMV(A, format=name, dtype=dtype, device=dev, **params)
    fits = csr_vector.fits_int32
    csr_vector.fits_int32 = lambda *sizes: False
    try:
        op = psc.SpMV(A, format=name, dtype=dtype, device=dev, **params)
    finally:
        csr_vector.fits_int32 = fits
    assert op._impl.pos_dtype == np.int64, op._impl.pos_dtype
    return op


def transposed_products(op, A, dtype, rng, quick=False):
    """A^T through the transposed copy (built by the first one: the operator's format and
    parameters where they take A^T): ``op.T.matvec`` of a device x into a fresh device
    y (beta == 0) and ``op.rmatmat`` of a device block (k = 3: blocks of 2 and 1, or
    columns) into a written one with beta != 0; unless ``quick``, also ``op.T.matvec``
    of a host x with beta != 0 and ``op.rmatmat`` into a fresh device block."""
    m, n = A.shape
    AT = sp.csr_matrix(sp.csr_matrix(A).T)
    queue = op.queue
    x = rng.standard_normal(m)
    x_d = cla.to_device(queue, x.astype(dtype))
    y_d = cla.empty(queue, n, dtype)
    U = rng.standard_normal((m, 3))
    U_d = cla.to_device(queue, U.astype(dtype))
    Z0 = rng.standard_normal((n, 3)).astype(dtype)
    Z0_d = cla.to_device(queue, Z0)
    KEEP.extend([x_d, y_d, U_d, Z0_d])
    op.T.matvec(x_d, out=y_d, alpha=0.5)
    check(y_d.get(), AT, x, dtype, 0.5)
    op.rmatmat(U_d, out=Z0_d, alpha=2.0, beta=-0.5)
    check(Z0_d.get(), AT, U, dtype, 2.0, -0.5, Z0)
    assert op.transposed is not None
    if quick:
        return 2
    y0 = rng.standard_normal(n).astype(dtype)
    y = op.T.matvec(x.astype(dtype), out=y0.copy(), alpha=2.0, beta=-0.5)
    check(y, AT, x, dtype, 2.0, -0.5, y0)
    Z_d = cla.empty(queue, (n, 3), dtype)
    KEEP.append(Z_d)
    op.rmatmat(U_d, out=Z_d, alpha=0.5)
    check(Z_d.get(), AT, U, dtype, 0.5)
    return 4


#: The quick pass's format for k = 17 column by column (see column_products): one kernel
#: a product, so the cheapest 17 products.
COLUMNS_17_QUICK = "ellr-t"


def column_products(op, A, dtype, rng, seventeen=True):
    """A format without block kernels multiplies a block column by column
    (formats/columns.py: X transposed on the device into columns, one product each, the
    columns transposed into Y; Y transposed in first when beta != 0): k = 3 into a
    written device block (beta != 0; block_products has run k = 3 with beta == 0) and,
    with ``seventeen``, k = 17 into a fresh one (its tiles 32 columns wide, the last
    one cut short; the transposes are the same whatever the format, so the driver
    takes k = 17 once a format, once in all in the quick pass).  ``op`` has no block
    copy (csr-scalar's block kernels for its blocks): checked."""
    m, n = A.shape
    queue = op.queue
    X3 = rng.standard_normal((n, 3))
    X3_d = cla.to_device(queue, X3.astype(dtype))
    Y0 = rng.standard_normal((m, 3)).astype(dtype)
    Y0_d = cla.to_device(queue, Y0)
    KEEP.extend([X3_d, Y0_d])
    with record_launches(with_names=True) as launched:
        op.matmat(X3_d, out=Y0_d, alpha=2.0, beta=-0.5)
        check(Y0_d.get(), A, X3, dtype, 2.0, -0.5, Y0)
        if seventeen:
            X = rng.standard_normal((n, 17))
            X_d = cla.to_device(queue, X.astype(dtype))
            Y_d = cla.empty(queue, (m, 17), dtype)
            KEEP.extend([X_d, Y_d])
            op.matmat(X_d, out=Y_d, alpha=0.5)
            check(Y_d.get(), A, X, dtype, 0.5)
    names = {name for name, _ in launched}
    assert op.block_copy is None and not any(name.endswith("_block") for name in names), \
        f"not column by column: {sorted(names)}"
    assert "transpose" in names or m == 0, sorted(names)
    return 2 if seventeen else 1


def lanes_products(op, A, dtype, rng, lanes):
    """Block products of an operator built with LANE_VARIANTS' parameters, every launch
    the lanes kernel, with the parameters rendered (the split and the columns a
    work-item at k = 32, whether rows are ordered)."""
    impl = op._impl
    assert impl._lanes, lanes
    if lanes.get("lane_columns"):
        assert impl._lane_columns(32) == min(32, lanes["lane_columns"]), lanes
    if lanes.get("lane_split"):
        assert impl._lane_split(2) > 1 or A.shape[0] == 0, lanes
    if lanes.get("lane_order"):
        assert impl._ordered or A.shape[0] <= 1, lanes
    with record_launches(with_names=True) as launched:
        count = block_products(op, A, dtype, rng)
    names = {name for name, _ in launched}
    assert names and all(name.endswith("lanes_block") for name in names), sorted(names)
    return count


def as_stored(A, op):
    """A with its values as ``op`` stores them (value_bits: rounded to the stored
    type), the matrix its products must match at ``op.dtype``'s accuracy."""
    stored = op._impl.value_dtype
    if stored == op.dtype:
        return A
    A = sp.csr_matrix(A, dtype=np.float64, copy=True)
    A.data = A.data.astype(op.dtype).astype(stored).astype(np.float64)
    return A


def reduced_on_device(A, name, dtype, dev, params, rng):
    """value_bits with the matrix given on the device (rounded there by store_values,
    and for sell scattered there): a beta == 0 product into a fresh buffer."""
    queue = dev.queue
    triple = (cla.to_device(queue, A.data.astype(dtype)),
              cla.to_device(queue, A.indices.astype(np.int32)),
              cla.to_device(queue, A.indptr.astype(np.int32)))
    KEEP.extend(triple)
    op = psc.SpMV(triple, shape=A.shape, format=name, dtype=dtype, device=dev, **params)
    KEEP.append(op)
    return products(op, as_stored(A, op), dtype, rng, full=False)


def value_update(op, A, dtype, rng):
    """update_values with new values (the map found on the device for an operator
    converted there: a second conversion and the gather kernel; else the host map and
    the scatter kernel or a straight copy), then a product with x holding Inf and NaN
    at its ends: padding must still never multiply."""
    B = sp.csr_matrix(A, dtype=np.float64, copy=True)
    B.data = rng.standard_normal(B.nnz).astype(dtype).astype(np.float64)
    op.update_values(B.data.astype(dtype))
    x = rng.standard_normal(A.shape[1])
    if x.size > 1:
        x[0], x[-1] = np.inf, np.nan
    y_d = cla.empty(op.queue, A.shape[0], dtype)
    KEEP.append(y_d)
    op.matvec(x.astype(dtype), out=y_d)
    check(y_d.get(), as_stored(B, op), x, dtype)
    return 1


def check(y, A, x, dtype, alpha=1.0, beta=0.0, y0=None):
    y_ref = reference(sp.csr_matrix(A, dtype=np.float64, copy=True), x, alpha, beta, y0)
    assert_close(y, y_ref, magnitudes(A), x, dtype)


def products(op, A, dtype, rng, full, blocks=True):
    """beta == 0 into a fresh device buffer; with ``full`` also NaN/Inf in x and a host
    product with beta != 0 (y read)."""
    m, n = A.shape
    queue = op.queue
    xs = [rng.standard_normal(n)]
    if full and n > 1:
        special = rng.standard_normal(n)
        special[0], special[-1] = np.inf, np.nan   # padding must never multiply x
        xs.append(special)
    for x in xs:
        x_d = cla.to_device(queue, x.astype(dtype))
        y_d = cla.empty(queue, m, dtype)
        KEEP.extend([x_d, y_d])
        op.matvec(x_d, out=y_d, alpha=0.5)
        check(y_d.get(), A, x, dtype, 0.5)
    if full:
        x = xs[0]
        y0 = rng.standard_normal(m).astype(dtype)
        y = op.matvec(x, out=y0.copy(), alpha=2.0, beta=-0.5)
        check(y, A, x, dtype, 2.0, -0.5, y0)
        return len(xs) + 1 + (block_products(op, A, dtype, rng) if blocks else 0)
    return len(xs)


def block_products(op, A, dtype, rng):
    """Multi-vector products (block kernels where the format has them, else the column
    loop): k = 3 (blocks of 2 and 1) into a fresh device block with beta == 0, and
    k = 35 (32, 2, 1) on the host with beta != 0."""
    m, n = A.shape
    queue = op.queue
    X = rng.standard_normal((n, 3))
    X_d = cla.to_device(queue, X.astype(dtype))
    Y_d = cla.empty(queue, (m, 3), dtype)
    KEEP.extend([X_d, Y_d])
    op.matmat(X_d, out=Y_d, alpha=0.5)
    check(Y_d.get(), A, X, dtype, 0.5)
    X = rng.standard_normal((n, 35))
    Y0 = rng.standard_normal((m, 35)).astype(dtype)
    Y = op.matmat(np.asfortranarray(X), out=Y0.copy(), alpha=2.0, beta=-0.5)
    check(Y, A, X, dtype, 2.0, -0.5, Y0)
    return 2


def complex_products(op, A, dtype, rng, adjoint=False):
    """Complex values (formats with ``complex_values``): a complex x into a fresh device
    buffer with beta == 0 and complex alpha, a host product with complex beta != 0 (y
    read); with ``adjoint`` (each format's defaults on the first matrix), A^H and A^T
    through the transposed copy (which holds A^H; ``op.T`` conjugates x, the scalars
    and y around it): ``op.H`` and ``op.T`` of a device x into fresh device buffers
    (beta == 0), ``op.H`` of a host x with complex beta != 0, and ``op.T`` into a
    written device y with complex beta != 0 (y conjugated in and out)."""
    m, n = A.shape
    A = sp.csr_matrix(A, dtype=np.complex128)
    x = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    x_d = cla.to_device(op.queue, x.astype(dtype))
    y_d = cla.empty(op.queue, m, dtype)
    KEEP.extend([x_d, y_d])
    op.matvec(x_d, out=y_d, alpha=0.5 - 1j)
    ccheck(y_d.get(), (0.5 - 1j) * (A @ x), A, x, dtype)
    y0 = (rng.standard_normal(m) + 1j * rng.standard_normal(m)).astype(dtype)
    y = op.matvec(x, out=y0.copy(), alpha=2.0, beta=-0.5 + 1j)
    ccheck(y, 2.0 * (A @ x) + (-0.5 + 1j) * y0, A, x, dtype, abs(y0) * 1.2)
    if not adjoint:
        return 2
    AH = sp.csr_matrix(A.conj().T)
    AT = sp.csr_matrix(A.T)
    u = rng.standard_normal(m) + 1j * rng.standard_normal(m)
    u_d = cla.to_device(op.queue, u.astype(dtype))
    z_d = cla.empty(op.queue, n, dtype)
    w_d = cla.empty(op.queue, n, dtype)
    z0 = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    z0_d = cla.to_device(op.queue, z0)
    KEEP.extend([u_d, z_d, w_d, z0_d])
    op.H.matvec(u_d, out=z_d, alpha=0.5 - 1j)
    ccheck(z_d.get(), (0.5 - 1j) * (AH @ u), AH, u, dtype)
    op.T.matvec(u_d, out=w_d, alpha=1j)
    ccheck(w_d.get(), 1j * (AT @ u), AT, u, dtype)
    z = op.H.matvec(u, out=z0.copy(), alpha=2.0, beta=-0.5 + 1j)
    ccheck(z, 2.0 * (AH @ u) + (-0.5 + 1j) * z0, AH, u, dtype, abs(z0) * 1.2)
    op.T.matvec(u_d, out=z0_d, alpha=2.0 - 1j, beta=0.5j)
    ccheck(z0_d.get(), (2.0 - 1j) * (AT @ u) + 0.5j * z0, AT, u, dtype, abs(z0) * 1.2)
    assert op.transposed is not None
    return 6


def complex_block_products(op, A, dtype, rng, wide=False):
    """Complex block kernels (every launch one of them): k = 3 (blocks of 2 and 1) into a
    fresh device block with beta == 0 and complex alpha, k = 7 (4, 2, 1) from a host
    column-major X with complex beta != 0 (Y read), and A^H @ U for k = 3 on the device
    (the transposed copy's block kernels, built beforehand).  ``wide``: k = 8, 17 and 9
    instead, width 8 (16 lanes) in each, which Oclgrind 21.10's --uninitialized
    misreads (test_oclgrind.py's test_sixteen_lane_shuffle_false_positive)."""
    m, n = A.shape
    A = sp.csr_matrix(A, dtype=np.complex128)
    AH = A.conj().T.tocsr()
    queue = op.queue
    k_device, k_host, k_adjoint = (8, 17, 9) if wide else (3, 7, 3)
    op.build_transposed()

    def cblock(rows, k):
        return rng.standard_normal((rows, k)) + 1j * rng.standard_normal((rows, k))

    X = cblock(n, k_device)
    X_d = cla.to_device(queue, X.astype(dtype))
    Y_d = cla.empty(queue, (m, k_device), dtype)
    U = cblock(m, k_adjoint)
    U_d = cla.to_device(queue, U.astype(dtype))
    Z_d = cla.empty(queue, (n, k_adjoint), dtype)
    KEEP.extend([X_d, Y_d, U_d, Z_d])
    with record_launches(with_names=True) as launched:
        op.matmat(X_d, out=Y_d, alpha=0.5 - 1j)
        ccheck(Y_d.get(), (0.5 - 1j) * (A @ X), A, X, dtype)
        X = cblock(n, k_host)
        Y0 = cblock(m, k_host).astype(dtype)
        Y = op.matmat(np.asfortranarray(X), out=Y0.copy(), alpha=2.0, beta=-0.5 + 1j)
        ccheck(Y, 2.0 * (A @ X) + (-0.5 + 1j) * Y0, A, X, dtype, abs(Y0) * 1.2)
        op.H.matmat(U_d, out=Z_d, alpha=1j)
        ccheck(Z_d.get(), 1j * (AH @ U), AH, U, dtype)
    names = {name for name, _ in launched}
    assert names and all(name.endswith("_block") for name in names), \
        f"not block kernels: {names}"
    return 3


def ccheck(y, ref, A, x, dtype, extra=0.0):
    """|y - ref| within 1e-5 of |A| |x| (+ extra); NaN nowhere (nothing unwritten)."""
    y = np.asarray(y, dtype=np.complex128)
    assert not np.isnan(y).any(), "NaN in a complex product"
    scale = abs(A) @ np.abs(x) + np.abs(ref) + extra
    assert np.all(np.abs(y - ref) <= 1e-5 * scale + 1e-30), "complex product off"


def complex_pass(device, names, matrices, rng, summary, wide=False, dtype=np.complex64,
                 quick=False):
    """Each complex-capable format with its defaults and its COMPLEX_VARIANTS, in
    ``dtype``, on the corpus (not with ``wide``), A^H and A^T with the defaults on the
    first matrix, then its block variants (:func:`complex_block_pass`).  ``quick``: the
    defaults on the first matrix alone, no A^H or A^T, no block variants."""
    dtype = np.dtype(dtype)
    for name in names:
        if not get_format(name).complex_values:
            continue
        t0 = time.perf_counter()
        corpus_runs = list(matrices.items())[:1] if quick else matrices.items()
        runs = [] if wide else [(mname, A, params) for params in
                                [{}] + ([] if quick else COMPLEX_VARIANTS.get(name, []))
                                for mname, A in corpus_runs]
        for mname, A, params in runs:
            A = sp.csr_matrix(A, dtype=np.complex128)
            A.data = A.data * (1 - 0.5j) + 0.25j   # explicit zeros become non-zero
            where = f"{name}/{dtype.name}/{mname}" + (f" {params}" if params else "")
            adjoint = not (params or quick) and mname == next(iter(matrices))
            try:
                op = built_or_refused(summary, where, name, psc.SpMV, A, format=name,
                                      dtype=dtype, device=device, **params)
                if op is None:
                    continue
                with timed(summary, "adjoint" if adjoint else "complex"):
                    summary["products"] += complex_products(op, A, dtype, rng, adjoint)
                if adjoint:
                    tally(summary["transposed"], name)
            except Exception:
                summary["failures"].append(f"{where}: " + traceback.format_exc(limit=3))
        summary["per_format_s"][name + "/complex"] = round(time.perf_counter() - t0, 2)
        if name in COMPLEX_BLOCK_VARIANTS and not quick:
            t0 = time.perf_counter()
            complex_block_pass(device, name, matrices, rng, summary, wide, dtype)
            summary["per_format_s"][name + "/complex-block"] = round(
                time.perf_counter() - t0, 2)


def complex_block_pass(device, name, matrices, rng, summary, wide, dtype):
    """Format ``name``'s complex block variants on the two structured matrices."""
    for i, params in enumerate(COMPLEX_BLOCK_VARIANTS[name]):
        params = dict(params)
        override = params.pop(PROFILE, None)
        dev = device.override(**override) if override else device
        for mname, A in list(matrices.items())[:2]:
            A = sp.csr_matrix(A, dtype=np.complex128)
            A.data = A.data * (1 - 0.5j) + 0.25j
            where = f"{name}/{dtype.name}-block-v{i}/{mname}"
            try:
                op = psc.SpMV(A, format=name, dtype=dtype, device=dev, **params)
                KEEP.append(op)
                summary["operators"] += 1
                summary["products"] += complex_block_products(op, A, dtype, rng, wide)
            except Exception:
                summary["failures"].append(f"{where} {params}: "
                                           + traceback.format_exc(limit=3))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", help="comma-separated subset (default: all)")
    parser.add_argument("--dtypes", default="float32,float64",
                        help="the sweep's variants run in the first one only")
    parser.add_argument("--device", default=None, help="pyspmv_cl device selection")
    parser.add_argument("--complex", action="store_true",
                        help="also a complex64 pass of the complex-capable formats: their "
                        "defaults, and the block variants of format_variants.py")
    parser.add_argument("--only-complex", action="store_true",
                        help="the complex64 pass alone (no real pass)")
    parser.add_argument("--wide-complex-blocks", action="store_true",
                        help="the complex pass: block variants only, with width-8 blocks")
    parser.add_argument("--wide-columns", action="store_true",
                        help="csr-vector's escaped 16-bit columns alone (no other pass)")
    parser.add_argument("--complex-dtype", default="complex64",
                        help="the complex pass's type (complex64 or complex128)")
    parser.add_argument("--in-place", action="store_true",
                        help="host products in place (USE_HOST_PTR) alone (no other pass)")
    parser.add_argument("--quick", action="store_true",
                        help="each format's defaults, natively and under a GPU profile, "
                        "and its value_bits variants")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # keep stderr for Oclgrind's reports
    _keep_device_temporaries()
    started = time.perf_counter()
    device = psc.get_device(args.device)
    names = args.formats.split(",") if args.formats else psc.formats()
    dtypes = [np.dtype(d) for d in args.dtypes.split(",")]
    rng = np.random.default_rng(int(os.environ.get("PYSPMV_CL_OCLGRIND_SEED", "20261122")))
    matrices = corpus(rng)
    summary = {"device": device.profile.name, "formats": names, "operators": 0,
               "products": 0, "refused": [], "failures": [], "per_format_s": {},
               "device_conversions": {}, "value_updates": 0, "transposed": {},
               "column_blocks": {}, "lane_variants": [], "positions64": 0,
               "in_place": {}, "columns_17": [], "dtypes": [d.name for d in dtypes],
               "extra_s": {},
               "extra_cpu_s": {}}
    if args.wide_columns:
        wide_columns_pass(device, dtypes, rng, summary, args.quick)
    if args.in_place:
        in_place_pass(device, names, dtypes, matrices, rng, summary, args.quick)
    for name in [] if (args.only_complex or args.wide_complex_blocks
                       or args.wide_columns or args.in_place) else names:
        t0 = time.perf_counter()
        for label, override, params, all_dtypes, quick in variants(name):
            reduced = label.startswith("bits")   # value_bits: VALUE_BITS_VARIANTS
            plain = {k: v for k, v in params.items() if k != POSITIONS64}
            if args.quick and label not in QUICK_VARIANTS and not quick:
                continue   # a sweep entry, or a profile the full pass covers
            dev = device.override(**override) if override else device
            for dtype in dtypes if all_dtypes else dtypes[:1]:
                if dtype == np.float64 and not dev.profile.fp64:
                    continue
                if reduced and params["value_bits"] >= dtype.itemsize * 8:
                    continue   # the dtype's own width: its default, run above
                for i, (mname, A) in enumerate(matrices.items()):
                    where = f"{name}/{label}/{dtype.name}/{mname}"
                    try:
                        with timed(summary, "positions64") if params.get(
                                POSITIONS64) else contextlib.nullcontext():
                            op = built_or_refused(summary, where, name, make, A, name,
                                                  dtype, dev, params)
                        if op is None:
                            continue
                        summary["positions64"] += bool(params.get(POSITIONS64))
                        # Operators converted on the device (GPU profiles: a format with
                        # host_input_on_device uploads the CSR and lays it out there).
                        if op._impl.converting_on_device:
                            counts = summary["device_conversions"]
                            counts[name] = counts.get(name, 0) + 1
                        if reduced and i == 0:
                            summary["operators"] += 1
                            summary["products"] += reduced_on_device(
                                A, name, dtype, dev, plain, rng)
                        A = as_stored(A, op)
                        # The full set on the two structured matrices, beta == 0 elsewhere.
                        # Block kernels with each format's defaults (both dtypes in the
                        # full pass, float32 in the quick one): their compiles dominate
                        # Oclgrind's time.
                        # ell's and sell's lanes block kernels run on GPU profiles only.
                        gpu_lanes = (label == "gpu32" and name in ("ell", "sell")
                                     and i == 0)
                        with timed(summary, "positions64") if params.get(
                                POSITIONS64) else contextlib.nullcontext():
                            summary["products"] += products(
                                op, A, dtype, rng, full=i < 2,
                                blocks=(label == "default" or reduced or gpu_lanes) and (
                                    not args.quick or dtype == np.float32))
                        if (label == "default" and name in LANES_FORMATS
                                and (not args.quick or dtype == np.float32)):
                            # The block mapping the device type did not pick.
                            other = ({"items", "lanes"} - {op.params["block_mapping"]}).pop()
                            op2 = psc.SpMV(A, format=name, dtype=dtype, device=dev,
                                           block_mapping=other, **plain)
                            KEEP.append(op2)
                            summary["products"] += block_products(op2, A, dtype, rng)
                        # The first matrices (the first in the quick pass, float32):
                        # transposed products (the full pass: the second matrix in the
                        # first dtype alone), blocks column by column, lanes kernels'
                        # own parameters.
                        extras = label == "default" and i < (1 if args.quick else 2) and (
                            not args.quick or dtype == np.float32)
                        if extras and (i == 0 or dtype == dtypes[0]):
                            with timed(summary, "transposed"):
                                summary["products"] += transposed_products(
                                    op, A, dtype, rng, args.quick)
                            tally(summary["transposed"], name)
                        if extras and not op._impl.has_block_kernels:
                            with timed(summary, "column_blocks"):
                                # Without the block copy: a CPU profile buys it for the
                                # first block product here, a GPU's never pays for it.
                                op3 = op if dev.profile.is_gpu else psc.SpMV(
                                    A, format=name, dtype=dtype, device=dev,
                                    block_copy=False, **plain)
                                KEEP.append(op3)
                                seventeen = name == COLUMNS_17_QUICK if args.quick else (
                                    i == 0 and dtype == dtypes[0])
                                summary["products"] += column_products(op3, A, dtype, rng,
                                                                       seventeen)
                            tally(summary["column_blocks"], name)
                            summary["columns_17"] += [name] if seventeen else []
                        for lanes in LANE_VARIANTS.get(name, []) if (
                                extras and dtype == dtypes[0]) else []:
                            if args.quick and not lanes.get(QUICK):
                                continue
                            lanes = {k: v for k, v in lanes.items() if k != QUICK}
                            with timed(summary, "lane_variants"):
                                op3 = psc.SpMV(A, format=name, dtype=dtype, device=dev,
                                               **lanes)
                                KEEP.append(op3)
                                summary["products"] += lanes_products(op3, A, dtype, rng,
                                                                      lanes)
                            summary["lane_variants"].append(f"{name} {lanes}")
                        # (last: it changes the operator's values)
                        if i == 0 and not reduced and label in ("default", "gpu32"):
                            summary["products"] += value_update(op, A, dtype, rng)
                            summary["value_updates"] += 1
                    except Exception:
                        summary["failures"].append(f"{where} {params}: "
                                                   + traceback.format_exc(limit=3))
        summary["per_format_s"][name] = round(time.perf_counter() - t0, 2)
    if args.complex or args.only_complex or args.wide_complex_blocks:
        complex_pass(device, names, matrices, rng, summary, args.wide_complex_blocks,
                     np.dtype(args.complex_dtype), args.quick)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["cpu_seconds"] = round(time.process_time(), 2)
    print(json.dumps(summary), flush=True)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
