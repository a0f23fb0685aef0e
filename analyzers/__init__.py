"""The analyzer registry: every diagnosis ``advise`` runs, in a fixed order.

An analyzer is a pure function ``analyze(trace, options) -> AnalysisResult`` (no I/O, no
plotting, thresholds only from :class:`~recsys_doctor.options.Options`). Adding one means
one new module and one line in :data:`ANALYZERS`.
"""

from __future__ import annotations

import contextlib
import threading
from functools import partial
from typing import Callable

from .._util.fork import run_in_two, second_cpu
from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from . import (allocator_churn, comm_exposed, embedding_bound, gil_handoffs, graph_candidate, input_stall, kernel_mix,
               launch_bound, memcpy_ping_pong, no_gpu_activity, optimizer_unfused, process_sharing, short_kernels,
               small_grid, step_variance, stream_contention, stream_overlap, sync_api, utilization)

from ._shared_causes import SHARED_EVIDENCE_UNITS

__all__ = ["ANALYZERS", "EVIDENCE_UNITS", "evidence_units", "run_all", "summarize_and_run_all"]

Analyzer = Callable[[Trace, Options], AnalysisResult]

#: name -> analyzer, in report order
ANALYZERS: dict[str, Analyzer] = {
    "no-gpu-activity": no_gpu_activity.analyze,
    "utilization": utilization.analyze,
    "launch-bound": launch_bound.analyze,
    "short-kernels": short_kernels.analyze,
    "stream-contention": stream_contention.analyze,
    "gil-handoffs": gil_handoffs.analyze,
    "memcpy-ping-pong": memcpy_ping_pong.analyze,
    "sync-api": sync_api.analyze,
    "small-grid": small_grid.analyze,
    "graph-candidate": graph_candidate.analyze,
    "comm-exposed": comm_exposed.analyze,
    "allocator-churn": allocator_churn.analyze,
    "step-variance": step_variance.analyze,
    "embedding-bound": embedding_bound.analyze,
    "optimizer-unfused": optimizer_unfused.analyze,
    "input-stall": input_stall.analyze,
    "streams-never-overlap": stream_overlap.analyze,
    "processes-share-gpu": process_sharing.analyze,
    "kernel-mix": kernel_mix.analyze,
}


#: finding id -> {evidence key: unit}, as each analyzer declares them (its module's
#: ``EVIDENCE_UNITS``) plus what every finding may carry (``SHARED_EVIDENCE_UNITS``)
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    fid: {**SHARED_EVIDENCE_UNITS, **units}
    for m in (allocator_churn, comm_exposed, embedding_bound, gil_handoffs, graph_candidate, input_stall, kernel_mix,
              launch_bound, memcpy_ping_pong, no_gpu_activity, optimizer_unfused, process_sharing, short_kernels,
              small_grid, step_variance, stream_contention, stream_overlap, sync_api)
    for fid, units in m.EVIDENCE_UNITS.items()
}


def evidence_units(finding_id: str) -> dict[str, str]:
    """The declared units of a finding's evidence (only the shared ones for an id no
    analyzer declares)."""
    return EVIDENCE_UNITS.get(finding_id, SHARED_EVIDENCE_UNITS)


#: the order in which two processes take the analyzers: the usually longest first
PARALLEL_ORDER = ("graph-candidate", "stream-contention", "gil-handoffs", "short-kernels", "sync-api", "launch-bound",
                  "memcpy-ping-pong", "small-grid", "comm-exposed", "allocator-churn", "step-variance",
                  "embedding-bound", "optimizer-unfused", "streams-never-overlap", "processes-share-gpu", "kernel-mix",
                  "input-stall", "utilization", "no-gpu-activity")


def run_all(trace: Trace, options: Options | None = None,
            on_done: Callable[[str], None] | None = None, *, parallel: bool = False) -> list[AnalysisResult]:
    """Run every registered analyzer over ``trace``; the results come in registry order.
    ``on_done(name)`` is called after each (progress reporting). ``parallel``: a forked
    process takes analyzers too (:func:`~recsys_doctor._util.fork.run_in_two`; the analyzers
    are pure functions of the trace, so the results are those of one process)."""
    return summarize_and_run_all(trace, options, on_done, parallel=parallel, summary=False)[1]


def summarize_and_run_all(trace: Trace, options: Options | None = None,
                          on_done: Callable[[str], None] | None = None, *, parallel: bool = False,
                          summary: bool = True) -> tuple[dict | None, list[AnalysisResult]]:
    """The trace's summary (:func:`~.summary.summarize`; None unless ``summary``) and
    every analyzer's result, as :func:`run_all`. In parallel the summary is one more task
    for the two processes, and the tables most of them share (operations joined to their
    launch calls, the steady-state window, the idle gaps) are built first, once, so that
    neither process builds them again after the fork."""
    from .summary import summarize

    options = options or Options()
    names = (["summary"] if summary else []) + list(ANALYZERS)
    tasks = ([partial(summarize, trace)] if summary else []) + [partial(fn, trace, options)
                                                                for fn in ANALYZERS.values()]
    if parallel and second_cpu():
        _shared_tables(trace, options)
        first = [n for n in PARALLEL_ORDER if n in names]
        first = first[:2] + (["summary"] if summary else []) + first[2:]
        order = [names.index(n) for n in first] + [i for i, n in enumerate(names) if n not in first]
        out = run_in_two(tasks, None if on_done is None else (lambda i: on_done(names[i])), order=order)
    else:
        out = []
        for name, task in zip(names, tasks):
            out.append(task())
            if on_done is not None:
                on_done(name)
    results = out[1:] if summary else out
    _settle(trace, options, results)
    return (out[0], results) if summary else (None, results)


def _settle(trace: Trace, options: Options, results: list[AnalysisResult]) -> None:
    """Findings that count the same idle gaps share a cause: count each gap once
    (:func:`~._shared_causes.settle_shared_causes`), after every analyzer has run."""
    from ._recoverable import steady_window
    from ._shared_causes import settle_shared_causes

    findings = [f for r in results for f in r.findings]
    if findings:
        settle_shared_causes(findings, steady_window(trace, options), options)


def _shared_tables(trace: Trace, options: Options) -> None:
    """Build the tables most analyzers share, once: the launch join here while a thread
    finds the idle gaps (both are mostly numpy sorts, searches and gathers, which release
    the GIL, so the two overlap on two CPUs). Whatever the thread fails to build is built
    again, and its error raised, by the first analyzer that asks."""
    from ._ops import launches, op_table
    from ._recoverable import allocator_cover, idle_gaps, steady_window

    op_table(trace)
    steady_window(trace, options)  # (the per-trace caches exist before the thread starts)

    def gap_tables(trace: Trace, options: Options) -> None:  # (allocator_cover: four analyzers ask)
        idle_gaps(trace, options)
        allocator_cover(trace, options)

    gaps = threading.Thread(target=_quietly, args=(gap_tables, trace, options), name="recsys-doctor-gaps",
                            daemon=True)
    gaps.start()
    try:
        launches(trace)
    finally:
        gaps.join()


def _quietly(fn: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(Exception):
        fn(*args)
