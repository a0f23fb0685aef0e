"""Which engine reads an Nsight Systems SQLite export fastest into columns?

Every candidate reads the same columns the nsys loader needs from the big activity
tables (runtime API, copies, kernels, syncs, graph executions) of one export into
numpy-backed pandas columns (integer ids, strings left as ``StringIds`` codes so every
engine does the same work) and, for the strings, the ``StringIds`` table once. Each
candidate runs in its own subprocess, so its peak RSS (``ru_maxrss``) is its own.

    python bench/engines/engines.py FILE [--engines sqlite3,adbc,pages,connectorx,polars,duckdb]
        [--python-for duckdb=/path/to/venv/bin/python] [--out bench/engines/results/engines.json]

``pages`` is recsys-doctor's own page reader (``recsys_doctor.loaders._sqlite_pages``,
one thread here like the others; the loader runs two), with ``StringIds`` (text) read
through sqlite3 as the loader does.

A candidate whose module is not importable by the interpreter given for it is reported
as ``unavailable`` with the import error, never silently dropped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

K = "CUPTI_ACTIVITY_KIND_"
#: table -> the columns read (what recsys_doctor.loaders.nsys needs)
QUERIES = {
    K + "RUNTIME": "start, \"end\", globalTid, correlationId, nameId, eventClass",
    K + "MEMCPY": "start, \"end\", globalPid, deviceId, streamId, correlationId, bytes, copyKind, srcKind, dstKind, graphNodeId",
    K + "KERNEL": "start, \"end\", globalPid, deviceId, streamId, correlationId, demangledName, shortName, gridX, gridY, gridZ, blockX, blockY, blockZ, graphNodeId",
    K + "SYNCHRONIZATION": "start, \"end\", globalPid, deviceId, streamId, correlationId, syncType",
    K + "GRAPH_TRACE": "start, \"end\", globalPid, deviceId, streamId, correlationId, graphId",
    "StringIds": "id, value",
}

_CHILD = r'''
import json, resource, sys, time
engine, path, queries = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t = time.perf_counter()
rows = 0
keep = []
if engine == "sqlite3":
    import sqlite3, pandas as pd
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    tables = {r[0] for r in con.execute("select name from sqlite_master")}
    for tab, cols in queries.items():
        if tab in tables:
            df = pd.read_sql_query(f"SELECT {cols} FROM {tab}", con)
            rows += len(df); keep.append(df)
elif engine == "adbc":
    import adbc_driver_sqlite.dbapi as dbapi
    con = dbapi.connect(f"file:{path}?mode=ro&immutable=1")
    cur = con.cursor()
    cur.execute("select name from sqlite_master"); tables = {r[0] for r in cur.fetchall()}
    for tab, cols in queries.items():
        if tab in tables:
            cur.execute(f"SELECT {cols} FROM {tab}")
            df = cur.fetch_arrow_table().to_pandas()
            rows += len(df); keep.append(df)
elif engine == "pages":
    import sqlite3, pandas as pd
    from recsys_doctor.loaders._sqlite_pages import PageFile
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    pf = PageFile(path)
    roots = dict(con.execute("select name, rootpage from sqlite_master where type = 'table'").fetchall())
    for tab, cols in queries.items():
        if tab not in roots:
            continue
        if tab == "StringIds":
            df = pd.read_sql_query(f"SELECT {cols} FROM {tab}", con)
        else:
            names = [r[1] for r in con.execute(f"PRAGMA table_info({tab})")]
            want = [c.strip().strip('"') for c in cols.split(",")]
            pos = [names.index(c) for c in want]
            parts = [pf.read(run, pos) for run in pf.runs(roots[tab], 1_000_000)]
            df = pd.DataFrame({c: (pd.concat([pd.Series(pd.arrays.IntegerArray(*p[i])) if p[i][1] is not None
                                              else pd.Series(p[i][0]) for p in parts], ignore_index=True)
                                   if parts else pd.Series([], dtype="int64"))
                               for c, i in zip(want, pos)})
        rows += len(df); keep.append(df)
elif engine in ("connectorx", "polars"):
    import sqlite3
    if engine == "connectorx":
        import connectorx as cx
        read = lambda sql: cx.read_sql(f"sqlite://{path}", sql, return_type="arrow").to_pandas()
    else:
        import polars as pl
        read = lambda sql: pl.read_database_uri(sql, f"sqlite://{path}", engine="connectorx").to_pandas()
    tables = {r[0] for r in sqlite3.connect(path).execute("select name from sqlite_master")}
    for tab, cols in queries.items():
        if tab in tables:
            df = read(f"SELECT {cols} FROM {tab}")
            rows += len(df); keep.append(df)
elif engine == "duckdb":
    import duckdb, os, duckdb_ext
    con = duckdb.connect(config={"extension_directory": os.path.join(list(duckdb_ext.__path__)[0], "extensions"),
                                 "autoinstall_known_extensions": False, "threads": 2})
    con.execute("LOAD sqlite_scanner")
    con.execute(f"ATTACH '{path}' AS t (TYPE sqlite, READ_ONLY)")
    con.execute("SET sqlite_all_varchar=false")
    tables = {r[0] for r in con.execute("select table_name from information_schema.tables where table_catalog='t'").fetchall()}
    for tab, cols in queries.items():
        if tab in tables:
            df = con.execute(f"SELECT {cols} FROM t.{tab}").df()
            rows += len(df); keep.append(df)
el = time.perf_counter() - t
print(json.dumps({"seconds": round(el, 3), "rows": rows,
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
'''

IMPORTS = {"sqlite3": "pandas", "adbc": "adbc_driver_sqlite", "pages": "recsys_doctor.loaders._sqlite_pages", "connectorx": "connectorx", "polars": "polars",
           "duckdb": "duckdb_ext"}


def run_one(python: str, engine: str, path: Path, repeat: int) -> dict:
    chk = subprocess.run([python, "-c", f"import {IMPORTS[engine]}"], capture_output=True, text=True)
    if chk.returncode:
        return {"engine": engine, "unavailable": chk.stderr.strip().splitlines()[-1]}
    runs = []
    for _ in range(repeat):
        out = subprocess.run([python, "-c", _CHILD, engine, str(path), json.dumps(QUERIES)],
                             capture_output=True, text=True)
        if out.returncode:
            return {"engine": engine, "failed": out.stderr.strip().splitlines()[-1]}
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    ver = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({_dist(engine)!r}))"],
                         capture_output=True, text=True).stdout.strip()
    return {"engine": engine, "version": ver, **best, "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}


def _dist(engine: str) -> str:
    return {"sqlite3": "pandas", "adbc": "adbc-driver-sqlite", "pages": "recsys-doctor", "connectorx": "connectorx", "polars": "polars",
            "duckdb": "duckdb"}[engine]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--engines", default="sqlite3,adbc,pages,connectorx,polars,duckdb")
    ap.add_argument("--python-for", action="append", default=[], metavar="ENGINE=PYTHON",
                    help="interpreter (of a venv) that has this engine installed")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    pys = dict(x.split("=", 1) for x in a.python_for)
    res = []
    for e in a.engines.split(","):
        row = run_one(pys.get(e, sys.executable), e, a.trace, a.repeat)
        print(json.dumps(row), flush=True)
        res.append(row)
    if a.out:
        doc = {"what": "read the nsys loader's columns of the activity tables + StringIds into pandas, per engine",
               "trace": a.trace.name, "file_mb": round(a.trace.stat().st_size / 2**20, 1),
               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "results": res}
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
