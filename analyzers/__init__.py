"""The analyzer registry: every diagnosis ``advise`` runs, in a fixed order.

An analyzer is a pure function ``analyze(trace, options) -> AnalysisResult`` (no I/O, no
plotting, thresholds only from :class:`~recsys_doctor.options.Options`). Adding one means
one new module and one line in :data:`ANALYZERS`.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from .._fork import run_in_two
from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from . import (graph_candidate, launch_bound, memcpy_ping_pong, no_gpu_activity, short_kernels, small_grid,
               stream_contention, sync_api, utilization)

__all__ = ["ANALYZERS", "run_all"]

Analyzer = Callable[[Trace, Options], AnalysisResult]

#: name -> analyzer, in report order
ANALYZERS: dict[str, Analyzer] = {
    "no-gpu-activity": no_gpu_activity.analyze,
    "utilization": utilization.analyze,
    "launch-bound": launch_bound.analyze,
    "short-kernels": short_kernels.analyze,
    "stream-contention": stream_contention.analyze,
    "memcpy-ping-pong": memcpy_ping_pong.analyze,
    "sync-api": sync_api.analyze,
    "small-grid": small_grid.analyze,
    "graph-candidate": graph_candidate.analyze,
}


#: the order in which two processes take the analyzers: the usually longest first
PARALLEL_ORDER = ("graph-candidate", "stream-contention", "short-kernels", "sync-api", "launch-bound",
                  "memcpy-ping-pong", "small-grid", "utilization", "no-gpu-activity")


def run_all(trace: Trace, options: Options | None = None,
            on_done: Callable[[str], None] | None = None, *, parallel: bool = False) -> list[AnalysisResult]:
    """Run every registered analyzer over ``trace``; the results come in registry order.
    ``on_done(name)`` is called after each (progress reporting). ``parallel``: a forked
    process takes analyzers too (:func:`~recsys_doctor._fork.run_in_two`; the analyzers
    are pure functions of the trace, so the results are those of one process)."""
    options = options or Options()
    if parallel:
        names = list(ANALYZERS)
        tasks = [partial(fn, trace, options) for fn in ANALYZERS.values()]
        order = [names.index(n) for n in PARALLEL_ORDER] + [i for i, n in enumerate(names) if n not in PARALLEL_ORDER]
        return run_in_two(tasks, None if on_done is None else (lambda i: on_done(names[i])), order=order)
    out = []
    for name, fn in ANALYZERS.items():
        out.append(fn(trace, options))
        if on_done is not None:
            on_done(name)
    return out
