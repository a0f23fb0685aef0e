"""Nsight Systems SQLite export -> canonical :class:`~recsys_doctor.model.Trace`.

The export is already a database, so this loader lets SQLite do the work: every table
is read with one ``SELECT`` that resolves strings with ``LEFT JOIN StringIds``, decodes
``globalTid``/``globalPid`` with bit arithmetic and maps enum codes with ``CASE``. Python
only post-processes whole columns (the ``_vNNNN`` suffix strip, the NVTX nesting depth).

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BadInputError, TraceFormatError
from ..model import Trace

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
def load_nsys_sqlite(path: str | os.PathLike[str]) -> Trace:
    """Load an Nsight Systems SQLite export (``.sqlite``, or gzip-compressed ``.sqlite.gz``).

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
            trace = _load_file(tmp, shown=p)
        trace.meta["compressed"] = "gzip"
        return trace
    return _load_file(p, shown=p)


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


def _load_file(p: Path, shown: Path) -> Trace:
    _check_header(p, shown)
    # immutable=1: no locks, no journal/-shm files, works on read-only media; the
    # export is never written to.
    uri = p.resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as e:
        raise TraceFormatError(f"{shown}: cannot open as SQLite ({_one_line(e)})") from None
    try:
        return _Reader(con, shown).read()
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
    def __init__(self, con: sqlite3.Connection, shown: Path) -> None:
        self.con = con
        self.shown = shown
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
        return (
            f'{a}.start AS start, {a}."end" AS "end", '
            f"{_PID.format(col=gp) if gp != 'NULL' else '0'} AS pid, "
            f"{self.col(table, a, 'deviceId', '0')} AS device, {self.col(table, a, 'streamId', '0')} AS stream, "
            f"{self.col(table, a, 'correlationId', '0')} AS correlation"
        )

    def in_graph(self, table: str, a: str) -> str:
        g = self.col(table, a, "graphNodeId")
        return "0" if g == "NULL" else f"CASE WHEN {g} IS NOT NULL AND {g} != 0 THEN 1 ELSE 0 END"

    # --- read everything -----------------------------------------------------------
    def read(self) -> Trace:
        if not self.has_strings and not any(t.startswith(("CUPTI_", "NVTX_")) for t in self.tables):
            raise TraceFormatError(
                f"{self.shown}: an SQLite database but not an Nsight Systems export "
                "(no StringIds and no CUPTI_/NVTX_ tables); export with `nsys export --type sqlite`"
            )
        self.read_meta()
        tables = {
            "kernels": self.kernels(), "memcpys": self.memcpys(), "memsets": self.memsets(),
            "api": self.api(), "syncs": self.syncs(), "graphs": self.graphs(), "ranges": self.ranges(),
        }
        tables["threads"] = self.threads(tables["api"], tables["ranges"])
        tables["devices"] = self.devices()
        self.meta["tables_missing"] = [t for t in READ_TABLES if t not in self.tables]
        if self.repairs:
            self.meta["repairs"] = self.repairs
        for k, df in tables.items():
            if df is not None and len(df) and "start" in df.columns:
                tables[k] = df.sort_values("start", kind="stable", ignore_index=True)
        return Trace(path=str(self.shown), format="nsys-sqlite", meta=self.meta, **tables)

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
    def kernels(self) -> pd.DataFrame | None:
        t = K + "KERNEL"
        if t not in self.tables:
            return None
        dn, jd = self.string(t, "k", "demangledName", "dn")
        sn, js = self.string(t, "k", "shortName", "sn")
        dims = ", ".join(
            f"{self.col(t, 'k', c)} AS {o}" for c, o in (
                ("gridX", "grid_x"), ("gridY", "grid_y"), ("gridZ", "grid_z"),
                ("blockX", "block_x"), ("blockY", "block_y"), ("blockZ", "block_z"))
        )
        return self.query(
            f"SELECT {self.gpu_common(t, 'k')}, COALESCE({dn}, {sn}) AS name, {dims}, "
            f"{self.in_graph(t, 'k')} AS in_graph FROM {t} k {jd} {js}"
        )

    def memcpys(self) -> pd.DataFrame | None:
        t = K + "MEMCPY"
        if t not in self.tables:
            return None
        kind = _case(self.col(t, "m", "copyKind"), COPY_KIND_CODES, "'other'")
        src = _case(self.col(t, "m", "srcKind"), MEM_KIND_CODES, "NULL")
        dst = _case(self.col(t, "m", "dstKind"), MEM_KIND_CODES, "NULL")
        return self.query(
            f"SELECT {self.gpu_common(t, 'm')}, {self.col(t, 'm', 'bytes', '0')} AS bytes, {kind} AS kind, "
            f"{src} AS src_mem, {dst} AS dst_mem, {self.in_graph(t, 'm')} AS in_graph FROM {t} m"
        )

    def memsets(self) -> pd.DataFrame | None:
        t = K + "MEMSET"
        if t not in self.tables:
            return None
        return self.query(
            f"SELECT {self.gpu_common(t, 's')}, {self.col(t, 's', 'bytes', '0')} AS bytes, "
            f"{self.in_graph(t, 's')} AS in_graph FROM {t} s"
        )

    def syncs(self) -> pd.DataFrame | None:
        t = K + "SYNCHRONIZATION"
        if t not in self.tables:
            return None
        st = self.col(t, "y", "syncType")
        if st == "NULL":  # only the deprecated column (never seen, but cheap to handle)
            st = self.col(t, "y", "deprecatedSyncType")
        return self.query(
            f"SELECT {self.gpu_common(t, 'y')}, {_case(st, SYNC_TYPE_CODES, repr('unknown'))} AS sync_type FROM {t} y"
        )

    def graphs(self) -> pd.DataFrame | None:
        t = K + "GRAPH_TRACE"
        if t not in self.tables:
            return None
        return self.query(f"SELECT {self.gpu_common(t, 'g')}, {self.col(t, 'g', 'graphId')} AS graph_id FROM {t} g")

    # --- CPU side -----------------------------------------------------------------------
    def api(self) -> pd.DataFrame | None:
        t = K + "RUNTIME"
        if t not in self.tables:
            return None
        name, join = self.string(t, "r", "nameId", "sn")
        gt = self.col(t, "r", "globalTid")
        ec = self.col(t, "r", "eventClass")
        where = ""
        if ec != "NULL":
            cls = f"CASE {ec} WHEN 0 THEN 'runtime' WHEN 1 THEN 'driver' END"
            where = f"WHERE {ec} IN (0, 1)"
            skipped = self.con.execute(f"SELECT count(*) FROM {t} r WHERE {ec} NOT IN (0, 1)").fetchone()[0]
            if skipped:
                self.meta["api_rows_skipped"] = int(skipped)  # e.g. eventClass 67 backtrace duplicates
        else:
            cls = "NULL"
        df = self.query(
            f'SELECT r.start AS start, r."end" AS "end", {_PID.format(col=gt)} AS pid, {_TID.format(col=gt)} AS tid, '
            f"{self.col(t, 'r', 'correlationId', '0')} AS correlation, {name} AS name, {cls} AS api_class "
            f"FROM {t} r {join} {where}"
        )
        if len(df) and "callchainId" in self.cols(t) and "CUDA_CALLCHAINS" in self.tables and self.has_strings:
            bt = self.query(  # --cudabacktrace: duplicate rows carry the chain, same correlation
                f"SELECT {_PID.format(col=gt)} AS pid, {self.col(t, 'r', 'correlationId', '0')} AS correlation, "
                f"r.callchainId AS chain, {name} AS name FROM {t} r {join} WHERE r.callchainId IS NOT NULL")
            if len(bt):
                sites = self.callsites(bt)
                df = df.merge(sites, on=["pid", "correlation"], how="left")
        if len(df):
            codes, uniq = pd.factorize(df["name"])
            clean = np.array([_API_SUFFIX.sub("", u) if isinstance(u, str) else u for u in uniq], dtype=object)
            df["name"] = pd.Series(clean.take(codes), dtype=object).where(codes >= 0, None)
            if ec == "NULL":  # no class column: the driver API is the cu* namespace
                s = df["name"].astype(str)
                df["api_class"] = np.where(s.str.startswith("cu") & ~s.str.startswith("cuda"), "driver", "runtime")
        return df

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

    def ranges(self) -> pd.DataFrame | None:
        t = "NVTX_EVENTS"
        if t not in self.tables:
            return None
        text = self.col(t, "n", "text")
        reg, join = self.string(t, "n", "textId", "sn")
        gt = self.col(t, "n", "globalTid")
        types = ", ".join(map(str, NVTX_RANGE_TYPES))
        counts = dict(self.con.execute(f"SELECT eventType, count(*) FROM {t} GROUP BY eventType").fetchall())
        if counts.get(NVTX_MARK_TYPE):
            self.meta["nvtx_marks_skipped"] = int(counts[NVTX_MARK_TYPE])
        open_ended = self.con.execute(
            f'SELECT count(*) FROM {t} WHERE eventType IN ({types}) AND "end" IS NULL'
        ).fetchone()[0]
        end = 'n."end"'
        if open_ended:
            # a range still open when collection stopped: it lasted at least to the last
            # NVTX timestamp seen
            end = f'COALESCE(n."end", (SELECT max(COALESCE("end", start)) FROM {t}))'
            self.repairs.append(f"{open_ended} NVTX ranges had no end: closed at the last NVTX timestamp")
        df = self.query(
            f"SELECT n.start AS start, {end} AS \"end\", {_PID.format(col=gt)} AS pid, {_TID.format(col=gt)} AS tid, "
            f"COALESCE({text}, {reg}) AS name, 'nvtx' AS source FROM {t} n {join} "
            f"WHERE n.eventType IN ({types})"
        )
        if len(df):
            df["depth"] = nesting_depth(df)
        return df

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
        seen = [x[["pid", "tid"]] for x in (api, ranges) if x is not None and len(x)]
        if seen:
            act = pd.concat(seen).dropna().astype("int64").drop_duplicates()
            known = pd.MultiIndex.from_frame(df[["pid", "tid"]].astype("int64"))
            missing = act[~pd.MultiIndex.from_frame(act.astype("int64")).isin(known)]
            if len(missing):
                self.repairs.append(f"{len(missing)} active threads missing from ThreadNames: added with no name")
                df = pd.concat([df, missing.assign(name=None)], ignore_index=True)
        return df.sort_values(["pid", "tid"], ignore_index=True)

    # --- devices ------------------------------------------------------------------------
    def devices(self) -> pd.DataFrame | None:
        parts = [f'SELECT DISTINCT deviceId FROM "{t}"' for t in GPU_TABLES
                 if t in self.tables and "deviceId" in self.cols(t)]
        if not parts:
            return None
        used = sorted(int(r[0]) for r in self.con.execute(" UNION ".join(parts)).fetchall() if r[0] is not None)
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
