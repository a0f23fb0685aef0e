"""Means of the rows of ``bench/apply/hooked_run.py`` (``knob_ab.sh``, ``hook_ab.sh``): per script and
label, the mean q/s, each run's q/s in order, and how many distinct checksums the runs printed (1: every
output equal). ``python bench/apply/ab_means.py OUT/knob_ab.jsonl``"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    by: dict[tuple[str, str], list[tuple[float | None, object]]] = defaultdict(list)
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            by[(r["script"], r["label"])].append((r.get("qps"), r.get("checksum")))
    for (script, label), runs in sorted(by.items()):
        q = [x for x, _ in runs if x]
        mean = sum(q) / len(q) if q else float("nan")
        print(f"{script[:18]:18s} {label} mean {mean:9.1f}  {[x for x, _ in runs]}  "
              f"{len({c for _, c in runs})} checksum(s)")


if __name__ == "__main__":
    main(sys.argv[1])
