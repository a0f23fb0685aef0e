"""The canonical trace model: the only thing analyzers ever see.

Every loader (Nsight Systems SQLite, ``.nsys-rep`` through ``nsys export``, PyTorch
profiler / Kineto JSON) produces a :class:`Trace`: a handful of pandas DataFrames with
the columns documented in :data:`SCHEMA`. Conventions, the same for every table:

* timestamps (``start``, ``end``) are **integer nanoseconds** (int64) on the trace's own
  time base (nsys: since session start, may be negative for NVTX ranges opened before
  collection; Kineto: microseconds times 1000, shifted so the earliest event is 0);
* ``pid``/``tid`` are OS process/thread ids (int64); ``device`` is the CUDA device index
  as the trace names it; ``stream`` is the tool's stream id (CUPTI id in nsys, the
  ``stream`` arg in Kineto). A stream is identified by ``(pid, device, stream)``;
* ``correlation`` links a CPU API call to the GPU work it caused and is unique **per
  process only**: always join on ``(pid, correlation)``. 0 or missing means no link
  (e.g. UVM migrations);
* strings in the event tables (``name``, ``kind``, ``api_class``, ...) are pandas
  **categoricals** (``"category"`` in :data:`SCHEMA`): one small integer code per row
  and each distinct string once, with the categories sorted so that sorting the column
  orders it as plain strings would; unknown values are NaN (code -1). The small tables
  (``threads``, ``devices``) keep plain ``str`` (object dtype). Compare with ``==`` /
  ``isin`` / ``.str`` as usual; ``.to_numpy(object)`` gives Python strings.

Tables
------
``kernels``     one row per kernel execution on the GPU.
``memcpys``     one row per copy; ``kind`` is one of ``COPY_KINDS``; ``src_mem``/``dst_mem``
                one of ``MEM_KINDS`` (where the trace says).
``memsets``     one row per memset.
``api``         CUDA runtime and driver API calls on CPU threads (``api_class`` is
                ``runtime`` or ``driver``); ``name`` has the nsys ``_vNNNN`` suffix stripped;
                ``callsite`` the program's own frame that made the call, where the trace
                has backtraces (nsys ``--cudabacktrace``), else ``None``.
``syncs``       GPU-side synchronization activity (CUPTI SYNCHRONIZATION / Kineto
                ``cuda_sync``); ``sync_type`` one of ``SYNC_TYPES``.
``graphs``      CUDA graph executions seen as one interval each (nsys GRAPH_TRACE).
                Kernels that ran inside a graph and were recorded individually carry
                ``in_graph = True`` in ``kernels`` instead.
``ranges``      CPU-side annotations: NVTX push/pop and start/end ranges, Kineto
                ``user_annotation`` (record_function, ProfilerStep#N) and ``cpu_op``
                (aten ops); ``source`` tells which. ``depth`` is the nesting level on its
                thread when known (0 = outermost).
``threads``     names of CPU threads.
``os_waits``    (optional, not counted in :meth:`Trace.counts`) CPU threads blocked in an
                OS lock or condition wait (nsys ``OSRT_API``: ``pthread_mutex_lock``,
                ``pthread_cond_wait``/``timedwait`` - the Python GIL -, ``pthread_rwlock_*lock``,
                ``pthread_spin_lock``); empty where the trace has no OS runtime trace.
                ``gil_by``: for a wait in which a thread takes the GIL back (seen in the
                wait's call stack, nsys ``--osrt-backtrace-threshold``), the native call
                that had given the GIL up (``THPVariable_clone [libtorch_python.so]``);
                missing otherwise.
``devices``     GPUs that appear in the trace, with name and SM count when known.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

__all__ = ["Trace", "SCHEMA", "COPY_KINDS", "MEM_KINDS", "SYNC_TYPES", "empty_table", "make_table", "as_categorical"]

#: direction of a copy, normalized across formats
COPY_KINDS = ("h2d", "d2h", "d2d", "h2h", "p2p", "uvm_h2d", "uvm_d2h", "uvm_d2d", "array", "other")
#: where a copy's source / destination lives
MEM_KINDS = ("pageable", "pinned", "device", "array", "managed", "unknown")
#: kinds of GPU-side synchronization
SYNC_TYPES = ("event", "stream_wait_event", "stream", "context", "unknown")

# column name -> pandas dtype. "Int64" is the nullable integer type (for optional ids).
SCHEMA: dict[str, dict[str, str]] = {
    "kernels": {
        "start": "int64", "end": "int64", "pid": "int64", "device": "int64", "stream": "int64",
        "correlation": "int64", "name": "category",
        "grid_x": "Int64", "grid_y": "Int64", "grid_z": "Int64",
        "block_x": "Int64", "block_y": "Int64", "block_z": "Int64",
        "in_graph": "bool",
    },
    "memcpys": {
        "start": "int64", "end": "int64", "pid": "int64", "device": "int64", "stream": "int64",
        "correlation": "int64", "bytes": "int64", "kind": "category",
        "src_mem": "category", "dst_mem": "category", "in_graph": "bool",
    },
    "memsets": {
        "start": "int64", "end": "int64", "pid": "int64", "device": "int64", "stream": "int64",
        "correlation": "int64", "bytes": "int64", "in_graph": "bool",
    },
    "api": {
        "start": "int64", "end": "int64", "pid": "int64", "tid": "int64",
        "correlation": "int64", "name": "category", "api_class": "category",
        "callsite": "category",
    },
    "syncs": {
        "start": "int64", "end": "int64", "pid": "int64", "device": "int64", "stream": "int64",
        "correlation": "int64", "sync_type": "category",
    },
    "graphs": {
        "start": "int64", "end": "int64", "pid": "int64", "device": "int64", "stream": "int64",
        "correlation": "int64", "graph_id": "Int64",
    },
    "ranges": {
        "start": "int64", "end": "int64", "pid": "int64", "tid": "int64", "name": "category",
        "source": "category", "depth": "Int64",
    },
    "threads": {"pid": "int64", "tid": "int64", "name": "object"},
    "os_waits": {"start": "int64", "end": "int64", "pid": "int64", "tid": "int64", "name": "category",
                 "gil_by": "category"},
    "devices": {"device": "int64", "name": "object", "sm_count": "Int64"},
}


def empty_table(table: str) -> pd.DataFrame:
    """An empty DataFrame with the canonical columns and dtypes of ``table``."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in SCHEMA[table].items()})


def make_table(table: str, df: pd.DataFrame | None) -> pd.DataFrame:
    """Coerce a loader's frame to the canonical columns and dtypes of ``table``.

    Missing optional columns are filled (NA for nullable ids, ``False`` for flags,
    ``None`` for strings, 0 for required integers); extra columns are dropped.
    """
    if df is None or len(df) == 0:
        return empty_table(table)
    out = {}
    n = len(df)
    for col, dtype in SCHEMA[table].items():
        if col in df.columns:
            s = df[col]
        elif dtype == "bool":
            s = pd.Series(np.zeros(n, dtype=bool), index=df.index)
        elif dtype == "category":  # absent: all missing, one byte per row
            s = pd.Series(pd.Categorical.from_codes(np.full(n, -1, dtype=np.int8), categories=pd.Index([], dtype=object)),
                          index=df.index)
        elif dtype in ("Int64", "object"):
            s = pd.Series([None] * n, index=df.index, dtype="object")
        else:
            s = pd.Series(np.zeros(n, dtype="int64"), index=df.index)
        if dtype == "int64":
            if s.dtype != np.int64:
                s = pd.to_numeric(s, errors="coerce").fillna(0).astype("int64")
        elif dtype == "Int64":
            if s.dtype != "Int64":
                s = pd.to_numeric(s, errors="coerce").astype("Int64")
        elif dtype == "bool":
            if s.dtype != bool:
                s = s.fillna(False).astype(bool)
        elif dtype == "category":
            s = as_categorical(s)
        else:
            s = s.astype("object")
        out[col] = s.reset_index(drop=True)
    return pd.DataFrame(out, copy=False)


def as_categorical(s: pd.Series) -> pd.Series:
    """A string column as a categorical with sorted categories (see the module docstring);
    missing values (None/NaN) become NaN. Already-categorical columns are kept as they are
    when their categories are sorted strings."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        cats = s.cat.categories
        if cats.is_monotonic_increasing and (cats.dtype == object or str(cats.dtype) == "str"):
            return s
        s = s.astype(object)
    codes, uniq = pd.factorize(s.astype(object), use_na_sentinel=True)
    vals = list(uniq)
    try:
        order = sorted(range(len(vals)), key=lambda i: vals[i])
    except TypeError:  # mixed types: keep the first-seen order
        order = list(range(len(vals)))
    rank = np.empty(len(vals) + 1, dtype=np.int64)
    rank[order] = np.arange(len(vals))
    rank[-1] = -1
    cats = pd.Index([vals[i] for i in order], dtype=object)
    return pd.Series(pd.Categorical.from_codes(rank[codes], categories=cats), index=s.index)


_T = TypeVar("_T")


class TraceIndex:
    """What the analyzers derive from one trace and share (the op table, the idle gaps, the
    steady-state window...), built on first use (:meth:`Trace.derived`) and kept with
    the trace. Analyzers treat the trace as read-only; should one of its tables be
    replaced all the same, every entry is dropped (the tables are compared by identity)."""

    __slots__ = ("_tables", "_entries")

    def __init__(self) -> None:
        self._tables: tuple[pd.DataFrame, ...] = ()
        self._entries: dict[Hashable, Any] = {}

    def get(self, tables: tuple[pd.DataFrame, ...], key: Hashable, make: Callable[[], _T]) -> _T:
        if len(tables) != len(self._tables) or any(a is not b for a, b in zip(tables, self._tables)):
            self._tables, self._entries = tables, {}
        if key not in self._entries:
            self._entries[key] = make()
        return self._entries[key]  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class Trace:
    """A loaded trace in the canonical model (see the module docstring for the tables)."""

    path: str
    format: str  # "nsys-sqlite" | "kineto-json"
    kernels: pd.DataFrame = field(default_factory=lambda: empty_table("kernels"))
    memcpys: pd.DataFrame = field(default_factory=lambda: empty_table("memcpys"))
    memsets: pd.DataFrame = field(default_factory=lambda: empty_table("memsets"))
    api: pd.DataFrame = field(default_factory=lambda: empty_table("api"))
    syncs: pd.DataFrame = field(default_factory=lambda: empty_table("syncs"))
    graphs: pd.DataFrame = field(default_factory=lambda: empty_table("graphs"))
    ranges: pd.DataFrame = field(default_factory=lambda: empty_table("ranges"))
    threads: pd.DataFrame = field(default_factory=lambda: empty_table("threads"))
    devices: pd.DataFrame = field(default_factory=lambda: empty_table("devices"))
    os_waits: pd.DataFrame = field(default_factory=lambda: empty_table("os_waits"))
    #: free-form facts about the source: tool version, schema version, notes on what
    #: was missing or repaired while loading (JSON-serializable values only)
    meta: dict[str, Any] = field(default_factory=dict)
    #: derived data the analyzers share (:meth:`derived`); not part of the trace's content
    index: TraceIndex = field(default_factory=TraceIndex, init=False, repr=False, compare=False)

    TABLES = ("kernels", "memcpys", "memsets", "api", "syncs", "graphs", "ranges", "threads", "devices")
    #: tables that only some traces have, left out of :meth:`counts` (and so of the JSON)
    OPTIONAL_TABLES = ("os_waits",)

    def __post_init__(self) -> None:
        for t in self.TABLES + self.OPTIONAL_TABLES:
            setattr(self, t, make_table(t, getattr(self, t)))

    def derived(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """``make()``, computed once per trace and ``key`` (:class:`TraceIndex`): the
        tables several analyzers build from the same trace are built once."""
        return self.index.get(tuple(getattr(self, t) for t in self.TABLES + self.OPTIONAL_TABLES), key, make)

    # --- small conveniences shared by analyzers -------------------------------------
    def gpu_activity(self) -> pd.DataFrame:
        """All GPU intervals (kernels, copies, memsets, graph executions) in one frame
        with columns ``start, end, pid, device, stream, correlation, what`` (``what`` a
        categorical: kernel, memcpy, memset or graph)."""
        cols = ["start", "end", "pid", "device", "stream", "correlation"]
        parts = []
        whats = pd.Index(["graph", "kernel", "memcpy", "memset"], dtype=object)  # sorted: sorts like str
        for what, df in (("kernel", self.kernels), ("memcpy", self.memcpys),
                         ("memset", self.memsets), ("graph", self.graphs)):
            if len(df):
                p = df[cols].copy()
                p["what"] = pd.Categorical.from_codes(np.full(len(df), whats.get_loc(what), dtype=np.int8),
                                                      categories=whats)
                parts.append(p)
        if not parts:
            return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols} | {"what": pd.Series(dtype="object")})
        return pd.concat(parts, ignore_index=True)

    def window(self, start: int | None = None, end: int | None = None) -> "Trace":
        """A copy restricted to events that overlap ``[start, end)`` (ns), clipped to it."""
        if start is None and end is None:
            return self
        lo = -(2**62) if start is None else int(start)
        hi = 2**62 if end is None else int(end)
        kw = {}
        for t in self.TABLES + self.OPTIONAL_TABLES:
            df = getattr(self, t)
            if "start" in df.columns:
                m = (df["end"] > lo) & (df["start"] < hi)
                df = df[m].copy()
                df["start"] = df["start"].clip(lower=lo)
                df["end"] = df["end"].clip(upper=hi)
            kw[t] = df
        meta = dict(self.meta)
        meta["window_ns"] = [lo if start is not None else None, hi if end is not None else None]
        return Trace(path=self.path, format=self.format, meta=meta, **kw)

    def counts(self) -> dict[str, int]:
        return {t: int(len(getattr(self, t))) for t in self.TABLES}
