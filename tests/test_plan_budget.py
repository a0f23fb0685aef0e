"""profile --apply --p99-ms: the latency budget, the throughput/p99 Pareto front and its
plot, and the table column; the numbers are picked by hand."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from rich.console import Console

from recsys_doctor.applying.apply import _keep_best
from recsys_doctor.applying.report import CandidateResult, keep_within
from recsys_doctor.cli import main
from recsys_doctor.cli.profile import render_apply
from recsys_doctor.planning.whatif import Candidate, Prediction
from recsys_doctor.reports.plots import pareto_front, plot_plan_front


def _res(cand: Candidate, qps: float | None, p99: float | None) -> CandidateResult:
    r = CandidateResult(Prediction(cand, 1.0, 1.0, 1.0, "host", qps=1.0, p50_ms=1.0, p99_ms=1.0))
    if qps is not None:
        r.measured = {"qps": qps, "p50_ms": p99 / 2, "p99_ms": p99}
    return r


RESULTS = [_res(Candidate(1), 3_000.0, 2.0), _res(Candidate(4), 9_000.0, 12.0),
           _res(Candidate(4, batching=True, max_batch=32), 8_000.0, 6.0), _res(Candidate(8, batching=True, max_batch=32), 7_000.0, 7.5),
           _res(Candidate(2), None, None)]


def test_pareto_front_by_hand():
    pts = [(r.prediction.candidate.label, r.measured["qps"], r.measured["p99_ms"]) for r in RESULTS if r.measured]
    # by rising p99: g1 (2 ms, 3k) is on it; g4 batched (6 ms, 8k) beats g8 batched (7.5 ms, 7k) on both;
    # g4 unbatched (12 ms, 9k) has the most q/s
    assert pareto_front(pts) == ["g1 merged own-pool graphs", "g4 merged own-pool graphs batched<=32",
                                 "g4 merged own-pool graphs"]
    assert pareto_front([("a", 1.0, 1.0), ("b", 1.0, 1.0)]) == ["a"]  # a tie is not a new point


def test_budget_keeps_the_most_throughput_within_it():
    notes: list[str] = []
    best = _keep_best(RESULTS, "serve", 8.0, notes)
    assert best.prediction.candidate == Candidate(4, batching=True, max_batch=32)  # 8k q/s at 6 ms; 9k is at 12 ms
    assert notes == ["kept the most queries/s among the 3 measured plans with p99 <= 8 ms"]
    assert _keep_best(RESULTS, "serve").prediction.candidate == Candidate(4)  # no budget: most q/s
    notes.clear()
    best = _keep_best(RESULTS, "serve", 1.0, notes)  # nobody is under 1 ms: most q/s, said so
    assert best.prediction.candidate == Candidate(4)
    assert notes == ["no measured plan met p99 <= 1 ms (lowest: 2.00 ms): kept the most queries/s regardless"]
    kept, note = keep_within(RESULTS, None)
    assert kept == RESULTS and note is None


def test_compare_page_and_table_show_the_front(tmp_path):
    cands = [{"plan": r.prediction.candidate.label, "predicted": 1.0, "measured": (r.measured or {}).get("qps"),
              "p99_ms": (r.measured or {}).get("p99_ms"), "error": None} for r in RESULTS]
    png = plot_plan_front(cands, 8.0, "g4 merged own-pool graphs batched<=32")
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_plan_front(cands[:1], 8.0, None) is None  # one measured plan: nothing to draw
    d = {"kind": "serve", "p99_budget_ms": 8.0, "chosen": {"label": "g4 merged own-pool graphs batched<=32"},
         "candidates": [{"label": r.prediction.candidate.label, "predicted": {"qps": 1.0, "p99_ms": 1.0, "bound": "host"},
                         "measured": r.measured, "error": None} for r in RESULTS],
         "table": [], "files": {}, "notes": []}
    buf = io.StringIO()
    render_apply(d, Console(file=buf, width=250, color_system=None))
    out = buf.getvalue()
    assert "(p99 budget 8 ms)" in out and "p99 <=" in out and "budget" in out
    rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 5}
    assert "│ no " in rows["g4 merged own-pool graphs"] and "│ yes " in rows["g4 merged own-pool graphs batched<=32"]


def test_p99_budget_goes_with_apply_only():
    r = CliRunner().invoke(main, ["profile", "examples/wdl_workload.py", "--p99-ms", "8"])
    assert r.exit_code == 2 and "--p99-ms" in r.output and "go with --apply" in r.output
    r = CliRunner().invoke(main, ["profile", "examples/wdl_workload.py", "--apply", "--p99-ms", "0"])
    assert r.exit_code == 2 and "--p99-ms" in r.output


@pytest.mark.parametrize("bad", [float("nan"), -3.0])
def test_apply_workload_refuses_a_bad_budget(bad):
    from recsys_doctor.applying.apply import apply_workload
    from recsys_doctor.errors import BadInputError

    with pytest.raises(BadInputError, match="--p99-ms must be a positive number"):
        apply_workload("examples/wdl_workload.py", p99_ms=bad)


def test_compare_page_draws_the_front_under_the_candidates(tmp_path):
    import gzip
    import shutil
    from pathlib import Path

    from recsys_doctor.diagnose.advise import advise
    from recsys_doctor.reports.html import render_compare_html

    src = Path(__file__).resolve().parents[1] / "recsys_doctor" / "data" / "demo_wdl_serial_q4.sqlite.gz"
    db = tmp_path / "demo.sqlite"
    with gzip.open(src, "rb") as f, open(db, "wb") as g:
        shutil.copyfileobj(f, g)
    a = advise(db)
    m = {"kind": "serve", "p99_budget_ms": 8.0, "chosen": "b", "rows": [],
         "candidates": [{"plan": "a", "predicted": 1, "measured": 100.0, "p99_ms": 5.0, "error": None},
                        {"plan": "b", "predicted": 1, "measured": 200.0, "p99_ms": 4.0, "error": None}]}
    doc = render_compare_html(a, a, measured=m)
    assert doc.count("<figure>") == 2 and "(p99 budget 8.0 ms)" in doc
    assert doc.index("Pareto front") < doc.index("before/after comparison")
    m["kind"] = "train"  # a training loop has no latency front
    assert render_compare_html(a, a, measured=m).count("<figure>") == 1


def test_script_and_training_plans_never_offer_own_pools(tmp_path):
    """Issue 25: the plain-script hook and the training runner cannot give a group its own
    allocator, so their candidates never say 'own-pool', and a plan written for a script
    has nothing the hook would report as not applied."""
    from recsys_doctor.applying.apply import candidates, read_plan, write_plan
    from recsys_doctor.plan import Plan

    for kind in ("script", "train"):
        cs = candidates(kind)
        assert cs and all(not c.per_stream_allocator and "shared-pool" in c.label for c in cs)
    p = write_plan(tmp_path / "plan.json", {}, candidates("script")[0])
    assert Plan.from_dict(read_plan(p)).unhonoured("script") == []


def test_a_plain_training_script_keeps_the_fastest_step():
    """A plain training loop prints step_ms, not qps: its candidates count as measured by
    their step time and the fastest step is kept (issue 25's training script)."""
    def train_res(c, step):
        r = CandidateResult(Prediction(c, 1.0, 1.0, 1.0, "host", qps=1.0))
        r.measured = None if step is None else {"step_ms": step, "steps": 10}
        return r

    rs = [train_res(Candidate(1, True, False), 9.0), train_res(Candidate(2, True, False), 6.5),
          train_res(Candidate(4, True, False), None)]
    assert _keep_best(rs, "script-train").prediction.candidate == Candidate(2, True, False)
    from recsys_doctor.errors import WorkloadError

    with pytest.raises(WorkloadError, match="no candidate plan could be measured"):
        _keep_best(rs, "script")  # as a serving script: none printed q/s


def test_a_script_plan_that_loses_is_declined():
    """A plain script whose best measured plan is slower than the script as it is keeps no
    plan (issue 25: the hook declines plans that lose); a tie or a win is kept."""
    from recsys_doctor.applying.confirm import declined as _declined

    def res(qps=None, step_ms=None):
        r = CandidateResult(Prediction(Candidate(2), 0.0, 0.0, 0.0, "", {}))
        r.measured = {"qps": qps, "step_ms": step_ms}
        return r

    why = _declined({"qps": 268.0}, res(qps=123.5), train=False)
    assert why and "g2" in why and "123.5 q/s against 268" in why
    assert _declined({"qps": 268.0}, res(qps=268.0), train=False) is None
    assert _declined({"qps": 268.0}, res(qps=900.0), train=False) is None
    assert "ms a step" in _declined({"step_ms": 3.0}, res(step_ms=3.5), train=True)
    assert _declined({"step_ms": 3.0}, res(step_ms=2.0), train=True) is None
