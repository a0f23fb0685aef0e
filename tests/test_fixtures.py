"""The project's own GPU-made fixtures: the core works without ../shared.

Expected summary numbers come from the independent SQL / JSON computations in
``test_summary_real`` (own queries on the file, not the code under test).
"""

from __future__ import annotations

import gzip
import shutil

import pytest

from recsys_doctor.diagnose.advise import advise
from recsys_doctor.analyzers.summary import summarize
from recsys_doctor.cli.advise import demo_trace_path
from recsys_doctor.loaders import load
from test_summary_real import _check, kineto_expected, nsys_expected

DEMO = demo_trace_path()


def _gunzip(src, tmp_path):
    dst = tmp_path / src.name.removesuffix(".gz")
    with gzip.open(src) as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return dst


@pytest.fixture(scope="module")
def graphs_fixture(project_data):
    return project_data / "wdl_graphs_q4" / "wdl_graphs_q4.sqlite.gz"


@pytest.fixture(scope="module")
def kineto_fixture(project_data):
    return project_data / "wdl_eager_q2_kineto" / "wdl_eager_q2.pt.trace.json.gz"


def test_demo_summary_matches_sql(tmp_path):
    _check(summarize(load(DEMO)), nsys_expected(_gunzip(DEMO, tmp_path)))


def test_graphs_fixture_summary_matches_sql(tmp_path, graphs_fixture):
    _check(summarize(load(graphs_fixture)), nsys_expected(_gunzip(graphs_fixture, tmp_path)))


def test_kineto_fixture_summary_matches_json(kineto_fixture):
    _check(summarize(load(kineto_fixture)), kineto_expected(kineto_fixture))


def test_demo_is_launch_bound_short_and_contended():
    res = advise(DEMO)
    sev = {f.id: f.severity for f in res.findings}
    # severity follows recoverable time: launch-bound is the main problem of 4 eager
    # threads on one stream; contention is present (how much it alone wins may be less)
    assert sev.get("launch-bound") == "high", sev
    assert sev.get("stream-contention") in ("low", "medium", "high"), sev
    # the idle before the short kernels is the launch waits: present, counted once under those
    sk = next(f for f in res.findings if f.id == "short-kernels")
    assert set(sk.evidence["shared_cause_with"]) & {"launch-bound", "stream-contention"}, sk.evidence
    worst = max(next(f for f in res.findings if f.id == "stream-contention").evidence["streams"],
                key=lambda s: s["concurrent_threads"])
    assert worst["concurrent_threads"] == 4  # the 4 client threads of examples/wdl_serving.py
    assert res.plan["stream_groups"]["count"] == 4
    assert res.plan["cuda_graphs"]["enabled"] is True


def test_graphs_fixture_recognized_and_not_contended(graphs_fixture, tmp_path):
    import sqlite3

    db = sqlite3.connect(_gunzip(graphs_fixture, tmp_path))
    n_graphs = db.execute("select count(*) from CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()[0]
    db.close()
    res = advise(graphs_fixture)
    ids = {f.id for f in res.findings}
    assert "stream-contention" not in ids
    g = next(f for f in res.findings if f.id == "graph-candidate")
    assert g.evidence["graph_executions"] == n_graphs > 0
    assert res.plan["cuda_graphs"]["enabled"] is False


def test_nvtx_restriction_uses_the_range_span(tmp_path):
    """--nvtx measure: the window is the span of the 'measure' range (SQL), so every kernel
    counted started before its end and ended after its start."""
    import sqlite3

    db = sqlite3.connect(_gunzip(DEMO, tmp_path))
    lo, hi = db.execute("""select min(start), max(end) from NVTX_EVENTS n
                           where coalesce(n.text, (select value from StringIds where id = n.textId)) = 'measure'
                           """).fetchone()
    n = db.execute("select count(*) from CUPTI_ACTIVITY_KIND_KERNEL where end > ? and start < ?", (lo, hi)).fetchone()[0]
    db.close()
    res = advise(DEMO, nvtx="measure")
    assert res.summary["kernels"] == n
    assert res.trace_info["nvtx"] == "measure"
