"""summarize(load(path)) against numbers computed independently from the raw files:
SQL on each Nsight Systems SQLite export, a plain JSON parse of each Kineto trace."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from _intervals import union_len
from conftest import shared_files
from recsys_doctor.analyzers.summary import summarize
from recsys_doctor.loaders import load

pytestmark = pytest.mark.shared

NSYS = shared_files("h100", ("*.sqlite",)) + shared_files("nsys", ("*.sqlite",))
KINETO = shared_files("h100", ("*.json.gz", "*.json")) + shared_files("kineto", ("*.json.gz", "*.json"))


def switches(copies) -> int:
    """copies: (pid, start, end, is_h2d); adjacent pairs per pid with different direction."""
    n = 0
    by_pid = defaultdict(list)
    for pid, s, e, h in copies:
        by_pid[pid].append((s, e, h))
    for lst in by_pid.values():
        lst.sort(key=lambda x: (x[0], x[1]))
        n += sum(1 for a, b in zip(lst, lst[1:]) if a[2] != b[2])
    return n


# --- nsys -------------------------------------------------------------------------------
def _tables(db) -> set[str]:
    return {r[0] for r in db.execute("select name from sqlite_master where type in ('table','view')")}


def nsys_expected(path: Path) -> dict:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    t = _tables(db)
    K, M, S, G = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                  "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    exp: dict = {"kernels": db.execute(f"select count(*) from {K}").fetchone()[0] if K in t else 0}
    # windows and busy per device
    act = [x for x in (K, M, S, G) if x in t]
    win = {}
    for tb in act:
        for dev, lo, hi in db.execute(f"select deviceId, min(start), max(end) from {tb} group by deviceId"):
            a, b = win.get(dev, (lo, hi))
            win[dev] = (min(a, lo), max(b, hi))
    busy = 0
    for dev in win:
        pairs = []
        for tb in (K, G):
            if tb in t:
                pairs += db.execute(f"select start, end from {tb} where deviceId = ?", (dev,)).fetchall()
        busy += union_len(pairs)
    window = sum(b - a for a, b in win.values())
    exp["gpu_utilization"] = busy / window if window > 0 else None
    if exp["kernels"]:
        n_short = db.execute(f"select count(*) from {K} where end - start < 10000").fetchone()[0]
        exp["short_kernel_fraction"] = n_short / exp["kernels"]
    else:
        exp["short_kernel_fraction"] = None
    # launching threads per stream: runtime (and driver) calls joined on (pid, correlation)
    apis = [x for x in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER") if x in t]
    best = 0
    if apis:
        api_union = " union all ".join(
            f"select (globalTid >> 24) & 16777215 as pid, globalTid & 16777215 as tid, correlationId as corr "
            f"from {a} where correlationId != 0" for a in apis)
        ops_union = " union all ".join(
            f"select (globalPid >> 24) & 16777215 as pid, deviceId as dev, streamId as st, correlationId as corr "
            f"from {x} where correlationId != 0" for x in (K, M, S) if x in t)
        if ops_union:
            q = (f"select max(n) from (select count(distinct a.tid) as n from ({ops_union}) o "
                 f"join ({api_union}) a on a.pid = o.pid and a.corr = o.corr group by o.pid, o.dev, o.st)")
            best = db.execute(q).fetchone()[0] or 0
    exp["launch_threads_per_stream_max"] = best
    # copies: copyKind 1 = HtoD, 2 = DtoH (CUPTI enum)
    if M in t:
        h2d = db.execute(f"select count(*) from {M} where copyKind = 1").fetchone()[0]
        d2h = db.execute(f"select count(*) from {M} where copyKind = 2").fetchone()[0]
        rows = db.execute(f"select (globalPid >> 24) & 16777215, start, end, copyKind = 1 from {M} "
                          "where copyKind in (1, 2)").fetchall()
        exp["memcpy"] = {"h2d": h2d, "d2h": d2h, "direction_switches": switches(rows)}
    else:
        exp["memcpy"] = {"h2d": 0, "d2h": 0, "direction_switches": 0}
    n_sync = 0
    for a in apis:
        n_sync += db.execute(f"select count(*) from {a} r join StringIds s on s.id = r.nameId "
                             "where instr(s.value, 'Synchronize') > 0").fetchone()[0]
    exp["sync_calls"] = n_sync
    db.close()
    return exp


def _check(got: dict, exp: dict) -> None:
    assert got["kernels"] == exp["kernels"]
    if exp["gpu_utilization"] is None:
        assert got["gpu_utilization"] is None
    else:
        assert got["gpu_utilization"] == pytest.approx(exp["gpu_utilization"], rel=1e-6,
                                                       abs=exp.get("_util_tol", 1e-9))
    if exp["short_kernel_fraction"] is None:
        assert got["short_kernel_fraction"] is None
    else:
        assert got["short_kernel_fraction"] == pytest.approx(exp["short_kernel_fraction"], abs=exp.get("_tol", 0))
    assert got["launch_threads_per_stream_max"] == exp["launch_threads_per_stream_max"]
    assert got["memcpy"] == exp["memcpy"]
    assert got["sync_calls"] == exp["sync_calls"]


@pytest.mark.parametrize("path", NSYS, ids=lambda p: p.name)
def test_summary_matches_sql(path, shared_traces):
    _check(summarize(load(path)), nsys_expected(path))


# --- kineto -----------------------------------------------------------------------------
def _read_json(path: Path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    return doc if isinstance(doc, list) else doc.get("traceEvents", [])


def kineto_expected(path: Path) -> dict:
    evs = [e for e in _read_json(path) if isinstance(e, dict) and e.get("ph") == "X"]
    kcat, mcat, scat = {"kernel", "Kernel"}, {"gpu_memcpy", "Memcpy"}, {"gpu_memset", "Memset"}
    acat = {"cuda_runtime", "cuda_driver", "Runtime"}

    def ns(e):
        s = round(float(e["ts"]) * 1000)
        return s, s + round(float(e.get("dur", 0)) * 1000)

    def dev(e):
        a = e.get("args") or {}
        return a.get("device", e.get("pid"))

    def stream(e):
        a = e.get("args") or {}
        return a.get("stream", e.get("tid"))

    kern = [e for e in evs if e.get("cat") in kcat]
    ops = [e for e in evs if e.get("cat") in kcat | mcat | scat]
    exp: dict = {"kernels": len(kern)}
    win, busy_pairs = {}, defaultdict(list)
    for e in ops:
        s, t = ns(e)
        a, b = win.get(dev(e), (s, t))
        win[dev(e)] = (min(a, s), max(b, t))
        if e.get("cat") in kcat:
            busy_pairs[dev(e)].append((s, t))
    window = sum(b - a for a, b in win.values())
    busy = sum(union_len(p) for p in busy_pairs.values())
    exp["gpu_utilization"] = busy / window if window > 0 else None
    # us floats -> ns: the loader may round each endpoint differently by up to ~1 ns
    exp["_util_tol"] = (4 * len(ops) / window) if window > 0 else 1e-9
    durs = [float(e.get("dur", 0)) * 1000 for e in kern]
    exp["short_kernel_fraction"] = (sum(d < 10000 for d in durs) / len(durs)) if durs else None
    # borderline durations (within 1 ns of the cut) may round either way in the loader
    exp["_tol"] = (sum(abs(d - 10000) <= 1 for d in durs) / len(durs)) if durs else 0
    api = {}
    for e in evs:
        if e.get("cat") in acat:
            c = (e.get("args") or {}).get("correlation")
            if c not in (None, 0, -1):
                api.setdefault(c, (str(e.get("pid")), str(e.get("tid"))))
    threads = defaultdict(set)
    for e in ops:
        c = (e.get("args") or {}).get("correlation")
        if c in api:
            threads[(str(dev(e)), str(stream(e)))].add(api[c])
    exp["launch_threads_per_stream_max"] = max((len(v) for v in threads.values()), default=0)
    copies = []
    for e in evs:
        if e.get("cat") in mcat:
            name = str(e.get("name", ""))
            if "HtoD" in name or "DtoH" in name:
                s, t = ns(e)
                copies.append((0, s, t, "HtoD" in name))
    exp["memcpy"] = {"h2d": sum(c[3] for c in copies), "d2h": sum(not c[3] for c in copies),
                     "direction_switches": switches(copies)}
    exp["sync_calls"] = sum(1 for e in evs if e.get("cat") in acat and "Synchronize" in str(e.get("name", "")))
    return exp


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name[-60:])
def test_summary_matches_json(path, shared_traces):
    _check(summarize(load(path)), kineto_expected(path))
