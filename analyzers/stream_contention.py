"""Stream contention: several CPU threads launching into the same stream at the same time.

A CUDA stream is a FIFO owned by the driver behind one lock: when several client threads
launch into it, their launch calls serialize (each ``cudaLaunchKernel`` gets slower) and
their work cannot overlap on the GPU. The analyzer joins every GPU operation to its
launch call on ``(pid, correlation)`` and, per stream ``(pid, device, stream)`` fed by at
least ``Options.contention_min_threads`` threads, measures

* **overlap**: the share of launch-call time during which another thread was also inside
  a launch call to the same stream (sum over threads of |own calls ∩ others' calls| /
  sum of |own calls|, calls of one thread merged first);
* **switch rate**: the share of consecutive launches (in launch order) that come from a
  different thread than the previous one (interleaving);
* **slowdown**: median launch-call duration while another thread is launching to the
  same stream against the median while alone.

Only streams where threads actually launch concurrently or interleave are reported
(``Options.contention_min_overlap`` / ``contention_min_switch_rate``): a warm-up thread
that launches before the client threads start, followed by one steady-state thread per
stream, is not contention. The thread count reported is the number of threads whose launch span
(first to last launch) overlaps another thread's span.

Recoverable time: the launch-call time lost to contention - per overlapped call, its
duration above the median call made alone - capped by the steady-state GPU idle that
ends with work on a contended stream (the GPU can only win back time it spent idle).
Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._arrays import code_order, code_spans
from ._attribution import any_region, attribute, where_shares
from ._framework import idiom
from ._recoverable import examples, finish, idle_gaps, report, steady_starts, steady_window
from ._ops import api_thread_spans, what_is
from ._util import (coverage_at, group_codes, launches, merge_intervals, pair_codes, r, stream_label, thread_label,
                    thread_label_codes, union_length)

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "stream-contention": {
        "concurrent_threads": "number", "cuda_call_ms": "ms", "device": "number",
        "idle_while_threads_wait_ns": "ns", "launch_time_lost_ns": "ns", "launches": "number",
        "launches_per_thread": "number", "lock_wait_ms": "ms", "median_launch_us_alone": "us",
        "median_launch_us_overlapped": "us", "overlap_share": "share", "pid": "number", "score": "number",
        "share": "share", "slowdown": "number", "stream_id": "number", "switch_rate": "number",
        "threads": "number", "wall_ms": "ms",
    },
}


def _overlap_stats(calls: pd.DataFrame) -> tuple[float, np.ndarray]:
    """(overlap share, per-call bool 'another thread was launching during this call')."""
    tids = calls["tid"].to_numpy(np.int64)
    s = calls["api_start"].to_numpy(np.int64)
    e = calls["api_end"].to_numpy(np.int64)
    by_tid = np.argsort(tids, kind="stable")  # each thread's calls in one segment, in order
    bounds = np.flatnonzero(np.r_[True, tids[by_tid][1:] != tids[by_tid][:-1], True])
    segs = [by_tid[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    merged = [merge_intervals(s[m], e[m]) for m in segs]  # each thread's launch time
    # sweep over per-thread unions: count of threads inside a call at each instant
    allS = np.concatenate([v[0] for v in merged])
    allE = np.concatenate([v[1] for v in merged])
    times, delta = _sweep_events(allS, allE)
    c = np.cumsum(delta)[:-1]
    seg = np.diff(times)
    busy = float((c * seg).sum())
    over = float((c * seg * (c >= 2)).sum())
    share = over / busy if busy > 0 else 0.0
    # per call: does any other thread's launch time intersect it? A call [s, e) with
    # s < e meets the union of the other threads' (merged) intervals exactly when it
    # meets one of them, so each other thread is asked on its own: the last of its
    # intervals that starts before e, ending after s. A call of no length lying where
    # one thread's interval ends and another's begins is inside the union but in
    # neither: those few are asked of the union itself.
    overlapped = np.zeros(s.size, dtype=bool)
    for t, m in enumerate(segs):
        hit = np.zeros(m.size, dtype=bool)
        st, en = s[m], e[m]
        for u, (us, ue) in enumerate(merged):
            if u != t:
                i = np.searchsorted(us, en, side="left") - 1
                hit |= (i >= 0) & (ue[np.maximum(i, 0)] > st)
        point = np.flatnonzero(~hit & (st == en))
        if point.size and len(merged) > 1:
            others = [v for u, v in enumerate(merged) if u != t]
            os_, oe = merge_intervals(np.concatenate([v[0] for v in others]), np.concatenate([v[1] for v in others]))
            i = np.searchsorted(os_, en[point], side="left") - 1
            hit[point] = (i >= 0) & (oe[np.maximum(i, 0)] > st[point])
        overlapped[m] = hit
    return share, overlapped


def _sweep_events(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every start (+1) and end (-1) in time order, ends before starts at equal times:
    (times, deltas). One sort of ``2 * time + is_start`` where that fits in an int64."""
    times = np.concatenate([starts, ends])
    if times.size and -(1 << 61) <= times.min() and times.max() < 1 << 61:
        key = np.concatenate([starts * 2 + 1, ends * 2])
        key.sort(kind="stable")  # sorted runs (each thread's starts, its ends): a merge
        return key >> 1, (key & 1) * 2 - 1
    delta = np.concatenate([np.ones(starts.size, np.int64), -np.ones(ends.size, np.int64)])
    o = np.lexsort((delta, times))
    return times[o], delta[o]


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="stream-contention")
    streams, flagged, calls = _streams(trace, options)
    res.data = {"streams": streams, "contended_streams": len(flagged)}
    if not flagged:
        return res
    worst = max(flagged, key=lambda x: (x["score"] or 0, x["concurrent_threads"]))
    fc = pd.concat(calls, ignore_index=True)
    slow = f", launch calls {worst['slowdown']:.1f}x slower while another thread launches" if worst["slowdown"] else ""
    f = report(
        res, "stream-contention",
        title=(f"{worst['concurrent_threads']} CPU threads launch concurrently into one stream "
               f"({worst['stream']}): {worst['switch_rate']:.0%} of consecutive launches switch thread, "
               f"{worst['overlap_share']:.0%} of launch time overlaps another thread{slow}"),
        evidence={"streams": flagged, "worst": worst["stream"]}, where=_where(trace, flagged, fc, options),
        recommendation=(
            "Give every client thread its own stream group (a compute stream plus a copy stream, "
            "with a per-stream caching allocator) so launches stop serializing on one stream and "
            "requests overlap on the GPU; use CUDA graphs per group to cut the launch calls."
            + idiom(trace, "own_stream")),
        action="give every client thread its own stream group instead of one shared stream")
    ov = fc[fc["_ov"].to_numpy(bool) & fc["_steady"].to_numpy(bool) & ~fc["_first"].to_numpy(bool)]
    if len(ov):  # (steady-state calls; a first launch loads a module, it is not contention)
        f.examples = examples(trace, start=ov["api_start"], end=ov["api_end"], pid=ov["pid"], tid=ov["tid"],
                              device=ov["device"], stream=ov["stream"],
                              what="launch call while another thread launches into the stream",
                              n=options.examples_per_finding)
    lost_s, lost_e = _lost_intervals(trace, fc, options)
    waits = _lock_waits(trace, fc)
    cover_s, cover_e = merge_intervals(np.concatenate([lost_s, waits[0]]), np.concatenate([lost_e, waits[1]]))
    claims = _idle_on(trace, flagged, cover_s, cover_e, options)
    f.evidence["launch_time_lost_ns"] = int((lost_e - lost_s).sum())
    if waits[2]:
        f.evidence["lock_waits"] = waits[2]
        f.evidence["idle_while_threads_wait_ns"] = int(claims["claim_ns"].sum())
        f.title += _lock_title(waits[2])
    finish(f, int(claims["claim_ns"].sum()), steady_window(trace, options), options, claims=claims)
    return res


def _lost_intervals(trace: Trace, fc: pd.DataFrame, options: Options) -> tuple[np.ndarray, np.ndarray]:
    """The launch-call time lost to contention, as a union of intervals: the part of each
    overlapped call beyond the median call made alone, for steady-state calls that are not
    a thread's first launch of a kernel (which loads the module: milliseconds that are no
    contention)."""
    keep = fc["_ov"].to_numpy(bool) & fc["_steady"].to_numpy(bool) & ~fc["_first"].to_numpy(bool)
    med = fc["_alone_med"].to_numpy(float)
    keep &= ~np.isnan(med)
    s = fc["api_start"].to_numpy(np.int64)[keep] + np.nan_to_num(med[keep]).astype(np.int64)
    e = fc["api_end"].to_numpy(np.int64)[keep]
    return merge_intervals(s[s < e], e[s < e])


def _lock_waits(trace: Trace, fc: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """OS lock waits (``trace.os_waits``) of the threads launching concurrently into the
    contended streams, inside each thread's span of CUDA calls: their intervals and, per thread, the
    lock-wait ms, the ms in CUDA calls and the span (wall)."""
    ow = trace.os_waits
    none: tuple[np.ndarray, np.ndarray, list[dict]] = (np.zeros(0, np.int64), np.zeros(0, np.int64), [])
    if not len(ow):
        return none
    conc = fc[fc["_conc"].to_numpy(bool)]  # (not a warm-up thread that launched before the clients)
    threads = sorted(set(zip(conc["pid"].to_numpy(np.int64).tolist(), conc["tid"].to_numpy(np.int64).tolist())))
    spans = api_thread_spans(trace)
    opid, otid = ow["pid"].to_numpy(np.int64), ow["tid"].to_numpy(np.int64)
    apid, atid = trace.api["pid"].to_numpy(np.int64), trace.api["tid"].to_numpy(np.int64)
    ss, es, per = [], [], []
    for pid, tid in threads:
        lo, hi = (int(v) for v in spans.loc[(pid, tid)])
        m = (opid == pid) & (otid == tid)
        ws, we = merge_intervals(np.clip(ow["start"].to_numpy(np.int64)[m], lo, hi),
                                 np.clip(ow["end"].to_numpy(np.int64)[m], lo, hi))
        a = (apid == pid) & (atid == tid)
        cuda = union_length(trace.api["start"].to_numpy(np.int64)[a], trace.api["end"].to_numpy(np.int64)[a])
        ss.append(ws)
        es.append(we)
        per.append({"thread": thread_label(trace, pid, tid), "lock_wait_ms": r(int((we - ws).sum()) / 1e6, 3),
                    "cuda_call_ms": r(cuda / 1e6, 3), "wall_ms": r((hi - lo) / 1e6, 3)})
    if not any(p["lock_wait_ms"] for p in per):
        return none
    return np.concatenate(ss), np.concatenate(es), per


def _lock_title(per: list[dict]) -> str:
    w = [p["lock_wait_ms"] for p in per]
    c = [p["cuda_call_ms"] for p in per]
    wall = [p["wall_ms"] for p in per]
    rng = (lambda v: f"{min(v):.0f}" if round(min(v)) == round(max(v)) else f"{min(v):.0f}-{max(v):.0f}")
    return (f"; each launching thread waits on locks (the GIL, mutexes) {rng(w)} ms of its {rng(wall)} ms "
            f"against {rng(c)} ms in CUDA calls")


def _streams(trace: Trace, options: Options) -> tuple[list[dict], list[dict], list[pd.DataFrame]]:
    """Every stream fed by enough threads (its evidence), the contended ones, and the
    launch calls of each contended stream."""
    j = launches(trace)
    streams: list[dict] = []
    flagged: list[dict] = []
    calls_of: list[pd.DataFrame] = []
    if not len(j):
        return streams, flagged, calls_of
    code, uniq = group_codes(j["pid"].to_numpy(), j["device"].to_numpy(), j["stream"].to_numpy())
    _, pair_stream, _ = pair_codes(code, j["tid"].to_numpy())  # distinct (stream, thread) pairs
    nthreads = np.bincount(pair_stream, minlength=len(uniq))  # threads per stream
    many = np.flatnonzero(nthreads >= options.contention_min_threads)
    if not many.size:
        return streams, flagged, calls_of
    order = code_order(code, len(uniq))
    bounds = np.searchsorted(code[order], np.arange(len(uniq) + 1))
    cols = {c: j[c].to_numpy() for c in ("pid", "device", "stream", "tid", "api_start", "api_end", "row")}
    cols["kernel"] = np.where(what_is(j, "kernel"), 0, -1)  # the kernel's name code below, -1: not a kernel
    if len(trace.kernels):
        kc = trace.kernels["name"].cat.codes.to_numpy(np.int64)
        isk = cols["kernel"] == 0
        cols["kernel"][isk] = kc[cols["row"][isk]]
    steady = steady_starts(trace, options)
    for c in many:
        pid, dev, st = uniq[c]
        rows = order[bounds[c]: bounds[c + 1]]
        rows = rows[np.lexsort((cols["api_end"][rows], cols["api_start"][rows]))]  # by launch start, then end
        same = {"pid": pid, "device": dev, "stream": st}  # (the group's key: the same on every row)
        calls = pd.DataFrame({k: np.full(rows.size, same[k], v.dtype) if k in same else v[rows]
                              for k, v in cols.items()})
        info, overlapped, d = _stream_info(trace, pid, dev, st, int(nthreads[c]), calls, options)
        streams.append(info)
        if info["contended"]:
            med = info["median_launch_us_alone"]
            c = calls.assign(_ov=overlapped, _dur=d, _steady=calls["api_start"].to_numpy(np.int64) >= steady.get(int(dev), 0),
                             _first=_first_launch(calls), _alone_med=np.nan if med is None else _alone_ns(d, overlapped))
            ls, le = _lost_intervals(trace, c, options)
            info["launch_time_lost_ns"] = int((le - ls).sum())
            flagged.append(info)
            calls_of.append(c)
    return streams, flagged, calls_of


def _stream_info(trace: Trace, pid: int, dev: int, st: int, nt: int, calls: pd.DataFrame,
                 options: Options) -> tuple[dict, np.ndarray, np.ndarray]:
    """One stream's evidence: overlap, switch rate, slowdown, concurrent threads."""
    share, overlapped = _overlap_stats(calls)
    tids = calls["tid"].to_numpy(np.int64)
    switch_rate = float((tids[1:] != tids[:-1]).mean()) if tids.size > 1 else 0.0
    d = (calls["api_end"] - calls["api_start"]).to_numpy(np.int64)
    med_over = float(np.median(d[overlapped])) if overlapped.any() else None
    med_alone = float(np.median(d[~overlapped])) if (~overlapped).any() else None
    tcode, tuniq = pd.factorize(tids, sort=True)
    per_thread = pd.Series(np.bincount(tcode, minlength=len(tuniq)), index=pd.Index(tuniq, name="tid"))
    per_thread = per_thread.sort_values(ascending=False)
    # threads whose launch span [first, last] overlaps another thread's span: a
    # warm-up thread that finished before the clients started does not count
    lo, hi = code_spans(tcode, len(tuniq), calls["api_start"].to_numpy(), calls["api_end"].to_numpy())
    ov = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])
    np.fill_diagonal(ov, False)
    concurrent = int(ov.any(axis=1).sum())
    calls["_conc"] = np.isin(tids, tuniq[ov.any(axis=1)])  # the thread launches beside another
    info = {
        "stream": stream_label(pid, dev, st), "pid": int(pid), "device": int(dev), "stream_id": int(st),
        "threads": nt, "concurrent_threads": concurrent, "launches": int(len(calls)),
        "overlap_share": r(share), "switch_rate": r(switch_rate),
        "median_launch_us_overlapped": r(med_over / 1000, 3) if med_over is not None else None,
        "median_launch_us_alone": r(med_alone / 1000, 3) if med_alone is not None else None,
        "slowdown": r(med_over / med_alone) if (med_over and med_alone) else None,
        "launches_per_thread": {thread_label(trace, pid, t): int(n) for t, n in per_thread.items()},
    }
    info["contended"] = bool(concurrent >= options.contention_min_threads and (
        share >= options.contention_min_overlap or switch_rate >= options.contention_min_switch_rate))
    info["score"] = r(max(share, switch_rate))
    return info, overlapped, d


def _alone_ns(d: np.ndarray, overlapped: np.ndarray) -> float:
    """The median duration of the launch calls made while no other thread launched."""
    return float(np.median(d[~overlapped]))


def _first_launch(calls: pd.DataFrame) -> np.ndarray:
    """Each thread's first launch of each kernel (by name): it loads the kernel's module
    (lazy loading), milliseconds that are start-up, not contention."""
    k = calls["kernel"].to_numpy(np.int64)
    key = pd.DataFrame({"tid": calls["tid"].to_numpy(np.int64), "k": k})
    return (~key.duplicated().to_numpy()) & (k >= 0)


def _where(trace: Trace, flagged: list[dict], fc: pd.DataFrame, options: Options) -> list[dict]:
    where = [{"stream": f["stream"], "threads": f["threads"],
              "share": round(f["launches"] / len(fc), 4)} for f in flagged][: options.top_n]
    where += where_shares(thread_label_codes(trace, fc["pid"], fc["tid"]), key="thread", top=options.top_n)
    reg = attribute(trace, fc["pid"], fc["tid"], fc["api_start"])
    if any_region(reg):
        where += where_shares(reg, key="nvtx", top=options.top_n)
    return where


def _idle_on(trace: Trace, flagged: list[dict], cover_s: np.ndarray, cover_e: np.ndarray,
             options: Options) -> pd.DataFrame:
    """Steady-state GPU idle gaps that end with work on a contended stream, with the ns of
    each during which a launching thread lost time to contention (``claim_ns``: the gap
    covered by the lost launch time or the threads' lock waits); the GPU can only win back
    time it spent idle."""
    gaps = idle_gaps(trace, options)
    if not len(gaps):
        return gaps.assign(claim_ns=np.zeros(0, np.int64))
    gs = gaps[gaps["steady"].astype(bool)]
    keys = pd.MultiIndex.from_tuples([(x["pid"], x["device"], x["stream_id"]) for x in flagged])
    on = pd.MultiIndex.from_arrays([gs["pid"].to_numpy(np.int64), gs["device"].to_numpy(np.int64),
                                    gs["stream"].to_numpy(np.int64)]).isin(keys)
    gs = gs[np.asarray(on, bool)]
    a, b = gs["start"].to_numpy(np.int64), gs["end"].to_numpy(np.int64)
    return gs.assign(claim_ns=coverage_at(cover_s, cover_e, b) - coverage_at(cover_s, cover_e, a))
