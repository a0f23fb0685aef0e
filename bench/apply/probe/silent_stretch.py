"""Is a trace's host-wait idle paced by CUDA calls (launch-bound) or by host work outside them?

For an Nsight Systems SQLite export: walk every GPU operation (kernels, copies, memsets, graph
executions) of the trace in start order; a gap of the device ended by an operation whose
launch call began after the device went idle is a host-wait gap (the definition of
``analyzers/launch_bound.py``, recomputed here from the tables alone). For each, the
*silent stretch* is how long the launching thread had made no CUDA runtime call of any kind
before that launch. Printed: the host-wait share of the window, the share of host-wait time
whose silent stretch was at least 50/100/200/500 us (host work outside CUDA calls: the
program's own Python, pandas, other threads holding the GIL), and the stretch percentiles.

    python bench/apply/probe/silent_stretch.py trace.sqlite [...]
"""

from __future__ import annotations

import sqlite3
import sys
from collections import defaultdict

import numpy as np

THRESHOLDS_US = (50, 100, 200, 500)
OP_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
             "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")


def run(path: str) -> None:
    c = sqlite3.connect(path)
    ops: list[tuple] = []
    for tab in OP_TABLES:
        try:
            ops += c.execute(f"select start, end, correlationId from {tab}").fetchall()
        except sqlite3.OperationalError:  # a table this trace lacks
            pass
    ops.sort()
    api = c.execute("select start, end, correlationId, globalTid from CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
    by_corr = {a[2]: a for a in api}
    calls: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for s, e, _, tid in api:
        calls[tid].append((s, e))
    starts, ends = {}, {}
    for tid, v in calls.items():
        v.sort()
        starts[tid] = np.array([s for s, _ in v])
        ends[tid] = np.maximum.accumulate(np.array([e for _, e in v]))  # the latest end so far
    reach = None
    host_wait, silent, stretches = 0, dict.fromkeys(THRESHOLDS_US, 0), []
    for s, e, corr in ops:
        if reach is not None and s > reach:
            gap = s - reach
            a = by_corr.get(corr)
            if a is not None and a[0] >= reach:  # launched after the device went idle
                host_wait += gap
                i = int(np.searchsorted(starts[a[3]], a[0]))  # the thread's calls before this one
                prev_end = ends[a[3]][i - 1] if i > 0 else a[0]
                stretch_us = (a[0] - prev_end) / 1e3
                stretches.append((stretch_us, gap))
                for t in THRESHOLDS_US:
                    if stretch_us >= t:
                        silent[t] += gap
        reach = e if reach is None else max(reach, e)
    window = reach - ops[0][0]
    print("/".join(path.split("/")[-2:]), f"window {window / 1e6:.1f} ms host_wait {host_wait / window:.1%} "
          f"gaps {len(stretches)}", {t: f"{v / max(host_wait, 1):.1%}" for t, v in silent.items()})
    if stretches:
        st = np.array(stretches)
        print("  stretch percentiles us (by count):", np.percentile(st[:, 0], [50, 90, 99]).round(1),
              " gap median us", np.median(st[:, 1]) / 1e3)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        run(p)
