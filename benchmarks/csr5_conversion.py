"""What building a ``csr5`` operator costs (#15): the host conversion against the
conversion on the device, beside one product.

For each matrix (generator specs, or names of ``<name>.mtx.gz`` in the shared matrix
folder, read in place), with the parameters the device's defaults give (``--set``
overrides them), medians over ``--repeat`` runs after one warm-up (kernels built and
cached), wall time with the queue finished:

- ``host_numpy``: the host conversion alone (``tile_layout`` + ``tile_arrays``: numpy);
- ``host``: the format built from the host CSR on the host path: analyse, numpy
  conversion, upload of the CSR5 arrays (what CPUs do);
- ``device``: the format built from a CSR already on the device (``DeviceCSR``): the
  layout kernels on its ``indptr``, four scalars read back, the conversion kernels;
- ``upload+device``: the CSR uploaded as it is, then as ``device`` (what GPUs do with
  a host matrix);
- ``spmv``: one product ``y = A @ x`` on device vectors.

Below each matrix, the breakdown of one more ``device`` conversion: wall time of
``analyse`` (on the device: its layout kernels and the read-back of four scalars),
of the program lookup, of the rest (allocations, the conversion kernels, the wait),
and each kernel's time from its profiling event (start to end, in launch order;
fills and copies are not kernels and not listed), with their sum, the span from the
first kernel's start to the last one's end, and the number of launches.

The device-converted operator's product is checked against scipy's float64 one first.

    python benchmarks/csr5_conversion.py --device 0:0 --json R.json \\
        random:100000,10 powerlaw:200000,5 cage10 astro-ph
    python benchmarks/csr5_conversion.py --device nvidia --replicate-to 2e7 cage10
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl.array as cla

import pyspmv_cl as psc
from pyspmv_cl.bench.generators import replicate_to
from pyspmv_cl.bench.runner import wall_times
from pyspmv_cl.bench.script_args import (
    check_matrices,
    device_or_error,
    dtypes_or_error,
    positive_int,
    reference_dtype,
    tolerance,
)
from pyspmv_cl.device_inputs import DeviceCSR
from pyspmv_cl.features import MatrixFeatures
from pyspmv_cl.formats import get_format
from pyspmv_cl.formats.base import choose_index_dtype
from pyspmv_cl.formats.csr5 import tile_arrays, tile_layout
from pyspmv_cl.launching import record_launches

MATRIX_DIR = Path(__file__).resolve().parents[2] / "shared" / "matrices"
DEFAULT_MATRICES = ["random:100000,10", "powerlaw:200000,5", "cage10", "astro-ph",
                    "Groebner_id2003_aug"]
COLUMNS = ("host_numpy", "host", "device", "upload+device", "spmv")


def median_seconds(run, repeat):
    """Median wall time of ``run()`` (which finishes the queue itself) after a warm-up."""
    return statistics.median(wall_times(run, repeat))


def parse_sets(items):
    params = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            params[key] = int(value)
        except ValueError:
            params[key] = value
    return params


def measure(label, A, device, dtype, given, repeat):
    cls = get_format("csr5")
    queue = device.queue
    features = MatrixFeatures.from_csr(A)
    params = cls.resolve_params(features, device.profile, dtype, dict(given))
    index = choose_index_dtype(A.shape[0], A.shape[1], A.nnz)
    omega, sigma = params["omega"], params["sigma"]
    keep = {}

    def host_numpy():
        layout = tile_layout(A.indptr, omega, sigma, index)
        tile_arrays(A.indptr, A.indices, A.data, omega, sigma, index, dtype, layout=layout)

    def host():
        keep["host"] = cls(A, device, dtype, params)
        queue.finish()

    on_device = DeviceCSR.upload(A, queue, index, dtype)

    def device_conversion():
        keep["device"] = cls(on_device, device, dtype, params)
        queue.finish()

    def upload_and_device():
        uploaded = DeviceCSR.upload(A, queue, index, dtype, owned=True)   # as instantiate
        keep["upload"] = cls(uploaded, device, dtype, params)
        queue.finish()

    row = {"matrix": label, "rows": A.shape[0], "nnz": int(A.nnz)}
    row["host_numpy"] = median_seconds(host_numpy, repeat)
    row["host"] = median_seconds(host, repeat)
    row["params"] = dict(keep["host"].params)   # "auto" resolved
    row["device"] = median_seconds(device_conversion, repeat)
    row["upload+device"] = median_seconds(upload_and_device, repeat)
    row["breakdown"] = breakdown(cls, on_device, device, dtype, params)

    # One product with the device-converted operator, checked against scipy first.
    op = psc.SpMV(on_device_triple(on_device), shape=A.shape, format="csr5", dtype=dtype,
                  device=device, **params)
    assert op._impl.converting_on_device
    x = np.random.default_rng(0).standard_normal(A.shape[1])
    x_dev = cla.to_device(queue, x.astype(dtype))
    y_dev = cla.empty(queue, A.shape[0], dtype)
    op.matvec(x_dev, out=y_dev)
    wide = reference_dtype(dtype)   # complex128 for complex values: keep imaginary parts
    y_ref = A.astype(wide) @ x
    y = y_dev.get(queue).astype(wide)
    scale = abs(A).astype(np.float64) @ np.abs(x) + 1e-30
    worst = float(np.max(np.abs(y - y_ref) / scale)) if A.shape[0] else 0.0
    if worst > tolerance(dtype, 1e-3, 1e-9):
        raise AssertionError(f"{label}: csr5 product off by {worst:.2e} (relative)")

    def spmv():
        op.matvec(x_dev, out=y_dev)
        queue.finish()

    row["spmv"] = median_seconds(spmv, max(repeat, 10))
    return row


def breakdown(cls, on_device, device, dtype, params):
    """Where one device conversion's time goes: host wall times of its steps and each
    kernel's profiling-event time (seconds)."""
    start = time.perf_counter()
    with record_launches(with_names=True) as launches:
        impl = cls(on_device, device, dtype, params)
        device.queue.finish()
    total = time.perf_counter() - start
    kernels = [(name, (ev.profile.end - ev.profile.start) * 1e-9) for name, ev in launches]
    span = ((launches[-1][1].profile.end - launches[0][1].profile.start) * 1e-9
            if launches else 0.0)
    return {"total": total, "analyse": impl.analyse_seconds, "build": impl.build_seconds,
            "rest": total - impl.analyse_seconds - impl.build_seconds,
            "kernels": kernels, "kernel_sum": sum(t for _, t in kernels),
            "kernel_span": span, "launches": len(kernels)}


def breakdown_line(b):
    kernels = ", ".join(f"{name.removeprefix('csr5_')} {t * 1e3:.3f}" for name, t in b["kernels"])
    return (f"  device breakdown (ms): analyse {b['analyse'] * 1e3:.2f}, build "
            f"{b['build'] * 1e3:.2f}, rest {b['rest'] * 1e3:.2f} (total {b['total'] * 1e3:.2f});"
            f" {b['launches']} kernels: {kernels}; sum {b['kernel_sum'] * 1e3:.3f}, span "
            f"{b['kernel_span'] * 1e3:.3f}")


def on_device_triple(dcsr):
    return (dcsr.data, dcsr.indices, dcsr.indptr_device)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("matrices", nargs="*", default=DEFAULT_MATRICES,
                        help="generator specs or shared matrix names (default: "
                        + ", ".join(DEFAULT_MATRICES) + ")")
    parser.add_argument("--device", default="0:0", help="platform:device (P:D)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed runs per column")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a csr5 parameter (omega, sigma, ...), repeatable")
    parser.add_argument("--replicate-to", type=float, default=0,
                        help="replicate each matrix block-diagonally to this many non-zeros")
    parser.add_argument("--json", help="write the rows here as JSON")
    args = parser.parse_args(argv)
    if not args.replicate_to >= 0:
        parser.error("--replicate-to must be a count >= 0")
    if "," in args.dtype:
        parser.error(f"--dtype {args.dtype!r}: one value type")
    dtype = dtypes_or_error(parser, args.dtype, "--dtype")[0]
    matrices = check_matrices(parser, args.matrices, MATRIX_DIR)
    # Kernels are timed by their profiling events: the device's profiling queue.
    device = device_or_error(parser, args.device).profiling_device()
    given = parse_sets(args.set)
    for _, A in matrices:   # a bad --set is an error up front, not a traceback mid-run
        try:
            get_format("csr5").resolve_params(MatrixFeatures.from_csr(A), device.profile,
                                              dtype, dict(given))
        except psc.PySpMVError as exc:
            parser.error(f"--set: {exc}")
    print(f"device: {device.cl_device.name.strip()} ({device.profile.device_type}), "
          f"{dtype.name}; medians of {args.repeat}, milliseconds", flush=True)
    header = f"{'matrix':<24} {'nnz':>10} " + " ".join(f"{c:>13}" for c in COLUMNS) \
        + f" {'host/device':>11}"
    print(header, flush=True)
    rows = []
    for label, A in matrices:
        label, A = replicate_to(label, A, args.replicate_to)
        if A.dtype.kind == "c":
            A = A.real.tocsr()
        row = measure(label, A, device, dtype, given, args.repeat)
        rows.append(row)
        print(f"{label:<24} {row['nnz']:>10} "
              + " ".join(f"{row[c] * 1e3:>13.2f}" for c in COLUMNS)
              + f" {row['host'] / row['upload+device']:>10.1f}x", flush=True)
        print(breakdown_line(row["breakdown"]), flush=True)
    if args.json:
        meta = {"device": device.cl_device.name.strip(),
                "platform": device.platform.version.strip(),
                "device_type": device.profile.device_type, "dtype": dtype.name,
                "repeat": args.repeat, "python": platform.python_version(),
                "units": "seconds (median wall time, queue finished)"}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
