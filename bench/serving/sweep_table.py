"""q/s per configuration and client count from one or more ``serving_sweep.py`` result files (the
mean where several files have the same point, e.g. rounds), and every row with an error or a max abs
error above 1e-5 flagged ``BAD``. ``python bench/serving/sweep_table.py OUT/round1.json OUT/round2.json``
(the ``*_info.json`` files beside them are skipped)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(paths: list[str]) -> None:
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for p in paths:
        if p.endswith("_info.json"):
            continue
        with open(p) as fh:
            rows = json.load(fh)
        for r in rows if isinstance(rows, list) else rows["rows"]:
            if r.get("qps"):
                by[(r["config"], r["Q"])].append(r["qps"])
            if r.get("errors") or (r.get("max_abs_err") or 0) > 1e-5:
                print("BAD", p, r["config"], r.get("Q"), r.get("max_abs_err"), r.get("errors"))
    qs = sorted({q for _, q in by})
    print(f"{'config':30s} " + " ".join(f"{q:>7d}" for q in qs))
    for c in dict.fromkeys(c for c, _ in by):
        print(f"{c:30s} " + " ".join(f"{sum(v) / len(v):7.0f}" if (v := by.get((c, q))) else "      -" for q in qs))


if __name__ == "__main__":
    main(sys.argv[1:])
