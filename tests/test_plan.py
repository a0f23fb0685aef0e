"""One plan type end to end: planner -> plan.json -> runtime / what-if / script hook / training -> report.

Expected values are worked out by hand from the hand-built traces of ``test_planner.py``
(3 contending threads -> 3 groups; 4 sibling expert ranges over 2 groups -> round-robin),
and the written JSON is read back with ``json.loads``, not through the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from recsys_doctor.diagnose.advise import advise_trace
from recsys_doctor.applying.apply import ApplyResult, CandidateResult, plan_candidate, read_plan, script_env, write_plan
from recsys_doctor.cli import main
from recsys_doctor.errors import BadInputError
from recsys_doctor.options import Options
from recsys_doctor.plan import Plan
from recsys_doctor.runtime import RuntimeConfig
from recsys_doctor.planning.whatif import Candidate, Prediction

from test_planner import _contended

_HOOK_PROBE = ("import sys, threading; m = sys.modules.get('_recsys_doctor_autoapply'); "
               "t = threading.Thread(target=lambda: None); t.start(); t.join(); "
               "s = m.stats(); print(s['active'], s['groups'], s['graphs'])")


def _training_plan() -> dict:
    from _tracebuild import T, api, kern, rng

    ks = [kern(i * 1000, i * 1000 + 800, corr=i + 1, grid=(4, 1, 1)) for i in range(8)]
    calls = [api(i * 1000 - 300, i * 1000 - 100, i + 1, tid=5) for i in range(8)]
    ranges = [rng(-1000, 9000, 5, "Optimizer.step#Adam.step", source="user_annotation", depth=0)]
    ranges += [rng(i * 2000 - 400, i * 2000 + 1500, 5, f"expert_{i}", depth=1) for i in range(4)]
    tr = T(kernels=ks, api=calls, ranges=ranges, devices=[{"device": 0, "name": "H100", "sm_count": 132}])
    return advise_trace(tr, Options(max_stream_groups=2)).plan


def test_serving_plan_round_trip(tmp_path):
    advised = advise_trace(_contended(3), Options()).plan
    plan = Plan.from_dict(advised)
    assert (plan.version, plan.kind, plan.groups, plan.cuda_graphs) == (1, "serving", 3, True)
    chosen = plan_candidate(advised)
    assert chosen == Candidate(3, True, True, True) == Candidate.from_plan(plan)

    # planner -> JSON (6 client threads on 3 groups: ceil(6 / 3) = 2 slots each)
    path = write_plan(tmp_path / "plan.json", advised, chosen, clients=6)
    doc = json.loads(path.read_text())
    assert doc["runtime"] == {"groups": 3, "merge_streams": True, "per_stream_allocator": True,
                              "cuda_graphs": True, "slots_per_group": 2}
    assert doc["schema"] == 1 and doc["stream_groups"]["count"] == 3

    # JSON -> runtime (serving path honours every field)
    cfg = RuntimeConfig.from_plan(read_plan(path))
    assert (cfg.groups, cfg.merge_streams, cfg.per_stream_allocator, cfg.cuda_graphs, cfg.slots_per_group) == \
        (3, True, True, True, 2)
    assert Plan.from_dict(doc).unhonoured("serve") == []

    # JSON -> script hook, in a fresh interpreter
    env = script_env(path, hook_dir=tmp_path / "hook")
    out = subprocess.run([sys.executable, "-c", _HOOK_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "3", "True"]
    # what a plain script cannot get is named, what it gets is not
    assert "plan per_stream_allocator=true is not applied to a plain script" in out.stderr
    assert "plan slots_per_group=2 is not applied to a plain script" in out.stderr
    assert "merge_streams" not in out.stderr and "groups=" not in out.stderr.replace("slots_per_group=", "")

    # -> report: apply.json's chosen plan is the same plan
    pred = Prediction(chosen, host_ns=1.0, gpu_ns=1.0, overlap=1.0, bound="gpu")
    rep = ApplyResult(kind="serve", target="x", chosen=chosen, before={}, after=None,
                      candidates=[CandidateResult(pred)], stats={}).to_dict()
    rep = json.loads(json.dumps(rep))
    assert {k: rep["chosen"][k] for k in ("groups", "merge_streams", "per_stream_allocator", "cuda_graphs")} == \
        {k: doc["runtime"][k] for k in ("groups", "merge_streams", "per_stream_allocator", "cuda_graphs")}
    assert rep["candidates"][0]["runtime"]["groups"] == 3


def test_training_range_assignment_is_honoured_or_reported(tmp_path):
    advised = _training_plan()
    plan = Plan.from_dict(advised)
    # expert_0..3 over 2 groups: 0, 1, 0, 1 (what branch streams do: branch i on stream i mod 2)
    assert plan.range_assignment == (("expert_0", 0), ("expert_1", 1), ("expert_2", 0), ("expert_3", 1))
    assert not [ln for ln in plan.unhonoured("train") if "range_assignment" in ln]
    assert any("plan range_assignment" in line for line in plan.unhonoured("script"))
    assert any("plan range_assignment" in line for line in plan.unhonoured("serve"))

    other = dict(advised, range_assignment=dict(advised["range_assignment"], assignments=[
        {"nvtx": "expert_0", "group": 1}, {"nvtx": "expert_1", "group": 0}]))
    assert [ln for ln in Plan.from_dict(other).unhonoured("train") if "round-robin" in ln]

    # the script hook says so on stderr, and still applies what it can
    path = write_plan(tmp_path / "plan.json", advised, Candidate(2, True, False, False))
    env = script_env(path, hook_dir=tmp_path / "hook")
    out = subprocess.run([sys.executable, "-c", _HOOK_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "2", "False"]
    assert "plan range_assignment is not applied to a plain script" in out.stderr
    assert "per_stream_allocator" not in out.stderr  # one shared pool is what the hook does


def test_unknown_plan_version_is_rejected(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"schema": 2, "stream_groups": {"count": 2}}))
    with pytest.raises(BadInputError, match="plan schema 2 is not supported"):
        read_plan(p)
    res = CliRunner().invoke(main, ["apply", str(p), "--", sys.executable, "-c", "print(1)"])
    assert res.exit_code == 2 and "plan schema 2" in res.output
    with pytest.raises(BadInputError, match="unknown plan path"):
        Plan().unhonoured("inference")


def test_cli_apply_removes_its_hook_folder(tmp_path):
    """The generated sitecustomize folder lives as long as the command, not longer."""
    from pathlib import Path

    p = write_plan(tmp_path / "plan.json", advise_trace(_contended(2), Options()).plan, Candidate(2))
    seen = tmp_path / "seen.txt"
    script = tmp_path / "s.py"
    script.write_text("import os, json, pathlib\nd = os.environ.get('PYTHONPATH', '').split(os.pathsep)[0]\n"
                      "there = bool(d) and os.path.isfile(os.path.join(d, 'sitecustomize.py'))\n"
                      f"there and pathlib.Path({str(seen)!r}).write_text(d)\n"
                      "print(json.dumps({'qps': 1.0, 'hook_there': there}))\n")
    for extra in ([], ["--compare", "--json"]):
        seen.unlink(missing_ok=True)
        res = CliRunner().invoke(main, ["apply", *extra, str(p), "--", sys.executable, str(script)])
        assert res.exit_code == 0, res.output
        hook = Path(seen.read_text())
        assert hook.name.startswith("recsys-doctor-hook-") and not hook.exists()
    assert json.loads(res.stdout)["after"]["hook_there"] is True


# ------------------------------------------------------------------------------ options never parsed and dropped

@pytest.mark.parametrize("extra, want", [
    (["--apply", "--nvtx", "step"], "--nvtx does not go with --apply"),
    (["--apply", "--no-baseline"], "--baseline/--no-baseline does not go with --apply"),
    (["--apply", "--baseline"], "--baseline/--no-baseline does not go with --apply"),
    (["--no-history"], "go with --apply"),
    (["--history"], "go with --apply"),
    (["--apply", "--gil-stacks"], "--gil-stacks does not go with --apply"),
    (["--gil-stacks", "--backend", "torch"], "--gil-stacks needs Nsight Systems"),
])
def test_profile_options_that_cannot_act_are_refused(tmp_path, extra, want):
    wl = tmp_path / "wl.py"
    wl.write_text("def workload():\n    raise SystemExit('never reached')\n")
    res = CliRunner().invoke(main, ["profile", str(wl), "--out", str(tmp_path / "o"), *extra])
    assert res.exit_code == 2 and want in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("opt", [["--threads", "4"], ["--duration", "1"], ["--steps", "3"]])
def test_apply_to_a_plain_script_refuses_workload_options(tmp_path, opt):
    script = tmp_path / "s.py"
    script.write_text("print('never run')\n")
    res = CliRunner().invoke(main, ["profile", str(script), "--apply", "--out", str(tmp_path / "o"), *opt])
    assert res.exit_code == 2 and "apply to a workload module" in res.output, res.output
    assert not (tmp_path / "o" / "before").exists()  # refused before anything ran
