"""HTML / Markdown reports, plots, the progress helper.

Injection: a hand-built trace whose kernel names, NVTX text and thread names are markup
must come out escaped in both reports, with no raw tag surviving.
"""

from __future__ import annotations

import io
import re
import sqlite3
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from _intervals import union_len

from recsys_doctor.diagnose.advise import advise_trace
from recsys_doctor.findings import Finding
from recsys_doctor.model import Trace
from recsys_doctor.reports import plots
from recsys_doctor.reports.html import render_compare_html, render_html, write_html
from recsys_doctor.reports.markdown import md_escape, write_markdown

EVIL_SCRIPT = "<script>alert(1)</script>"
EVIL_IMG = '"><img src=x onerror=alert(2)>'
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _evil_trace() -> Trace:
    """2 threads launching 40 kernels (2 us each, 8 us apart) into one stream, H2D/D2H
    copies, NVTX ranges: all names are markup."""
    kernels, api, copies = [], [], []
    t = 1_000_000
    for i in range(40):
        corr = i + 1
        tid = 11 if i % 2 else 12
        api.append({"start": t - 3000, "end": t - 1000, "pid": 1, "tid": tid, "correlation": corr,
                    "name": "cudaLaunchKernel", "api_class": "runtime"})
        kernels.append({"start": t, "end": t + 2000, "pid": 1, "device": 0, "stream": 7, "correlation": corr,
                        "name": EVIL_SCRIPT if i % 2 else EVIL_IMG, "grid_x": 1, "grid_y": 1, "grid_z": 1,
                        "block_x": 32, "block_y": 1, "block_z": 1, "in_graph": False})
        t += 10_000
    for i in range(6):
        corr = 1000 + i
        api.append({"start": 1_000_000 + i * 60_000 - 2000, "end": 1_000_000 + i * 60_000, "pid": 1, "tid": 11,
                    "correlation": corr, "name": "cudaMemcpyAsync", "api_class": "runtime"})
        copies.append({"start": 1_000_000 + i * 60_000 + 2500, "end": 1_000_000 + i * 60_000 + 3500, "pid": 1,
                       "device": 0, "stream": 7, "correlation": corr, "bytes": 4096,
                       "kind": "h2d" if i % 2 == 0 else "d2h", "src_mem": "pinned", "dst_mem": "device",
                       "in_graph": False})
    ranges = [{"start": 900_000, "end": 1_500_000, "pid": 1, "tid": 11, "name": EVIL_SCRIPT, "source": "nvtx",
               "depth": 0},
              {"start": 900_000, "end": 1_500_000, "pid": 1, "tid": 12, "name": EVIL_IMG, "source": "nvtx",
               "depth": 0}]
    threads = [{"pid": 1, "tid": 11, "name": EVIL_SCRIPT}, {"pid": 1, "tid": 12, "name": EVIL_IMG}]
    devices = [{"device": 0, "name": EVIL_IMG, "sm_count": 132}]
    return Trace(path=f"/tmp/{EVIL_IMG}.sqlite", format="test", kernels=pd.DataFrame(kernels),
                 api=pd.DataFrame(api), memcpys=pd.DataFrame(copies), ranges=pd.DataFrame(ranges),
                 threads=pd.DataFrame(threads), devices=pd.DataFrame(devices))


@pytest.fixture(scope="module")
def evil_result():
    res = advise_trace(_evil_trace())
    # whatever the analyzers chose to quote, make sure trace strings reach every part
    res.findings.append(Finding(
        id="crafted", severity="high", title=f"kernel {EVIL_SCRIPT} in {EVIL_IMG}",
        evidence={"top_kernels": [{"name": EVIL_SCRIPT, "share": 0.5}, {"name": EVIL_IMG, "share": 0.5}],
                  "nvtx": EVIL_IMG, EVIL_SCRIPT: 1},
        recommendation=f"rewrite {EVIL_SCRIPT}",
        where=[{"nvtx": EVIL_SCRIPT, "thread": EVIL_IMG, "share": 0.75}]))
    res.plan = {"steps": [{"title": EVIL_SCRIPT, "detail": EVIL_IMG}]}
    return res


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_html_escapes_every_trace_string(evil_result):
    doc = render_html(evil_result)
    assert "<script" not in doc.lower()
    assert "<img src=x" not in doc
    assert "onerror=alert" not in doc.replace("onerror=alert(2)&gt;", "")  # only inside escaped text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in doc
    p = _Tags()
    p.feed(doc)
    names = {t for t, _ in p.tags}
    assert "script" not in names
    imgs = [a for t, a in p.tags if t == "img"]
    assert imgs, "the report has plots"
    for a in imgs:  # every image is one of ours: an embedded PNG, no handler attributes
        assert a["src"].startswith("data:image/png;base64,")
        assert not any(k.startswith("on") for k in a)
    # no attribute anywhere starts an event handler or loads something from outside
    for _t, a in p.tags:
        assert not any(k.startswith("on") for k in a)
        for k in ("src", "href"):
            if k in a:
                assert a[k].startswith("data:")


def test_html_is_self_contained_and_complete(tmp_path, evil_result):
    out = tmp_path / "r.html"
    write_html(evil_result, out)
    doc = out.read_text(encoding="utf-8")
    assert re.search(r"(?i)(src|href)\s*=\s*[\"']?(https?:|//)", doc) is None
    assert "<link" not in doc and "@import" not in doc
    # summary, findings by severity, plan, plots
    assert "crafted" in doc and ">High (" in doc and "<h2>Plan</h2>" in doc
    assert doc.count("data:image/png;base64,") >= 3


def test_markdown_escapes_and_writes_images(tmp_path, evil_result):
    md_path = tmp_path / "rep.md"
    files = write_markdown(evil_result, md_path)
    text = md_path.read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text
    assert "&lt;script&gt;" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links and len(links) == len(files) - 1
    for rel in links:
        f = md_path.parent / rel
        assert f.read_bytes()[:8] == PNG_MAGIC


def test_md_escape_neutralizes_links_and_tables():
    s = md_escape("[x](javascript:alert(1)) | *b* <i>")
    assert "](" not in s.replace("\\](", "").replace("\\]\\(", "")
    assert "\\|" in s and "\\*b\\*" in s and "&lt;i&gt;" in s and "<i>" not in s


def _decode_png(png: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return imread(io.BytesIO(png), format="png")


def test_each_plot_is_a_png(evil_result):
    specs = plots.report_plots(evil_result)
    keys = [k for k, *_ in specs]
    assert keys == ["utilization", "idle", "kernels", "threads", "copies"]
    for _k, _title, _cap, png in specs:
        img = _decode_png(png)
        assert img.shape[0] > 100 and img.shape[1] > 500


def test_plots_absent_without_data():
    empty = advise_trace(Trace(path="x", format="test"))
    assert plots.plot_kernel_durations(empty) is None
    assert plots.plot_copy_traffic(empty) is None
    assert plots.plot_threads_per_stream(empty) is None
    assert plots.plot_history_trend([{"when_utc": "2026-01-01", "gpu_utilization": 0.3}]) is None


def test_before_after_and_compare_page(evil_result):
    other = advise_trace(_evil_trace())
    png = plots.plot_before_after(evil_result, other, "a$b$", "after")
    assert png[:8] == PNG_MAGIC
    doc = render_compare_html(evil_result, other, a_label=EVIL_SCRIPT, b_label="after")
    assert "<script" not in doc and "&lt;script&gt;" in doc
    # "crafted" was only added to the first result: it disappeared
    assert "Findings that disappeared</h2><ul>" in doc and "crafted" in doc


def test_history_trend_in_html(evil_result):
    rows = [{"when_utc": f"2026-11-2{i}T00:00:00+00:00", "gpu_utilization": u, "git_commit": EVIL_IMG,
             "git_branch": EVIL_SCRIPT, "command": "advise"} for i, u in enumerate([0.4, 0.42, 0.1])]
    doc = render_html(evil_result, history_rows=rows)
    assert "Utilization trend" in doc and "<script" not in doc
    assert "10.0%" in doc and "42.0%" in doc


def _gpu_intervals(db: str, tables: tuple[str, ...]) -> list[tuple[int, int]]:
    con = sqlite3.connect(db)
    return [iv for t in tables for iv in con.execute(f"SELECT start, end FROM {t}").fetchall()]


_ACTIVITY = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def _util_by_sql(db: str) -> float:
    """Busy (union of kernels) over window (first to last kernel/copy/memset), straight
    from the nsys tables: the summary's definition, computed without the package."""
    every = _gpu_intervals(db, _ACTIVITY)
    window = max(e for _, e in every) - min(s for s, _ in every)
    return union_len(_gpu_intervals(db, _ACTIVITY[:1])) / window


def _idle_by_sql(db: str) -> float:
    """Share of the window in which nothing at all runs on the GPU (no kernel, copy or
    memset), from the nsys tables and a hand-written interval union."""
    every = _gpu_intervals(db, _ACTIVITY)
    window = max(e for _, e in every) - min(s for s, _ in every)
    return 1 - union_len(every) / window


@pytest.mark.shared
def test_serial_report_says_gpu_mostly_idle(shared_traces, tmp_path):
    from recsys_doctor.diagnose.advise import advise

    db = shared_traces / "h100" / "wdl_serial_q4_h100.sqlite"
    u = _util_by_sql(str(db))
    assert u < 0.5
    res = advise(db)
    out = tmp_path / "serial.html"
    write_html(res, out)
    doc = out.read_text(encoding="utf-8")
    idle = _idle_by_sql(str(db))
    # one idle figure: the hero line, the terminal row and launch-bound all say the same
    assert f"GPU busy {u:.0%}" in doc and f"idle {idle:.0%}." in doc
    assert 'class="hero bad"' in doc  # the main problem is high


def test_progress_quiet_when_not_a_tty(monkeypatch, capsys):
    from recsys_doctor._util import progress as pg
    class TTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    assert pg.progress_enabled(TTY()) is True
    assert pg.progress_enabled(io.StringIO()) is False
    monkeypatch.setenv("CI", "true")
    assert pg.progress_enabled(TTY()) is False
    with pg.progress("loading", total=10) as bar:  # stderr is captured: not a TTY
        bar.advance(3)
        bar.update(completed=10)
    assert capsys.readouterr().err == ""


def test_compare_page_shows_measured_tables_escaped(evil_result):
    other = advise_trace(_evil_trace())
    measured = {"chosen": EVIL_SCRIPT,
                "rows": [{"metric": "qps", "before": 1000.0, "after": 2500.0, "ratio": 2500.0 / 1000.0}],
                "candidates": [{"plan": EVIL_IMG, "predicted": 3.0, "measured": None, "p99_ms": 1.23456,
                                "error": EVIL_SCRIPT}]}
    doc = render_compare_html(evil_result, other, measured=measured)
    assert "<script" not in doc and "<img src=x" not in doc
    head = doc[: doc.index("<figure>")]  # the measured tables come before the plot
    assert "Measured before / after (chosen: &lt;script&gt;" in head
    assert "<td class='num'>2,500.000</td><td class='num'>2.500</td>" in head
    assert "<td class='num'>3.000</td><td class='num'>-</td><td class='num'>1.235</td>" in head
    assert "Measured before" not in render_compare_html(evil_result, other)


def test_templates_ship_with_the_package():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "templates/*" in data["recsys_doctor.reports"]
    assert {p.name for p in (root / "reports" / "templates").iterdir()} >= {"report.html.j2", "compare.html.j2"}
