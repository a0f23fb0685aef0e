"""One script under the hook with a fixed plan, the result appended to a JSONL file:
``python bench/apply/hooked_run.py OUT.jsonl LABEL GROUPS SCRIPT [ARGS...]`` (GROUPS 0: the script
unhooked). Each row: the label, the plan, the script's JSON line (q/s, p99, checksum) and the
hook's counters (replays, thread replays, fallbacks). Every run's output goes to ``OUT.jsonl.log``
(a failed run's whole traceback: the error names only its last line). ``bench/apply/hook_ab.sh`` alternates two
trees of the package with it, on one machine. ``RD_BATCHING=1``: the batching plan; ``RD_NO_GRAPHS=1``: stream
groups without CUDA graphs (where the hook's placement alone costs or wins)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from recsys_doctor.applying.script_hook import read_hook_stats, run_script, script_env
from recsys_doctor.planning.io import write_plan
from recsys_doctor.planning.whatif import Candidate


def main() -> None:
    out, label, groups, script, *args = sys.argv[1:]
    g = int(groups)
    argv = [sys.executable, script, *args]
    log = Path(out + ".log")  # every run's stdout and stderr (a failed run's traceback), beside OUT
    row = {"label": label, "script": Path(script).name, "args": args, "groups": g}
    if os.environ.get("RECSYS_DOCTOR_PLACE"):  # (where hooked threads are placed: start or first-call)
        row["place"] = os.environ["RECSYS_DOCTOR_PLACE"]
    if g == 0:
        res, _ = run_script(argv, log=log, timeout_s=300)
    else:
        d = Path(tempfile.mkdtemp(prefix="hooked-run-"))
        batching = os.environ.get("RD_BATCHING") == "1"  # the hook's batching plan (batches of up to 32)
        graphs = os.environ.get("RD_NO_GRAPHS") != "1"  # (1: stream groups alone, every call eager)
        plan = write_plan(d / "plan.json", {}, Candidate(g, True, False, graphs, batching=batching and graphs))
        row["batching"] = batching
        row["cuda_graphs"] = graphs
        env = script_env(plan, hook_dir=d / "hook", stats_path=d / "stats.json")
        res, _ = run_script(argv, env=env, log=log, timeout_s=300)
        st = read_hook_stats(d / "stats.json") or {}  # (worker processes' stats merged in)
        row["hook"] = {k: st.get(k) for k in ("replays", "thread_graphs", "thread_replays", "materialized",
                                               "staged_copies", "captured", "served_calls", "pageable_fast", "mark_waits", "outputs_lent",
                                               "served_batch_sizes", "processes", "threads", "late_threads",
                                               "ended_threads", "short_lived_threads", "training_thread_count",
                                               "module_changes")}
        row["hook"]["fallback_calls"] = sum(s.get("fallback", 0) for s in st.get("sites", []))
        row["hook"]["fallbacks"] = st.get("fallbacks", [])[:4]
        row["hook"]["reasons"] = {k: v for s in st.get("sites", []) for k, v in (s.get("reasons") or {}).items()}
        row["hook"]["batch_sizes"] = [s.get("batch_sizes") for s in st.get("sites", []) if s.get("batch_sizes")]
    row.update(res)
    with open(out, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"{label:<10} g{g} {row['script']:<26} {res.get('qps')!s:>8} q/s  p99 {res.get('p99_ms')} ms  "
          f"checksum {res.get('checksum')}  {row.get('hook', '')}", flush=True)


if __name__ == "__main__":
    main()
