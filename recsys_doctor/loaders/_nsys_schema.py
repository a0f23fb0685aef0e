"""What an nsys export holds: its tables and columns, its version, and the SQL pieces
that select a column only where the export has it.

Real exports from 2020 to 2026 differ (``/work/shared/traces/nsys/SCHEMAS.md`` documents
the corpus this was written against): the version lives in ``META_DATA_EXPORT``
(2023.3+), ``EXPORT_META_DATA`` (2022.1 to 2023.2) or nowhere (older; then the install
path in ``StringIds`` may tell); empty tables are left out; columns come and go between
versions and other tools (DLProf, pipit) add their own, so every column is selected by
name after checking ``PRAGMA table_info``.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ._nsys_columns import Strings, as_str

__all__ = ["Schema", "K", "READ_TABLES", "PID_SQL", "TID_SQL"]

K = "CUPTI_ACTIVITY_KIND_"
#: the tables this loader reads; absent ones are reported in ``meta["tables_missing"]``
READ_TABLES = (
    K + "KERNEL", K + "MEMCPY", K + "MEMSET", K + "SYNCHRONIZATION", K + "RUNTIME",
    K + "GRAPH_TRACE", "NVTX_EVENTS", "ThreadNames", "StringIds",
)
PID_SQL = "(({col} >> 24) & 16777215)"  # globalTid/globalPid = vid<<48 | pid<<24 | tid
TID_SQL = "({col} & 16777215)"
_VERSION_IN_PATH = re.compile(r"nsight[-_ ]?systems[-/_ ]*(20\d\d\.\d+(?:\.\d+)*)", re.IGNORECASE)
_HPCSDK_IN_PATH = re.compile(r"hpc_sdk/[^/]+/(\d+\.\d+)/\S*nsys", re.IGNORECASE)


class Schema:
    """An open export: which tables and columns it has, its metadata, its strings."""

    def __init__(self, con: sqlite3.Connection, shown: Path) -> None:
        self.con = con
        self.shown = shown
        rows = con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')").fetchall()
        self.tables = {r[0] for r in rows}
        self._cols: dict[str, set[str]] = {}
        self._strings: Strings | None = None
        self.meta: dict[str, Any] = {}
        self.repairs: list[str] = []
        #: guards ``meta`` updates made by the decoding in worker threads
        self.lock = threading.Lock()

    # --- columns -----------------------------------------------------------------
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
        """(select expression, join clause) resolving an id column through StringIds in SQL
        (for the small tables). A column that already holds text (some post-processing
        tools do that) is used as is."""
        if id_col not in self.cols(table):
            return "NULL", ""
        if not self.has_strings:
            return f"CASE WHEN typeof({alias}.\"{id_col}\")='text' THEN {alias}.\"{id_col}\" END", ""
        expr = f"CASE WHEN typeof({alias}.\"{id_col}\")='text' THEN {alias}.\"{id_col}\" ELSE {join_alias}.value END"
        return expr, f'LEFT JOIN StringIds {join_alias} ON {join_alias}.id = {alias}."{id_col}"'

    def string_cols(self, table: str, alias: str, id_col: str, out: str) -> str:
        """A StringIds reference, raw: an integer id, or the text itself where the column
        already holds text; :meth:`Strings.resolve` decodes it."""
        if id_col not in self.cols(table):
            return f"NULL AS {out}"
        return f'{alias}."{id_col}" AS {out}'

    def strings(self) -> Strings:
        """``StringIds`` as sorted ids and their values, read once."""
        if self._strings is None:
            if self.has_strings:
                st = self.query("SELECT id, value FROM StringIds WHERE typeof(id) = 'integer' ORDER BY id")
                self._strings = Strings(st["id"].to_numpy(dtype=np.int64), st["value"].to_numpy(dtype=object))
            else:
                self._strings = Strings(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))
        return self._strings

    def gpu_common(self, table: str, a: str) -> str:
        """start, end, pid, device, stream, correlation of a GPU activity table."""
        gp = self.col(table, a, "globalPid")
        if gp == "NULL":
            self.repairs.append(f"{table} has no globalPid column: pid set to 0")
        # raw columns only: decoding in SQL (bit arithmetic, CASE) would cost SQLite more
        # than reading the rows; decode_ids does it on whole columns
        return (
            f'{a}.start AS start, {a}."end" AS "end", {gp if gp != "NULL" else "0"} AS gp_raw, '
            f"{self.col(table, a, 'deviceId', '0')} AS device, {self.col(table, a, 'streamId', '0')} AS stream, "
            f"{self.col(table, a, 'correlationId', '0')} AS correlation"
        )

    def in_graph(self, table: str, a: str) -> str:
        g = self.col(table, a, "graphNodeId")
        return "0" if g == "NULL" else g

    # --- metadata ------------------------------------------------------------------
    def read_meta(self) -> None:
        m = self.meta
        m["nsys_version"] = None
        for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if t in self.tables and {"name", "value"} <= self.cols(t):
                kv = dict(self.con.execute(f'SELECT name, value FROM "{t}"').fetchall())
                m["metadata_table"] = t
                m["nsys_version"] = as_str(kv.get("EXPORT_PRODUCT_VERSION"))
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


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))
