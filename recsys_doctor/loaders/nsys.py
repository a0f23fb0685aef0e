"""Nsight Systems SQLite export -> canonical :class:`~recsys_doctor.model.Trace`.

The export is already a database, so this loader lets SQLite select the columns and
reads each big table column-wise into Arrow through the ADBC SQLite driver (no Python
object per row; :mod:`._nsys_engine`). The big tables are read in rowid chunks of
:data:`CHUNK_ROWS`, two at a time on separate connections, and each chunk is decoded into
its final compact columns in the same worker thread (:mod:`._nsys_tables`,
:mod:`._nsys_columns`) before more is read: memory stays near the size of the result,
not of the raw rows. Strings never travel per row: ``StringIds`` ids and enum codes come
back as integers and become pandas categoricals once, when the chunks are joined.

The pieces: :mod:`._nsys_file` (gzip, header checks), :mod:`._nsys_schema` (tables,
columns and version of this export: exports from 2020 to 2026 differ),
:mod:`._nsys_tables` (one SELECT and decoding per activity table), :mod:`._nsys_extra`
(threads, devices, call sites).

Timestamps are kept exactly as stored (ns since session start; NVTX can be negative).
``correlation`` is unique per process only: join on ``(pid, correlation)``.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BadInputError, TraceFormatError
from ..model import Trace
from ..progress import ProgressHandle, _Quiet
from ._nsys_columns import decode_ids, release_free_memory
from ._nsys_engine import Engine, adbc_available
from ._nsys_extra import Extras
from ._nsys_file import GZIP_MAGIC, check_header, gunzipped, one_line
from ._nsys_schema import READ_TABLES
from ._nsys_sink import TableSink
from ._nsys_tables import COPY_KIND_CODES, MEM_KIND_CODES, SYNC_TYPE_CODES, Chunk, Job, TableJobs

__all__ = ["load_nsys_sqlite", "release_free_memory", "COPY_KIND_CODES", "MEM_KIND_CODES", "SYNC_TYPE_CODES"]

#: rows per read of a big table (about 50-90 MB of raw columns)
CHUNK_ROWS = 1_000_000
_FROM = re.compile(r'FROM (\S+) (\w+)$')


def load_nsys_sqlite(path: str | os.PathLike[str], *, engine: str | None = None,
                     progress: ProgressHandle | None = None) -> Trace:
    """Load an Nsight Systems SQLite export (``.sqlite``, or gzip-compressed ``.sqlite.gz``).

    ``engine``: ``"adbc"`` (the default when ``adbc-driver-sqlite`` is installed, which
    it is with the package) or ``"sqlite3"`` (the standard library; slower, same
    result). ``progress`` is advanced once per chunk read.

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
        with gunzipped(p) as tmp:
            trace = _load_file(tmp, shown=p, engine=engine, progress=progress)
        trace.meta["compressed"] = "gzip"
        return trace
    return _load_file(p, shown=p, engine=engine, progress=progress)


def _load_file(p: Path, shown: Path, engine: str | None, progress: ProgressHandle | None) -> Trace:
    check_header(p, shown)
    # immutable=1: no locks, no journal/-shm files, works on read-only media; the
    # export is never written to.
    uri = p.resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as e:
        raise TraceFormatError(f"{shown}: cannot open as SQLite ({one_line(e)})") from None
    try:
        eng = Engine(uri, engine or ("adbc" if adbc_available() else "sqlite3"))
        return _Reader(con, shown, eng, progress or _Quiet()).read()
    except (sqlite3.Error, pd.errors.DatabaseError) as e:
        cause = e.__cause__ if isinstance(e, pd.errors.DatabaseError) and e.__cause__ else e
        raise TraceFormatError(f"{shown}: corrupt or truncated SQLite file ({one_line(cause)})") from None
    finally:
        con.close()


class _Reader(TableJobs, Extras):
    def __init__(self, con: sqlite3.Connection, shown: Path, engine: Engine, progress: ProgressHandle) -> None:
        super().__init__(con, shown)
        self.engine = engine
        self.progress = progress

    def read(self) -> Trace:
        if not self.has_strings and not any(t.startswith(("CUPTI_", "NVTX_")) for t in self.tables):
            raise TraceFormatError(
                f"{self.shown}: an SQLite database but not an Nsight Systems export "
                "(no StringIds and no CUPTI_/NVTX_ tables); export with `nsys export --type sqlite`"
            )
        self.read_meta()
        jobs = self.jobs()  # reads StringIds once, here, not raced by the workers
        tasks, rows = self.tasks(jobs)
        self.progress.update(total=len(tasks) + 1, completed=0)
        tables: dict[str, Any] = {k: s.frame() for k, s in self.read_chunks(jobs, tasks, rows).items()}
        if tables.get("api") is not None:
            tables["api"] = self.attach_callsites(tables["api"])
        tables["threads"] = self.threads(tables.get("api"), tables.get("ranges"))
        tables["devices"] = self.devices(tables)
        self.meta["tables_missing"] = [t for t in READ_TABLES if t not in self.tables]
        if self.repairs:
            self.meta["repairs"] = self.repairs
        tables = {k: _time_ordered(df) for k, df in tables.items()}
        self.progress.advance()
        trace = Trace(path=str(self.shown), format="nsys-sqlite", meta=self.meta, **tables)
        release_free_memory()
        return trace

    def tasks(self, jobs: dict[str, Job]) -> tuple[list[tuple[str, str]], dict[str, int]]:
        """(table, SELECT) of every read: big tables in rowid chunks, NVTX whole (its
        nesting needs the whole table at once); and the most rows each table can have
        (its rowid span; 0 where unknown)."""
        out: list[tuple[str, str]] = []
        rows = {}
        for k, (sql, _) in jobs.items():
            m = _FROM.search(sql)
            spans = [] if k == "ranges" or m is None else self.rowid_ranges(m.group(1))
            rows[k] = sum(hi - lo for lo, hi in spans) if spans and spans[0][0] > -(2**62) else 0
            if not spans:
                out.append((k, sql))
            for lo, hi in spans:
                out.append((k, f"{sql} WHERE {m.group(2)}.rowid >= {lo} AND {m.group(2)}.rowid < {hi}"))
        return out, rows

    def read_chunks(self, jobs: dict[str, Job], tasks: list[tuple[str, str]],
                    rows: dict[str, int]) -> dict[str, TableSink]:
        """Every table, its chunks written in order. Workers read and decode; this thread
        keeps a few reads ahead, writes each chunk into its table and moves the bar."""
        def work(k: str, sql: str) -> Chunk:
            return jobs[k][1](decode_ids(self.engine.run(sql)))

        parts = {k: TableSink(rows[k]) for k in jobs}
        workers = 2 if self.engine.engine == "adbc" else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque[tuple[str, Future[Chunk]]] = deque()
            todo = iter(tasks)
            for k, q in islice(todo, workers + 1):
                pending.append((k, pool.submit(work, k, q)))
            while pending:
                k, fut = pending.popleft()
                parts[k].write(fut.result())
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt[0], pool.submit(work, *nxt)))
                self.progress.update(description=f"loading {self.shown.name}: {k}")
                self.progress.advance()
        return parts

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


def _time_ordered(df: pd.DataFrame | None) -> pd.DataFrame | None:
    """``df`` sorted by start (stable); exports are mostly in time order already."""
    if df is None or not len(df) or "start" not in df.columns:
        return df
    st = pd.to_numeric(df["start"]).to_numpy()
    if (st[1:] >= st[:-1]).all():
        return df
    return df.take(np.argsort(st, kind="stable")).reset_index(drop=True)
