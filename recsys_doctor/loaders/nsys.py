"""Nsight Systems SQLite export -> canonical :class:`~recsys_doctor.model.Trace`.

The export is already a database, so this loader lets SQLite select and convert the
columns and reads each big table column-wise into Arrow through the ADBC SQLite driver
(``adbc-driver-sqlite``: no Python object per row; README "Why this engine" has the
measurements against sqlite3, connectorx, Polars and DuckDB). The activity tables are
read two at a time on separate connections. Strings never travel per row: the
``StringIds`` ids and the enum codes come back as integers and become pandas
categoricals (dictionary codes) through a lookup table, so a 10-million-row runtime
table holds one small code per row. ``globalTid``/``globalPid`` are decoded with numpy
bit arithmetic. Python only post-processes whole columns or the distinct values (the
``_vNNNN`` suffix strip, the NVTX nesting depth).

Why so defensive: real exports from 2020 to 2026 differ (``/work/shared/traces/nsys/
SCHEMAS.md`` documents the corpus this was written against):

* the version lives in ``META_DATA_EXPORT`` (2023.3+), ``EXPORT_META_DATA`` (2022.1 to
  2023.2) or nowhere (older; then the install path in ``StringIds`` may tell);
* empty tables are left out, so any of KERNEL, MEMCPY, MEMSET, SYNCHRONIZATION,
  NVTX_EVENTS, RUNTIME may be missing; they load as empty tables and are listed in
  ``meta["tables_missing"]``;
* columns come and go between versions and other tools (DLProf, pipit) add their own,
  so every column is selected by name after checking ``PRAGMA table_info``;
* RUNTIME holds runtime (``eventClass`` 0) and driver (1) calls and, in some exports,
  duplicate backtrace rows (67): only classes 0 and 1 are kept.

Timestamps are kept exactly as stored (ns since session start; NVTX can be negative).
``correlation`` is unique per process only: join on ``(pid, correlation)``.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import sqlite3
import struct
import tempfile
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BadInputError, TraceFormatError
from ..model import Trace
from ..progress import ProgressHandle, _Quiet

#: what a table method hands the engine: the SELECT, and a whole-column post-processing
Job = tuple[str, "Callable[[pd.DataFrame], pd.DataFrame] | None"]

__all__ = ["load_nsys_sqlite", "COPY_KIND_CODES", "MEM_KIND_CODES", "SYNC_TYPE_CODES"]

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"

#: ``ENUM_CUDA_MEMCPY_OPER`` (the same numbers in exports older than the enum table)
COPY_KIND_CODES: dict[int, str] = {
    1: "h2d", 2: "d2h", 3: "array", 4: "array", 5: "array", 6: "array", 7: "array",
    8: "d2d", 9: "h2h", 10: "p2p", 11: "uvm_h2d", 12: "uvm_d2h", 13: "uvm_d2d",
}  # anything else (0 unknown, new codes) -> "other"
#: ``ENUM_CUDA_MEM_KIND``; "static" device/managed memory is still device/managed memory.
#: Note nsys numbers these from 0 = pageable, unlike CUPTI's own enum (1 = pageable).
MEM_KIND_CODES: dict[int, str] = {
    0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed",
    5: "device", 6: "managed", 7: "unknown",
}
#: ``ENUM_CUPTI_SYNC_TYPE``
SYNC_TYPE_CODES: dict[int, str] = {1: "event", 2: "stream_wait_event", 3: "stream", 4: "context"}

#: ``ENUM_NSYS_EVENT_TYPE`` codes of NVTX ranges (59 push/pop, 60 start/end). Marks (34),
#: thread naming (39) and domain creation (75) are not ranges and are skipped.
NVTX_RANGE_TYPES = (59, 60)
NVTX_MARK_TYPE = 34

K = "CUPTI_ACTIVITY_KIND_"
#: the tables this loader reads; absent ones are reported in ``meta["tables_missing"]``
READ_TABLES = (
    K + "KERNEL", K + "MEMCPY", K + "MEMSET", K + "SYNCHRONIZATION", K + "RUNTIME",
    K + "GRAPH_TRACE", "NVTX_EVENTS", "ThreadNames", "StringIds",
)
#: GPU activity tables that carry ``deviceId`` (used to list the devices in the trace)
GPU_TABLES = (K + "KERNEL", K + "MEMCPY", K + "MEMSET", K + "SYNCHRONIZATION", K + "GRAPH_TRACE")

_PID = "(({col} >> 24) & 16777215)"  # globalTid/globalPid = vid<<48 | pid<<24 | tid
_TID = "({col} & 16777215)"
#: libraries whose frames are not the program's own call site
_RUNTIME_LIB = re.compile(r"^(lib(cuda|cudart|cupti|nvidia|nvToolsExt|c10_cuda|torch_cuda|cublas|cudnn)|libc[-.])")
#: CUDA API wrappers (the runtime's templates inlined into the program)
_CUDA_SYMBOL = re.compile(r"\bcu(da)?[A-Z]\w*")
_API_SUFFIX = re.compile(r"_v\d+$")
_VERSION_IN_PATH = re.compile(r"nsight[-_ ]?systems[-/_ ]*(20\d\d\.\d+(?:\.\d+)*)", re.IGNORECASE)
_HPCSDK_IN_PATH = re.compile(r"hpc_sdk/[^/]+/(\d+\.\d+)/\S*nsys", re.IGNORECASE)


# --------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------
def load_nsys_sqlite(path: str | os.PathLike[str], *, engine: str | None = None,
                     progress: ProgressHandle | None = None) -> Trace:
    """Load an Nsight Systems SQLite export (``.sqlite``, or gzip-compressed ``.sqlite.gz``).

    ``engine``: ``"adbc"`` (the default when ``adbc-driver-sqlite`` is installed, which
    it is with the package) or ``"sqlite3"`` (the standard library; slower, same
    result). ``progress`` is advanced once per table read.

    Raises :class:`BadInputError` for a missing/unreadable path and
    :class:`TraceFormatError` (one line: the path and what is wrong) for a corrupt or
    truncated database, a corrupt gzip, or an SQLite file that is not an nsys export.
    ``sqlite3`` errors never escape.
    """
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such file")
    if p.is_dir():
        raise BadInputError(f"{p}: is a directory, expected an Nsight Systems .sqlite export")
    try:
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise BadInputError(f"{p}: cannot read ({e.strerror or e})") from None
    if head.startswith(GZIP_MAGIC):
        with _gunzipped(p) as tmp:
            trace = _load_file(tmp, shown=p, engine=engine, progress=progress)
        trace.meta["compressed"] = "gzip"
        return trace
    return _load_file(p, shown=p, engine=engine, progress=progress)


# --------------------------------------------------------------------------------------
# file handling and error translation
# --------------------------------------------------------------------------------------
@contextlib.contextmanager
def _gunzipped(p: Path) -> Iterator[Path]:
    """Decompress ``p`` to a private temporary file (deleted afterwards). The whole
    trace is read into DataFrames while the file exists, so nothing needs caching."""
    fd, name = tempfile.mkstemp(prefix="recsys-doctor-", suffix=".sqlite")
    tmp = Path(name)
    try:
        try:
            with os.fdopen(fd, "wb") as out, gzip.open(p, "rb") as g:
                shutil.copyfileobj(g, out, 1 << 20)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceFormatError(f"{p}: corrupt gzip file ({e or type(e).__name__})") from None
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _check_header(p: Path, shown: Path) -> None:
    """Catch non-SQLite and truncated files before SQLite does, with a clearer message.

    The header stores the database size in pages (offset 28) and is trustworthy when the
    "version-valid-for" number (offset 92) equals the change counter (offset 24); a file
    shorter than that size was cut off (a partial copy or download)."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        hdr = f.read(100)
    if not hdr.startswith(SQLITE_MAGIC):
        raise TraceFormatError(f"{shown}: not an SQLite database (expected an Nsight Systems .sqlite export)")
    if len(hdr) < 100:
        raise TraceFormatError(f"{shown}: truncated SQLite file ({size} bytes, shorter than the 100-byte header)")
    page_size = struct.unpack(">H", hdr[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    (change,) = struct.unpack(">I", hdr[24:28])
    (n_pages,) = struct.unpack(">I", hdr[28:32])
    (valid_for,) = struct.unpack(">I", hdr[92:96])
    if page_size < 512 or page_size & (page_size - 1):
        raise TraceFormatError(f"{shown}: corrupt SQLite file (invalid page size {page_size} in header)")
    if n_pages and change == valid_for and size < n_pages * page_size:
        raise TraceFormatError(
            f"{shown}: truncated SQLite file ({size} bytes, the header says {n_pages * page_size}); "
            "copy or export it again"
        )


def _load_file(p: Path, shown: Path, engine: str | None, progress: ProgressHandle | None) -> Trace:
    _check_header(p, shown)
    # immutable=1: no locks, no journal/-shm files, works on read-only media; the
    # export is never written to.
    uri = p.resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as e:
        raise TraceFormatError(f"{shown}: cannot open as SQLite ({_one_line(e)})") from None
    try:
        eng = _Engine(uri, con, engine or ("adbc" if _adbc_available() else "sqlite3"))
        return _Reader(con, shown, eng, progress or _Quiet()).read()
    except (sqlite3.Error, pd.errors.DatabaseError) as e:
        cause = e.__cause__ if isinstance(e, pd.errors.DatabaseError) and e.__cause__ else e
        raise TraceFormatError(f"{shown}: corrupt or truncated SQLite file ({_one_line(cause)})") from None
    finally:
        con.close()


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


# --------------------------------------------------------------------------------------
# the reader
# --------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, con: sqlite3.Connection, shown: Path, engine: "_Engine", progress: ProgressHandle) -> None:
        self.con = con
        self.shown = shown
        self.engine = engine
        self.progress = progress
        self._strings: tuple[np.ndarray, np.ndarray] | None = None
        rows = con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')").fetchall()
        self.tables = {r[0] for r in rows}
        self._cols: dict[str, set[str]] = {}
        self.meta: dict[str, Any] = {}
        self.repairs: list[str] = []

    # --- helpers -----------------------------------------------------------------
    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = (
                {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')} if table in self.tables else set()
            )
        return self._cols[table]

    def col(self, table: str, alias: str, name: str, default: str = "NULL") -> str:
        """``alias.name`` if the column exists, else ``default`` (an SQL expression)."""
        return f'{alias}."{name}"' if name in self.cols(table) else default

    def query(self, sql: str) -> pd.DataFrame:
        return pd.read_sql_query(sql, self.con)

    @property
    def has_strings(self) -> bool:
        return "StringIds" in self.tables

    def string(self, table: str, alias: str, id_col: str, join_alias: str) -> tuple[str, str]:
        """(select expression, join clause) resolving an id column through StringIds.
        A column that already holds text (some post-processing tools do that) is used as is."""
        if id_col not in self.cols(table):
            return "NULL", ""
        if not self.has_strings:
            return f"CASE WHEN typeof({alias}.\"{id_col}\")='text' THEN {alias}.\"{id_col}\" END", ""
        expr = f"CASE WHEN typeof({alias}.\"{id_col}\")='text' THEN {alias}.\"{id_col}\" ELSE {join_alias}.value END"
        return expr, f'LEFT JOIN StringIds {join_alias} ON {join_alias}.id = {alias}."{id_col}"'

    def gpu_common(self, table: str, a: str) -> str:
        """start, end, pid, device, stream, correlation of a GPU activity table."""
        gp = self.col(table, a, "globalPid")
        if gp == "NULL":
            self.repairs.append(f"{table} has no globalPid column: pid set to 0")
        # raw columns only: decoding in SQL (bit arithmetic, CASE) would cost SQLite more
        # than reading the rows; :func:`_decode_ids` does it on whole columns
        return (
            f'{a}.start AS start, {a}."end" AS "end", {gp if gp != "NULL" else "0"} AS gp_raw, '
            f"{self.col(table, a, 'deviceId', '0')} AS device, {self.col(table, a, 'streamId', '0')} AS stream, "
            f"{self.col(table, a, 'correlationId', '0')} AS correlation"
        )

    def in_graph(self, table: str, a: str) -> str:
        g = self.col(table, a, "graphNodeId")
        return "0" if g == "NULL" else g

    # --- read everything -----------------------------------------------------------
    def read(self) -> Trace:
        if not self.has_strings and not any(t.startswith(("CUPTI_", "NVTX_")) for t in self.tables):
            raise TraceFormatError(
                f"{self.shown}: an SQLite database but not an Nsight Systems export "
                "(no StringIds and no CUPTI_/NVTX_ tables); export with `nsys export --type sqlite`"
            )
        self.read_meta()
        jobs = {
            "kernels": self.kernels(), "memcpys": self.memcpys(), "memsets": self.memsets(),
            "api": self.api(), "syncs": self.syncs(), "graphs": self.graphs(), "ranges": self.ranges(),
        }
        jobs = {k: j for k, j in jobs.items() if j is not None}
        self.string_table()  # read once here, not raced by the workers
        # big tables are read in rowid chunks, each turned into its final compact columns
        # before more are read: memory stays near the size of the result, not of the raw rows
        tasks: list[tuple[str, str]] = []
        for k, (sql, _) in jobs.items():
            m = _FROM.search(sql)
            if k == "ranges" or m is None:  # NVTX nesting needs the whole table at once
                tasks.append((k, sql))
                continue
            for lo, hi in self.rowid_ranges(m.group(1)):
                tasks.append((k, f"{sql} WHERE {m.group(2)}.rowid >= {lo} AND {m.group(2)}.rowid < {hi}"))
        self.progress.update(total=len(tasks) + 1, completed=0)
        parts: dict[str, list[pd.DataFrame]] = {k: [] for k in jobs}
        workers = 2 if self.engine.engine == "adbc" else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque[tuple[str, Future[pd.DataFrame]]] = deque()
            todo = iter(tasks)
            for k, q in islice(todo, workers + 1):
                pending.append((k, pool.submit(self.engine.run, q)))
            while pending:  # post-process in this thread, in order, as each arrives
                k, fut = pending.popleft()
                df = _decode_ids(fut.result())
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt[0], pool.submit(self.engine.run, nxt[1])))
                post = jobs[k][1]
                parts[k].append(post(df) if post is not None else df)
                self.progress.update(description=f"loading {self.shown.name}: {k}")
                self.progress.advance()
        tables: dict[str, pd.DataFrame | None] = {k: _concat(v) for k, v in parts.items()}
        if tables.get("api") is not None:
            tables["api"] = self.attach_callsites(tables["api"])
        tables["threads"] = self.threads(tables.get("api"), tables.get("ranges"))
        tables["devices"] = self.devices(tables)
        self.meta["tables_missing"] = [t for t in READ_TABLES if t not in self.tables]
        if self.repairs:
            self.meta["repairs"] = self.repairs
        for k, df in tables.items():
            if df is not None and len(df) and "start" in df.columns:
                st = pd.to_numeric(df["start"]).to_numpy()
                if not (st[1:] >= st[:-1]).all():  # exports are mostly in time order already
                    tables[k] = df.take(np.argsort(st, kind="stable")).reset_index(drop=True)
        self.progress.advance()
        trace = Trace(path=str(self.shown), format="nsys-sqlite", meta=self.meta, **tables)
        release_free_memory()
        return trace

    # --- metadata ------------------------------------------------------------------
    def read_meta(self) -> None:
        m = self.meta
        m["nsys_version"] = None
        for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if t in self.tables and {"name", "value"} <= self.cols(t):
                kv = dict(self.con.execute(f'SELECT name, value FROM "{t}"').fetchall())
                m["metadata_table"] = t
                m["nsys_version"] = _str_or_none(kv.get("EXPORT_PRODUCT_VERSION"))
                m["nsys_version_source"] = t
                if kv.get("EXPORT_SCHEMA_VERSION") is not None:
                    m["export_schema_version"] = str(kv["EXPORT_SCHEMA_VERSION"])
                for key in ("DERIVED_FROM", "DERIVED_WINDOW_NS", "DERIVED_BY"):
                    if kv.get(key) is not None:
                        m[key.lower()] = str(kv[key])
                break
        if m["nsys_version"] is None and self.has_strings:
            self._version_from_strings()
        if "ANALYSIS_DETAILS" in self.tables and "duration" in self.cols("ANALYSIS_DETAILS"):
            row = self.con.execute("SELECT duration FROM ANALYSIS_DETAILS LIMIT 1").fetchone()
            if row and row[0] is not None:
                m["duration_ns"] = int(row[0])
        t = "TARGET_INFO_SESSION_START_TIME"
        if t in self.tables and "utcEpochNs" in self.cols(t):
            row = self.con.execute(f"SELECT utcEpochNs FROM {t} LIMIT 1").fetchone()
            if row and row[0] is not None:
                m["session_start_utc_ns"] = int(row[0])

    def _version_from_strings(self) -> None:
        """Exports before 2022.1 store no version; the injection libraries' install path
        (``/opt/nvidia/nsight-systems/2021.2.1/...``) often does."""
        rows = self.con.execute(
            "SELECT value FROM StringIds WHERE value LIKE '%ight%ystems%' OR value LIKE '%hpc_sdk%nsys%' LIMIT 500"
        ).fetchall()
        found: set[str] = set()
        hpcsdk: set[str] = set()
        for (v,) in rows:
            if not isinstance(v, str):
                continue
            found.update(_VERSION_IN_PATH.findall(v))
            hpcsdk.update(_HPCSDK_IN_PATH.findall(v))
        if found:
            self.meta["nsys_version"] = max(found, key=_version_key)
            self.meta["nsys_version_source"] = "StringIds install path"
        elif hpcsdk:
            self.meta["nsys_version_hint"] = f"nsys from the NVHPC {max(hpcsdk, key=_version_key)} bundle"
            self.meta["nsys_version_source"] = "StringIds install path"
        else:
            self.meta["nsys_version_source"] = None
            self.meta["nsys_version_hint"] = "older than 2022.1 (the export stores no version)"

    # --- GPU activity ----------------------------------------------------------------
    # Each table method returns (sql, post): the engine runs ``sql`` (in a worker thread,
    # two tables at a time) and ``post`` turns the raw integer columns into the canonical
    # ones with whole-column numpy work.
    def kernels(self) -> Job | None:
        t = K + "KERNEL"
        if t not in self.tables:
            return None
        dims = ", ".join(
            f"{self.col(t, 'k', c)} AS {o}" for c, o in (
                ("gridX", "grid_x"), ("gridY", "grid_y"), ("gridZ", "grid_z"),
                ("blockX", "block_x"), ("blockY", "block_y"), ("blockZ", "block_z"))
        )
        sql = (f"SELECT {self.gpu_common(t, 'k')}, {self.string_cols(t, 'k', 'demangledName', 'dn')}, "
               f"{self.string_cols(t, 'k', 'shortName', 'sn')}, {dims}, {self.in_graph(t, 'k')} AS ig_raw FROM {t} k")

        def post(df: pd.DataFrame) -> pd.DataFrame:
            codes, values = self.coalesce(self.resolve(df, "dn"), self.resolve(df, "sn"))
            df["name"] = categorical(codes, values)
            return df

        return sql, post

    def memcpys(self) -> Job | None:
        t = K + "MEMCPY"
        if t not in self.tables:
            return None
        sql = (f"SELECT {self.gpu_common(t, 'm')}, {self.col(t, 'm', 'bytes', '0')} AS bytes, "
               f"{self.col(t, 'm', 'copyKind')} AS kind, {self.col(t, 'm', 'srcKind')} AS src_mem, "
               f"{self.col(t, 'm', 'dstKind')} AS dst_mem, {self.in_graph(t, 'm')} AS ig_raw FROM {t} m")
        has = {c: self.col(t, "m", c) != "NULL" for c in ("copyKind", "srcKind", "dstKind")}

        def post(df: pd.DataFrame) -> pd.DataFrame:
            df["kind"] = enum_categorical(df["kind"] if has["copyKind"] else None, COPY_KIND_CODES, "other", len(df))
            df["src_mem"] = enum_categorical(df["src_mem"] if has["srcKind"] else None, MEM_KIND_CODES, None, len(df))
            df["dst_mem"] = enum_categorical(df["dst_mem"] if has["dstKind"] else None, MEM_KIND_CODES, None, len(df))
            return df

        return sql, post

    def memsets(self) -> Job | None:
        t = K + "MEMSET"
        if t not in self.tables:
            return None
        return (f"SELECT {self.gpu_common(t, 's')}, {self.col(t, 's', 'bytes', '0')} AS bytes, "
                f"{self.in_graph(t, 's')} AS ig_raw FROM {t} s"), None

    def syncs(self) -> Job | None:
        t = K + "SYNCHRONIZATION"
        if t not in self.tables:
            return None
        st = self.col(t, "y", "syncType")
        if st == "NULL":  # only the deprecated column (never seen, but cheap to handle)
            st = self.col(t, "y", "deprecatedSyncType")

        def post(df: pd.DataFrame) -> pd.DataFrame:
            df["sync_type"] = enum_categorical(df["sync_type"] if st != "NULL" else None, SYNC_TYPE_CODES,
                                               "unknown", len(df))
            return df

        return f"SELECT {self.gpu_common(t, 'y')}, {st} AS sync_type FROM {t} y", post

    def graphs(self) -> Job | None:
        t = K + "GRAPH_TRACE"
        if t not in self.tables:
            return None
        return f"SELECT {self.gpu_common(t, 'g')}, {self.col(t, 'g', 'graphId')} AS graph_id FROM {t} g", None

    # --- CPU side -----------------------------------------------------------------------
    def api(self) -> Job | None:
        t = K + "RUNTIME"
        if t not in self.tables:
            return None
        gt = self.col(t, "r", "globalTid")
        ec = self.col(t, "r", "eventClass")
        sql = (f'SELECT r.start AS start, r."end" AS "end", {gt} AS gt_raw, '
               f"{self.col(t, 'r', 'correlationId', '0')} AS correlation, "
               f"{self.string_cols(t, 'r', 'nameId', 'nm')}, {ec} AS event_class FROM {t} r")

        def post(df: pd.DataFrame) -> pd.DataFrame:
            codes, values = self.resolve(df, "nm")
            if ec != "NULL":
                cls = df.pop("event_class")
                keep = cls.isin([0, 1]).to_numpy()
                if not keep.all():
                    # e.g. eventClass 67: backtrace duplicates of the same calls
                    self.meta["api_rows_skipped"] = self.meta.get("api_rows_skipped", 0) + int((~keep).sum())
                    df, codes, cls = df[keep].reset_index(drop=True), codes[keep], cls[keep]
                df["api_class"] = enum_categorical(cls, {0: "runtime", 1: "driver"}, None, len(df))
            else:
                df = df.drop(columns=["event_class"])
            # the nsys version suffix (cudaLaunchKernel_v7000) goes, per distinct name
            values = np.array([_API_SUFFIX.sub("", u) if isinstance(u, str) else u for u in values], dtype=object)
            df["name"] = name = categorical(codes, values)
            if ec == "NULL":  # no class column: the driver API is the cu* namespace
                drv = np.array([isinstance(c, str) and c.startswith("cu") and not c.startswith("cuda")
                                for c in name.categories], dtype=bool)
                is_drv = np.where(name.codes >= 0, np.append(drv, False)[name.codes], False)
                df["api_class"] = pd.Categorical.from_codes(np.where(is_drv, 0, 1), categories=["driver", "runtime"])
            return df

        return sql, post

    def attach_callsites(self, df: pd.DataFrame) -> pd.DataFrame:
        """``--cudabacktrace`` exports: each call's ``callsite`` (see :meth:`callsites`),
        joined on ``(pid, correlation)``; other exports are returned as they are."""
        t = K + "RUNTIME"
        if not (len(df) and "callchainId" in self.cols(t) and "CUDA_CALLCHAINS" in self.tables and self.has_strings):
            return df
        gt = self.col(t, "r", "globalTid")
        name, join = self.string(t, "r", "nameId", "sn")
        bt = self.query(  # duplicate rows carry the chain, same correlation
            f"SELECT {_PID.format(col=gt)} AS pid, {self.col(t, 'r', 'correlationId', '0')} AS correlation, "
            f"r.callchainId AS chain, {name} AS name FROM {t} r {join} WHERE r.callchainId IS NOT NULL")
        if not len(bt):
            return df
        return df.merge(self.callsites(bt), on=["pid", "correlation"], how="left")

    def callsites(self, bt: pd.DataFrame) -> pd.DataFrame:
        """``--cudabacktrace`` exports: per backtraced call ``(pid, correlation)``, the first
        frame in the program's own code (resolved, outside the CUDA/profiler libraries, not
        a CUDA API wrapper), as ``symbol (module)``. The call's ``callchainId`` is 0-based
        in some exports and equal to ``CUDA_CALLCHAINS.id`` in others: the offset whose
        chains contain the call's own API name more often wins."""
        rows = self.con.execute(
            "SELECT c.id, s.value, m.value, c.unresolved FROM CUDA_CALLCHAINS c "
            "JOIN StringIds s ON s.id = c.symbol JOIN StringIds m ON m.id = c.module "
            "ORDER BY c.id, c.stackDepth").fetchall()
        site: dict[int, str] = {}
        syms: dict[int, set[str]] = {}
        for cid, sym, mod, unresolved in rows:
            syms.setdefault(int(cid), set()).add(str(sym))
            if int(cid) in site or unresolved or not isinstance(sym, str):
                continue
            base = str(mod).rsplit("/", 1)[-1]
            if _RUNTIME_LIB.search(base) or _CUDA_SYMBOL.search(sym):
                continue
            site[int(cid)] = f"{sym} ({base})"
        chain = bt["chain"].to_numpy(np.int64)
        api = [_API_SUFFIX.sub("", str(n)) for n in bt["name"]]
        best = max((0, 1), key=lambda off: sum(a in syms.get(int(c) + off, ()) for c, a in zip(chain, api)))
        out = pd.DataFrame({"pid": bt["pid"].to_numpy(np.int64), "correlation": bt["correlation"].to_numpy(np.int64),
                            "callsite": [site.get(int(c) + best) for c in chain]})
        return out.drop_duplicates(["pid", "correlation"])

    def ranges(self) -> Job | None:
        t = "NVTX_EVENTS"
        if t not in self.tables:
            return None
        gt = self.col(t, "n", "globalTid")
        text = self.col(t, "n", "text")
        sql = (f'SELECT n.start AS start, n."end" AS "end", {gt} AS gt_raw, {text} AS tx_txt, '
               f"{self.string_cols(t, 'n', 'textId', 'ti')}, {self.col(t, 'n', 'eventType')} AS event_type "
               f"FROM {t} n")

        def post(df: pd.DataFrame) -> pd.DataFrame:
            et = df.pop("event_type")
            n_marks = int((et == NVTX_MARK_TYPE).sum())
            if n_marks:
                self.meta["nvtx_marks_skipped"] = n_marks
            # a range still open when collection stopped lasted at least to the last NVTX
            # timestamp seen (of any NVTX event, ranges or not)
            start = pd.to_numeric(df["start"])
            end = pd.to_numeric(df["end"])
            last = end.fillna(start).max()
            keep = et.isin(list(NVTX_RANGE_TYPES)).to_numpy()
            df = df[keep].reset_index(drop=True)
            open_ended = int(df["end"].isna().sum())
            if open_ended:
                df["end"] = df["end"].fillna(last)
                self.repairs.append(f"{open_ended} NVTX ranges had no end: closed at the last NVTX timestamp")
            txt = df.pop("tx_txt")
            codes, values = self.coalesce(text_codes(txt), self.resolve(df, "ti"))
            df["name"] = categorical(codes, values)
            df["source"] = pd.Categorical.from_codes(np.zeros(len(df), dtype=np.int8), categories=["nvtx"])
            if len(df):
                df["depth"] = nesting_depth(df)
            return df

        return sql, post

    def rowid_ranges(self, table: str) -> list[tuple[int, int]]:
        """``[lo, hi)`` rowid ranges of about :data:`CHUNK_ROWS` rows each (one range for
        a table without rowids or with no rows)."""
        try:  # two queries: SQLite answers a lone min() or max() of rowid from the b-tree
            lo = self.con.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
            hi = self.con.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
        except sqlite3.Error:
            lo = hi = None
        if lo is None or hi is None:
            return [(-(2**62), 2**62)]
        edges = list(range(int(lo), int(hi) + 1, CHUNK_ROWS)) + [int(hi) + 1]
        return list(zip(edges[:-1], edges[1:]))

    # --- strings ------------------------------------------------------------------------
    def string_cols(self, table: str, alias: str, id_col: str, out: str) -> str:
        """A StringIds reference, raw: an integer id, or the text itself where the column
        already holds text (some post-processing tools write it so)."""
        if id_col not in self.cols(table):
            return f"NULL AS {out}"
        return f'{alias}."{id_col}" AS {out}'

    def string_table(self) -> tuple[np.ndarray, np.ndarray]:
        """``StringIds`` as (sorted ids, values), read once."""
        if self._strings is None:
            if self.has_strings:
                st = self.query("SELECT id, value FROM StringIds WHERE typeof(id) = 'integer' ORDER BY id")
                self._strings = (st["id"].to_numpy(dtype=np.int64), st["value"].to_numpy(dtype=object))
            else:
                self._strings = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))
        return self._strings

    def resolve(self, df: pd.DataFrame, out: str) -> tuple[np.ndarray, np.ndarray]:
        """(codes, values) of a StringIds reference read by :meth:`string_cols`: a text
        value is used as is, an id is looked up (unknown ids -> missing)."""
        sid, sval = self.string_table()
        raw = df.pop(out)
        txt = pd.Series([None] * len(raw), dtype=object)
        if raw.dtype == object or str(raw.dtype) == "str":  # text, or ids and text mixed
            is_txt = raw.map(lambda v: isinstance(v, str)).to_numpy(dtype=bool)
            txt = raw.where(is_txt, None).astype(object)
            raw = pd.to_numeric(raw.where(~is_txt, None), errors="coerce")
        codes = np.full(len(df), -1, dtype=np.int64)
        if sid.size and raw.notna().any():
            iv = (raw.to_numpy() if raw.dtype == np.int64 else pd.to_numeric(raw).fillna(-1).to_numpy(dtype=np.int64))
            if sid[-1] - sid[0] == sid.size - 1:  # dense ids (every export seen): an offset
                pos = iv - sid[0]
                codes = np.where((pos >= 0) & (pos < sid.size), pos, -1)
            else:
                pos = np.searchsorted(sid, iv)
                pos_c = np.minimum(pos, sid.size - 1)
                hit = (iv >= 0) & (pos < sid.size) & (sid[pos_c] == iv)
                codes = np.where(hit, pos_c, -1)
        return self.coalesce(text_codes(txt), (codes, sval))

    @staticmethod
    def coalesce(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """SQL ``COALESCE`` of two (codes, values) string columns."""
        ca, va = a
        cb, vb = b
        if not len(va):
            return cb, vb
        if not len(vb):
            return ca, va
        present = np.append(np.array([v is not None for v in va], dtype=bool), False)
        codes = np.where(present[ca], ca, np.where(cb >= 0, cb + len(va), -1))
        return codes, np.concatenate([va, vb])

    def threads(self, api: pd.DataFrame | None, ranges: pd.DataFrame | None) -> pd.DataFrame:
        t = "ThreadNames"
        if t in self.tables and "globalTid" in self.cols(t):
            name, join = self.string(t, "tn", "nameId", "sn")
            # a thread renamed during the capture has several rows: keep the last one
            df = self.query(
                f"SELECT {_PID.format(col='tn.globalTid')} AS pid, {_TID.format(col='tn.globalTid')} AS tid, "
                f"{name} AS name FROM {t} tn {join} "
                f"WHERE tn.rowid IN (SELECT max(rowid) FROM {t} GROUP BY globalTid)"
            )
        else:
            df = pd.DataFrame({"pid": pd.Series(dtype="int64"), "tid": pd.Series(dtype="int64"),
                               "name": pd.Series(dtype=object)})
        # threads that call CUDA or NVTX but were never named (Windows captures, some
        # OpenACC runs) still get a row, with name None
        df = df.dropna(subset=["pid", "tid"])
        seen = [_distinct_threads(x) for x in (api, ranges) if x is not None and len(x)]
        if seen:
            act = pd.concat(seen).dropna().astype("int64").drop_duplicates()
            known = pd.MultiIndex.from_frame(df[["pid", "tid"]].astype("int64"))
            missing = act[~pd.MultiIndex.from_frame(act.astype("int64")).isin(known)]
            if len(missing):
                self.repairs.append(f"{len(missing)} active threads missing from ThreadNames: added with no name")
                df = pd.concat([df, missing.assign(name=None)], ignore_index=True)
        return df.sort_values(["pid", "tid"], ignore_index=True)

    # --- devices ------------------------------------------------------------------------
    def devices(self, tables: dict[str, pd.DataFrame | None]) -> pd.DataFrame | None:
        """The CUDA devices that any GPU activity row names (``deviceId``), described
        from whichever GPU table the export has."""
        src = {"kernels": K + "KERNEL", "memcpys": K + "MEMCPY", "memsets": K + "MEMSET",
               "syncs": K + "SYNCHRONIZATION", "graphs": K + "GRAPH_TRACE"}
        seen = [pd.unique(pd.to_numeric(tables[k]["device"]).dropna()) for k, t in src.items()
                if tables.get(k) is not None and "deviceId" in self.cols(t)]
        if not seen:
            return None
        used = sorted({int(d) for arr in seen for d in arr})
        info = self._device_info()
        rows = []
        for d in used:
            name, sm = info.get(d, (None, None))
            rows.append({"device": d, "name": name, "sm_count": sm})
        if used and not info:
            self.repairs.append("no GPU description table: device names unknown")
        return pd.DataFrame(rows)

    def _device_info(self) -> dict[int, tuple[str | None, int | None]]:
        """CUDA device index -> (name, SM count), from whichever table this export has.

        ``TARGET_INFO_GPU`` lists every GPU of the machine (also iGPUs and the Windows
        basic render driver) and its ``id`` may differ from the CUDA index ``cuDevice``;
        the activity tables' ``deviceId`` is the CUDA index. 2025.1+ also maps them
        explicitly in ``TARGET_INFO_CUDA_DEVICE(gpuId, cudaId)``."""
        out: dict[int, tuple[str | None, int | None]] = {}
        g = "TARGET_INFO_GPU"
        gcols = self.cols(g)
        gpu = None
        if g in self.tables and "name" in gcols:
            id_col = "id" if "id" in gcols else ("deviceId" if "deviceId" in gcols else None)
            if id_col is not None:
                gpu = self.query(
                    f'SELECT "{id_col}" AS id, {self.col(g, "t", "cuDevice")} AS cu, name, '
                    f'{self.col(g, "t", "smCount")} AS sm FROM {g} t'
                )
        cd = "TARGET_INFO_CUDA_DEVICE"
        if gpu is not None and cd in self.tables and {"gpuId", "cudaId"} <= self.cols(cd):
            for cuda_id, gpu_id, nsm in self.con.execute(
                f"SELECT DISTINCT cudaId, gpuId, {self.col(cd, 'c', 'numMultiprocessors')} FROM {cd} c"
            ).fetchall():
                hit = gpu[gpu["id"] == gpu_id]
                if len(hit) and cuda_id is not None:
                    sm = _int_or_none(hit["sm"].iloc[0])
                    out.setdefault(int(cuda_id), (_str_or_none(hit["name"].iloc[0]), sm or _int_or_none(nsm)))
        if gpu is not None and len(gpu):
            gpu = gpu.assign(sm_pos=(pd.to_numeric(gpu["sm"], errors="coerce").fillna(0) > 0))
            for cu in set(pd.to_numeric(gpu["cu"], errors="coerce").dropna().astype(int)) | set(
                    pd.to_numeric(gpu["id"], errors="coerce").dropna().astype(int)):
                if cu in out:
                    continue
                # prefer a CUDA-capable GPU whose cuDevice is this index (several rows
                # share cuDevice 0 on Windows), then the row whose id is the index
                cands = gpu[gpu["cu"] == cu].sort_values(["sm_pos", "id"], ascending=[False, True], key=_bool_key)
                if not len(cands):
                    cands = gpu[gpu["id"] == cu]
                if len(cands):
                    r = cands.iloc[0]
                    out[cu] = (_str_or_none(r["name"]), _int_or_none(r["sm"]))
        cg = "TARGET_INFO_CUDA_GPU"  # <= 2021.1
        if cg in self.tables and {"deviceId", "name"} <= self.cols(cg):
            for dev, name, nsm in self.con.execute(
                f"SELECT deviceId, name, {self.col(cg, 'c', 'numMultiprocessors')} FROM {cg} c"
            ).fetchall():
                prev = out.get(int(dev))
                if prev is None or prev[1] is None:
                    out[int(dev)] = (_str_or_none(name) or (prev[0] if prev else None), _int_or_none(nsm))
        return out


# --------------------------------------------------------------------------------------
# string columns as categoricals
# --------------------------------------------------------------------------------------
def _distinct_threads(df: pd.DataFrame) -> pd.DataFrame:
    """The distinct non-null (pid, tid) pairs of a table, as int64 columns."""
    t = df[["pid", "tid"]].dropna()
    p = pd.to_numeric(t["pid"]).to_numpy(dtype=np.int64)
    q = pd.to_numeric(t["tid"]).to_numpy(dtype=np.int64)
    if len(p) and (p.min() < -(1 << 30) or p.max() >= 1 << 30 or q.min() < -(1 << 31) or q.max() >= 1 << 31):
        return t.astype("int64").drop_duplicates()  # ids beyond 32 bits: the general way
    k = pd.unique(p * (1 << 32) + (q & 0xFFFFFFFF))  # a hash pass, no sort
    lo = k & 0xFFFFFFFF
    return pd.DataFrame({"pid": (k - lo) >> 32, "tid": np.where(lo >= 1 << 31, lo - (1 << 32), lo)})


def text_codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values) of a column of text values (None = missing)."""
    if not len(s) or not s.notna().any():
        return np.full(len(s), -1, dtype=np.int64), np.zeros(0, dtype=object)
    codes, uniq = pd.factorize(s.astype(object))
    return codes.astype(np.int64), np.asarray(uniq, dtype=object)


def categorical(codes: np.ndarray, values: np.ndarray) -> pd.Categorical:
    """A pandas categorical from codes into ``values`` (which may repeat and hold None).

    Categories are the distinct values used, sorted (so sorting the column orders it as
    the plain strings would); work is per row only in numpy (``bincount``, one ``take``)."""
    n_val = len(values)
    codes = np.asarray(codes, dtype=np.int64)
    valid = codes >= 0
    if n_val == 0 or not valid.any():
        return pd.Categorical.from_codes(np.full(len(codes), -1, dtype=np.int8), categories=[])
    used = np.flatnonzero(np.bincount(codes[valid], minlength=n_val))
    vals = [values[i] for i in used]
    distinct = {v for v in vals if v is not None and not (isinstance(v, float) and v != v)}
    try:
        cats = sorted(distinct)
    except TypeError:  # mixed types (never in a real export): first-seen order
        cats = list(dict.fromkeys(v for v in vals if v in distinct))
    index = {v: i for i, v in enumerate(cats)}
    lut = np.full(n_val + 1, -1, dtype=np.int64)  # the extra last slot maps code -1
    lut[used] = [index.get(v, -1) if v in distinct else -1 for v in vals]
    return pd.Categorical.from_codes(lut[codes], categories=pd.Index(cats, dtype=object))


def enum_categorical(col: pd.Series | None, names: dict[int, str], default: str | None, n: int) -> pd.Categorical:
    """SQL ``CASE col WHEN k THEN names[k] ... ELSE default END`` as a categorical
    (``col`` None: the column is absent, every row is ``default``)."""
    if col is None:
        return categorical(np.zeros(n, dtype=np.int64), np.array([default], dtype=object))
    v = col.to_numpy() if col.dtype == np.int64 else None
    if v is not None and len(v) and 0 <= v.min() and v.max() < 1024:  # small codes: a lookup table
        values = [names.get(i, default) for i in range(int(v.max()) + 1)]
        return categorical(v, np.array(values, dtype=object))
    codes, uniq = pd.factorize(pd.to_numeric(col), use_na_sentinel=True)
    values = [names.get(int(u), default) if float(u).is_integer() else default for u in uniq] + [default]
    codes = np.where(codes < 0, len(uniq), codes)
    return categorical(codes, np.array(values, dtype=object))


def release_free_memory() -> None:
    """Hand the raw chunks' freed memory back to the system (Arrow's pool, glibc's heap),
    so the analysis starts from the size of the trace, not of the peak of the load."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except ImportError:  # pragma: no cover - a dependency
        pass
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


#: rows per read of a big table (about 50-90 MB of raw columns)
CHUNK_ROWS = 1_000_000
_FROM = re.compile(r'FROM (\S+) (\w+)$')


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame | None:
    """Chunks of one table -> one frame; categoricals are united (sorted categories)."""
    if not frames:
        return None
    if len(frames) == 1:
        return frames[0]
    cols = {}
    for c in frames[0].columns:
        if isinstance(frames[0][c].dtype, pd.CategoricalDtype):
            # the union of the chunks' (few) categories, sorted; each chunk's codes remapped
            cats = list(dict.fromkeys(v for f in frames for v in f[c].cat.categories))
            try:
                cats.sort()
            except TypeError:  # mixed types (never in a real export): first-seen order
                pass
            at = {v: i for i, v in enumerate(cats)}
            codes = np.concatenate([
                np.append(np.array([at[v] for v in f[c].cat.categories], dtype=np.int64), -1)[
                    f[c].cat.codes.to_numpy()] for f in frames])
            cols[c] = pd.Series(pd.Categorical.from_codes(codes, categories=pd.Index(cats, dtype=object)))
        elif all(isinstance(f[c].dtype, np.dtype) and f[c].dtype == frames[0][c].dtype for f in frames) \
                and frames[0][c].dtype != object:
            cols[c] = pd.Series(np.concatenate([f[c].to_numpy() for f in frames]), copy=False)
        else:
            cols[c] = pd.concat([f[c] for f in frames], ignore_index=True)
        for f in frames:  # release each chunk's column as soon as it is copied
            del f[c]
    return pd.DataFrame(cols, copy=False)


def _decode_ids(df: pd.DataFrame) -> pd.DataFrame:
    """Raw nsys columns -> canonical ones, whole-column: ``globalPid``/``globalTid``
    (``vid << 48 | pid << 24 | tid``) -> ``pid``/``tid``; ``graphNodeId`` -> ``in_graph``
    (set and non-zero). A missing id (NULL) gives pid/tid 0."""
    for raw, outs in (("gp_raw", ("pid",)), ("gt_raw", ("pid", "tid"))):
        if raw in df.columns:
            v = pd.to_numeric(df.pop(raw), errors="coerce")
            ok = v.notna().to_numpy()
            g = v.fillna(0).to_numpy().astype(np.int64)
            cols = {"pid": np.where(ok, (g >> 24) & 0xFFFFFF, 0), "tid": np.where(ok, g & 0xFFFFFF, 0)}
            for i, o in enumerate(outs):
                df.insert(2 + i, o, cols[o])
    if "ig_raw" in df.columns:
        v = pd.to_numeric(df.pop("ig_raw"), errors="coerce")
        df["in_graph"] = (v.notna() & (v != 0)).to_numpy(dtype=bool)
    return df


# --------------------------------------------------------------------------------------
# the engines: ADBC (Arrow) for the big tables, sqlite3 as the fallback
# --------------------------------------------------------------------------------------
def _adbc_available() -> bool:
    try:
        import adbc_driver_sqlite.dbapi  # noqa: F401
    except ImportError:
        return False
    return True


def _arrow_to_pandas(tab: Any) -> pd.DataFrame:
    """Arrow table -> pandas without float round trips: integer columns with nulls
    become nullable ``Int64``, text stays text. Columns are converted and released one
    at a time, so the peak is the Arrow table plus one column, not two full copies."""
    import pyarrow as pa

    cols = {}
    n = tab.num_rows
    for name in list(tab.column_names):
        col = tab.column(0)
        tab = tab.remove_column(0)
        if pa.types.is_null(col.type):
            cols[name] = pd.Series([None] * n, dtype=object)
        elif pa.types.is_integer(col.type):
            if col.null_count:
                cols[name] = pd.Series(col.to_pandas(types_mapper={col.type: pd.Int64Dtype()}.get), dtype="Int64")
            else:
                cols[name] = pd.Series(col.to_numpy(), dtype=np.int64)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            cols[name] = pd.Series(col.to_numpy(zero_copy_only=False), dtype=object)
        else:
            cols[name] = col.to_pandas()
        del col
    return pd.DataFrame(cols, copy=False)


#: the only columns the big SELECTs return as text (NVTX's inline text); every other
#: column is an integer (an id, a code, a time)
TEXT_COLUMNS = ("tx_txt",)


class _Engine:
    """Runs the big ``SELECT``s: with ADBC, each on its own read-only connection in a
    pool of two threads (the driver steps SQLite and builds Arrow buffers without the
    GIL); with sqlite3 (``engine="sqlite3"``, or when ADBC refuses a query, e.g. a
    column whose values change type mid-table) through ``pandas.read_sql_query``."""

    def __init__(self, uri: str, con: sqlite3.Connection, engine: str) -> None:
        self.uri = uri
        self.con = con
        self.engine = engine

    def run(self, sql: str) -> pd.DataFrame:
        if self.engine == "adbc":
            import adbc_driver_manager
            import adbc_driver_sqlite.dbapi as dbapi

            import pyarrow as pa

            try:
                with dbapi.connect(self.uri) as c, c.cursor() as cur:
                    cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": "65536"})
                    cur.execute(sql)
                    tab = cur.fetch_arrow_table()
                # the reader types a column from its first batch and turns the integers of a
                # column that also holds text into strings ("3"): such a (rare) table is read
                # through sqlite3, which keeps each value's own type
                if not any(pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                           for f in tab.schema if f.name not in TEXT_COLUMNS):
                    return _arrow_to_pandas(tab)
                del tab
            except adbc_driver_manager.Error as e:
                if "Type mismatch" not in str(e):
                    raise sqlite3.DatabaseError(_one_line(e)) from None
        with contextlib.closing(sqlite3.connect(self.uri, uri=True)) as con:
            return pd.read_sql_query(sql, con)

# --------------------------------------------------------------------------------------
# vectorized helpers
# --------------------------------------------------------------------------------------
def nesting_depth(df: pd.DataFrame) -> np.ndarray:
    """Nesting level of each range on its ``(pid, tid)``: how many other ranges of the
    same thread are open when it starts (0 = outermost).

    One sort over start/end events and a cumulative sum, no Python loop: each range adds
    +1 at its start and -1 at its end; per thread the running sum returns to 0, so one
    global cumsum is correct once events are grouped by thread. At equal timestamps ends
    close before starts (adjacent ranges are siblings), longer ranges open first (the
    parent), and a zero-length range closes after the starts at its timestamp."""
    n = len(df)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    grp = pd.factorize(pd.MultiIndex.from_arrays([df["pid"].to_numpy(), df["tid"].to_numpy()]))[0]
    start = df["start"].to_numpy(dtype=np.int64)
    end = df["end"].to_numpy(dtype=np.int64)
    end = np.maximum(end, start)
    zero = end == start
    g = np.concatenate([grp, grp])
    t = np.concatenate([start, end])
    # order at equal (thread, time): 0 = end of a non-empty range, 1 = start, 2 = end of an empty one
    phase = np.concatenate([np.ones(n, dtype=np.int8), np.where(zero, 2, 0).astype(np.int8)])
    longer_first = np.concatenate([-end, np.zeros(n, dtype=np.int64)])
    order = np.lexsort((longer_first, phase, t, g))
    delta = np.concatenate([np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)])[order]
    running = np.cumsum(delta)
    is_start = order < n
    depth = np.empty(n, dtype=np.int64)
    depth[order[is_start]] = running[is_start] - 1
    return depth


def _case(expr: str, codes: dict[int, str], default: str) -> str:
    if expr == "NULL":
        return default
    whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in codes.items())
    return f"CASE {expr} {whens} ELSE {default} END"


def _bool_key(s: pd.Series) -> pd.Series:
    return s.astype("int64") if s.dtype == bool else s


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _str_or_none(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return str(v)


def _int_or_none(v: Any) -> int | None:
    try:
        if v is None or pd.isna(v):
            return None
        return int(v)
    except (TypeError, ValueError):
        return None
