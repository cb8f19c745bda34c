"""First-SpMV latency of a new process with a cold vs a warm kernel cache.

Each run starts a fresh Python process that imports pyspmv_cl, builds one operator
and multiplies once.  "first SpMV" is timed inside the child from just before
``SpMV(...)`` to the result on the host (device profile, kernel build or cache load,
upload, one product); "process" is the parent's wall time for the whole child.
Cold runs get an empty PYSPMV_CL_CACHE_DIR each; warm runs share one populated by an
untimed run.  POCL_KERNEL_CACHE=0 stops PoCL's own cache from hiding the cold cost.

    python benchmarks/cache_latency.py [--runs 5] [--device 0:0 ...] [--format csr-vector]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD_FLAG = "--child"


def child(fmt, rows, cols, density):
    import numpy as np
    import scipy.sparse as sp

    import pyspmv_cl as psc
    from pyspmv_cl import cache

    rng = np.random.default_rng(1234)
    A = sp.random(rows, cols, density=density, format="csr", random_state=rng,
                  dtype=np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    t0 = time.perf_counter()
    op = psc.SpMV(A, format=fmt)  # device from PYSPMV_CL_DEVICE
    y = op @ x
    t1 = time.perf_counter()
    ok = bool(np.allclose(y, A.astype(np.float64) @ x, rtol=1e-4, atol=1e-5))
    print(json.dumps({"first_spmv_s": t1 - t0, "ok": ok, "stats": cache.stats,
                      "device": op.device.id, "name": op.device.profile.name}))


def run_child(device_id, cache_dir, args):
    env = dict(os.environ)
    env.update({"PYSPMV_CL_CACHE_DIR": cache_dir, "PYSPMV_CL_DEVICE": device_id,
                "POCL_KERNEL_CACHE": "0"})
    env.pop("PYSPMV_CL_NO_CACHE", None)
    cmd = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, args.format,
           str(args.rows), str(args.cols), str(args.density)]
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                            cwd=tempfile.gettempdir())
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"child failed on {device_id}:\n{result.stderr}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if not report["ok"]:
        raise RuntimeError(f"wrong result on {device_id}")
    report["process_s"] = wall
    return report


def measure(device_id, args):
    cold, warm = [], []
    with tempfile.TemporaryDirectory(prefix="pyspmv-cache-bench-") as tmp:
        for i in range(args.runs):
            cold.append(run_child(device_id, os.path.join(tmp, f"cold-{i}"), args))
        warm_dir = os.path.join(tmp, "warm")
        run_child(device_id, warm_dir, args)  # populate, untimed
        for _ in range(args.runs):
            warm.append(run_child(device_id, warm_dir, args))
    if any(r["stats"]["disk_hits"] for r in cold) or any(r["stats"]["builds"] for r in warm):
        raise RuntimeError(f"cache did not behave as expected on {device_id}: "
                           f"{[r['stats'] for r in cold + warm]}")
    return cold, warm


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per case (median)")
    parser.add_argument("--device", action="append",
                        help="device id (repeatable); default: every device")
    parser.add_argument("--format", default="csr-vector")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--cols", type=int, default=1500)
    parser.add_argument("--density", type=float, default=0.004)
    args = parser.parse_args(argv)

    import pyspmv_cl as psc

    device_ids = args.device or [d.id for d in psc.devices()]
    med = statistics.median
    print(f"First SpMV in a new process ({args.rows}x{args.cols}, density {args.density}, "
          f"{args.format}, float32), median of {args.runs} runs, POCL_KERNEL_CACHE=0\n")
    print("| device | cold: first SpMV | warm: first SpMV | speed-up | cold: process "
          "| warm: process | kernels built (cold) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for device_id in device_ids:
        cold, warm = measure(device_id, args)
        c = med(r["first_spmv_s"] for r in cold)
        w = med(r["first_spmv_s"] for r in warm)
        print(f"| {device_id} {cold[0]['name']} | {c * 1e3:.0f} ms | {w * 1e3:.0f} ms | "
              f"{c / w:.1f}x | {med(r['process_s'] for r in cold) * 1e3:.0f} ms | "
              f"{med(r['process_s'] for r in warm) * 1e3:.0f} ms | "
              f"{cold[0]['stats']['builds']} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        fmt, rows, cols, density = sys.argv[2:6]
        child(fmt, int(rows), int(cols), float(density))
    else:
        main()
