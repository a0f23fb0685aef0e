"""Launch-bound: the GPU sits idle because the CPU has not issued the next operation yet.

Per device, idle time is the part of its window not covered by any kernel, graph
execution, copy or memset. Each idle gap ends with a GPU operation; the gap is

* **host wait** when that operation's launch call began only after the GPU went idle
  (``launch_call.start >= end of the previous GPU activity on the device``): the GPU had
  nothing queued, it waited for the CPU;
* a **short gap** when it is shorter than ``Options.short_gap_us`` and not host wait
  (back-to-back launch latency of the driver and GPU front end);
* **other** otherwise (dependencies, syncs, work queued on the CPU side already, or an
  operation whose launch call is not in the trace).

Severity follows the launch-related share of the window, ``(host wait + short gaps) /
window``, against ``Options.high_share`` / ``medium_share``: both parts disappear when the
launches are batched (CUDA graphs) or spread over independent streams.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import AnalysisResult, Finding, severity_for_share
from ..model import Trace
from ..options import Options
from ._attribution import attribute, where_shares
from ._util import launches, left_join_ops, op_table, r, thread_labels

__all__ = ["analyze"]


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="launch-bound")
    ops = op_table(trace)
    if len(ops) == 0:
        res.data = {"devices": {}}
        return res
    j = launches(trace)
    ops = left_join_ops(ops, j, ["tid", "api_start"])
    short_ns = int(round(options.short_gap_us * 1000))
    devices: dict[str, dict] = {}
    hw_parts = []
    tot = {"window": 0, "idle": 0, "host_wait": 0, "short_gap": 0, "other": 0}
    for dev, g in ops.groupby("device", sort=True):
        g = g.sort_values(["start", "end"], kind="stable")
        s = g["start"].to_numpy(np.int64)
        e = g["end"].to_numpy(np.int64)
        cm = np.maximum.accumulate(e)
        gap = np.zeros(s.size, dtype=np.int64)
        gap[1:] = s[1:] - cm[:-1]
        new = gap > 0  # this op starts a new busy block after an idle gap
        idx = np.flatnonzero(new)
        gl = gap[idx]
        prev_end = cm[idx - 1]
        api_start = g["api_start"].to_numpy(dtype="float64", na_value=np.nan)[idx]
        host = ~np.isnan(api_start) & (api_start >= prev_end)
        shortg = ~host & (gl < short_ns)
        other = ~host & ~shortg
        win = int(e.max() - s.min())
        d = {
            "window_ns": win, "idle_ns": int(gl.sum()), "gaps": int(idx.size),
            "host_wait_ns": int(gl[host].sum()), "host_wait_gaps": int(host.sum()),
            "short_gap_ns": int(gl[shortg].sum()), "short_gaps": int(shortg.sum()),
            "other_ns": int(gl[other].sum()), "other_gaps": int(other.sum()),
        }
        d["idle_share"] = r(d["idle_ns"] / win) if win else None
        d["host_wait_share_of_idle"] = r(d["host_wait_ns"] / d["idle_ns"]) if d["idle_ns"] else None
        d["host_wait_share_of_window"] = r(d["host_wait_ns"] / win) if win else None
        devices[str(int(dev))] = d
        tot["window"] += win
        tot["idle"] += d["idle_ns"]
        tot["host_wait"] += d["host_wait_ns"]
        tot["short_gap"] += d["short_gap_ns"]
        tot["other"] += d["other_ns"]
        if host.any():
            hw_parts.append(pd.DataFrame({
                "pid": g["pid"].to_numpy()[idx][host], "tid": g["tid"].to_numpy(dtype="float64", na_value=np.nan)[idx][host],
                "api_start": api_start[host], "gap": gl[host]}))
    W = tot["window"]
    launch_share = ((tot["host_wait"] + tot["short_gap"]) / W) if W else None
    data = {
        "devices": devices,
        "window_ns": W, "idle_ns": tot["idle"], "host_wait_ns": tot["host_wait"],
        "short_gap_ns": tot["short_gap"], "other_idle_ns": tot["other"],
        "idle_share": r(tot["idle"] / W) if W else None,
        "host_wait_share_of_idle": r(tot["host_wait"] / tot["idle"]) if tot["idle"] else None,
        "host_wait_share_of_window": r(tot["host_wait"] / W) if W else None,
        "launch_share_of_window": r(launch_share),
        "short_gap_us": options.short_gap_us,
    }
    res.data = data
    if launch_share is None or launch_share < options.report_min_share:
        return res
    sev = severity_for_share(launch_share, options.high_share, options.medium_share)
    where: list[dict] = []
    if hw_parts:
        hw = pd.concat(hw_parts, ignore_index=True)
        hw = hw[~np.isnan(hw["tid"].to_numpy(float))]
        if len(hw):
            tid = hw["tid"].to_numpy().astype(np.int64)
            reg = attribute(trace, hw["pid"], tid, hw["api_start"].to_numpy().astype(np.int64))
            if any(x is not None for x in reg):
                where = where_shares(reg, hw["gap"], key="nvtx", top=options.top_n)
            labels = thread_labels(trace, hw["pid"], tid)
            where += where_shares(labels, hw["gap"], key="thread", top=options.top_n)
    res.findings.append(Finding(
        id="launch-bound", severity=sev,
        title=(f"GPU idle {data['idle_share']:.0%} of the window; {launch_share:.0%} of the window is "
               f"waiting for launches (host wait {data['host_wait_share_of_window']:.0%}, "
               f"short gaps {tot['short_gap'] / W:.0%})"),
        evidence=data,
        recommendation=(
            "The GPU waits for the CPU to issue work: capture the steady-state sequence in CUDA graphs "
            "(one launch per query/step), give each client thread its own stream group so launches "
            "from several threads overlap instead of queuing, and move host-side preprocessing off the "
            "launching thread."),
        where=where))
    return res
