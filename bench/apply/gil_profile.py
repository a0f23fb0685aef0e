"""Where a plain script's GIL time goes, hooked and not (issue 25): ``python
bench/apply/gil_profile.py OUTDIR SCRIPT [ARGS...]`` runs SCRIPT under ``py-spy record --gil``
(samples only while a thread holds the GIL) unhooked and with a fixed plan (``RD_GROUPS`` groups, default 2; graphs
on), writing each run's folded stacks (``*.folded``), its JSON line, its stderr and the hooked run's
``hook_stats.json``; then prints the frames
with the most GIL samples (self and total) of each run."""

from __future__ import annotations

import collections
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from recsys_doctor.applying.script_hook import script_env
from recsys_doctor.planning.io import write_plan
from recsys_doctor.planning.whatif import Candidate


def stacks(folded: Path) -> Iterator[tuple[str, int]]:
    """Each ``(stack, samples)`` of a py-spy ``--format raw`` file (``.gz`` read as gzip)."""
    with (gzip.open(folded, "rt") if folded.suffix == ".gz" else open(folded)) as fh:
        for line in fh:
            stack, _, cnt = line.rstrip("\n").rpartition(" ")
            if stack and cnt.isdigit():  # (a frame's text can hold a line break)
                yield stack, int(cnt)


def top(folded: Path, n: int = 25) -> list[str]:
    self_c: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for stack, k in stacks(folded):
        samples += k
        frames = stack.split(";")
        self_c[frames[-1]] += k
        for f in set(frames):
            total[f] += k
    out = [f"{folded.name}: {samples} GIL samples", "  self:"]
    out += [f"    {c / samples:6.1%}  {f}" for f, c in self_c.most_common(n)]
    out += ["  total:"] + [f"    {c / samples:6.1%}  {f}" for f, c in total.most_common(n)]
    return out


def main() -> None:
    outdir, script, *args = sys.argv[1:]
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    plan = write_plan(out / "plan.json", {}, Candidate(int(os.environ.get("RD_GROUPS", "2")), True, False, True,
                                                          batching=os.environ.get("RD_BATCHING") == "1"))
    runs = {} if os.environ.get("RD_HOOKED_ONLY") == "1" else {"unhooked": dict(os.environ)}
    runs |= {"hooked": script_env(plan, hook_dir=out / "hook", stats_path=out / "hook_stats.json")}
    report = []
    for name, env in runs.items():
        folded = out / f"{name}.folded"
        p = subprocess.run(["py-spy", "record", "--gil", "--nonblocking", "-r", "200", "--format", "raw", "-o",
                            str(folded), "--", sys.executable, script, *args],
                           env=env, capture_output=True, text=True, timeout=400)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        (out / f"{name}.stderr").write_text(p.stderr)  # (the hook's log lines: captures, fallbacks)
        (out / f"{name}.json").write_text((line[-1] if line else json.dumps({"stderr": p.stderr[-2000:]})) + "\n")
        report += [f"{name}: {line[-1] if line else p.stderr[-500:]}"] + (top(folded) if folded.is_file() else [])
    (out / "top.txt").write_text("\n".join(report) + "\n")
    print("\n".join(report))


if __name__ == "__main__":
    main()
