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
from _sql import sql_rows
from click.testing import CliRunner

from recsys_doctor.diagnose.advise import advise
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
    (n,), = sql_rows(db, "SELECT count(*) FROM runs")
    branches = sql_rows(db, "SELECT DISTINCT git_branch FROM runs")
    assert f"no runs on branch 'nosuch' in {db}, which holds {n} run" in r.stdout
    assert "branches: " + ", ".join(f"{b or '(none)'} ({n})" for (b,) in branches) in r.stdout
    r = _cli("history", "--db", tmp_path / "none.db")
    assert r.stdout.strip() == f"no runs recorded in {tmp_path / 'none.db'}"


def test_a_run_whose_report_fails_is_not_recorded(tmp_path):
    db = tmp_path / "h.db"
    _one_line_error(_cli("advise", PINGPONG, "--html", tmp_path / "no" / "r.html", "--db", db),
                    "cannot write report")
    assert not db.exists() or sql_rows(db, "SELECT count(*) FROM runs") == [(0,)]
    # the same run with a report that can be written is recorded once, and its trend has it
    assert _cli("advise", PINGPONG, "--html", tmp_path / "r.html", "--db", db).exit_code == 0
    assert sql_rows(db, "SELECT count(*) FROM runs") == [(1,)]


def test_many_rank_run_is_recorded_one_row_per_rank(rank_dir, tmp_path):
    db = tmp_path / "h.db"
    r = _cli("advise", rank_dir, "--db", db, "--workers", "2", "--json")
    assert r.exit_code == 0, r.output
    rows = sql_rows(db, "SELECT workload, command, kernels, trace_path FROM runs ORDER BY workload")
    assert [(w, c, k) for w, c, k, _ in rows] == [("rank0", "advise", _kernels(PINGPONG)),
                                                   ("rank1", "advise", _kernels(LARGE))]
    assert [Path(p).name for *_, p in rows] == ["rank0.sqlite.gz", "rank1.sqlite.gz"]
    # the same rank traced alone gets the same workload key: one trend for both ways
    assert _cli("advise", rank_dir / "rank0.sqlite.gz", "--db", db, "--json").exit_code == 0
    keys = sql_rows(db, "SELECT workload_key FROM runs WHERE workload = 'rank0'")
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
    for part, _fixture in zip(page.split('<section id="rank-')[1:], (PINGPONG, LARGE)):
        name = re.search(r"<h2>Rank \d+: ([^<]*)</h2>", part).group(1)
        fx = PINGPONG if name.endswith("rank0.sqlite.gz") else LARGE
        assert part.count("<img") >= 2 and "Proposed multi-stream plan" in part
        assert re.search(rf">{_kernels(fx):,}</div><div class=\"l\">kernels<", part)
    assert "<script" not in page and page.count("<html") == 1


def test_many_rank_html_and_history_on_dask(rank_dir, tmp_path):
    """The same through Dask workers: the sections and rows travel back from them."""
    out, db = tmp_path / "ranks.html", tmp_path / "h.db"
    r = _cli("advise", rank_dir, "--html", out, "--db", db, "--dask", "local", "--workers", "1")
    assert r.exit_code == 0, r.output
    assert len(re.findall(r'<section id="rank-\d+">', out.read_text())) == 2
    assert sql_rows(db, "SELECT workload, kernels FROM runs ORDER BY workload") == [
        ("rank0", _kernels(PINGPONG)), ("rank1", _kernels(LARGE))]


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


# --- plots -----------------------------------------------------------------------------------


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _title(result) -> str:
    from recsys_doctor.reports.plots._base import _RC
    from recsys_doctor.reports.plots.breakdown import _draw_kernel_durations
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig = _draw_kernel_durations(result, 10.0)
    return fig.axes[0].get_title(loc="left")


def test_histogram_title_short_kernels_by_sql():
    """Ping-pong: median kernel 2.4 us against a 6.7 us launch call (SQL): they cannot hide."""
    with sqlite3.connect(":memory:") as con:
        con.deserialize(gzip.decompress(PINGPONG.read_bytes()))
        k = [e - s for s, e in con.execute("SELECT start, [end] FROM CUPTI_ACTIVITY_KIND_KERNEL")]
        launch = [e - s for s, e in con.execute(
            "SELECT r.start, r.[end] FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
            "ON k.correlationId = r.correlationId")]
    med_k, med_l = _median(k) / 1000, _median(launch) / 1000
    assert med_k < med_l
    t = _title(advise(PINGPONG))
    assert f"median {med_k:.1f} us" in t and f"launch call ({med_l:.1f} us)" in t and "cannot hide" in t


@pytest.mark.shared
def test_histogram_title_follows_the_data(shared_traces):
    """The TorchRec rank (median kernel 57 us): the title said "short kernels cannot hide
    the launch cost". Median kernel and launch call from a plain JSON parse."""
    path = next((shared_traces / "kineto").glob("pytorch__torchrec__*54105*.json"), None)
    if path is None:
        pytest.skip("the TorchRec rank trace is not in ../shared/traces/kineto")
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    kern = [e for e in ev if e.get("cat") == "kernel"]
    corr = {e["args"]["correlation"] for e in kern}
    launch = [e["dur"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and e.get("args", {}).get("correlation") in corr]
    med_k, med_l = _median([e["dur"] for e in kern]), _median(launch)
    assert med_k > med_l  # 57 us against 13 us
    t = _title(advise(path))
    assert "cannot hide" not in t
    assert f"median {med_k:.1f} us" in t and f"launch call ({med_l:.1f} us)" in t and "can hide" in t


def _luminance(rgba) -> float:
    r, g, b = rgba[:3]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_stream_strip_low_utilization_is_visible():
    """A stream busy a few % of a bin was drawn nearly white (#fbe3e2 at 0); now any busy
    share is a saturated colour, and an idle bin a grey of its own."""
    import matplotlib
    from matplotlib.image import AxesImage

    from recsys_doctor.reports.plots._base import _RC
    from recsys_doctor.reports.plots.timeline import _draw_utilization

    res = advise(PINGPONG)
    with matplotlib.rc_context(_RC):
        fig = _draw_utilization(res)
    im = next(a for ax in fig.axes for a in ax.get_children() if isinstance(a, AxesImage))
    data = im.get_array()
    low = [float(v) for v in data.ravel() if 0 < v <= 0.1]
    assert low, "the ping-pong stream has bins busy 10% or less"
    for v in low:
        assert _luminance(im.to_rgba(v)) < 0.7, v  # white is 1.0; the old map gave 0.91 at 2%
    idle = im.to_rgba(0.0)
    assert _luminance(idle) > 0.85 and abs(_luminance(idle) - _luminance(im.to_rgba(low[0]))) > 0.2


def test_compare_png_spans_the_runs_and_the_legend_covers_no_label():
    """compare --png: each run's utilization over 0-100% of the run (it drew at 85-100%:
    the clock's zero is not the trace's start), and the legend over no bar label."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from recsys_doctor.reports.plots._base import _RC
    from recsys_doctor.reports.plots.runs import _draw_before_after

    a, b = advise(DATA / "wdl_graphs_q4" / "wdl_graphs_q4.sqlite.gz"), advise(PINGPONG)
    with matplotlib.rc_context(_RC):
        fig = _draw_before_after(a, b, "graphs", "pingpong")
        FigureCanvasAgg(fig)
        fig.draw_without_rendering()
    ax1, ax2 = fig.axes[:2]
    for line in ax2.get_lines():
        x = line.get_xdata()
        assert x.min() < 1.0 and x.max() > 99.0, (x.min(), x.max())
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert legends
    labels = [t.get_window_extent(renderer) for t in ax1.texts]
    assert len(labels) == 4
    for lg in legends:
        box = lg.get_window_extent(renderer)
        assert not any(box.overlaps(t) for t in labels)


# --- make test and Chromium ------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_chromium_install_can_be_opted_out(tmp_path):
    """``make test`` ran apt-get as root without a word; now README says so, and
    ``make test NO_CHROMIUM=1`` / ``RECSYS_DOCTOR_NO_CHROMIUM=1`` installs nothing."""
    import subprocess

    make = subprocess.run(["make", "-n", "test", "NO_CHROMIUM=1"], cwd=ROOT, capture_output=True, text=True)
    assert 'RECSYS_DOCTOR_NO_CHROMIUM="1" sh tests/ensure_chromium.sh' in make.stdout, make.stdout
    # the script with the opt-out, as root, with an apt-get that records being called
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls"
    for name, body in (("apt-get", f'echo apt-get "$@" >> {log}'), ("id", "echo 0")):
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    r = subprocess.run(["sh", str(ROOT / "tests" / "ensure_chromium.sh")], capture_output=True, text=True,
                       env={"PATH": f"{bin_}:/usr/bin:/bin", "RECSYS_DOCTOR_NO_CHROMIUM": "1"})
    assert r.returncode == 0 and not log.exists()
    assert "not installing Chromium" in r.stderr and "tests/test_chromium.py" in r.stderr
    readme = (ROOT / "README.md").read_text()
    make_test = readme[readme.index("make test    #"):readme.index("## Diagnose a trace")]
    for words in ("apt-get", "root", "chromium", "NO_CHROMIUM=1", "RECSYS_DOCTOR_NO_CHROMIUM=1",
                  "tests/test_chromium.py"):
        assert words in make_test, words
