"""The run history: every ``advise``/``check`` run as one row of an SQLite database.

Why: a single trace says "the GPU is 14% busy"; a history says "it was 41% last week,
on main, before commit abc123". ``check --baseline-db BRANCH`` and the HTML report's
utilization trend read it back.

Where: ``platformdirs.user_data_dir("recsys-doctor")/history.db`` unless ``--db`` or the
environment variable ``RECSYS_DOCTOR_DB`` names another file.

Several CI jobs may record at the same moment: the database runs in WAL mode with a
busy timeout, each row is written in its own short ``BEGIN IMMEDIATE`` transaction (schema
check and insert under one write lock), and a write that still meets ``database is
locked`` is retried with backoff, so no row is lost or half-written. Tables, columns,
indexes and queries go through sqlite-utils; the row itself is built in
:mod:`recsys_doctor.history.row`.

Table ``runs`` (one row per run, one per rank of an ``advise DIR`` run; summary metrics as columns
for SQL, plus JSON):

=============================  ====================================================
``id``                         row id (integer primary key)
``when_utc``                   ISO 8601 UTC time of the run (``2026-11-21T04:45:00+00:00``)
``command``                    ``advise`` or ``check``
``workload``                   trace file name without its extension(s) (for display)
``workload_key``               what makes two runs comparable (:func:`workload_key`): the
                               trace's path (relative to the git top level when inside
                               a repository), the GPUs, the analysis window (``--start``,
                               ``--end``, ``--nvtx``) and the options that change numbers;
                               a baseline is looked up by it
``trace_path``, ``trace_sha256``  the trace file and its content hash
``tool_version``               recsys-doctor version
``gpus``                       GPU name(s) in the trace, ``"; "``-joined
``git_commit``, ``git_branch`` of the working directory, when it is inside a git repo
``gpu_utilization`` ...        the summary metrics listed in :data:`METRIC_COLUMNS`
``summary_json``               the whole summary
``findings_json``              ``[{id, severity, title}, ...]``
``finding_ids``                comma-joined ids (for SQL ``LIKE``)
``passed``                     ``check`` only: 1 passed, 0 failed; ``reasons_json`` why.
                               Only passed checks (and ``check --write-baseline`` runs,
                               recorded as passed) can become a ``--baseline-db`` baseline
=============================  ====================================================

History is a side effect: when it cannot be written or read (unwritable home, read-only or
corrupt database) the commands warn in one line and still print their result.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlite_utils import Database

from .row import METRIC_COLUMNS, build_row, flatten_summary, git_info, workload_key, workload_name
from ..errors import BadInputError

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = [
    "METRIC_COLUMNS",
    "DB_ENV",
    "default_db_path",
    "resolve_db_path",
    "record_run",
    "record_row",
    "list_runs",
    "latest_run",
    "run_counts",
    "flatten_summary",
    "git_info",
    "workload_name",
    "workload_key",
    "build_row",
]

#: environment variable that overrides the default database path
DB_ENV = "RECSYS_DOCTOR_DB"

_COLUMNS: dict[str, str] = {
    "id": "INTEGER",
    "when_utc": "TEXT",
    "command": "TEXT",
    "workload": "TEXT",
    "workload_key": "TEXT",
    "trace_path": "TEXT",
    "trace_sha256": "TEXT",
    "tool_version": "TEXT",
    "gpus": "TEXT",
    "git_commit": "TEXT",
    "git_branch": "TEXT",
    **METRIC_COLUMNS,
    "summary_json": "TEXT",
    "findings_json": "TEXT",
    "finding_ids": "TEXT",
    "passed": "INTEGER",
    "reasons_json": "TEXT",
}
_INDEXES = {"runs_branch_when": ["git_branch", "when_utc"], "runs_workload_when": ["workload", "when_utc"]}

#: how long one statement waits for another writer before SQLite gives up (s)
_BUSY_TIMEOUT_S = 30.0
#: how many times a write that still hits "database is locked" is retried
_RETRIES = 20

T = TypeVar("T")


def default_db_path() -> Path:
    """``$RECSYS_DOCTOR_DB`` if set, else ``<user data dir>/recsys-doctor/history.db``."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("recsys-doctor")) / "history.db"


def resolve_db_path(db_path: str | os.PathLike[str] | None) -> Path:
    """An explicit path wins over ``$RECSYS_DOCTOR_DB`` which wins over the default."""
    return Path(db_path).expanduser() if db_path else default_db_path()


def _is_locked(e: sqlite3.Error) -> bool:
    msg = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


def _retry(fn: Callable[[], T]) -> T:
    """``fn()`` again, with jittered backoff, while SQLite says the database is locked:
    the busy timeout covers most waits, not all (a WAL switch or recovery answers busy
    at once)."""
    delay = 0.01
    for attempt in range(_RETRIES):
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if not _is_locked(e) or attempt == _RETRIES - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")  # pragma: no cover


def _open_for_writing(path: Path) -> Database:
    if path.is_dir():
        raise BadInputError(f"history database {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return Database(sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S), recursive_triggers=False,
                        execute_plugins=False)
    except (OSError, sqlite3.Error) as e:
        raise BadInputError(f"cannot open history database {path}: {e}") from None


def _open_for_reading(path: Path) -> Database:
    """Open for reading only (``mode=ro``): reading the history must work on a database
    the user may not write, and never changes its journal mode."""
    if path.is_dir():
        raise BadInputError(f"history database {path} is a directory")
    p = path.resolve()
    # a WAL database in a folder we may not write cannot get its -shm file: read it as
    # immutable then (nobody can be writing where we cannot)
    writable = os.access(p, os.W_OK) and os.access(p.parent, os.W_OK)
    err: Exception | None = None
    for mode in (["ro", "ro&immutable=1"] if writable else ["ro&immutable=1"]):
        try:
            conn = sqlite3.connect(f"{p.as_uri()}?mode={mode}", uri=True, timeout=_BUSY_TIMEOUT_S)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return Database(conn, recursive_triggers=False, execute_plugins=False)
        except (OSError, sqlite3.Error) as e:
            err = e
    raise BadInputError(f"cannot read history database {path}: {err}") from None


@contextmanager
def _write_lock(db: Database) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: the write lock is taken (waiting out other
    writers) before the schema is read, so two first runs cannot both create or migrate
    the table; sqlite-utils' own transactions nest inside as savepoints."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:  # noqa: BLE001 - rolled back, then re-raised (Ctrl-C too)
        db.rollback()
        raise
    db.commit()


def _ensure_schema(db: Database) -> None:
    """Create ``runs`` and its indexes, or add the columns newer versions introduced
    (additive: NULL in old rows)."""
    runs = db.table("runs")
    if not runs.exists():
        runs.create(_COLUMNS, pk="id", not_null={"when_utc", "command"})
    else:
        for col, typ in _COLUMNS.items():
            if col not in runs.columns_dict:
                runs.add_column(col, typ)
    for name, cols in _INDEXES.items():
        runs.create_index(cols, index_name=name, if_not_exists=True)


def record_run(result: "AdviseResult", db_path: str | os.PathLike[str] | None = None, command: str = "advise",
               *, passed: bool | None = None, reasons: list[str] | None = None,
               cwd: str | os.PathLike[str] | None = None, options: Any = None, key: str | None = None) -> int:
    """Append one run to the history and return its row id.

    ``db_path`` None means :func:`default_db_path`. ``passed``/``reasons`` are for
    ``check`` runs. Safe to call from several processes at once.
    """
    row = build_row(result, command, passed=passed, reasons=reasons, cwd=cwd, options=options, key=key)
    return record_row(row, db_path)


def record_row(row: dict[str, Any], db_path: str | os.PathLike[str] | None = None) -> int:
    """Append a row made by :func:`build_row` (made earlier, or elsewhere: a rank's
    worker) and return its id."""
    path = resolve_db_path(db_path)
    db = _open_for_writing(path)

    def write() -> int:
        db.enable_wal()
        with _write_lock(db):
            _ensure_schema(db)
            return int(db.table("runs").insert(row, alter=False).last_rowid or 0)

    try:
        return _retry(write)
    except sqlite3.Error as e:
        if _is_locked(e):
            raise BadInputError(f"history database {path} stayed locked: {e}") from None
        raise BadInputError(f"{path} is not a usable recsys-doctor history database: {e}") from None
    finally:
        db.close()


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for k in ("summary_json", "findings_json", "reasons_json"):
        v = out.pop(k, None)
        out[k[: -len("_json")]] = json.loads(v) if v else None
    if out.get("passed") is not None:
        out["passed"] = bool(out["passed"])
    return out


def list_runs(db_path: str | os.PathLike[str] | None = None, *, limit: int | None = 20,
              branch: str | None = None, workload: str | None = None,
              command: str | None = None, key: str | None = None,
              baselines_only: bool = False) -> list[dict[str, Any]]:
    """Recorded runs, newest first, with ``summary``/``findings``/``reasons`` decoded.

    A missing database reads as no runs (a fresh machine has no history yet), and so does
    a database written before a column the filter needs existed.
    """
    path = resolve_db_path(db_path)
    if not path.exists():
        return []
    filters = {col: val for col, val in (("git_branch", branch), ("workload", workload), ("command", command),
                                         ("workload_key", key)) if val is not None}
    where = [f"[{col}] = :{col}" for col in filters]
    if baselines_only:
        where.append("[command] = 'check' AND [passed] = 1")
    db = _open_for_reading(path)
    try:
        runs = db.table("runs")
        if not runs.exists() or not {*filters, "command", "passed", "when_utc"} <= set(runs.columns_dict):
            return []
        rows = _retry(lambda: list(runs.rows_where(" AND ".join(where) or None, filters,
                                                   order_by="when_utc DESC, id DESC", limit=limit)))
        return [_decode(r) for r in rows]
    except sqlite3.Error as e:
        raise BadInputError(f"cannot read history {path}: {e}") from None
    finally:
        db.close()


def run_counts(db_path: str | os.PathLike[str] | None = None, column: str = "git_branch") -> list[tuple[Any, int]]:
    """``[(value, runs)]`` of one column (``git_branch``, ``workload``...), most runs
    first: what a filter that matched nothing could have matched. Empty when there is no
    database or no such column."""
    path = resolve_db_path(db_path)
    if not path.exists():
        return []
    db = _open_for_reading(path)
    try:
        runs = db.table("runs")
        if not runs.exists() or column not in runs.columns_dict:
            return []
        rows = db.execute(f"SELECT [{column}], count(*) AS n FROM runs GROUP BY 1 ORDER BY n DESC, 1").fetchall()
        return [(v, int(n)) for v, n in rows]
    except sqlite3.Error as e:
        raise BadInputError(f"cannot read history {path}: {e}") from None
    finally:
        db.close()


def latest_run(branch: str, db_path: str | os.PathLike[str] | None = None, *,
               workload: str | None = None, key: str | None = None) -> dict[str, Any]:
    """The newest **passed** check recorded for ``branch`` (and the workload ``key`` /
    name when given): a failed run, or a plain ``advise`` run, never becomes a baseline.

    Raises :class:`BadInputError` when there is none: a gate without its baseline must
    not silently pass.
    """
    runs = list_runs(db_path, limit=1, branch=branch, workload=workload, key=key, baselines_only=True)
    if not runs:
        extra = f" and workload {workload!r}" if workload else ""
        extra += f" (key {key})" if key else ""
        raise BadInputError(f"no passed check recorded for branch {branch!r}{extra} in {resolve_db_path(db_path)}: "
                            "a baseline is a passed `check` or a `check --write-baseline` run")
    return runs[0]
