"""Issue 26: the rough edges a new user met in the first hour, each as they met it.

Error paths (one line, exit 2, no traceback), history and window messages, many-rank runs
(history, one HTML report), piped output, the plan in every report. Expected values come
from the fixtures' own tables (SQL) or from the files the commands write.
"""

from __future__ import annotations

import gzip
import html
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from recsys_doctor.advise import advise
from recsys_doctor.cli import main

DATA = Path(__file__).parent / "data"
PINGPONG = DATA / "patho_pingpong" / "pingpong.sqlite.gz"
LARGE = DATA / "patho_large_kernels" / "large_kernels.sqlite.gz"


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_line_error(r, *fragments: str) -> None:
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output and r.stderr.count("\n") == 1, r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr


def _sql(db: Path, q: str):
    con = sqlite3.connect(db)
    try:
        return con.execute(q).fetchall()
    finally:
        con.close()


def _kernels(path: Path) -> int:
    """Kernel rows of a fixture, by SQL over the decompressed export."""
    with sqlite3.connect(":memory:") as con:
        con.deserialize(gzip.decompress(path.read_bytes()))
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory) -> Path:
    """Two ranks of a job: the ping-pong fixture as rank 0, the large-kernel one as rank 1."""
    d = tmp_path_factory.mktemp("ranks")
    shutil.copy(PINGPONG, d / "rank0.sqlite.gz")
    shutil.copy(LARGE, d / "rank1.sqlite.gz")
    return d


# --- errors: one line, exit 2 ---------------------------------------------------------------


@pytest.mark.parametrize("md", ["/missing/dir/r.md", "/proc/x.md"])
def test_ranks_md_that_cannot_be_written(rank_dir, md):
    _one_line_error(_cli("advise", rank_dir, "--md", md, "--workers", "1", "--no-history"),
                    f"cannot write report {md}")


def test_empty_json_array_is_not_a_trace(tmp_path):
    p = tmp_path / "e.json"
    p.write_text("[]")
    _one_line_error(_cli("advise", p, "--no-history"), "empty JSON array")


def test_end_before_start_says_so():
    _one_line_error(_cli("advise", PINGPONG, "--start", "2s", "--end", "1s", "--no-history"),
                    "--end 1.000000 s is before --start 2.000000 s")


# --- history --------------------------------------------------------------------------------


def test_history_unknown_branch_lists_the_branches(tmp_path):
    db = tmp_path / "h.db"
    assert _cli("advise", PINGPONG, "--json", "--db", db).exit_code == 0
    r = _cli("history", "--branch", "nosuch", "--db", db)
    assert r.exit_code == 0
    (n,), = _sql(db, "SELECT count(*) FROM runs")
    branches = _sql(db, "SELECT DISTINCT git_branch FROM runs")
    assert f"no runs on branch 'nosuch' in {db}, which holds {n} run" in r.stdout
    assert "branches: " + ", ".join(f"{b or '(none)'} ({n})" for (b,) in branches) in r.stdout
    r = _cli("history", "--db", tmp_path / "none.db")
    assert r.stdout.strip() == f"no runs recorded in {tmp_path / 'none.db'}"


def test_a_run_whose_report_fails_is_not_recorded(tmp_path):
    db = tmp_path / "h.db"
    _one_line_error(_cli("advise", PINGPONG, "--html", tmp_path / "no" / "r.html", "--db", db),
                    "cannot write report")
    assert not db.exists() or _sql(db, "SELECT count(*) FROM runs") == [(0,)]
    # the same run with a report that can be written is recorded once, and its trend has it
    assert _cli("advise", PINGPONG, "--html", tmp_path / "r.html", "--db", db).exit_code == 0
    assert _sql(db, "SELECT count(*) FROM runs") == [(1,)]


def test_many_rank_run_is_recorded_one_row_per_rank(rank_dir, tmp_path):
    db = tmp_path / "h.db"
    r = _cli("advise", rank_dir, "--db", db, "--workers", "2", "--json")
    assert r.exit_code == 0, r.output
    rows = _sql(db, "SELECT workload, command, kernels, trace_path FROM runs ORDER BY workload")
    assert [(w, c, k) for w, c, k, _ in rows] == [("rank0", "advise", _kernels(PINGPONG)),
                                                   ("rank1", "advise", _kernels(LARGE))]
    assert [Path(p).name for *_, p in rows] == ["rank0.sqlite.gz", "rank1.sqlite.gz"]
    # the same rank traced alone gets the same workload key: one trend for both ways
    assert _cli("advise", rank_dir / "rank0.sqlite.gz", "--db", db, "--json").exit_code == 0
    keys = _sql(db, "SELECT workload_key FROM runs WHERE workload = 'rank0'")
    assert len(keys) == 2 and keys[0] == keys[1]
    assert _cli("advise", rank_dir, "--db", tmp_path / "n.db", "--no-history", "--json").exit_code == 0
    assert not (tmp_path / "n.db").exists()


# --- many ranks: one HTML report --------------------------------------------------------------


def test_many_rank_html_has_a_section_per_rank(rank_dir, tmp_path):
    out = tmp_path / "ranks.html"
    r = _cli("advise", rank_dir, "--html", out, "--workers", "2", "--no-history")
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.stderr
    page = out.read_text()
    sections = re.findall(r'<section id="rank-\d+">\s*<h2>Rank (\d+): ([^<]*)</h2>', page)
    assert sorted(sections) == [("0", html.escape(str(rank_dir / "rank0.sqlite.gz"))),
                                ("1", html.escape(str(rank_dir / "rank1.sqlite.gz")))]
    # each section is the per-trace report: its plots and its kernel count
    for part, fixture in zip(page.split('<section id="rank-')[1:], (PINGPONG, LARGE)):
        name = re.search(r"<h2>Rank \d+: ([^<]*)</h2>", part).group(1)
        fx = PINGPONG if name.endswith("rank0.sqlite.gz") else LARGE
        assert part.count("<img") >= 2 and "Proposed multi-stream plan" in part
        assert re.search(rf">{_kernels(fx):,}</div><div class=\"l\">kernels<", part)
    assert "<script" not in page and page.count("<html") == 1


# --- piped output is not cut -------------------------------------------------------------------


def test_piped_many_rank_table_keeps_whole_columns(rank_dir):
    r = _cli("advise", rank_dir, "--workers", "1", "--no-history")
    assert r.exit_code == 0
    doc = json.loads(_cli("advise", rank_dir, "--workers", "1", "--json").stdout)
    header = next(line for line in r.stdout.splitlines() if "\u2503 rank" in line)
    for fid in doc["finding_ids"]:
        assert f" {fid} " in header, (fid, header)


def test_piped_single_report_crops_nothing():
    r = _cli("advise", PINGPONG, "--no-history")
    assert r.exit_code == 0
    assert "\u2026" not in r.stdout  # rich's crop mark
    res = advise(PINGPONG)
    for f in res.findings:  # every finding's id and title, whole
        assert f.id in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) < 200  # text still wraps


# --- the plan in the reports ---------------------------------------------------------------------


def test_empty_trace_shows_no_plan(tmp_path):
    p = tmp_path / "empty.json"
    p.write_text(json.dumps({"traceEvents": []}))
    r = _cli("advise", p, "--no-history", "--html", tmp_path / "e.html", "--md", tmp_path / "e.md")
    assert r.exit_code == 0, r.output
    assert "Proposed multi-stream plan" not in r.stdout and "Plan:" not in r.stdout
    for f in ("e.html", "e.md"):
        text = (tmp_path / f).read_text()
        assert "No plan: nothing to change." in text and "stream groups" not in text.lower()


def test_html_plan_is_the_decisions_and_their_reasons():
    from recsys_doctor.reports.html import render_html

    res = advise(PINGPONG)
    page = render_html(res)
    plan = page[page.index(">Plan</h2>"):page.index(">Summary</h2>")]
    assert "<th>choice</th><th>value</th><th>because</th>" in plan
    for key, val in res.plan.items():
        if isinstance(val, dict) and "reason" in val:
            assert f"<b>{key.replace('_', ' ')}</b>" in plan
            assert html.escape(val["reason"], quote=True) in plan
    assert "<td>reason</td>" not in plan and "<td>because</td>" not in plan  # no key/value dump
