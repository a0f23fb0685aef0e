"""Streams that never overlap: a process puts kernels on several streams of one device,
yet they (almost) never run at the same time.

Several streams are how independent work (towers, experts, requests) is meant to share
the GPU; when their kernels overlap for ~0 ms the streams only add event waits. Usual
causes: every side-stream kernel waits on an event recorded just before it
(``cudaStreamWaitEvent`` in lock-step), the launching thread cannot issue work fast
enough to get ahead of the GPU, or each kernel fills the GPU by itself. Evidence per
device: the streams and their kernel time, the time two or more of them ran kernels
at once (``sum over streams of their busy time - the device's busy time``; the
overlapped time is counted once per extra stream), and the ``cudaStreamWaitEvent`` calls.
Reported, as a note with no recoverable time of its own (launch-bound and small-grid
count what concurrency could win), when a process uses at least two streams with
kernels on a device, each holding at least ``Options.report_min_share`` of its kernel
time, and they overlap for less than ``Options.stream_overlap_note_share`` of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._ops import op_table
from ._recoverable import finish, report, steady_window
from ._util import busy_by_key, busy_together, r, stream_label, str_is

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "streams-never-overlap": {
        "busy_us": "us", "device": "number", "kernel_time_us": "us", "overlap_share": "share",
        "overlap_us": "us", "pid": "number", "share": "share", "stream_wait_event_calls": "number",
        "streams": "number", "streams_judged": "number",
    },
}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="streams-never-overlap")
    k = trace.kernels
    if not len(k):
        res.data = {"devices": []}
        return res
    devices = _per_device(trace, options)
    res.data = {"devices": devices}
    quiet = [d for d in devices if d["judged"] and d["overlap_share"] < options.stream_overlap_note_share]
    if not quiet:
        return res
    d = max(quiet, key=lambda x: x["kernel_time_us"])
    waits = sum(x.get("stream_wait_event_calls", 0) for x in quiet)
    f = report(
        res, "streams-never-overlap",
        title=(f"{d['streams']} streams on device {d['device']} run kernels concurrently for only "
               f"{d['overlap_us'] / 1000:.3f} ms of {d['kernel_time_us'] / 1000:.3f} ms"
               + (f" ({waits:,} cudaStreamWaitEvent calls)" if waits else "")),
        evidence={"devices": quiet, "stream_wait_event_calls": waits},
        where=[{"stream": s["stream"], "share": s["share"]} for s in d["per_stream"][:options.top_n]],
        recommendation=(
            "The side streams serialize: record the event once per step/batch and let each branch (tower, "
            "expert, request) run its whole chain on its own stream before joining, instead of a wait before "
            "every kernel; make sure one thread can issue the branches ahead of the GPU (CUDA graphs, fewer "
            "launches), or run the branches as one batched kernel when each already fills the GPU."),
        action="let each branch run its whole chain on its own stream and join once per step")
    finish(f, 0, steady_window(trace, options), options)
    return res


def _per_device(trace: Trace, options: Options) -> list[dict[str, Any]]:
    """Per (process, device) with kernels (or graph executions) on two or more streams: each stream's busy
    time, the device's busy time and the overlap between streams."""
    k = trace.kernels if not len(trace.graphs) else op_table(trace, ("kernel", "graph"))
    keys, merged, busy = busy_by_key(k, "pid", "device", "stream")
    api = trace.api
    waits = str_is(api["name"], "cudaStreamWaitEvent") if len(api) else np.zeros(0, bool)
    out = []
    for pd_key in sorted({key[:2] for key in keys}):
        idx = [i for i, key in enumerate(keys) if key[:2] == pd_key]
        if len(idx) < 2:
            continue
        total, union = busy_together(merged, busy, idx)
        shares = busy[idx] / max(total, 1)
        per = sorted(({"stream": stream_label(*keys[i]), "kernel_time_us": r(busy[i] / 1000, 3),
                       "share": r(sh)} for i, sh in zip(idx, shares)), key=lambda x: -x["share"])
        big = int((shares >= options.report_min_share).sum())
        d: dict[str, Any] = {"pid": pd_key[0], "device": pd_key[1], "streams": len(idx), "streams_judged": big,
                             "kernel_time_us": r(total / 1000, 3), "busy_us": r(union / 1000, 3),
                             "overlap_us": r((total - union) / 1000, 3),
                             "overlap_share": r((total - union) / total) if total else 0.0,
                             "judged": big >= 2, "per_stream": per}
        if waits.size:
            d["stream_wait_event_calls"] = int((waits & (api["pid"].to_numpy(np.int64) == pd_key[0])).sum())
        out.append(d)
    return out
