"""Launch-bound: the GPU sits idle because the CPU has not issued the next operation yet.

Per device, idle time is the part of its window not covered by any kernel, graph
execution, copy or memset. Each idle gap ends with a GPU operation; the gap is

* **host wait** when that operation's launch call began only after the GPU went idle
  (``launch_call.start >= end of the previous GPU activity on the device``): the GPU had
  nothing queued, it waited for the CPU;
* a **short gap** when it is shorter than ``Options.short_gap_us`` and not host wait
  (back-to-back launch latency of the driver and GPU front end);
* **allocator** when allocator calls (``cudaMalloc``/``cudaFree``/..., see
  ``Options.allocator_api_pattern``) of the process cover at least
  ``Options.allocator_gap_share`` of it: the GPU waited for memory management, which a
  CUDA graph does not remove (the ``allocator-churn`` finding takes these gaps);
* **other** otherwise (dependencies, syncs, work queued on the CPU side already, or an
  operation whose launch call is not in the trace).

Of the host wait, the part that follows **host work outside CUDA calls** is split out: the
launching thread had made no CUDA call for at least ``Options.host_work_us`` before the launch
(its previous call, of any kind, ended that long before: the program's own Python, preprocessing,
another thread holding the GIL). CUDA graphs remove launch calls, not that work; where it is
most of the wait, the title and the advice say so.

Reported when the launch-related share of the window, ``(host wait + short gaps) /
window``, reaches ``Options.report_min_share``. Recoverable time: the host-wait and
short gaps of the steady state (start-up idle excluded, see ``_recoverable``): both
disappear when the launches are batched (CUDA graphs) or spread over independent
streams. Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import any_region, attribute, where_shares
from ._ops import what_is
from ._framework import idiom
from ._recoverable import allocator_cover, device_gaps, examples, finish, report, steady_starts, steady_window
from ._arrays import pair_codes
from ._util import _packed_key, merge_intervals, op_api_rows, op_table, per_key, r, take_str, thread_label_codes

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "launch-bound": {
        "allocator_gaps": "number", "allocator_idle_ns": "ns", "allocator_ns": "ns", "gaps": "number",
        "host_wait_gaps": "number", "host_wait_ns": "ns", "host_wait_share_of_idle": "share",
        "host_wait_share_of_window": "share", "idle_ns": "ns", "idle_share": "share",
        "launch_share_of_window": "share", "other_gaps": "number", "other_idle_ns": "ns", "other_ns": "ns",
        "short_gap_ns": "ns", "short_gap_us": "us", "short_gaps": "number", "steady_launch_wait_ns": "ns",
        "window_ns": "ns", "host_work_us": "us", "host_work_ns": "ns", "host_work_share_of_host_wait": "share",
    },
}

_KINDS = ("host_wait", "short_gap", "allocator", "other")


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="launch-bound")
    ops = op_table(trace)
    if len(ops) == 0:
        res.data = {"devices": {}}
        return res
    gaps = _classified_gaps(trace, options)
    data = res.data = _evidence(gaps, options)
    share = data["launch_share_of_window"]
    if share is None or share < options.report_min_share:
        return res
    W = data["window_ns"]
    work = data["host_work_share_of_host_wait"]
    hosty = work is not None and work >= 0.5
    advice = (_HOST_WORK.format(work=work, us=options.host_work_us, elsewhere=idiom(trace, "input_off_thread")) if hosty else "") + _advice(
        trace, ops, _waiting_threads(gaps, options) > 1)
    f = report(
        res, "launch-bound",
        title=(f"GPU idle {data['idle_share']:.0%} of the window; {share:.0%} of the window is "
               f"waiting for launches (host wait {data['host_wait_share_of_window']:.0%}, "
               f"short gaps {data['short_gap_ns'] / W:.0%})"
               + (f"; {work:.0%} of the host wait follows >= {options.host_work_us:g} us of host work outside "
                  "CUDA calls" if hosty else "")),
        evidence=data, recommendation=advice, where=_where(trace, gaps, options),
        action=("profile the host work outside CUDA calls (py-spy --gil) and cut it or move it off the launching "
                "threads: it, not launching, is most of the GPU's wait" if hosty else
                "overlap requests on several stream groups (the work already runs in CUDA graphs)"
                if advice.startswith("The work is already in CUDA graphs")
                else "capture the per-query/step sequence in a CUDA graph so the GPU stops waiting for launches"))
    ex = gaps[gaps["host_wait"] & gaps["steady"]]
    if len(ex):
        f.examples = examples(trace, start=ex["start"], end=ex["end"], pid=ex["pid"], tid=ex["tid"],
                              device=ex["device"], stream=ex["stream"], what="GPU idle, waiting for a launch",
                              n=options.examples_per_finding)
    claim = gaps[((gaps["host_wait"] | gaps["short_gap"]) & gaps["steady"]).to_numpy()]
    finish(f, data["steady_launch_wait_ns"], steady_window(trace, options), options,
           claims=claim.rename(columns={"gap": "ns"}))
    return res


def _classified_gaps(trace: Trace, options: Options) -> pd.DataFrame:
    """Every idle gap of every device with the operation that ended it, its launch call
    (NaN where none) and its class: host wait, short gap or other."""
    ops = op_table(trace)
    parts = device_gaps(trace)
    steady = steady_starts(trace, options, ops)
    at = np.concatenate([g.order[g.ends_gap] for g in parts])
    dev = np.concatenate([np.full(g.ends_gap.size, g.device, np.int64) for g in parts])
    prev_end = np.concatenate([g.gap_start for g in parts])
    gap = np.concatenate([g.gap for g in parts])
    api = trace.api
    row = op_api_rows(trace)[at]
    has = row >= 0
    api_start = np.where(has, api["start"].to_numpy(np.int64)[np.maximum(row, 0)] if len(api) else 0, np.nan)
    alloc = allocator_cover(trace, options) >= options.allocator_gap_share * gap
    host = has & (api_start >= prev_end) & ~alloc
    short = ~host & ~alloc & (gap < int(round(options.short_gap_us * 1000)))
    out = pd.DataFrame({
        "device": dev, "start": prev_end, "end": ops["start"].to_numpy(np.int64)[at], "gap": gap,
        "pid": ops["pid"].to_numpy(np.int64)[at], "stream": ops["stream"].to_numpy(np.int64)[at],
        "api_row": row, "api_start": api_start,
        "tid": np.where(has, api["tid"].to_numpy(np.int64)[np.maximum(row, 0)] if len(api) else 0, np.nan),
        "host_wait": host, "short_gap": short, "allocator": alloc, "other": ~host & ~short & ~alloc,
        "steady": prev_end >= per_key(dev, steady, 0),
        "silent": _silent_before(trace, row, host)})
    out.attrs["windows"] = {g.device: int(g.reach[-1] - g.start[0]) for g in parts}
    return out


def _evidence(gaps: pd.DataFrame, options: Options) -> dict[str, Any]:
    """Per device and in total: window, idle time and its split by class."""
    devices: dict[str, dict] = {}
    tot = dict.fromkeys(("window", "idle", *_KINDS), 0)
    for dev, win in gaps.attrs["windows"].items():
        g = gaps[gaps["device"].to_numpy() == dev]
        gl = g["gap"].to_numpy()
        d = {"window_ns": win, "idle_ns": int(gl.sum()), "gaps": int(len(g))}
        for k, name in zip(_KINDS, ("host_wait", "short", "allocator", "other")):
            m = g[k].to_numpy()
            d[f"{k}_ns"] = int(gl[m].sum())
            d[f"{name}_gaps"] = int(m.sum())
            tot[k] += int(gl[m].sum())
        d["idle_share"] = r(d["idle_ns"] / win) if win else None
        d["host_wait_share_of_idle"] = r(d["host_wait_ns"] / d["idle_ns"]) if d["idle_ns"] else None
        d["host_wait_share_of_window"] = r(d["host_wait_ns"] / win) if win else None
        devices[str(dev)] = d
        tot["window"] += win
        tot["idle"] += d["idle_ns"]
    W = tot["window"]
    rec = gaps["gap"].to_numpy()[((gaps["host_wait"] | gaps["short_gap"]) & gaps["steady"]).to_numpy()]
    work = int(gaps["gap"].to_numpy()[(gaps["host_wait"] & (gaps["silent"] >= options.host_work_us * 1e3)).to_numpy()]
               .sum())
    return {
        "devices": devices,
        "window_ns": W, "idle_ns": tot["idle"], "host_wait_ns": tot["host_wait"],
        "short_gap_ns": tot["short_gap"], "allocator_idle_ns": tot["allocator"], "other_idle_ns": tot["other"],
        "idle_share": r(tot["idle"] / W) if W else None,
        "host_wait_share_of_idle": r(tot["host_wait"] / tot["idle"]) if tot["idle"] else None,
        "host_wait_share_of_window": r(tot["host_wait"] / W) if W else None,
        "launch_share_of_window": r((tot["host_wait"] + tot["short_gap"]) / W) if W else None,
        "short_gap_us": options.short_gap_us,
        "steady_launch_wait_ns": int(rec.sum()),
        "host_work_us": options.host_work_us, "host_work_ns": work,
        "host_work_share_of_host_wait": r(work / tot["host_wait"]) if tot["host_wait"] else None,
    }


#: the advice's opening where most of the host wait follows host work outside CUDA calls
_HOST_WORK = ("Most of the wait is host work outside CUDA calls: in {work:.0%} of the host-wait time the launching "
              "thread had made no CUDA call for at least {us:g} us before the launch (the program's own Python, "
              "preprocessing or parsing, another thread holding the GIL). CUDA graphs and stream groups remove "
              "launch calls, not that work: profile the host (py-spy --gil, nsys CPU sampling) and cut it or move it "
              "off the launching threads ({elsewhere}, inputs prepared ahead of the model call). Then: ")


def _silent_before(trace: Trace, rows: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """For each launch call ``rows[i]`` (a row of ``trace.api``; where ``pick``), how long its
    thread had made no CUDA call before it: its start less the latest end among the thread's
    calls that ended at or before that start (ns; NaN where none did, or not picked)."""
    out = np.full(len(rows), np.nan)
    api = trace.api
    if not len(api) or not pick.any():
        return out
    start, end = api["start"].to_numpy(np.int64), api["end"].to_numpy(np.int64)
    thread = pair_codes(api["pid"].to_numpy(np.int64), api["tid"].to_numpy(np.int64))[0].astype(np.int64)
    at = rows[pick]
    # each call's end and each launch's start as one key ordered by thread, then time
    packed = _packed_key((np.concatenate([thread, thread[at]]), np.concatenate([end, start[at]])))
    if packed is None:  # (a key would not fit in an int64: not split)
        return out
    key, (lo_thread, lo_time), (_, width) = packed
    keys, q = np.sort(key[:len(end)]), key[len(end):]
    i = np.maximum(np.searchsorted(keys, q, side="right") - 1, 0)
    ok = (keys[i] <= q) & (keys[i] // width + lo_thread == thread[at])
    prev_end = keys[i] % width + lo_time
    out[np.flatnonzero(pick)] = np.where(ok, start[at] - prev_end, np.nan)
    return out


def _where(trace: Trace, gaps: pd.DataFrame, options: Options) -> list[dict]:
    """Where the host waits happen: the steady-state ones (those counted as recoverable)
    of each device that has some, else all of that device's host waits."""
    hs = (gaps["host_wait"] & gaps["steady"]).to_numpy()
    host = gaps["host_wait"].to_numpy()
    dev = gaps["device"].to_numpy()
    pick = np.where(per_key(dev, {int(d): bool(hs[dev == d].any()) for d in np.unique(dev)}, False), hs, host)
    hw = gaps[pick]
    if not len(hw):
        return []
    tid = hw["tid"].to_numpy().astype(np.int64)
    rows = hw["api_row"].to_numpy()
    top = options.top_n
    where: list[dict] = []
    reg = attribute(trace, hw["pid"], tid, hw["api_start"].to_numpy().astype(np.int64))
    if any_region(reg):
        where = where_shares(reg, hw["gap"], key="nvtx", top=top)
    where += where_shares(thread_label_codes(trace, hw["pid"], tid), hw["gap"], key="thread", top=top)
    if not any("nvtx" in w for w in where):
        # no code regions: the CUDA calls whose late arrival left the GPU idle
        where += where_shares(take_str(trace.api["name"], rows), hw["gap"], key="api", top=top)
        # and, where the trace has backtraces, the program's own frame that called
        calls = (take_str(trace.api["callsite"], rows) if "callsite" in trace.api.columns
                 else np.full(len(rows), None, dtype=object))
        where += where_shares(calls, hw["gap"], key="callsite", top=top)
    return where


def _waiting_threads(gaps: pd.DataFrame, options: Options) -> int:
    """How many CPU threads launch after host-wait gaps: those whose launches end at least
    ``report_min_share`` of the host-wait time (per process and thread id)."""
    hw = gaps[gaps["host_wait"].to_numpy() & gaps["tid"].notna().to_numpy()]
    if not len(hw):
        return 0
    per = hw.groupby([hw["pid"].to_numpy(np.int64), hw["tid"].to_numpy(np.int64)])["gap"].sum()
    return int((per >= options.report_min_share * float(per.sum())).sum())


def _advice(trace: Trace, ops: pd.DataFrame, several: bool = True) -> str:
    """What to do; a trace whose GPU time already runs mostly in CUDA graphs is told to
    overlap requests, not to capture graphs it already has; one whose host waits all follow
    one thread's launches (``several`` False: a training or scoring loop) is not told to give
    each client thread a stream group of its own."""
    kern, graph = what_is(ops, "kernel"), what_is(ops, "graph")
    in_graph = np.zeros(len(ops), dtype=bool)
    if len(trace.kernels):
        in_graph[kern] = trace.kernels["in_graph"].to_numpy(bool)[ops["row"].to_numpy()[kern]]
    busy = kern | graph
    graphed = graph | in_graph
    s, e = ops["start"].to_numpy(), ops["end"].to_numpy()
    ms, me = merge_intervals(s[busy], e[busy])
    gs, ge = merge_intervals(s[graphed], e[graphed])
    tot = int((me - ms).sum())
    if tot and int((ge - gs).sum()) / tot >= 0.5:
        return ("The work is already in CUDA graphs; the GPU waits for the host between replays: "
                "overlap requests on several stream groups (one graph per group), copy each request's "
                "inputs with one pinned copy, and wait on an event only where the result is needed.")
    per_thread = (", give each client thread its own stream group so launches from several threads overlap "
                  "instead of queuing," if several else "")
    return ("The GPU waits for the CPU to issue work: capture the steady-state sequence in CUDA graphs "
            f"(one launch per query/step){per_thread} and move host-side preprocessing off the launching thread.")
