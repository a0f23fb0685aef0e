"""GPU utilization per device, a binned timeline, and the steady state apart from start-up.

This analyzer reports no finding of its own: low utilization is a symptom, and the
findings of the other analyzers (launch-bound, short kernels, contention...) name causes.
Its ``data`` feeds the reports' plots and the other findings' evidence.

``data``::

    {"devices": {dev: {"window_ns", "busy_ns", "utilization",
                       "steady_start_ns", "steady_utilization"}},
     "utilization": float | None,            # same definition as the summary
     "timeline": {"start_ns", "end_ns", "bins",
                  "devices": {dev: [busy fraction per bin]},
                  "streams": {"pid P dev D stream S": [busy fraction per bin]}}}

Busy = union of kernel and graph-execution intervals (copies are not compute); the
window of a device spans all its GPU activity. The steady state starts at the later of
``Options.startup_fraction`` of the window and the first timeline bin of that device that
reaches half of its median non-empty bin (see ``Options.startup_fraction``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._recoverable import steady_cut
from ._ops import device_busy, timeline_edges
from ._util import covered_in_bins, intersect_length, merge_intervals, op_table, stream_label

__all__ = ["analyze"]


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="utilization")
    parts = device_busy(trace)
    if not parts:
        res.data = {"devices": {}, "utilization": None, "timeline": None}
        return res
    edges = timeline_edges(trace, options.timeline_bins)
    widths = np.maximum(np.diff(edges), 1).astype(float)
    devs: dict[str, Any] = {}
    tl_dev: dict[str, list[float]] = {}
    tot_busy = tot_win = 0
    for p in parts:
        busy = int((p.busy_end - p.busy_start).sum())
        win = p.last - p.first
        frac = covered_in_bins(p.busy_start, p.busy_end, edges) / widths
        tl_dev[str(p.device)] = [round(float(x), 4) for x in frac]
        cut = steady_cut(frac, edges, p.first, p.last, options.startup_fraction)
        steady_busy = intersect_length(p.busy_start, p.busy_end, cut, p.last)
        devs[str(p.device)] = {
            "window_ns": win,
            "busy_ns": busy,
            "utilization": (busy / win) if win > 0 else None,
            "steady_start_ns": cut,
            "steady_utilization": (steady_busy / (p.last - cut)) if p.last > cut else None,
        }
        tot_busy += busy
        tot_win += win
    res.data = {
        "devices": devs,
        "utilization": (tot_busy / tot_win) if tot_win > 0 else None,
        "timeline": {"start_ns": int(edges[0]), "end_ns": int(edges[-1]), "bins": len(edges) - 1,
                     "edges_ns": [int(x) for x in edges], "devices": tl_dev,
                     "streams": _stream_timelines(trace, edges, widths)},
    }
    return res


def _stream_timelines(trace: Trace, edges: np.ndarray, widths: np.ndarray) -> dict[str, list[float]]:
    """Busy fraction per bin of every stream (kernels and graph executions)."""
    ops = op_table(trace, ("kernel", "graph"))
    out: dict[str, list[float]] = {}
    for (pid, dev, st), g in ops.groupby(["pid", "device", "stream"], sort=True):
        ms, me = merge_intervals(g["start"].to_numpy(), g["end"].to_numpy())
        out[stream_label(pid, dev, st)] = [round(float(x), 4) for x in covered_in_bins(ms, me, edges) / widths]
    return out
