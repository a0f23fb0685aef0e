"""make_plan on hand-built serving and training traces."""

from __future__ import annotations

import json

import pytest

from recsys_doctor.diagnose.advise import advise, advise_trace
from recsys_doctor.options import Options

from _tracebuild import T, api, copy, kern, rng


def _contended(n_threads: int):
    ks, calls = [], []
    for i in range(60):
        ks.append(kern(100000 + i * 3000, 100000 + i * 3000 + 2000, corr=i + 1, name="k%d" % (i % 10)))
        calls.append(api(i * 1000, i * 1000 + 1500, i + 1, tid=10 + i % n_threads))
    return T(kernels=ks, api=calls, memcpys=[copy(0, 10, "h2d"), copy(20, 30, "d2h"), copy(40, 50, "h2d")])


def test_serving_plan_groups_per_contending_thread():
    res = advise_trace(_contended(3), Options())
    p = res.plan
    assert p["schema"] == 1 and p["kind"] == "serving"
    # the contention finding is a note here: the 3 groups come from the 3 threads launching
    # concurrently (every bin of the timeline has all three), justified by the launch findings
    sev = {f.id: f.severity for f in res.findings}
    assert sev["stream-contention"] == "note"
    assert p["stream_groups"]["count"] == 3 and "stream-contention" not in p["stream_groups"]["because"]
    assert "3 CPU threads launch concurrently" in p["stream_groups"]["reason"]
    assert p["per_stream_allocators"]["enabled"] is True
    assert p["merge_copy_compute"]["enabled"] is True  # 3 small copies, 2 direction switches
    assert p["cuda_graphs"]["enabled"] is True and "launch-bound" in p["cuda_graphs"]["because"]
    # the idle before the short kernels is the launch waits: counted once, under launch-bound
    sk = next(f for f in res.findings if f.id == "short-kernels")
    assert "launch-bound" in sk.evidence["shared_cause_with"] and sk.recoverable_ns == 0
    assert p["range_assignment"]["enabled"] is False
    json.dumps(res.to_dict())


def test_threads_of_several_processes_each_on_its_own_stream_of_one_number_do_not_share_it():
    """Pool workers: each process launches into its own legacy stream, and nsys numbers each
    process's the same (stream 7): two processes' stream 7 are two streams (two CUDA contexts),
    not one shared by 3 threads, as the stream-contention analyzer keys them too."""
    ks, calls = [], []
    for i in range(60):
        pid = 100 + i % 3
        ks.append(kern(100000 + i * 3000, 100000 + i * 3000 + 2000, corr=i + 1, pid=pid, name="k%d" % (i % 10)))
        calls.append(api(i * 1000, i * 1000 + 1500, i + 1, tid=10, pid=pid))
    res = advise_trace(T(kernels=ks, api=calls), Options())
    g = res.plan["stream_groups"]
    # one launching thread a process: a process's groups hold its own threads, so one group each
    # (not 3 groups "one per thread": the 3 are in 3 CUDA contexts, which time-slice)
    assert g["count"] == 1 and g["because"] == []
    assert g["reason"].startswith("3 CPU threads of 3 processes launch concurrently on device 0, one per "
                                  "process: ")
    assert "time-slice" in g["reason"]
    assert res.plan["per_stream_allocators"]["enabled"] is False
    # the same launches from 3 threads of one process share its one stream 7
    one = advise_trace(_contended(3), Options()).plan["stream_groups"]["reason"]
    assert one.startswith("3 CPU threads launch concurrently on device 0, into shared streams")


def test_threads_of_several_processes_get_groups_per_process_thread():
    """2 processes with 2 launching threads each, launches round-robin over the 4 threads (each
    thread every 4 us, busy 1.5 us): 4 threads launch concurrently, 2 within each process, so
    2 groups (one per thread of a process), not 4."""
    ks, calls = [], []
    for i in range(80):
        k = i % 4
        pid, tid = 100 + k // 2, 10 + k % 2
        ks.append(kern(200000 + i * 3000, 200000 + i * 3000 + 2000, corr=i + 1, pid=pid, name="k%d" % (i % 10)))
        calls.append(api(i * 1000, i * 1000 + 1500, i + 1, tid=tid, pid=pid))
    g = advise_trace(T(kernels=ks, api=calls), Options()).plan["stream_groups"]
    assert g["count"] == 2 and g["because"]
    assert g["reason"].startswith("4 CPU threads of 2 processes launch concurrently on device 0, up to 2 in "
                                  "one process: one group per thread of a process")


def test_sibling_streams_are_streams_of_one_process():
    """The same 10 kernels on streams 7 and 13, their spans overlapping: sibling branches of one
    module when one process runs both, nothing when each stream is another process's."""
    from recsys_doctor.planning._branches import sibling_streams

    def ks(pid_of):
        return [kern(i * 1000, i * 1000 + 800, corr=i + 1, pid=pid_of(s), stream=s, name="k%d" % (i // 2))
                for i, s in enumerate([7, 13] * 10)]

    one = sibling_streams(T(kernels=ks(lambda s: 1)), Options())
    assert one["streams"] == 2 and one["kernels_each"] == 10
    assert sibling_streams(T(kernels=ks(lambda s: s)), Options())["streams"] == 0


def test_group_count_is_capped():
    p = advise_trace(_contended(6), Options(max_stream_groups=4)).plan
    assert p["stream_groups"]["count"] == 4


def test_training_plan_assigns_sibling_ranges_round_robin():
    ks = [kern(i * 1000, i * 1000 + 800, corr=i + 1, grid=(4, 1, 1)) for i in range(8)]
    calls = [api(i * 1000 - 300, i * 1000 - 100, i + 1, tid=5) for i in range(8)]
    ranges = [rng(-1000, 9000, 5, "Optimizer.step#Adam.step", source="user_annotation", depth=0)]
    ranges += [rng(i * 2000 - 400, i * 2000 + 1500, 5, f"expert_{i}", depth=1) for i in range(4)]
    tr = T(kernels=ks, api=calls, ranges=ranges, devices=[{"device": 0, "name": "H100", "sm_count": 132}])
    p = advise_trace(tr, Options(max_stream_groups=2)).plan
    assert p["kind"] == "training"
    assert p["stream_groups"]["count"] == 2
    ra = p["range_assignment"]
    assert ra["enabled"] and ra["family"] == "expert_"
    assert ra["assignments"] == [{"nvtx": "expert_0", "group": 0}, {"nvtx": "expert_1", "group": 1},
                                 {"nvtx": "expert_2", "group": 0}, {"nvtx": "expert_3", "group": 1}]


def test_id_numbered_ranges_are_not_sibling_branches():
    """``aten::copy_, op_id = N`` ranges number a chain of calls, not branches: no family
    (the nsys-ai export's 1,149 dependent casts once became 4 'independent' groups)."""
    ks = [kern(i * 1000, i * 1000 + 800, corr=i + 1) for i in range(8)]
    calls = [api(i * 1000 - 300, i * 1000 - 100, i + 1, tid=5) for i in range(8)]
    ranges = [rng(-1000, 9000, 5, "Optimizer.step#Adam.step", source="user_annotation", depth=0)]
    ranges += [rng(i * 1000 - 400, i * 1000 + 900, 5, f"aten::copy_, op_id = {314298 + 7 * i}", depth=1)
               for i in range(8)]
    ranges += [rng(i * 1000 - 400, i * 1000 + 900, 5, f"layer{100 + 9 * i}", depth=1) for i in range(8)]
    p = advise_trace(T(kernels=ks, api=calls, ranges=ranges), Options()).plan
    assert p["kind"] == "training" and p["stream_groups"]["count"] == 1
    assert p["range_assignment"]["enabled"] is False


def test_graphed_trace_does_not_ask_for_graphs():
    ks = [kern(0, 1000, corr=1, in_graph=True)]
    graphs = [{"start": 0, "end": 3000, "pid": 1, "device": 0, "stream": 7, "correlation": 1, "graph_id": 1}]
    p = advise_trace(T(kernels=ks, graphs=graphs, api=[api(-10, -5, 1, 5, name="cudaGraphLaunch")]), Options()).plan
    assert p["cuda_graphs"]["enabled"] is False and p["cuda_graphs"]["already_graphed_share"] == 1.0
    assert p["stream_groups"]["count"] == 1


# --- the plans of the shared traces named in issue 23, against SQL / JSON over the files ---

def _shared(sub: str, name: str):
    from conftest import SHARED_TRACES

    p = SHARED_TRACES / sub / name
    if not p.exists():
        pytest.skip(f"{p} not present")
    return p


@pytest.mark.shared
def test_wdl_graphs_plan_keeps_one_group_per_client_thread():
    """4 client threads, each launching its CUDA graphs into its own stream: 4 groups
    (the launch-bound fix says to overlap requests on several groups)."""
    import sqlite3

    path = _shared("h100", "wdl_graphs_q4_h100.sqlite")
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT r.globalTid, g.streamId, count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE g JOIN "
        "CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId GROUP BY 1, 2").fetchall()
    con.close()
    streams_of: dict[int, set] = {}
    for tid, stream, _ in rows:
        streams_of.setdefault(tid, set()).add(stream)
    assert len(streams_of) == 4 and all(len(s) == 1 for s in streams_of.values())
    assert len(set.union(*streams_of.values())) == 4  # each thread its own stream
    res = advise(path, Options())
    g = res.plan["stream_groups"]
    assert g["count"] == 4 and "each into its own stream already" in g["reason"]
    lb = next(f for f in res.findings if f.id == "launch-bound")
    assert "several stream groups" in lb.action and g["because"] == ["launch-bound"]


@pytest.mark.shared
def test_mmoe_plan_counts_the_four_sibling_streams():
    """MMoE: 8 experts on 4 side streams, the same kernels on each, forked and joined by
    96 cudaStreamWaitEvent calls, overlapping for 0 ms: 4 groups, said so."""
    import gzip
    from collections import Counter

    path = _shared("h100", "mmoe_4streams_h100.pt.trace.json.gz")
    ev = json.load(gzip.open(path, "rt"))["traceEvents"]
    ks = [e for e in ev if e.get("cat") == "kernel"]
    per = {}
    for e in ks:
        per.setdefault(e["args"]["stream"], []).append(e)
    main = max(per, key=lambda s: len(per[s]))
    sides = [s for s in per if s != main]
    sigs = {s: Counter(e["name"] for e in per[s]) for s in sides}
    assert len(sides) == 4 and all(sigs[s] == sigs[sides[0]] for s in sides)
    waits = sum(1 for e in ev if e.get("name") == "cudaStreamWaitEvent")
    ivs = sorted((e["ts"], e["ts"] + e["dur"], e["args"]["stream"]) for s in sides for e in per[s])
    overlap = sum(max(0.0, min(a[1], b[1]) - b[0]) for a, b in zip(ivs, ivs[1:]) if a[2] != b[2])
    assert waits == 96 and overlap == 0
    g = advise(path, Options()).plan["stream_groups"]
    assert g["count"] == 4
    assert f"{len(per[sides[0]])} kernels each" in g["reason"] and "96 cudaStreamWaitEvent" in g["reason"]
    assert "never run at the same time" in g["reason"]


@pytest.mark.shared
def test_torchrec_plan_makes_no_groups_from_a_note():
    path = _shared("kineto", "pytorch__torchrec__examples__golden_training__trace__sst_long_a2a_optimizer_5_qcomm__"
                             "ip-172-31-16-248.us-east-2.compute.internal_54105.1698958768306379521.pt.trace.json")
    res = advise(path, Options())
    sev = {f.id: f.severity for f in res.findings}
    assert sev.get("stream-contention") == "note"
    g = res.plan["stream_groups"]
    assert g["count"] == 1 and "stream-contention" not in g["because"] and "take turns" in g["reason"]
