"""What a fix could win: GPU idle gaps, the steady state, recoverable time and severity.

Every finding carries ``recoverable_ns``: an estimate of the GPU time inside the analysis
window that fixing it could win back, counted in the **steady state** only (idle during
start-up - CUDA context creation, cuBLAS initialization, lazy module loading, warm-up -
is not something a CUDA graph or a stream group removes). Severity derives from
``recoverable_ns / steady window`` (see :func:`finish` and docs/findings.md): the sum
over devices of steady-state start to last GPU activity - a trace that is mostly
start-up still judges its steady state on the steady state.

The building block is the list of idle gaps of each device: the stretches of its window
covered by no kernel, graph execution, copy or memset; each gap ends with the operation
that ended it (``what``/``row`` in :func:`~._util.op_table`).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..findings import AnalysisResult, Finding, severity_for_recoverable
from ..model import Trace
from ..options import Options
from ._ops import device_busy, timeline_edges
from ._util import (coverage_at, covered_in_bins, merge_intervals, op_table, str_contains, stream_label, take_str,
                    thread_labels)

__all__ = ["steady_starts", "idle_gaps", "allocator_cover", "allocator_gap", "device_gaps", "DeviceGaps", "analysis_window", "steady_window", "finish", "examples",
           "gaps_containing", "report", "claims_within"]


def _cached(trace: Trace, key: tuple, make: Any) -> Any:
    """The results of the functions below per options, kept with the trace
    (:meth:`Trace.derived`), so the analyzers that all need the gaps compute them once."""
    return trace.derived(key, make)


def steady_starts(trace: Trace, options: Options, ops: pd.DataFrame | None = None) -> dict[int, int]:
    """Per device, where its steady state starts: the later of
    ``Options.startup_fraction`` of its window and the first timeline bin (of
    ``Options.timeline_bins`` over the whole trace) whose busy fraction reaches half of
    the device's median non-empty bin."""
    return dict(_cached(trace, ("steady", options), lambda: _steady_starts(trace, options, ops)))


def _steady_starts(trace: Trace, options: Options, ops: pd.DataFrame | None) -> dict[int, int]:
    parts = device_busy(trace)
    if not parts:
        return {}
    edges = timeline_edges(trace, options.timeline_bins)
    widths = np.maximum(np.diff(edges), 1).astype(float)
    return {p.device: steady_cut(covered_in_bins(p.busy_start, p.busy_end, edges) / widths, edges, p.first,
                                 p.last, options.startup_fraction) for p in parts}


def steady_cut(frac: np.ndarray, edges: np.ndarray, w0: int, w1: int, startup_fraction: float) -> int:
    """Where a device's steady state starts: the later of the start-up cut
    (``startup_fraction`` of its window ``[w0, w1]``) and the first timeline bin whose busy
    fraction ``frac`` reaches half the median non-empty bin; never past ``w1``."""
    cut = w0 + int(startup_fraction * (w1 - w0))
    in_win = (edges[1:] > w0) & (edges[:-1] < w1)
    nonempty = frac[in_win & (frac > 0)]
    if nonempty.size:
        thr = 0.5 * float(np.median(nonempty))
        first = np.flatnonzero(in_win & (frac >= thr))
        if first.size:
            cut = max(cut, int(edges[first[0]]))
    return min(cut, w1)


def analysis_window(trace: Trace) -> int:
    """Sum over devices of (last end - first start) of all GPU activity (ns)."""
    ops = op_table(trace)
    if len(ops) == 0:
        return 0
    g = ops.groupby("device")
    return int((g["end"].max() - g["start"].min()).sum())


def steady_window(trace: Trace, options: Options) -> int:
    """Sum over devices of (last GPU activity - steady-state start), ns."""
    return _cached(trace, ("steady_window", options), lambda: _steady_window(trace, options))


def _steady_window(trace: Trace, options: Options) -> int:
    ops = op_table(trace)
    if len(ops) == 0:
        return 0
    st = steady_starts(trace, options, ops)
    ends = ops.groupby("device")["end"].max()
    return int(sum(max(0, int(e) - st.get(int(d), int(e))) for d, e in ends.items()))


class DeviceGaps(NamedTuple):
    """One device's GPU operations in (start, end) order and the idle gaps between them."""

    device: int
    order: np.ndarray  # positions in op_table(trace), by (start, end), stable
    start: np.ndarray  # start of each operation, in that order
    reach: np.ndarray  # the latest end of all work up to and including each operation
    ends_gap: np.ndarray  # positions (in that order) of the operations that end a gap
    gap: np.ndarray  # length of each of those gaps (ns)

    @property
    def gap_start(self) -> np.ndarray:
        """When the device went idle before each gap."""
        return self.reach[self.ends_gap - 1]


def device_gaps(trace: Trace) -> list[DeviceGaps]:
    """Every device's idle gaps (in device order): the stretches of its window covered by
    no operation, each ended by the operation that starts it busy again."""
    return _cached(trace, ("device_gaps",), lambda: _device_gaps(op_table(trace)))


def _device_gaps(ops: pd.DataFrame) -> list[DeviceGaps]:
    dev = ops["device"].to_numpy(np.int64)
    start = ops["start"].to_numpy(np.int64)
    end = ops["end"].to_numpy(np.int64)
    out = []
    for d in np.unique(dev):
        pos = np.flatnonzero(dev == d)
        o = pos[np.lexsort((end[pos], start[pos]))]
        s = start[o]
        cm = np.maximum.accumulate(end[o])
        gap = np.zeros(s.size, dtype=np.int64)
        gap[1:] = s[1:] - cm[:-1]
        idx = np.flatnonzero(gap > 0)
        out.append(DeviceGaps(int(d), o, s, cm, idx, gap[idx]))
    return out


def idle_gaps(trace: Trace, options: Options, ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """Idle gaps of every device: ``device, start, end, ns, what, row, pid, stream,
    steady`` - ``start`` is when the device went idle (end of all work before), ``end``
    when the operation (``what``, ``row``) that ended the gap started; ``steady`` is True
    when the gap lies after the device's steady-state start. The table is the per-trace
    cached one, not a copy (a copy of the millions of gaps of a large trace, taken by each
    of a dozen callers, cost more than the analyses that use it): callers filter or assign
    into new frames and never write into it."""
    return _cached(trace, ("gaps", options), lambda: _idle_gaps(trace, options))


def _idle_gaps(trace: Trace, options: Options) -> pd.DataFrame:
    cols = ["device", "start", "end", "ns", "what", "row", "pid", "stream", "steady"]
    ops = op_table(trace)
    parts = device_gaps(trace)
    if not parts:
        return pd.DataFrame({c: [] for c in cols})
    st = steady_starts(trace, options, ops)
    at = np.concatenate([g.order[g.ends_gap] for g in parts])
    gap_start = np.concatenate([g.gap_start for g in parts])
    device = np.concatenate([np.full(g.ends_gap.size, g.device, np.int64) for g in parts])
    steady_at = np.concatenate([np.full(g.ends_gap.size, st.get(g.device, 0), np.int64) for g in parts])
    return pd.DataFrame({
        "device": device, "start": gap_start, "end": ops["start"].to_numpy(np.int64)[at],
        "ns": np.concatenate([g.gap for g in parts]), "what": take_str(ops["what"], at),
        "row": ops["row"].to_numpy(np.int64)[at], "pid": ops["pid"].to_numpy(np.int64)[at],
        "stream": ops["stream"].to_numpy(np.int64)[at], "steady": gap_start >= steady_at})


def allocator_cover(trace: Trace, options: Options) -> np.ndarray:
    """Per row of :func:`idle_gaps`, the ns of the gap during which a thread of the gap's
    process was inside an allocator call (``Options.allocator_api_pattern``: cudaMalloc,
    cudaFree, ...); a gap covered at least ``Options.allocator_gap_share`` is the
    allocator's, not a launch wait."""
    return _cached(trace, ("alloc_cover", options.allocator_api_pattern, options),
                   lambda: _allocator_cover(trace, options))


def allocator_gap(trace: Trace, options: Options) -> np.ndarray:
    """Per row of :func:`idle_gaps`: whether it is an allocator gap (see
    :func:`allocator_cover`); launch findings (launch-bound, short-kernels,
    graph-candidate) leave these to ``allocator-churn``."""
    gaps = idle_gaps(trace, options)
    return allocator_cover(trace, options) >= options.allocator_gap_share * gaps["ns"].to_numpy(np.int64)


def _allocator_cover(trace: Trace, options: Options) -> np.ndarray:
    gaps = idle_gaps(trace, options)
    out = np.zeros(len(gaps), dtype=np.int64)
    api = trace.api
    if not len(gaps) or not len(api):
        return out
    m = str_contains(api["name"], re.compile(options.allocator_api_pattern)).to_numpy(bool)
    if not m.any():
        return out
    apid, ast, aen = (api[c].to_numpy(np.int64)[m] for c in ("pid", "start", "end"))
    gpid, gs, ge = (gaps[c].to_numpy(np.int64) for c in ("pid", "start", "end"))
    for pid in np.unique(apid):
        ms, me = merge_intervals(ast[apid == pid], aen[apid == pid])
        at = np.flatnonzero(gpid == pid)
        out[at] = coverage_at(ms, me, ge[at]) - coverage_at(ms, me, gs[at])
    return out


def gaps_containing(gaps: pd.DataFrame, t: Any, device: Any = None) -> np.ndarray:
    """Index (into ``gaps``) of the gap that contains each time ``t`` (``start <= t <
    end``), -1 where none; with ``device`` only that device's gaps, else the first device
    (in device order) with a gap there."""
    t = np.asarray(t, dtype=np.int64)
    out = np.full(t.size, -1, dtype=np.int64)
    if len(gaps) == 0 or t.size == 0:
        return out
    gdev = gaps["device"].to_numpy(np.int64)
    devs = [int(device)] if device is not None else sorted(set(gdev.tolist()))
    for d in devs:
        gi = np.flatnonzero(gdev == d)
        gs = gaps["start"].to_numpy(np.int64)[gi]
        ge = gaps["end"].to_numpy(np.int64)[gi]
        o = np.argsort(gs, kind="stable")
        gi, gs, ge = gi[o], gs[o], ge[o]
        i = np.searchsorted(gs, t, side="right") - 1
        hit = np.zeros(t.size, bool)
        ok = i >= 0
        hit[ok] = ge[i[ok]] > t[ok]
        sel = hit & (out < 0)
        out[sel] = gi[i[sel]]
    return out


def report(res: AnalysisResult, fid: str, *, title: str, evidence: dict[str, Any], recommendation: str,
           where: list[dict[str, Any]], action: str) -> Finding:
    """Add a finding (severity "note" until :func:`finish` sets it) to ``res``; return it."""
    f = Finding(id=fid, severity="note", title=title, evidence=evidence, recommendation=recommendation,
                where=where, action=action)
    res.findings.append(f)
    return f


def finish(f: Finding, recoverable_ns: float, window_ns: int, options: Options,
           claims: pd.DataFrame | None = None) -> Finding:
    """Set the finding's recoverable time (capped at the window) and the severity that
    follows from its share of the window. ``claims``: the idle gaps (rows of
    :func:`idle_gaps`: ``device, start, ns``; ``claim_ns`` where the finding counts only
    part of a gap; ``root``, a finding id, where that finding names the gap's cause
    better) the recoverable time was counted from: :func:`settle_shared_causes` counts
    each gap once."""
    rec = int(max(0, min(float(recoverable_ns), float(window_ns))))
    share = rec / window_ns if window_ns > 0 else None
    f.recoverable_ns = rec
    f.recoverable_share = None if share is None else round(share, 4)
    f.severity = severity_for_recoverable(share, options.recoverable_high, options.recoverable_medium,
                                          options.recoverable_low)
    if claims is not None:
        ns = claims["ns"].to_numpy(np.int64)
        want = claims["claim_ns"].to_numpy(np.int64) if "claim_ns" in claims.columns else ns
        own = pd.DataFrame({"device": claims["device"].to_numpy(np.int64), "start": claims["start"].to_numpy(np.int64),
                            "full": ns, "want": np.minimum(want, ns)})
        if "root" in claims.columns:
            own["root"] = claims["root"].to_numpy(object)
        f.claims = own
    return f


def claims_within(trace: Trace, options: Options, pid: Any, start: Any, end: Any) -> pd.DataFrame:
    """The claims (for :func:`finish`) of a finding whose idle time is the GPU idle inside
    some host intervals (input loading, an optimizer step): per idle gap of
    :func:`idle_gaps`, the part of it inside the union of the intervals ``[start, end)``
    of the gap's process (``claim_ns``); gaps with no such part are left out."""
    gaps = idle_gaps(trace, options)
    pid, start, end = (np.asarray(x, dtype=np.int64) for x in (pid, start, end))
    claim = np.zeros(len(gaps), np.int64)
    if len(gaps) and pid.size:
        gpid, gs, ge = (gaps[c].to_numpy(np.int64) for c in ("pid", "start", "end"))
        for p in np.unique(pid):
            ms, me = merge_intervals(start[pid == p], end[pid == p])
            at = np.flatnonzero(gpid == p)
            claim[at] = coverage_at(ms, me, ge[at]) - coverage_at(ms, me, gs[at])
    keep = claim > 0
    return pd.DataFrame({"device": gaps["device"].to_numpy(np.int64)[keep] if len(gaps) else claim[keep],
                         "start": gaps["start"].to_numpy(np.int64)[keep] if len(gaps) else claim[keep],
                         "ns": gaps["ns"].to_numpy(np.int64)[keep] if len(gaps) else claim[keep],
                         "claim_ns": claim[keep]})




def examples(trace: Trace, *, start: Any, end: Any, pid: Any, weight: Any = None, tid: Any = None,
             device: Any = None, stream: Any = None, what: str | list[str] | np.ndarray = "",
             n: int = 3) -> list[dict[str, Any]]:
    """Up to ``n`` moments to look at, the heaviest first (``weight``, default the duration):
    ``{"what", "start_ns", "duration_ns", "thread", "stream"}`` on the trace's clock."""
    s = np.asarray(start, dtype=np.int64)
    e = np.asarray(end, dtype=np.int64)
    if s.size == 0 or n <= 0:
        return []
    w = (e - s) if weight is None else np.asarray(weight, dtype=float)
    pick = np.argsort(-w, kind="stable")[:n]
    p = np.asarray(pid, dtype=np.int64)
    labels: list[str | None] | None = None
    if tid is not None:
        tt = np.asarray(tid, dtype=np.float64)
        ok = ~np.isnan(tt[pick])
        labels = [None] * pick.size
        if ok.any():
            lab = thread_labels(trace, p[pick][ok], tt[pick][ok].astype(np.int64))
            for k, v in zip(np.flatnonzero(ok).tolist(), lab):
                labels[k] = v
    out = []
    for k, i in enumerate(pick):
        d: dict[str, Any] = {"what": what[i] if isinstance(what, (list, np.ndarray)) else what,
                             "start_ns": int(s[i]), "duration_ns": int(e[i] - s[i])}
        if labels is not None and labels[k] is not None:
            d["thread"] = labels[k]
        if device is not None and stream is not None:
            d["stream"] = stream_label(p[i], np.asarray(device)[i], np.asarray(stream)[i])
        out.append(d)
    return sorted(out, key=lambda x: x["start_ns"])
