"""Issue 10: numbers that agree with each other, one clock, the verdict first.

Expected values come from the trace files (SQL on the nsys export, hand arithmetic),
never from the package's own output.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from _intervals import union_len
from click.testing import CliRunner
from rich.console import Console

from recsys_doctor.diagnose.advise import advise
from recsys_doctor.cli import main
from recsys_doctor.options import Options
from recsys_doctor.reports._common import evidence_label, kernel_label
from recsys_doctor.reports.terminal import render_terminal

HERE = Path(__file__).parent
SYNCQ = HERE / "data" / "patho_sync_per_query" / "sync_per_query.sqlite.gz"
GRAPHS = HERE / "data" / "patho_graphs_in_use" / "graphs_in_use.sqlite.gz"


def _cli(*args):
    return CliRunner().invoke(main, [*map(str, args)])


def _unzip(src: Path, dst: Path) -> Path:
    with gzip.open(src, "rb") as a, open(dst, "wb") as b:
        shutil.copyfileobj(a, b)
    return dst


def _terminal(res) -> str:
    buf = io.StringIO()
    render_terminal(res, Console(file=buf, width=100, color_system=None))
    return buf.getvalue()


@pytest.fixture(scope="module")
def syncq():
    return advise(SYNCQ)


# --- one clock ---------------------------------------------------------------------------

def test_span_in_header_and_window_outside_the_trace_is_an_error(tmp_path, syncq):
    db = sqlite3.connect(_unzip(SYNCQ, tmp_path / "s.sqlite"))
    k0, k1 = db.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    lo, hi = syncq.trace_info["span_ns"]
    assert lo <= k0 and hi >= k1
    out = _terminal(syncq)
    assert f"trace spans {lo / 1e9:.6f} s - {hi / 1e9:.6f} s" in out
    # a window read off a clock that starts at the first GPU activity (0.1-0.2 s) is
    # outside this trace (which starts seconds into the session): an error, not "no GPU"
    r = _cli("advise", SYNCQ, "--start", "0.1", "--end", "0.2", "--no-history")
    assert r.exit_code == 2 and "lies outside the trace" in r.output and f"{lo / 1e9:.6f} s" in r.output
    # a window inside the trace: the kernels that start in it are analyzed
    a, b = k0 + (k1 - k0) // 2, k1
    n = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end > ? AND start < ?", (a, b)).fetchone()[0]
    r = _cli("advise", SYNCQ, "--start", f"{a}ns", "--end", f"{b}ns", "--no-history", "--json")
    d = json.loads(r.stdout)
    assert d["summary"]["kernels"] == n and d["trace"]["window_ns"] == [a, b]


def test_window_shows_in_every_report(tmp_path):
    r = _cli("advise", SYNCQ, "--nvtx", "query", "--no-history", "--html", tmp_path / "r.html", "--md", tmp_path / "r.md")
    assert r.exit_code == 0
    for text in (r.stdout, (tmp_path / "r.html").read_text(), (tmp_path / "r.md").read_text()):
        text = " ".join(text.replace("&#x27;", "'").replace("\\", "").split())  # unwrap, unescape
        assert "analysis window: NVTX range 'query'" in text
        assert "trace spans" in text


def test_plots_use_the_trace_clock(syncq):
    from recsys_doctor.reports import plots
    from recsys_doctor.reports.plots._base import _edges_s

    assert _edges_s(syncq.analyses["utilization"]["timeline"])[0] == pytest.approx(
        syncq.analyses["utilization"]["timeline"]["start_ns"] / 1e9)
    assert "--start" in plots.CLOCK_LABEL


# --- numbers that agree ------------------------------------------------------------------

def _idle_by_sql(db) -> tuple[int, int]:
    iv = []
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        iv += db.execute(f"SELECT start, end FROM {t}").fetchall()
    win = max(e for _, e in iv) - min(s for s, _ in iv)
    return win - union_len(iv), win


def test_one_idle_figure(tmp_path, syncq):
    db = sqlite3.connect(_unzip(SYNCQ, tmp_path / "s.sqlite"))
    idle, win = _idle_by_sql(db)
    share = idle / win
    out = _terminal(syncq)
    lb = next(f for f in syncq.findings if f.id == "launch-bound")
    assert lb.title.startswith(f"GPU idle {share:.0%} of the window")
    assert f"idle {share:.0%}." in syncq.verdict["line"]
    assert f"{share * 100:.1f}%" in out  # the summary row
    # no other idle percentage for the same trace anywhere on the screen
    assert f"idle {100 - syncq.summary['gpu_utilization'] * 100:.0f}%" not in out or \
        round(100 - syncq.summary["gpu_utilization"] * 100) == round(share * 100)


def test_units_match_keys_and_labels_follow_options():
    assert evidence_label("window_ns") == "window" and evidence_label("blocked_us") == "blocked"
    assert evidence_label("short_gap_us") == "short_gap threshold"  # an option, not a measurement
    res = advise(SYNCQ, Options(short_kernel_us=5))
    out = _terminal(res)
    assert "window_ns=" not in out and "kernels shorter than 5 us" in out and "shorter than 10 us" not in out
    f = next(f for f in res.findings if f.id == "short-kernels")
    assert "under 5 us" in f.title


@pytest.mark.parametrize("args", [["--short-kernel-us", "-3"], ["--set", "short_gap_us=-1"],
                                  ["--set", "report_min_share=1.5"], ["--set", "graph_min_kernels=0"],
                                  ["--set", "recoverable_high=0.01"]])
def test_bad_thresholds_are_rejected(args):
    r = _cli("advise", SYNCQ, "--no-history", *args)
    assert r.exit_code == 2 and "Traceback" not in r.output and r.output.count("\n") == 1


# --- the first screen ----------------------------------------------------------------------

def test_first_screen_holds_the_verdict(syncq):
    out = _terminal(syncq).splitlines()
    head = "\n".join(out[:8])
    top = syncq.findings[0]
    assert "Main problem" in head and top.id in head and "First:" in head and "Plan:" in head
    gain = f"{top.recoverable_ns / 1e6:.1f} ms"
    assert gain in head.replace("\n", " ")


def test_graphs_in_use_verdict_does_not_say_capture():
    res = advise(GRAPHS)
    assert "capture" not in res.verdict["first_action"].lower()
    assert res.findings[0].id != "graph-candidate"
    assert "capture" not in res.findings[0].recommendation.lower().split(":")[0]


@pytest.mark.parametrize("name,want", [
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, float, "
     "at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)3>>(int, T2, T3)",
     "vectorized_elementwise_kernel<MulFunctor>"),
    ("void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::func_wrapper_t<"
     "float, at::native::sum_functor<float, float, float>::operator ()(at::TensorIterator &)::[lambda(float, "
     "float) (instance 1)]>, unsigned int, float, (int)4, (int)4>>(T3)", "reduce_kernel<sum_functor>"),
    ("std::enable_if<!T7, void>::type internal::gemvx::kernel<int, int, float>(T13)", "gemvx::kernel"),
    ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn"),
])
def test_kernel_names_show_their_functor(name, want):
    assert kernel_label(name) == want


def test_examples_are_moments_in_the_trace(tmp_path, syncq):
    lo, hi = syncq.trace_info["span_ns"]
    for f in syncq.findings:
        assert len(f.examples) <= 3
        for e in f.examples:
            assert lo <= e["start_ns"] <= hi and e["duration_ns"] >= 0
    out = _terminal(syncq)
    e = syncq.findings[0].examples[0]
    assert f"at {e['start_ns'] / 1e9:.6f} s" in out


# --- files ---------------------------------------------------------------------------------

def test_two_traces_with_one_base_name_get_two_reports(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    shutil.copy(SYNCQ, a / "report1.sqlite.gz")
    shutil.copy(GRAPHS, b / "report1.sqlite.gz")
    r = _cli("advise", a / "report1.sqlite.gz", b / "report1.sqlite.gz", "--no-history", "--html", tmp_path / "r.html",
             "--md", tmp_path / "m.md")
    assert r.exit_code == 0
    html = sorted(p.name for p in tmp_path.glob("r-*.html"))
    assert html == ["r-report1-2.html", "r-report1.html"]
    for p in (*tmp_path.glob("r-*.html"), *tmp_path.glob("m-*.md")):
        assert f"wrote {p}" in r.stderr
    assert "graphs_in_use" not in (tmp_path / "r-report1.html").read_text()  # each its own trace
    assert (tmp_path / "r-report1.html").read_text() != (tmp_path / "r-report1-2.html").read_text()


def test_compare_html_shows_severity_changes(tmp_path):
    from recsys_doctor.gate import compare
    from recsys_doctor.reports.html import render_compare_html

    a, b = advise(SYNCQ), advise(SYNCQ, Options(recoverable_high=0.9, recoverable_medium=0.5))
    changed = compare(a, b).changed
    assert changed  # the same trace judged with other cut-offs: some severities move
    doc = render_compare_html(a, b)
    assert "Findings whose severity changed" in doc
    for c in changed:
        assert f"{c['a']}</span> &rarr; <span class='sev sev-{c['b']}'>{c['b']}" in doc


def test_html_and_markdown_labels_follow_the_threshold(tmp_path):
    res = advise(SYNCQ, Options(short_kernel_us=5))
    from recsys_doctor.reports.html import render_html
    from recsys_doctor.reports.markdown import render_markdown

    for doc in (render_html(res), render_markdown(res)):
        assert "kernels shorter than 5 us" in doc and "kernels shorter than 10 us" not in doc
