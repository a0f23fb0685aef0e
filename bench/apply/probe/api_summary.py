"""Per-process CUDA runtime calls of an nsys .sqlite export, by name: count and total ms, plus the
kernels and copies on the GPU (count, busy ms) - to compare a script's run unhooked and hooked.
``python api_summary.py X.sqlite [Y.sqlite ...]``: one JSON line per file."""

import json
import sqlite3
import sys


def summary(path):
    db = sqlite3.connect(path)
    q = lambda sql: db.execute(sql).fetchall()  # noqa: E731
    tables = {r[0] for r in q("SELECT name FROM sqlite_master WHERE type='table'")}
    out = {"file": path, "api": {}}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        for name, n, ms in q("SELECT s.value, COUNT(*), SUM(r.end - r.start) / 1e6 FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                             "JOIN StringIds s ON s.id = r.nameId GROUP BY s.value ORDER BY 3 DESC LIMIT 25"):
            out["api"][name] = [n, round(ms, 3)]
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if t in tables:
            n, ms, lo, hi = q(f"SELECT COUNT(*), SUM(end - start) / 1e6, MIN(start), MAX(end) FROM {t}")[0]
            out[t.rsplit("_", 1)[-1].lower()] = {"n": n, "busy_ms": round(ms or 0, 3),
                                                 "span_ms": round(((hi or 0) - (lo or 0)) / 1e6, 3)}
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        out["memcpy_kinds"] = q("SELECT copyKind, srcKind, dstKind, COUNT(*), ROUND(SUM(end-start)/1e6, 3) "
                                "FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1, 2, 3")
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        out["streams"] = q("SELECT streamId, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1 ORDER BY 2 DESC LIMIT 8")
    if "OSRT_API" in tables:
        out["osrt"] = q("SELECT s.value, COUNT(*), ROUND(SUM(o.end - o.start) / 1e6, 3) FROM OSRT_API o "
                        "JOIN StringIds s ON s.id = o.nameId GROUP BY 1 ORDER BY 3 DESC LIMIT 12")
    return out


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(json.dumps(summary(p)))
