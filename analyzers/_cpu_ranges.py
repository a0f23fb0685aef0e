"""CPU-side ranges the recommender findings look for (optimizer steps, data loading,
profiler steps) and how much of them the GPU spent idle.

Ranges are picked by a regex over the distinct names of ``trace.ranges`` (a categorical),
never per row; GPU idle inside them is one interval intersection per process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model import Trace
from ._arrays import merge_intervals
from ._ops import op_table
from ._util import coverage_at, str_contains, take_str

__all__ = ["ranges_matching", "gpu_idle_within", "profiler_steps"]


def ranges_matching(trace: Trace, pattern: str, *, cpu_ops: bool = False) -> np.ndarray:
    """Rows of ``trace.ranges`` whose name matches ``pattern``: code regions (NVTX,
    ``record_function``), or aten ``cpu_op`` rows with ``cpu_ops``."""
    rg = trace.ranges
    if not len(rg):
        return np.zeros(0, dtype=np.int64)
    hit = str_contains(rg["name"], pattern).to_numpy(bool)
    is_op = (rg["source"] == "cpu_op").to_numpy(bool)
    return np.flatnonzero(hit & (is_op if cpu_ops else ~is_op))


def gpu_idle_within(trace: Trace, pid: Any, start: Any, end: Any) -> tuple[int, int]:
    """(GPU idle ns, total ns) over the union of the intervals ``[start, end)``, each of
    process ``pid``: the time no GPU operation (kernel, copy, memset, graph) of that
    process was running, on any of its devices."""
    pid = np.asarray(pid, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    ops = op_table(trace)
    opid = ops["pid"].to_numpy(np.int64)
    ostart, oend = ops["start"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    idle = total = 0
    for p in np.unique(pid):
        rs, re_ = merge_intervals(start[pid == p], end[pid == p])
        span = int((re_ - rs).sum())
        m = opid == p
        bs, be = merge_intervals(ostart[m], oend[m])
        busy = int((coverage_at(bs, be, re_) - coverage_at(bs, be, rs)).sum())
        idle += span - busy
        total += span
    return idle, total


def profiler_steps(trace: Trace) -> tuple[int, float | None]:
    """(number of ``ProfilerStep#N`` steps, their mean duration in ns) - each step once,
    where a trace repeats it on another track, the longest."""
    rows = ranges_matching(trace, r"^ProfilerStep#\d+$")
    if not rows.size:
        return 0, None
    rg = trace.ranges
    names = take_str(rg["name"], rows)
    dur = (rg["end"].to_numpy(np.int64) - rg["start"].to_numpy(np.int64))[rows]
    best: dict[str, int] = {}
    for n, d in zip(names.tolist(), dur.tolist()):
        best[n] = max(best.get(n, 0), d)
    return len(best), float(np.mean(list(best.values())))
