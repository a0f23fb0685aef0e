"""The analyzer registry: every diagnosis ``advise`` runs, in a fixed order.

An analyzer is a pure function ``analyze(trace, options) -> AnalysisResult`` (no I/O, no
plotting, thresholds only from :class:`~recsys_doctor.options.Options`). Adding one means
one new module and one line in :data:`ANALYZERS`.
"""

from __future__ import annotations

from typing import Callable

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


def run_all(trace: Trace, options: Options | None = None,
            on_done: Callable[[str], None] | None = None) -> list[AnalysisResult]:
    """Run every registered analyzer over ``trace``, in registry order; ``on_done(name)``
    is called after each (progress reporting)."""
    options = options or Options()
    out = []
    for name, fn in ANALYZERS.items():
        out.append(fn(trace, options))
        if on_done is not None:
            on_done(name)
    return out
