"""Every Matrix Market file of MATRIX_DIR (``*.mtx.gz``), every format, both dtypes and
every device, against scipy with a fresh random x.  Complex matrices must be refused
with a clear ``UnsupportedDtypeError``."""

import functools
import gzip

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from conftest import MATRIX_DIR, make_operator, poisoned, skip_without_fp64
from matrix_cases import check_against_scipy

import pyspmv_cl as psc
from pyspmv_cl.formats import get_format

FORMATS = psc.formats()  # read at collection time: new formats are covered automatically
FILES = sorted(MATRIX_DIR.glob("*.mtx.gz")) if MATRIX_DIR.is_dir() else []
NAMES = [f.name[:-len(".mtx.gz")] for f in FILES]

pytestmark = pytest.mark.skipif(not FILES, reason=f"no *.mtx.gz matrices in {MATRIX_DIR}")


@functools.cache
def load(name):
    """The matrix as read by scipy (once per session), as CSR in its own dtype."""
    with gzip.open(MATRIX_DIR / f"{name}.mtx.gz", "rb") as stream:
        A = scipy.io.mmread(stream)
    A = sp.csr_matrix(A)
    A.data.setflags(write=False)  # shared by every test: nobody may change it
    return A


def _is_complex(name):
    return load(name).dtype.kind == "c"


# float64 by default (the reference's precision, where a format's summation order shows
# least), float32 too with --exhaustive (tests/conftest.py): half the default run's time.
@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.float32,
                                                        marks=pytest.mark.exhaustive)],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", NAMES or ["none"])
def test_real_matrix(name, fmt, dtype, device, rng):
    A = load(name)
    if A.dtype.kind == "c":
        # A real dtype is refused (the imaginary parts would be lost); the complex
        # dtype of the same precision works in the formats that take complex values.
        with pytest.raises(psc.UnsupportedDtypeError, match="imaginary|complex"):
            psc.SpMV(A, format=fmt, dtype=dtype, device=device)
        cdtype = np.result_type(dtype, np.complex64)
        skip_without_fp64(device, cdtype)
        if not get_format(fmt).complex_values:
            with pytest.raises(psc.UnsupportedDtypeError, match="complex"):
                psc.SpMV(A, format=fmt, dtype=cdtype, device=device)
            return
        op = make_operator(A, fmt, dtype=cdtype, device=device)
        if op is not None:
            x = rng.standard_normal(n := A.shape[1]) + 1j * rng.standard_normal(n)
            y, ref = op @ x, A.astype(np.complex128) @ x
            scale = abs(A) @ np.abs(x) + np.abs(ref)
            tol = 1e-12 if cdtype == np.complex128 else 1e-4
            assert np.all(np.abs(y - ref) <= tol * scale + 1e-30)
        return
    skip_without_fp64(device, dtype)
    m, n = A.shape
    op = make_operator(A, fmt, dtype=dtype, device=device)
    if op is None:
        return
    assert op.shape == A.shape and op.dtype == np.dtype(dtype) and op.format == fmt
    x = rng.standard_normal(n)
    y = op.matvec(x, out=poisoned(m, dtype))
    check_against_scipy(y, A, x, dtype)
    x = rng.standard_normal(n)
    y0 = rng.standard_normal(m).astype(dtype)
    y = op.matvec(x, out=y0.copy(), alpha=-0.5, beta=2.0)
    check_against_scipy(y, A, x, dtype, -0.5, 2.0, y0)


def test_complex_matrix_present():
    """The corpus holds at least one complex matrix, so the refusal above is exercised."""
    assert any(_is_complex(name) for name in NAMES)
