"""Per process of an Nsight Systems SQLite export: kernels, memcpys, and CUDA runtime/driver API
calls (plain SQL), to see what a capture kept of each process (``flush_interval.sh``).

    python bench/apply/probe/nsys_by_pid.py TRACE.sqlite LABEL
"""
import json
import sqlite3
import sys


def count(con, table, pid_expr):
    try:
        return dict(con.execute(f"SELECT {pid_expr} AS pid, COUNT(*) FROM {table} GROUP BY pid").fetchall())
    except sqlite3.OperationalError:
        return {}


con = sqlite3.connect(sys.argv[1])
pid = "(globalPid >> 24) & 16777215"
tid = "(globalTid >> 24) & 16777215"
rows = {"kernels": count(con, "CUPTI_ACTIVITY_KIND_KERNEL", pid),
        "memcpys": count(con, "CUPTI_ACTIVITY_KIND_MEMCPY", pid),
        "runtime_api": count(con, "CUPTI_ACTIVITY_KIND_RUNTIME", tid)}
pids = sorted(set().union(*rows.values()))
print(json.dumps({"label": sys.argv[2], "totals": {k: sum(v.values()) for k, v in rows.items()},
                  "by_pid": {str(p): {k: v.get(p, 0) for k, v in rows.items()} for p in pids}}))
