"""64 ranks: ``advise DIR`` with local processes and with a Dask LocalCluster, same result.

The rank traces are made from one real PyTorch profiler trace of a 4-rank NCCL job
(torchrec's golden training trace, rank 0): rank r is a copy with ``distributedInfo.rank =
r`` (``world_size`` 64), its timeline shifted by r x 1.5 ms and slowed down as a whole
(every timestamp and duration) by (r mod 5) x 1% so that the ranks differ a little; rank 17
is made a straggler: 30% slower, and arriving late at every collective (each NCCL kernel
starts later and ends where it ended, 30% of its length: the others wait for it). Each configuration runs the whole
command (``recsys-doctor advise DIR --json --workers 2 [--dask local]``) in a fresh
subprocess; the two JSON outputs must be equal apart from their ``engine`` field.

    python bench/ranks/ranks_bench.py [--ranks 64] [--workers 2] [--out bench/ranks/results/ranks_....json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT.parent / "shared" / "traces" / "kineto" / (
    "pytorch__torchrec__examples__golden_training__trace__sst_long_a2a_optimizer_5_qcomm__"
    "ip-172-31-16-248.us-east-2.compute.internal_54105.1698958768306379521.pt.trace.json")
STRAGGLER = 17


def make_ranks(src: Path, out: Path, n: int) -> list[Path]:
    doc = msgspec.json.decode(src.read_bytes())
    t0 = min(e["ts"] for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float)))
    files = []
    for r in range(n):
        d = dict(doc)
        d["distributedInfo"] = dict(doc.get("distributedInfo") or {}, rank=r, world_size=n)
        stretch = 1.30 if r == STRAGGLER else 1 + 0.01 * (r % 5)
        evs = []
        for e in doc["traceEvents"]:
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = t0 + (e["ts"] - t0) * stretch + r * 1500
            if isinstance(e.get("dur"), (int, float)):
                e["dur"] = e["dur"] * stretch
                if r == STRAGGLER and e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower():
                    e["ts"], e["dur"] = e["ts"] + 0.7 * e["dur"], 0.3 * e["dur"]
            evs.append(e)
        d["traceEvents"] = evs
        f = out / f"rank{r:03d}.pt.trace.json"
        f.write_bytes(msgspec.json.encode(d))
        files.append(f)
    return files


def run(cmd: list[str]) -> tuple[dict, bytes]:
    t = time.perf_counter()
    with tempfile.TemporaryFile() as o, tempfile.TemporaryFile() as e:
        p = subprocess.Popen(cmd, stdout=o, stderr=e)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        o.seek(0)
        e.seek(0)
        out, err = o.read(), e.read()
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}): {err.decode()[-2000:]}")
    return {"seconds": round(wall, 3), "peak_rss_mb_largest_process": round(ru.ru_maxrss / 1024, 1)}, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--src", type=Path, default=SRC)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "ranks" / "results" / f"ranks_{dt.date.today()}.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = make_ranks(a.src, Path(tmp), a.ranks)
        mb = sum(f.stat().st_size for f in files) / 2**20
        base = [sys.executable, "-m", "recsys_doctor", "advise", tmp, "--json", "--workers", str(a.workers)]
        local, out_local = run(base)
        dask, out_dask = run(base + ["--dask", "local"])
    jl, jd = json.loads(out_local), json.loads(out_dask)
    el, ed = jl.pop("engine"), jd.pop("engine")
    same = jl == jd
    doc = {
        "what": (f"recsys-doctor advise DIR --json on {a.ranks} rank traces made from a real NCCL Kineto trace "
                 f"(shifted, slowed 0-4% per rank, rank {STRAGGLER} 30% slower: a straggler); local processes vs "
                 "Dask LocalCluster, both with the same number of workers"),
        "source_trace": a.src.name, "ranks": a.ranks, "total_mb": round(mb, 1), "workers": a.workers,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "local_processes": {"engine": el, **local}, "dask_localcluster": {"engine": ed, **dask},
        "same_combined_result": same,
        "stragglers": jl["stragglers"], "totals": jl["totals"],
        "worst_ranks": [{"rank": r["rank"], "gpu_utilization": r["summary"]["gpu_utilization"],
                         "overlap_share": r["overlap_share"]} for r in jl["ranks"][:5]],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("local_processes", "dask_localcluster", "same_combined_result",
                                           "stragglers")}, indent=1))
    if not same:
        raise SystemExit("local processes and Dask disagree")


if __name__ == "__main__":
    main()
