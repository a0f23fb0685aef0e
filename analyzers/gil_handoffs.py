"""GIL hand-offs: client threads waiting for Python's interpreter lock, and the calls that
gave it up.

Every PyTorch op called from Python releases the GIL (pybind11's ``gil_scoped_release``), so
does every tensor's deallocation (``THPVariable_clear``), numpy's larger loops and every CUDA
synchronization; with several client threads, each release is a hand-off: the thread takes
the GIL back only behind the others. On the H100 a hooked serving script waited for it 20
times a query, ~1.3 ms of a 2 ms query (``bench/apply/results/gil_waits_h100/``). The
evidence needs an nsys export with OS-runtime backtraces (``-t osrt
--osrt-backtrace-threshold=NS``): the loader names, for each wait in which a thread takes the
GIL back, the native call that had given it up (``Trace.os_waits["gil_by"]``,
:mod:`recsys_doctor.loaders._nsys_gil`). Traces without them give nothing here.

Waits shorter than the capture's OS-runtime threshold are not in the trace (10 us under
``profile --gil-stacks``): counts and times are lower bounds. One take of the GIL can be several
waits (CPython waits in slices of the switch interval, 5 ms).

Per process, inside the steady state (from the earliest steady-state start of its devices to
its last GPU operation: ``window_start_ns``, ``window_end_ns``; a wait counts where it starts
inside, up to the window's end): the threads that wait, their GIL waits (count, time, mean, share of
the window), and who gave the GIL up (``released_by``: each call's waits, time and share).
Reported where at least two threads wait and their GIL waits reach
``Options.report_min_share`` of their time in the window. The recoverable time is the GPU idle
during those waits (the idle gaps between GPU operations that a GIL wait covers): an upper
bound, since the thread holding the GIL meanwhile also did work the query needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._arrays import merge_intervals
from ._attribution import enclosing_range, where_shares
from ._ops import op_table
from ._recoverable import claims_within, examples, finish, report, steady_starts, steady_window
from ._util import norm_name, per_value, r, thread_labels

__all__ = ["analyze", "advice_for"]

#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "gil-handoffs": {
        "gil_waits": "number", "gil_wait_ms": "ms", "mean_wait_us": "us", "pid": "number", "threads": "number",
        "wait_share": "share", "window_ms": "ms", "gpu_idle_while_waiting_ms": "ms", "window_start_ns": "number",
        "window_end_ns": "number", "waits": "number", "ms": "ms", "share": "share",
    },
}

#: what to do about each kind of releaser, first match wins: (substrings of the releaser, advice)
_ADVICE = (
    (("THPVariable_clear",), "a tensor freed every query (each deallocation gives the GIL up): keep the query's "
                             "tensors and write into them (copy_, out=) instead of making new ones"),
    (("CUDAGraph",), "CUDA graph replays: one replay a query is the floor; batch queries so one replay serves "
                     "several"),
    (("synchronize",), "a synchronization per query: one device-to-host copy and one wait a query, not several"),
    (("dispatch_to",), "copies made with .to()/.cpu()/.cuda() one tensor at a time: stage a query's inputs in one "
                       "pinned buffer (one copy), read its outputs back in one"),
    (("THPVariable_",), "PyTorch ops called one by one from Python: capture the query in a CUDA graph (one replay), "
                        "or batch queries so one pass serves several"),
    (("numpy", "_multiarray", "_common", "_bounded_integers", "mtrand"),
     "numpy on the serving threads (random fills, ufuncs and copies past ~500 elements give the GIL up): build "
     "requests outside them, or for many queries at once"),
    (("Python's own",), "Python-level locks, queues or sleeps between the threads"),
)


#: the OS name PyTorch gives the DataLoader's pin-memory thread (``torch.utils.data._utils.pin_memory``)
PIN_THREAD = "pt_data_pin"


def advice_for(releaser: str) -> str | None:
    """What to do about the calls of one releaser (None: nothing specific)."""
    return next((advice for keys, advice in _ADVICE if any(k in releaser for k in keys)), None)


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="gil-handoffs")
    ow = trace.os_waits
    if not len(ow) or "gil_by" not in ow.columns or not ow["gil_by"].notna().any():
        res.data = {"gil_waits": 0}
        return res
    ops = op_table(trace)
    gil = np.flatnonzero(ow["gil_by"].notna().to_numpy())
    res.data = {"gil_waits": int(gil.size)}
    if not len(ops):
        return res
    starts = steady_starts(trace, options)
    best: dict[str, Any] | None = None
    for pid in np.unique(ow["pid"].to_numpy(np.int64)[gil]):
        e = _process(trace, ow, gil, int(pid), ops, starts, options)
        if e is not None and (best is None or e["gil_wait_ms"] > best["gil_wait_ms"]):
            best = e
    if best is None:
        return res
    rows = best.pop("_rows")
    _report(res, trace, ow, rows, best, options)
    return res


def _process(trace: Trace, ow: pd.DataFrame, gil: np.ndarray, pid: int, ops: pd.DataFrame, starts: dict[int, int],
             options: Options) -> dict[str, Any] | None:
    """One process's evidence (with ``_rows``: its GIL waits in the window), or None when it
    is not reported."""
    mine = ops["pid"].to_numpy(np.int64) == pid
    if not mine.any():
        return None
    devs = np.unique(ops["device"].to_numpy(np.int64)[mine])
    lo = min(starts.get(int(d), int(ops["start"].min())) for d in devs)
    hi = int(ops["end"].to_numpy(np.int64)[mine].max())
    s = ow["start"].to_numpy(np.int64)[gil]
    rows = gil[(ow["pid"].to_numpy(np.int64)[gil] == pid) & (s >= lo) & (s < hi)]
    if hi <= lo or not rows.size:
        return None
    tid = ow["tid"].to_numpy(np.int64)[rows]
    ws = ow["start"].to_numpy(np.int64)[rows]
    we = np.minimum(ow["end"].to_numpy(np.int64)[rows], hi)
    window = hi - lo
    per = []
    for t in np.unique(tid):
        m = tid == t
        a, b = merge_intervals(ws[m], we[m])
        per.append((int(t), int(m.sum()), int((b - a).sum())))
    # (each thread kept waits >= report_min_share of the window, so together they do too)
    waiting = [p for p in per if p[2] >= options.report_min_share * window]
    if len(waiting) < 2:
        return None
    keep = np.isin(tid, [p[0] for p in waiting])
    rows = rows[keep]
    dur = (we - ws)[keep]
    labels = ow["gil_by"].astype(object).to_numpy()[rows]
    by = pd.DataFrame({"by": labels, "ns": dur}).groupby("by", sort=False)["ns"].agg(["size", "sum"])
    by = by.sort_values("sum", ascending=False).head(options.top_n)
    n = int(rows.size)
    return {
        "pid": pid, "threads": len(waiting), "gil_waits": n, "gil_wait_ms": r(int(dur.sum()) / 1e6, 3),
        "mean_wait_us": r(float(dur.mean()) / 1e3, 1), "window_ms": r(window / 1e6, 3),
        "window_start_ns": int(lo), "window_end_ns": int(hi),
        "wait_share": r(int(dur.sum()) / (window * len(waiting))),
        "released_by": [{"by": str(k), "waits": int(v["size"]), "ms": r(int(v["sum"]) / 1e6, 3),
                         "share": r(int(v["sum"]) / max(int(dur.sum()), 1))} for k, v in by.iterrows()],
        "per_thread": [{"thread": lab, "gil_waits": c, "gil_wait_ms": r(ns / 1e6, 3), "share": r(ns / window)}
                       for lab, (_, c, ns) in zip(thread_labels(trace, [pid] * len(waiting),
                                                                [p[0] for p in waiting]), waiting)],
        "_rows": rows,
    }


def _report(res: AnalysisResult, trace: Trace, ow: pd.DataFrame, rows: np.ndarray, ev: dict[str, Any],
            options: Options) -> None:
    pid = np.full(rows.size, ev["pid"], np.int64)
    s, e = ow["start"].to_numpy(np.int64)[rows], ow["end"].to_numpy(np.int64)[rows]
    tid = ow["tid"].to_numpy(np.int64)[rows]
    claims = claims_within(trace, options, pid, s, e)
    idle = int(claims["claim_ns"].sum())
    ev["gpu_idle_while_waiting_ms"] = r(idle / 1e6, 3)
    top = ev["released_by"][0]
    advice = []
    for b in ev["released_by"]:
        a = advice_for(b["by"])
        if a is not None and a not in advice:
            advice.append(a)
    title = (f"{ev['threads']} threads wait for the GIL {ev['gil_wait_ms']:.1f} ms ({ev['wait_share']:.0%} of their "
             f"time, {ev['gil_waits']} waits); {top['share']:.0%} of it after {top['by']} gave it up")
    pin = [t for t in ev["per_thread"] if PIN_THREAD in t["thread"]]
    cut = "Cut those calls per query or step" + (": " + "; ".join(advice[:3]) if advice else "") + ". "
    if pin:  # (the DataLoader's pin-memory thread is one of the waiting threads)
        recommendation = (
            f"The loop's thread and the DataLoader's pin-memory thread ({PIN_THREAD}, "
            f"{pin[0]['share']:.0%} of the window waiting) take turns at Python's interpreter lock: that "
            "thread holds it to rebuild and pin every batch the workers send, and every call of the loop's "
            "that gives it up makes the loop wait to take it back. " + cut
            + "Keep pin_memory on: turning it off moves that work onto the loop's thread (0.84x on an H200 "
              "batch-scoring job with 2 workers). Measure larger batches (fewer handoffs per row).")
        action = "cut the loop's calls that give the GIL up (CUDA graphs: one replay for a step's ops)"
    else:
        recommendation = (
            "The threads queue for Python's interpreter lock: every call that gives it up makes its thread wait "
            "behind the others to take it back. " + cut
            + "Measure again after each change (the waits should fall); where they stay, fewer threads per "
              "interpreter (processes) or batching (one host path for many queries) is what is left.")
        action = "cut the calls that give the GIL up per query (graphs or batching, reused tensors)"
    f = report(res, "gil-handoffs", title=title, evidence=ev, where=_where(trace, rows, s, e, pid, tid, options),
               recommendation=recommendation, action=action)
    f.examples = examples(trace, start=s, end=e, pid=pid, tid=tid,
                          what=list(ow["gil_by"].astype(object).to_numpy()[rows]), n=options.examples_per_finding)
    finish(f, idle, steady_window(trace, options), options, claims=claims)


def _where(trace: Trace, rows: np.ndarray, s: np.ndarray, e: np.ndarray, pid: np.ndarray, tid: np.ndarray,
           options: Options) -> list[dict[str, Any]]:
    """Where in the model the waits happen (the innermost NVTX / annotation range around
    each), by wait time; the threads where the trace has no ranges there."""
    rg = trace.ranges
    at = enclosing_range(rg, pid, tid, s) if len(rg) else np.full(rows.size, -1)
    if (at >= 0).any():
        names = np.full(rows.size, None, dtype=object)
        names[at >= 0] = per_value(rg["name"], norm_name, at[at >= 0])
        return where_shares(names, (e - s).astype(float), key="nvtx", top=options.top_n)
    return where_shares(np.asarray(thread_labels(trace, pid, tid), dtype=object), (e - s).astype(float),
                        key="thread", top=options.top_n)
