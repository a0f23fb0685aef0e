"""Issue 10: a gate a careful user can trust.

Only passed checks (or --write-baseline runs) become baselines; the workload key holds the
trace's place, the window and the options; history is a side effect that can fail
without taking the diagnosis away. Expected values are read back with plain SQL.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from _gitrepo import git_repo
from _sql import sql_rows
from click.testing import CliRunner

from recsys_doctor.history import db as history
from recsys_doctor.cli import main

HERE = Path(__file__).parent
PINGPONG = HERE / "data" / "patho_pingpong" / "pingpong.sqlite.gz"


def _run(util, path="/ci/run.sqlite", nvtx=None):
    trace = {"path": path, "format": "nsys-sqlite"}
    if nvtx:
        trace["nvtx"] = nvtx
    return {"schema": 1, "trace": trace,
            "summary": {"kernels": 10, "gpu_utilization": util, "short_kernel_fraction": 0.5,
                        "launch_threads_per_stream_max": 1, "memcpy": {"h2d": 0, "d2h": 0, "direction_switches": 0},
                        "sync_calls": 0},
            "findings": [], "plan": {}, "analyses": {}}


def _write(tmp_path: Path, name: str, data) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def _cli(*args, **kw):
    return CliRunner(**kw).invoke(main, [*map(str, args)])


@pytest.fixture
def on_main(tmp_path, monkeypatch):
    """Work inside a fresh git repository on branch ``main``."""
    git_repo(tmp_path / "repo", "main")
    monkeypatch.chdir(tmp_path / "repo")
    return tmp_path / "repo"


def test_a_failed_check_never_becomes_the_baseline(tmp_path, on_main):
    db = tmp_path / "h.db"
    good = _write(tmp_path, "good.json", _run(0.454))
    bad = _write(tmp_path, "bad.json", _run(0.059))
    assert _cli("check", good, "--write-baseline", tmp_path / "b.json", "--db", db).exit_code == 0
    r1 = _cli("check", bad, "--baseline-db", "main", "--db", db)
    assert r1.exit_code == 1
    # the failed run is recorded, as failed
    assert sql_rows(db, "SELECT command, passed FROM runs ORDER BY id") == [("check", 1), ("check", 0)]
    # re-running does not turn the gate green: the baseline is still the passed run
    r2 = _cli("check", bad, "--baseline-db", "main", "--db", db)
    assert r2.exit_code == 1 and "0.4540" in r2.output
    assert sql_rows(db, "SELECT count(*) FROM runs WHERE passed = 0") == [(2,)]


def test_advise_runs_and_other_windows_are_not_baselines(tmp_path, on_main):
    db = tmp_path / "h.db"
    # an advise run of the same trace is recorded but is no baseline
    assert _cli("advise", PINGPONG, "--db", db, "--json").exit_code == 0
    r = _cli("check", PINGPONG, "--baseline-db", "main", "--db", db, "--no-history")
    assert r.exit_code == 2 and "no passed check" in r.output
    # a passed check restricted to NVTX 'step' is no baseline for the whole-trace check
    assert _cli("check", PINGPONG, "--nvtx", "step", "--min-utilization", "0", "--db", db).exit_code == 0
    keys = sql_rows(db, "SELECT command, passed, workload_key FROM runs ORDER BY id")
    assert [k[:2] for k in keys] == [("advise", None), ("check", 1)]
    assert keys[0][2] != keys[1][2]  # the window is part of the key
    r = _cli("check", PINGPONG, "--baseline-db", "main", "--db", db, "--no-history")
    assert r.exit_code == 2 and "no passed check" in r.output
    r = _cli("check", PINGPONG, "--nvtx", "step", "--baseline-db", "main", "--db", db, "--no-history")
    assert r.exit_code == 0, r.output


def test_same_base_name_in_two_folders_are_two_workloads(tmp_path, on_main):
    db = tmp_path / "h.db"
    a = _write(tmp_path / "a" if (tmp_path / "a").mkdir() is None else tmp_path, "report1.json",
               _run(0.5, path=str(tmp_path / "a" / "report1.sqlite")))
    b = _write(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path, "report1.json",
               _run(0.1, path=str(tmp_path / "b" / "report1.sqlite")))
    assert _cli("check", a, "--min-utilization", "0.4", "--db", db).exit_code == 0
    # b has no baseline of its own: it must not be gated against a's run
    r = _cli("check", b, "--baseline-db", "main", "--db", db, "--no-history")
    assert r.exit_code == 2 and "no passed check" in r.output
    assert sql_rows(db, "SELECT workload FROM runs") == [("report1",)]  # same display name, distinct keys
    # an option that changes numbers is part of the key too
    from recsys_doctor.gate import result_from_dict
    from recsys_doctor.options import Options

    ra = result_from_dict(_run(0.5, path="/x/r.sqlite"))
    assert history.workload_key(ra, Options()) != history.workload_key(ra, Options(short_kernel_us=5))
    assert history.workload_key(ra, Options()) == history.workload_key(ra, Options(top_n=9))  # display only


def test_history_failures_do_not_hide_the_diagnosis(tmp_path, monkeypatch):
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    r = _cli("advise", PINGPONG, "--db", bad, "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["summary"]["kernels"] == 1216  # 1216 kernel rows (tests/data README)
    assert r.stderr.count("\n") == 1 and "warning: run not recorded" in r.stderr
    # an unwritable home: the default database lies under a regular file
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.delenv("RECSYS_DOCTOR_DB", raising=False)
    monkeypatch.setenv("HOME", str(blocker))
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker / "data"))
    r = _cli("advise", PINGPONG)
    assert r.exit_code == 0 and "Findings:" in r.stdout and "warning: run not recorded" in r.stderr
    r = _cli("check", PINGPONG, "--min-utilization", "0.5")
    assert r.exit_code == 1 and "warning: run not recorded" in r.stderr  # the verdict stands
    # `history` on a corrupt database: one line, exit 2, no traceback
    r = _cli("history", "--db", bad)
    assert r.exit_code == 2 and "Traceback" not in r.output and r.output.count("\n") == 1


def test_history_reads_without_writing(tmp_path):
    db = tmp_path / "h.db"
    assert _cli("advise", PINGPONG, "--db", db, "--json").exit_code == 0
    before = db.read_bytes()
    mode = sql_rows(db, "PRAGMA journal_mode")
    r = _cli("history", "--db", db, "--json")
    assert r.exit_code == 0 and len(json.loads(r.output)) == 1
    assert db.read_bytes() == before and sql_rows(db, "PRAGMA journal_mode") == mode


def test_old_history_database_gains_the_key_column(tmp_path):
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, when_utc TEXT NOT NULL, command TEXT NOT NULL, "
                "workload TEXT, passed INTEGER)")
    con.execute("INSERT INTO runs (when_utc, command, workload, passed) VALUES ('2026-01-01', 'check', 'x', 1)")
    con.commit()
    con.close()
    assert _cli("advise", PINGPONG, "--db", db, "--json").exit_code == 0
    cols = [r[1] for r in sql_rows(db, "PRAGMA table_info(runs)")]
    assert "workload_key" in cols and sql_rows(db, "SELECT count(*) FROM runs") == [(2,)]
