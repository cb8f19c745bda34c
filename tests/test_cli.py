"""The `pyspmv-cl bench` command: results as JSON, clear errors for bad arguments."""

import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
from conftest import DEVICES


def run_cli(*args):
    # From outside the checkout: `-m` puts the working directory first on sys.path.
    return subprocess.run([sys.executable, "-m", "pyspmv_cl", *args], capture_output=True,
                          text=True, timeout=300, cwd=tempfile.gettempdir())


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_bench_json():
    device = DEVICES[0].id
    proc = run_cli("bench", "--device", device, "--formats", "csr-scalar,sell,auto",
                   "--peers", "scipy", "--dtype", "float32", "--repeat", "3",
                   "--min-time", "0.01", "--json", "-", "--quiet", "poisson2d:30",
                   "powerlaw:2000,6")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["environment"]["copy_gbps"] > 0
    rows = data["results"]
    assert {(r["matrix"], r["impl"]) for r in rows} == {
        (m, i) for m in ("poisson2d-30", "powerlaw-2000-6")
        for i in ("csr-scalar", "sell", "auto", "scipy")}
    for r in rows:
        assert r["gflops"] > 0 and r["gbps"] > 0
        assert r["rel_err"] < 1e-5, r
        if r["impl"] == "auto":
            assert r["format"] in ("csr-scalar", "sell", "dia", "coo", "csr-vector")


def test_bench_table_output():
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "--formats", "csr-vector",
                   "--peers", "none", "--dtype", "float64", "--repeat", "2",
                   "--min-time", "0.01", "--quiet", "banded:500,2")
    assert proc.returncode == 0, proc.stderr
    assert "banded-500-2 float64: 500 x 500, " in proc.stdout and "copy bandwidth" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if "nbytes" in line)
    assert header.split() == ["impl", "GFLOP/s", "GB/s", "%", "copy", "kernel", "ms", "call",
                              "ms", "conv", "rel", "err", "nbytes", "params"]
    assert re.search(r" KiB  [a-z_]+=", proc.stdout)   # nbytes, then the parameters


LONG_PARAMS = ["--formats", "bccoo,csr5,ellr-t,auto", "--peers", "scipy", "--dtype", "float32",
               "--repeat", "2", "--min-time", "0.01", "--quiet", "poisson2d:20"]


def test_bench_table_fits_120_columns_with_a_legend(tmp_path):
    """bccoo's and csr5's parameters alone are over 120 characters: the default table
    cuts them (full in --json and -v) and explains its columns in one line."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    out = tmp_path / "bench.json"
    proc = run_cli("bench", "--device", DEVICES[0].id, "--json", str(out), *LONG_PARAMS)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""    # --quiet: no progress, the table still on stdout
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    from pyspmv_cl.bench.runner import LEGEND
    assert LEGEND in lines and len(LEGEND) <= 120
    assert "% copy" in LEGEND and ">100%" in LEGEND
    rows = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"bccoo", "csr5", "ellr-t", "auto", "scipy"}
    # --json keeps every parameter, index_bits too
    assert set(rows["bccoo"]["params"]) >= {"work_group_size", "tile_size", "result_cache",
                                             "col_compress", "index_bits"}
    full = " ".join(f"{k}={v}" for k, v in rows["bccoo"]["params"].items() if k != "index_bits")
    assert len(full) > 120
    table = {line.split()[0]: line for line in lines if line.startswith("  ")}
    bccoo = table["bccoo"]
    wg = rows["bccoo"]["params"]["work_group_size"]    # the device's default
    assert bccoo.endswith("...") and f"work_group_size={wg}" in bccoo
    assert "result_cache=" not in proc.stdout
    # the table's cells are the JSON's numbers
    r = rows["bccoo"]
    env = json.loads(out.read_text())["environment"]
    assert abs(r["pct_copy_bw"] - 100 * r["gbps"] / env["copy_gbps"]) < 1e-9 * r["pct_copy_bw"]
    assert bccoo.split()[1:5] == [f"{r['gflops']:.2f}", f"{r['gbps']:.1f}",
                                  f"{r['pct_copy_bw']:.0f}", f"{r['seconds'] * 1e3:.3f}"]
    assert table["auto"].split()[10].startswith(rows["auto"]["format"])
    assert "-v shows everything" in proc.stdout


def test_bench_verbose_shows_full_parameters():
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "-v", *LONG_PARAMS)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    bccoo = next(line for line in lines if line.startswith("  bccoo "))
    assert " result_cache=1 index_bits=32" in bccoo and not bccoo.endswith("...")
    assert len(bccoo) > 120
    assert any(line.startswith("  auto: ") for line in lines)     # auto's explanation
    assert any(line.startswith("  % copy ") for line in lines)    # the column notes
    assert "Over 100% is possible" in proc.stdout.replace("\n", " ").replace("  ", " ")
    assert "-v shows everything" not in proc.stdout


def _synthetic_results():
    base = {"rows": 1000, "cols": 1000, "nnz": 4960, "dtype": "float32", "seconds": 2e-5,
            "min_bytes": 51_000, "gflops": 0.5, "gbps": 2.55, "pct_copy_bw": 123.4,
            "rel_err": 1e-7}
    name = "a-matrix-with-a-rather-long-name-" + "x" * 90
    ours = dict(base, matrix=name, impl="bccoo", kind="pyspmv_cl", format="bccoo",
                params={f"parameter_{k}": k for k in range(20)}, nbytes=40_000,
                call_seconds=1e-4, conversion_seconds=1e-3, conversion_spmvs=50.0)
    auto = dict(ours, impl="auto", format="csr5", tuning_source="measured",
                explanation="measured" + " because" * 30)
    peer = dict(base, matrix=name, impl="scipy", kind="peer", seconds=4e-5)
    refused = {"matrix": name, "dtype": "float32", "impl": "dia",
               "error": "FormatNotSuitableError: too many" + " diagonals" * 20}
    env = {"device": "Some Device", "platform": "A Platform " + "with a long version " * 10,
           "compute_units": 8, "copy_gbps": 100.0,
           "peers_unavailable": {"mkl": "ModuleNotFoundError: no" + " no" * 60}}
    return env, [refused, ours, auto, peer], name


def test_format_report_cuts_every_line_unless_verbose():
    from pyspmv_cl.bench import format_report, format_table
    from pyspmv_cl.bench.runner import LEGEND

    env, results, name = _synthetic_results()
    text = format_report(env, results)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert LEGEND in text.splitlines()
    assert "parameter_19" not in text and "  bccoo " in text and "  dia    refused: " in text
    auto = next(line for line in text.splitlines() if line.startswith("  auto "))
    assert "123  " in auto and "csr5 (measured): parameter_0=0" in auto
    wide = format_report(env, results, verbose=True)
    for full in (name, "parameter_19=19", env["platform"], results[0]["error"],
                 results[2]["explanation"], env["peers_unavailable"]["mkl"]):
        assert full in wide and full not in text
    assert max(len(line) for line in wide.splitlines()) > 120
    assert "parameter_19=19" in format_table(env, results)   # the markdown keeps them


def test_tune_line_fits_120_columns_unless_verbose(monkeypatch, capsys):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from pyspmv_cl import cli
    from pyspmv_cl.tuning.tuner import Decision

    params = {f"parameter_{k}": k for k in range(20)}
    monkeypatch.setattr(cli, "select", lambda *a, **k: Decision(
        "csr5", params, "measured because", "measured", kernel_seconds=1e-5))
    argv = ["tune", "--device", DEVICES[0].id, "--quiet", "poisson2d:10"]
    assert cli.main(argv) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert len(line) <= 120 and "parameter_0=0" in line and "parameter_19" not in line
    assert "csr5 parameter_0=0" in line and "... [measured, kernel 10.0 us, " in line
    assert cli.main([*argv, "-v"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "parameter_19=19 [measured" in out[-2] and out[-1] == "    measured because"


def test_bench_progress_bar_and_nbytes():
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "--formats", "csr-scalar,auto",
                   "--peers", "scipy", "--dtype", "float32", "--repeat", "2",
                   "--min-time", "0.01", "--json", "-", "poisson2d:20")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()   # not a terminal: one line per step
    assert lines[0].startswith("[....") and " 0/5 " in lines[0]
    assert lines[-1].startswith("[" + "#" * 24 + "] 5/5 100%")
    rows = {r["impl"]: r for r in json.loads(proc.stdout)["results"]}
    import scipy.sparse as sp

    from pyspmv_cl.bench import generators
    A = generators.poisson2d(20)
    assert rows["csr-scalar"]["nbytes"] == A.nnz * 8 + (A.shape[0] + 1) * 4
    assert rows["auto"]["tuning_source"] == "model" and rows["auto"]["explanation"]
    assert rows["scipy"]["min_bytes"] == (A.nnz * 8 + (A.shape[0] + 1) * 4 + 2 * A.shape[0] * 4)
    for r in rows.values():   # the derived columns agree with the raw ones
        assert abs(r["gflops"] - 2 * A.nnz / r["seconds"] / 1e9) < 1e-9 * r["gflops"] + 1e-12
        assert abs(r["gbps"] - r["min_bytes"] / r["seconds"] / 1e9) < 1e-9 * r["gbps"] + 1e-12
    assert sp.issparse(A)


def test_progress_bar_rendering():
    import io

    from pyspmv_cl.bench import ProgressBar
    stream = io.StringIO()
    bar = ProgressBar(total=4, stream=stream, width=8)
    bar("one")
    bar("two")
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[........] 0/4   0%") and lines[0].endswith("one")
    assert lines[1].startswith("[##......] 1/4  25%") and lines[1].endswith("two")
    assert lines[2].startswith("[########] 4/4 100%")


def test_progress_bar_stays_within_the_terminal(monkeypatch):
    """Redrawn in place with '\\r': a line wider than the terminal would wrap and leave
    its first part behind at every step."""
    import io
    import os
    import shutil

    from pyspmv_cl.bench import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a: os.terminal_size((60, 24)))
    stream = Terminal()
    bar = ProgressBar(total=2, stream=stream, width=8)
    bar("building " + "a-long-matrix-name-" * 10)
    bar.close()
    drawn = stream.getvalue().replace("\n", "\r").split("\r")
    assert max(len(d) for d in drawn) <= 59 and drawn[1].endswith("...")
    assert drawn[-2].startswith("[########] 2/2 100%")


def test_bench_plot(tmp_path):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    target = tmp_path / "roofline.png"
    proc = run_cli("bench", "--device", DEVICES[0].id, "--formats", "csr-scalar",
                   "--peers", "scipy", "--dtype", "float32", "--repeat", "2",
                   "--min-time", "0.01", "--quiet", "--plot", str(target), "poisson2d:20")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert proc.returncode == 2 and "needs matplotlib" in proc.stderr
        assert "Traceback" not in proc.stderr and not target.exists()
        pytest.skip("matplotlib not installed (the clear error was checked)")
    assert proc.returncode == 0, proc.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--formats", "nosuch"], "unknown format"),
    (["--dtype", "float16"], "unknown dtype"),
    (["notagenerator:5"], "bad matrix spec"),
    (["--peers", "nosuchpeer"], "unknown peers"),
])
def test_bench_bad_arguments(args, message):
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "--quiet", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_version(capsys):
    from pyspmv_cl import __version__
    from pyspmv_cl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyspmv-cl {__version__}"


@pytest.mark.parametrize("argv, match", [
    (["--json", "/nonexistent/dir/x.json"], "cannot write --json"),
    (["--repeat", "0"], "--repeat must be at least 1"),
    (["--min-time", "-1"], "--min-time a finite number of seconds >= 0"),
    (["--min-time", "nan"], "--min-time a finite number of seconds >= 0"),
    (["--min-time", "inf"], "--min-time a finite number of seconds >= 0"),
    (["--formats="], "--formats names no format"),
    (["--dtype="], "--dtype names no dtype"),
])
def test_bench_refuses_bad_options_before_running(argv, match, capsys):
    from pyspmv_cl.cli import main

    assert main(["bench", "--quiet", *argv, "poisson2d:10"]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("name, value, match", [
    ("PYSPMV_CL_TUNE_BUDGET", "abc", "PYSPMV_CL_TUNE_BUDGET must be positive"),
    ("PYSPMV_CL_TUNE", "sometimes", "PYSPMV_CL_TUNE (the default of tune) must be"),
])
def test_bench_refuses_bad_tuner_settings_before_running(name, value, match, capsys,
                                                         monkeypatch):
    """A bad tuner setting in the environment: bench ran, exited 0 and said so only in
    the auto row ("refused: InvalidParameterError"); now it refuses before the runs.
    Without auto among the formats the setting is not read."""
    from pyspmv_cl.cli import main

    monkeypatch.setenv(name, value)
    assert main(["bench", "--quiet", "--formats", "csr-scalar,auto", "poisson2d:10"]) == 2
    assert match in capsys.readouterr().err
    if DEVICES:
        assert main(["bench", "--quiet", "--device", DEVICES[0].id, "--formats",
                     "csr-scalar", "--peers", "none", "--repeat", "1", "poisson2d:10"]) == 0


def test_tune_takes_a_complex_matrix_in_its_own_type(tmp_path, capsys, monkeypatch):
    """A complex matrix is tuned in its complex type (what SpMV(A) computes in); a real
    --dtype, which would drop the imaginary parts, is refused (exit status 1)."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    import scipy.io
    import scipy.sparse as sp

    from pyspmv_cl import cli

    asked = _fake_select(monkeypatch)
    path = tmp_path / "complex.mtx"
    scipy.io.mmwrite(str(path), sp.random(20, 20, density=0.2, random_state=0) * (1 + 1j))
    argv = ["tune", "--device", DEVICES[0].id, "--quiet"]
    assert cli.main([*argv, str(path)]) == 0
    assert [d.kind for d in asked] == ["c"]
    assert cli.main([*argv, "--dtype", "float32", str(path)]) == 1
    assert "leave --dtype at default" in capsys.readouterr().err
    assert len(asked) == 1


def test_unreadable_or_too_large_matrices_are_messages_not_tracebacks(tmp_path):
    """A file that is not gzip, a gzip cut short and a generator spec too large for
    memory end with a message naming the spec and exit status 2 (a test drive saw
    BadGzipFile, EOFError and MemoryError tracebacks)."""
    bad = tmp_path / "bad.mtx.gz"
    bad.write_text("not gzip")
    good = gzip.compress(b"%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1.0\n")
    cut = tmp_path / "cut.mtx.gz"
    cut.write_bytes(good[:20])
    parse = tmp_path / "parse.mtx"
    parse.write_text("%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 abc\n")
    for spec, text in ((str(bad), "cannot read it"), (str(cut), "cannot read it"),
                       ("rmat:40", "too large"), (str(parse), f"{str(parse)!r}: ")):
        proc = run_cli("tune", spec)
        assert proc.returncode == 2, (spec, proc.stderr[-2000:])
        assert text in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_bench_skips_matrices_with_nothing_to_time(tmp_path):
    """bench on a matrix without non-zeros, or with no rows, skips it and reports the
    others (it ended in a math domain error, or a kernel argument error, after timing)."""
    empty = tmp_path / "empty.mtx"
    empty.write_text("%%MatrixMarket matrix coordinate real general\n0 0 0\n")
    proc = run_cli("bench", "--quiet", "--repeat", "2", "--min-time", "0.01", "--peers",
                   "none", "--formats", "csr-scalar", "--dtype", "float32", "--json", "-",
                   "denserows:10,0,0", str(empty), "poisson2d:20")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["results"]
    skipped = [r for r in rows if "nothing to time" in r.get("error", "")]
    assert len(skipped) == 2, rows
    assert any(r.get("matrix") == "poisson2d-20" and "error" not in r for r in rows), rows


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_bench_times_a_complex_matrix_in_complex_types(tmp_path, capsys):
    """A complex .mtx is timed in the complex type of each precision asked for (it was
    skipped), its error against scipy in complex128; a real matrix takes a complex
    --dtype too."""
    import scipy.io
    import scipy.sparse as sp
    A = sp.random(300, 300, density=0.03, random_state=1)
    path = tmp_path / "complex.mtx"
    scipy.io.mmwrite(str(path), A + 1j * sp.random(300, 300, density=0.03, random_state=2))
    dtypes = "float32,float64" if DEVICES[0].profile.fp64 else "float32"
    from pyspmv_cl.cli import main
    assert main(["bench", "--device", DEVICES[0].id, "--formats", "csr-scalar,coo",
                 "--peers", "scipy", "--dtype", dtypes, "--repeat", "2", "--min-time",
                 "0.01", "--quiet", "--json", "-", str(path)]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    want = {"complex64", "complex128"} if DEVICES[0].profile.fp64 else {"complex64"}
    assert {r["dtype"] for r in rows} == want, rows
    assert {r["impl"] for r in rows} == {"csr-scalar", "coo", "scipy"}
    for r in rows:
        assert "error" not in r, r
        assert 0 <= r["rel_err"] < (1e-5 if r["dtype"] == "complex64" else 1e-12), r
        assert r["gflops"] == pytest.approx(8 * r["nnz"] / r["seconds"] / 1e9)
    assert main(["bench", "--device", DEVICES[0].id, "--formats", "csr-scalar",
                 "--peers", "none", "--dtype", "complex64", "--repeat", "2",
                 "--min-time", "0.01", "--quiet", "--json", "-", "poisson2d:10"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["results"]
    assert row["dtype"] == "complex64" and 0 <= row["rel_err"] < 1e-5, row


def test_tune_refuses_values_the_dtype_cannot_hold(tmp_path, capsys, monkeypatch):
    """--dtype float32 on a matrix holding 1e300: refused as SpMV(A, dtype=float32)
    refuses it (exit 1), where every candidate failed as a 'wrong result' before and
    the command exited 0; the float64 tuning goes on."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from pyspmv_cl import cli

    asked = _fake_select(monkeypatch)
    path = tmp_path / "big.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1e300\n"
                    "2 2 1.0\n")
    argv = ["tune", "--device", DEVICES[0].id, "--quiet", str(path)]
    assert cli.main([*argv, "--dtype", "float32"]) == 1
    assert "overflow float32" in capsys.readouterr().err and asked == []
    if DEVICES[0].profile.fp64:
        assert cli.main([*argv, "--dtype", "both"]) == 1
        assert [d.name for d in asked] == ["float64"]


def test_tune_says_when_nothing_could_be_stored(tmp_path, capsys, monkeypatch):
    """An unwritable tuning directory: the decision is printed, the warning is one line
    (not Python's source line), and the exit status is 1 with 'could not be stored'."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    from pyspmv_cl import cli
    from pyspmv_cl.tuning import database

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PYSPMV_CL_TUNING_DIR", str(blocker / "db"))
    monkeypatch.delenv("PYSPMV_CL_NO_CACHE", raising=False)
    database.clear_memory()
    code = cli.main(["tune", "--device", DEVICES[0].id, "--quiet", "--budget", "2",
                     "poisson2d:6"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "could not be stored" in err and "kept in this process's memory only" in err
    assert "pyspmv-cl: warning: " in err and "tuning database" in err
    assert "database.store(" not in err   # no source line


def test_refused_runs_leave_no_json_file_and_nan_budget_is_refused(tmp_path, capsys):
    """A bench refused for its matrix spec left an empty --json file behind (the
    writability check created it); tune --budget nan passed the CLI's check."""
    from pyspmv_cl import cli

    out = tmp_path / "out.json"
    assert cli.main(["bench", "nosuch:1", "--json", str(out), "--quiet"]) == 2
    assert not out.exists()
    assert cli.main(["bench", "poisson2d:4", "--json", str(tmp_path), "--quiet"]) == 2
    assert "it is a directory" in capsys.readouterr().err
    assert cli.main(["tune", "poisson2d:4", "--budget", "nan", "--quiet"]) == 2
    assert "--budget must be positive seconds" in capsys.readouterr().err
    (tmp_path / "d.mtx").mkdir()
    assert cli.main(["tune", str(tmp_path / "d.mtx"), "--quiet"]) == 2
    assert "is a directory, not a Matrix Market file" in capsys.readouterr().err


def _fake_select(monkeypatch):
    """cli's select replaced by one that records the dtypes asked and decides at once;
    returns that record."""
    from pyspmv_cl import cli
    from pyspmv_cl.tuning.tuner import Decision

    asked = []
    monkeypatch.setattr(cli, "select", lambda csr, features, device, dtype, **k: asked.append(
        dtype) or Decision("csr-scalar", {}, "measured because", "measured",
                           kernel_seconds=1e-5))
    return asked


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (Linux only)")
def test_outputs_that_cannot_be_written():
    """bench --json on a full disk printed a traceback, and its table (printed after
    the JSON) was lost; a full stdout gave a traceback.  Now: one line and the table,
    exit 1; one line and exit 1."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    proc = run_cli("bench", "--device", DEVICES[0].id, "--formats", "csr-scalar",
                   "--peers", "none", "--dtype", "float64", "--repeat", "1",
                   "--quiet", "--json", "/dev/full", "poisson2d:5")
    assert proc.returncode == 1
    assert "csr-scalar" in proc.stdout and "poisson2d-5" in proc.stdout
    assert "cannot write --json /dev/full" in proc.stderr and "Traceback" not in proc.stderr
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "pyspmv_cl", "devices"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=300,
                              cwd=tempfile.gettempdir())
    assert proc.returncode == 1
    assert "cannot write the output" in proc.stderr and "Traceback" not in proc.stderr
    assert "Exception ignored" not in proc.stderr


def _small_bench(*extra):
    return ["bench", "--quiet", "--formats", "csr-scalar", "--peers", "none", "--dtype",
            "float32", "--repeat", "2", "--min-time", "0.01", *extra]


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_bench_outputs_survive_a_closed_or_full_stream(tmp_path):
    """A test drive's findings: a closed stdout gave an AttributeError traceback; a
    closed or full stderr (the progress bar's) ended the run without its table; a full
    stdout lost the --json file, written after the table."""
    device = ["--device", DEVICES[0].id]
    cli = f"{sys.executable} -m pyspmv_cl"
    closed = subprocess.run(["bash", "-c", f"{cli} devices >&-"], capture_output=True,
                            text=True, timeout=300, cwd=tempfile.gettempdir())
    assert closed.returncode == 1 and "Traceback" not in closed.stderr
    assert "cannot write the output: stdout is closed" in closed.stderr
    args = " ".join(_small_bench(*device, "poisson2d:10")).replace("--quiet ", "")
    proc = subprocess.run(["bash", "-c", f"{cli} {args} 2>&-"], capture_output=True,
                          text=True, timeout=300, cwd=tempfile.gettempdir())
    assert proc.returncode == 0 and "poisson2d-10 float32" in proc.stdout
    from pyspmv_cl.bench import ProgressBar

    class Full:   # a full stderr: the bar turns itself off
        def write(self, text):
            raise OSError(28, "No space left on device")

        def isatty(self):
            return False

    bar = ProgressBar(total=2, stream=Full())
    bar("one")
    bar("two")
    bar.close()
    assert bar.stream is None and bar.done == 2
    saved = tmp_path / "r.json"
    proc = subprocess.run(["bash", "-c", f"{cli} {args} --json {saved} >/dev/full"],
                          capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())
    assert proc.returncode == 1 and "cannot write the output" in proc.stderr
    assert json.loads(saved.read_text())["results"][0]["matrix"] == "poisson2d-10"


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_bench_labels_files_of_one_name_apart_and_counts_complex_flops(tmp_path, capsys):
    """Two files named m.mtx got one label (their rows under one heading); the summary's
    GFLOP/s counted 2 per non-zero for complex values where the table counts 8."""
    import scipy.io
    import scipy.sparse as sp
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    scipy.io.mmwrite(str(tmp_path / "a" / "m.mtx"), sp.random(6, 6, density=0.5,
                                                              random_state=1))
    scipy.io.mmwrite(str(tmp_path / "b" / "m.mtx"), sp.random(4, 9, density=0.4,
                                                              random_state=2))
    from pyspmv_cl.cli import main
    assert main(_small_bench("--device", DEVICES[0].id, "--json", "-",
                             str(tmp_path / "a" / "m.mtx"), str(tmp_path / "b" / "m.mtx"))) == 0
    labels = [r["matrix"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert len(set(labels)) == 2 and labels[0] == "m", labels
    assert main(["bench", "--quiet", "--device", DEVICES[0].id, "--formats", "csr-scalar",
                 "--peers", "none", "--dtype", "complex64", "--repeat", "2",
                 "--min-time", "0.01", "poisson2d:20"]) == 0
    out = capsys.readouterr().out
    table = re.search(r"^  csr-scalar +([0-9.]+)", out, re.M).group(1)
    summary = re.search(r"^  complex64 +csr-scalar +([0-9.]+)", out, re.M).group(1)
    assert table == summary, out


def test_bench_refuses_what_it_cannot_build_or_write(tmp_path, capsys):
    """An integer past int64 in a file (an OverflowError traceback), copies that would
    not fit in memory (the process grew until the kernel killed it), and an empty
    --json or --plot name (ignored): one line each, exit status 2."""
    big = tmp_path / "big.mtx"
    big.write_text("%%MatrixMarket matrix coordinate integer general\n2 2 2\n"
                   "1 1 99999999999999999999999\n2 2 1\n")
    from pyspmv_cl.bench import generators
    from pyspmv_cl.cli import main
    for args, text in (([str(big)], "cannot read it"),
                       (["--json", "", "poisson2d:5"], "--json needs a file name"),
                       (["--plot", " ", "poisson2d:5"], "--plot needs a file name")):
        assert main(_small_bench(*args)) == 2, args
        assert text in capsys.readouterr().err
    with pytest.raises(ValueError, match="too large"):   # before any copy is made
        generators.from_spec("poisson2d:2*100000000000")   # 38 TB


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
def test_tune_takes_complex_types_and_reports_no_database_as_null(tmp_path, monkeypatch,
                                                                  capsys):
    """tune --dtype complex64 (refused before: only the default, complex128, could be
    stored); --json says "database": null without a disk store (it said "None")."""
    import scipy.io
    import scipy.sparse as sp

    from pyspmv_cl import cli
    asked = _fake_select(monkeypatch)
    path = tmp_path / "c.mtx"
    scipy.io.mmwrite(str(path), sp.random(20, 20, density=0.2, random_state=0) * (1 + 1j))
    argv = ["tune", "--device", DEVICES[0].id, "--quiet"]
    assert cli.main([*argv, "--dtype", "complex64", str(path)]) == 0
    assert cli.main([*argv, "--dtype", "complex128", "poisson2d:5"]) == 0
    assert [d.name for d in asked] == ["complex64", "complex128"]
    capsys.readouterr()
    monkeypatch.setenv("PYSPMV_CL_NO_CACHE", "1")
    assert cli.main([*argv, "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["database"] is None


def test_no_cache_off_means_not_set(monkeypatch):
    """PYSPMV_CL_NO_CACHE=off turned the disk stores off (0, false and no did not)."""
    from pyspmv_cl import store
    for value, off in (("off", False), ("OFF", False), ("0", False), ("", False),
                       ("1", True), ("yes", True)):
        monkeypatch.setenv("PYSPMV_CL_NO_CACHE", value)
        assert store.disk_off() is off, value
