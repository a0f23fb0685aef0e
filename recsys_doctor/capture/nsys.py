"""The Nsight Systems backend: run the program under ``nsys profile``, export SQLite.

Only CUDA API/activity and NVTX are traced (``-t cuda,nvtx``); CPU sampling and context
switch tracing are off (``--sample=none --cpuctxsw=none``): the analyzers do not use
them, and with them on the raw capture of even a tiny program grew to 2 GB on the H100
machine (``../shared/GPU.md``). The program runs as a child process; its stdout and
stderr go to a log file beside the trace so ``--json`` output stays clean.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ..errors import NsysNotFoundError, TraceFormatError
from ..loaders.nsysrep import find_nsys
from .workload import WorkloadError

__all__ = ["profile_argv", "export_argv", "run_nsys", "TRACE_FLAGS", "GIL_STACK_FLAGS", "find_nsys"]

#: what is traced, and what is switched off, for every capture
TRACE_FLAGS = ("-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none")
#: ``profile --gil-stacks``: OS-runtime calls of 10 us or more, each with its native call stack
#: (DWARF-unwound), so that the ``gil-handoffs`` finding can name who gave the GIL up
#: (``tests/data/gil_wdl_eager_q4`` was made so); the program runs slower under them
GIL_STACK_FLAGS = ("-t", "cuda,nvtx,osrt", "--sample=none", "--cpuctxsw=none", "--osrt-threshold=10000",
                   "--osrt-backtrace-threshold=10000", "--backtrace=dwarf")


def profile_argv(nsys: str | os.PathLike[str], out_base: str | os.PathLike[str], program: Sequence[str],
                 gil_stacks: bool = False) -> list[str]:
    """``nsys profile`` command line writing ``<out_base>.nsys-rep`` (nsys adds the
    suffix), replacing an older report of that name; ``gil_stacks``: :data:`GIL_STACK_FLAGS`."""
    flags = GIL_STACK_FLAGS if gil_stacks else TRACE_FLAGS
    return [str(nsys), "profile", *flags, "--force-overwrite=true", "-o", str(out_base), *map(str, program)]


def export_argv(nsys: str | os.PathLike[str], report: str | os.PathLike[str], sqlite: str | os.PathLike[str]) -> list[str]:
    """``nsys export`` command line turning ``report`` into the SQLite file ``sqlite``."""
    return [str(nsys), "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(sqlite), str(report)]


def _tail(path: Path, n: int = 1) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return " | ".join(lines[-n:]) if lines else "no output"


def run_nsys(program: Sequence[str], out_dir: Path, *, env: dict[str, str] | None = None,
             nsys: str | os.PathLike[str] | None = None, name: str = "trace",
             gil_stacks: bool = False) -> tuple[Path, list[str]]:
    """Profile ``program`` (an argv) under nsys, export it; return ``(sqlite path, profile
    argv)``. The program's and nsys's output go to ``<out_dir>/program.log``.

    Errors: :class:`NsysNotFoundError` (no nsys, or it cannot be started),
    :class:`WorkloadError` (the program exited non-zero: the log's last line says why),
    :class:`TraceFormatError` (nsys wrote no report, or the export failed)."""
    nsys = Path(nsys) if nsys else find_nsys()
    base = out_dir / name
    rep = base.with_suffix(".nsys-rep")
    sqlite = base.with_suffix(".sqlite")
    log = out_dir / "program.log"
    argv = profile_argv(nsys, base, program, gil_stacks=gil_stacks)
    with open(log, "ab") as fh:
        try:
            proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
        except OSError as e:
            raise NsysNotFoundError(f"cannot run {nsys} ({e.strerror or e})") from None
    if proc.returncode != 0:
        raise WorkloadError(f"{' '.join(map(str, program))} exited with status {proc.returncode} under nsys: "
                            f"{_tail(log)} (full output in {log})")
    if not rep.is_file():
        raise TraceFormatError(f"nsys wrote no report {rep}: {_tail(log)} (full output in {log})")
    with open(log, "ab") as fh:
        proc = subprocess.run(export_argv(nsys, rep, sqlite), stdout=fh, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0 or not sqlite.is_file():
        raise TraceFormatError(f"nsys export of {rep} failed (exit {proc.returncode}): {_tail(log)}")
    return sqlite, argv
