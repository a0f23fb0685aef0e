"""Plan search and --apply without a GPU: the what-if estimate on hand-built traces (every
expected number worked out by hand in the comments), candidate ranking, plan.json round
trip, the plain-script hook's activation, and the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from recsys_doctor.applying.apply import (
    before_after_rows,
    candidates,
    parse_script_result,
    plan_candidate,
    read_plan,
    runtime_plan,
    script_env,
    select_to_measure,
    write_plan,
)
from recsys_doctor.cli import main
from recsys_doctor.errors import BadInputError, WorkloadError
from recsys_doctor.model import Trace
from recsys_doctor.runtime import RuntimeConfig
from recsys_doctor.planning.whatif import Candidate, WhatIfCosts, estimate, host_busy_ns, rank, trace_stats, union_ns

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ intervals

def test_union_of_intervals_by_hand():
    # [0,10) and [5,15) merge into [0,15) = 15; [20,30) = 10; [22,25) inside it adds 0
    assert union_ns([0, 5, 20, 22], [10, 15, 30, 25]) == 25
    assert union_ns([], []) == 0
    # touching intervals: [0,5) + [5,9) = 9
    assert union_ns([5, 0], [9, 5]) == 9


def _api(rows):
    return pd.DataFrame(rows, columns=["start", "end", "pid", "tid", "correlation", "name", "api_class"])


def test_host_busy_excludes_blocking_calls_and_unions_threads():
    api = _api([
        # thread 1: launch [0,2), synchronize [2,10) (blocked), launch [10,12) -> busy [0,2) + [10,12)
        (0, 2, 1, 1, 1, "cudaLaunchKernel", "runtime"),
        (2, 10, 1, 1, 0, "cudaStreamSynchronize", "runtime"),
        (10, 12, 1, 1, 2, "cudaLaunchKernel", "runtime"),
        # thread 2: launch [5,7), a synchronous cudaMemcpy [7,8) (blocked), launch [8,9)
        #   -> busy [5,7) + [8,9)
        (5, 7, 1, 2, 3, "cudaLaunchKernel", "runtime"),
        (7, 8, 1, 2, 4, "cudaMemcpy", "runtime"),
        (8, 9, 1, 2, 5, "cudaMemcpyAsync", "runtime"),
    ])
    # union: [0,2) + [5,7) + [8,9) + [10,12) = 2 + 2 + 1 + 2 = 7
    assert host_busy_ns(api) == 7


# ------------------------------------------------------------------------------ trace stats

def _trace() -> Trace:
    """Two queries on one thread, SM count 100.

    query 1: kernel A [100,120) grid 10x1x1 block 128 -> 1280 threads; kernel B [130,170)
             grid 200 block 1024 -> 204800 threads; H2D [90,100) 1000 B; D2H [170,180) 10 B
    query 2: the same shifted by 185 (closed loop: the next query starts when the last ends).
    API (thread 7): launches [0,20) [20,40) [40,60) [60,80) then sync [80,185) per query.
    """
    k, m, a = [], [], []
    for q in (0, 185):
        k += [(100 + q, 120 + q, 1, 0, 7, 1, "A", 10, 1, 1, 128, 1, 1, False),
              (130 + q, 170 + q, 1, 0, 7, 2, "B", 200, 1, 1, 1024, 1, 1, False)]
        m += [(90 + q, 100 + q, 1, 0, 7, 3, 1000, "h2d", "pinned", "device", False),
              (170 + q, 180 + q, 1, 0, 7, 4, 10, "d2h", "device", "pinned", False)]
        a += [(0 + q, 20 + q, 1, 7, 3, "cudaMemcpyAsync", "runtime"),
              (20 + q, 40 + q, 1, 7, 1, "cudaLaunchKernel", "runtime"),
              (40 + q, 60 + q, 1, 7, 2, "cudaLaunchKernel", "runtime"),
              (60 + q, 80 + q, 1, 7, 4, "cudaMemcpyAsync", "runtime"),
              (80 + q, 185 + q, 1, 7, 0, "cudaStreamSynchronize", "runtime")]
    kernels = pd.DataFrame(k, columns=["start", "end", "pid", "device", "stream", "correlation", "name",
                                       "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "in_graph"])
    memcpys = pd.DataFrame(m, columns=["start", "end", "pid", "device", "stream", "correlation", "bytes", "kind",
                                       "src_mem", "dst_mem", "in_graph"])
    devices = pd.DataFrame([(0, "test GPU", 100)], columns=["device", "name", "sm_count"])
    return Trace(path="hand.sqlite", format="nsys-sqlite", kernels=kernels, memcpys=memcpys, api=_api(a),
                 devices=devices)


def test_trace_stats_by_hand():
    st = trace_stats(_trace(), kind="serve", p99_over_p50=1.5)
    assert st.units == 2 and st.unit_source == "device-to-host copies"  # two D2H copies
    assert st.kernel_ns_per_unit == 60  # (20 + 40) per query
    assert st.copy_ns_per_unit == 20  # 10 + 10
    assert st.kernels_per_unit == 2 and st.copies_per_unit == 2 and st.ops_per_unit == 4
    assert st.bytes_per_unit == 1010
    # host busy: [0,80) and [185,265) (the syncs are blocked time) = 160 over 2 queries
    assert st.host_ns_per_unit == 80
    assert st.host_ns_per_op == 20
    # GPU share: A = 1280 / (100 * 2048) = 0.00625 for 20 ns; B = 204800 / 204800 = 1 for 40 ns
    # time-weighted: (0.00625 * 20 + 1 * 40) / 60
    assert st.mean_sm_share == pytest.approx((0.00625 * 20 + 40) / 60)
    # small grid: A (10 blocks < 100 SMs) is 20 of 60 ns
    assert st.small_grid_share == pytest.approx(20 / 60)
    # wall: first API call 0 .. last sync end 370; GPU busy per query [90,120) + [130,180) = 80
    assert st.wall_ns == 370 and st.gpu_busy_ns == 160
    assert st.threads == 1 and st.sm_count == 100


def test_trace_stats_counts_units_from_ranges_or_as_given():
    t = _trace()
    t.ranges = pd.DataFrame([(0, 185, 1, 7, "query", "nvtx", 0), (185, 370, 1, 7, "query", "nvtx", 0),
                             (0, 2000, 1, 7, "measure", "nvtx", 0)],
                            columns=["start", "end", "pid", "tid", "name", "source", "depth"])
    assert trace_stats(t, unit_range="query").unit_source == "query ranges"
    st = trace_stats(t, units=4)
    assert st.units == 4 and st.kernel_ns_per_unit == 30


def test_trace_stats_refuses_empty_trace():
    with pytest.raises(BadInputError, match="no kernels"):
        trace_stats(Trace(path="x", format="nsys-sqlite"))
    # CUDA calls from 3 processes, no activity (a terminated pool's workers): the reason says so
    api = pd.DataFrame({"start": [0, 5, 9], "end": [1, 6, 10], "pid": [1, 2, 3], "tid": [1, 2, 3],
                        "correlation": [1, 2, 3], "name": ["cuInit"] * 3, "api_class": ["driver"] * 3})
    with pytest.raises(BadInputError) as e:
        trace_stats(Trace(path="x", format="nsys-sqlite", api=api))
    assert str(e.value).startswith("the trace has no kernels or copies: nothing to estimate from (3 CUDA API calls")
    assert "come from 3 processes" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------ estimate

def test_estimate_eager_baseline_by_hand():
    st = trace_stats(_trace(), p99_over_p50=1.5)
    p = estimate(st, Candidate(1, True, True, False), clients=1)
    # host 80 ns, GPU 80 ns (60 kernels + 20 copies), overlap 1:
    # limits: host 1e9/80 = 12.5e6; gpu 1e9/80 = 12.5e6; clients 1e9 * 1 / 160 = 6.25e6
    assert p.bound == "clients" and p.qps == pytest.approx(6.25e6)
    assert p.p50_ms == pytest.approx(1 / 6.25e6 * 1e3)
    assert p.p99_ms == pytest.approx(p.p50_ms * 1.5)


def test_estimate_graphs_by_hand():
    st = trace_stats(_trace())
    costs = WhatIfCosts(graph_host_ns=None, graph_host_ops=3, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101,
                        max_overlap=None, serial_share=None)
    p = estimate(st, Candidate(2, True, True, True), clients=4, costs=costs)
    # host: 3 ops * 20 ns = 60
    # gpu: kernels 60 + 2 kernels * 5 + packed copies (2 directions * 4 + 1010 / 101 = 18) = 88
    # overlap: 1 / share = 60 / (0.125 + 40) = 1.4953..., below groups 2 and clients 4
    ov = 60 / (0.00625 * 20 + 40)
    assert p.host_ns == pytest.approx(60) and p.gpu_ns == pytest.approx(88)
    assert p.overlap == pytest.approx(ov)
    # limits: host 1e9/60 = 16.67e6; gpu 1e9*1.4953/88 = 16.99e6; clients 4e9/148 = 27.0e6
    assert p.bound == "host" and p.qps == pytest.approx(1e9 / 60)
    assert p.p50_ms == pytest.approx(4 / (1e9 / 60) * 1e3)
    # split copy streams add 4 host ops: 60 + 4 * 20 = 140
    q = estimate(st, Candidate(2, False, True, True), clients=4, costs=costs)
    assert q.host_ns == pytest.approx(140) and q.qps == pytest.approx(1e9 / 140)


def test_estimate_tells_group_counts_apart_with_a_fixed_runtime_host_cost():
    st = trace_stats(_trace())
    # GPU 88 ns per query as in test_estimate_graphs_by_hand; the runtime's own host cost 10 ns;
    # one kernel fills 1/160 of the GPU (cap 160), max_overlap 3 caps it instead
    costs = WhatIfCosts(graph_host_ns=10, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101,
                        max_overlap=3, serial_share=None)
    st.mean_sm_share = 1 / 160
    got = {g: estimate(st, Candidate(g), clients=8, costs=costs) for g in (1, 2, 4, 8)}
    # g1: gpu 1e9/88; g2: 2e9/88; g4 and g8: 3e9/88 (max_overlap), below host 1e9/10 = 1e8 and
    # clients 8e9/98
    assert got[1].bound == "gpu" and got[1].qps == pytest.approx(1e9 / 88)
    assert got[2].qps == pytest.approx(2e9 / 88)
    assert got[4].qps == pytest.approx(3e9 / 88) and got[8].qps == pytest.approx(3e9 / 88)
    assert got[1].host_ns == 10
    # a host cost of 25 us: g1 GPU-bound at 1e9/60028, g4 host-bound at 4e4 (GPU would allow 3e9/60028)
    slow = WhatIfCosts(graph_host_ns=25_000, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101,
                       max_overlap=3, serial_share=None)
    st2 = trace_stats(_trace())
    st2.mean_sm_share = 1 / 160
    st2.kernel_ns_per_unit = 60_000  # GPU 60 us + 10 + 18 per query
    p1 = estimate(st2, Candidate(1), clients=8, costs=slow)
    p4 = estimate(st2, Candidate(4), clients=8, costs=slow)
    assert p1.bound == "gpu" and p1.qps == pytest.approx(1e9 / 60_028)
    assert p4.bound == "host" and p4.qps == pytest.approx(1e9 / 25_000)


def test_graphed_serving_overlap_follows_the_serial_share_by_hand():
    st = trace_stats(_trace())
    # GPU 88 ns per query as in test_estimate_graphs_by_hand, host 10 ns; serial share 1/3:
    # n queries in flight overlap n / (1 + (n - 1) / 3): 1, 1.5, 2, 2.4 for n = 1, 2, 4, 8.
    # The SM share (1/160 here) and max_overlap (1.2) no longer cap graphed serving.
    costs = WhatIfCosts(graph_host_ns=10, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101,
                        max_overlap=1.2, serial_share=1 / 3)
    st.mean_sm_share = 1 / 160
    got = {g: estimate(st, Candidate(g), clients=8, costs=costs) for g in (1, 2, 4, 8)}
    for g, ov in [(1, 1.0), (2, 1.5), (4, 2.0), (8, 2.4)]:
        assert got[g].overlap == pytest.approx(ov)
        assert got[g].bound == "gpu" and got[g].qps == pytest.approx(ov * 1e9 / 88)
    # 16 groups with 8 clients: 8 in flight, the same as 8 groups
    assert estimate(st, Candidate(16), clients=8, costs=costs).overlap == pytest.approx(2.4)
    # eager candidates keep the SM-share / max_overlap rule: min(2, 160, 1.2)
    assert estimate(st, Candidate(2, cuda_graphs=False), clients=8, costs=costs).overlap == pytest.approx(1.2)


def test_a_script_keeps_its_own_copies_on_the_host_by_hand():
    st = trace_stats(_trace())
    # per query: 2 copies (H2D, D2H), host time per operation h = 80 / 4 = 20 ns. The
    # runtime's graphed query costs graph_host_ns = 100 on the host; a plain script under
    # the hook keeps its own 2 copies: 100 + 2 * 20 = 140 ns, host-bound at 1e9/140 for any
    # group count (the GPU's 88 ns per query, overlapped or not, allows more)
    costs = WhatIfCosts(graph_host_ns=100, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101,
                        script_copy_host_ns=None, script_copy_node_ns=None)
    assert st.copies_per_unit == pytest.approx(2) and st.host_ns_per_op == pytest.approx(20)
    for g in (1, 2, 8):
        p = estimate(st, Candidate(g), clients=8, costs=costs, script=True)
        assert p.host_ns == pytest.approx(140) and p.bound == "host" and p.qps == pytest.approx(1e9 / 140)
    assert estimate(st, Candidate(2), clients=8, costs=costs).host_ns == pytest.approx(100)
    # eager candidates are the script as it is: the same with or without script=True
    e = Candidate(2, cuda_graphs=False)
    assert estimate(st, e, clients=8, costs=costs, script=True).qps == estimate(st, e, clients=8, costs=costs).qps
    ranked = rank(st, [Candidate(8), Candidate(2), Candidate(4)], clients=8, costs=costs, script=True)
    assert [p.candidate.groups for p in ranked] == [2, 4, 8]  # a tie: fewer groups first


def test_a_scripts_batching_is_measured_not_priced():
    """The hook's batching has no measured host cost per call to price it with: its estimate
    says so (no q/s), it ranks after every priced plan, and the selection measures the batched
    twin of the best estimate all the same."""
    from recsys_doctor.applying.report import _pred_numbers
    from recsys_doctor.planning._batching import UNPRICED

    st = trace_stats(_trace())
    costs = WhatIfCosts(graph_host_ns=100, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101)
    b2 = Candidate(2, True, False, True, batching=True)
    p = estimate(st, b2, clients=8, costs=costs, script=True)
    assert p.bound == UNPRICED and p.qps is None and p.p99_ms is None and p.score == 0.0
    assert p.notes and p.notes[0].startswith("not priced")
    nums = _pred_numbers(p)
    assert nums["qps"] is None and nums["host_us"] is None and nums["bound"] == UNPRICED
    cands = candidates("script", clients=8)
    ranked = rank(st, cands, clients=8, costs=costs, script=True)
    # batched at 1, 2 and 4 groups (8 groups of 8 clients: one each, nothing to combine), last
    assert all(q.candidate.batching for q in ranked[-3:]) and not any(q.candidate.batching for q in ranked[:-3])
    picked = select_to_measure(ranked, 2, allocator_twin=False)
    assert [q.candidate.batching for q in picked] == [False, False, True]
    assert picked[2].candidate.groups == picked[0].candidate.groups  # the batched twin of the best
    # serving's batching stays priced
    assert estimate(st, Candidate(2, batching=True), clients=8, costs=costs).qps > 0


def test_a_script_whose_copies_the_thread_graphs_take_over_by_hand():
    st = trace_stats(_trace())
    # per query: 2 copies, kernels 60 ns, 2 kernels. Host: the runtime's 100 + 2 copies x 7 =
    # 114. GPU: kernels 60 + 2 x 5 gap + 2 memcpy nodes x 30 (instead of the packed 18) = 130.
    # Serial share 1/3: overlap 1, 1.5, 2, 2.4 for 1, 2, 4, 8 groups. Limits: host 1e9/114 =
    # 8.77e6; GPU 1e9 x overlap / 130 = 7.69e6, 11.5e6, ...: g1 GPU-bound, 2+ host-bound
    costs = WhatIfCosts(graph_host_ns=100, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101,
                        serial_share=1 / 3, script_copy_host_ns=7, script_copy_node_ns=30)
    got = {g: estimate(st, Candidate(g), clients=8, costs=costs, script=True) for g in (1, 2, 4, 8)}
    for g in (1, 2, 4, 8):
        assert got[g].host_ns == pytest.approx(114) and got[g].gpu_ns == pytest.approx(130)
    assert got[1].bound == "gpu" and got[1].qps == pytest.approx(1e9 / 130)
    for g in (2, 4, 8):
        assert got[g].bound == "host" and got[g].qps == pytest.approx(1e9 / 114)
    # the same candidates as a workload: no script copies on the host, packed copies on the GPU
    w = estimate(st, Candidate(1), clients=8, costs=costs)
    assert w.host_ns == pytest.approx(100) and w.gpu_ns == pytest.approx(88)


def test_estimate_training_by_hand():
    st = trace_stats(_trace(), kind="train")
    costs = WhatIfCosts(graph_host_ns=None, graph_host_ops=1, graph_node_gap_ns=0, copy_fixed_ns=0, copy_bytes_per_ns=1010,
                        max_overlap=None)
    eager = estimate(st, Candidate(1, True, True, False), costs=costs)
    # eager: max(host 80, GPU 80) = 80 ns
    assert eager.step_ms == pytest.approx(80 / 1e6)
    g = estimate(st, Candidate(8, True, True, True), costs=costs)
    # graphs: host 1 * 20 = 20; GPU 60 + 0 + (2 * 0 + 1010/1010 = 1) = 61; overlap min(8, 8, 1.4953)
    # the small-grid third runs overlapped: 61 * 2/3 + 61 * 1/3 / 1.4953
    ov = 60 / (0.00625 * 20 + 40)
    assert g.step_ms == pytest.approx((61 * (1 - 1 / 3) + 61 * (1 / 3) / ov) / 1e6)
    assert g.bound == "gpu"


def test_estimate_rejects_no_clients():
    with pytest.raises(BadInputError):
        estimate(trace_stats(_trace()), Candidate(1), clients=0)


# ------------------------------------------------------------------------------ ranking

def test_candidates_cover_the_grid():
    c = candidates("serve")
    assert len(c) == 4 * 2 * 2 * 2 + 4 == len(set(c))
    assert {x.groups for x in c} == {1, 2, 4, 8}
    # batching at each group count, merged, own pools, graphs
    assert sorted(x.groups for x in c if x.batching) == [1, 2, 4, 8]
    assert all(x.merge_streams and x.per_stream_allocator and x.cuda_graphs for x in c if x.batching)
    assert len(candidates("train")) == 8 and len(candidates("script")) == 8 + 4
    # scripts: every group count, graphed or not (any number of client threads per group)
    assert sorted((c.groups, c.cuda_graphs) for c in candidates("script") if not c.batching) == [
        (g, gr) for g in (1, 2, 4, 8) for gr in (False, True)]
    # and the hook's batching (graphed) where a group has more than one client thread to combine
    assert [(c.groups, c.cuda_graphs) for c in candidates("script") if c.batching] == [(g, True) for g in (1, 2, 4, 8)]
    assert [c.groups for c in candidates("script", clients=4) if c.batching] == [1, 2]
    assert not [c for c in candidates("script", clients=1) if c.batching]  # a training loop: one thread
    # one thread calls the model: one group, with and without graphs (the others would stay idle)
    assert [(c.groups, c.cuda_graphs) for c in candidates("script", clients=1)] == [(1, True), (1, False)]
    assert {c.groups for c in candidates("script", clients=2)} == {1, 2, 4, 8}
    with pytest.raises(BadInputError):
        candidates("nope")


def test_rank_prefers_graphs_when_host_bound_and_breaks_ties_with_the_plan():
    st = trace_stats(_trace())
    costs = WhatIfCosts(graph_host_ns=None, graph_host_ops=3, graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101,
                        max_overlap=None)
    r = rank(st, candidates("serve"), clients=8, prefer=Candidate(4, True, True, True), costs=costs)
    # as in test_estimate_graphs_by_hand: merged graphs on >= 2 groups are host-bound at
    # 1e9/60 q/s, eager ones at 1e9/80, one graphed group is GPU-bound at 1e9/88: the
    # advisor's g4 wins the tie among g2/g4/g8, then fewer groups first
    assert [p.candidate for p in r[:3]] == [Candidate(4), Candidate(2), Candidate(2, True, False, True)]
    assert r[0].qps == pytest.approx(1e9 / 60)
    g1 = next(p for p in r if p.candidate == Candidate(1))
    assert g1.bound == "gpu" and g1.qps == pytest.approx(1e9 / 88)
    worst_graph = min(p.score for p in r if p.candidate.cuda_graphs and p.candidate.merge_streams
                      and p.candidate.groups > 1 and not p.candidate.batching)
    assert all(p.score < worst_graph for p in r if not p.candidate.cuda_graphs)
    picked = select_to_measure(r, 3, Candidate(4, True, True, True))
    keys = [(p.candidate.groups, p.candidate.merge_streams, p.candidate.cuda_graphs) for p in picked[:3]]
    assert len(set(keys)) == 3  # allocator twins are not among the top k twice
    # ... but the best one is measured with both allocators: g4 own pools, then g4 shared pool
    assert len(picked) == 5 and picked[0].candidate == Candidate(4, True, True, True)
    assert picked[3].candidate == Candidate(4, True, False, True)
    # ... and the best batching candidate, which the estimate ranks low here, is measured too
    best_batched = next(p for p in r if p.candidate.batching)
    assert picked[4] is best_batched
    assert len(select_to_measure(r, 3, Candidate(4, True, True, True), allocator_twin=False)) == 4
    # the advisor's plan is added when it is not among the top k (then the best batching one)
    eager_plan = Candidate(1, True, True, False)
    picked = select_to_measure(r, 2, eager_plan)
    assert len(picked) == 5 and picked[-2].candidate == eager_plan and picked[-1].candidate.batching


def test_estimate_batching_by_hand():
    """A batching candidate: mean batch k = 0.5 x 8 clients = 4, one batch's GPU time =
    one graphed query's x (1 + 3 x 0.1), 2 groups busy (8 clients / 4), overlap 2 / (1 + 1/3)."""
    st = trace_stats(_trace())
    costs = WhatIfCosts(graph_node_gap_ns=5, copy_fixed_ns=4, copy_bytes_per_ns=101, batch_host_ns=1_000,
                        batch_marginal_share=0.1, batch_fill=0.5, serial_share=1 / 3)
    one = st.kernel_ns_per_unit + st.kernels_per_unit * 5 + min(2, st.copies_per_unit) * 4 + st.bytes_per_unit / 101
    batch = one * 1.3
    x = min(1e9 / 1_000, 1e9 * 1.5 * 4 / batch, 1e9 * 8 / (1_000 + batch))
    p = estimate(st, Candidate(4, batching=True, max_batch=16), clients=8, costs=costs)
    assert p.qps == pytest.approx(x) and p.overlap == pytest.approx(1.5)
    assert p.gpu_ns == pytest.approx(batch / 4) and p.p50_ms == pytest.approx(8 / x * 1e3)
    assert "mean batch 4 of 8 clients" in p.notes[0]
    # max_batch caps the batch: 64 clients, max 16
    p64 = estimate(st, Candidate(8, batching=True, max_batch=16), clients=64, costs=costs)
    assert "mean batch 16 of 64" in p64.notes[0]
    # the label and the plan carry it
    c = Candidate(4, batching=True, max_batch=16)
    assert c.label == "g4 merged own-pool graphs batched<=16"
    assert Candidate.from_plan(c.to_plan()) == c and c.to_runtime()["batching"] is True


# ------------------------------------------------------------------------------ plan.json

ADVISED = {"schema": 1, "kind": "serving", "stream_groups": {"count": 4, "because": [], "reason": "x"},
           "merge_copy_compute": {"enabled": True, "because": [], "reason": "x"},
           "per_stream_allocators": {"enabled": True, "because": [], "reason": "x"},
           "cuda_graphs": {"enabled": True, "because": [], "reason": "x"}, "findings": []}


def test_plan_round_trip(tmp_path):
    chosen = Candidate(8, False, False, True)
    p = write_plan(tmp_path / "sub" / "plan.json", ADVISED, chosen, clients=12,
                   predicted={"qps": 1.0}, measured={"qps": 2.0})
    doc = read_plan(p)
    assert plan_candidate(doc) == chosen  # the runtime object wins over the advisor's plan
    cfg = RuntimeConfig.from_plan(doc)
    assert (cfg.groups, cfg.merge_streams, cfg.per_stream_allocator, cfg.cuda_graphs) == (8, False, False, True)
    assert cfg.slots_per_group == 2  # ceil(12 / 8) = 2
    assert runtime_plan(Candidate(1), 8)["slots_per_group"] == 8
    assert doc["apply"]["measured"] == {"qps": 2.0} and doc["stream_groups"]["count"] == 4
    assert plan_candidate(ADVISED) == Candidate(4, True, True, True)


def test_read_plan_errors(tmp_path):
    with pytest.raises(BadInputError, match="no such plan"):
        read_plan(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(BadInputError, match="not JSON"):
        read_plan(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(BadInputError, match="not a recsys-doctor plan"):
        read_plan(other)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"runtime": {"groups": "many"}}))
    with pytest.raises(BadInputError, match="groups"):
        read_plan(wrong)
    adv = tmp_path / "advise.json"
    adv.write_text(json.dumps({"schema": 1, "findings": [], "plan": ADVISED}))
    assert read_plan(adv)["stream_groups"]["count"] == 4


def test_parse_script_result_takes_the_last_json_line():
    out = 'hello\n{"qps": 1}\nnoise\n{"qps": 12.5, "p99_ms": 3}\n\n'
    assert parse_script_result(out) == {"qps": 12.5, "p99_ms": 3}
    with pytest.raises(WorkloadError, match="no measurement"):
        parse_script_result('{"other": 1}\nplain text')


def test_before_after_rows():
    rows = before_after_rows({"qps": 100.0, "p99_ms": 20.0}, {"qps": 1500.0, "p99_ms": 2.0})
    by = {r["key"]: r for r in rows}
    assert by["qps"]["ratio"] == 15.0 and by["p99_ms"]["ratio"] == 0.1
    assert "step_ms" not in by


# ------------------------------------------------------------------------------ the script hook

_PROBE = ("import sys, threading; m = sys.modules.get('_recsys_doctor_autoapply'); "
          "t = threading.Thread(target=lambda: None); t.start(); t.join(); "
          "print(m is not None and m.stats()['active'], m.stats()['groups'] if m else None)")


def test_script_env_activates_the_hook_at_interpreter_start(tmp_path):
    p = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2, True, True, False))
    env = script_env(p, hook_dir=tmp_path / "hook")
    assert (tmp_path / "hook" / "sitecustomize.py").is_file()
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "2"]
    # without the variable the same interpreter runs untouched
    env.pop("RECSYS_DOCTOR_PLAN")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "None"]


def test_hook_with_a_broken_plan_leaves_the_script_running(tmp_path):
    p = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2))
    env = script_env(p, hook_dir=tmp_path / "hook")
    Path(env["RECSYS_DOCTOR_PLAN"]).write_text('{"runtime": {"groups": 0}}')
    out = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ran"
    assert "not applied" in out.stderr and "groups" in out.stderr


# ------------------------------------------------------------------------------ treatments

TRAIN_WORKLOAD = """
from recsys_doctor.capture.workload import Workload

def workload():
    state = {"loss": 8.0}

    def step(k):
        state["loss"] /= 2
        return state["loss"]

    return Workload(model=None, inputs=lambda k: (k,), kind="train", steps=3, warmup=1, run=step)
"""


def test_applied_child_runs_the_workload_with_the_settings(tmp_path):
    """The "after" child of a workload is the train runner's: same arguments as the capture
    child plus --apply; it measures the workload changed and writes what the runtime said."""
    from recsys_doctor.capture import child_argv
    from recsys_doctor.applying.train_runner import main as runner_main, runtime_treatment

    runtime = {"groups": 1, "cuda_graphs": False}
    t = runtime_treatment(runtime)
    argv = child_argv(Path("wl.py"), Path("m.json"), ["x"], threads=None, duration_s=None, steps=2, profiled="nsys",
                      treatment=t)
    assert argv == [sys.executable, "-m", "recsys_doctor.applying.train_runner", "wl.py", "--result", "m.json",
                    "--apply", json.dumps(runtime), "--steps", "2", "--profiled", "nsys", "--", "x"]
    wl = tmp_path / "wl.py"
    wl.write_text(TRAIN_WORKLOAD)
    out = tmp_path / "m.json"
    assert runner_main([str(wl), "--result", str(out), "--apply", json.dumps(runtime)]) == 0
    m = json.loads(out.read_text())
    # warm-up 1 step (8 -> 4), then 3 measured steps: 2, 1, 0.5
    assert m["calls"] == 3 and m["losses"] == [2.0, 1.0, 0.5]
    info = json.loads(Path(str(out) + ".apply.json").read_text())
    assert info["runtime"]["groups"] == 1 and info["runtime"]["cuda_graphs"] is False


def test_the_after_profiles_child_measures_no_bucket_costs(tmp_path, monkeypatch):
    """Bucket costs are read from the measured candidates only (``write_bucket_costs``): the
    after-profile's treatment tells its child not to measure them (each bucket replayed alone
    after the measured window), through ``"bucket_costs": false`` in its ``--apply`` JSON; a
    candidate's does not. The workload's own arguments are untouched. (That a serving run so
    told skips ``served.bucket_gpu_us()`` needs the GPU:
    ``test_a_batching_candidate_reports_its_bucket_costs``.)"""
    from recsys_doctor.applying import train_runner
    from recsys_doctor.capture import child_argv

    runtime = {"groups": 1, "cuda_graphs": False}
    kw = dict(threads=None, duration_s=None, steps=2, profiled=None)
    after = child_argv(Path("wl.py"), Path("m.json"), ["x"],
                       treatment=train_runner.runtime_treatment(runtime, bucket_costs=False), **kw)
    assert after == [sys.executable, "-m", "recsys_doctor.applying.train_runner", "wl.py", "--result", "m.json",
                     "--apply", json.dumps({**runtime, "bucket_costs": False}), "--steps", "2", "--", "x"]
    cand = child_argv(Path("wl.py"), Path("m.json"), ["x"], treatment=train_runner.runtime_treatment(runtime), **kw)
    assert cand[cand.index("--apply") + 1] == json.dumps(runtime)
    seen = []
    real = train_runner.make_runner
    monkeypatch.setattr(train_runner, "make_runner",
                        lambda wl, rt, bucket_costs=True: seen.append((dict(rt), bucket_costs)) or real(wl, rt))
    wl = tmp_path / "wl.py"
    wl.write_text(TRAIN_WORKLOAD)
    out = tmp_path / "m.json"
    for payload in ({**runtime, "bucket_costs": False}, runtime):
        assert train_runner.main([str(wl), "--result", str(out), "--apply", json.dumps(payload)]) == 0
        assert json.loads(out.read_text())["losses"] == [2.0, 1.0, 0.5]
    # the key is the child's, not the runtime's: make_runner gets the runtime dict without it
    assert seen == [(runtime, False), (runtime, True)]
    assert train_runner.main([str(wl), "--result", str(out), "--apply", json.dumps({**runtime, "bucket_costs": 1})]) == 2


def test_applied_child_errors_are_one_line(tmp_path, capsys):
    from recsys_doctor.applying.train_runner import main as runner_main

    wl = tmp_path / "wl.py"
    wl.write_text(TRAIN_WORKLOAD)
    assert runner_main([str(wl), "--result", str(tmp_path / "m.json"), "--apply", "{groups: 2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recsys-doctor: error: --apply: not JSON")


def test_a_treatment_must_fit_the_target(tmp_path):
    from recsys_doctor.capture import profile
    from recsys_doctor.applying.script_hook import script_treatment
    from recsys_doctor.applying.train_runner import runtime_treatment

    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    wl = tmp_path / "wl.py"
    wl.write_text(TRAIN_WORKLOAD)
    with pytest.raises(BadInputError, match="runtime settings apply to a workload module"):
        profile(script, treatment=runtime_treatment({"groups": 2}), out_dir=tmp_path / "o")
    plan = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2))
    with pytest.raises(BadInputError, match="a plan file applies to a plain script"):
        profile(wl, treatment=script_treatment(plan), out_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()  # refused before anything ran


# ------------------------------------------------------------------------------ CLI

def test_cli_apply_errors(tmp_path):
    r = CliRunner()
    res = r.invoke(main, ["apply", str(tmp_path / "none.json"), "--", "python", "x.py"])
    assert res.exit_code == 2 and "no such plan file" in res.output
    p = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2))
    res = r.invoke(main, ["apply", str(p)])
    assert res.exit_code == 2 and "give the command" in res.output
    res = r.invoke(main, ["apply", str(p), "--", "/no/such/program-xyz"])
    assert res.exit_code == 2 and "no such program" in res.output
    res = r.invoke(main, ["apply", "--json", str(p), "--", sys.executable, "-c", "print(1)"])
    assert res.exit_code == 2 and "--json goes with --compare" in res.output


def test_cli_apply_runs_the_command_and_compares(tmp_path):
    p = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2, True, True, False))
    script = tmp_path / "s.py"
    # prints a larger number when the hook is active, so before and after differ
    script.write_text("import sys, json\nm = sys.modules.get('_recsys_doctor_autoapply')\n"
                      "print(json.dumps({'qps': 30.0 if m and m.stats()['active'] else 10.0, 'p99_ms': 4.0}))\n")
    res = CliRunner().invoke(main, ["apply", "--compare", "--json", str(p), "--", sys.executable, str(script)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)  # stderr may say the plan is not active on this machine
    assert d["before"]["qps"] == 10.0 and d["after"]["qps"] == 30.0
    assert {r["key"]: r["ratio"] for r in d["table"]}["qps"] == 3.0
    fail = tmp_path / "f.py"
    fail.write_text("import sys; sys.exit(3)\n")
    res = CliRunner().invoke(main, ["apply", str(p), "--", sys.executable, str(fail)])
    assert res.exit_code == 3


def test_cli_profile_apply_options_need_apply(tmp_path):
    script = tmp_path / "m.py"
    script.write_text("print(1)\n")
    res = CliRunner().invoke(main, ["profile", str(script), "--top-k", "2"])
    assert res.exit_code == 2 and "--top-k" in res.output
    # the default value written out is still an option that would do nothing
    for extra in (["--top-k", "3"], ["--history"], ["--db", str(tmp_path / "h.db")]):
        res = CliRunner().invoke(main, ["profile", str(script), *extra])
        assert res.exit_code == 2 and "go with --apply" in res.output, extra


def test_cli_apply_says_the_plan_is_not_active_without_cuda(tmp_path):
    """On a machine without PyTorch+CUDA (CI) the command still runs, and stderr says the
    plan did nothing."""
    import importlib.util

    try:
        import torch
        has_cuda = bool(torch.cuda.is_available())
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("CUDA is available: the plan is active here")
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"stream_groups": {"count": 2}, "cuda_graphs": {"enabled": False}}))
    res = CliRunner().invoke(main, ["apply", str(p), "--", sys.executable, "-c", "print('ran')"])
    assert res.exit_code == 0
    want = "PyTorch is not installed" if importlib.util.find_spec("torch") is None else "no CUDA device"
    assert "the plan is not active here" in res.stderr and want in res.stderr


def test_a_kept_batching_plan_whose_calls_ran_unbatched_says_so():
    """The hook stats of two-tower's kept plan on the H100 (bench/apply/results/suite_h100_2026-11-26c):
    a batching plan whose model inputs the hook refused; its label says batched, so a note must."""
    from recsys_doctor.applying.report import batching_refused as _batching_refused

    refused = {"batching": True, "max_batch": 32, "batches": 0, "batched_calls": 0,
               "fallbacks": ["not batched: no floating-point input tells the rows of a query; declare batch_spec"]}
    note = _batching_refused(Candidate(1, True, False, True, batching=True), refused)
    assert note is not None and "no floating-point input tells the rows" in note and "ran unbatched" in note
    quiet = _batching_refused(Candidate(1, batching=True), {"batched_calls": 0})  # refused without a reason said
    assert quiet is not None and "no call was batched" in quiet
    # batched calls, a plan without batching, or no stats: nothing to say
    assert _batching_refused(Candidate(1, batching=True), {**refused, "batches": 5, "batched_calls": 40}) is None
    assert _batching_refused(Candidate(1), refused) is None
    assert _batching_refused(Candidate(1, batching=True), None) is None
    # the copies a refused batching plan left to PyTorch (cascade_serve.py's kept plan on the H200,
    # bench/apply/results/silent_h200/3_cascade/cascade_apply.json): 0 of 3,000 + 3,000 + 3,000 taken over
    sites = [{"kind": "model", "site": "c.py:91", "taken_over": 2999, "fallback": 4},
             {"kind": "h2d", "site": "c.py:89", "taken_over": 0, "fallback": 3000},
             {"kind": "h2d", "site": "c.py:92", "taken_over": 4, "fallback": 2996}]
    note = _batching_refused(Candidate(1, batching=True), {**refused, "sites": sites})
    assert note.endswith("each on its group's graphs; 4 of 6000 input copies taken over")
    sites[2]["taken_over"], sites[2]["fallback"] = 0, 3000
    note = _batching_refused(Candidate(1, batching=True), {**refused, "sites": sites})
    assert note.endswith("its input copies stayed PyTorch's (a batching plan learns no thread graphs)")



def test_a_scripts_graphed_estimates_are_labelled_upper_bounds():
    """Every graphed, unbatched candidate of a plain script carries the upper-bound note
    (dcn_frame_serve.py on the H100: 13,510 q/s estimated for its graphed plans, 295-376
    measured); eager and batched ones (priced otherwise, or not at all) do not."""
    from recsys_doctor.applying.apply import SCRIPT_BOUND, _label_script_bounds
    from recsys_doctor.planning.whatif import Prediction

    preds = [Prediction(Candidate(g, True, False, graphs, batching=b), 1.0, 1.0, 1.0, "host", qps=1.0,
                        notes=["shared pool"])
             for g in (1, 4) for graphs in (True, False) for b in (False, True)]
    _label_script_bounds(preds)
    assert [SCRIPT_BOUND in p.notes for p in preds] == [True, False, False, False] * 2
    assert all(p.notes[0] == "shared pool" for p in preds)  # the estimate's own notes stay first
