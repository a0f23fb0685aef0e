"""GPU operations in one table, and the CPU call that launched each.

Built once per trace and shared by every analyzer (the trace is read-only to them):
:func:`op_table` concatenates kernels, copies, memsets and graph executions;
:func:`op_api_rows` finds, for each operation, the API call with the same ``(pid,
correlation)`` (one int64 key per pair and a binary search, not a hash join of frames);
:func:`launches` is the inner join as a frame.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

import numpy as np
import pandas as pd

from ..model import Trace
from ._arrays import code_spans, merge_intervals, pair_codes

__all__ = ["OP_KINDS", "op_table", "op_api_rows", "launches", "cached", "api_thread_spans",
           "api_keys_in", "what_is", "DeviceBusy", "device_busy", "timeline_edges"]

#: the kinds of GPU operation, in op_table's default order
OP_KINDS = ("kernel", "memcpy", "memset", "graph")
#: ``what`` is a categorical with these categories (sorted, so it sorts like the strings)
_WHAT_CATS = pd.Index(sorted(OP_KINDS), dtype=object)
_OP_COLS = ["start", "end", "pid", "device", "stream", "correlation"]
_KEY_BITS = 40  # correlation ids are 32-bit in CUPTI; pids fit in 23 bits on Linux


def cached(trace: Trace, name: str, make: Any) -> Any:
    """The tables several analyzers build, once per trace (:meth:`Trace.derived`)."""
    return trace.derived(name, make)


def _build_op_table(trace: Trace, what: Iterable[str]) -> pd.DataFrame:
    src = {"kernel": trace.kernels, "memcpy": trace.memcpys, "memset": trace.memsets, "graph": trace.graphs}
    parts = [(w, src[w]) for w in what if len(src[w])]
    if not parts:
        out = pd.DataFrame({c: pd.Series(dtype="int64") for c in _OP_COLS})
        out["what"] = pd.Series(dtype="object")
        out["row"] = pd.Series(dtype="int64")
        return out
    cols: dict[str, Any] = {c: np.concatenate([df[c].to_numpy(np.int64) for _, df in parts]) for c in _OP_COLS}
    codes = np.concatenate([np.full(len(df), _WHAT_CATS.get_loc(w), dtype=np.int8) for w, df in parts])
    cols["what"] = pd.Categorical.from_codes(codes, categories=_WHAT_CATS)
    cols["row"] = np.concatenate([np.arange(len(df)) for _, df in parts])
    return pd.DataFrame(cols, copy=False)


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


def op_table(trace: Trace, what: Iterable[str] = OP_KINDS) -> pd.DataFrame:
    """GPU operations of the requested kinds in one frame (``Trace.gpu_activity`` columns
    plus ``row``: the index in the source table). ``what`` is categorical."""
    what = tuple(what)
    full = cached(trace, "ops", lambda: _build_op_table(trace, OP_KINDS))
    sub = _subset(full, what)
    return sub if sub is not None else _build_op_table(trace, what)


def op_api_rows(trace: Trace) -> np.ndarray:
    """For each row of the full :func:`op_table`, the row of ``trace.api`` that launched
    it (same ``(pid, correlation)``, correlation not 0), -1 where none. When several API
    rows share a key the earliest-starting one (the outermost call) wins, then table order."""
    return cached(trace, "op_api_rows", lambda: _api_rows_for(trace, op_table(trace)))


def _api_rows_for(trace: Trace, ops: pd.DataFrame) -> np.ndarray:
    out = np.full(len(ops), -1, dtype=np.int64)
    api = trace.api
    if not len(ops) or not len(api):
        return out
    corr = ops["correlation"].to_numpy(np.int64)
    nz = corr != 0
    every = bool(nz.all())  # (the usual case: no gathers, no boolean indexing below)
    at = None if every else np.flatnonzero(nz)
    idx = _api_index(trace)
    pid = ops["pid"].to_numpy(np.int64)
    k = (_pid_corr_key(pid, corr) if at is None else _pid_corr_key(pid[at], corr[at])) if idx is not None else None
    if k is None or idx is None:  # a key does not fit in one int64: the hash join
        return _api_rows_merge(api, ops, np.arange(len(corr)) if at is None else at, out)
    keys, rows = idx
    if len(keys):
        pos = np.searchsorted(keys, k)
        np.minimum(pos, len(keys) - 1, out=pos)
        hit = keys[pos] == k
        found = pos if rows is None else rows[pos]
        if at is None:
            return np.where(hit, found, out)
        out[at[hit]] = found[hit]
    return out


def _api_rows_merge(api: pd.DataFrame, ops: pd.DataFrame, at: np.ndarray, out: np.ndarray) -> np.ndarray:
    a = api.loc[api["correlation"] != 0, ["pid", "correlation", "start"]]
    a = a.assign(_row=np.flatnonzero((api["correlation"] != 0).to_numpy()))
    if a.duplicated(["pid", "correlation"]).any():
        a = a.sort_values("start", kind="stable").drop_duplicates(["pid", "correlation"], keep="first")
    o = ops[["pid", "correlation"]].iloc[at].assign(_at=at)
    m = o.merge(a[["pid", "correlation", "_row"]], on=["pid", "correlation"], how="inner")
    out[m["_at"].to_numpy()] = m["_row"].to_numpy()
    return out


def _pid_corr_key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray | None:
    """``pid << 40 | correlation`` when every pair fits, else None (use the hash join)."""
    if len(pid) and (pid.min() < 0 or pid.max() >= 1 << (63 - _KEY_BITS)
                     or corr.min() < 0 or corr.max() >= 1 << _KEY_BITS):
        return None
    key = np.left_shift(pid, _KEY_BITS)
    return np.bitwise_or(key, corr, out=key)


def _api_index(trace: Trace) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Sorted unique ``(pid, correlation)`` keys of the API calls with a correlation and,
    for each, the row of its earliest-starting call (first in table order on ties), as
    the hash join would pick it (rows None: the keys are the table's own rows, in order);
    None when a key does not fit in one int64."""
    api = trace.api
    corr = api["correlation"].to_numpy(np.int64)
    pid = api["pid"].to_numpy(np.int64)
    nz = corr != 0
    rows = None if nz.all() else np.flatnonzero(nz)
    key = _pid_corr_key(pid, corr) if rows is None else _pid_corr_key(pid[rows], corr[rows])
    if key is None:
        return None
    if len(key) < 2 or bool((key[1:] > key[:-1]).all()):  # distinct and sorted already (one process)
        return key, rows
    order = np.argsort(key, kind="stable")  # nearly sorted already: correlation ids grow with time
    ks = key[order]
    first = np.ones(len(ks), dtype=bool)
    first[1:] = ks[1:] != ks[:-1]
    if first.all():  # distinct keys (the usual case): no boolean indexing
        return ks, (order if rows is None else rows[order])
    rows = np.arange(len(corr)) if rows is None else rows
    # shared keys: the earliest start wins, then table order
    st = api["start"].to_numpy()[rows]
    if len(st) > 1 and not (st[1:] >= st[:-1]).all():  # table not in time order
        order = np.lexsort((st, key))
    ks = key[order]
    first[1:] = ks[1:] != ks[:-1]
    return ks[first], rows[order[first]]


def what_is(ops: pd.DataFrame, *kinds: str) -> np.ndarray:
    """Which rows of an :func:`op_table` frame are of one of ``kinds`` (bool per row)."""
    w = ops["what"]
    if not isinstance(w.dtype, pd.CategoricalDtype):
        return w.isin(list(kinds)).to_numpy(bool)
    return np.isin(w.cat.codes.to_numpy(), [_WHAT_CATS.get_loc(k) for k in kinds])


class DeviceBusy(NamedTuple):
    """One device's window (first start, last end of any GPU operation) and the union of
    its kernel and graph-execution intervals (sorted, disjoint)."""

    device: int
    first: int
    last: int
    busy_start: np.ndarray
    busy_end: np.ndarray


def device_busy(trace: Trace) -> list[DeviceBusy]:
    """:class:`DeviceBusy` of every device, in device order."""
    return cached(trace, "device_busy", lambda: _device_busy(op_table(trace)))


def _device_busy(ops: pd.DataFrame) -> list[DeviceBusy]:
    if not len(ops):
        return []
    dev = ops["device"].to_numpy(np.int64)
    start, end = ops["start"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    busy = what_is(ops, "kernel", "graph")
    out = []
    for d in np.sort(pd.unique(dev)):
        m = dev == d
        mb = m & busy
        ms, me = merge_intervals(start[mb], end[mb])
        out.append(DeviceBusy(int(d), int(start[m].min()), int(end[m].max()), ms, me))
    return out


def timeline_edges(trace: Trace, bins: int) -> np.ndarray:
    """``bins`` equal bins (ns edges, rounded) from the first to the last GPU operation."""
    parts = device_busy(trace)
    lo, hi = min(p.first for p in parts), max(p.last for p in parts)
    return np.linspace(lo, hi, max(1, int(bins)) + 1).round().astype(np.int64)


def api_thread_spans(trace: Trace) -> pd.DataFrame:
    """Per CPU thread ``(pid, tid)`` of the API table (sorted): its first call start ``lo``
    and last call end ``hi``, as ``api.groupby(["pid", "tid"]).agg(min start, max end)``."""
    def make() -> pd.DataFrame:
        api = trace.api
        codes, pid, tid = pair_codes(api["pid"].to_numpy(np.int64), api["tid"].to_numpy(np.int64))
        lo, hi = code_spans(codes, len(pid), api["start"].to_numpy(), api["end"].to_numpy())
        index = pd.MultiIndex.from_arrays([pid, tid], names=["pid", "tid"])
        return pd.DataFrame({"lo": lo, "hi": hi}, index=index).sort_index()
    return cached(trace, "api_thread_spans", make)


def api_keys_in(trace: Trace, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """Which API rows have one of the given ``(pid, correlation)`` pairs (bool per row)."""
    api = trace.api
    apid, acorr = api["pid"].to_numpy(np.int64), api["correlation"].to_numpy(np.int64)
    want = _pid_corr_key(np.asarray(pid, np.int64), np.asarray(corr, np.int64))
    have = _pid_corr_key(apid, acorr) if want is not None else None
    if have is None or want is None:
        keys = pd.MultiIndex.from_arrays([np.asarray(pid, np.int64), np.asarray(corr, np.int64)])
        return np.asarray(pd.MultiIndex.from_arrays([apid, acorr]).isin(keys), bool)
    return np.isin(have, np.unique(want))


def launches(trace: Trace, what: Iterable[str] = OP_KINDS) -> pd.DataFrame:
    """GPU operations joined to the CPU API call that issued them, on ``(pid, correlation)``.

    Returns the :func:`op_table` columns plus ``tid``, ``api_start``, ``api_end``,
    ``api_name`` (and ``callsite`` when the trace has backtraces) (inner join: operations
    without a launch call in the trace are dropped, e.g. work launched before the
    profiler window opened), in op_table order. When several API rows share a
    ``(pid, correlation)`` the earliest-starting one (the outermost call) is used.
    """
    what = tuple(what)
    full = cached(trace, "launches", lambda: _launches(trace, op_table(trace), op_api_rows(trace)))
    sub = _subset(full, what)
    if sub is not None:
        return sub
    ops = op_table(trace, what)
    return _launches(trace, ops, _api_rows_for(trace, ops))


def _launches(trace: Trace, ops: pd.DataFrame, api_rows: np.ndarray) -> pd.DataFrame:
    api = trace.api
    hit = api_rows >= 0
    if not hit.any():
        out = ops.iloc[:0].copy()
        for c in ("tid", "api_start", "api_end"):
            out[c] = pd.Series(dtype="int64")
        out["api_name"] = pd.Series(dtype="object")
        return out
    out = ops[hit].reset_index(drop=True) if not hit.all() else ops.copy(deep=False)
    src = api_rows[hit]
    out["tid"] = api["tid"].to_numpy()[src]
    out["api_start"] = api["start"].to_numpy()[src]
    out["api_end"] = api["end"].to_numpy()[src]
    out["api_name"] = api["name"].take(src).reset_index(drop=True) if len(api) else pd.Series(dtype="object")
    if "callsite" in api.columns and len(api):
        out["callsite"] = api["callsite"].take(src).reset_index(drop=True)
    return out
