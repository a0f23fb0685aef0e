"""What the hook did: groups, threads placed, graphs captured and replayed, fallback reasons, and
per call site of the script the calls taken over and left to PyTorch (``stats()``).

At exit the first hooked interpreter writes ``stats()`` as JSON to the file that
``RECSYS_DOCTOR_HOOK_STATS`` names (``profile --apply`` sets it for every hooked run it makes and
reads it back), and prints it on stderr where ``RECSYS_DOCTOR_AUTOAPPLY_LOG`` is set.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from ._common import _first_line, _log, _state
from .accounting import sites
from .meter import measurement, timed

#: the file the stats are written to at exit (JSON); unset: none is written
ENV_STATS = "RECSYS_DOCTOR_HOOK_STATS"
#: the process that writes that file: the first hooked interpreter sets it to its own id, and the
#: interpreters it starts (a spawned DataLoader worker, a subprocess) inherit it and write nothing,
#: so a child's exit never replaces the script's numbers
ENV_STATS_PID = "RECSYS_DOCTOR_HOOK_STATS_PID"


def stats() -> dict[str, Any]:
    """Groups created, threads placed, graphs captured, replays, fallback reasons, batches (where
    the plan batches: their count, the calls in them, ``batch_sizes``: size -> batches), and per
    call site of the script (:func:`.accounting.sites`) the calls taken over and left to PyTorch.
    ``not_applied``: why the plan did nothing (a bad plan file), else None. ``thread_errors``:
    exceptions that ended a thread of the script (:mod:`.threaderrors`), the first few;
    ``copy_only_threads``: threads placed at their start that copied to the GPU but called no
    model (:func:`.interception._note_copy_only`); ``measurement``: the hook's own rate of
    top-level model calls where metering is on (:mod:`.meter`), else None; ``training_threads``
    / ``training_thread_count``: threads that left their group to train (:mod:`.trainers`); ``ended_threads`` / ``short_lived_threads``:
    placed threads that ended, and those of them that made fewer model calls than a thread graph
    needs to pay for its capture (:func:`.thread_graphs.short_lived`)."""
    per_site = sites()
    sizes = dict(sorted((_state.get("batch_sizes") or {}).items()))
    return {"active": _state.get("active", False), "groups": _state.get("n_groups"),
            "graphs": _state.get("graphs"), "batching": bool(_state.get("batching")),
            "max_batch": _state.get("max_batch"), "batches": sum(sizes.values()),
            "batched_calls": sum(k * n for k, n in sizes.items()), "batch_sizes": sizes,
            "threads": _state.get("started", 0), "late_threads": _state.get("late_threads", 0),
            "captured": _state.get("captured", 0), "replays": _state.get("replays", 0),
            "thread_graphs": _state.get("thread_captured", 0), "thread_replays": _state.get("thread_replays", 0),
            "ended_threads": _state.get("ended_threads", 0), "short_lived_threads": _state.get("short_lived_threads", 0),
            "materialized": _state.get("materialized", 0), "pageable_fast": _state.get("pageable_fast", 0),
            "mark_waits": _state.get("mark_waits", 0),
            "outputs_lent": _state.get("outputs_lent", 0),
            "served_calls": _state.get("served_calls", 0),
            "module_changes": _state.get("module_changes", 0),
            "thread_errors": list(_state.get("thread_errors", [])),
            "thread_error_count": _state.get("thread_error_count", 0),
            "copy_only_threads": list(_state.get("copy_only_threads", [])),
            "copy_only_count": _state.get("copy_only_count", 0),
            "training_threads": list(_state.get("training_threads", [])),
            "training_thread_count": _state.get("training_threads_count", 0),
            "served_batch_sizes": _served_batch_sizes(),
            "staged_copies": sum(r["taken_over"] for r in per_site if r["kind"] == "h2d"),
            "fallbacks": list(_state.get("fallbacks", [])), "not_applied": _state.get("not_applied"), "sites": per_site,
            "meter_only": bool(_state.get("meter_only")), "measurement": measurement()}


def _served_batch_sizes() -> dict[str, int]:
    """The runtime's batch sizes (size -> batches) over the models it served for the hook (:mod:`.served`)."""
    out: dict[str, int] = {}
    for sm in _state.get("served_models", []):
        try:
            for k, n in sm.stats()["batching"].get("batch_sizes", {}).items():
                out[str(k)] = out.get(str(k), 0) + int(n)
        except Exception:  # noqa: BLE001 - a closed or broken served model: no sizes
            continue
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def claim_stats_file() -> None:
    """Make this interpreter the one that writes ``$RECSYS_DOCTOR_HOOK_STATS``, unless the
    interpreter that started it already is (see :data:`ENV_STATS_PID`)."""
    if os.environ.get(ENV_STATS) and not os.environ.get(ENV_STATS_PID):
        os.environ[ENV_STATS_PID] = str(os.getpid())


def write_stats(path: str | os.PathLike[str]) -> bool:
    """:func:`stats` as JSON into ``path``, through a temp file beside it renamed over it (a
    reader never sees half a file). A failure is one line on stderr and False, never an
    exception: the user's program ends as it would have without the hook."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    try:
        with _write_lock:  # (a snapshot and the last write of a worker process: one at a time)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(stats(), f, default=str)
            os.replace(tmp, path)
        return True
    except Exception as ex:  # noqa: BLE001 - never break the user's program
        _log(f"could not write the hook's stats to {os.fspath(path)}: {_first_line(ex)}")
        try:
            os.remove(tmp)
        except OSError:
            pass
        return False


#: seconds between the snapshots of its stats a worker process of the program writes
SNAPSHOT_S = float(os.environ.get("RECSYS_DOCTOR_HOOK_STATS_EVERY_S") or 0.5)
_write_lock = threading.Lock()


def snapshots_in_child() -> None:
    """Where this is a child process of the hooked program (a stats path not this process's):
    from its first placed thread on, a daemon thread of the hook's writes its stats every
    :data:`SNAPSHOT_S` seconds, as :func:`_at_exit` does at the end. A worker its pool
    terminates (``with multiprocessing.Pool() as pool:`` ends in SIGTERM) runs no ``atexit``
    function: its counts up to the last snapshot are kept. (Not a SIGTERM handler: a worker
    whose main thread is stuck in a C call would no longer die of its pool's SIGTERM, and the
    pool's ``terminate`` would wait for it forever.) Once a process."""
    path = os.environ.get(ENV_STATS)
    if not path or os.environ.get(ENV_STATS_PID) == str(os.getpid()) or _state.get("snapshots") == os.getpid():
        return
    _state["snapshots"] = os.getpid()
    target = child_stats_path(path, os.getpid())

    def snapshot() -> None:
        while True:
            time.sleep(SNAPSHOT_S)
            write_stats(target)

    t = threading.Thread(target=snapshot, name="recsys-doctor-stats", daemon=True)
    # (placed in no group: .interception._runtime_thread)
    t.rd_hook_thread = True  # type: ignore[attr-defined]
    t.start()


def _at_exit() -> None:
    """Registered at interpreter start, so it runs after the script's non-daemon threads are
    joined (and ``concurrent.futures``' workers, which ``threading`` joins first) and after any
    ``atexit`` function registered later (PyTorch's): the counts are final."""
    if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_LOG"):
        _log(json.dumps(stats()))
    path = os.environ.get(ENV_STATS)
    if not path:
        return
    if os.environ.get(ENV_STATS_PID) == str(os.getpid()):
        write_stats(path)
    elif _state.get("started", 0) or _state.get("late_threads", 0) or timed():
        # a child process of the program (multiprocessing) with threads the hook placed: in plan
        # groups, or a group of their own (a worker serving on its main thread); or, metered, one
        # that called models (a worker a pool terminates runs no exit handler: its calls are lost)
        write_stats(child_stats_path(path, os.getpid()))


def child_stats_path(path: str, pid: int) -> str:
    """Where a child process of the hooked program writes its stats, beside ``path`` (the
    program's own, :func:`~recsys_doctor.applying.script_hook.read_hook_stats` merges them)."""
    return f"{path}.proc-{pid}.json"
