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

import weakref
from typing import Any

import numpy as np
import pandas as pd

from ..findings import Finding, severity_for_recoverable
from ..model import Trace
from ..options import Options
from ._util import covered_in_bins, merge_intervals, op_table, stream_label, thread_labels

__all__ = ["steady_starts", "idle_gaps", "analysis_window", "steady_window", "finish", "examples",
           "gaps_containing"]


#: per live trace (by id, dropped when the trace is collected): results of the functions
#: below per options, so the analyzers that all need the gaps compute them once
_CACHE: dict[int, dict] = {}


def _cached(trace: Trace, key: tuple, make: Any) -> Any:
    tid = id(trace)
    if tid not in _CACHE:
        try:
            weakref.finalize(trace, _CACHE.pop, tid, None)
        except TypeError:  # pragma: no cover - not weak-referenceable: no caching
            return make()
        _CACHE[tid] = {}
    d = _CACHE[tid]
    if key not in d:
        d[key] = make()
    return d[key]


def steady_starts(trace: Trace, options: Options, ops: pd.DataFrame | None = None) -> dict[int, int]:
    """Per device, where its steady state starts: the later of
    ``Options.startup_fraction`` of its window and the first timeline bin (of
    ``Options.timeline_bins`` over the whole trace) whose busy fraction reaches half of
    the device's median non-empty bin."""
    return dict(_cached(trace, ("steady", options), lambda: _steady_starts(trace, options, ops)))


def _steady_starts(trace: Trace, options: Options, ops: pd.DataFrame | None) -> dict[int, int]:
    ops = op_table(trace) if ops is None else ops
    out: dict[int, int] = {}
    if len(ops) == 0:
        return out
    lo, hi = int(ops["start"].min()), int(ops["end"].max())
    nb = max(1, int(options.timeline_bins))
    edges = np.linspace(lo, hi, nb + 1).round().astype(np.int64)
    widths = np.maximum(np.diff(edges), 1).astype(float)
    busy_ops = ops[ops["what"].isin(["kernel", "graph"])]
    for dev, g in ops.groupby("device", sort=True):
        w0, w1 = int(g["start"].min()), int(g["end"].max())
        b = busy_ops[busy_ops["device"] == dev]
        ms, me = merge_intervals(b["start"].to_numpy(), b["end"].to_numpy())
        frac = covered_in_bins(ms, me, edges) / widths
        out[int(dev)] = steady_cut(frac, edges, w0, w1, options.startup_fraction)
    return out


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
    ops = op_table(trace)
    if len(ops) == 0:
        return 0
    st = steady_starts(trace, options, ops)
    ends = ops.groupby("device")["end"].max()
    return int(sum(max(0, int(e) - st.get(int(d), int(e))) for d, e in ends.items()))


def idle_gaps(trace: Trace, options: Options, ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """Idle gaps of every device: ``device, start, end, ns, what, row, pid, stream,
    steady`` - ``start`` is when the device went idle (end of all work before), ``end``
    when the operation (``what``, ``row``) that ended the gap started; ``steady`` is True
    when the gap lies after the device's steady-state start."""
    return _cached(trace, ("gaps", options), lambda: _idle_gaps(trace, options, ops)).copy()


def _idle_gaps(trace: Trace, options: Options, ops: pd.DataFrame | None) -> pd.DataFrame:
    ops = op_table(trace) if ops is None else ops
    cols = ["device", "start", "end", "ns", "what", "row", "pid", "stream", "steady"]
    if len(ops) == 0:
        return pd.DataFrame({c: [] for c in cols})
    st = steady_starts(trace, options, ops)
    parts = []
    for dev, g in ops.groupby("device", sort=True):
        g = g.sort_values(["start", "end"], kind="stable")
        s = g["start"].to_numpy(np.int64)
        e = g["end"].to_numpy(np.int64)
        cm = np.maximum.accumulate(e)
        gap = np.zeros(s.size, dtype=np.int64)
        gap[1:] = s[1:] - cm[:-1]
        idx = np.flatnonzero(gap > 0)
        parts.append(pd.DataFrame({
            "device": int(dev), "start": cm[idx - 1], "end": s[idx], "ns": gap[idx],
            "what": g["what"].to_numpy(object)[idx], "row": g["row"].to_numpy(np.int64)[idx],
            "pid": g["pid"].to_numpy(np.int64)[idx], "stream": g["stream"].to_numpy(np.int64)[idx],
            "steady": cm[idx - 1] >= st.get(int(dev), 0)}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in cols})


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


def finish(f: Finding, recoverable_ns: float, window_ns: int, options: Options) -> Finding:
    """Set the finding's recoverable time (capped at the window) and the severity that
    follows from its share of the window."""
    rec = int(max(0, min(float(recoverable_ns), float(window_ns))))
    share = rec / window_ns if window_ns > 0 else None
    f.recoverable_ns = rec
    f.recoverable_share = None if share is None else round(share, 4)
    f.severity = severity_for_recoverable(share, options.recoverable_high, options.recoverable_medium,
                                          options.recoverable_low)
    return f


def examples(trace: Trace, *, start: Any, end: Any, pid: Any, weight: Any = None, tid: Any = None,
             device: Any = None, stream: Any = None, what: str | list[str] = "", n: int = 3) -> list[dict[str, Any]]:
    """Up to ``n`` moments to look at, the heaviest first (``weight``, default the duration):
    ``{"what", "start_ns", "duration_ns", "thread", "stream"}`` on the trace's clock."""
    s = np.asarray(start, dtype=np.int64)
    e = np.asarray(end, dtype=np.int64)
    if s.size == 0 or n <= 0:
        return []
    w = (e - s) if weight is None else np.asarray(weight, dtype=float)
    pick = np.argsort(-w, kind="stable")[:n]
    p = np.asarray(pid, dtype=np.int64)
    labels = None
    if tid is not None:
        tt = np.asarray(tid, dtype=np.float64)
        ok = ~np.isnan(tt[pick])
        labels = [None] * pick.size
        if ok.any():
            lab = thread_labels(trace, p[pick][ok], tt[pick][ok].astype(np.int64))
            for k, v in zip(np.flatnonzero(ok), lab):
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
