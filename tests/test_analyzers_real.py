"""Acceptance checks of the analyzers on the H100 recommender traces (independent SQL for
the facts the verdicts rest on)."""

from __future__ import annotations

import sqlite3

import pytest

from recsys_doctor.diagnose.advise import advise_trace
from recsys_doctor.analyzers import run_all
from recsys_doctor.loaders import load
from recsys_doctor.options import Options

pytestmark = pytest.mark.shared


def _findings(trace):
    return {f.id: f for r in run_all(trace, Options()) for f in r.findings}


def test_wdl_serial_is_launch_bound_short_and_contended(shared_traces):
    path = shared_traces / "h100" / "wdl_serial_q4_h100.sqlite"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    # 4 client threads launch kernels into one stream (SQL, independent of the loader)
    n = db.execute("""select count(distinct r.globalTid) from CUPTI_ACTIVITY_KIND_KERNEL k
                      join CUPTI_ACTIVITY_KIND_RUNTIME r on r.correlationId = k.correlationId
                      group by k.streamId order by 1 desc limit 1""").fetchone()[0]
    assert n >= 4
    f = _findings(load(path))
    # 4 eager client threads on one stream, waiting on the GIL and each other: contention is
    # the main problem and names the cause of the launch waits, which are counted once, there
    assert f["stream-contention"].severity == "high", f["stream-contention"].title
    for fid in ("short-kernels", "launch-bound"):
        assert "stream-contention" in f[fid].evidence["shared_cause_with"], (fid, f[fid].title)
    worst = max(f["stream-contention"].evidence["streams"], key=lambda s: s["concurrent_threads"])
    assert worst["concurrent_threads"] == 4


def test_wdl_graphs_recognized_and_not_contended(shared_traces):
    path = shared_traces / "h100" / "wdl_graphs_q4_h100.sqlite"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_graphs = db.execute("select count(*) from CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()[0]
    assert n_graphs > 0
    tr = load(path)
    f = _findings(tr)
    assert "stream-contention" not in f
    g = f["graph-candidate"]
    assert g.evidence["graph_executions"] == n_graphs
    assert g.evidence["graphed_busy_share"] > 0.5
    plan = advise_trace(tr, Options()).plan
    assert plan["cuda_graphs"]["enabled"] is False
