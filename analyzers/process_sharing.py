"""Processes that share a GPU: several processes run kernels on one device, each in a CUDA
context of its own, and their kernels (almost) never run at the same time.

Teams start several serving processes (a ``multiprocessing`` pool, one server per worker) to
get around the GIL. Unless the MPS daemon runs, the GPU time-slices between the processes'
contexts: one process's kernels never run beside another's, and every switch of context costs
time. Threads of one process, each with a stream group of its own, share one context and let
their kernels overlap (what ``profile --apply`` applies); MPS does it for processes. Evidence
per device: each process's kernel time and busy time, the device's busy time, the time two or
more processes ran kernels at once (``sum over processes of their busy time - the device's busy
time``), and the device's busy share of its window (the summary's utilization of that device:
where the GPU is mostly idle, the host is the limit, and the processes help the host, not the
GPU). Reported, as a note with no recoverable time of its own, when at least two processes
each hold at least ``Options.report_min_share`` of a device's kernel time and they overlap for
less than ``Options.stream_overlap_note_share`` of it. A trace cannot tell whether MPS ran: with MPS the kernels can overlap, so an overlap
that stays near 0 while the processes are busy is what time slicing looks like.
"""

from __future__ import annotations

from typing import Any

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._ops import op_table
from ._recoverable import finish, report, steady_window
from ._util import busy_by_key, busy_together, r
from .summary import device_windows

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "processes-share-gpu": {
        "busy_share": "share", "busy_us": "us", "device": "number", "kernel_time_us": "us", "overlap_share": "share",
        "overlap_us": "us", "pid": "number", "processes": "number", "processes_judged": "number", "share": "share",
    },
}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="processes-share-gpu")
    devices = _per_device(trace, options) if len(trace.kernels) or len(trace.graphs) else []
    res.data = {"devices": devices}
    quiet = [d for d in devices if d["judged"] and d["overlap_share"] < options.stream_overlap_note_share]
    if not quiet:
        return res
    d = max(quiet, key=lambda x: x["kernel_time_us"])
    f = report(
        res, "processes-share-gpu",
        title=(f"{d['processes']} processes run kernels on device {d['device']}, each in its own CUDA context, "
               f"and together for only {d['overlap_us'] / 1000:.3f} ms of {d['kernel_time_us'] / 1000:.3f} ms "
               f"(GPU busy {d['busy_share']:.0%})"),
        evidence={"devices": quiet},
        where=[{"process": p["pid"], "device": d["device"], "share": p["share"]}
               for p in d["per_process"][:options.top_n]],
        recommendation=(
            "Unless the MPS daemon runs, the GPU time-slices between these processes' contexts: one "
            "process's kernels never run beside another's. Serve from threads of one process, each with a "
            "stream group of its own (recsys-doctor profile --apply, the runtime's serve()), so requests "
            "share one context and overlap; or start MPS (nvidia-cuda-mps-control -d) for the processes. "
            "Where the GPU is mostly idle, the host is the limit (launch-bound): there the processes help "
            "the host, and CUDA graphs cut the host work each request costs."),
        action="serve from threads of one process with a stream group each, or run the processes under MPS")
    finish(f, 0, steady_window(trace, options), options)
    return res


def _per_device(trace: Trace, options: Options) -> list[dict[str, Any]]:
    """Per device with kernels (or graph executions) of two or more processes: each process's
    kernel time and busy time, the device's busy time, and the overlap between processes."""
    k = trace.kernels if not len(trace.graphs) else op_table(trace, ("kernel", "graph"))
    keys, merged, busy = busy_by_key(k, "device", "pid")
    wins = device_windows(trace)  # (the summary's: its GPU utilization is busy / window per device)
    out = []
    for dev in sorted({key[0] for key in keys}):
        idx = [i for i, key in enumerate(keys) if key[0] == dev]
        if len(idx) < 2:
            continue
        total, union = busy_together(merged, busy, idx)
        shares = busy[idx] / max(total, 1)
        per = sorted(({"pid": int(keys[i][1]), "busy_us": r(busy[i] / 1000, 3), "share": r(sh)}
                      for i, sh in zip(idx, shares)), key=lambda x: -x["share"])
        big = int((shares >= options.report_min_share).sum())
        out.append({"device": int(dev), "processes": len(idx), "processes_judged": big,
                    "kernel_time_us": r(total / 1000, 3), "busy_us": r(union / 1000, 3),
                    "busy_share": r(_busy_share(wins.get(int(dev)))), "overlap_us": r((total - union) / 1000, 3),
                    "overlap_share": r((total - union) / total) if total else 0.0,
                    "judged": big >= 2, "per_process": per})
    return out


def _busy_share(w: dict[str, int] | None) -> float:
    return w["busy"] / (w["end"] - w["start"]) if w and w["end"] > w["start"] else 0.0
