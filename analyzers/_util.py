"""Shared numeric helpers for the analyzers: interval unions, coverage, the CPU-GPU join.

Everything here is vectorized with numpy/pandas: the biggest traces have ~10^5 rows per
table and all analyzers together must stay well under a second.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..model import Trace
from ._arrays import code_order, merge_intervals, pair_codes
from ._ops import OP_KINDS, launches, op_api_rows, op_table

__all__ = [
    "merge_intervals", "union_length", "coverage_at", "covered_in_bins", "intersect_length",
    "launches", "op_table", "op_api_rows", "take_str", "str_is", "per_value", "per_key", "str_contains", "OP_KINDS",
    "group_codes", "pair_codes", "stream_label", "stream_labels", "stream_label_codes", "thread_label", "thread_labels",
    "thread_label_codes", "norm_name", "share", "r",
    "SYNC_RE", "BLOCKING_COPY_RE", "GRAPH_LAUNCH_RE",
]

#: CPU calls that block the calling thread until the GPU catches up.
SYNC_RE = re.compile(r"Synchronize")
#: Copies without ``Async`` in the name block the host (synchronous with respect to it).
BLOCKING_COPY_RE = re.compile(r"^(?:cuda|cu|hip)Memcpy(?!.*Async)")
#: Launching a CUDA graph.
GRAPH_LAUNCH_RE = re.compile(r"^(?:cuda|cu|hip)GraphLaunch")


def union_length(start: Any, end: Any) -> int:
    """Length (ns) of the union of intervals."""
    ms, me = merge_intervals(start, end)
    return int((me - ms).sum())


def coverage_at(ms: np.ndarray, me: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Covered length of disjoint sorted intervals up to each time ``t`` (the covered
    length inside ``[a, b)`` is ``coverage_at(b) - coverage_at(a)``)."""
    if ms.size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(me - ms)))
    i = np.searchsorted(ms, t, side="right") - 1
    out = np.zeros(t.shape, dtype=np.int64)
    ok = i >= 0
    ii = i[ok]
    out[ok] = cum[ii] + np.minimum(t[ok], me[ii]) - ms[ii]
    return out


def covered_in_bins(ms: np.ndarray, me: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Covered length (ns) of disjoint sorted intervals inside each bin of ``edges``."""
    return np.diff(coverage_at(ms, me, np.asarray(edges, dtype=np.int64)))


def intersect_length(ms: np.ndarray, me: np.ndarray, lo: int, hi: int) -> int:
    """Covered length of disjoint sorted intervals inside ``[lo, hi)``."""
    c = coverage_at(ms, me, np.array([lo, hi], dtype=np.int64))
    return int(c[1] - c[0])


def take_str(s: pd.Series, rows: Any = None) -> np.ndarray:
    """``s.to_numpy(object)[rows]`` (missing values NaN), converting only the rows taken:
    for a categorical, one Python object per distinct value, not per row."""
    if not isinstance(s.dtype, pd.CategoricalDtype):
        v = s.to_numpy(object)
        return v if rows is None else v[rows]
    codes = s.cat.codes.to_numpy()
    if rows is not None:
        codes = codes[rows]
    vals = np.append(np.asarray(s.cat.categories, dtype=object), np.nan)
    return vals[codes]


def str_is(s: pd.Series, value: str, rows: Any = None) -> np.ndarray:
    """``take_str(s, rows) == value`` (bool per row): for a categorical, a compare of the
    integer codes, no Python object per row."""
    if not isinstance(s.dtype, pd.CategoricalDtype):
        return np.asarray(take_str(s, rows) == value, dtype=bool)
    codes = s.cat.codes.to_numpy()
    if rows is not None:
        codes = codes[rows]
    hit = np.flatnonzero(np.asarray(s.cat.categories, dtype=object) == value)
    return codes == hit[0] if hit.size else np.zeros(codes.shape, dtype=bool)


def per_value(s: pd.Series, fn: Callable[[Any], Any], rows: Any = None) -> np.ndarray:
    """``[fn(v) for v in take_str(s, rows)]`` as an object array: for a categorical, ``fn``
    runs once per distinct value (and once on NaN for a missing one), not once per row."""
    if not isinstance(s.dtype, pd.CategoricalDtype):
        out = np.empty(len(s), dtype=object)
        out[:] = [fn(v) for v in s.to_numpy(object)]
        return out if rows is None else out[rows]
    cats = s.cat.categories.to_numpy(object)
    vals = np.empty(len(cats) + 1, dtype=object)
    vals[:-1] = [fn(v) for v in cats]
    vals[-1] = fn(np.nan)  # code -1
    codes = s.cat.codes.to_numpy()
    return vals[codes if rows is None else codes[rows]]


def per_key(keys: Any, mapping: dict[int, Any], default: Any = 0) -> np.ndarray:
    """``[mapping.get(k, default) for k in keys]`` as an array, by one lookup per distinct key."""
    k = np.asarray(keys, dtype=np.int64)
    uniq, inv = np.unique(k, return_inverse=True)
    return np.array([mapping.get(int(u), default) for u in uniq])[inv.reshape(-1)] if k.size else np.zeros(0)


def str_contains(s: pd.Series, pat: Any, regex: bool = True) -> pd.Series:
    """``s.astype(str).str.contains(pat)`` as a bool Series (missing -> False), evaluated
    once per distinct value when ``s`` is categorical (the trace model's string columns),
    so a 10-million-row API table costs one regex per distinct name, not per call."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        cats = s.cat.categories
        if regex:
            rx = pat if isinstance(pat, re.Pattern) else re.compile(pat)
            hit = [rx.search(str(c)) is not None for c in cats]
        else:
            hit = [pat in str(c) for c in cats]
        m = np.append(np.array(hit, dtype=bool), False)[s.cat.codes.to_numpy()]
        return pd.Series(m, index=s.index)
    return s.astype(str).str.contains(pat, regex=regex).fillna(False).astype(bool)


def busy_by_key(ops: pd.DataFrame, *columns: str) -> tuple[list[tuple], list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """The rows of ``ops`` (``start``/``end`` and ``columns``) grouped by ``columns``: each
    group's key, its merged busy intervals and their total length (ns), in key order."""
    codes, keys = group_codes(*(ops[c].to_numpy(np.int64) for c in columns))
    order = code_order(codes, len(keys))
    bounds = np.searchsorted(codes[order], np.arange(len(keys) + 1))
    s, e = ops["start"].to_numpy(np.int64)[order], ops["end"].to_numpy(np.int64)[order]
    merged = [merge_intervals(s[a:b], e[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return keys, merged, np.array([int((me - ms).sum()) for ms, me in merged], dtype=np.int64)


def busy_together(merged: list[tuple[np.ndarray, np.ndarray]], busy: np.ndarray, idx: list[int]) -> tuple[int, int]:
    """``(sum of the groups' busy time, busy time of their union)`` for the groups ``idx`` of
    :func:`busy_by_key`: the first minus the second is the time two or more ran at once."""
    ms, me = merge_intervals(np.concatenate([merged[i][0] for i in idx]), np.concatenate([merged[i][1] for i in idx]))
    return int(busy[idx].sum()), int((me - ms).sum())


def stream_label(pid: Any, device: Any, stream: Any) -> str:
    return f"pid {int(pid)} dev {int(device)} stream {int(stream)}"


_KINETO_THREAD_NAME = re.compile(r"thread \d+ \((.*)\)")


def thread_label(trace: Trace, pid: Any, tid: Any) -> str:
    """``pid P tid T (name)`` for one thread."""
    return thread_labels(trace, [pid], [tid])[0]


def thread_labels(trace: Trace, pids: Any, tids: Any) -> list[str]:
    """Vectorized :func:`thread_label`: names are looked up once per distinct thread."""
    codes, labels = thread_label_codes(trace, pids, tids)
    return labels[codes].tolist()


def group_codes(*cols: Any) -> tuple[np.ndarray, list[tuple]]:
    """Rows grouped by several integer columns, as ``groupby(cols, sort=True)`` numbers
    them: (group of each row, the key of each group in sorted order), with one hash pass
    per column and no tuple per row (one pass in all where the columns' ranges pack into
    one int64: the usual pids, devices, streams and thread ids)."""
    packed = _packed_key(cols)
    if packed is not None:
        key, lows, widths = packed
        codes, ukeys = pd.factorize(key, sort=True)
        rest = np.asarray(ukeys, dtype=np.int64)
        parts = []
        for lo, w in zip(reversed(lows), reversed(widths)):
            parts.append(rest % w + lo)
            rest = rest // w
        return codes, list(zip(*[p.tolist() for p in reversed(parts)]))
    key = np.zeros(len(cols[0]), dtype=np.int64)
    uniqs = []
    for c in cols:
        f, u = pd.factorize(np.asarray(c), sort=True)
        key = key * max(len(u), 1) + f
        uniqs.append(np.asarray(u))
    codes, ukeys = pd.factorize(key, sort=True)
    parts = []
    rest = np.asarray(ukeys, dtype=np.int64)
    for u in reversed(uniqs):
        parts.append(u[rest % max(len(u), 1)])
        rest = rest // max(len(u), 1)
    return codes, list(zip(*[p.tolist() for p in reversed(parts)]))


def _packed_key(cols: tuple[Any, ...]) -> tuple[np.ndarray, list[int], list[int]] | None:
    """Integer columns packed into one int64 key in mixed radix, whose order is the
    columns' lexicographic order: (key, each column's minimum, each column's width);
    None when a column is not integer or the ranges do not fit in 62 bits."""
    arrs = [np.asarray(c) for c in cols]
    if not len(arrs[0]) or any(a.dtype.kind not in "iu" for a in arrs):
        return None
    lows, widths, span = [], [], 1
    for a in arrs:
        lo, hi = int(a.min()), int(a.max())
        w = hi - lo + 1
        span *= w
        if span >= 1 << 62:
            return None
        lows.append(lo)
        widths.append(w)
    key = np.zeros(len(arrs[0]), dtype=np.int64)
    for a, lo, w in zip(arrs, lows, widths):
        key *= w
        key += a.astype(np.int64, copy=False)
        key -= lo
    return key, lows, widths


def thread_label_codes(trace: Trace, pids: Any, tids: Any) -> tuple[np.ndarray, np.ndarray]:
    """(code of each row, label of each distinct thread): :func:`thread_labels` without a
    Python string per row (what :func:`~._attribution.where_shares` takes)."""
    t = trace.threads
    names: dict[tuple[int, int], Any] = {}
    if len(t):
        tt = t.drop_duplicates(["pid", "tid"], keep="last")
        names = {(int(p), int(i)): n for p, i, n in zip(tt["pid"], tt["tid"], tt["name"])}
    p = np.asarray(pids, dtype=np.int64)
    q = np.asarray(tids, dtype=np.int64)
    if p.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, dtype=object)
    inv, pa, pb = pair_codes(p, q)
    labels = []
    for a, b in zip(pa.tolist(), pb.tolist()):
        n = names.get((a, b))
        if isinstance(n, str):  # Kineto names threads "thread <tid> (<comm>)": keep <comm>
            m = _KINETO_THREAD_NAME.fullmatch(n)
            n = m.group(1) if m and int(m.group(0).split()[1]) == b else n
        base = f"pid {a} tid {b}"
        labels.append(f"{base} ({n})" if isinstance(n, str) and n else base)
    return inv, np.array(labels, dtype=object)


def stream_labels(pids: Any, devices: Any, streams: Any) -> list[str]:
    """Vectorized :func:`stream_label`."""
    codes, labels = stream_label_codes(pids, devices, streams)
    return labels[codes].tolist()


def stream_label_codes(pids: Any, devices: Any, streams: Any) -> tuple[np.ndarray, np.ndarray]:
    """(code of each row, label of each distinct stream), as :func:`thread_label_codes`."""
    p = np.asarray(pids, np.int64)
    if p.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, dtype=object)
    pair, up, ud = pair_codes(p, np.asarray(devices, np.int64))
    inv, which, us = pair_codes(pair, np.asarray(streams, np.int64))
    return inv, np.array([stream_label(up[i], ud[i], x) for i, x in zip(which.tolist(), us.tolist())], dtype=object)


_STEP_RE = re.compile(r"#\d+$")
#: per-instance fields PyTorch's ``emit_nvtx`` / ``record_shapes`` append to an op's range
#: name (``aten::mm, seq = 12, op_id = 318072, sizes = [[256, 64], [64, 64]]``)
_INSTANCE_RE = re.compile(r"\s*,\s*(?:seq|op_id|sizes|input_op_ids|stashed seq|stashed_seq)\s*=.*$")
_LONE_ID_RE = re.compile(r"^(op_id|seq)\s*=\s*\d+$")


def norm_name(name: Any) -> Any:
    """Group per-instance names by what they name: ``ProfilerStep#12`` ->
    ``ProfilerStep#*``, ``aten::view, op_id = 314290`` -> ``aten::view``, a bare
    ``op_id = 318072`` -> ``op_id = *``."""
    if isinstance(name, str):
        out = _INSTANCE_RE.sub("", name)
        out = _LONE_ID_RE.sub(r"\1 = *", out)
        return _STEP_RE.sub("#*", out or name)
    return name


def share(a: float, b: float) -> float | None:
    return None if not b else float(a) / float(b)


def r(x: Any, nd: int = 4) -> Any:
    """Round floats for JSON evidence (None stays None)."""
    if x is None:
        return None
    try:
        if np.isnan(x):
            return None
    except TypeError:
        return x
    return round(float(x), nd)
