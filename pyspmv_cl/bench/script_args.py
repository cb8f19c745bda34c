"""Argument checks shared by the benchmark scripts: bad arguments become one
``ap.error`` line (exit status 2) up front instead of a traceback mid-run."""

import argparse
import os
from pathlib import Path

import numpy as np

from pyspmv_cl.bench.generators import from_spec, resolve_name

#: The shared matrices beside the checkout (PYSPMV_CL_MATRIX_DIR overrides).
MATRIX_DIR = Path(__file__).resolve().parents[3] / "shared" / "matrices"


def _at_least(low):
    """argparse type: an integer >= ``low``."""
    def check(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {low}")
        return value
    return check


#: argparse types: an integer >= 1, an integer >= 0.
positive_int = _at_least(1)
nonnegative_int = _at_least(0)


def resolve_matrix(spec, default_dir=MATRIX_DIR):
    """A matrix spec for ``from_spec``: a bare name (``cage10``) or file name
    (``cage10.mtx.gz``) found in PYSPMV_CL_MATRIX_DIR (else ``default_dir``) as that
    file's path; anything else unchanged."""
    spec = resolve_name(spec, default_dir)
    if ":" not in spec and not Path(spec).exists():
        path = Path(os.environ.get("PYSPMV_CL_MATRIX_DIR", default_dir)) / spec
        if path.is_file():
            return str(path)
    return spec


def load_or_error(ap, spec, default_dir=MATRIX_DIR):
    """``from_spec`` of the resolved spec; a bad spec is ``ap.error`` (one line)."""
    try:
        return from_spec(resolve_matrix(spec, default_dir))
    except ValueError as exc:
        ap.error(str(exc).splitlines()[0])


def check_matrices(ap, specs, default_dir=MATRIX_DIR):
    """Resolve and load every spec up front (``ap.error`` on the first bad one);
    returns ``[(label, csr_matrix), ...]``."""
    return [load_or_error(ap, spec, default_dir) for spec in specs]


def device_or_error(ap, device):
    """``pyspmv_cl.get_device(device)``; a bad selection is ``ap.error``."""
    import pyspmv_cl as psc

    try:
        return psc.get_device(device)
    except psc.PySpMVError as exc:   # (the devices available on following lines)
        ap.error(" ".join(str(exc).split()))


def reference_dtype(dtype):
    """The dtype to check results of ``dtype`` in: complex128 for complex values
    (keeping the imaginary parts), else float64."""
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def is_single(dtype):
    """Whether ``dtype`` has single-precision parts (float32, complex64)."""
    return np.finfo(np.dtype(dtype)).eps > 1e-10


def tolerance(dtype, single, double):
    """``single`` for single-precision dtypes (float32, complex64), else ``double``."""
    return single if is_single(dtype) else double


#: The value types the library computes in.
DTYPES = ("float32", "float64", "complex64", "complex128")


def dtypes_or_error(ap, text, option="--dtypes"):
    """The comma-separated dtypes of ``text`` as numpy dtypes; ``ap.error`` unless
    each is one of ``DTYPES``."""
    names = [d.strip() for d in text.split(",") if d.strip()]
    if not names or any(d not in DTYPES for d in names):
        ap.error(f"{option} {text!r}: each of {', '.join(DTYPES)}")
    return [np.dtype(d) for d in names]
