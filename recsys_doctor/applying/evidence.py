"""The after-state evidence of ``profile --apply``: synchronizing CUDA calls per query (per step
for training) and GPU busy, before and after, from the two profiles; and, for a plain script,
what the hook took over in the kept plan's runs (its ``stats()``, per line of the script).

Both numbers come from definitions that exist once in the package, read off each profile's
diagnosis: a synchronizing call is what the ``sync-api`` analyzer counts
(``analyzers/sync_api.py``: ``*Synchronize`` calls, copies without ``Async``, and async
device-to-host copies into pageable memory, which block all the same); GPU busy is the summary's
``gpu_utilization`` (``analyzers/summary.py``). The queries (steps) are those of the profiled
run itself: a workload's measurement under the profiler (its trace is analyzed inside the
``measure`` window, so both sides count the same calls); a script's own last JSON line in
that profile's ``program.log`` (``queries``, else ``calls``; ``steps`` for a training loop; for
a script that prints no q/s, its last JSON line's ``queries`` or ``calls`` all the same, or
its ``steps`` where it has neither: a training loop that prints no step time).
A script's trace is analyzed whole, so its syncs include start-up and warm-up ones, which
its count of queries leaves out: a few more per query than the steady state, on both sides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import WorkloadError
from .report import _trace_util
from .script_hook import last_json, parse_script_result

__all__ = ["sync_calls", "profiled_units", "sync_evidence", "HOOK_STATS_FILE"]

#: the file, in an "after" profile's folder, that the script hook writes its stats to
HOOK_STATS_FILE = "hook_stats.json"


def sync_calls(advise: Any) -> int | None:
    """Synchronizing CUDA API calls of a diagnosed trace, as ``sync-api`` counts them (None
    where that analyzer did not run)."""
    v = ((getattr(advise, "analyses", None) or {}).get("sync-api") or {}).get("calls")
    return int(v) if isinstance(v, (int, float)) else None


def profiled_units(prof: Any) -> tuple[int | None, str]:
    """``(calls, "query" or "step")`` of one profiled run (a
    :class:`~recsys_doctor.capture.ProfileResult`): see the module docstring. ``None`` calls
    where the run counted none."""
    m = getattr(prof, "measurement", None)
    if m is not None:
        return (int(m.calls) if m.calls else None), ("step" if m.kind == "train" else "query")
    try:
        text = (Path(prof.out_dir) / "program.log").read_text(errors="replace")
    except OSError:
        return None, "query"
    try:
        line = parse_script_result(text)
    except WorkloadError:  # (a script printing no q/s: its last JSON line's count, where it has one)
        line = last_json(text) or {}
    counts_steps = "steps" in line and not {"queries", "calls"} & line.keys()  # (a silent training loop)
    if line.get("qps") is None and (line.get("step_ms") is not None or counts_steps):
        n, unit = line.get("steps"), "step"
    else:
        n, unit = line.get("queries", line.get("calls")), "query"
    return (int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0 else None), unit


def sync_evidence(before: Any, after: Any | None) -> dict[str, Any]:
    """Syncs, queries (steps), syncs per query (step) and GPU busy % of the before and after
    profiles: ``{"unit", "syncs": {"before", "after"}, "units": {...}, "syncs_per_unit": {...},
    "gpu_busy_pct": {...}}`` (a side's values are None where it has no profile or count)."""
    ev: dict[str, Any] = {"unit": "query", "syncs": {}, "units": {}, "syncs_per_unit": {}, "gpu_busy_pct": {}}
    for side, prof in (("before", before), ("after", after)):
        syncs = sync_calls(prof.advise) if prof is not None else None
        n, unit = profiled_units(prof) if prof is not None else (None, ev["unit"])
        if side == "before":
            ev["unit"] = unit
        ev["syncs"][side], ev["units"][side] = syncs, n
        ev["syncs_per_unit"][side] = round(syncs / n, 4) if syncs is not None and n else None
        ev["gpu_busy_pct"][side] = _trace_util(prof.advise) if prof is not None else None
    return ev

