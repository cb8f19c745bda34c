"""Turn a results JSON of run_suite.py into the compact tables of BENCHMARKS.md:
one row per matrix, one column per implementation (kernel microseconds), the format
``auto`` chose, and the geometric-mean summary.

    python benchmarks/summarize.py benchmarks/results/cpu-pocl31-2core.json
"""

import argparse
import json
import sys

from pyspmv_cl import formats
from pyspmv_cl.bench import format_table, summary_lines
from pyspmv_cl.bench.peers import PEER_NAMES

ORDER = [*formats(), "auto", *PEER_NAMES]


def pivot(results, dtype):
    rows = [r for r in results if "seconds" in r and r["dtype"] == dtype]
    impls = [i for i in ORDER if any(r["impl"] == i for r in rows)]
    matrices = list(dict.fromkeys(r["matrix"] for r in rows))
    out = [f"| matrix ({dtype}, µs) | nnz | " + " | ".join(impls) + " | auto chose |",
           "|---|---:|" + "---:|" * len(impls) + "---|"]
    for m in matrices:
        t = {r["impl"]: r for r in rows if r["matrix"] == m}
        best = min((v["seconds"] for k, v in t.items()
                    if v.get("kind") == "pyspmv_cl" and k != "auto"), default=None)
        cells = []
        for i in impls:
            if i not in t:
                cells.append("–")
                continue
            us = f"{t[i]['seconds'] * 1e6:.0f}"
            cells.append(f"**{us}**" if t[i]["seconds"] == best else us)
        nnz = next(iter(t.values()))["nnz"]
        chose = t.get("auto", {}).get("format", "")
        out.append(f"| {m} | {nnz} | " + " | ".join(cells) + f" | {chose} |")
    return "\n".join(out)


DTYPE_ORDER = ("float32", "float64", "complex64", "complex128")
ENV_KEYS = {"device", "platform", "compute_units", "copy_gbps"}


def build(data):
    """(terminal text, the .md text) of a run_suite / bench result; KeyError,
    TypeError or ValueError when ``data`` is not one."""
    env, results = data["environment"], data["results"]
    if not isinstance(env, dict) or not ENV_KEYS <= set(env):
        raise KeyError("environment")
    if not isinstance(results, list) or not all(
            isinstance(r, dict) and {"impl", "dtype", "matrix"} <= set(r)
            and ("error" in r or {"seconds", "rows", "nnz"} <= set(r)) for r in results):
        raise KeyError("results")
    # A table per value type the results hold (known ones first, then any other).
    present = list(dict.fromkeys(r["dtype"] for r in results if "seconds" in r))
    dtypes = [d for d in DTYPE_ORDER if d in present] + \
        [d for d in present if d not in DTYPE_ORDER]
    tables = [pivot(results, dt) for dt in dtypes]
    text = "\n\n".join(tables) + "\n\n" + "\n".join(summary_lines(results))
    return text, format_table(env, results) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a JSON of run_suite.py or `pyspmv-cl bench --json`")
    path = parser.parse_args(argv).path
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read {path}: {exc}")
    # Everything is built before the .md is opened: a wrong JSON leaves it alone.
    try:
        text, md = build(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        parser.error(f"{path} is not a JSON of run_suite.py or `pyspmv-cl bench --json` "
                     "(needs an environment with device, platform, compute_units and "
                     "copy_gbps, and results with matrix, impl, dtype and seconds, rows "
                     "and nnz or an error)")
    print(text)
    full = path.rsplit(".", 1)[0] + ".md"
    with open(full, "w") as fh:
        fh.write(md)


if __name__ == "__main__":
    main(sys.argv[1:])
