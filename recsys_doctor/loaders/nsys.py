"""Nsight Systems SQLite export -> canonical :class:`~recsys_doctor.model.Trace`.

The export is already a database. Its big tables hold only integers: where a table's
``SELECT`` only picks columns, its rows are decoded straight from the file's b-tree
pages (:mod:`._sqlite_pages`: a C loop where the install built it, numpy otherwise;
several times faster than SQLite returning values one by one); other queries, and any
rows the page reader refuses, are read column-wise into Arrow through the ADBC SQLite
driver (no Python object per row; :mod:`._nsys_engine`); a table with a refused run is
read again whole by one full scan through the standard library's SQLite and checked
against ``count(*)``, and a corrupt one is refused in one line. The big tables are read in
chunks of about :data:`CHUNK_ROWS` rows (runs of leaf pages, or rowid ranges), two at a
time, and each chunk is decoded into its final compact columns in the same worker thread
(:mod:`._nsys_tables`, :mod:`._nsys_columns`) before more is read: memory stays near the
size of the result, not of the raw rows. Strings never travel per row: ``StringIds`` ids
and enum codes come back as integers and become pandas categoricals once, when the
chunks are joined.

The pieces: :mod:`._nsys_file` (gzip, header checks), :mod:`._nsys_schema` (tables,
columns and version of this export: exports from 2020 to 2026 differ),
:mod:`._nsys_tables` (one SELECT and decoding per activity table), :mod:`._nsys_extra`
(threads, devices, call sites).

Timestamps are kept exactly as stored (ns since session start; NVTX can be negative).
``correlation`` is unique per process only: join on ``(pid, correlation)``.
"""

from __future__ import annotations

import contextlib
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
from .._util.progress import ProgressHandle, _Quiet
from ._nsys_columns import decode_ids, release_free_memory
from ._nsys_engine import BadValue, Engine, PlainSelect, adbc_available, page_frame, plain_select
from ._nsys_extra import Extras
from ._nsys_file import GZIP_MAGIC, check_header, gunzipped, one_line
from ._nsys_schema import READ_TABLES
from ._nsys_sink import TableSink
from ._nsys_tables import COPY_KIND_CODES, MEM_KIND_CODES, SYNC_TYPE_CODES, Chunk, Job, TableJobs
from ._sqlite_pages import Corrupt, LeafRun, PageFile, Unsupported

__all__ = ["load_nsys_sqlite", "release_free_memory", "COPY_KIND_CODES", "MEM_KIND_CODES", "SYNC_TYPE_CODES"]

#: rows per read of a big table (about 50-90 MB of raw columns)
CHUNK_ROWS = 1_000_000
_FROM = re.compile(r'FROM (\S+) (\w+)$')


def _table_of(sql: str) -> str:
    """The table a read of :func:`tasks` selects from (every job's SQL ends ``FROM t a``)."""
    m = _FROM.search(sql)
    if m is None:
        raise ValueError(f"no FROM clause at the end of {sql!r}")
    return m.group(1)


def load_nsys_sqlite(path: str | os.PathLike[str], *, engine: str | None = None,
                     progress: ProgressHandle | None = None) -> Trace:
    """Load an Nsight Systems SQLite export (``.sqlite``, or gzip-compressed ``.sqlite.gz``).

    ``engine``: ``"pages"`` (the default: big integer tables decoded from the file's pages,
    everything else through ADBC, or sqlite3 where ``adbc-driver-sqlite`` is missing),
    ``"adbc"`` (every query through the ADBC SQLite driver) or ``"sqlite3"`` (the standard
    library; slower). All three give the same result. ``progress`` is advanced once per
    chunk read.

    Raises :class:`BadInputError` for a missing/unreadable path and
    :class:`TraceFormatError` (one line: the path and what is wrong) for a corrupt or
    truncated database, a corrupt gzip, or an SQLite file that is not an nsys export.
    ``sqlite3`` errors never escape.
    """
    engine = engine or "pages"
    if engine not in ("pages", "adbc", "sqlite3"):
        raise ValueError(f"engine {engine!r}: expected 'pages', 'adbc' or 'sqlite3'")
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


def _load_file(p: Path, shown: Path, engine: str, progress: ProgressHandle | None) -> Trace:
    check_header(p, shown)
    # immutable=1: no locks, no journal/-shm files, works on read-only media; the
    # export is never written to. A database whose -wal file holds changes is read
    # through SQLite with them (read-only, not immutable: SQLite needs its -shm file)
    wal = p.with_name(p.name + "-wal")
    with_wal = wal.is_file() and wal.stat().st_size > 0
    uri = p.resolve().as_uri() + ("?mode=ro" if with_wal else "?mode=ro&immutable=1")
    try:
        con = sqlite3.connect(uri, uri=True)
        if with_wal:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        if with_wal:
            raise TraceFormatError(
                f"{shown}: cannot be read with its -wal file ({one_line(e)}); checkpoint it "
                f"(sqlite3 {p.name} 'PRAGMA wal_checkpoint') or copy both files to a writable directory") from None
        raise TraceFormatError(f"{shown}: cannot open as SQLite ({one_line(e)})") from None
    pages = None
    if engine == "pages" and not with_wal:
        with contextlib.suppress(Unsupported, OSError, ValueError):  # not mappable: read through SQLite
            pages = PageFile(p)
    try:
        # (with a -wal file: sqlite3, which waits while another reader rebuilds the WAL index)
        eng = Engine(uri, "sqlite3" if engine == "sqlite3" or with_wal or not adbc_available() else "adbc")
        return _Reader(con, shown, eng, progress or _Quiet(), pages).read()
    except (sqlite3.Error, pd.errors.DatabaseError) as e:
        cause = e.__cause__ if isinstance(e, pd.errors.DatabaseError) and e.__cause__ else e
        raise TraceFormatError(f"{shown}: corrupt or truncated SQLite file ({one_line(cause)})") from None
    except BadValue as e:
        raise TraceFormatError(f"{shown}: {e}") from None
    finally:
        con.close()
        if pages is not None:
            pages.close()


#: one read: (table key, the SELECT of its rows, the leaf pages that hold them or None)
Task = tuple[str, str, "LeafRun | None"]


class _Reader(TableJobs, Extras):
    def __init__(self, con: sqlite3.Connection, shown: Path, engine: Engine, progress: ProgressHandle,
                 pages: PageFile | None = None) -> None:
        super().__init__(con, shown)
        self.engine = engine
        self.progress = progress
        self.pages = pages
        self._selects: dict[str, tuple[PlainSelect, dict[str, int]]] = {}
        self._ranged: set[str] = set()  # tables read in rowid ranges

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
        tables["os_waits"] = self.os_waits()
        self.meta["tables_missing"] = [t for t in READ_TABLES if t not in self.tables]
        if self.repairs:
            self.meta["repairs"] = self.repairs
        tables = {k: _time_ordered(df) for k, df in tables.items()}
        self.progress.advance()
        trace = Trace(path=str(self.shown), format="nsys-sqlite", meta=self.meta, **tables)
        release_free_memory()
        return trace

    def tasks(self, jobs: dict[str, Job]) -> tuple[list[Task], dict[str, int]]:
        """Every read: big tables in chunks (runs of leaf pages where the page reader can
        take the table, else rowid ranges), NVTX whole (its nesting needs the whole table
        at once); and the most rows each table can have (0 where unknown)."""
        out: list[Task] = []
        rows = {}
        for k, (sql, _) in jobs.items():
            m = _FROM.search(sql)
            runs = self.page_runs(k, sql) if k != "ranges" and m is not None else None
            if runs:
                rows[k] = sum(r.rows for r in runs)
                out += [(k, sql, r) for r in runs]
                continue
            if m is not None:
                self.check_tree(m.group(1))
            spans = [] if k == "ranges" or m is None else self.rowid_ranges(m.group(1))
            rows[k] = sum(hi - lo for lo, hi in spans) if spans and spans[0][0] > -(2**62) else 0
            if len(spans) <= 1 or m is None:
                out.append((k, sql, None))
                continue
            self._ranged.add(k)
            for lo, hi in spans:
                out.append((k, f"{sql} WHERE {m.group(2)}.rowid >= {lo} AND {m.group(2)}.rowid < {hi}", None))
        return out, rows

    def check_tree(self, table: str) -> None:
        """A table read through SQLite: refuse it where its b-tree breaks the format."""
        root = self.root(table) if self.pages is not None else None
        if root is not None and self.pages is not None:
            try:
                self.pages.check(root)
            except Corrupt as e:
                raise TraceFormatError(f"{self.shown}: {table}: {e}; the file is corrupt") from None

    def root(self, table: str) -> int | None:
        row = self.con.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?",
                               (table,)).fetchone()
        return row[0] if row is not None and isinstance(row[0], int) else None

    def page_runs(self, k: str, sql: str) -> list[LeafRun] | None:
        """The table of ``sql`` cut into runs of leaf pages, where the page reader can
        answer ``sql`` (a plain SELECT of integer columns of an ordinary rowid table)."""
        sel = plain_select(sql)
        if self.pages is None or sel is None:
            return None
        info = self.con.execute(f'PRAGMA table_xinfo("{sel.table}")').fetchall()
        # cid, name, type, notnull, default, pk, hidden: a generated (hidden) column is
        # not stored in the records, an INTEGER PRIMARY KEY is stored as the rowid
        if any(r[6] for r in info) or any(r[5] for r in info if r[1] in {c for _, c, _ in sel.items}):
            return None
        root = self.root(sel.table)
        if root is None:
            return None
        try:
            runs = self.pages.runs(root, CHUNK_ROWS)
        except Corrupt as e:
            raise TraceFormatError(f"{self.shown}: {sel.table}: {e}; the file is corrupt") from None
        except Unsupported:
            return None
        self._selects[k] = (sel, {r[1]: i for i, r in enumerate(info)})
        return runs or None

    def read_chunks(self, jobs: dict[str, Job], tasks: list[Task],
                    rows: dict[str, int]) -> dict[str, TableSink]:
        """Every table, its chunks written in order. Workers read and decode; this thread
        keeps a few reads ahead, writes each chunk into its table and moves the bar.

        A table one of whose runs of pages the page reader refuses is read again whole,
        by a full scan through SQLite (the reference a reader of the file gets), and so is
        a table read in rowid ranges whose rows do not add up to SQLite's own count (a
        range ends early, without an error, on a corrupt b-tree)."""
        def work(k: str, sql: str, run: LeafRun | None) -> tuple[int, Chunk] | None:
            df = self.read_rows(k, sql, run)
            return None if df is None else (len(df), jobs[k][1](decode_ids(df)))

        parts = {k: TableSink(rows[k]) for k in jobs}
        read = dict.fromkeys(jobs, 0)
        refused: set[str] = set()
        workers = 2 if self.engine.engine == "adbc" or self.pages is not None else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque[tuple[str, Future[tuple[int, Chunk] | None]]] = deque()
            todo = iter(tasks)
            for t in islice(todo, workers + 1):
                pending.append((t[0], pool.submit(work, *t)))
            while pending:
                k, fut = pending.popleft()
                got = fut.result()
                if got is None:
                    refused.add(k)
                elif k not in refused:
                    read[k] += got[0]
                    parts[k].write(got[1])
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt[0], pool.submit(work, *nxt)))
                self.progress.update(description=f"loading {self.shown.name}: {k}")
                self.progress.advance()
        for k in sorted(self._ranged - refused):
            if read[k] != self.count(jobs[k][0]):
                refused.add(k)
        for k in sorted(refused):
            parts[k] = self.read_whole(k, jobs[k])
        return parts

    def read_whole(self, k: str, job: Job) -> TableSink:
        """Table ``k`` by one full scan through the standard library's SQLite (the reference
        reader: the ADBC driver bundles another SQLite, which reads some corrupt pages
        that it calls malformed), its rows checked against SQLite's own count."""
        df = Engine(self.engine.uri, "sqlite3").run(job[0])
        n = self.count(job[0])
        if len(df) != n:
            raise TraceFormatError(f"{self.shown}: {_table_of(job[0])}: SQLite counts {n} rows, "
                                   f"a full scan reads {len(df)}; the file is corrupt")
        sink = TableSink(len(df))
        sink.write(job[1](decode_ids(df)))
        return sink

    def count(self, sql: str) -> int:
        """SQLite's own count of the rows of the table ``sql`` reads."""
        table = _table_of(sql)
        return int(self.con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])

    def read_rows(self, k: str, sql: str, run: LeafRun | None) -> pd.DataFrame | None:
        """One chunk's raw columns: from its leaf pages (None where the page reader refuses
        them), or through SQL where there are none."""
        if run is not None and self.pages is not None:  # (runs are made only where there is one)
            sel, position = self._selects[k]
            pages = self.pages
            try:
                return page_frame(sel, position, lambda cols: pages.read(run, cols))
            except Corrupt as e:
                raise TraceFormatError(f"{self.shown}: {sel.table}: {e}; the file is corrupt") from None
            except Unsupported:
                return None
        return self.engine.run(sql)

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
