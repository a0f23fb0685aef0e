"""A held-out script run as it is or under the script hook with a fixed plan, for the GPU tests
that compare the two (tests/test_autoapply_refresh_gpu.py, tests/test_autoapply_pipeline_gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from recsys_doctor.applying.script_hook import read_hook_stats, script_env
from recsys_doctor.planning.io import write_plan
from recsys_doctor.planning.whatif import Candidate


def run_json(script: Path, args: list[str], env: dict | None = None) -> dict:
    """Run ``script`` with ``args``; its last stdout line as JSON (the test fails on a non-zero exit)."""
    p = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_hooked(tmp_path: Path, script: Path, args: list[str], groups: int, batching: bool = False,
               extra_env: dict | None = None) -> tuple[dict, dict]:
    """``script`` under the hook with ``groups`` graphed groups (batching as given): its JSON line
    and the hook's stats (asserted active)."""
    plan = write_plan(tmp_path / "plan.json", {}, Candidate(groups, True, False, True, batching=batching))
    env = script_env(plan, base_env={**os.environ, **(extra_env or {})}, hook_dir=tmp_path / "hook",
                     stats_path=tmp_path / "stats.json")
    got = run_json(script, args, env)
    st = read_hook_stats(tmp_path / "stats.json")
    assert st is not None and st["active"], st
    return got, st


def assert_same_scores(got: dict, unhooked: dict, st: dict, rel: float = 1e-6) -> None:
    """The hooked run's checksum is the unhooked run's, within ``rel`` (the hook's stats shown if not)."""
    diff = abs(got["checksum"] - unhooked["checksum"]) / abs(unhooked["checksum"])
    assert diff <= rel, (got["checksum"], unhooked["checksum"], st)


def graphed_calls(st: dict) -> int:
    """Model calls served from a graph: the groups' replays, the threads' own and the runtime's."""
    return int(st["replays"] + st["thread_replays"] + st["served_calls"])
