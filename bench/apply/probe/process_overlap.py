"""Per device of an Nsight Systems SQLite export: each process's kernel busy time (the union of
its kernels' intervals), the device's, and the time two or more processes ran kernels at once,
computed in plain Python from CUPTI_ACTIVITY_KIND_KERNEL, to check the processes-share-gpu
finding against (session23_first.sh).

    python bench/apply/probe/process_overlap.py TRACE.sqlite
"""
import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from _intervals import union_len as union  # noqa: E402  (the tests' own union, written out by hand)


con = sqlite3.connect(sys.argv[1])
rows = con.execute("SELECT deviceId, (globalPid >> 24) & 16777215, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
by = {}
for dev, pid, s, e in rows:
    by.setdefault(dev, {}).setdefault(pid, []).append((s, e))
out = []
for dev, procs in sorted(by.items()):
    busy = {pid: union(iv) for pid, iv in procs.items()}
    dev_busy = union([x for iv in procs.values() for x in iv])
    total = sum(busy.values())
    out.append({"device": dev, "processes": len(procs), "busy_us": {str(p): b / 1000 for p, b in busy.items()},
                "device_busy_us": dev_busy / 1000, "overlap_us": (total - dev_busy) / 1000,
                "overlap_share": (total - dev_busy) / total if total else 0.0})
print(json.dumps(out))
