"""The persistent tuning database: reuse across processes without timing, several
processes tuning at once, damaged/stale entries, unwritable directories, forced
re-tuning.  Runs on the first device only (the database does not depend on it) with a
small matrix and a short budget, so each tuning takes a fraction of a second."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES, assert_close, reference

import pyspmv_cl as psc
from pyspmv_cl.bench import generators
from pyspmv_cl.tuning import database

pytestmark = pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
BUDGET = 0.5


@pytest.fixture
def db(empty_tuning_db):
    """An empty tuning database directory and an empty memory layer."""
    return empty_tuning_db


def matrix(k=40):
    return generators.poisson2d(k)


def entries(root):
    return sorted(p for p in root.rglob("*.json") if not p.name.startswith(".tmp-"))


def tune(A, **kw):
    kw.setdefault("tune", True)
    return psc.SpMV(A, format="auto", dtype=np.float32, device=DEVICES[0],
                    tune_budget=BUDGET, **kw)


def retune_after_edit(path, A, edit, then=None, **kw):
    """Edit the stored entry at ``path`` (``edit(entry)`` in place), forget the memory
    layer, tune ``A`` again (``tune(A, **kw)``, then ``then(op)`` while warnings are
    still caught: a background conversion's); (the operator, the warnings caught)."""
    entry = json.loads(path.read_text())
    edit(entry)
    path.write_text(json.dumps(entry))
    database.clear_memory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = tune(A, **kw)
        if then is not None:
            then(op)
    return op, caught


def to_dia(entry):
    """An edit: every candidate made dia (past its diagonal limit on most matrices)."""
    for c in entry["candidates"]:
        c["format"], c["params"] = "dia", {}


def check(op, A, rng):
    x = rng.standard_normal(A.shape[1])
    assert_close(op @ x, reference(A, x), A, x, np.float32)


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import pyspmv_cl as psc
    from pyspmv_cl.bench import generators
    from pyspmv_cl.tuning import database
    out = []
    for k in map(int, sys.argv[1].split(",")):
        A = generators.poisson2d(k)
        op = psc.SpMV(A, format="auto", dtype=np.float32, device=sys.argv[3], tune=sys.argv[2],
                      tune_budget=0.5)
        x = np.ones(A.shape[1])
        ok = bool(np.allclose(op @ x, A @ x, rtol=1e-4, atol=1e-4))
        out.append({"format": op.format, "params": op.params, "source": op.tuning.source,
                    "seconds": op.tuning.tuning_seconds, "ok": ok,
                    "stats": dict(database.stats)})
    print(json.dumps(out if len(out) > 1 else out[0]))
""")


def run_script(root, k, mode="measure", wait=True):
    env = dict(os.environ, PYSPMV_CL_TUNING_DIR=str(root))
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(k), mode, DEVICES[0].id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(root.parent))
    return finish(proc) if wait else proc


def finish(proc):
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_decision_reused_by_a_new_process_without_timing(db):
    first = run_script(db, 40)
    assert first["source"] == "measured" and first["ok"]
    assert first["stats"]["writes"] == 1
    assert len(entries(db)) == 1
    second = run_script(db, 40)
    assert second["source"] == "database" and second["ok"]
    assert (second["format"], second["params"]) == (first["format"], first["params"])
    assert second["stats"]["writes"] == 0 and second["stats"]["hits"] == 1
    assert second["seconds"] < min(0.25, first["seconds"])  # no timing the second time
    entry = json.loads(entries(db)[0].read_text())
    assert entry["package"] == psc.__version__ and entry["formats"] == sorted(psc.formats())
    assert entry["fingerprint"]["nnz"] == matrix().nnz
    assert any(c["format"] == first["format"] for c in entry["candidates"])


@pytest.mark.parametrize("field, value", [
    ("kernel_seconds", None), ("kernel_seconds", "fast"), ("kernel_seconds", -1.0),
    ("kernel_seconds", True), ("conversion_seconds", "slow"), ("params", None),
    ("format", 3), ("conversion_seconds", None)])
def test_one_bad_candidate_damages_the_entry(db, rng, field, value):
    """A stored entry whose candidates are not all well formed is ignored with one
    warning and re-tuned (one null time used to raise TypeError in every process)."""
    A = matrix()
    tune(A)
    (path,) = entries(db)

    def damage(entry):
        assert len(entry["candidates"]) >= 2
        entry["candidates"][-1][field] = value
    op, caught = retune_after_edit(path, A, damage)
    assert op.tuning.source == "measured"
    assert any("damaged tuning entry" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]
    check(op, A, rng)


@pytest.mark.parametrize("field, value", [
    ("block_size", "x"), ("block_size", 0), ("block_size", True), ("skipped", 5),
    ("skipped", [["ell"]]), ("skipped", [[1, 2]]), ("tuning_seconds", "long"),
    ("resolved", "zzz"), ("product", 7)])
def test_one_bad_field_damages_the_entry(db, rng, field, value):
    """The entry's own fields a lookup reads, and a candidate's ``resolved`` and
    ``product``: one of the wrong type makes the entry damaged, ignored with one warning
    and re-tuned (each raised a TypeError in every process before)."""
    A = matrix()
    tune(A)
    (path,) = entries(db)

    def damage(entry):
        if field in ("resolved", "product"):
            for c in entry["candidates"]:
                c[field] = value
        else:
            entry[field] = value
    op, caught = retune_after_edit(path, A, damage)
    assert op.tuning.source == "measured"
    assert any("damaged tuning entry" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]
    check(op, A, rng)


@pytest.mark.parametrize("kw", [{"tune": True}, {"tune": None, "expected_calls": 50}])
def test_a_stored_winner_that_cannot_be_built_is_tuned_anew(db, rng, kw):
    """An entry whose winner does not suit this matrix (edited here; dia past its
    diagonal limit) is tuned anew with one warning where the caller waits for the
    choice (tune=True, expected_calls=); it raised FormatNotSuitableError before.  (The
    default, online path already fell back to its start format.)"""
    A = sp.random(2000, 2000, density=0.003, format="csr",
                  random_state=int(rng.integers(1 << 30)))
    with pytest.raises(psc.FormatNotSuitableError):
        psc.SpMV(A, format="dia", dtype=np.float32, device=DEVICES[0])
    tune(A)
    (path,) = entries(db)
    op, caught = retune_after_edit(path, A, to_dia, **kw)
    # (expected_calls=50 would not repay a measurement: the rules decide)
    assert op.tuning.source in ("measured", "model") and op.format != "dia"
    assert [str(w.message) for w in caught if "cannot be built" in str(w.message)], \
        [str(w.message) for w in caught]
    check(op, A, rng)
    # the entry is replaced by the new measurement, or removed (the rules store nothing)
    assert json.loads(path.read_text())["candidates"][0]["format"] != "dia" \
        if op.tuning.source == "measured" else not path.exists()


def test_a_stored_start_format_that_cannot_be_built_is_removed(db, rng):
    """A stored winner of the online start format's own format (sell on a CPU) is
    built at once: where it cannot be (an edited work_group_size past the device's
    maximum, which the parameter check lets through), the entry is removed with one
    warning and decided anew.  It was handed to SpMV unbuilt before, and every plain
    SpMV(A) raised InvalidParameterError while the entry stayed."""
    from pyspmv_cl.features import MatrixFeatures, shape_fingerprint, structure_digest
    from pyspmv_cl.tuning import online

    A = matrix()
    device = DEVICES[0]
    features = MatrixFeatures.from_csr(A, count_diagonals=False)
    start, _, _ = online.start_choice(features, device.profile, np.float32)
    fp = {**shape_fingerprint(features), "structure_sha256": structure_digest(A)}
    key = database.entry_key(device.profile, fp, "float32")
    database.store(key, {"candidates": [{"format": start,
                                         "params": {"work_group_size": 100000},
                                         "kernel_seconds": 1e-9,
                                         "conversion_seconds": 0.01}],
                         "skipped": [], "fingerprint": fp,
                         "created": f"edited {rng.integers(1 << 30)}"})
    assert entries(db)
    database.clear_memory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = psc.SpMV(A, format="auto", dtype=np.float32, device=device)
    # (a small matrix: decided anew by the rules, which store nothing)
    assert op.tuning.source == "model"
    assert len([w for w in caught if "cannot be built" in str(w.message)]) == 1, \
        [str(w.message) for w in caught]
    assert not entries(db)
    check(op, A, rng)


def test_concurrent_processes_tuning_same_and_different_keys(db):
    procs = [run_script(db, k, wait=False) for k in (40, 40, 41)]
    results = [finish(p) for p in procs]
    assert all(r["ok"] and r["source"] in ("measured", "database") for r in results)
    files = entries(db)
    assert len(files) == 2
    for f in files:  # whole files only, whoever wrote last
        json.loads(f.read_text())
    assert not list(db.rglob(".tmp-*"))
    later = run_script(db, "40,41")
    assert [r["source"] for r in later] == ["database", "database"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong-key", "empty"])
def test_damaged_entry_ignored_with_one_warning_and_retuned(db, rng, damage):
    A = matrix()
    tune(A)
    (path,) = entries(db)
    text = path.read_text()
    path.write_text({"garbage": "\x00not json{{", "truncated": text[:len(text) // 2],
                     "wrong-key": text.replace('"key": "', '"key": "0'),
                     "empty": ""}[damage])
    database.clear_memory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = tune(A)
        database.clear_memory()
        path.write_text("garbage again")
        tune(A)
    assert op.tuning.source == "measured"
    damaged = [w for w in caught if "damaged tuning entry" in str(w.message)]
    assert len(damaged) == 1, [str(w.message) for w in caught]
    json.loads(path.read_text())  # rewritten whole
    check(op, A, rng)


@pytest.mark.parametrize("field, value", [("package", "0.0.0-other"),
                                          ("formats", ["csr-scalar"]), ("schema", 0)])
def test_stale_entry_ignored_silently(db, field, value):
    A = matrix()
    tune(A)
    (path,) = entries(db)
    entry = json.loads(path.read_text())
    entry[field] = value
    path.write_text(json.dumps(entry))
    database.clear_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op = tune(A)
    assert op.tuning.source == "measured"
    assert json.loads(path.read_text())[field] != value


def test_unwritable_directory_works_and_warns_once(tmp_path, monkeypatch, rng):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database directory should be")
    if os.geteuid() == 0:  # root ignores permissions: make mkdir fail instead
        root = blocker / "tuning"
    else:
        root = tmp_path / "ro"
        root.mkdir()
        root.chmod(0o500)
    monkeypatch.setenv(database.TUNING_DIR_ENV, str(root))
    database.clear_memory()
    A, B = matrix(40), matrix(41)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops = [tune(A), tune(B)]
        again = tune(A)   # kept in memory for this process
    assert [op.tuning.source for op in ops] == ["measured", "measured"]
    assert again.tuning.source == "database"
    msgs = [str(w.message) for w in caught if "tuning database" in str(w.message)]
    # One warning, that decisions are not stored (a directory under a file read as
    # "unreadable ...; re-tuning" first before: two warnings, one wrong)
    writes = [m for m in msgs if "cannot write" in m and "kept in memory only" in m]
    assert len(writes) == 1 and len(msgs) == 1, msgs
    for op, M in ((ops[0], A), (ops[1], B)):
        check(op, M, rng)
    database.clear_memory()


def test_force_retunes_and_overwrites(db):
    A = matrix()
    tune(A)
    (path,) = entries(db)
    entry = json.loads(path.read_text())
    entry["created"] = "marker"
    path.write_text(json.dumps(entry))
    database.clear_memory()
    assert tune(A).tuning.source == "database"
    op = tune(A, tune="force")
    assert op.tuning.source == "measured"
    assert json.loads(path.read_text())["created"] != "marker"


def test_expected_calls_redecides_from_stored_measurements(db):
    A = matrix()
    tune(A)
    database.clear_memory()
    (path,) = entries(db)
    entry = json.loads(path.read_text())
    # The decision is among the finalists re-timed in alternation (marked confirmed).
    finalists = [c for c in entry["candidates"] if c.get("confirmed")]
    assert 2 <= len(finalists) <= psc.tuning.tuner.FINALISTS
    for calls in (1, 10**6):
        op = tune(A, expected_calls=calls)
        assert op.tuning.source == "database"
        best = min(finalists,
                   key=lambda c: c["kernel_seconds"] * calls + c["conversion_seconds"])
        assert (op.format, op.tuning.params) == (best["format"], best["params"])
        assert f"x {calls} calls" in op.explanation


def test_rules_only_and_no_cache_leave_no_files(db, monkeypatch):
    A = matrix()
    op = tune(A, tune=False)
    assert op.tuning.source == "model" and op.explanation.startswith("rules only")
    assert not entries(db)
    # PYSPMV_CL_NO_CACHE wins over a tuning directory given (a test drive found it did
    # not: decisions were still written there).
    monkeypatch.setenv("PYSPMV_CL_NO_CACHE", "1")
    assert database.database_dir() is None
    assert tune(A, tune="force").tuning.source == "measured"
    assert not entries(db)
    database.clear_memory()
    monkeypatch.delenv(database.TUNING_DIR_ENV)
    assert database.database_dir() is None
    assert tune(A).tuning.source == "measured"
    assert tune(A).tuning.source == "database"   # the memory layer
    assert not entries(db)


def test_key_separates_dtype_device_profile_and_structure():
    prof = DEVICES[0].profile
    A = matrix()
    fp = psc.tuning.fingerprint(A.tocsr())
    key = database.entry_key(prof, fp, "float32")
    assert key != database.entry_key(prof, fp, "float64")
    assert key != database.entry_key(prof.replace(simd_width=64), fp, "float32")
    B = A.tocsr(copy=True)
    B.indices = B.indices.astype(np.int64)
    B.indptr = B.indptr.astype(np.int64)
    assert psc.tuning.fingerprint(B) == fp   # index types do not matter
    C = A.tocsr(copy=True)
    C.indices = C.indices.copy()
    C.indices[[0, 1]] = C.indices[[1, 0]]   # same statistics, other structure
    assert psc.tuning.fingerprint(C) != fp


@pytest.mark.parametrize("params", [{"bogus_param": 1}, {"work_group_size": -7},
                                    {"value_bits": 16}])   # (auto never stores it)
def test_entry_with_invalid_parameters_is_retuned_with_one_warning(db, rng, params):
    """Valid JSON with parameters its format refuses: ignored like a damaged entry
    (one warning), re-tuned and overwritten; SpMV never raises for it."""
    A = matrix()
    tune(A)
    (path,) = entries(db)

    def damage(entry):
        for candidate in entry["candidates"]:
            candidate["params"] = dict(params)
    op, caught = retune_after_edit(path, A, damage)
    assert op.tuning.source == "measured"
    invalid = [w for w in caught if "invalid parameters" in str(w.message)]
    assert len(invalid) == 1, [str(w.message) for w in caught]
    stored = json.loads(path.read_text())
    assert all(c["params"] != params for c in stored["candidates"])
    check(op, A, rng)


def test_a_stored_winner_converted_in_the_background_that_cannot_be_built(db, rng):
    """A stored winner converted in the background (on a CPU, dia converts on the host:
    the operator starts on its start format) that does not suit the matrix failed in
    every process, without a word, and stayed on disk.  Now: one warning, the entry
    removed, the start format kept (right results), and the next SpMV tunes anew."""
    if DEVICES[0].profile.is_gpu:
        pytest.skip("dia converts on the device on GPUs (no background conversion)")
    A = sp.random(3000, 3000, density=5 / 3000, format="csr", random_state=3,
                  dtype=np.float32)
    tune(A)
    (path,) = entries(db)
    states = []
    op, caught = retune_after_edit(path, A, to_dia, tune=None,
                                   then=lambda op: states.append(op.finish_tuning(60)))
    assert op.tuning.source == "database" and op.format != "dia"
    assert states == ["failed"]
    removed = [w for w in caught if "removed from the database" in str(w.message)]
    assert len(removed) == 1, [str(w.message) for w in caught]
    assert not path.exists()
    check(op, A, rng)
    database.clear_memory()
    assert psc.SpMV(A, dtype=np.float32, device=DEVICES[0]).tuning.source != "database"


def test_a_stored_reduced_precision_is_not_usable():
    """format="auto" never chooses value_bits below the dtype's: a stored sell with
    value_bits=16 (an edited or foreign entry) was built, and products lost precision
    silently; it is unusable now (one warning), full width stays usable."""
    from pyspmv_cl.features import MatrixFeatures
    from pyspmv_cl.tuning import tuner

    A = matrix()
    f = MatrixFeatures.from_csr(A)
    profile = DEVICES[0].profile
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not tuner._usable({"format": "sell", "params": {"value_bits": 16}}, f,
                                 profile, np.float32, None, ("k", "t", "16"))
        assert tuner._usable({"format": "sell", "params": {"value_bits": 32}}, f,
                             profile, np.float32, None, ("k", "t", "32"))
    assert any("value_bits=16" in str(w.message) for w in caught)
