"""How ``advise`` scales with trace size: tile a real Nsight Systems export in time and
time the whole ``recsys-doctor advise --json`` command (start-up, load, analyze, plan) on
each size, next to nsys-ai (``nsys-ai diagnose --format json``, its DuckDB path) on the
same file in the same run when it is installed; then the same for a PyTorch profiler
(Kineto) JSON trace tiled to ~450 MB.

For a tiling factor K the activity tables (kernels, copies, memsets, runtime API, syncs,
graph executions, NVTX) are copied K times, copy i shifted by i x the span of the GPU
activity (last GPU operation end - first start, plus a 1 us gap: the copies' GPU work
follows on without dead time, so the tiled trace's window is K times the original's and
its utilization and findings' shares are the original's; a copy's CPU calls before its
first GPU operation - start-up - overlap the previous copy's end) and with correlation ids offset so they stay unique per
process; everything else (strings, threads, devices, metadata) is kept once. Every command runs in a fresh subprocess; its
peak resident memory is the child's own ``ru_maxrss`` (``os.wait4``). The generated files
go to a temporary directory (``--tmp``, default /tmp) and are deleted after use: only the
results JSON is kept.

    python bench/scale/scale_trace.py [--rows 1e6,4e6,1e7] [--gb 2] [--kineto-mb 450]
        [--nsys-ai /path/to/venv/bin/nsys-ai] [--repeat 3] [--before ../main] [--out bench/scale/results/....json]

``--before ROOT`` also times another checkout's ``advise`` (its own ``.venv``) on each
tiled export, its runs interleaved with this one's (``recsys_doctor_before``).

nsys-ai is not a dependency: install it in a throwaway venv (``python -m venv v; v/bin/pip
install nsys-ai``). Its DuckDB path needs DuckDB's ``sqlite_scanner`` extension, which
DuckDB downloads at run time; offline, ``--nsys-ai-duckdb-ext FILE`` places a copy (e.g.
from the ``duckdb-ext-sqlite`` wheel, with the matching ``duckdb`` version) in a private
HOME for it. Whether its DuckDB path or its sqlite3 fallback ran is recorded per run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of, machine, run_cmd, version  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces" / "h100" / "wdl_graphs_q4_h100.sqlite"
DEMO = ROOT / "recsys_doctor" / "data" / "demo_wdl_serial_q4.sqlite.gz"

ACTIVITY = [
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "NVTX_EVENTS",
]


#: the gap between two tiled copies (ns): small against any step, so no dead time is added
TILE_GAP_NS = 1_000


def activity_span(con: sqlite3.Connection, tables: list[str]) -> int:
    """Last activity end - first activity start over ``tables`` (ns); an NVTX mark (no
    end) counts at its start."""
    lo, hi = None, None
    for t in tables:
        a, b = con.execute(f"SELECT min(start), max(coalesce(end, start)) FROM {t}").fetchone()
        if a is not None:
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return 0 if lo is None else int(hi) - int(lo)

#: the tables of GPU work: their span is what a tiled copy is shifted by
GPU_ACTIVITY = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"]


def tile(src: Path, dst: Path, k: int) -> int:
    """Write a K-times tiled copy of ``src`` to ``dst``; return the number of activity rows."""
    if src.suffix == ".gz":
        with gzip.open(src) as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
    else:
        shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    span = activity_span(con, [t for t in GPU_ACTIVITY if t in tables]) + TILE_GAP_NS
    corr = con.execute("SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] + 1
    rows = 0
    for t in ACTIVITY:
        if t not in tables:
            continue
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
        con.execute(f"CREATE TEMP TABLE orig AS SELECT * FROM {t}")
        for i in range(1, k):
            sel = []
            for c in cols:
                if c in ("start", "end"):
                    sel.append(f"{c} + {i * span}")
                elif c == "correlationId":
                    sel.append(f"CASE WHEN {c} > 0 THEN {c} + {i * corr} ELSE {c} END")
                else:
                    sel.append(c)
            con.execute(f"INSERT INTO {t} ({','.join(cols)}) SELECT {','.join(sel)} FROM orig")
        con.execute("DROP TABLE orig")
        rows += con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    con.commit()
    con.close()
    return rows


def ours(path: Path, repeat: int) -> dict:
    cmd = [sys.executable, "-m", "recsys_doctor", "advise", "--json", "--no-history", str(path)]
    return best_of([run_cmd(cmd) for _ in range(repeat)])


def ours_and_before(path: Path, repeat: int, before: Path) -> tuple[dict, dict]:
    """``ours`` for this checkout and for ``before`` (another checkout, its own ``.venv``),
    their runs interleaved so that both see the same machine load."""
    cmd = ["-m", "recsys_doctor", "advise", "--json", "--no-history", str(path)]
    this, other = [], []
    for _ in range(repeat):
        this.append(run_cmd([sys.executable, *cmd], cwd=ROOT))
        other.append(run_cmd([str(before / ".venv" / "bin" / "python"), *cmd], cwd=before))
    return best_of(this), best_of(other)


def nsys_ai(exe: str | None, home: Path | None, path: Path, repeat: int, tmp: Path) -> dict:
    """nsys-ai diagnose on a fresh copy of the file (its Parquet cache cold), then once
    more on the same copy (cache warm)."""
    if not exe:
        return {"unavailable": "nsys-ai not given (--nsys-ai)"}
    env = dict(os.environ, HOME=str(home)) if home else None
    cold, warm, engine = [], [], set()
    for _ in range(repeat):
        d = Path(tempfile.mkdtemp(dir=tmp))
        try:
            f = d / path.name
            shutil.copyfile(path, f)
            # a session directory of its own per run: nsys-ai refuses to reuse the session
            # of a profile copy that is gone ("SESSION_CORRUPT")
            cmd = [exe, "diagnose", str(f), "--format", "json", "-o", str(d / "out.json"), "--session"]
            r = run_cmd(cmd + [str(d / "session-cold")], env, cwd=d)  # it writes .nsys-ai/ in its cwd
            engine.add("sqlite3 fallback" if "falling back to sqlite" in r["stderr_tail"].lower() else "duckdb")
            cold.append(r)
            warm.append(run_cmd(cmd + [str(d / "session-warm")], env, cwd=d))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return {"engine": sorted(engine), "cold": best_of(cold), "warm_cache": best_of(warm)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=SHARED if SHARED.exists() else DEMO)
    ap.add_argument("--rows", default="1e6,4e6,1e7", help="target activity rows per tiled export")
    ap.add_argument("--gb", type=float, default=2.0, help="also a tiled export of about this many GB (0: none)")
    ap.add_argument("--kineto", type=Path, default=None, help="Kineto trace to tile (default: kineto_scale.KINETO)")
    ap.add_argument("--kineto-mb", type=float, default=450, help="tiled Kineto trace size (0: none)")
    ap.add_argument("--nsys-ai", help="nsys-ai executable (in its own venv) to compare with")
    ap.add_argument("--nsys-ai-duckdb-ext", type=Path, help="sqlite_scanner.duckdb_extension for nsys-ai's DuckDB")
    ap.add_argument("--nsys-ai-duckdb-version", default="v1.4.4")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the fastest is reported")
    ap.add_argument("--before", type=Path, help="another checkout (with its .venv) whose advise is timed on the "
                                                "same files, runs interleaved (e.g. main before a change)")
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "scale" / "results" / f"scale_{dt.date.today()}.json")
    a = ap.parse_args()
    doc: dict = {
        "what": ("recsys-doctor advise --json (whole command: start-up, load, analyze, plan) on a real H100 "
                 "export tiled in time; nsys-ai diagnose --format json on the same file in the same run"),
        "code": {"this": version(ROOT), **({"before": version(a.before.resolve())} if a.before else {})},
        "trace": str(a.trace.relative_to(ROOT.parent) if a.trace.is_relative_to(ROOT.parent) else a.trace),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "nsys_ai": None, "results": [],
    }
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmpd:
        tmp = Path(tmpd)
        home = _nsys_ai_setup(a, tmp, doc)
        base_rows = _activity_rows(a.trace)
        sizes = [("rows", float(x)) for x in a.rows.split(",") if x] + ([("gb", a.gb)] if a.gb else [])
        for kind, target in sizes:
            k = (max(1, round(target / base_rows)) if kind == "rows"
                 else max(1, round(target * 2**30 / _bytes_per_factor(a.trace, tmp))))
            doc["results"].append(_one_size(a, tmp, home, k, repeat=1 if kind == "gb" else a.repeat,
                                            with_nsys_ai=kind == "rows"))
        a.kineto = a.kineto or _kineto_default()
        if a.kineto_mb and a.kineto.exists():
            doc["kineto"] = _kineto_size(a, tmp)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")


def _nsys_ai_setup(a: argparse.Namespace, tmp: Path, doc: dict) -> Path | None:
    """Record nsys-ai's version; place DuckDB's sqlite extension in a private HOME when
    given (offline). Returns that HOME (None: nsys-ai's own)."""
    if not a.nsys_ai:
        doc["nsys_ai"] = {"unavailable": "not measured: run with --nsys-ai (pip install nsys-ai in a throwaway venv)"}
        return None
    ver = subprocess.run([str(Path(a.nsys_ai).parent / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('nsys-ai'), m.version('duckdb'))"],
                         capture_output=True, text=True).stdout.split()
    doc["nsys_ai"] = {"version": ver[0] if ver else None, "duckdb": ver[1] if len(ver) > 1 else None}
    if not a.nsys_ai_duckdb_ext:
        return None
    home = tmp / "home"
    d = home / ".duckdb" / "extensions" / a.nsys_ai_duckdb_version / "linux_amd64"
    d.mkdir(parents=True)
    shutil.copyfile(a.nsys_ai_duckdb_ext, d / "sqlite_scanner.duckdb_extension")
    doc["nsys_ai"]["duckdb_extension"] = f"sqlite_scanner placed offline ({a.nsys_ai_duckdb_ext.name})"
    return home


def _one_size(a: argparse.Namespace, tmp: Path, home: Path | None, k: int, repeat: int, with_nsys_ai: bool) -> dict:
    """Tile K times, time both tools on the file (machine load before and after), delete it."""
    f = tmp / f"tiled_{k}.sqlite"
    rows = tile(a.trace, f, k)
    row = {"factor": k, "activity_rows": rows, "file_mb": round(f.stat().st_size / 2**20, 1),
           "load_avg_before": os.getloadavg()[0]}
    print(f"tiled x{k}: {rows:,} rows, {row['file_mb']} MB", file=sys.stderr, flush=True)
    if a.before:
        row["recsys_doctor"], row["recsys_doctor_before"] = ours_and_before(f, repeat, a.before.resolve())
    else:
        row["recsys_doctor"] = ours(f, repeat)
    if with_nsys_ai:
        row["nsys_ai"] = nsys_ai(a.nsys_ai, home, f, repeat, tmp)
    row["load_avg_after"] = os.getloadavg()[0]
    print(json.dumps(row), file=sys.stderr, flush=True)
    f.unlink()
    return row


def _kineto_default() -> Path:
    from kineto_scale import KINETO  # the Kineto bench's own helpers

    return KINETO


def _kineto_size(a: argparse.Namespace, tmp: Path) -> dict:
    """The Kineto trace tiled to about ``--kineto-mb``: load only, and the whole advise
    (``bench/scale/kineto_scale.py``'s tiling and timing)."""
    from kineto_scale import kineto_child, tile_to_size

    f, k, n = tile_to_size(a.kineto, tmp, a.kineto_mb)
    row = {"factor": k, "events": n, "file_mb": round(f.stat().st_size / 2**20, 1),
           "load_avg_before": os.getloadavg()[0]}
    row.update(kineto_child(f, a.repeat))
    row["load_avg_after"] = os.getloadavg()[0]
    print(json.dumps(row), file=sys.stderr, flush=True)
    f.unlink()
    return {"trace": str(a.kineto.name), **row}


def _activity_rows(src: Path) -> int:
    with tempfile.TemporaryDirectory() as d:
        return tile(src, Path(d) / "x.sqlite", 1)


def _bytes_per_factor(src: Path, tmp: Path) -> float:
    """File growth per tiling step, measured on a small tiling."""
    a, b = tmp / "f1.sqlite", tmp / "f5.sqlite"
    tile(src, a, 1)
    tile(src, b, 5)
    per = (b.stat().st_size - a.stat().st_size) / 4
    a.unlink()
    b.unlink()
    return per


if __name__ == "__main__":
    main()
