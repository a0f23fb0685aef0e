"""What concurrency a trace already has: the CPU threads that launch at the same time, the
streams each launches into, and the side streams that run sibling branches.

The planner (:mod:`recsys_doctor.planner`) sizes the stream groups from these facts, so
its reasons say what the trace shows:

* **launching threads** of a device: threads that issue at least
  ``Options.report_min_share`` of the device's launches (kernels, copies, memsets, graph
  launches); **concurrent** ones: those that issue at least half of their launches while
  another of them is busy launching (between two of its launches less than 4x its median
  gap apart). A forward thread and an autograd thread that take turns count as one; four client
  threads launching all the time count as four. ``own_streams``: each of them launches
  mostly into a stream none of the others uses (the groups exist already).
* **sibling streams** of a device: streams with no communication kernels that run the
  same kernels (the same names the same number of times: replicas of one module, e.g. the
  experts or towers of a multi-task model, or one client's query per stream), each with at
  least ``Options.report_min_share`` / 2 of the device's kernel time, all in use over a
  common stretch of time (a stream pool used one stream per step is not). Replicas of one
  module on separate streams, forked and joined by events, are branches that do not feed
  each other; a stream running different kernels (a copy or a pipelined stage) may depend
  on the others and is never counted. ``overlap_ns``: how long two or more of
  them actually run at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .analyzers._arrays import merge_intervals
from .analyzers._comm import comm_mask
from .analyzers._ops import launches
from .analyzers._util import str_contains
from .model import Trace
from .options import Options

__all__ = ["launching_threads", "sibling_streams"]


def launching_threads(trace: Trace, options: Options) -> dict[str, Any]:
    """``{"threads", "concurrent", "own_streams", "device"}`` for the device with the most
    concurrent launching threads, then the most launching threads (zeros when nothing is
    launched)."""
    j = launches(trace)
    best = {"threads": 0, "concurrent": 0, "own_streams": False, "device": None}
    if not len(j):
        return best
    dev = j["device"].to_numpy(np.int64)
    thread = j["pid"].to_numpy(np.int64) * (1 << 32) + j["tid"].to_numpy(np.int64)
    t = j["api_start"].to_numpy(np.int64)
    stream = j["stream"].to_numpy(np.int64)
    for d in np.unique(dev):
        on = np.flatnonzero(dev == d)
        u, inv, cnt = np.unique(thread[on], return_inverse=True, return_counts=True)
        heavy = np.flatnonzero(cnt >= options.report_min_share * on.size)
        hk = np.isin(inv, heavy)
        conc = _concurrency(t[on][hk], inv[hk])
        if (conc, heavy.size) > (best["concurrent"], best["threads"]):
            best = {"threads": int(heavy.size), "concurrent": conc,
                    "own_streams": _own_streams(inv[hk], stream[on][hk]), "device": int(d)}
    return best


def _concurrency(t: np.ndarray, thread: np.ndarray) -> int:
    """How many of the threads launch concurrently: those that issue at least half of
    their launches while another of the threads is busy launching. A thread is busy
    launching from a launch until its next one, unless that gap is over 4x its median gap
    (then it is idle: a forward thread waiting while the autograd thread runs backward)."""
    if t.size == 0:
        return 0
    o = np.lexsort((t, thread))
    ts, th = t[o], thread[o]
    new = np.ones(ts.size, dtype=bool)
    new[1:] = th[1:] != th[:-1]
    gap = np.diff(ts, prepend=ts[0])
    gap[new] = 0
    med = pd.Series(gap[~new]).groupby(th[~new]).median()
    limit = 4 * med.reindex(th, fill_value=0).to_numpy() + 1
    cut = new | (gap > limit)  # starts a busy window
    starts = np.flatnonzero(cut)
    ends = np.append(starts[1:], ts.size) - 1
    ws, we, wt = ts[starts], ts[ends] + 1, th[starts]
    n = 0
    for x in np.unique(th):
        mine = th == x
        os_, oe = merge_intervals(ws[wt != x], we[wt != x])
        if os_.size == 0:
            continue
        i = np.searchsorted(os_, ts[mine], side="right") - 1
        inside = (i >= 0) & (ts[mine] < oe[np.maximum(i, 0)])
        n += bool(inside.mean() >= 0.5)
    return n if n >= 2 else 1


def _own_streams(thread: np.ndarray, stream: np.ndarray) -> bool:
    """Each thread's most used stream is used by no other of these threads (for most of
    that thread's launches)."""
    df = pd.DataFrame({"t": thread, "s": stream})
    counts = df.value_counts()
    main = counts.groupby(level="t").idxmax().map(lambda ts: ts[1])
    if main.nunique() < len(main):
        return False
    users = df.drop_duplicates().groupby("s")["t"].nunique()
    total = df.groupby("t").size()
    shared = users[users > 1].index
    return bool((df[df["s"].isin(shared)].groupby("t").size().reindex(total.index, fill_value=0)
                 <= 0.5 * total).all())


def sibling_streams(trace: Trace, options: Options) -> dict[str, Any]:
    """``{"streams", "kernels_each", "overlap_ns", "wait_events", "device"}``: the largest
    set of sibling side streams of one device (``streams`` 0 when there is none)."""
    k = trace.kernels
    api = trace.api
    waits = int(str_contains(api["name"], r"StreamWaitEvent").sum()) if len(api) else 0
    none = {"streams": 0, "kernels_each": 0, "overlap_ns": 0, "wait_events": waits, "device": None}
    if not len(k):
        return none
    comm = comm_mask(trace)
    dur = (k["end"] - k["start"]).to_numpy(np.int64)
    df = pd.DataFrame({"device": k["device"].to_numpy(np.int64), "stream": k["stream"].to_numpy(np.int64),
                       "start": k["start"].to_numpy(np.int64),
                       "code": k["name"].cat.codes.to_numpy() if hasattr(k["name"], "cat") else
                       pd.factorize(k["name"])[0], "dur": dur, "comm": comm})
    best = none
    for d, g in df.groupby("device"):
        comm_streams = set(g.loc[g["comm"], "stream"])
        g = g[~g["stream"].isin(comm_streams)]
        per = g.groupby("stream")["dur"].sum()
        if len(per) < 2:
            continue
        side = per[per >= options.report_min_share / 2 * per.sum()]
        sig = g[g["stream"].isin(side.index)].groupby("stream")["code"].apply(lambda c: tuple(np.sort(c.to_numpy())))
        if not len(sig):
            continue
        sets: dict[tuple, list[int]] = {}
        for stream, names in sig.items():
            sets.setdefault(names, []).append(int(stream))
        spans = g.assign(end=g["start"] + g["dur"]).groupby("stream").agg(lo=("start", "min"), hi=("end", "max"))
        together = [m for m in sets.values() if spans.loc[m, "lo"].max() < spans.loc[m, "hi"].min()]
        members = max(together, key=len) if together else []
        if len(members) >= 2 and len(members) > best["streams"]:
            best = {"streams": len(members), "kernels_each": len(sig[members[0]]),
                    "overlap_ns": _overlap(k, int(d), members), "wait_events": waits, "device": int(d)}
    return best


def _overlap(k: pd.DataFrame, device: int, streams: list[int]) -> int:
    """Time two or more of ``streams`` run kernels at once: the sum of each stream's busy
    time minus the busy time of all of them together."""
    on = (k["device"].to_numpy(np.int64) == device)
    st = k["stream"].to_numpy(np.int64)
    s, e = k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    each = 0
    for x in streams:
        m = on & (st == x)
        ms, me = merge_intervals(s[m], e[m])
        each += int((me - ms).sum())
    m = on & np.isin(st, streams)
    ms, me = merge_intervals(s[m], e[m])
    return each - int((me - ms).sum())
