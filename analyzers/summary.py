"""The headline numbers of a trace (the ``summary`` object of ``advise --json``).

The keys and their exact definitions are a contract (tests recompute each one with SQL on
the nsys file or a plain JSON parse of the Kineto file):

``kernels``
    number of kernel executions (rows of ``trace.kernels``).
``gpu_utilization``
    sum over devices of busy / sum over devices of window. A device's window runs from the
    first start to the last end of any kernel, memcpy, memset or graph execution on it;
    busy is the length of the union of its kernel and graph-execution intervals. ``None``
    when no device has a non-empty window.
``short_kernel_fraction``
    kernels with ``end - start < 10000`` ns over all kernels (``None`` without kernels).
``launch_threads_per_stream_max``
    the largest number of distinct CPU threads ``(pid, tid)`` whose API calls (joined on
    ``(pid, correlation)``) issued kernels, copies or memsets into one stream
    ``(pid, device, stream)``; 0 when nothing joins.
``memcpy``
    ``{"h2d", "d2h", "direction_switches"}``: copies of kind ``h2d`` / ``d2h`` (UVM
    migrations excluded) and, per process, the number of adjacent pairs of h2d/d2h copies
    (ordered by start, then end) whose directions differ.
``sync_calls``
    API calls whose name contains ``Synchronize``.

Extra keys (informative, not part of the fixed contract): ``devices``, ``window_ns``,
``busy_ns``, ``memcpys``, ``memsets``, ``api_calls``, ``graph_launches``,
``graph_executions``, ``median_kernel_us``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..model import Trace
from ._arrays import code_order
from ._ops import device_busy, op_api_rows, op_table, what_is
from ._util import GRAPH_LAUNCH_RE, group_codes, pair_codes, str_contains

__all__ = ["summarize", "SHORT_KERNEL_NS", "device_windows", "direction_switches"]

#: The summary's fixed short-kernel cut (10 us), independent of ``Options`` so the JSON
#: contract does not move with user thresholds.
SHORT_KERNEL_NS = 10_000


def device_windows(trace: Trace) -> dict[int, dict[str, int]]:
    """Per device: ``start``/``end`` of its window and ``busy`` (union of kernels+graphs)."""
    return {p.device: {"start": p.first, "end": p.last, "busy": int((p.busy_end - p.busy_start).sum())}
            for p in device_busy(trace)}


def launch_threads_per_stream_max(trace: Trace) -> int:
    """The most distinct launching threads ``(pid, tid)`` of kernels, copies and memsets
    (joined to their API call) in one stream ``(pid, device, stream)``; 0 when none join."""
    ops = op_table(trace)
    rows = op_api_rows(trace)
    m = (rows >= 0) & ~what_is(ops, "graph") if len(ops) else np.zeros(0, bool)
    if not m.any():
        return 0
    tid = trace.api["tid"].to_numpy(np.int64)[rows[m]]
    stream, _ = group_codes(*(ops[c].to_numpy(np.int64)[m] for c in ("pid", "device", "stream")))
    _, stream_of_pair, _ = pair_codes(stream, tid)  # each distinct (stream, thread) once
    return int(np.bincount(stream_of_pair).max())


def direction_switches(memcpys: Any) -> int:
    """Adjacent h2d/d2h copies of one process (by start, then end) with different
    directions, summed over processes."""
    sel = memcpys["kind"].isin(["h2d", "d2h"]).to_numpy()
    if sel.sum() < 2:
        return 0
    # a stable sort of the three key columns (no copy of the table)
    p, s, e = (memcpys[c].to_numpy()[sel] for c in ("pid", "start", "end"))
    k = (memcpys["kind"] == "h2d").to_numpy()[sel]
    order = _pid_start_end_order(p, s, e)
    if order is not None:
        k, p = k[order], p[order]
    same_pid = p[1:] == p[:-1]
    return int(((k[1:] != k[:-1]) & same_pid).sum())


def _pid_start_end_order(p: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    """``np.lexsort((e, s, p))``, or None where that is the identity. Tables come in
    start order, so usually only the processes need sorting: a stable sort of their
    narrow codes (numpy sorts those by counting), none at all for one process."""
    if s.size > 1 and not bool(((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] >= e[:-1]))).all()):
        return np.lexsort((e, s, p))
    codes, uniq = pd.factorize(p, sort=True)
    if len(uniq) <= 1:
        return None
    return code_order(codes, len(uniq))


def summarize(trace: Trace) -> dict[str, Any]:
    """The fixed summary of ``trace`` (see the module docstring for each definition)."""
    k = trace.kernels
    dur = (k["end"] - k["start"]).to_numpy()
    wins = device_windows(trace)
    window = sum(w["end"] - w["start"] for w in wins.values())
    busy = sum(w["busy"] for w in wins.values())

    # distinct (pid, tid): pid is part of the stream key, so tid alone is distinct within it
    threads_max = launch_threads_per_stream_max(trace)

    mc = trace.memcpys
    return {
        "kernels": int(len(k)),
        "gpu_utilization": (busy / window) if window > 0 else None,
        "short_kernel_fraction": (float((dur < SHORT_KERNEL_NS).sum()) / len(k)) if len(k) else None,
        "launch_threads_per_stream_max": threads_max,
        "memcpy": {
            "h2d": int((mc["kind"] == "h2d").sum()),
            "d2h": int((mc["kind"] == "d2h").sum()),
            "direction_switches": direction_switches(mc),
        },
        "sync_calls": int(str_contains(trace.api["name"], "Synchronize", regex=False).sum()),
        # extras
        "devices": sorted(wins),
        "window_ns": int(window),
        "busy_ns": int(busy),
        "memcpys": int(len(mc)),
        "memsets": int(len(trace.memsets)),
        "api_calls": int(len(trace.api)),
        "graph_launches": int(str_contains(trace.api["name"], GRAPH_LAUNCH_RE).sum()),
        "graph_executions": int(len(trace.graphs)),
        "median_kernel_us": float(np.median(dur)) / 1000.0 if len(k) else None,
    }
