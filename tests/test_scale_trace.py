"""bench/scale/scale_trace.py's tiling: K copies of an export, each shifted by the span of the
activity, so the tiled trace is K times the original with no dead time between copies and
its findings' shares are the original's. Checked on the packaged demo export (K=2) with
SQL over both files and advise on both."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from _sql import sql_rows

from recsys_doctor.diagnose.advise import advise
from recsys_doctor.options import Options

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "recsys_doctor" / "data" / "demo_wdl_serial_q4.sqlite.gz"


def _scale_trace():
    spec = importlib.util.spec_from_file_location("scale_trace", ROOT / "bench" / "scale" / "scale_trace.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scale_trace"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiled(tmp_path_factory):
    st = _scale_trace()
    d = tmp_path_factory.mktemp("tile")
    one, two = d / "k1.sqlite", d / "k2.sqlite"
    st.tile(DEMO, one, 1)
    st.tile(DEMO, two, 2)
    return one, two


def _q(path: Path, sql: str):
    return sql_rows(path, sql)[0]


def test_copies_follow_each_other_without_dead_time(tiled):
    one, two = tiled
    k = "CUPTI_ACTIVITY_KIND_KERNEL"
    n1, s1, e1 = _q(one, f"SELECT count(*), min(start), max(end) FROM {k}")
    n2, s2, e2 = _q(two, f"SELECT count(*), min(start), max(end) FROM {k}")
    assert n2 == 2 * n1 and s2 == s1
    # the span of the GPU work, from the tables themselves
    tables = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"]
    lo = min(_q(one, f"SELECT min(start) FROM {t}")[0] for t in tables)
    hi = max(_q(one, f"SELECT max(end) FROM {t}")[0] for t in tables)
    shift = e2 - e1
    assert hi - lo < shift <= hi - lo + 10_000  # the span plus a small gap, not the absolute end
    second = _q(two, f"SELECT min(start) FROM {k} WHERE start > {e1}")[0]
    assert second - s1 == shift
    # the API calls are copied with the same shift
    r1 = _q(one, "SELECT count(*), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    r2 = _q(two, "SELECT count(*), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    assert r2 == (2 * r1[0], r1[1] + shift)


def test_tiled_findings_match_the_original(tiled):
    """The same findings, and every share over the whole window the same: utilization,
    idle and launch-wait shares, short-kernel and small-grid shares (the old tiling put
    seconds of dead time between copies: utilization 6.1% became 1.3%). Recoverable
    shares are over the steady state, which in the tiled trace includes the second copy's
    start-up, so they are not compared. The copy's first query is a warm-up query in the
    middle of the tiled trace (cudaMalloc in it): ``step-variance`` may name that one
    step and no other."""
    one, two = tiled
    a, b = advise(one, Options()), advise(two, Options())
    assert {f.id for f in a.findings} - {"step-variance"} == {f.id for f in b.findings} - {"step-variance"}
    sv = [f for f in b.findings if f.id == "step-variance"]
    if sv and not any(f.id == "step-variance" for f in a.findings):
        out = sv[0].evidence["outliers"]
        assert len(out) == 1 and "cudaMalloc" in {x["api"] for x in out[0]["extra_api"]}
    assert b.summary["window_ns"] == pytest.approx(2 * a.summary["window_ns"], rel=1e-4)  # + the small gap
    assert b.summary["gpu_utilization"] == pytest.approx(a.summary["gpu_utilization"], abs=1e-4)
    ea = {f.id: f.evidence for f in a.findings}
    eb = {f.id: f.evidence for f in b.findings}
    for fid, key in [("launch-bound", "idle_share"), ("launch-bound", "launch_share_of_window"),
                     ("short-kernels", "count_share"), ("short-kernels", "time_share"),
                     ("small-grid", "time_share"), ("memcpy-ping-pong", "switch_share")]:
        if fid in ea:
            assert eb[fid][key] == pytest.approx(ea[fid][key], abs=1e-3), (fid, key)
