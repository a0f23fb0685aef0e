"""The run history: what a row holds, where the database lives, concurrent writers."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import sqlite3
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest
from _gitrepo import git_repo
from click.testing import CliRunner

from recsys_doctor.history import db as history
from recsys_doctor.diagnose.advise import AdviseResult
from recsys_doctor.errors import BadInputError
from recsys_doctor.findings import Finding
from recsys_doctor.model import Trace


def _result(trace_file: Path, util: float = 0.25) -> AdviseResult:
    tr = Trace(path=str(trace_file), format="test",
               devices=pd.DataFrame([{"device": 0, "name": "NVIDIA H100 80GB HBM3", "sm_count": 132}]))
    summary = {"kernels": 120, "gpu_utilization": util, "short_kernel_fraction": 0.75,
               "launch_threads_per_stream_max": 4, "memcpy": {"h2d": 30, "d2h": 7, "direction_switches": 9},
               "sync_calls": 5}
    f = Finding(id="launch-bound", severity="high", title="idle", evidence={}, recommendation="graphs")
    return AdviseResult(trace_info={"path": str(trace_file), "format": "test", "meta": {}}, summary=summary,
                        findings=[f], plan={}, trace=tr)


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    p = tmp_path / "work_load.sqlite"
    p.write_bytes(b"not really a trace but hashed all the same\n" * 100)
    return p


def test_record_run_row(tmp_path, trace_file, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not inside a git repo (tmp is outside /work/main)
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True).returncode == 0:
        pytest.skip("tmp dir is inside a git repository")
    db = tmp_path / "h.db"
    before = datetime.now(timezone.utc).replace(microsecond=0)
    rid = history.record_run(_result(trace_file), db)
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    row = dict(con.execute("SELECT * FROM runs WHERE id = ?", (rid,)).fetchone())
    assert row["command"] == "advise"
    when = datetime.fromisoformat(row["when_utc"])
    assert when.utcoffset().total_seconds() == 0 and when >= before
    assert row["trace_path"] == str(trace_file.resolve())
    assert row["trace_sha256"] == hashlib.sha256(trace_file.read_bytes()).hexdigest()
    assert row["workload"] == "work_load"
    assert row["gpus"] == "NVIDIA H100 80GB HBM3"
    assert row["git_commit"] is None and row["git_branch"] is None
    assert (row["gpu_utilization"], row["kernels"], row["memcpy_h2d"], row["memcpy_d2h"],
            row["memcpy_direction_switches"], row["sync_calls"], row["launch_threads_per_stream_max"]) == \
        (0.25, 120, 30, 7, 9, 5, 4)
    assert json.loads(row["summary_json"])["memcpy"]["h2d"] == 30
    assert json.loads(row["findings_json"]) == [{"id": "launch-bound", "severity": "high", "title": "idle"}]
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_git_commit_and_branch(tmp_path, trace_file):
    repo = tmp_path / "repo"
    sha = git_repo(repo, "feature/x")
    db = tmp_path / "h.db"
    history.record_run(_result(trace_file), db, command="check", passed=True, cwd=repo)
    run = history.list_runs(db)[0]
    assert (run["git_commit"], run["git_branch"]) == (sha, "feature/x")
    assert history.latest_run("feature/x", db)["id"] == run["id"]


def test_db_location(tmp_path, monkeypatch):
    from platformdirs import user_data_dir

    monkeypatch.delenv(history.DB_ENV, raising=False)
    assert history.default_db_path() == Path(user_data_dir("recsys-doctor")) / "history.db"
    monkeypatch.setenv(history.DB_ENV, str(tmp_path / "env.db"))
    assert history.resolve_db_path(None) == tmp_path / "env.db"
    assert history.resolve_db_path(tmp_path / "x.db") == tmp_path / "x.db"


def test_list_filters_and_order(tmp_path, trace_file):
    db = tmp_path / "h.db"
    assert history.list_runs(db) == []  # no database yet: no runs, nothing created
    assert not db.exists()
    ids = [history.record_run(_result(trace_file, u), db, command=c)
           for u, c in ((0.1, "advise"), (0.2, "check"), (0.3, "advise"))]
    runs = history.list_runs(db, limit=2)
    assert [r["id"] for r in runs] == [ids[2], ids[1]]
    assert [r["gpu_utilization"] for r in history.list_runs(db, command="advise")] == [0.3, 0.1]
    with pytest.raises(BadInputError, match="no passed check recorded for branch 'nope'"):
        history.latest_run("nope", db)


def test_not_a_database(tmp_path, trace_file):
    bad = tmp_path / "bad.db"
    bad.write_text("hello, not sqlite " * 100)
    with pytest.raises(BadInputError):
        history.record_run(_result(trace_file), bad)


def _writer(args: tuple[str, str, int]) -> int:
    db, trace, n = args
    for i in range(n):
        history.record_run(_result(Path(trace), util=i / 100), db, command="check")
    return n


def test_concurrent_writers_lose_nothing(tmp_path, trace_file):
    db = tmp_path / "c.db"
    procs, per = 6, 15
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(procs) as pool:
        done = pool.map(_writer, [(str(db), str(trace_file), per)] * procs)
    assert sum(done) == procs * per
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM runs").fetchone() == (procs * per, procs * per)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # every row complete: no half-written row
    assert con.execute("SELECT count(*) FROM runs WHERE summary_json IS NULL OR trace_sha256 IS NULL").fetchone()[0] == 0


def test_history_cli(tmp_path, trace_file):
    from recsys_doctor.cli import main

    db = tmp_path / "h.db"
    history.record_run(_result(trace_file, 0.5), db)
    history.record_run(_result(trace_file, 0.125), db)
    r = CliRunner().invoke(main, ["history", "--db", str(db), "--json", "--limit", "1"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert len(rows) == 1 and rows[0]["gpu_utilization"] == 0.125
    r = CliRunner().invoke(main, ["history", "--db", str(db)])
    assert r.exit_code == 0 and "12.5%" in r.output and "50.0%" in r.output
    r = CliRunner(env={"RECSYS_DOCTOR_DB": str(db)}).invoke(main, ["history", "--json"])
    assert len(json.loads(r.output)) == 2
