"""Which Python code holds the host: sample a running program's threads with py-spy.

A launch-bound recommender server is usually bound by its CPU threads, not by the GPU:
each client thread needs the GIL to run the model's Python and to enter every launch.
:func:`sample_process` takes ``py-spy dump --json --nonblocking`` of a process every
``interval_s`` (each snapshot says, per thread, whether it holds the GIL, whether the OS
has it running, and its stack) and :class:`HostSamples` sums them per thread: the share
of the process's snapshots in which the thread held the GIL, the share of its own it was running, and its top
frames (the innermost frame of each snapshot, counted over its running or GIL-holding
snapshots). :func:`sample_program` runs a command as a child and samples it until it
exits; ``profile --host-sample`` uses it (docs/profile.md), with or without a GPU.

py-spy is an optional dependency (``pip install recsys-doctor[host]``, pinned); it reads
the process's memory with ``process_vm_readv``, so it needs ptrace permission over the
child (root, ``CAP_SYS_PTRACE``, or ``kernel.yama.ptrace_scope`` 0/1 for one's own
child). Where it cannot attach, the result says so in one line (``reason``), nothing else
fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["HostSamples", "find_py_spy", "sample_process", "sample_program", "host_profile"]

#: the frozen module every stack that is importing a module goes through
_IMPORTING = "<frozen importlib._bootstrap"
#: how often a snapshot is taken (one ``py-spy dump`` costs ~15-70 ms of CPU)
DEFAULT_INTERVAL_S = 0.1
_TOP = 5


def find_py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (a venv), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.is_file() and os.access(here, os.X_OK) else shutil.which("py-spy")


@dataclass
class _Thread:
    name: str
    snapshots: int = 0
    gil: float = 0.0
    active: int = 0
    imports: int = 0
    frames: Counter = field(default_factory=Counter)


@dataclass
class HostSamples:
    """Per-thread sums of py-spy snapshots of one process; ``reason`` says why there are
    none (py-spy missing, no permission to attach, the process gone)."""

    pid: int | None = None
    snapshots: int = 0
    interval_s: float = DEFAULT_INTERVAL_S
    reason: str | None = None
    threads: dict[int, _Thread] = field(default_factory=dict)

    def add(self, dump: list[dict[str, Any]]) -> None:
        """Count one ``py-spy dump --json`` snapshot."""
        self.snapshots += 1
        # a non-blocking snapshot is not atomic: two threads may both seem to hold the GIL;
        # each then gets an equal part of it, so that a snapshot counts one holder at most
        holders = sum(1 for th in dump if th.get("owns_gil"))
        for th in dump:
            tid = int(th.get("os_thread_id") or th.get("thread_id") or 0)
            t = self.threads.setdefault(tid, _Thread(str(th.get("thread_name") or f"thread {tid}")))
            t.snapshots += 1
            gil, active = bool(th.get("owns_gil")), bool(th.get("active"))
            t.gil += gil / holders if gil else 0.0
            t.active += active
            frames = th.get("frames") or []
            if frames and (gil or active):
                if any(_IMPORTING in str(f.get("filename") or "") for f in frames):
                    t.imports += 1  # (start-up: the program's imports, not the work it is run for)
                    continue
                f = frames[0]
                t.frames[f"{f.get('name')} ({f.get('short_filename') or f.get('filename')})"] += 1

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: per thread (most GIL-holding first) its GIL share of all the
        process's snapshots (one GIL: the threads' shares add up to at most 1, also where a
        thread lived for part of the run only), its running share, the share of its own
        snapshots spent importing modules (``import_share``: a stack through
        ``<frozen importlib._bootstrap>``, the program's start-up) and its top frames outside
        imports with their share of the thread's own snapshots."""
        rows: list[dict[str, Any]] = []
        whole = max(self.snapshots, 1)
        for tid, t in self.threads.items():
            n = max(t.snapshots, 1)
            rows.append({"tid": tid, "name": t.name, "snapshots": t.snapshots, "gil_share": round(t.gil / whole, 4),
                         "active_share": round(t.active / n, 4), "import_share": round(t.imports / n, 4),
                         "top_frames": [{"frame": fr, "share": round(c / n, 4)} for fr, c in t.frames.most_common(_TOP)]})
        rows.sort(key=lambda x: (-x["gil_share"], -x["active_share"], x["tid"]))
        return {"tool": "py-spy dump", "pid": self.pid, "snapshots": self.snapshots, "interval_s": self.interval_s,
                "reason": self.reason, "threads": rows}


def _dump(py_spy: Sequence[str], pid: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """One snapshot, or (None, why not)."""
    try:
        p = subprocess.run([*py_spy, "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"py-spy could not run: {e}"
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        return None, msg[-1] if msg else f"py-spy exited with {p.returncode}"
    try:
        return json.loads(p.stdout), None
    except json.JSONDecodeError:
        return None, "py-spy printed no JSON"


def _why(msg: str) -> str:
    low = msg.lower()
    if "permission" in low or "operation not permitted" in low or "ptrace" in low:
        return (f"py-spy cannot attach ({msg}): it needs ptrace permission (run as root, grant CAP_SYS_PTRACE, "
                "or set kernel.yama.ptrace_scope to 0 or 1)")
    return f"py-spy could not read the process: {msg}"


def sample_process(pid: int, stop: threading.Event, *, interval_s: float = DEFAULT_INTERVAL_S,
                   alive: Any = None, command: Sequence[str] | None = None) -> HostSamples:
    """Snapshot process ``pid`` every ``interval_s`` until ``stop`` is set (or ``alive()``
    says it ended). Errors while the process is alive are kept as ``reason`` (the last one
    when no snapshot ever succeeded); failures after it exits are not errors. ``command``:
    how to run py-spy (default :func:`find_py_spy`; e.g. under another user)."""
    out = HostSamples(pid=pid, interval_s=interval_s)
    found = find_py_spy()
    py_spy = list(command) if command else ([found] if found else None)
    if py_spy is None:
        out.reason = "py-spy is not installed (pip install 'recsys-doctor[host]'): no host sampling"
        return out
    last_err = None
    while not stop.is_set():
        t0 = time.perf_counter()
        dump, err = _dump(py_spy, pid)
        if dump is not None:
            out.add(dump)
        elif alive is None or alive():
            last_err = err
        stop.wait(max(0.0, interval_s - (time.perf_counter() - t0)))
    if not out.snapshots and last_err:
        out.reason = _why(last_err)
    return out


def sample_program(argv: Sequence[str], *, log: Path, env: dict[str, str] | None = None,
                   interval_s: float = DEFAULT_INTERVAL_S, startup_s: float = 0.2,
                   command: Sequence[str] | None = None) -> tuple[int, HostSamples]:
    """Run ``argv`` (output to ``log``) and sample it until it exits: (exit code, samples).
    The first ``startup_s`` (interpreter start-up) is not sampled."""
    stop = threading.Event()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, env=env)
        box: dict[str, HostSamples] = {}

        def run() -> None:
            if not stop.wait(startup_s):
                box["s"] = sample_process(proc.pid, stop, interval_s=interval_s, alive=lambda: proc.poll() is None,
                                          command=command)

        th = threading.Thread(target=run, name="recsys-doctor-host-sample", daemon=True)
        th.start()
        try:
            rc = proc.wait()
        finally:
            stop.set()
            th.join()
    return rc, box.get("s") or HostSamples(pid=proc.pid, interval_s=interval_s,
                                           reason="the program ended before it could be sampled")


def host_profile(target: str | os.PathLike[str], args: Sequence[str] = (), *, out_dir: str | os.PathLike[str],
                 threads: int | None = None, duration_s: float | None = None, steps: int | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S) -> dict[str, Any]:
    """Run ``target`` once, with no GPU profiler and no GPU needed, sampled by py-spy:
    a plain script as ``python target args``, a workload module through the measuring
    child (its measurement is kept). Writes ``host_sample.json`` into ``out_dir``; returns
    ``{"command", "exit_code", "log", "host_sampling"}``. A failing program raises
    :class:`~recsys_doctor.errors.WorkloadError` naming its last output line."""
    from ..errors import BadInputError, WorkloadError
    from .workload import is_workload_module
    from .child_process import check_workload_options, child_argv, child_env

    path = Path(target)
    if not path.is_file():
        raise BadInputError(f"{path}: no such file")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"--out {out}: cannot create ({e.strerror or e})") from None
    is_wl = is_workload_module(path)
    check_workload_options(path, is_wl, threads, duration_s, steps)
    argv = (child_argv(path, out / "host_sample_measure.json", list(args), threads=threads, duration_s=duration_s,
                       steps=steps, profiled=None) if is_wl else [sys.executable, str(path), *args])
    log = out / "host_sample.log"
    rc, samples = sample_program(argv, log=log, env=child_env(), interval_s=interval_s)
    if rc != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        raise WorkloadError(f"{lines[-1].strip() if lines else 'no output'} (exit {rc}; full output in {log})")
    doc = {"command": [str(a) for a in argv], "exit_code": rc, "log": str(log), "host_sampling": samples.to_dict()}
    (out / "host_sample.json").write_text(json.dumps(doc, indent=1))
    return doc
