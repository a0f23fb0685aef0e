"""Issue 25's suite through ``profile --apply``, unmodified (run on the GPU machine:
``pytest -m gpu tests/test_scripts_suite_gpu.py -k dlrm``: a few minutes a script, so
a few scripts per call on a machine that caps a command at 10 minutes).

For each script of ``examples/scripts/``: one run as it is (the reference), then
``recsys-doctor profile --apply SCRIPT -- ARGS``. Every run the tool made of the script
prints the script's JSON line into ``DIR/program.log`` (the unhooked baseline first, then
each candidate plan under the hook) and ``DIR/after/program.log`` (the kept plan under the
profiler): each of their checksums must equal the reference's, the kept plan must not
lose (>= 0.95x) and, for a serving script whose baseline ``advise`` calls launch-bound,
must reach 8x. With ``RECSYS_DOCTOR_WRITE_SUITE=PATH`` each script's row is merged into
the JSON list at PATH (``bench/results/scripts_suite_h100.json`` for the committed one)
before the assertions, so a failing script still leaves its numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "examples" / "scripts"
#: script -> (kind, its arguments: 4 client threads, sizes for a few seconds of eager work)
SUITE = {
    "dlrm_numpy_serve.py": ("serve", ["--threads", "4", "--queries", "3000"]),
    "deepfm_serve.py": ("serve", ["--threads", "4", "--queries", "2000"]),
    "two_tower_retrieval.py": ("serve", ["--threads", "4", "--queries", "4000"]),
    "mmoe_ranker.py": ("serve", ["--threads", "4", "--queries", "3000"]),
    "candidates_ranker.py": ("serve", ["--threads", "4", "--queries", "2000"]),
    "dataloader_train.py": ("train", ["--epochs", "2"]),
}
#: how close a hooked checksum must be: serving replays the same kernels (bit-equal in
#: practice); training sums hundreds of losses and every trained parameter
REL_TOL = {"serve": 1e-6, "train": 1e-4, "heldout": 1e-6}
LAUNCH_BOUND = "launch-bound"  # analyzers/launch_bound.py's finding id


def _results(log: Path) -> list[dict]:
    """Every measurement line (a JSON object with a checksum) of a program.log."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        s = line.strip()
        if s.startswith("{") and '"checksum"' in s:
            try:
                out.append(json.loads(s))
            except json.JSONDecodeError:
                continue
    return out


def _speedup(kind: str, before: dict, after: dict) -> float:
    if kind == "train":
        return before["step_ms"] / after["step_ms"]
    return after["qps"] / before["qps"]


def _write_row(path: str, row: dict) -> None:
    p = Path(path)
    rows = json.loads(p.read_text()) if p.is_file() else []
    rows = [r for r in rows if r.get("script") != row["script"]] + [row]
    order = list(SUITE)
    rows.sort(key=lambda r: order.index(r["script"]) if r["script"] in order else len(order))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rows, indent=1) + "\n")


def run_through_apply(script: Path, kind: str, args: list[str], tmp_path: Path) -> tuple[dict, dict, str]:
    """``script`` run as it is (the reference), then through ``profile --apply``: its row
    (as committed), the tool's ``apply.json`` and its stdout. With
    ``RECSYS_DOCTOR_WRITE_SUITE=PATH`` the row is merged into the JSON list at PATH first,
    so that a failing script still leaves its numbers."""
    name = script.name
    ref = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = json.loads(ref.stdout.strip().splitlines()[-1])

    out = tmp_path / "apply"
    p = subprocess.run([sys.executable, "-m", "recsys_doctor", "profile", "--apply", str(script), "--out", str(out),
                        "--no-history", "--", *args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"profile --apply {name}: {p.stderr[-3000:]}"
    res = json.loads((out / "apply.json").read_text())
    findings = json.loads((out / "before" / "profile.json").read_text())["findings"]
    launch_bound = any(f["id"] == LAUNCH_BOUND for f in findings)

    runs = _results(out / "program.log")  # the baseline, then every candidate the tool ran
    after_log = out / "after" / "program.log"
    hooked = runs[1:] + (_results(after_log) if after_log.is_file() else [])
    assert runs and hooked, f"no measurement line with a checksum in {out / 'program.log'}"
    tol = REL_TOL[kind]
    diffs = [abs(r["checksum"] - reference["checksum"]) / max(1.0, abs(reference["checksum"])) for r in runs + hooked]
    outputs_equal = max(diffs) <= tol
    speedup = _speedup(kind, res["before"], res["after"])

    row = {"script": name, "kind": kind, "launch_bound": launch_bound, "speedup": round(speedup, 3),
           "outputs_equal": outputs_equal, "threads": reference.get("threads"),
           "chosen": (res["chosen"] or {}).get("label", "none: declined"),
           "before": {k: res["before"].get(k) for k in ("qps", "p50_ms", "p99_ms", "step_ms") if k in res["before"]},
           "after": {k: res["after"].get(k) for k in ("qps", "p50_ms", "p99_ms", "step_ms") if k in res["after"]},
           "checksum": reference["checksum"], "checksum_max_rel_diff": max(diffs), "hooked_runs": len(hooked),
           "checksums": sorted({r["checksum"] for r in runs + hooked}),
           "findings": sorted({f["id"] for f in findings}), "args": args,
           # the after-state evidence (apply.json evidence): syncs per query (step), GPU busy, hooked lines
           "syncs_per_unit": res["evidence"]["syncs_per_unit"], "gpu_busy_pct": res["evidence"]["gpu_busy_pct"],
           "hook_sites": [{k: s[k] for k in ("site", "kind", "taken_over", "fallback")}
                          for s in ((res["evidence"]["hook"] or {}).get("measured") or {}).get("sites", [])]}
    if os.environ.get("RECSYS_DOCTOR_WRITE_SUITE"):
        _write_row(os.environ["RECSYS_DOCTOR_WRITE_SUITE"], row)
    return row, res, p.stdout


def check_kept_outputs(row: dict, res: dict, stdout: str) -> None:
    """What every script through ``profile --apply`` must show: the evidence of the run (syncs
    per query before and, for a kept plan, after; the hooked call sites), every run's
    checksum equal to the reference's, and no kept plan that loses (>= 0.95x)."""
    ev = res["evidence"]
    assert ev["syncs_per_unit"]["before"] is not None, ev
    if res["chosen"] is not None:  # a declined plan leaves the script as it is: no after profile
        assert ev["syncs_per_unit"]["after"] is not None, ev
        assert ev["hook"]["measured"] is not None and ev["hook"]["measured"]["active"], ev["hook"]
        assert f"Synchronizing CUDA calls per {ev['unit']}:" in stdout
    assert row["outputs_equal"], f"{row['script']}: checksums {row['checksums']} vs {row['checksum']}"
    assert row["speedup"] >= 0.95, f"{row['script']}: the kept plan loses ({row['speedup']:.3f}x, {row['chosen']})"


@pytest.mark.parametrize("name", list(SUITE))
def test_script_through_profile_apply_keeps_its_outputs(name, tmp_path):
    kind, args = SUITE[name]
    row, res, stdout = run_through_apply(SCRIPTS / name, kind, args, tmp_path)
    check_kept_outputs(row, res, stdout)
    if kind == "serve" and row["launch_bound"]:
        assert row["speedup"] >= 8.0, f"{name}: launch-bound baseline, only {row['speedup']:.2f}x ({row['chosen']})"
