"""Synchronizing API calls: CPU threads blocked waiting for the GPU.

Counts device/stream/event/context ``*Synchronize`` calls and blocking copies (``cudaMemcpy``
and friends without ``Async``: synchronous with respect to the host) and the CPU time they
block, by thread and by code region (innermost NVTX / ``record_function`` range).

Async copies from device to *pageable* host memory count too: the driver stages them and
the call returns only when the copy is done (the thread blocks all the same).

A sync is reported by count and by what it costs the GPU, not only by the CPU time it
blocks: the finding appears when there are at least ``Options.sync_report_min_calls``
such calls, or when the blocked share (blocked time over the blocking threads' API
spans) or the GPU idle they cause reaches ``Options.report_min_share``.

Recoverable time is the GPU idle the syncs cause: the steady-state idle gaps (of the
calling process's devices) in which a sync call returns - the GPU drained, the thread
woke up and had to issue the next work before the GPU could continue. A final sync at
the end of a saturated job returns into no gap and costs nothing. Severity follows from
it (docs/findings.md).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import any_region, attribute, where_shares
from ._framework import idiom
from ._ops import api_keys_in, api_thread_spans, cached
from ._recoverable import examples, finish, gaps_containing, idle_gaps, report, steady_window
from ._util import (BLOCKING_COPY_RE, SYNC_RE, launches, per_value, r, str_contains, str_is,
                    thread_label, thread_label_codes)

__all__ = ["analyze", "sync_calls"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "sync-api": {
        "blocked_share": "share", "blocked_us": "us", "calls": "number", "gpu_idle_after_sync_ns": "ns",
        "gpu_idle_after_sync_share": "share", "pageable_d2h_copies": "number",
    },
}

#: syncs a program makes on purpose, not as the tail of a copy
_EXPLICIT_SYNC = re.compile(r"(?:Device|Ctx|Context|Event)Synchronize")


def _kind(name: str) -> str:
    for k in ("Device", "Stream", "Event", "Ctx", "Context"):
        if k + "Synchronize" in name:
            return {"Ctx": "context", "Context": "context"}.get(k, k.lower())
    return "blocking_copy" if BLOCKING_COPY_RE.search(name) else "other"


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="sync-api")
    if len(trace.api) == 0:
        res.data = {"calls": 0}
        return res
    m, pageable_d2h = sync_calls(trace)
    sy = trace.api[m]
    if len(sy) == 0:
        res.data = {"calls": 0, "blocked_us": 0.0}
        return res
    dur = (sy["end"] - sy["start"]).to_numpy(np.int64)
    gaps, used, hit = _gaps_after(trace, sy, options)
    gpu_idle = int(gaps["ns"].to_numpy(np.int64)[used].sum()) if used.size else 0
    window = steady_window(trace, options)
    data = res.data = _evidence(trace, sy, dur, pageable_d2h, gpu_idle, window, options)
    idle_share = gpu_idle / window if window else 0.0
    blocked, blocked_share = dur.sum(), data["blocked_share"]
    if (len(sy) < options.sync_report_min_calls and (blocked_share or 0.0) < options.report_min_share
            and idle_share < options.report_min_share):
        return res
    f = report(
        res, "sync-api",
        title=(f"{len(sy)} synchronizing calls block CPU threads for {blocked / 1e6:.2f} ms "
               f"({(blocked_share or 0):.0%} of those threads' API time) and leave the GPU idle "
               f"{gpu_idle / 1e6:.2f} ms ({idle_share:.0%} of the steady state) after they return"),
        evidence=data, where=_where(trace, sy, dur, options),
        recommendation=(
            "Remove the syncs from the hot path: replace cudaDeviceSynchronize/cudaStreamSynchronize "
            f"and blocking cudaMemcpy{idiom(trace, 'host_read_examples')} with an event recorded on the group's stream and "
            "waited on only where the result is consumed; copy results into pinned buffers "
            "asynchronously."),
        action="replace the per-request synchronize calls with one event wait where the result is used")
    if used.size:
        gu = gaps.iloc[used]
        f.examples = examples(trace, start=gu["start"], end=gu["end"], pid=gu["pid"], device=gu["device"],
                              stream=gu["stream"], what="GPU idle while a synchronizing thread wakes up",
                              n=options.examples_per_finding)
    else:
        f.examples = examples(trace, start=sy["start"], end=sy["end"], pid=sy["pid"], tid=sy["tid"],
                              what=[str(x) for x in sy["name"]], n=options.examples_per_finding)
    finish(f, gpu_idle, window, options, claims=_claims(sy, gaps, used, hit))
    return res


def sync_calls(trace: Trace) -> tuple[np.ndarray, int]:
    """Which API calls synchronize (by name, and the launch calls of async D2H copies into
    pageable memory), and how many of them are such pageable copies (once a trace: this analyzer
    and graph-candidate's sync points ask)."""
    return cached(trace, "sync_calls", lambda: _sync_calls(trace))  # type: ignore[no-any-return]


def _sync_calls(trace: Trace) -> tuple[np.ndarray, int]:
    api = trace.api
    m = (str_contains(api["name"], SYNC_RE) | str_contains(api["name"], BLOCKING_COPY_RE)).to_numpy()
    mc = trace.memcpys
    pj = launches(trace, ("memcpy",)) if len(mc) else None
    if pj is None or not len(pj):
        return m, 0
    rows = pj["row"].to_numpy(np.int64)
    pg = str_is(mc["kind"], "d2h", rows) & str_is(mc["dst_mem"], "pageable", rows)
    if not pg.any():
        return m, 0
    pm = api_keys_in(trace, pj["pid"].to_numpy(np.int64)[pg], pj["correlation"].to_numpy(np.int64)[pg]) & ~m
    return m | pm, int(pm.sum())


def _gaps_after(trace: Trace, sy: pd.DataFrame, options: Options) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The steady-state idle gaps (of the caller's process) in which a sync call returns:
    (all steady gaps, positions of those, per sync call the gap it returns into or -1)."""
    gaps = idle_gaps(trace, options)
    gaps = gaps[gaps["steady"].astype(bool)].reset_index(drop=True) if len(gaps) else gaps
    hit = np.full(len(sy), -1, dtype=np.int64)
    spid = sy["pid"].to_numpy(np.int64)
    gpid = gaps["pid"].to_numpy(np.int64) if len(gaps) else np.zeros(0, np.int64)
    for pid in np.unique(spid):
        mp = spid == pid
        gp = np.flatnonzero(gpid == pid)
        if gp.size:
            h = gaps_containing(gaps.iloc[gp].reset_index(drop=True), sy["end"].to_numpy(np.int64)[mp])
            hit[mp] = np.where(h >= 0, gp[np.maximum(h, 0)], -1)
    return gaps, np.unique(hit[hit >= 0]), hit


def _claims(sy: pd.DataFrame, gaps: pd.DataFrame, used: np.ndarray, hit: np.ndarray) -> pd.DataFrame:
    """The gaps the syncs leave idle. Where no device-, context- or event-wide sync (an
    explicit ``torch.cuda.synchronize()``, an event wait) returned into a gap, only a
    copy's own sync did (``.cpu()``/``.item()``: a D2H copy and a ``cudaStreamSynchronize``,
    or a blocking copy): the copy is the root cause, and ``memcpy-ping-pong`` counts the gap
    first (``root``) where it is a host round trip."""
    explicit = str_contains(sy["name"], _EXPLICIT_SYNC).to_numpy(bool)
    by_sync = np.zeros(len(gaps), bool)
    by_sync[hit[(hit >= 0) & explicit]] = True
    g = gaps.iloc[used]
    root = np.full(len(g), "memcpy-ping-pong", dtype=object)
    root[by_sync[used]] = None
    return g.assign(root=root)


def _evidence(trace: Trace, sy: pd.DataFrame, dur: np.ndarray, pageable_d2h: int, gpu_idle: int,
              window: int, options: Options) -> dict[str, Any]:
    """Counts and blocked time, by kind, by name and by thread."""
    names = sy["name"]
    kinds = per_value(names, lambda v: _kind(str(v)))
    kinds = np.where(kinds == "other", "pageable_copy", kinds)
    by_thread = pd.DataFrame({"pid": sy["pid"].to_numpy(), "tid": sy["tid"].to_numpy(), "dur": dur}) \
        .groupby(["pid", "tid"])["dur"].agg(["count", "sum"])
    spans = api_thread_spans(trace)
    by_thread = by_thread.join((spans["hi"] - spans["lo"]).rename("span"))
    span_sum = int(by_thread["span"].sum())
    blocked_share = int(dur.sum()) / span_sum if span_sum > 0 else None
    threads = [{"thread": thread_label(trace, p, t), "calls": int(row["count"]),
                "blocked_us": r(row["sum"] / 1000, 3),
                "blocked_share": r(row["sum"] / row["span"]) if row["span"] > 0 else None}
               for (p, t), row in by_thread.sort_values("sum", ascending=False).iterrows()]
    by_kind = {k: {"calls": int(c), "blocked_us": r(s / 1000, 3)}
               for k, (c, s) in pd.DataFrame({"k": kinds, "d": dur}).groupby("k")["d"].agg(["count", "sum"]).iterrows()}
    by_name = sy.assign(d=dur).groupby("name")["d"].agg(["count", "sum"]).sort_values("sum", ascending=False)
    return {
        "calls": int(len(sy)), "blocked_us": r(int(dur.sum()) / 1000, 3), "blocked_share": r(blocked_share),
        "pageable_d2h_copies": pageable_d2h,
        "gpu_idle_after_sync_ns": gpu_idle, "gpu_idle_after_sync_share": r(gpu_idle / window) if window else None,
        "by_kind": by_kind,
        "by_name": [{"name": str(n), "calls": int(c), "blocked_us": r(s / 1000, 3)}
                    for n, (c, s) in by_name.head(options.top_n).iterrows()],
        "threads": threads[: options.top_n],
    }


def _where(trace: Trace, sy: pd.DataFrame, dur: np.ndarray, options: Options) -> list[dict]:
    reg = attribute(trace, sy["pid"], sy["tid"], sy["start"])
    where: list[dict] = []
    if any_region(reg):
        where = where_shares(reg, dur, key="nvtx", top=options.top_n)
    where += where_shares(thread_label_codes(trace, sy["pid"], sy["tid"]), dur, key="thread", top=options.top_n)
    if "callsite" in sy.columns and sy["callsite"].notna().any():  # backtraces in the trace
        where += where_shares(sy["callsite"].to_numpy(object), dur, key="callsite", top=options.top_n)
    return where
