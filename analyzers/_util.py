"""Shared numeric helpers for the analyzers: interval unions, coverage, the CPU-GPU join.

Everything here is vectorized with numpy/pandas: the biggest traces have ~10^5 rows per
table and all analyzers together must stay well under a second.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..model import Trace

__all__ = [
    "merge_intervals", "union_length", "covered_in_bins", "intersect_length",
    "launches", "op_table", "left_join_ops", "str_contains", "OP_KINDS", "stream_label", "stream_labels", "thread_label", "thread_labels", "norm_name", "share", "r",
    "SYNC_RE", "BLOCKING_COPY_RE", "GRAPH_LAUNCH_RE",
]

#: CPU calls that block the calling thread until the GPU catches up.
SYNC_RE = re.compile(r"Synchronize")
#: Copies without ``Async`` in the name block the host (synchronous with respect to it).
BLOCKING_COPY_RE = re.compile(r"^(?:cuda|cu|hip)Memcpy(?!.*Async)")
#: Launching a CUDA graph.
GRAPH_LAUNCH_RE = re.compile(r"^(?:cuda|cu|hip)GraphLaunch")


def merge_intervals(start: Any, end: Any) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals ``[start, end)`` as sorted disjoint (starts, ends) arrays.
    Touching intervals are merged."""
    s = np.asarray(start, dtype=np.int64)
    e = np.asarray(end, dtype=np.int64)
    if s.size == 0:
        return s[:0], e[:0]
    e = np.maximum(e, s)
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    cm = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > cm[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def union_length(start: Any, end: Any) -> int:
    """Length (ns) of the union of intervals."""
    ms, me = merge_intervals(start, end)
    return int((me - ms).sum())


def _coverage_at(ms: np.ndarray, me: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Covered length of disjoint sorted intervals up to each time ``t``."""
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
    return np.diff(_coverage_at(ms, me, np.asarray(edges, dtype=np.int64)))


def intersect_length(ms: np.ndarray, me: np.ndarray, lo: int, hi: int) -> int:
    """Covered length of disjoint sorted intervals inside ``[lo, hi)``."""
    c = _coverage_at(ms, me, np.array([lo, hi], dtype=np.int64))
    return int(c[1] - c[0])


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


#: the kinds of GPU operation, in op_table's default order
OP_KINDS = ("kernel", "memcpy", "memset", "graph")
#: ``what`` is a categorical with these categories (sorted, so it sorts like the strings)
_WHAT_CATS = pd.Index(sorted(OP_KINDS), dtype=object)


def _build_op_table(trace: Trace, what: Iterable[str]) -> pd.DataFrame:
    cols = ["start", "end", "pid", "device", "stream", "correlation"]
    src = {"kernel": trace.kernels, "memcpy": trace.memcpys, "memset": trace.memsets, "graph": trace.graphs}
    parts = []
    for w in what:
        df = src[w]
        if len(df):
            p = df[cols].copy()
            p["what"] = pd.Categorical.from_codes(np.full(len(df), _WHAT_CATS.get_loc(w), dtype=np.int8),
                                                  categories=_WHAT_CATS)
            p["row"] = np.arange(len(df))
            parts.append(p)
    if not parts:
        out = pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
        out["what"] = pd.Series(dtype="object")
        out["row"] = pd.Series(dtype="int64")
        return out
    return pd.concat(parts, ignore_index=True)


def _subset(full: pd.DataFrame, what: tuple[str, ...]) -> pd.DataFrame | None:
    """Rows of a full (all kinds, default order) table for ``what``, if ``what`` keeps the
    default order (then the rows come out exactly as a table built for ``what`` would)."""
    if what == OP_KINDS:
        return full.copy(deep=False)
    pos = [OP_KINDS.index(w) for w in what if w in OP_KINDS]
    if len(pos) != len(what) or pos != sorted(pos):
        return None
    if not len(full) or not isinstance(full["what"].dtype, pd.CategoricalDtype):
        return full.iloc[:0].copy() if not len(full) else None
    keep = np.isin(full["what"].cat.codes.to_numpy(), [_WHAT_CATS.get_loc(w) for w in what])
    idx = np.flatnonzero(keep)
    if idx.size and idx[-1] - idx[0] + 1 == idx.size:  # one block: a slice, no copy
        return full.iloc[int(idx[0]): int(idx[-1]) + 1].reset_index(drop=True)
    return full[keep].reset_index(drop=True)


def _cached(trace: Trace, name: str, make: Any) -> Any:
    """A per-trace cache for the tables several analyzers build (the trace is read-only
    to analyzers); entries are keyed to the table objects they were built from."""
    cache = trace.__dict__.setdefault("_analysis_cache", {})
    key = (name, id(trace.kernels), id(trace.memcpys), id(trace.memsets), id(trace.graphs), id(trace.api))
    if key not in cache:
        cache[key] = make()
    return cache[key]


def op_table(trace: Trace, what: Iterable[str] = OP_KINDS) -> pd.DataFrame:
    """GPU operations of the requested kinds in one frame (``Trace.gpu_activity`` columns
    plus ``row``: the index in the source table). ``what`` is categorical."""
    what = tuple(what)
    full = _cached(trace, "ops", lambda: _build_op_table(trace, OP_KINDS))
    sub = _subset(full, what)
    return sub if sub is not None else _build_op_table(trace, what)


def left_join_ops(ops: pd.DataFrame, j: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """``ops.merge(j[["what", "row"] + cols], on=["what", "row"], how="left")`` for an
    :func:`op_table` frame and a :func:`launches` frame (unique ``(what, row)``): numeric
    columns come back as float64 with NaN where an operation has no launch call, others
    (names, call sites) with a missing value."""
    def key(df: pd.DataFrame) -> np.ndarray:
        w = df["what"]
        codes = (w.cat.codes.to_numpy().astype(np.int64) if isinstance(w.dtype, pd.CategoricalDtype)
                 else _WHAT_CATS.get_indexer(w.astype(object)).astype(np.int64))
        return (codes << 40) | df["row"].to_numpy(np.int64)

    out = ops.copy(deep=False)
    if not len(j):
        for c in cols:
            out[c] = np.full(len(ops), np.nan)
        return out
    kj = key(j)
    order = np.argsort(kj, kind="stable")
    ks = kj[order]
    ko = key(ops)
    pos = np.minimum(np.searchsorted(ks, ko), len(ks) - 1)
    hit = ks[pos] == ko
    src = order[pos]
    for c in cols:
        col = j[c]
        if pd.api.types.is_numeric_dtype(col.dtype) and not isinstance(col.dtype, pd.CategoricalDtype):
            v = col.to_numpy(dtype="float64", na_value=np.nan)
            out[c] = np.where(hit, v[src], np.nan)
        else:  # names, call sites: the value where there is a launch, missing elsewhere
            out[c] = col.take(src).reset_index(drop=True).where(pd.Series(hit))
    return out


def launches(trace: Trace, what: Iterable[str] = ("kernel", "memcpy", "memset", "graph")) -> pd.DataFrame:
    """GPU operations joined to the CPU API call that issued them, on ``(pid, correlation)``.

    Returns the :func:`op_table` columns plus ``tid``, ``api_start``, ``api_end``,
    ``api_name`` (and ``callsite`` when the trace has backtraces) (inner join: operations without a launch call in the trace are dropped,
    e.g. work launched before the profiler window opened). When several API rows share a
    ``(pid, correlation)`` the earliest-starting one (the outermost call) is used.
    """
    what = tuple(what)
    full = _cached(trace, "launches", lambda: _launches(trace, OP_KINDS))
    sub = _subset(full, what)
    return sub if sub is not None else _launches(trace, what)


def _launches(trace: Trace, what: tuple[str, ...]) -> pd.DataFrame:
    ops = op_table(trace, what)
    api = trace.api
    if len(ops) == 0 or len(api) == 0:
        out = ops.iloc[:0].copy()
        for c in ("tid", "api_start", "api_end"):
            out[c] = pd.Series(dtype="int64")
        out["api_name"] = pd.Series(dtype="object")
        return out
    ops = ops[ops["correlation"] != 0]
    idx = _api_index(trace)
    if idx is not None:
        # one int64 key per (pid, correlation): a binary search instead of a hash join
        keys, rows = idx
        k = _pid_corr_key(ops["pid"].to_numpy(), ops["correlation"].to_numpy())
        if k is not None:
            pos = np.minimum(np.searchsorted(keys, k), max(len(keys) - 1, 0))
            hit = (keys[pos] == k) if len(keys) else np.zeros(len(k), dtype=bool)
            src = rows[pos[hit]]
            out = ops[hit].reset_index(drop=True)
            out["tid"] = api["tid"].to_numpy()[src]
            out["api_start"] = api["start"].to_numpy()[src]
            out["api_end"] = api["end"].to_numpy()[src]
            out["api_name"] = api["name"].take(src).reset_index(drop=True)
            if "callsite" in api.columns:
                out["callsite"] = api["callsite"].take(src).reset_index(drop=True)
            return out
    cols = ["pid", "correlation", "tid", "start", "end", "name"] + (["callsite"] if "callsite" in api.columns else [])
    a = api.loc[api["correlation"] != 0, cols]
    if a["correlation"].duplicated().any() or a.duplicated(["pid", "correlation"]).any():
        a = a.sort_values("start", kind="stable").drop_duplicates(["pid", "correlation"], keep="first")
    a = a.rename(columns={"start": "api_start", "end": "api_end", "name": "api_name"})
    return ops.merge(a, on=["pid", "correlation"], how="inner")


_KEY_BITS = 40  # correlation ids are 32-bit in CUPTI; pids fit in 23 bits on Linux


def _pid_corr_key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray | None:
    """``pid << 40 | correlation`` when every pair fits, else None (use the hash join)."""
    pid = np.asarray(pid, dtype=np.int64)
    corr = np.asarray(corr, dtype=np.int64)
    if len(pid) and (pid.min() < 0 or pid.max() >= 1 << (63 - _KEY_BITS)
                     or corr.min() < 0 or corr.max() >= 1 << _KEY_BITS):
        return None
    return (pid << _KEY_BITS) | corr


def _api_index(trace: Trace) -> tuple[np.ndarray, np.ndarray] | None:
    """Sorted unique ``(pid, correlation)`` keys of the API calls with a correlation and,
    for each, the row of its earliest-starting call (first in table order on ties), as
    the hash join would pick it; None when a key does not fit in one int64."""
    api = trace.api
    corr = api["correlation"].to_numpy()
    rows = np.flatnonzero(corr != 0)
    key = _pid_corr_key(api["pid"].to_numpy()[rows], corr[rows])
    if key is None:
        return None
    order = np.argsort(key, kind="stable")  # nearly sorted already: correlation ids grow with time
    ks = key[order]
    first = np.ones(len(ks), dtype=bool)
    first[1:] = ks[1:] != ks[:-1]
    if not first.all():  # shared keys: the earliest start wins, then table order
        st = api["start"].to_numpy()[rows]
        if len(st) > 1 and not (st[1:] >= st[:-1]).all():  # table not in time order
            order = np.lexsort((st, key))
        ks = key[order]
        first[1:] = ks[1:] != ks[:-1]
    return ks[first], rows[order[first]]


def stream_label(pid: Any, device: Any, stream: Any) -> str:
    return f"pid {int(pid)} dev {int(device)} stream {int(stream)}"


_KINETO_THREAD_NAME = re.compile(r"thread \d+ \((.*)\)")


def thread_label(trace: Trace, pid: Any, tid: Any) -> str:
    """``pid P tid T (name)`` for one thread."""
    return thread_labels(trace, [pid], [tid])[0]


def thread_labels(trace: Trace, pids: Any, tids: Any) -> list[str]:
    """Vectorized :func:`thread_label`: names are looked up once per distinct thread."""
    t = trace.threads
    names: dict[tuple[int, int], Any] = {}
    if len(t):
        tt = t.drop_duplicates(["pid", "tid"], keep="last")
        names = {(int(p), int(i)): n for p, i, n in zip(tt["pid"], tt["tid"], tt["name"])}
    p = np.asarray(pids, dtype=np.int64)
    q = np.asarray(tids, dtype=np.int64)
    if p.size == 0:
        return []
    # distinct (pid, tid) pairs by factorizing each column, then their combination
    fp, up = pd.factorize(p)
    fq, uq = pd.factorize(q)
    inv, pair = pd.factorize(fp.astype(np.int64) * max(len(uq), 1) + fq)
    labels = []
    for code in pair:
        a, b = int(up[code // max(len(uq), 1)]), int(uq[code % max(len(uq), 1)])
        n = names.get((a, b))
        if isinstance(n, str):  # Kineto names threads "thread <tid> (<comm>)": keep <comm>
            m = _KINETO_THREAD_NAME.fullmatch(n)
            n = m.group(1) if m and int(m.group(0).split()[1]) == b else n
        base = f"pid {a} tid {b}"
        labels.append(f"{base} ({n})" if isinstance(n, str) and n else base)
    return np.array(labels, dtype=object)[inv].tolist()


def stream_labels(pids: Any, devices: Any, streams: Any) -> list[str]:
    """Vectorized :func:`stream_label`."""
    a = np.stack([np.asarray(pids, np.int64), np.asarray(devices, np.int64), np.asarray(streams, np.int64)], axis=1)
    if a.size == 0:
        return []
    u, inv = np.unique(a, axis=0, return_inverse=True)
    lab = [stream_label(*row) for row in u]
    return [lab[i] for i in np.asarray(inv).ravel()]


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
