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

Reported when the launch-related share of the window, ``(host wait + short gaps) /
window``, reaches ``Options.report_min_share``. Recoverable time: the host-wait and
short gaps of the steady state (start-up idle excluded, see ``_recoverable``): both
disappear when the launches are batched (CUDA graphs) or spread over independent
streams. Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import AnalysisResult, Finding
from ..model import Trace
from ..options import Options
from ._attribution import attribute, where_shares
from ._recoverable import examples, finish, steady_starts, steady_window
from ._util import launches, left_join_ops, op_table, r, thread_labels

__all__ = ["analyze"]


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="launch-bound")
    ops = op_table(trace)
    if len(ops) == 0:
        res.data = {"devices": {}}
        return res
    j = launches(trace)
    ops = left_join_ops(ops, j, ["tid", "api_start", "api_name"] + (["callsite"] if "callsite" in j.columns else []))
    if "callsite" not in ops.columns:
        ops["callsite"] = None
    short_ns = int(round(options.short_gap_us * 1000))
    steady = steady_starts(trace, options, ops)
    rec = 0
    ex_parts = []
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
        in_steady = prev_end >= steady.get(int(dev), 0)
        rec += int(gl[(host | shortg) & in_steady].sum())
        hs = host & in_steady
        if hs.any():
            ex_parts.append(pd.DataFrame({
                "start": prev_end[hs], "end": s[idx][hs], "pid": g["pid"].to_numpy()[idx][hs],
                "tid": g["tid"].to_numpy(dtype="float64", na_value=np.nan)[idx][hs],
                "device": g["device"].to_numpy()[idx][hs], "stream": g["stream"].to_numpy()[idx][hs]}))
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
        # where: the steady-state host waits (the ones counted as recoverable), else all
        wm = hs if hs.any() else host
        if wm.any():
            hw_parts.append(pd.DataFrame({
                "pid": g["pid"].to_numpy()[idx][wm], "tid": g["tid"].to_numpy(dtype="float64", na_value=np.nan)[idx][wm],
                "api_start": api_start[wm], "gap": gl[wm],
                "api": g["api_name"].to_numpy(object)[idx][wm],
                "callsite": g["callsite"].to_numpy(object)[idx][wm]}))
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
        "steady_launch_wait_ns": int(rec),
    }
    res.data = data
    if launch_share is None or launch_share < options.report_min_share:
        return res
    sev = "note"
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
            if not any("nvtx" in w for w in where):
                # no code regions: the CUDA calls whose late arrival left the GPU idle
                where += where_shares(hw["api"].to_numpy(object), hw["gap"], key="api", top=options.top_n)
                # and, where the trace has backtraces, the program's own frame that called
                where += where_shares(hw["callsite"].to_numpy(object), hw["gap"], key="callsite", top=options.top_n)
    res.findings.append(Finding(
        id="launch-bound", severity=sev,
        title=(f"GPU idle {data['idle_share']:.0%} of the window; {launch_share:.0%} of the window is "
               f"waiting for launches (host wait {data['host_wait_share_of_window']:.0%}, "
               f"short gaps {tot['short_gap'] / W:.0%})"),
        evidence=data,
        recommendation=_advice(trace, ops),
        where=where))
    f = res.findings[-1]
    f.action = ("overlap requests on several stream groups (the work already runs in CUDA graphs)"
                if f.recommendation.startswith("The work is already in CUDA graphs")
                else "capture the per-query/step sequence in a CUDA graph so the GPU stops waiting for launches")
    if ex_parts:
        ex = pd.concat(ex_parts, ignore_index=True)
        f.examples = examples(trace, start=ex["start"], end=ex["end"], pid=ex["pid"], tid=ex["tid"],
                              device=ex["device"], stream=ex["stream"], what="GPU idle, waiting for a launch",
                              n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options)
    return res


def _advice(trace: Trace, ops: pd.DataFrame) -> str:
    """What to do; a trace whose GPU time already runs mostly in CUDA graphs is told to
    overlap requests, not to capture graphs it already has."""
    from ._util import merge_intervals

    busy = ops[ops["what"].isin(["kernel", "graph"])]
    graphed = busy[(busy["what"] == "graph")]
    in_graph = trace.kernels["in_graph"].to_numpy(bool) if len(trace.kernels) else np.zeros(0, bool)
    gk = busy[(busy["what"] == "kernel") & np.isin(busy["row"].to_numpy(), np.flatnonzero(in_graph))]
    parts = pd.concat([graphed, gk])
    ms, me = merge_intervals(busy["start"].to_numpy(), busy["end"].to_numpy())
    gs, ge = merge_intervals(parts["start"].to_numpy(), parts["end"].to_numpy())
    tot = int((me - ms).sum())
    if tot and int((ge - gs).sum()) / tot >= 0.5:
        return ("The work is already in CUDA graphs; the GPU waits for the host between replays: "
                "overlap requests on several stream groups (one graph per group), copy each request's "
                "inputs with one pinned copy, and wait on an event only where the result is needed.")
    return ("The GPU waits for the CPU to issue work: capture the steady-state sequence in CUDA graphs "
            "(one launch per query/step), give each client thread its own stream group so launches "
            "from several threads overlap instead of queuing, and move host-side preprocessing off the "
            "launching thread.")
