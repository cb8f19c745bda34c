"""The multi-vector grid of #16: every format x float32, float64, complex64, complex128
x k = 1, 3, 17, 33, 64 x every layout of ``op @ X`` / ``op.matmat(X, out, alpha, beta)``
against scipy (float64 / complex128), with fresh random data.

Layouts: host X C-ordered, F-ordered and a non-contiguous view, host out C, F and a
view; device X row-major (C) and column-major (F), each also as a view at an offset of
a larger array, into device out C and F; results from ``op @ X`` (out made), into a
NaN-POISONED out with beta == 0 (an unwritten entry fails) and into a given out with
beta != 0; alpha and beta complex for complex values.  The formats without block
kernels run the grid column by column (``block_copy=False``) and with the default
block copy (made when block products have paid for it, then forced by
``build_block_copy``; README "Formats without block kernels"); the formats with them
run it on their default block kernels and, for the wide matrix, on their other block
mapping (lanes under a GPU profile on a CPU, items under a CPU profile on a GPU).

Matrices every format takes with its default parameters (dia and ell refuse some): a
wide and a tall rectangular band of few diagonals with holes and empty rows (first,
last and inside), values spread over six orders of magnitude.

PoCL's compilation dominates, so each test builds its operators once per (format,
dtype) and runs every k and layout on them; k = 1, 3, 17, 33, 64 take the block widths
1, 2 and 16 (8 for complex values: 17 = 8+8+1, 33 = 4x8+1), see tests/test_spmm.py.
The full grid is ``exhaustive``; the default run has a slice of it (``quick_only``)."""

import numpy as np
import pyopencl.array as cla
import pytest
import scipy.sparse as sp
from conftest import DEVICE_IDS, DEVICES, FIRST_OF_EACH_TYPE, assert_cclose, skip_without_fp64
from test_spmm import BLOCK_FORMATS, BLOCK_KERNEL, launched_kernels, poisoned

import pyspmv_cl as psc

FORMATS = psc.formats()
DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
DTYPE_IDS = ["f32", "f64", "c64", "c128"]
KS = (1, 3, 17, 33, 64)

# The default run's slice: a block-kernel format and one without per value type, the
# complex ones reaching past a complex block's width of 8.
SLICE = [("csr-vector", np.complex64, (3, 17)), ("sell", np.float32, (3, 17)),
         ("coo", np.complex128, (3, 17)), ("csr5", np.float64, (3,))]

# One CPU, one GPU... (conftest's notes): a second PoCL build of the same CPU would
# double this compile-bound grid.
GRID_DEVICES = [pytest.param(d, id=DEVICE_IDS[DEVICES.index(d)])
                for d in FIRST_OF_EACH_TYPE] or [pytest.param(None, id="no-device")]


def band_with_holes(rng, m, n, offsets, dtype):
    """An m x n band of the given diagonals, about a third of its entries dropped, rows
    0, 7-9, m//2 and m-1 empty; complex values for a complex dtype; stored in ``dtype``
    (so the reference multiplies the very values the operator holds)."""
    A = sp.diags([rng.standard_normal(min(m, n)) for _ in offsets], offsets,
                 shape=(m, n), format="csr")
    if np.dtype(dtype).kind == "c":
        A = A + 1j * sp.diags([rng.standard_normal(min(m, n)) for _ in offsets],
                              offsets, shape=(m, n), format="csr")
    A = sp.csr_matrix(A)
    A.data[rng.random(A.nnz) < 0.35] = 0
    A.data[::7] *= 1e3         # a spread of magnitudes
    A.data[3::11] *= 1e-3
    rows = np.zeros(m, dtype=bool)
    rows[[0, 7, 8, 9, m // 2, m - 1]] = True
    A = sp.diags((~rows).astype(float)) @ A
    A = sp.csr_matrix(A, dtype=dtype)
    A.eliminate_zeros()
    assert (np.diff(A.indptr) == 0).sum() >= 6 and A.nnz > 200
    return A


def matrices(rng, dtype):
    return [band_with_holes(rng, 157, 211, (-5, -1, 0, 1, 4, 30), dtype),     # wide
            band_with_holes(rng, 203, 131, (-40, -3, 0, 2, 3), dtype)]        # tall


def block(rng, rows, k, dtype):
    X = rng.standard_normal((rows, k))
    if np.dtype(dtype).kind == "c":
        X = X + 1j * rng.standard_normal((rows, k))
    return X.astype(dtype)


class Grid:
    """One operator's products against scipy, for one matrix and one value type."""

    def __init__(self, op, A, dtype, rng):
        self.op, self.A, self.dtype, self.rng = op, A, np.dtype(dtype), rng
        self.A128 = sp.csr_matrix(A, dtype=np.complex128)
        self.complex = self.dtype.kind == "c"
        # assert_cclose's tolerance is that of the complex type of the same precision
        self.tol_dtype = np.result_type(self.dtype, np.complex64)

    def scalars(self):
        """(alpha, beta), beta != 0: complex ones for complex values."""
        r = self.rng.standard_normal(4)
        if self.complex:
            return complex(r[0], r[1]), complex(r[2], r[3]) or 1j
        return float(r[0]), float(r[2]) or 0.5

    def check(self, Y, X, alpha=1.0, beta=0.0, Y0=None):
        """Y == alpha A X + beta Y0 (scipy in complex128), no NaN where scipy has none
        (a poisoned entry left unwritten fails); the error bound scales with
        |alpha| |A| |X| + |beta Y0| + |result|."""
        X = np.asarray(X, dtype=np.complex128)
        want = alpha * (self.A128 @ X)
        if Y0 is not None:
            Y0 = np.asarray(Y0, dtype=np.complex128)
            want = want + beta * Y0
        # (assert_cclose's |A| |x| term: |alpha X| gives |alpha| |A| |X|)
        assert_cclose(Y, want, self.A128, abs(alpha) * np.abs(X), self.tol_dtype,
                      Y0, beta)

    def run(self, ks):
        for k in ks:
            self.host(k)
            self.device(k)

    def host(self, k):
        op, dtype, rng = self.op, self.dtype, self.rng
        m, n = op.shape
        X = block(rng, n, k, dtype)
        Y = op @ X                                              # C, out made
        assert Y.dtype == dtype and Y.shape == (m, k)
        self.check(Y, X)
        wider = self.complex and np.complex128 or np.float64   # numpy's promotion
        Y = op @ X.astype(wider)
        assert Y.dtype == np.result_type(dtype, wider)
        self.check(Y, X)
        alpha, beta = self.scalars()
        for order in "CF":                                     # poisoned out, beta == 0
            out = poisoned((m, k), dtype, order=order)
            assert op.matmat(np.asfortranarray(X), out=out, alpha=alpha) is out
            self.check(out, X, alpha)
        big = block(rng, 2 * n, 3 * k + 1, dtype)
        view = big[::2, 1::3]                                  # neither C nor F
        assert view.shape == (n, k) and (k == 1 or not (
            view.flags.c_contiguous or view.flags.f_contiguous))
        self.check(op @ view, view)
        outs = poisoned((2 * m, 2 * k), dtype)
        out = outs[1::2, ::2]                                  # a strided out view
        assert op.matmat(view, out=out, alpha=alpha) is out
        self.check(out, view, alpha)
        assert np.isnan(outs[0::2]).all() and np.isnan(outs[1::2, 1::2]).all()
        for x, order in ((X, "F"), (np.asfortranarray(X), "C"), (view, "F")):
            Y0 = block(rng, m, k, dtype)                       # given out, beta != 0
            out = Y0.copy(order=order)
            assert op.matmat(x, out=out, alpha=alpha, beta=beta) is out
            self.check(out, x, alpha, beta, Y0)
        Y0 = block(rng, m, k, dtype)
        out = outs[1::2, ::2]
        out[...] = Y0
        op.matmat(view, out=out, alpha=alpha, beta=beta)
        self.check(out, view, alpha, beta, Y0)

    def xs(self, X):
        """X on the device: row-major, column-major, and each as a view at an offset
        of a larger array (a row range of a row-major block; a column range of a
        column-major one)."""
        q, (n, k) = self.op.queue, X.shape
        rows = np.zeros((n + 3, k), dtype=X.dtype)
        rows[2:n + 2] = X
        cols = np.zeros((n, k + 2), dtype=X.dtype, order="F")
        cols[:, 1:k + 1] = X
        views = [cla.to_device(q, rows)[2:n + 2], cla.to_device(q, cols)[:, 1:k + 1]]
        assert all(v.offset and v.shape == (n, k) for v in views)
        assert views[1].flags.f_contiguous
        return [cla.to_device(q, X), cla.to_device(q, np.asfortranarray(X)), *views]

    def device(self, k):
        op, dtype, rng, q = self.op, self.dtype, self.rng, self.op.queue
        m, n = op.shape
        X = block(rng, n, k, dtype)
        Xds = self.xs(X)
        for Xd in Xds[:2]:                                     # out made: row-major
            Y = op @ Xd
            assert isinstance(Y, cla.Array) and Y.dtype == dtype and Y.shape == (m, k)
            assert Y.flags.c_contiguous
            self.check(Y.get(), X)
        alpha, beta = self.scalars()
        for Xd in Xds:
            for order in "CF":
                out = cla.to_device(q, poisoned((m, k), dtype, order=order))
                assert op.matmat(Xd, out=out, alpha=alpha) is out
                assert out.flags.f_contiguous if order == "F" else out.flags.c_contiguous
                self.check(out.get(), X, alpha)
                Y0 = block(rng, m, k, dtype)
                out = cla.to_device(q, np.asarray(Y0, order=order))
                assert op.matmat(Xd, out=out, alpha=alpha, beta=beta) is out
                self.check(out.get(), X, alpha, beta, Y0)
        assert np.array_equal(Xds[0].get(), X) and np.array_equal(Xds[3].get(), X)


LANES_KERNEL = {"csr-scalar": "csr_lanes_block", "csr-vector": "csr_lanes_block",
                "ell": "ell_lanes_block", "sell": "sell_lanes_block"}


def launched_kernel(op):
    """The one kernel a device block product of two vectors launches."""
    X = cla.zeros(op.queue, (op.shape[1], 2), op.dtype)
    names, _ = launched_kernels(lambda: op @ X)
    assert len(names) == 1, names
    return names[0]


def operators(device, A, fmt, dtype, other_mapping):
    """(name, operator) pairs to run the grid on: the format's own block kernels (and
    with ``other_mapping`` those of its other block mapping), or for a format without
    them, column by column (block_copy=False) and the default (the block copy made once
    paid for)."""
    op = psc.SpMV(A, fmt, dtype=dtype, device=device)   # default parameters: no refusal
    assert op.format == fmt and op.dtype == dtype
    if fmt in BLOCK_FORMATS:
        assert op.has_block_kernels and op.build_block_copy() is None
        if not other_mapping:
            return [("block kernels", op)]
        # The other block mapping: the lanes kernels (the GPU default, up to 32 wide)
        # under a GPU profile on a CPU, the items ones under a CPU profile on a GPU.
        other = device.override(device_type="cpu" if device.profile.is_gpu else "gpu")
        lanes = psc.SpMV(A, fmt, dtype=dtype, device=other)
        assert lanes.has_block_kernels
        kernels = {launched_kernel(o) for o in (op, lanes)}
        assert kernels == {BLOCK_KERNEL[fmt], LANES_KERNEL[fmt]}, kernels
        return [("block kernels", op), ("other mapping", lanes)]
    assert not op.has_block_kernels
    columns = psc.SpMV(A, fmt, dtype=dtype, device=device, block_copy=False)
    return [("columns", columns), ("default", op)]


def run_grid(device, fmt, dtype, ks):
    skip_without_fp64(device, dtype)
    rng = np.random.default_rng()
    for tall, A in enumerate(matrices(rng, dtype)):
        for name, op in operators(device, A, fmt, dtype, other_mapping=not tall):
            # (the wide matrix's wide blocks are enough of one product a column, and
            # of the other block mapping)
            Grid(op, A, dtype, rng).run([k for k in ks if k <= 17]
                                        if tall and name == "columns" else ks)
            if name == "columns":
                assert op.block_copy is None and op.build_block_copy() is None
                assert op.nbytes_parts["blocks"] == 0
            elif name == "default":
                # Made by the grid's products on a CPU (README: once a block or two of
                # 8 have paid for it, 10-20 for the slower copies: by k = 17 here), so
                # the small blocks ran column by column; where not (a GPU repays it
                # later), made now.  The blocks the copy has not run yet run on it.
                made = op.block_copy is not None
                copy = op.build_block_copy()
                assert copy is op.block_copy and copy.format == "csr-scalar"
                assert copy.has_block_kernels and op.nbytes_parts["blocks"] == copy.nbytes
                Grid(op, A, dtype, rng).run([k for k in ks if k <= 17] if made else ks)


@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("device", GRID_DEVICES, indirect=True)
def test_block_grid(device, fmt, dtype):
    run_grid(device, fmt, dtype, KS)


@pytest.mark.quick_only
@pytest.mark.parametrize("fmt, dtype, ks", SLICE,
                         ids=[f"{f}-{DTYPE_IDS[DTYPES.index(d)]}" for f, d, _ in SLICE])
@pytest.mark.parametrize("device", GRID_DEVICES, indirect=True)
def test_block_grid_slice(device, fmt, dtype, ks):
    run_grid(device, fmt, dtype, ks)
