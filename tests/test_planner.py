"""make_plan on hand-built serving and training traces."""

from __future__ import annotations

import json

from recsys_doctor.advise import advise_trace
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
    assert p["stream_groups"]["count"] == 3 and p["stream_groups"]["because"] == ["stream-contention"]
    assert p["per_stream_allocators"]["enabled"] is True
    assert p["merge_copy_compute"]["enabled"] is True  # 3 small copies, 2 direction switches
    assert p["cuda_graphs"]["enabled"] is True and "launch-bound" in p["cuda_graphs"]["because"]
    # the idle before the short kernels is the launch waits: counted once, under launch-bound
    sk = next(f for f in res.findings if f.id == "short-kernels")
    assert "launch-bound" in sk.evidence["shared_cause_with"] and sk.recoverable_ns == 0
    assert p["range_assignment"]["enabled"] is False
    json.dumps(res.to_dict())


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


def test_graphed_trace_does_not_ask_for_graphs():
    ks = [kern(0, 1000, corr=1, in_graph=True)]
    graphs = [{"start": 0, "end": 3000, "pid": 1, "device": 0, "stream": 7, "correlation": 1, "graph_id": 1}]
    p = advise_trace(T(kernels=ks, graphs=graphs, api=[api(-10, -5, 1, 5, name="cudaGraphLaunch")]), Options()).plan
    assert p["cuda_graphs"]["enabled"] is False and p["cuda_graphs"]["already_graphed_share"] == 1.0
    assert p["stream_groups"]["count"] == 1
