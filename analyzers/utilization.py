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
from ._util import covered_in_bins, intersect_length, merge_intervals, op_table, stream_label

__all__ = ["analyze"]


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    ops = op_table(trace)
    res = AnalysisResult(name="utilization")
    if len(ops) == 0:
        res.data = {"devices": {}, "utilization": None, "timeline": None}
        return res
    lo, hi = int(ops["start"].min()), int(ops["end"].max())
    nb = max(1, int(options.timeline_bins))
    edges = np.linspace(lo, hi, nb + 1).round().astype(np.int64)
    widths = np.maximum(np.diff(edges), 1).astype(float)
    busy_ops = ops[ops["what"].isin(["kernel", "graph"])]
    devs: dict[str, Any] = {}
    tl_dev: dict[str, list[float]] = {}
    tot_busy = tot_win = 0
    for dev, g in ops.groupby("device", sort=True):
        w0, w1 = int(g["start"].min()), int(g["end"].max())
        b = busy_ops[busy_ops["device"] == dev]
        ms, me = merge_intervals(b["start"].to_numpy(), b["end"].to_numpy())
        busy = int((me - ms).sum())
        win = w1 - w0
        frac = covered_in_bins(ms, me, edges) / widths
        tl_dev[str(int(dev))] = [round(float(x), 4) for x in frac]
        cut = steady_cut(frac, edges, w0, w1, options.startup_fraction)
        steady_busy = intersect_length(ms, me, cut, w1)
        devs[str(int(dev))] = {
            "window_ns": win,
            "busy_ns": busy,
            "utilization": (busy / win) if win > 0 else None,
            "steady_start_ns": cut,
            "steady_utilization": (steady_busy / (w1 - cut)) if w1 > cut else None,
        }
        tot_busy += busy
        tot_win += win
    tl_stream: dict[str, list[float]] = {}
    for (pid, dev, st), g in busy_ops.groupby(["pid", "device", "stream"], sort=True):
        ms, me = merge_intervals(g["start"].to_numpy(), g["end"].to_numpy())
        tl_stream[stream_label(pid, dev, st)] = [round(float(x), 4) for x in covered_in_bins(ms, me, edges) / widths]
    res.data = {
        "devices": devs,
        "utilization": (tot_busy / tot_win) if tot_win > 0 else None,
        "timeline": {"start_ns": lo, "end_ns": hi, "bins": nb, "edges_ns": [int(x) for x in edges],
                     "devices": tl_dev, "streams": tl_stream},
    }
    return res
