"""The parent's side of the workload child process (:mod:`._child`): its command line,
its environment, running it and reading the measurement it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from ..errors import BadInputError, WorkloadError
from .workload import Measurement
from .treatment import Treatment

__all__ = ["CHILD_MODULE", "check_workload_options", "child_argv", "child_env", "run_child_measure", "measurement_from_json"]

#: the module run as the child when nothing changes the workload
CHILD_MODULE = "recsys_doctor.capture._child"


def check_workload_options(target: Path, is_wl: bool, threads: int | None, duration_s: float | None,
                           steps: int | None) -> None:
    """``--threads/--duration/--steps`` drive a workload module; for a plain script they
    are an error (it runs as it is, with its own arguments), never silently dropped."""
    if not is_wl and any(v is not None for v in (threads, duration_s, steps)):
        raise BadInputError(f"{target}: --threads/--duration/--steps apply to a workload module "
                            "(one with a workload() function); a plain script is profiled as it is")


def child_argv(target: Path, result: Path, args: Sequence[str], *, threads: int | None,
               duration_s: float | None, steps: int | None, profiled: str | None,
               treatment: Treatment | None = None) -> list[str]:
    """The command that drives a workload in a child process; with ``treatment``, its
    child module and arguments (the workload runs changed)."""
    module = treatment.child_module if treatment is not None and treatment.child_module else CHILD_MODULE
    argv = [sys.executable, "-m", module, str(target), "--result", str(result)]
    if treatment is not None:
        argv += list(treatment.child_args)
    if threads is not None:
        argv += ["--threads", str(threads)]
    if duration_s is not None:
        argv += ["--duration", repr(float(duration_s))]
    if steps is not None:
        argv += ["--steps", str(steps)]
    if profiled:
        argv += ["--profiled", profiled]
    return argv + ["--", *args] if args else argv


def child_env() -> dict[str, str]:
    """The parent's environment with this package importable in the child."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def run_child_measure(argv: list[str], result: Path, log: Path) -> Measurement:
    """Run the child ``argv`` (output appended to ``log``) and read its measurement; a
    failed child raises the error its last output line names."""
    with open(log, "ab") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=child_env())
    if proc.returncode != 0 or not result.is_file():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "no output"
        last = last.removeprefix("recsys-doctor: error: ")
        cls = BadInputError if proc.returncode == 2 else WorkloadError
        raise cls(f"{last} (full output in {log})")
    return measurement_from_json(result)


def measurement_from_json(path: Path) -> Measurement:
    return Measurement(**json.loads(path.read_text()))
