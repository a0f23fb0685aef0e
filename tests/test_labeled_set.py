"""The labeled set (tests/labels.py): each trace's findings and severities against what
its workload was built to contain, plus the counts those labels rest on, read with SQL."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import pytest

from _intervals import union_len
from labels import LABELS, SEVERITY_RANK
from recsys_doctor.diagnose.advise import advise

ROOT = Path(__file__).resolve().parent.parent


def _path(key: str, shared: Path | None) -> Path:
    if key.startswith("shared:"):
        if shared is None:
            pytest.skip("../shared/traces is not here")
        return shared / key.split(":", 1)[1]
    return ROOT / key


@pytest.fixture(scope="module")
def shared_dir():
    from conftest import SHARED_TRACES  # (../shared/traces, or $RECSYS_DOCTOR_SHARED/traces)

    return SHARED_TRACES if SHARED_TRACES.is_dir() else None


@pytest.fixture(scope="module")
def results():
    return {}


def _advise(key: str, shared: Path | None, cache: dict):
    if key not in cache:
        cache[key] = advise(_path(key, shared))
    return cache[key]


def test_the_set_has_at_least_12_traces_and_5_made_pathologies():
    assert len(LABELS) >= 12
    assert sum(k.startswith("tests/data/patho_") for k in LABELS) == 5


@pytest.mark.parametrize("key", sorted(LABELS))
def test_labels(key, shared_dir, results):
    lab = LABELS[key]
    res = _advise(key, shared_dir, results)
    found = {}
    for f in res.findings:  # one finding per id in practice; keep the worst
        if f.id not in found or SEVERITY_RANK[f.severity] > SEVERITY_RANK[found[f.id].severity]:
            found[f.id] = f
    for fid, lowest in lab["must"].items():
        assert fid in found, f"{key}: {fid} missing ({lab['why']})"
        assert SEVERITY_RANK[found[fid].severity] >= SEVERITY_RANK[lowest], (key, fid, found[fid].severity)
    for fid, highest in lab["must_not"].items():
        if highest is None:
            assert fid not in found, f"{key}: {fid} must not appear: {found[fid].title if fid in found else ''}"
        elif fid in found:
            assert SEVERITY_RANK[found[fid].severity] <= SEVERITY_RANK[highest], (key, fid, found[fid].severity)
    if lab.get("no_high"):
        assert not [f.id for f in res.findings if f.severity == "high"]
    v = res.verdict
    for fid in lab.get("top_not", ()):
        assert v.get("finding") != fid and (not res.findings or res.findings[0].id != fid), (key, fid)
    for word in lab.get("action_not", ()):
        assert word not in (v.get("first_action") or "").lower(), (key, v.get("first_action"))
    # the invariants every trace keeps: shares are shares, severities follow recoverable time
    for f in res.findings:
        if f.recoverable_share is not None:
            assert 0.0 <= f.recoverable_share <= 1.0
        for k, x in f.evidence.items():
            if isinstance(x, float) and ("share" in k or "fraction" in k):
                assert 0.0 <= x <= 1.0 + 1e-9, (key, f.id, k, x)


# --- the construction facts the labels rest on, counted with SQL -------------------------

def _db(tmp_path: Path, rel: str) -> sqlite3.Connection:
    out = tmp_path / "t.sqlite"
    with gzip.open(ROOT / rel, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return sqlite3.connect(out)


def _nvtx(db, name):
    return db.execute("SELECT count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                      "WHERE coalesce(n.text, s.value) = ?", (name,)).fetchone()[0]


def _api(db, like):
    return db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                      "WHERE s.value LIKE ?", (like,)).fetchone()[0]


def test_sync_per_query_counts(tmp_path, results):
    rel = "tests/data/patho_sync_per_query/sync_per_query.sqlite.gz"
    db = _db(tmp_path, rel)
    queries = _nvtx(db, "query")
    syncs = _api(db, "cudaDeviceSynchronize%")
    assert queries == 400 and syncs >= queries  # one per query (+ warm-up / exit)
    f = next(f for f in _advise(rel, None, results).findings if f.id == "sync-api")
    assert f.evidence["by_kind"]["device"]["calls"] == syncs
    assert f.where[0] == {"nvtx": "query", "share": pytest.approx(f.where[0]["share"])}


def test_pingpong_counts(tmp_path, results):
    rel = "tests/data/patho_pingpong/pingpong.sqlite.gz"
    db = _db(tmp_path, rel)
    kinds = [k for (k,) in db.execute("SELECT copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start")]
    switches = sum(1 for a, b in zip(kinds, kinds[1:]) if a != b)  # 1 = H2D, 2 = D2H in nsys
    assert _nvtx(db, "step") == 400 and switches >= 2 * 400 - 1
    f = next(f for f in _advise(rel, None, results).findings if f.id == "memcpy-ping-pong")
    assert f.evidence["direction_switches"] == switches


def test_threads8_counts_and_names(tmp_path, results):
    rel = "tests/data/patho_threads8_one_stream/threads8_one_stream.sqlite.gz"
    db = _db(tmp_path, rel)
    n = db.execute("""SELECT count(DISTINCT r.globalTid) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                      JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                      GROUP BY k.streamId ORDER BY 1 DESC LIMIT 1""").fetchone()[0]
    assert n >= 8  # 8 clients (+ the warm-up on the main thread)
    res = _advise(rel, None, results)
    f = next(f for f in res.findings if f.id == "stream-contention")
    worst = max(f.evidence["streams"], key=lambda s: s["concurrent_threads"])
    assert worst["concurrent_threads"] == 8
    threads = [w["thread"] for w in f.where if "thread" in w]
    assert threads and all("client-" in t for t in threads)  # OS thread names, no NVTX
    assert res.trace_info["attribution"] and "No NVTX" in res.trace_info["attribution"]
    assert all(1 <= len(x.examples) <= 3 for x in res.findings if x.severity != "note")


def test_graphs_in_use_counts(tmp_path, results):
    rel = "tests/data/patho_graphs_in_use/graphs_in_use.sqlite.gz"
    db = _db(tmp_path, rel)
    graphs = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()[0]
    assert graphs == _nvtx(db, "query")  # one replay per query
    f = next(f for f in _advise(rel, None, results).findings if f.id == "graph-candidate")
    assert f.severity == "note" and "already in use" in f.title and f.evidence["graph_executions"] == graphs


def test_large_kernels_are_long_and_back_to_back(tmp_path, results):
    rel = "tests/data/patho_large_kernels/large_kernels.sqlite.gz"
    db = _db(tmp_path, rel)
    rows = db.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end - start > 1000000 "
                      "ORDER BY start").fetchall()
    assert len(rows) >= 300  # the 300 loop matmuls (+ the one before), each over 1 ms
    gaps = [b[0] - a[1] for a, b in zip(rows, rows[1:])]
    busy = sum(e - s for s, e in rows)
    assert sum(max(g, 0) for g in gaps) < 0.01 * busy  # back to back: < 1% idle between them
    res = _advise(rel, None, results)
    assert res.verdict["finding"] is None and "no fix" in res.verdict["line"]


def test_two_threads_pageable_syncs_are_reported(shared_traces):
    """200 cudaStreamSynchronize after pageable D2H copies from two threads: reported by
    count even though each blocks the CPU little (the issue's missed finding)."""
    path = shared_traces / "h100" / "torch_matmul_2threads_h100.sqlite"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_sync = _api(db, "cudaStreamSynchronize%")
    n_pageable = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2 AND dstKind = 0"
                            ).fetchone()[0]  # D2H into pageable memory (ENUM_CUDA_MEM_KIND 0)
    assert n_sync == 200 and n_pageable == 200
    f = next(f for f in advise(path).findings if f.id == "sync-api")
    assert f.evidence["by_kind"]["stream"]["calls"] == n_sync
    assert f.evidence["pageable_d2h_copies"] == n_pageable


def test_backtraces_name_the_call_site(shared_traces):
    """An nsys export made with --cudabacktrace: places include the program's own frames
    that made the CUDA calls."""
    path = shared_traces / "nsys" / "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_bt = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE callchainId IS NOT NULL").fetchone()[0]
    # the program's own frames (its module is the binary saxpy-mpi-cuda), CUDA wrappers left out
    own = {s for (s,) in db.execute(
        "SELECT DISTINCT s.value FROM CUDA_CALLCHAINS c JOIN StringIds s ON s.id = c.symbol "
        "JOIN StringIds m ON m.id = c.module WHERE m.value LIKE '%/saxpy-mpi-cuda' AND s.value NOT LIKE '%cuda%'")}
    assert "main" in own
    res = advise(path)
    assert int(res.trace.api["callsite"].notna().sum()) == n_bt
    assert set(res.trace.api["callsite"].dropna().str.split(" \\(").str[0]) <= own
    sync = next(f for f in res.findings if f.id == "sync-api")
    assert {"callsite": "main (saxpy-mpi-cuda)", "share": 1.0} in sync.where


def test_procs2_pool_processes_share_gpu_against_sql(tmp_path, results):
    """The 2 pool workers' kernels, read with SQL (the process is globalPid's bits 24-47), each
    worker's busy time and their overlap by the tests' own interval union: the finding's numbers."""
    rel = "tests/data/procs2_pool/procs2_pool.sqlite.gz"
    db = _db(tmp_path, rel)
    by_pid: dict[int, list[tuple[int, int]]] = {}
    for pid, s, e in db.execute("SELECT (globalPid >> 24) & 16777215, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                "WHERE deviceId = 0"):
        by_pid.setdefault(pid, []).append((s, e))
    assert len(by_pid) == 2 and db.execute("SELECT count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL"
                                           ).fetchone()[0] == 1
    busy = {pid: union_len(iv) for pid, iv in by_pid.items()}
    total = sum(busy.values())
    union = union_len([x for iv in by_pid.values() for x in iv])
    f = next(f for f in _advise(rel, None, results).findings if f.id == "processes-share-gpu")
    (d,) = f.evidence["devices"]
    assert (d["device"], d["processes"], d["processes_judged"]) == (0, 2, 2)
    assert d["kernel_time_us"] == pytest.approx(total / 1000, abs=1e-3)
    assert d["busy_us"] == pytest.approx(union / 1000, abs=1e-3)
    assert d["overlap_us"] == pytest.approx((total - union) / 1000, abs=1e-3)
    assert {p["pid"]: p["busy_us"] for p in d["per_process"]} == {
        pid: pytest.approx(b / 1000, abs=1e-3) for pid, b in busy.items()}
    assert f"together for only {(total - union) / 1e6:.3f} ms of {total / 1e6:.3f} ms" in f.title
    # each worker's one launching thread: the plan keeps one group (a process's groups are its own)
    assert _advise(rel, None, results).plan["stream_groups"]["count"] == 1
