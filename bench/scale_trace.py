"""How ``advise`` scales with trace size: tile a real Nsight Systems export in time and
time the whole ``recsys-doctor advise --json`` run (load + analyze + plan) on each size.

For a tiling factor K the activity tables (kernels, copies, memsets, runtime API, syncs,
graph executions, NVTX) are copied K times, each copy shifted by K x the trace duration
and with correlation ids offset so they stay unique per process; everything else (strings,
threads, devices, metadata) is kept once. Each size runs in a fresh subprocess so the
peak resident memory (ru_maxrss of the child) is that run's own.

    python bench/scale_trace.py [--trace FILE] [--factors 1,2,4,8,16] [--out bench/results/...json]

Default trace: the largest shared H100 export when ../shared is present, else the sample
trace shipped with the package.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "h100" / "wdl_graphs_q4_h100.sqlite"
DEMO = ROOT / "recsys_doctor" / "data" / "demo_wdl_serial_q4.sqlite.gz"

ACTIVITY = [
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "NVTX_EVENTS",
]


def tile(src: Path, dst: Path, k: int) -> int:
    """Write a K-times tiled copy of ``src`` to ``dst``; return the number of activity rows."""
    if src.suffix == ".gz":
        with gzip.open(src) as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
    else:
        shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    (t0, t1) = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    span = int(t1) + 1_000_000
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


KINETO = ROOT.parent / "shared" / "traces" / "kineto" / \
    "facebookresearch__HolisticTraceAnalysis__tests__data__df_index_resolver__df_index_resolver.json.gz"


def tile_kineto(src: Path, dst: Path, k: int) -> int:
    """Write a K-times tiled copy of a Kineto JSON trace (events shifted by K x the
    trace span, correlation and flow ids offset); return the number of events."""
    import orjson

    raw = gzip.open(src).read() if src.suffix == ".gz" else src.read_bytes()
    doc = orjson.loads(raw)
    events = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    corr = max((e.get("args") or {}).get("correlation", 0) or 0 for e in events
               if isinstance((e.get("args") or {}).get("correlation", 0), int)) + 1
    fid = max((e.get("id", 0) for e in events if isinstance(e.get("id"), int)), default=0) + 1
    n = 0
    with open(dst, "wb") as f:
        head = orjson.dumps(doc)[:-1]
        f.write(head + (b", " if doc else b"") + b'"traceEvents": [\n')
        first = True
        for i in range(k):
            for e in events:
                if i and e.get("ph") == "M":
                    continue  # metadata once
                if i:
                    e = dict(e)
                    if isinstance(e.get("ts"), (int, float)):
                        e["ts"] = e["ts"] + i * span
                    if isinstance(e.get("id"), int):
                        e["id"] = e["id"] + i * fid
                    a = e.get("args")
                    if isinstance(a, dict) and isinstance(a.get("correlation"), int) and a["correlation"] > 0:
                        e["args"] = dict(a, correlation=a["correlation"] + i * corr)
                f.write((b"" if first else b",\n") + orjson.dumps(e))
                first = False
                n += 1
        f.write(b"\n]}\n")
    return n


_CHILD = r"""
import json, resource, sys, time
t = time.perf_counter()
from recsys_doctor.advise import advise
r = advise(sys.argv[1])
d = r.to_dict()
el = time.perf_counter() - t
print(json.dumps({"seconds": el, "kernels": d["summary"]["kernels"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=SHARED if SHARED.exists() else DEMO)
    ap.add_argument("--factors", default="1,2,4,8,16")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the fastest is reported")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"scale_{dt.date.today()}.json")
    a = ap.parse_args()
    res = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in [int(x) for x in a.factors.split(",")]:
            f = Path(tmp) / f"tiled_{k}.sqlite"
            rows = tile(a.trace, f, k)
            runs = []
            for _ in range(a.repeat):
                out = subprocess.run([sys.executable, "-c", _CHILD, str(f)], capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            best = min(runs, key=lambda r: r["seconds"])
            cli = []
            for _ in range(a.repeat):  # the whole command, Python start-up and imports included
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "recsys_doctor", "advise", "--json", str(f)],
                               stdout=subprocess.DEVNULL, check=True)
                cli.append(time.perf_counter() - t)
            row = {"factor": k, "activity_rows": rows, "file_mb": round(f.stat().st_size / 2**20, 1),
                   "seconds": round(best["seconds"], 3), "cli_seconds": round(min(cli), 3), "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
                   "kernels": best["kernels"]}
            print(json.dumps(row), flush=True)
            res.append(row)
            f.unlink()
    import pandas
    import recsys_doctor

    doc = {
        "what": "recsys-doctor advise on a tiled real trace: seconds = load + analyze + plan in-process; cli_seconds = the whole `python -m recsys_doctor advise --json` command",
        "trace": str(a.trace.relative_to(ROOT.parent) if a.trace.is_relative_to(ROOT.parent) else a.trace),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "pandas": pandas.__version__, "recsys_doctor": recsys_doctor.__version__, "gpu": None},
        "results": res,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
