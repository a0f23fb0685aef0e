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
    "launches", "op_table", "stream_label", "stream_labels", "thread_label", "thread_labels", "norm_name", "share", "r",
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


def op_table(trace: Trace, what: Iterable[str] = ("kernel", "memcpy", "memset", "graph")) -> pd.DataFrame:
    """GPU operations of the requested kinds in one frame (``Trace.gpu_activity`` columns
    plus ``row``: the index in the source table)."""
    cols = ["start", "end", "pid", "device", "stream", "correlation"]
    src = {"kernel": trace.kernels, "memcpy": trace.memcpys, "memset": trace.memsets, "graph": trace.graphs}
    parts = []
    for w in what:
        df = src[w]
        if len(df):
            p = df[cols].copy()
            p["what"] = w
            p["row"] = np.arange(len(df))
            parts.append(p)
    if not parts:
        out = pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
        out["what"] = pd.Series(dtype="object")
        out["row"] = pd.Series(dtype="int64")
        return out
    return pd.concat(parts, ignore_index=True)


def launches(trace: Trace, what: Iterable[str] = ("kernel", "memcpy", "memset", "graph")) -> pd.DataFrame:
    """GPU operations joined to the CPU API call that issued them, on ``(pid, correlation)``.

    Returns the :func:`op_table` columns plus ``tid``, ``api_start``, ``api_end``,
    ``api_name`` (and ``callsite`` when the trace has backtraces) (inner join: operations without a launch call in the trace are dropped,
    e.g. work launched before the profiler window opened). When several API rows share a
    ``(pid, correlation)`` the earliest-starting one (the outermost call) is used.
    """
    ops = op_table(trace, what)
    api = trace.api
    if len(ops) == 0 or len(api) == 0:
        out = ops.iloc[:0].copy()
        for c in ("tid", "api_start", "api_end"):
            out[c] = pd.Series(dtype="int64")
        out["api_name"] = pd.Series(dtype="object")
        return out
    cols = ["pid", "correlation", "tid", "start", "end", "name"] + (["callsite"] if "callsite" in api.columns else [])
    a = api.loc[api["correlation"] != 0, cols]
    if a["correlation"].duplicated().any() or a.duplicated(["pid", "correlation"]).any():
        a = a.sort_values("start", kind="stable").drop_duplicates(["pid", "correlation"], keep="first")
    a = a.rename(columns={"start": "api_start", "end": "api_end", "name": "api_name"})
    ops = ops[ops["correlation"] != 0]
    return ops.merge(a, on=["pid", "correlation"], how="inner")


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
    pairs, inv = np.unique(np.stack([p, q], axis=1), axis=0, return_inverse=True)
    labels = []
    for a, b in pairs:
        n = names.get((int(a), int(b)))
        if isinstance(n, str):  # Kineto names threads "thread <tid> (<comm>)": keep <comm>
            m = _KINETO_THREAD_NAME.fullmatch(n)
            n = m.group(1) if m and int(m.group(0).split()[1]) == int(b) else n
        base = f"pid {int(a)} tid {int(b)}"
        labels.append(f"{base} ({n})" if isinstance(n, str) and n else base)
    return [labels[i] for i in np.asarray(inv).ravel()]


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
