"""What concurrency a trace already has: the CPU threads that launch at the same time, the
streams each launches into, and the side streams that run sibling branches.

The planner (:mod:`recsys_doctor.planning.planner`) sizes the stream groups from these facts, so
its reasons say what the trace shows:

* **launching threads** of a device: threads that issue at least
  ``Options.report_min_share`` of the device's launches (kernels, copies, memsets, graph
  launches); **concurrent** ones: those that issue at least half of their launches while
  another of them is busy launching (between two of its launches less than 4x its median
  gap apart), measured on the middle :data:`CONCURRENCY_SAMPLE` launches of the device. A forward thread and an autograd thread that take turns count as one; four client
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

from ..analyzers._arrays import code_order, merge_intervals, pair_codes
from ..analyzers._comm import comm_mask
from ..analyzers._ops import launches
from ..analyzers._util import busy_by_key, busy_together, str_contains
from ..model import Trace
from ..options import Options

__all__ = ["launching_threads", "sibling_streams", "CONCURRENCY_SAMPLE"]

#: launches (per device) the concurrency of the threads is measured on: the middle ones of
#: the trace in operation order, a stretch of time long enough to hold many steps or
#: queries (a 10M-row export has millions of launches; the share of launches made while
#: another thread is busy is the same on a long stretch of them)
CONCURRENCY_SAMPLE = 200_000


def launching_threads(trace: Trace, options: Options) -> dict[str, Any]:
    """``{"threads", "concurrent", "own_streams", "device", "processes", "per_process"}`` for the
    device with the most concurrent launching threads, then the most launching threads (zeros
    when nothing is launched). A stream is its process's: two processes' streams of one number
    are two streams (each process has its own CUDA context), as the stream-contention analyzer
    keys them; ``processes`` counts the processes of the launching threads and ``per_process``
    is the most of them that launch concurrently within one process (a process's stream groups
    are its own: another process's threads are not among them)."""
    j = launches(trace)
    best = {"threads": 0, "concurrent": 0, "own_streams": False, "device": None, "processes": 0, "per_process": 0}
    if not len(j):
        return best
    dev = j["device"].to_numpy(np.int64)
    pid = j["pid"].to_numpy(np.int64)
    thread, _, _ = pair_codes(pid, j["tid"].to_numpy(np.int64))
    t = j["api_start"].to_numpy(np.int64)
    stream, _, _ = pair_codes(pid, j["stream"].to_numpy(np.int64))
    one = dev.min() == dev.max()  # (one device: no sort of the millions of launches by device)
    devs, dev_code = (dev[:1], None) if one else np.unique(dev, return_inverse=True)
    for di, d in enumerate(devs):
        on = None if dev_code is None else np.flatnonzero(dev_code == di)  # (None: every launch)
        th = thread if on is None else thread[on]
        cnt = np.bincount(th)
        heavy = np.flatnonzero(cnt >= options.report_min_share * th.size)
        if heavy.size == 0:
            continue
        is_heavy = np.zeros(cnt.size, dtype=bool)
        is_heavy[heavy] = True
        keep = is_heavy[th]
        hk = np.flatnonzero(keep) if on is None else on[keep]
        mid = hk[max(0, hk.size // 2 - CONCURRENCY_SAMPLE // 2):][:CONCURRENCY_SAMPLE]
        conc = _concurrency(t[mid], thread[mid])
        if (conc, heavy.size) > (best["concurrent"], best["threads"]):
            pm = pid[mid]
            pids = np.unique(pm)
            per = conc if pids.size <= 1 else max(_concurrency(t[mid[pm == p]], thread[mid[pm == p]]) for p in pids)
            best = {"threads": int(heavy.size), "concurrent": conc,
                    "own_streams": _own_streams(thread[hk], stream[hk]), "device": int(d),
                    "processes": int(np.unique(pid[hk]).size), "per_process": per}
    return best


def _concurrency(t: np.ndarray, thread: np.ndarray) -> int:
    """How many of the threads launch concurrently: those that issue at least half of
    their launches while another of the threads is busy launching. A thread is busy
    launching from a launch until its next one, unless that gap is over 4x its median gap
    (then it is idle: a forward thread waiting while the autograd thread runs backward)."""
    if t.size == 0:
        return 0
    o = np.argsort(t, kind="stable")
    o = o[code_order(thread[o], int(thread.max()) + 1)]  # by thread, then time
    ts, th = t[o], thread[o]
    first = np.flatnonzero(np.r_[True, th[1:] != th[:-1]])
    last = np.r_[first[1:], ts.size]
    windows, mine = [], []
    for a, b in zip(first, last):
        x = ts[a:b]
        gap = np.diff(x)
        limit = 4 * (float(np.median(gap)) if gap.size else 0.0) + 1
        cut = np.flatnonzero(gap > limit) + 1  # a new busy window starts after a long gap
        ws = np.r_[0, cut]
        we = np.r_[cut, x.size] - 1
        windows.append((x[ws], x[we] + 1))
        mine.append(x)
    n = 0
    for i, x in enumerate(mine):
        others = [w for k, w in enumerate(windows) if k != i]
        if not others:
            continue
        os_, oe = merge_intervals(np.concatenate([w[0] for w in others]), np.concatenate([w[1] for w in others]))
        k = np.searchsorted(os_, x, side="right") - 1
        inside = (k >= 0) & (x < oe[np.maximum(k, 0)])
        n += bool(inside.mean() >= 0.5)
    return n if n >= 2 else 1


def _own_streams(thread: np.ndarray, stream: np.ndarray) -> bool:
    """Each thread's most used stream is used by no other of these threads (for most of
    that thread's launches)."""
    nt, ns = int(thread.max()) + 1, int(stream.max()) + 1
    m = np.bincount(thread * ns + stream, minlength=nt * ns).reshape(nt, ns)
    m = m[m.sum(axis=1) > 0]
    main = m.argmax(axis=1)
    if len(set(main.tolist())) < len(main):
        return False
    shared = (m > 0).sum(axis=0) > 1
    return bool((m[:, shared].sum(axis=1) <= 0.5 * m.sum(axis=1)).all())


def sibling_streams(trace: Trace, options: Options) -> dict[str, Any]:
    """``{"streams", "kernels_each", "overlap_ns", "wait_events", "device"}``: the largest
    set of sibling side streams of one process on one device (``streams`` 0 when there is
    none): two processes running the same kernels are not one module's branches."""
    k = trace.kernels
    api = trace.api
    waits = int(str_contains(api["name"], r"StreamWaitEvent").sum()) if len(api) else 0
    none: dict[str, Any] = {"streams": 0, "kernels_each": 0, "overlap_ns": 0, "wait_events": waits, "device": None}
    if not len(k):
        return none
    comm = comm_mask(trace)
    dur = (k["end"] - k["start"]).to_numpy(np.int64)
    df = pd.DataFrame({"pid": k["pid"].to_numpy(np.int64), "device": k["device"].to_numpy(np.int64),
                       "stream": k["stream"].to_numpy(np.int64),
                       "start": k["start"].to_numpy(np.int64),
                       "code": k["name"].cat.codes.to_numpy() if hasattr(k["name"], "cat") else
                       pd.factorize(k["name"])[0], "dur": dur, "comm": comm})
    best = none
    for (p, d), g in df.groupby(["pid", "device"]):  # (a stream is its process's)
        comm_streams = set(g.loc[g["comm"], "stream"])
        g = g[~g["stream"].isin(comm_streams)]
        per = g.groupby("stream")["dur"].sum()
        if len(per) < 2:
            continue
        side = per[per >= options.report_min_share / 2 * per.sum()]
        # each stream's kernels as (name, count) pairs: one row per distinct name, not per kernel
        pc = g.loc[g["stream"].isin(side.index), ["stream", "code"]].value_counts().sort_index()
        sets: dict[tuple, list[int]] = {}
        for stream, names in pc.groupby(level="stream"):
            key = tuple(zip(names.index.get_level_values("code").tolist(), names.tolist()))
            sets.setdefault(key, []).append(int(stream))
        if not sets:
            continue
        spans = g.assign(end=g["start"] + g["dur"]).groupby("stream").agg(lo=("start", "min"), hi=("end", "max"))
        together = [m for m in sets.values() if spans.loc[m, "lo"].max() < spans.loc[m, "hi"].min()]
        members = max(together, key=len) if together else []
        if len(members) >= 2 and len(members) > best["streams"]:
            best = {"streams": len(members), "kernels_each": int((g["stream"] == members[0]).sum()),
                    "overlap_ns": _overlap(k, int(p), int(d), members), "wait_events": waits, "device": int(d)}
    return best


def _overlap(k: pd.DataFrame, pid: int, device: int, streams: list[int]) -> int:
    """Time two or more of ``streams`` (of process ``pid``) run kernels at once: the sum of each
    stream's busy time minus the busy time of all of them together."""
    on = ((k["device"].to_numpy(np.int64) == device) & (k["pid"].to_numpy(np.int64) == pid)
          & np.isin(k["stream"].to_numpy(np.int64), streams))
    keys, merged, busy = busy_by_key(k[on], "stream")
    each, together = busy_together(merged, busy, list(range(len(keys))))
    return each - together
