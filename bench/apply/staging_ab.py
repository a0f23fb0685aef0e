"""Pageable-copy staging on and off, same plan, same script, one process after the other
(issue 25): ``python bench/apply/staging_ab.py OUT.json SCRIPT [ARGS...]`` runs SCRIPT unhooked,
then under the hook with a fixed plan (``--groups``, graphs on) with
``RECSYS_DOCTOR_STAGE_PAGEABLE=1`` and ``=0``, twice each alternating; writes each run's
JSON line (q/s, p99, checksum) and the hook's counters to OUT.json."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from recsys_doctor.applying.script_hook import run_script, script_env
from recsys_doctor.planning.io import write_plan
from recsys_doctor.planning.whatif import Candidate


def main() -> None:
    out, script, *args = sys.argv[1:]
    groups = int(os.environ.get("GROUPS", "2"))
    d = Path(tempfile.mkdtemp(prefix="staging-ab-"))
    plan = write_plan(d / "plan.json", {}, Candidate(groups, True, False, True))
    argv = [sys.executable, script, *args]
    rows = [{"config": "unhooked", **run_script(argv, timeout_s=300)[0]}]
    for rep in range(2):
        for stage in ("1", "0"):
            env = script_env(plan, hook_dir=d / "hook")
            env.update(RECSYS_DOCTOR_STAGE_PAGEABLE=stage, RECSYS_DOCTOR_AUTOAPPLY_LOG="1")
            res, text = run_script(argv, env=env, log=d / f"run_{stage}_{rep}.log", timeout_s=300)
            hook = [json.loads(ln.split(": ", 1)[1]) for ln in text.splitlines()
                    if ln.startswith("recsys-doctor apply: {")]
            rows.append({"config": f"g{groups} graphs, staging {'on' if stage == '1' else 'off'}", "rep": rep, **res,
                         "hook": hook[-1] if hook else None})
    Path(out).write_text(json.dumps({"script": Path(script).name, "args": args, "rows": rows}, indent=1) + "\n")
    for r in rows:
        print(f"{r['config']:<28} {r.get('qps')!s:>8} q/s  p99 {r.get('p99_ms')} ms  checksum {r.get('checksum')}")


if __name__ == "__main__":
    main()
