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
           "gaps_containing", "report", "settle_shared_causes", "ROOT_CAUSE_ORDER", "claims_within"]


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


#: Which finding names the root cause when several count the same idle gap: the first in
#: this order keeps the shared time, the others only what is left. The specific causes come
#: first (memory management, input loading, syncs and copies that make the host wait for
#: the GPU, threads on one stream, one slow step, the optimizer's and the embedding
#: lookups' many launches), the general symptom (the GPU waits for launches) after
#: them, and the remedies for that symptom (graphs, fewer short kernels) last. A gap that
#: only a blocking copy's return leaves idle goes to ``memcpy-ping-pong`` before
#: ``sync-api`` (the copy is the cause; see ``sync_api._claims``).
ROOT_CAUSE_ORDER = ("allocator-churn", "input-stall", "sync-api", "memcpy-ping-pong", "stream-contention",
                    "step-variance", "optimizer-unfused", "embedding-bound", "launch-bound", "graph-candidate",
                    "short-kernels")


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


def settle_shared_causes(findings: list[Finding], window_ns: int, options: Options) -> None:
    """Count every idle gap once. Each gap's idle time is handed out in
    :data:`ROOT_CAUSE_ORDER` (a claim with a ``root`` ranks just after that finding), each
    finding taking what it claims of the gap up to what is left of it. A finding that gets
    less than it claimed shares a cause with the one that took the gap first: both say so
    (``evidence["shared_cause_with"]``, the shared idle ns, a sentence in the
    recommendation), and its recoverable time keeps only what it got (plus its part that is
    not idle time, e.g. the copy time saved by merging copies); its severity follows again.
    The recoverable times of the idle findings then add up to at most the idle time."""
    claimers = [f for f in findings if f.claims is not None and len(f.claims)]
    if len(claimers) >= 2:
        wanted, got, lost = _hand_out(claimers)
        for i, f in enumerate(claimers):
            if lost[i]:
                _share_cause(f, claimers, lost[i], int(wanted[i]), int(got[i]), window_ns, options)
    for f in findings:
        f.claims = None
        _say_shared(f)


def _hand_out(claimers: list[Finding]) -> tuple[np.ndarray, np.ndarray, list[dict[int, int]]]:
    """Hand every claimed gap out in root-cause order: per claimer, the idle ns it claimed,
    the ns it got, and the ns it lost to each claimer that took a gap first. Dense arrays
    over the distinct gaps, one pass per (finding, root) group: no loop per gap."""
    order = {fid: i for i, fid in enumerate(ROOT_CAUSE_ORDER)}
    device, start, full_ns, want_all = (np.concatenate([f.claims[c].to_numpy(np.int64) for f in claimers])
                                        for c in ("device", "start", "full", "want"))
    code, n_gaps = _gap_codes(device, start)
    full = np.zeros(n_gaps, np.int64)
    full[code] = full_ns
    groups: list[tuple[float, int, np.ndarray]] = []
    at = 0
    for i, f in enumerate(claimers):
        n = len(f.claims)
        own = order.get(f.id, len(order))
        if "root" not in f.claims:  # one group, at the finding's own rank
            groups.append((own, i, at + np.arange(n)))
        else:
            rc, roots = pd.factorize(f.claims["root"].to_numpy(object))  # -1: the finding's own rank
            for k in np.unique(rc):
                rank = own if k < 0 else order.get(str(roots[k]), own - 1) + 0.5
                groups.append((rank, i, at + np.flatnonzero(rc == k)))
        at += n
    left, first = full.copy(), np.full(full.size, -1, np.int64)
    wanted, got = np.zeros(len(claimers), np.int64), np.zeros(len(claimers), np.int64)
    lost: list[dict[int, int]] = [{} for _ in claimers]
    for _, i, rows in sorted(groups, key=lambda g: (g[0], g[1])):
        gid, inv, by = _group_by_code(code[rows])  # (a gap claimed twice by one finding: once)
        w = np.minimum(np.bincount(inv, weights=want_all[rows][by]).astype(np.int64), full[gid])
        g = np.minimum(w, left[gid])
        left[gid] -= g
        short = w > g
        for o, ns in zip(*_sums(first[gid][short], (w - g)[short])):
            lost[i][o] = lost[i].get(o, 0) + ns
        first[gid[(first[gid] < 0) & (g > 0)]] = i
        wanted[i] += int(w.sum())
        got[i] += int(g.sum())
    return wanted, got, lost


def _gap_codes(device: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, int]:
    """A code per claim for its gap (``device``, ``start``), ``0..n_gaps-1`` in gap order,
    and the number of distinct gaps. A sort, not a hash: each finding's claims come in gap
    order, so the stable sort only merges a few sorted runs."""
    if device.size == 0:
        return device, 0
    o = np.lexsort((start, device))
    d, s = device[o], start[o]
    new = np.empty(o.size, dtype=bool)
    new[0] = True
    new[1:] = (d[1:] != d[:-1]) | (s[1:] != s[:-1])
    code = np.empty(o.size, np.int64)
    code[o] = np.cumsum(new) - 1
    return code, int(np.count_nonzero(new))


def _group_by_code(code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct codes (ascending), each row's index among them (in the order ``o``) and
    that order: a stable sort of the rows by code (quick on codes that come ascending)."""
    o = np.argsort(code, kind="stable")
    c = code[o]
    new = np.empty(c.size, dtype=bool)
    new[:1] = True
    new[1:] = c[1:] != c[:-1]
    return c[new], np.cumsum(new) - 1, o


def _sums(keys: np.ndarray, values: np.ndarray) -> tuple[list[int], list[int]]:
    """Sum of ``values`` per distinct ``key``."""
    u, inv = np.unique(keys, return_inverse=True)
    return u.tolist(), np.bincount(inv, weights=values, minlength=u.size).astype(np.int64).tolist()


def _share_cause(f: Finding, claimers: list[Finding], lost: dict[int, int], wanted: int, got: int,
                 window_ns: int, options: Options) -> None:
    """``f`` claimed idle time that other claimers counted first (``lost``: claimer index
    -> ns): record it on both sides (:func:`_say_shared` words it) and take that time out of
    ``f``'s recoverable time."""
    rec = int(f.recoverable_ns or 0)
    other = max(0, rec - wanted)  # the part that is not these gaps (e.g. copy time)
    for o, ns in lost.items():
        first = claimers[o]
        for a, b, key in ((first, f, "also_counted_by"), (f, first, "counted_under")):
            ev = a.evidence
            ev["shared_cause_with"] = sorted(set(ev.get("shared_cause_with", [])) | {b.id})
            d = ev.setdefault("shared_idle_ns", {}).setdefault(key, {})
            d[b.id] = int(d.get(b.id, 0)) + int(ns)
    finish(f, other + min(rec - other, got), window_ns, options)


def _say_shared(f: Finding) -> None:
    """One sentence on the finding's shared cause, at the end of its recommendation."""
    sh = f.evidence.get("shared_idle_ns") or {}
    parts = []
    under = sh.get("counted_under") or {}
    if under:
        parts.append(f"{sum(under.values()) / 1e6:.2f} ms of what it claimed is counted under " + ", ".join(sorted(under)))
    also = sh.get("also_counted_by") or {}
    if also:  # (each of those claims part of the same time: their largest, not their sum)
        parts.append(f"up to {max(also.values()) / 1e6:.2f} ms of its own is also claimed by " + ", ".join(sorted(also)))
    if parts:
        f.recommendation = (f"{f.recommendation.rstrip()} Shared cause with {', '.join(f.evidence['shared_cause_with'])}: "
                            f"the same idle gaps, each counted once, under the finding that names the root cause ("
                            + "; ".join(parts) + ").")


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
