"""Acceptance: ``advise --json`` succeeds on every trace in ../shared/traces and prints
strict JSON (no NaN/Infinity) that follows the contract."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from collections import Counter

import pytest
from click.testing import CliRunner

from conftest import shared_files
from recsys_doctor.cli import main

ALL = (shared_files("nsys", ("*.sqlite",)) + shared_files("h100", ("*.sqlite", "*.json.gz"))
       + shared_files("kineto", ("*.json", "*.json.gz")))
FINDING_IDS = {"short-kernels", "launch-bound", "stream-contention", "memcpy-ping-pong", "sync-api",
               "small-grid", "graph-candidate", "no-gpu-activity", "comm-exposed",
               "allocator-churn", "step-variance", "embedding-bound", "optimizer-unfused",
               "input-stall", "streams-never-overlap", "processes-share-gpu", "copy-kernels", "fp32-gemm"}


def _no_constants(name: str):
    raise AssertionError(f"non-standard JSON constant {name} in advise --json output")


@pytest.mark.shared
@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name[-70:])
def test_advise_json_on_every_shared_trace(path, shared_traces):
    res = CliRunner().invoke(main, ["advise", "--json", str(path)], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout, parse_constant=_no_constants)
    assert d["schema"] == 1
    assert d["trace"]["format"] in ("nsys-sqlite", "kineto-json")
    s = d["summary"]
    assert isinstance(s["kernels"], int)
    assert s["gpu_utilization"] is None or 0.0 <= s["gpu_utilization"] <= 1.0
    assert s["short_kernel_fraction"] is None or 0.0 <= s["short_kernel_fraction"] <= 1.0
    ids = {f["id"] for f in d["findings"]}
    assert ids <= FINDING_IDS
    if s["kernels"] == 0:
        assert "no-gpu-activity" in ids
    for f in d["findings"]:
        assert f["severity"] in ("high", "medium", "low", "note")
        assert f["title"] and f["recommendation"]
    assert d["plan"]["schema"] == 1
    _plan_agrees_with_findings_and_trace(d, path)


def _launch_threads_per_device(path) -> dict[int, int]:
    """Per device, the CPU threads issuing at least 5% of its launches (kernels, copies,
    memsets, graph launches), from SQL over the export or a plain parse of the JSON."""
    rows: list[tuple[int, int]] = []  # (device, thread) per launch
    if path.suffix == ".sqlite":
        con = sqlite3.connect(path)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            for t in ("KERNEL", "MEMCPY", "MEMSET", "GRAPH_TRACE"):
                if f"CUPTI_ACTIVITY_KIND_{t}" in tables:
                    rows += con.execute(
                        f"SELECT g.deviceId, r.globalTid FROM CUPTI_ACTIVITY_KIND_{t} g JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                        "ON r.correlationId = g.correlationId AND r.globalTid / 16777216 = g.globalPid / 16777216"
                    ).fetchall()
        con.close()
    else:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
            doc = json.load(f)
        ev = doc["traceEvents"] if isinstance(doc, dict) else doc
        gpu = {e["args"]["correlation"]: e["args"].get("device", 0) for e in ev
               if str(e.get("cat")).lower() in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
               and "correlation" in e.get("args", {})}
        rows = [(gpu[e["args"]["correlation"]], (e.get("pid"), e.get("tid"))) for e in ev
                if str(e.get("cat")).lower() in ("cuda_runtime", "cuda_driver", "runtime")
                and e.get("args", {}).get("correlation") in gpu]
    per: dict[int, Counter] = {}
    for dev, tid in rows:
        per.setdefault(dev, Counter())[tid] += 1
    return {d: sum(1 for n in c.values() if n >= 0.05 * sum(c.values())) for d, c in per.items()}


def _plan_agrees_with_findings_and_trace(d: dict, path) -> None:
    """The stream-group count and its reason agree with the findings and the trace: groups
    only on findings above note, never from a note; a launch-bound fix that says to overlap
    on several groups gets several; a reason's thread counts are the trace's."""
    g = d["plan"]["stream_groups"]
    sev = {f["id"]: f["severity"] for f in d["findings"]}
    assert all(sev.get(i) in ("high", "medium", "low") for i in g["because"]), g
    if g["count"] >= 2:
        assert g["because"], g
    lb = [f for f in d["findings"] if f["id"] == "launch-bound" and f["severity"] != "note"]
    if lb and "several stream groups" in lb[0]["action"]:
        assert g["count"] >= 2, g
    threads = _launch_threads_per_device(path)
    most = max(threads.values(), default=0)
    if "one CPU thread launches at a time" in g["reason"]:
        assert most <= 1, (g, threads)
    m = re.search(r"the (\d+) launching threads take turns", g["reason"])
    if m:
        assert int(m.group(1)) == most, (g, threads)
    m = re.match(r"(\d+) CPU threads launch concurrently on device (\d+)", g["reason"])
    if m:
        assert threads[int(m.group(2))] >= int(m.group(1)) >= g["count"] >= 2, (g, threads)
    m = re.match(r"(\d+) CPU threads of (\d+) processes launch concurrently on device (\d+)", g["reason"])
    if m:  # (a process's groups hold its own threads: at most the threads of one process)
        assert threads[int(m.group(3))] >= int(m.group(1)) >= int(m.group(2)) >= 2, (g, threads)
        assert g["count"] <= int(m.group(1)) - int(m.group(2)) + 1, (g, threads)


def test_the_corpus_is_all_there_when_shared_is():
    """Guards the parametrization: where ../shared exists, every trace file is iterated."""
    if not ALL:
        pytest.skip("../shared/traces not present")
    assert len(ALL) >= 50
