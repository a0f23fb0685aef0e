"""Kineto columns -> the canonical tables (kernels, copies, memsets, API calls, syncs,
ranges), all on numpy arrays: string columns become categoricals from their codes, labels
that depend on a name (copy direction, sync type, ...) are worked out once per distinct
name."""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import pandas as pd

from ..model import COPY_KINDS, MEM_KINDS, SYNC_TYPES
from ._kineto_columns import EventColumns, int_col
from ._kineto_time import MISSING, BadTime

_COPY_TOKEN = re.compile(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP|HtoA|AtoH|AtoD|DtoA|AtoA)\b")
COPY_KIND_OF_TOKEN = {
    "HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "HtoH": "h2h", "PtoP": "p2p",
    "HtoA": "array", "AtoH": "array", "AtoD": "array", "DtoA": "array", "AtoA": "array",
}
_MEM_PAIR = re.compile(r"\(\s*(\w+)\s*->\s*(\w+)\s*\)")
_MEM_KIND_OF_WORD = {
    "pageable": "pageable", "pinned": "pinned", "device": "device", "array": "array",
    "managed": "managed",
    # ROCm writes "(Host -> Device)" without saying pageable or pinned.
    "host": "unknown",
}
_SYNC_TYPE_OF_NAME = {
    "Event Sync": "event",
    "Stream Wait Event": "stream_wait_event",
    "Stream Sync": "stream",
    "Context Sync": "context",
}
_GRAPH_LAUNCH = re.compile(r"^(cuda|cu|hip)GraphLaunch")
_SOURCES = ("cpu_op", "user_annotation")


def copy_kind_from_name(name: str) -> tuple[str, str, str]:
    """``(kind, src_mem, dst_mem)`` of a Kineto copy name such as
    ``"Memcpy HtoD (Pinned -> Device)"``: the direction is only in the name."""
    m = _COPY_TOKEN.search(name)
    kind = COPY_KIND_OF_TOKEN[m.group(1)] if m else "other"
    pm = _MEM_PAIR.search(name)
    if pm:
        src = _MEM_KIND_OF_WORD.get(pm.group(1).lower(), "unknown")
        dst = _MEM_KIND_OF_WORD.get(pm.group(2).lower(), "unknown")
    else:
        src = dst = "unknown"
    return kind, src, dst


class Tables:
    """The event tables of one trace. Times: ``start = ts - t0`` in ns (both exact, see
    :mod:`._kineto_time`) from the earliest ``ts`` among the loaded events (the profiler's
    own span excluded), ``end = start + dur`` (a missing or negative ``dur`` is 0); rows
    without a ``ts`` are dropped and counted. A window or an end beyond int64 ns is bad
    input (:class:`BadTime`)."""

    def __init__(self, cols: EventColumns) -> None:
        self.cols = cols
        self.values = cols.strings.values
        mins = [int(a[a != MISSING].min()) for b in cols.parts if b != "trace"
                for a in [cols.column(b, "ts")] if len(a) and (a != MISSING).any()]
        #: the earliest ts, in ns
        self.t0_ns: int | None = min(mins) if mins else None
        self.dropped = 0
        self.unmatched: dict[str, int] = {}

    def fresh(self) -> "Tables":
        """The same columns and origin, with counters of its own (dropped rows, unmatched
        GPU events) for a part of the tables built apart."""
        t = copy.copy(self)
        t.dropped, t.unmatched = 0, {}
        return t

    def range_pids(self) -> set[int]:
        """The processes of the ranges table's rows (those with a ``ts``), without building it."""
        out: set[int] = set()
        for bucket in _SOURCES:
            if self.cols.size(bucket):
                ts = self.cols.column(bucket, "ts")
                out.update(np.unique(int_col(self.cols.column(bucket, "pid")[ts != MISSING], -1)).tolist())
        return out

    def ns(self, bucket: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(start_ns, end_ns, valid)``: rows with a missing ts are invalid."""
        t0 = self.t0_ns if self.t0_ns is not None else 0
        ts, dur = self.cols.column(bucket, "ts"), self.cols.column(bucket, "dur")
        valid = ts != MISSING
        if valid.any() and int(ts[valid].max()) - t0 >= 2**63:
            raise BadTime(0, f"the {bucket} events' ts", f"{int(ts[valid].max()) / 1000} µs after the first")
        start = np.where(valid, ts, t0) - t0
        d = np.maximum(dur, 0)  # (missing: MISSING < 0)
        if (d > np.iinfo(np.int64).max - np.maximum(start, 0)).any():
            raise BadTime(0, f"the {bucket} events' dur", "(an end)")
        return start, start + d, valid

    def rows(self, bucket: str, fields: tuple[str, ...], *, drop: bool = True) -> dict[str, np.ndarray] | None:
        """Start, end and ``fields`` of a bucket's events; None when it has none. ``drop``:
        leave out (and count) the rows without a ``ts`` now, else say which in ``valid``."""
        if not self.cols.size(bucket):
            return None
        start, end, valid = self.ns(bucket)
        out = {"start": start, "end": end} | {f: self.cols.column(bucket, f) for f in fields}
        return self.drop_invalid(out, valid) if drop else out | {"valid": valid}

    def drop_invalid(self, cols: dict[str, np.ndarray], valid: np.ndarray) -> dict[str, np.ndarray]:
        if valid.all():
            return cols
        self.dropped += int((~valid).sum())
        return {k: v[valid] for k, v in cols.items()}

    def names(self, codes: np.ndarray) -> Any:
        return categorical(codes, self.values)

    def per_string(self, fn: Any, dtype: Any = object) -> np.ndarray:
        """``fn(value)`` for every distinct string, with ``fn(None)`` last (code -1)."""
        return np.array([fn(v) for v in self.values] + [fn(None)], dtype=dtype)

    # --- CPU side ---------------------------------------------------------------------------

    def api(self) -> pd.DataFrame:
        parts = []
        for bucket in ("runtime", "driver"):
            r = self.rows(bucket, ("pid", "tid", "correlation", "name"))
            if r is not None:
                parts.append(r | {"api_class": np.full(len(r["start"]), ("runtime", "driver").index(bucket))})
        if not parts:
            return pd.DataFrame()
        c = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return pd.DataFrame({
            "start": c["start"], "end": c["end"], "pid": int_col(c["pid"], -1), "tid": int_col(c["tid"], -1),
            "correlation": int_col(c["correlation"], 0), "name": self.names(c["name"].astype(np.int64)),
            "api_class": categorical(c["api_class"], ["runtime", "driver"]),
            "graph_launch": self.per_string(lambda v: bool(_GRAPH_LAUNCH.match(str(v))), bool)[c["name"]],
        })

    def ranges(self) -> pd.DataFrame:
        parts = []
        for bucket in ("user_annotation", "cpu_op"):
            r = self.rows(bucket, ("pid", "tid", "name"))
            if r is None:
                continue
            if bucket == "cpu_op":  # torch 1.8 recorded ProfilerStep#N as an Operator: a step annotation
                step = self.per_string(lambda v: isinstance(v, str) and v.startswith("ProfilerStep#"), bool)
                r["source"] = step[r["name"]].astype(np.int64)
            else:
                r["source"] = np.ones(len(r["start"]), dtype=np.int64)
            parts.append(r)
        if not parts:
            return pd.DataFrame()
        c = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        pid, tid = int_col(c["pid"], -1), int_col(c["tid"], -1)
        return pd.DataFrame({
            "start": c["start"], "end": c["end"], "pid": pid, "tid": tid, "name": self.names(c["name"]),
            "source": categorical(c["source"], list(_SOURCES)),
            "depth": depths(pid, tid, c["start"], c["end"]),
        })

    # --- GPU side -----------------------------------------------------------------------------

    def gpu(self, bucket: str, extra: tuple[str, ...], link: "HostLink") -> tuple[pd.DataFrame, dict[str, Any]]:
        """Columns shared by every GPU table (the host process found through ``link``),
        and the bucket's own raw ``extra`` fields for the caller."""
        r = self.rows(bucket, ("pid", "tid", "device", "stream", "correlation", *extra), drop=False)
        if r is None:
            self.unmatched[bucket] = 0
            return pd.DataFrame(), {}
        # matched before rows without a ts are dropped: those count as unmatched too
        corr = int_col(r["correlation"], 0)
        host, self.unmatched[bucket] = link.host(corr)
        valid = r.pop("valid")
        r = self.drop_invalid(r | {"host": host, "correlation": corr}, valid)
        dev = np.where(np.isnan(r["device"]), r["pid"], r["device"])
        stream = np.where(np.isnan(r["stream"]), r["tid"], r["stream"])
        df = pd.DataFrame({"start": r["start"], "end": r["end"], "pid": r["host"], "device": int_col(dev, -1),
                           "stream": int_col(stream, -1), "correlation": r["correlation"]})
        if bucket != "sync":
            df["in_graph"] = link.in_graph(r["host"], r["correlation"])
        return df, r

    def kernels(self, link: "HostLink") -> pd.DataFrame:
        dims = tuple(f"{d}_{a}" for d in ("grid", "block") for a in "xyz")
        df, r = self.gpu("kernel", ("name", *dims), link)
        if len(df):
            df["name"] = self.names(r["name"])
            for d in dims:
                df[d] = r[d]
        return df

    def memcpys(self, link: "HostLink") -> pd.DataFrame:
        df, r = self.gpu("memcpy", ("name", "kind", "bytes"), link)
        if not len(df):
            return df
        parsed = [copy_kind_from_name("" if v is None else str(v)) for v in [*self.values, None]]
        kind = np.array([COPY_KINDS.index(p[0]) for p in parsed])[r["name"]]
        # ROCm also says args.kind ("HtoD"); use it where the name has no direction token.
        fallback = self.per_string(lambda k: COPY_KINDS.index(COPY_KIND_OF_TOKEN[k])
                                   if isinstance(k, str) and k in COPY_KIND_OF_TOKEN else -1, np.int64)
        fb = fallback[r["kind"]]
        kind = np.where((kind == COPY_KINDS.index("other")) & (fb >= 0), fb, kind)
        df["bytes"] = int_col(r["bytes"], 0)
        df["kind"] = categorical(kind, list(COPY_KINDS))
        for col, i in (("src_mem", 1), ("dst_mem", 2)):
            df[col] = categorical(np.array([MEM_KINDS.index(p[i]) for p in parsed])[r["name"]], list(MEM_KINDS))
        return df

    def memsets(self, link: "HostLink") -> pd.DataFrame:
        df, r = self.gpu("memset", ("bytes",), link)
        if len(df):
            df["bytes"] = int_col(r["bytes"], 0)
        return df

    def syncs(self, link: "HostLink") -> pd.DataFrame:
        df, r = self.gpu("sync", ("name", "cuda_sync_kind"), link)
        if not len(df):
            return df
        by_name = self.per_string(lambda v: SYNC_TYPES.index(_SYNC_TYPE_OF_NAME[v]) if v in _SYNC_TYPE_OF_NAME
                                  else -1, np.int64)
        t = np.where(by_name[r["name"]] >= 0, by_name[r["name"]], by_name[r["cuda_sync_kind"]])
        df["sync_type"] = categorical(np.where(t >= 0, t, SYNC_TYPES.index("unknown")), list(SYNC_TYPES))
        return df


class HostLink:
    """Which host process issued each GPU event (its ``correlation`` is that of a runtime
    or driver call; the first call seen wins), and which events a ``cudaGraphLaunch`` made."""

    def __init__(self, api: pd.DataFrame, default_pid: int) -> None:
        self.default_pid = default_pid
        if len(api):
            linked = api[api["correlation"] != 0].drop_duplicates("correlation")
            self.owner = pd.Series(linked["pid"].to_numpy(), index=linked["correlation"].to_numpy())
            graph = api[api["graph_launch"]]
            self.graph_keys = pd.MultiIndex.from_arrays([graph["pid"], graph["correlation"]])
        else:
            self.owner = pd.Series(dtype="int64")
            self.graph_keys = pd.MultiIndex.from_arrays([[], []])

    def host(self, corr: np.ndarray) -> tuple[np.ndarray, int]:
        """``(host pid per event, events with no matching call)``."""
        host = pd.Series(corr).map(self.owner)
        missing = int(host.isna().sum())
        return host.fillna(self.default_pid).astype(np.int64).to_numpy(), missing

    def in_graph(self, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
        if not len(self.graph_keys):
            return np.zeros(len(pid), dtype=bool)
        return pd.MultiIndex.from_arrays([pid, corr]).isin(self.graph_keys)


def categorical(codes: np.ndarray, values: list[Any]) -> Any:
    """Codes into ``values`` (-1: missing) as the model's categorical: only the values used,
    sorted. Values that do not sort (mixed types) come back as objects for the model to
    order."""
    used = np.unique(codes)
    used = used[used >= 0]
    vals = [values[i] for i in used.tolist()]
    try:
        order = sorted(range(len(vals)), key=vals.__getitem__)
    except TypeError:
        objs = np.empty(len(values) + 1, dtype=object)
        objs[:len(values)] = values
        return objs[codes]
    rank = np.full(len(values) + 1, -1, dtype=np.int64)
    rank[used[order]] = np.arange(len(vals))
    return pd.Categorical.from_codes(rank[codes], categories=pd.Index([vals[i] for i in order], dtype=object))


def depths(pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting level of each range on its (pid, tid), 0 = outermost: ranges sorted by
    start (longest first), each one is inside every earlier range still open when it
    starts, as a stack pass (:func:`_stack_depths`) counts them.

    Done on arrays: each range opens and closes a bracket, sorted in time (closes before
    opens at the same instant, a zero-length range closing right after it opens); when
    every bracket's next one on its nesting level is its own close (ranges nest), the
    level is the depth. A thread whose ranges overlap without nesting gets the stack pass."""
    n = len(start)
    if not n:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((-end, start, tid, pid))
    s, e = start[order], end[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (pid[order][1:] != pid[order][:-1]) | (tid[order][1:] != tid[order][:-1])
    group = np.cumsum(new) - 1
    level, ok = _bracket_levels(group, s, e)
    depth_sorted = level
    if not ok.all():  # overlapping, not nested: the stack pass for those threads
        bad = ok[group] == 0
        depth_sorted[bad] = _stack_depths(group[bad], s[bad], e[bad])
    out = np.empty(n, dtype=np.int64)
    out[order] = depth_sorted
    return out


def _bracket_levels(group: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(level of each range's open bracket, per group: do the brackets nest)`` for ranges
    sorted by (group, start, -end)."""
    n = len(s)
    pos = np.arange(n, dtype=np.int64)
    zero = e == s
    # tie order at one instant: closes of longer ranges (inner first), then opens in range
    # order, each zero-length range's close right after its open
    close_key = np.where(zero, 2 * n + 2 * pos + 1, n - pos)
    tie = np.concatenate([2 * n + 2 * pos, close_key])
    tok = np.lexsort((tie, _group_time(group, s, e)))
    is_open = tok < n
    h = np.cumsum(np.where(is_open, 1, -1))
    level = np.where(is_open, h - 1, h)
    tgroup = group[tok % n]
    # stable: time order within a (group, level)
    by_level = np.argsort(tgroup * (int(level.max()) + 1) + level, kind="stable")
    ids = (tok % n)[by_level]
    pair_ok = ids[0::2] == ids[1::2]
    ok = np.ones(int(group[-1]) + 1 if n else 0, dtype=np.int8)
    ok[tgroup[by_level][0::2][~pair_ok]] = 0
    out = np.empty(n, dtype=np.int64)
    out[tok[is_open]] = level[is_open]
    return out, ok


def _group_time(group: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Starts then ends, each group's times shifted past the previous group's, so one key
    sorts by (group, time)."""
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    lo = np.minimum.reduceat(s, first)  # s is sorted within a group: its first start
    span = np.maximum.reduceat(e, first) - lo + 1
    shift = (np.cumsum(span) - span - lo)[group]
    return np.concatenate([s + shift, e + shift])


def _stack_depths(group: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The stack pass over ranges sorted by (group, start, -end): pop the ranges that ended
    by this start; the depth is what is left open."""
    out = [0] * len(s)
    stack: list[int] = []
    prev = None
    for i, (g, si, ei) in enumerate(zip(group.tolist(), s.tolist(), e.tolist())):
        if g != prev:
            stack.clear()
            prev = g
        while stack and stack[-1] <= si:
            stack.pop()
        out[i] = len(stack)
        stack.append(ei)
    return np.array(out, dtype=np.int64)
