"""The run history: every ``advise``/``check`` run as one row of an SQLite database.

Why: a single trace says "the GPU is 14% busy"; a history says "it was 41% last week,
on main, before commit abc123". ``check --baseline-db BRANCH`` and the HTML report's
utilization trend read it back.

Where: ``platformdirs.user_data_dir("recsys-doctor")/history.db`` unless ``--db`` or the
environment variable ``RECSYS_DOCTOR_DB`` names another file.

Several CI jobs may record at the same moment: the database runs in WAL mode with a
busy timeout, each row is written in its own short transaction, and a write that still
meets ``database is locked`` is retried with backoff, so no row is lost or half-written.

Table ``runs`` (one row per run; summary metrics as columns for SQL, plus JSON):

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

import hashlib
import json
import os
import random
import sqlite3
import subprocess
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import BadInputError

if TYPE_CHECKING:  # pragma: no cover
    from .advise import AdviseResult

__all__ = [
    "METRIC_COLUMNS",
    "DB_ENV",
    "default_db_path",
    "resolve_db_path",
    "record_run",
    "list_runs",
    "latest_run",
    "flatten_summary",
    "git_info",
    "workload_name",
    "workload_key",
    "build_row",
]

#: environment variable that overrides the default database path
DB_ENV = "RECSYS_DOCTOR_DB"

#: summary metrics stored as their own columns (nested keys joined with ``_``)
METRIC_COLUMNS: dict[str, str] = {
    "gpu_utilization": "REAL",
    "kernels": "INTEGER",
    "short_kernel_fraction": "REAL",
    "launch_threads_per_stream_max": "INTEGER",
    "memcpy_h2d": "INTEGER",
    "memcpy_d2h": "INTEGER",
    "memcpy_direction_switches": "INTEGER",
    "sync_calls": "INTEGER",
}

_COLUMNS: dict[str, str] = {
    "when_utc": "TEXT NOT NULL",
    "command": "TEXT NOT NULL",
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

_SCHEMA_SQL = (
    "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, "
    + ", ".join(f"[{c}] {t}" for c, t in _COLUMNS.items())
    + ")"
)
_INDEX_SQL = (
    "CREATE INDEX IF NOT EXISTS runs_branch_when ON runs (git_branch, when_utc)",
    "CREATE INDEX IF NOT EXISTS runs_workload_when ON runs (workload, when_utc)",
)

#: how long one statement waits for another writer before SQLite gives up (ms)
_BUSY_TIMEOUT_MS = 30_000
#: how many times a write that still hits "database is locked" is retried
_RETRIES = 20


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


def _is_locked(e: sqlite3.OperationalError) -> bool:
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


def _retry(fn: Any, *args: Any) -> Any:
    """Run ``fn`` again (with jittered backoff) while SQLite says the database is locked."""
    delay = 0.01
    for attempt in range(_RETRIES):
        try:
            return fn(*args)
        except sqlite3.OperationalError as e:
            if not _is_locked(e) or attempt == _RETRIES - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")  # pragma: no cover


def _connect(path: Path, *, create: bool) -> sqlite3.Connection:
    if not create and not path.exists():
        raise BadInputError(f"no run history at {path} (record one with `recsys-doctor advise TRACE`)")
    if path.exists() and path.is_dir():
        raise BadInputError(f"history database {path} is a directory")
    if not create:
        return _connect_ro(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    except (OSError, sqlite3.Error) as e:
        raise BadInputError(f"cannot open history database {path}: {e}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")

        def setup() -> None:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            if create:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.execute(_SCHEMA_SQL)
                    _migrate(conn)
                    for sql in _INDEX_SQL:
                        conn.execute(sql)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise

        _retry(setup)
    except sqlite3.DatabaseError as e:
        conn.close()
        if isinstance(e, sqlite3.OperationalError) and _is_locked(e):
            raise BadInputError(f"history database {path} stayed locked: {e}") from None
        raise BadInputError(f"{path} is not a usable recsys-doctor history database: {e}") from None
    return conn


def _connect_ro(path: Path) -> sqlite3.Connection:
    """Open for reading only (``mode=ro``): reading the history must work on a database
    the user may not write, and never changes its journal mode."""
    p = path.resolve()
    # a WAL database in a folder we may not write cannot get its -shm file: read it as
    # immutable then (nobody can be writing where we cannot)
    writable = os.access(p, os.W_OK) and os.access(p.parent, os.W_OK)
    modes = ["mode=ro", "mode=ro&immutable=1"] if writable else ["mode=ro&immutable=1"]
    err: Exception | None = None
    for mode in modes:
        try:
            conn = sqlite3.connect(f"file:{p}?{mode}", uri=True, timeout=_BUSY_TIMEOUT_MS / 1000,
                                   isolation_level=None)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except (OSError, sqlite3.Error) as e:
            err = e
    raise BadInputError(f"cannot read history database {path}: {err}") from None


def _migrate(conn: sqlite3.Connection) -> None:
    """Add columns newer versions introduced (additive, NULL in old rows)."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(runs)").fetchall()}
    for col, typ in _COLUMNS.items():
        if col not in have:
            conn.execute(f"ALTER TABLE runs ADD COLUMN [{col}] {typ.replace(' NOT NULL', '')}")


def flatten_summary(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"memcpy": {"h2d": 3}}`` -> ``{"memcpy_h2d": 3}`` (scalars only)."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_summary(v, key + "_"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
        elif hasattr(v, "item"):  # numpy scalar
            out[key] = v.item()
    return out


def git_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """``{"git_commit": sha, "git_branch": name}`` of ``cwd`` (default: the current
    directory) via ``git rev-parse``; empty when git or the repository is absent.

    A detached HEAD (as in most CI checkouts) takes the branch from
    ``$GITHUB_HEAD_REF`` / ``$GITHUB_REF_NAME`` / ``$CI_COMMIT_REF_NAME`` when set.
    """

    def run(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        out = p.stdout.strip()
        return out if p.returncode == 0 and out else None

    commit = run("rev-parse", "HEAD")
    if commit is None:
        return {}
    info = {"git_commit": commit}
    branch = run("rev-parse", "--abbrev-ref", "HEAD")
    if branch in (None, "HEAD"):
        branch = (os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME")
                  or os.environ.get("CI_COMMIT_REF_NAME") or None)
    if branch:
        info["git_branch"] = branch
    return info


def _tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("recsys-doctor")
    except Exception:
        from . import __version__

        return __version__


def workload_name(path: str | None) -> str | None:
    """The workload a trace belongs to: its file name without extension(s)."""
    if not path:
        return None
    name = Path(path).name
    for suf in (".gz", ".sqlite", ".nsys-rep", ".json", ".pt.trace", ".trace"):
        if name.endswith(suf):
            name = name[: -len(suf)]
    return name or None


#: options that do not change any number of a run (display only)
_DISPLAY_OPTIONS = {"top_n", "examples_per_finding", "timeline_bins"}


def _trace_place(path: str) -> str:
    """The trace's path relative to the git top level of its directory when it is inside
    a repository (stable across CI checkouts), else its absolute path."""
    p = Path(path).resolve()
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=p.parent, capture_output=True, text=True,
                             timeout=10)
        top = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        top = ""
    if top:
        try:
            return "git:" + str(p.relative_to(Path(top).resolve()))
        except ValueError:
            pass
    return str(p)


def workload_key(result: "AdviseResult", options: Any = None) -> str | None:
    """What makes two runs the same workload, as a short hash: the trace's place
    (:func:`_trace_place`), the GPU names, the analysis window (``--start``/``--end``/
    ``--nvtx``) and every option that differs from its default and changes numbers.
    Two ``report1.sqlite`` files of different directories, or a ``--nvtx query`` run and a
    whole-trace run of one file, get different keys."""
    info = result.trace_info or {}
    path = info.get("path")
    if not path:
        return None
    from dataclasses import fields as dc_fields

    from .options import Options

    opts = {}
    if options is not None:
        base = Options()
        opts = {f.name: getattr(options, f.name) for f in dc_fields(Options)
                if f.name not in _DISPLAY_OPTIONS and getattr(options, f.name) != getattr(base, f.name)}
    parts = {"trace": _trace_place(str(path)), "gpus": _gpu_names(result), "nvtx": info.get("nvtx"),
             "window_ns": info.get("window_ns"), "options": opts}
    return hashlib.sha256(_json(parts).encode()).hexdigest()[:16]


def _file_sha256(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def _gpu_names(result: "AdviseResult") -> list[str]:
    names: list[str] = []
    tr = getattr(result, "trace", None)
    if tr is not None and len(tr.devices):
        names = [str(n) for n in tr.devices["name"].tolist() if n is not None and str(n) not in ("", "nan", "None")]
    if not names:
        devs = result.trace_info.get("devices") or result.summary.get("devices") or []
        for d in devs if isinstance(devs, list) else []:
            n = d.get("name") if isinstance(d, Mapping) else d
            if n:
                names.append(str(n))
    return list(dict.fromkeys(names))


def _json(o: Any) -> str:
    def default(x: Any) -> Any:
        if hasattr(x, "item"):
            return x.item()
        if isinstance(x, (set, tuple)):
            return list(x)
        return str(x)

    return json.dumps(o, default=default, sort_keys=True)


def build_row(result: "AdviseResult", command: str = "advise", *, passed: bool | None = None,
              reasons: list[str] | None = None, cwd: str | os.PathLike[str] | None = None,
              now: datetime | None = None, options: Any = None, key: str | None = None) -> dict[str, Any]:
    """The row :func:`record_run` would insert (exposed for tests and dry runs)."""
    info = result.trace_info or {}
    path = info.get("path")
    meta = info.get("meta") or {}
    sha = meta.get("sha256") or info.get("sha256") or (_file_sha256(str(path)) if path else None)
    flat = flatten_summary(result.summary or {})
    findings = [{"id": f.id, "severity": f.severity, "title": f.title} for f in result.findings]
    row: dict[str, Any] = {
        "when_utc": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "command": command,
        "workload": workload_name(str(path) if path else None),
        "workload_key": key or workload_key(result, options),
        "trace_path": str(Path(path).resolve()) if path else None,
        "trace_sha256": sha,
        "tool_version": _tool_version(),
        "gpus": "; ".join(_gpu_names(result)) or None,
        "git_commit": None,
        "git_branch": None,
        "summary_json": _json(result.summary or {}),
        "findings_json": _json(findings),
        "finding_ids": ",".join(f["id"] for f in findings),
        "passed": None if passed is None else int(bool(passed)),
        "reasons_json": None if reasons is None else _json(list(reasons)),
    }
    row.update(git_info(cwd))
    for col, typ in METRIC_COLUMNS.items():
        v = flat.get(col)
        if isinstance(v, bool) or v is None:
            row[col] = None if v is None else int(v)
        else:
            try:
                row[col] = float(v) if typ == "REAL" else int(v)
            except (TypeError, ValueError):
                row[col] = None
    return row


def record_run(result: "AdviseResult", db_path: str | os.PathLike[str] | None = None, command: str = "advise",
               *, passed: bool | None = None, reasons: list[str] | None = None,
               cwd: str | os.PathLike[str] | None = None, options: Any = None, key: str | None = None) -> int:
    """Append one run to the history and return its row id.

    ``db_path`` None means :func:`default_db_path`. ``passed``/``reasons`` are for
    ``check`` runs. Safe to call from several processes at once.
    """
    path = resolve_db_path(db_path)
    row = build_row(result, command, passed=passed, reasons=reasons, cwd=cwd, options=options, key=key)
    conn = _connect(path, create=True)
    try:
        import sqlite_utils

        db = sqlite_utils.Database(conn)

        def insert() -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                db["runs"].insert(row, alter=False)
                rid = int(conn.execute("SELECT last_insert_rowid()").fetchone()[0])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return rid

        try:
            return int(_retry(insert))
        except sqlite3.OperationalError as e:
            raise BadInputError(f"cannot record the run in {path}: {e}") from None
    finally:
        conn.close()


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

    A missing database reads as no runs (a fresh machine has no history yet).
    """
    path = resolve_db_path(db_path)
    if not path.exists():
        return []
    conn = _connect(path, create=False)
    try:
        where, params = [], []
        for col, val in (("git_branch", branch), ("workload", workload), ("command", command),
                         ("workload_key", key)):
            if val is not None:
                where.append(f"[{col}] = ?")
                params.append(val)
        if baselines_only:
            where.append("[command] = 'check' AND [passed] = 1")
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY when_utc DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        try:
            cur = _retry(conn.execute, sql, params)
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []
            if "no such column" in str(e):  # a database written before the column existed
                return []
            raise BadInputError(f"cannot read history {path}: {e}") from None
        except sqlite3.DatabaseError as e:
            raise BadInputError(f"cannot read history {path}: {e}") from None
        cols = [d[0] for d in cur.description]
        return [_decode(dict(zip(cols, r))) for r in cur.fetchall()]
    finally:
        conn.close()


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
