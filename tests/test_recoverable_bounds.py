"""Acceptance (issue 23): on every shared trace no finding claims more recoverable time
than it could recover, and findings with a shared cause do not add past the idle time.

The bounds are computed here, independently of the loaders and analyzers: SQL over the
nsys export, JSON arithmetic over the Kineto file - the window (per device, first start to
last end of any kernel, copy, memset or graph), the idle time (the window less the union
of those operations) and, for small-grid, the most unused-SM time any kernel with fewer
blocks than SMs could leave (its whole duration times the share of SMs it leaves empty).
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_files
from recsys_doctor.analyzers import run_all
from recsys_doctor.loaders import load
from recsys_doctor.options import Options

pytestmark = pytest.mark.shared

ALL = (shared_files("nsys", ("*.sqlite",)) + shared_files("h100", ("*.sqlite", "*.json.gz"))
       + shared_files("kineto", ("*.json", "*.json.gz")))
#: findings whose recoverable time is GPU idle time (gaps), plus a part that is not idle
#: for two of them (evidence key): the copy time merging copies saves, half the foreach
#: optimizer kernels' time a fused optimizer saves
IDLE_FINDINGS = {"launch-bound", "short-kernels", "graph-candidate", "sync-api", "stream-contention",
                 "allocator-churn", "step-variance", "memcpy-ping-pong", "input-stall", "embedding-bound",
                 "optimizer-unfused"}
NOT_IDLE = {"memcpy-ping-pong": "merge_copies_saving_ns", "optimizer-unfused": "half_foreach_time_ns"}
TOL = 1000  # ns: Kineto microsecond floats


def union_ns(s: np.ndarray, e: np.ndarray) -> int:
    """Length of the union of intervals, by a plain sort-and-sweep."""
    if not len(s):
        return 0
    o = np.argsort(s, kind="stable")
    tot, cs, ce = 0, int(s[o[0]]), int(e[o[0]])
    for a, b in zip(s[o[1:]].tolist(), e[o[1:]].tolist()):
        if a > ce:
            tot += ce - cs
            cs, ce = a, b
        else:
            ce = max(ce, b)
    return tot + ce - cs


def json_events(path: Path) -> tuple[list[dict], dict]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    d = json.loads(raw)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    return ev, (d if isinstance(d, dict) else {})


def bounds_kineto(path: Path) -> dict:
    ev, top = json_events(path)
    gpu = [e for e in ev if e.get("ph") == "X" and str(e.get("cat", "")).lower()
           in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")]
    dev = np.array([int((e.get("args") or {}).get("device", e.get("pid", 0))) for e in gpu], dtype=np.int64)
    s = np.array([round(float(e["ts"]) * 1000) for e in gpu], dtype=np.int64)
    e_ = s + np.array([round(float(e.get("dur", 0)) * 1000) for e in gpu], dtype=np.int64)
    sms = [int(p.get("numSms") or 0) for p in top.get("deviceProperties", [])]
    kern = [e for e in gpu if str(e.get("cat", "")).lower() == "kernel"]
    grid = [(e.get("args") or {}).get("grid") for e in kern]
    blocks = [int(np.prod(g)) if isinstance(g, list) and g else None for g in grid]
    small = _small_grid_bound([e["name"] for e in kern], blocks,
                              [round(float(e.get("dur", 0)) * 1000) for e in kern], max(sms, default=0) or None)
    return _window_idle(dev, s, e_) | {"small_grid_bound": small}


def bounds_nsys(path: Path) -> dict:
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    have = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
    rows = []
    for t in ("KERNEL", "MEMCPY", "MEMSET", "GRAPH_TRACE"):
        if f"CUPTI_ACTIVITY_KIND_{t}" in have:
            rows += db.execute(f"select deviceId, start, end from CUPTI_ACTIVITY_KIND_{t}").fetchall()
    a = np.array(rows, dtype=np.int64).reshape(-1, 3)
    out = _window_idle(a[:, 0], a[:, 1], a[:, 2])
    try:
        sm = db.execute("select max(smCount) from TARGET_INFO_GPU").fetchone()[0]
    except sqlite3.OperationalError:  # older exports: no SM count here (at most: every kernel's whole time)
        sm = None
    k = (db.execute("select s.value, k.gridX * k.gridY * k.gridZ, k.end - k.start from CUPTI_ACTIVITY_KIND_KERNEL k "
                    "join StringIds s on s.id = k.shortName").fetchall()
         if "CUPTI_ACTIVITY_KIND_KERNEL" in have and "StringIds" in have else [])
    # (short names: a communication kernel's short name carries the nccl/all-reduce name too)
    out["small_grid_bound"] = _small_grid_bound([x[0] for x in k], [x[1] for x in k], [x[2] for x in k], sm)
    return out


def _window_idle(dev: np.ndarray, s: np.ndarray, e: np.ndarray) -> dict:
    window = idle = 0
    for d in np.unique(dev):
        m = dev == d
        w = int(e[m].max() - s[m].min())
        window += w
        idle += w - union_ns(s[m], np.maximum(e[m], s[m]))
    return {"window": window, "idle": idle}


def _small_grid_bound(names: list, blocks: list, durs: list, sm: int | None) -> int:
    """Every non-communication kernel with fewer blocks than SMs, run alone: duration x
    share of SMs left empty (the most small-grid could ever claim); with the SM count
    unknown, every non-communication kernel's whole duration."""
    rx = re.compile(Options().comm_kernel_pattern)
    tot = 0.0
    for n, b, d in zip(names, blocks, durs):
        if rx.search(str(n)) or b is None:
            continue
        if sm is None:
            tot += d
        elif b < sm:
            tot += d * (1 - b / sm)
    return int(tot)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name[-70:])
def test_no_finding_claims_more_than_it_could_recover(path, shared_traces):
    b = bounds_nsys(path) if path.suffix == ".sqlite" else bounds_kineto(path)
    findings = [f for r in run_all(load(path), Options()) for f in r.findings]
    for f in findings:
        rec = f.recoverable_ns or 0
        assert rec <= b["window"] + TOL, (f.id, rec, b)
        if f.id in IDLE_FINDINGS:
            extra = f.evidence.get(NOT_IDLE.get(f.id, ""), 0)
            assert rec <= b["idle"] + extra + TOL, (f.id, rec, b)
        if f.id == "small-grid":
            assert rec <= b["small_grid_bound"] + TOL, (rec, b)
    # every idle gap is counted once: all the idle findings together claim at most the idle
    idle_total = sum(max(0, (f.recoverable_ns or 0) - f.evidence.get(NOT_IDLE.get(f.id, ""), 0))
                     for f in findings if f.id in IDLE_FINDINGS)
    assert idle_total <= b["idle"] + TOL * len(IDLE_FINDINGS), (idle_total, b)
    # findings that share a cause (connected by shared_cause_with) add up to at most the idle
    byid = {f.id: f for f in findings}
    seen: set[str] = set()
    for f in findings:
        if f.id in seen or not f.evidence.get("shared_cause_with"):
            continue
        group, todo = set(), [f.id]
        while todo:
            x = todo.pop()
            if x in group or x not in byid:
                continue
            group.add(x)
            todo += byid[x].evidence.get("shared_cause_with", [])
        seen |= group
        tot = sum((byid[x].recoverable_ns or 0) - (byid[x].evidence.get("merge_copies_saving_ns", 0)
                                                   if x == "memcpy-ping-pong" else 0) for x in group)
        assert tot <= b["idle"] + TOL * len(group), (sorted(group), tot, b)
        assert sum(byid[x].recoverable_ns or 0 for x in group) <= b["window"] + TOL * len(group)
