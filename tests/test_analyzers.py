"""Every analyzer on tiny hand-built traces; expected numbers are worked out by hand."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from recsys_doctor.analyzers import ANALYZERS, run_all
from recsys_doctor.analyzers import (graph_candidate, launch_bound, memcpy_ping_pong, no_gpu_activity, process_sharing,
                                     short_kernels, small_grid, stream_contention, sync_api, utilization)
from recsys_doctor.analyzers._attribution import attribute, enclosing_range
from recsys_doctor.findings import SEVERITIES
from recsys_doctor.model import Trace
from recsys_doctor.options import Options

from _tracebuild import T, api, copy, kern, rng

O = Options()
IDS = {"short-kernels", "launch-bound", "stream-contention", "memcpy-ping-pong", "sync-api", "small-grid",
       "graph-candidate", "no-gpu-activity", "allocator-churn", "step-variance", "embedding-bound",
       "optimizer-unfused", "input-stall", "streams-never-overlap", "processes-share-gpu", "copy-kernels", "fp32-gemm"}


def ids(res):
    return [f.id for f in res.findings]


# --- attribution ----------------------------------------------------------------------
def test_enclosing_range_innermost():
    tr = T(ranges=[rng(0, 100, 5, "outer"), rng(10, 50, 5, "inner"), rng(60, 90, 5, "inner2"),
                   rng(20, 30, 5, "deep"), rng(0, 100, 6, "other_thread"), rng(0, 10, 5, "first")])
    # note: "first" [0,10) nests in "outer" and starts with it
    t = [5, 25, 40, 55, 70, 150, 5]
    tid = [5, 5, 5, 5, 5, 5, 7]
    got = attribute(tr, [1] * 7, tid, t)
    assert list(got) == ["first", "deep", "inner", "outer", "inner2", None, None]
    idx = enclosing_range(tr.ranges, [1], [6], [50])
    assert tr.ranges["name"].iloc[idx[0]] == "other_thread"


def test_attribution_groups_steps_and_skips_cpu_ops():
    tr = T(ranges=[rng(0, 100, 5, "ProfilerStep#3", source="user_annotation"),
                   rng(10, 20, 5, "aten::mm", source="cpu_op")])
    assert list(attribute(tr, [1], [5], [15])) == ["ProfilerStep#*"]
    assert list(attribute(tr, [1], [5], [15], cpu_ops=True)) == ["aten::mm"]


# --- utilization ------------------------------------------------------------------------
def test_utilization_timeline_by_hand():
    tr = T(kernels=[kern(0, 4000), kern(2000, 6000), kern(10000, 30000), kern(100, 400, device=1)],
           memcpys=[copy(30000, 40000, "h2d")])
    d = utilization.analyze(tr, O.with_overrides(timeline_bins=4, startup_fraction=0.0)).data
    assert d["devices"]["0"]["busy_ns"] == 26000 and d["devices"]["0"]["window_ns"] == 40000
    assert d["devices"]["1"]["utilization"] == pytest.approx(1.0)
    # bins of 10000 ns over 0..40000: [0,6000] -> 0.6; [10000,30000] -> 1, 1; copy only -> 0
    assert d["timeline"]["devices"]["0"] == [0.6, 1.0, 1.0, 0.0]
    assert d["timeline"]["devices"]["1"] == [0.03, 0.0, 0.0, 0.0]
    assert d["timeline"]["streams"]["pid 1 dev 0 stream 7"] == [0.6, 1.0, 1.0, 0.0]
    # steady state: median non-empty bin 1.0 -> first bin >= 0.5 is bin 0 -> starts at 0
    assert d["devices"]["0"]["steady_start_ns"] == 0
    d2 = utilization.analyze(tr, O.with_overrides(timeline_bins=4, startup_fraction=0.25)).data
    # cut at 10000: busy 20000 of 30000
    assert d2["devices"]["0"]["steady_utilization"] == pytest.approx(20000 / 30000)
    assert utilization.analyze(tr, O).findings == []


# --- short kernels -------------------------------------------------------------------------
def test_short_kernels_by_hand():
    ks = [kern(0, 2000, corr=1, name="a"), kern(3000, 5000, corr=2, name="a"), kern(6000, 9000, corr=3, name="b"),
          kern(10000, 40000, corr=4, name="big")]
    calls = [api(-9000, 0, 1, 5), api(-6000, 0, 2, 5), api(-3000, 0, 3, 5), api(0, 1000, 4, 5)]
    res = short_kernels.analyze(T(kernels=ks, api=calls), O)
    d = res.data
    assert d["short"] == 3 and d["count_share"] == 0.75
    assert d["time_share"] == pytest.approx(round(7000 / 37000, 4))
    assert d["offenders"][0] == {"name": "a", "count": 2, "total_us": 4.0, "median_us": 2.0}
    # launch durations 9000, 6000, 3000, 1000 -> median 4500; kernels 2000,2000,3000,30000 -> 2500
    assert d["median_launch_us"] == 4.5 and d["median_kernel_us"] == 2.5
    (f,) = res.findings
    # steady state from 10% of the 40000 ns window (4000); idle gaps 2000-3000 (start-up),
    # 5000-6000 (ends with short kernel b), 9000-10000 (ends with the long one): 1000 ns
    assert f.id == "short-kernels" and f.recoverable_ns == 1000
    # share of the steady state (4000-40000): 1000 / 36000 = 2.8% -> low (2% <= x < 10%)
    assert f.recoverable_share == round(1000 / 36000, 4) and f.severity == "low"
    assert f.examples == [{"what": "GPU idle before a short kernel", "start_ns": 5000, "duration_ns": 1000,
                           "stream": "pid 1 dev 0 stream 7"}]


def test_short_kernels_back_to_back_recover_nothing():
    # short kernels queued ahead of the GPU run back to back: no idle, nothing to win
    ks = [kern(i * 2000, i * 2000 + 2000, corr=i + 1) for i in range(10)]
    calls = [api(-100, 0, i + 1, 5) for i in range(10)]
    (f,) = short_kernels.analyze(T(kernels=ks, api=calls), O).findings
    assert f.recoverable_ns == 0 and f.severity == "note"


# --- launch-bound -------------------------------------------------------------------------
def test_launch_bound_split_by_hand():
    ks = [kern(0, 1000, corr=1), kern(3000, 4000, corr=2), kern(20000, 21000, corr=3),
          kern(30000, 31000, corr=4), kern(32000, 33000, corr=0)]
    calls = [api(-500, -100, 1, 5), api(500, 900, 2, 5), api(10000, 11000, 3, 6), api(2000, 2500, 4, 5)]
    res = launch_bound.analyze(T(kernels=ks, api=calls), O)
    d = res.data
    # gaps: 2000 (launch began before idle, < 5 us: short), 16000 (launch at 10000 >= 4000: host wait),
    #       9000 (launch at 2000 < 21000: other), 1000 (no launch call, short)
    assert d["idle_ns"] == 28000 and d["host_wait_ns"] == 16000
    assert d["short_gap_ns"] == 3000 and d["other_idle_ns"] == 9000
    assert d["host_wait_share_of_idle"] == pytest.approx(round(16000 / 28000, 4))
    assert d["launch_share_of_window"] == pytest.approx(round(19000 / 33000, 4))
    (f,) = res.findings
    # steady state from 3300 (10% of 33000): the 2000 ns short gap at 1000 is start-up;
    # recoverable = host wait 16000 + short gap 1000 at 31000 = 17000 of the 29700 ns
    # steady state -> high
    assert f.recoverable_ns == 17000 and f.severity == "high"
    assert f.where[0]["thread"].startswith("pid 1 tid 6") and f.where[0]["share"] == 1.0
    assert f.examples[0] == {"what": "GPU idle, waiting for a launch", "start_ns": 4000, "duration_ns": 16000,
                             "thread": "pid 1 tid 6", "stream": "pid 1 dev 0 stream 7"}


def test_launch_bound_names_client_threads_only_where_several_launch_after_the_waits():
    """Ten 1 us kernels, each after 9 us of GPU idle whose launch starts after the previous
    kernel ended (host waits). Launched by one thread (a training or scoring loop): the advice
    does not ask for a stream group per client thread. Launched round-robin by 3 threads (each
    >= 5% of the host-wait time): it does."""
    def trace(n_threads):
        ks = [kern(i * 10_000, i * 10_000 + 1000, corr=i + 1) for i in range(10)]
        calls = [api(i * 10_000 - 2000, i * 10_000 - 1500, i + 1, 10 + i % n_threads) for i in range(10)]
        return T(kernels=ks, api=calls)

    (one,) = launch_bound.analyze(trace(1), O).findings
    assert one.evidence["host_wait_ns"] == 9 * 9000
    assert one.recommendation == ("The GPU waits for the CPU to issue work: capture the steady-state sequence in "
                                  "CUDA graphs (one launch per query/step) and move host-side preprocessing off the "
                                  "launching thread.")
    (three,) = launch_bound.analyze(trace(3), O).findings
    assert three.evidence["host_wait_ns"] == 9 * 9000
    assert "give each client thread its own stream group" in three.recommendation


def test_launch_bound_splits_out_host_work_outside_cuda_calls_by_hand():
    """Two host waits, of 20 and 60 us. Before the first launch its thread was in a synchronize
    until 1 ns earlier (launching); before the second it had made no CUDA call for 60.1 us (host
    work: >= 50 us). A driver call nested in the first launch call, a call ending long before, and
    a call of another thread inside the silence change nothing."""
    ks = [kern(0, 1000, corr=1), kern(21_000, 22_000, corr=2), kern(82_000, 83_000, corr=3)]
    calls = [api(-500, -100, 1, 5), api(15_000, 19_999, 9, 5),  # a synchronize on thread 5, then ...
             api(20_000, 20_900, 2, 5), api(20_100, 20_800, 2, 5),  # ... the launch (and its nested driver call)
             api(-20_000, -19_000, 8, 5), api(30_000, 30_500, 7, 6),  # thread 6's call in thread 5's silence
             api(81_000, 81_900, 3, 5)]
    res = launch_bound.analyze(T(kernels=ks, api=calls), O)
    d = res.data
    # host waits: 1000 -> 21_000 (launch at 20_000 >= 1000: 20_000 ns), 22_000 -> 82_000 (launch at 81_000: 60_000 ns)
    assert d["host_wait_ns"] == 20_000 + 60_000
    # silent before 20_000: last end <= 20_000 on thread 5 is 19_999 -> 1 ns; before 81_000: 20_900 -> 60_100 ns
    assert d["host_work_ns"] == 60_000 and d["host_work_us"] == 50.0
    assert d["host_work_share_of_host_wait"] == pytest.approx(round(60_000 / 80_000, 4))
    (f,) = res.findings
    assert f.title.endswith("; 75% of the host wait follows >= 50 us of host work outside CUDA calls")
    assert f.recommendation.startswith("Most of the wait is host work outside CUDA calls: in 75% of the host-wait")
    assert f.action.startswith("profile the host work outside CUDA calls")
    # under half: neither the title nor the advice says so (the evidence still does)
    res = launch_bound.analyze(T(kernels=ks, api=calls), Options(host_work_us=61.0))
    (f,) = res.findings
    assert res.data["host_work_ns"] == 0 and "host work" not in f.title
    assert f.recommendation.startswith("The GPU waits for the CPU") and f.action.startswith("capture the per-query")


# --- stream contention ----------------------------------------------------------------
def test_stream_contention_by_hand():
    ks = [kern(1000 + i * 10, 1005 + i * 10, corr=i + 1) for i in range(4)]
    calls = [api(0, 100, 1, 1), api(50, 150, 2, 2), api(200, 300, 3, 1), api(400, 500, 4, 2)]
    res = stream_contention.analyze(T(kernels=ks, api=calls), O)
    (s,) = res.data["streams"]
    # per-thread unions A=[0,100]+[200,300], B=[50,150]+[400,500]; overlap [50,100] counts twice
    assert s["overlap_share"] == pytest.approx(100 / 400)
    assert s["switch_rate"] == 1.0 and s["concurrent_threads"] == 2
    assert s["median_launch_us_overlapped"] == 0.1 and s["median_launch_us_alone"] == 0.1
    (f,) = res.findings
    # every call takes 100 ns overlapped or not: contention costs no launch time here
    assert f.id == "stream-contention" and f.recoverable_ns == 0 and f.severity == "note"


def test_stream_contention_recoverable_is_the_slowdown():
    # one kernel every 10 us, each launched in the idle gap before it; thread 1 alone and
    # thread 2 alone take 100 ns a call, the two overlapped pairs 300 ns a call
    ks = [kern(i * 10_000, i * 10_000 + 5, corr=i) for i in range(1, 9)]
    calls = [api(9_000, 9_100, 1, 1), api(19_000, 19_100, 2, 2),
             api(29_000, 29_300, 3, 1), api(29_100, 29_400, 4, 2),
             api(39_000, 39_100, 5, 1), api(49_000, 49_100, 6, 2),
             api(59_000, 59_300, 7, 1), api(59_100, 59_400, 8, 2)]
    (f,) = stream_contention.analyze(T(kernels=ks, api=calls), O).findings
    # median alone 100 ns: lost = each overlapped call beyond its first 100 ns, as a union:
    # [29_100, 29_300] u [29_200, 29_400] = 300 ns, and the same at 59_100: 600 ns, all of it
    # while the GPU idles before the next kernel (steady state from 10_000 + 10% of 70_005)
    assert f.evidence["launch_time_lost_ns"] == 600
    assert f.recoverable_ns == 600


def test_stream_contention_lost_time_only_where_the_gpu_idles():
    # the same calls, but a long kernel keeps the GPU busy over the first overlapped pair:
    # only the second pair's 300 ns is GPU idle that contention cost
    ks = [kern(i * 10_000, i * 10_000 + 5, corr=i) for i in range(1, 9)] + [kern(20_000, 30_000, corr=99)]
    calls = [api(9_000, 9_100, 1, 1), api(19_000, 19_100, 2, 2),
             api(29_000, 29_300, 3, 1), api(29_100, 29_400, 4, 2),
             api(39_000, 39_100, 5, 1), api(49_000, 49_100, 6, 2),
             api(59_000, 59_300, 7, 1), api(59_100, 59_400, 8, 2)]
    (f,) = stream_contention.analyze(T(kernels=ks, api=calls), O).findings
    assert f.evidence["launch_time_lost_ns"] == 600 and f.recoverable_ns == 300


def test_warmup_then_one_thread_is_not_contention():
    ks = [kern(5000 + i * 10, 5005 + i * 10, corr=i + 1, stream=9) for i in range(4)]
    calls = [api(0, 100, 1, 1), api(1000, 1100, 2, 2), api(1200, 1300, 3, 2), api(1400, 1500, 4, 2)]
    res = stream_contention.analyze(T(kernels=ks, api=calls), O)
    (s,) = res.data["streams"]
    assert s["threads"] == 2 and s["concurrent_threads"] == 0 and not s["contended"]
    assert res.findings == []


# --- memcpy ping-pong -----------------------------------------------------------------
def test_memcpy_ping_pong_by_hand():
    cps = [copy(0, 10, "h2d", corr=1, src="pageable"), copy(1000, 1010, "d2h", corr=2),
           copy(2000, 2010, "h2d", corr=3), copy(3000, 3010, "d2h", corr=4, nbytes=10**6)]
    calls = [api(-50, -1, 1, 5, name="cudaMemcpy"), api(900, 950, 2, 5, name="cudaMemcpyAsync"),
             api(1900, 1950, 3, 5, name="cudaMemcpyAsync"), api(2900, 2950, 4, 5, name="cudaMemcpyAsync")]
    res = memcpy_ping_pong.analyze(T(memcpys=cps, api=calls, ranges=[rng(-100, 5000, 5, "query")]), O)
    d = res.data
    assert (d["h2d"], d["d2h"], d["direction_switches"]) == (2, 2, 3)
    assert d["small_copies"] == 3 and d["sync_copies"] == 1 and d["pageable_copies"] == 1
    assert d["unit"] == "query" and d["units"] == 1 and d["small_copies_per_unit"] == 3.0
    (f,) = res.findings
    # round trip: the GPU idles from the end of the D2H at 1010 until the H2D at 2000
    # (the gap 10-1000 ends *with* a D2H, the one at 3010 never comes); 990 of 3010 -> high
    assert f.recoverable_ns == 990 and f.severity == "high"
    assert f.where[0] == {"nvtx": "query", "share": 1.0}


# --- sync api -----------------------------------------------------------------------
def test_sync_api_by_hand():
    calls = [api(0, 10, 1, 5), api(10, 60, 0, 5, name="cudaStreamSynchronize"), api(60, 100, 2, 5),
             api(0, 1000, 3, 6)]
    res = sync_api.analyze(T(api=calls, ranges=[rng(5, 70, 5, "step")]), O)
    d = res.data
    assert d["calls"] == 1 and d["blocked_us"] == 0.05
    assert d["blocked_share"] == 0.5  # 50 of thread 5's 100 ns span
    assert d["by_kind"] == {"stream": {"calls": 1, "blocked_us": 0.05}}
    (f,) = res.findings
    # reported (half the thread's time blocked) but no GPU work in the trace: nothing to win
    assert f.severity == "note" and f.where[0] == {"nvtx": "step", "share": 1.0}


def test_sync_api_costs_the_gpu_idle_after_it():
    # kernel 0-1000; the thread syncs 100-1200, then launches the next kernel at 4000 (runs
    # 5000-6000): the GPU idles 1000-5000 and the sync returned inside that gap
    ks = [kern(0, 1000, corr=1), kern(5000, 6000, corr=2)]
    calls = [api(-50, 0, 1, 5), api(100, 1200, 0, 5, name="cudaDeviceSynchronize"), api(4000, 4100, 2, 5)]
    (f,) = sync_api.analyze(T(kernels=ks, api=calls), O).findings
    assert f.evidence["gpu_idle_after_sync_ns"] == 4000
    assert f.recoverable_ns == 4000 and f.recoverable_share == round(4000 / 5400, 4) and f.severity == "high"


def test_sync_api_by_count_and_pageable_copies():
    # 120 pageable D2H cudaMemcpyAsync (block the host) + 120 stream syncs of 1 ns each
    # over a long-running thread: blocked share tiny, but 240 syncs are reported by count
    cps, calls = [], [api(0, 10**9, 10**6, 5, name="cudaLaunchKernel")]
    for i in range(120):
        t = 1000 + i * 10_000
        cps.append(copy(t, t + 100, "d2h", corr=i + 1, src="device", dst="pageable"))
        calls.append(api(t - 50, t + 120, i + 1, 5, name="cudaMemcpyAsync"))
        calls.append(api(t + 200, t + 201, 0, 5, name="cudaStreamSynchronize"))
    (f,) = sync_api.analyze(T(memcpys=cps, api=calls), O).findings
    assert f.evidence["calls"] == 240 and f.evidence["pageable_d2h_copies"] == 120


# --- small grid ----------------------------------------------------------------------
def test_small_grid_by_hand():
    ks = [kern(0, 100, grid=(32, 1, 1), name="tiny"), kern(100, 400, grid=(132, 2, 1)),
          kern(0, 1000, device=1, grid=(1, 1, 1))]
    tr = T(kernels=ks, devices=[{"device": 0, "name": "H100", "sm_count": 132}])
    res = small_grid.analyze(tr, O)
    d = res.data
    assert d["skipped_devices"] == [1] and "note" in d
    assert d["kernels_judged"] == 2 and d["small_grid_kernels"] == 1
    assert d["time_share"] == 0.25
    (f,) = res.findings
    assert d["offenders"][0]["name"] == "tiny"
    # with start-up exclusion off: tiny leaves 100 of 132 SMs empty for 100 ns -> 75 ns of
    # the 400 + 1000 ns window (device 1 is skipped but its window counts)
    f0 = small_grid.analyze(tr, O.with_overrides(startup_fraction=0)).findings[0]
    assert f0.recoverable_ns == int(100 * (1 - 32 / 132)) and f0.severity == "low"


def test_small_grid_unknown_sm_count_is_skipped():
    res = small_grid.analyze(T(kernels=[kern(0, 100)]), O)
    assert res.findings == [] and res.data["skipped_devices"] == [0]


# --- graph candidates --------------------------------------------------------------
def test_graph_candidate_by_hand():
    names = [f"x{i}" for i in range(5)] + [c for _ in range(4) for c in "ABCDEFGH"]
    # 1000 ns kernels every 2000 ns: a 1000 ns launch gap before each
    ks = [kern(i * 2000, i * 2000 + 1000, corr=i + 1, name=n) for i, n in enumerate(names)]
    calls = [api(i * 2000 - 500, i * 2000 - 400, i + 1, 5) for i in range(len(names))]
    res = graph_candidate.analyze(T(kernels=ks, api=calls), O)
    d = res.data
    assert d["eager_kernels"] == 37 and d["candidate_kernels"] == 32
    assert d["sequence_length"] == 8 and d["sequence_head"][:2] == ["A", "B"]
    assert d["candidate_share_of_busy"] == pytest.approx(round(32 / 37, 4))
    (f,) = res.findings
    # the 32 gaps before A..H kernels (all after the 7300 ns start-up cut): 32000 of 65700
    assert f.recoverable_ns == 32000 and f.severity == "high" and d["graphed_busy_share"] == 0.0


def test_graph_candidate_one_kernel_loop_and_two_streams_stay_below_100pct():
    # one kernel name repeated 30x on two threads/streams at the same moments
    ks, calls = [], []
    for i in range(30):
        for tid, st in ((5, 7), (6, 8)):
            c = len(ks) + 1
            ks.append(kern(i * 2000, i * 2000 + 1000, corr=c, stream=st, name="gemm"))
            calls.append(api(i * 2000 - 500, i * 2000 - 400, c, tid))
    res = graph_candidate.analyze(T(kernels=ks, api=calls), O)
    (f,) = res.findings
    # the loop body is one kernel; it is reported as the smallest sequence of >= 8 kernels
    assert res.data["sequence_length"] == 8 and "8-kernel sequence" in f.title
    assert res.data["candidate_share_of_busy"] == 1.0  # union of the overlapping kernels, not 200%
    assert "100% of GPU busy time" in f.title


def test_graph_candidate_recognizes_graphs():
    ks = [kern(0, 1000, corr=1, in_graph=True), kern(5000, 6000, corr=2)]
    graphs = [{"start": 0, "end": 3000, "pid": 1, "device": 0, "stream": 7, "correlation": 1, "graph_id": 1}]
    calls = [api(-10, -5, 1, 5, name="cudaGraphLaunch"), api(4000, 4100, 2, 5)]
    res = graph_candidate.analyze(T(kernels=ks, graphs=graphs, api=calls), O)
    # graphed: [0,3000] of busy [0,3000] U [5000,6000] = 3000 / 4000
    assert res.data["graphed_busy_share"] == 0.75
    (f,) = res.findings
    assert f.id == "graph-candidate" and f.severity == "note"


# --- processes sharing a GPU -----------------------------------------------------------
def _two_processes(offset_us, dev2=0, n2=10, len2_us=100):
    """pid 1: 10 kernels of 100 us every 300 us from 0; pid 2: ``n2`` of ``len2_us`` starting
    ``offset_us`` later each, on device ``dev2``."""
    ks = [kern(i * 300_000, i * 300_000 + 100_000, corr=i + 1, pid=1) for i in range(10)]
    ks += [kern(i * 300_000 + offset_us * 1000, i * 300_000 + (offset_us + len2_us) * 1000, corr=100 + i, pid=2,
                device=dev2) for i in range(n2)]
    return T(kernels=ks)


def test_processes_whose_kernels_never_overlap_on_one_device():
    res = process_sharing.analyze(_two_processes(150), O)
    (f,) = res.findings
    assert f.id == "processes-share-gpu" and f.severity == "note" and f.recoverable_ns == 0
    (d,) = f.evidence["devices"]
    # busy 20 x 100 us = 2,000 us, no overlap; the device's window 0 .. 9 x 300 + 250 us = 2,950 us
    assert (d["processes"], d["kernel_time_us"], d["busy_us"], d["overlap_us"]) == (2, 2000.0, 2000.0, 0.0)
    assert d["busy_share"] == round(2000 / 2950, 4)
    assert [p["pid"] for p in d["per_process"]] == [1, 2] and d["per_process"][0]["share"] == 0.5
    assert f.title == ("2 processes run kernels on device 0, each in its own CUDA context, and together for only "
                       "0.000 ms of 2.000 ms (GPU busy 68%)")
    assert f.where == [{"process": 1, "device": 0, "share": 0.5}, {"process": 2, "device": 0, "share": 0.5}]


def test_processes_that_overlap_or_do_not_share_a_device_are_not_reported():
    # 50 of each 100 us overlap: 500 of 2,000 us (25%), as MPS allows
    res = process_sharing.analyze(_two_processes(50), O)
    assert res.findings == [] and res.data["devices"][0]["overlap_us"] == 500.0
    assert res.data["devices"][0]["overlap_share"] == 0.25
    # each process on a device of its own (one rank per GPU): nothing to compare
    res = process_sharing.analyze(_two_processes(150, dev2=1), O)
    assert res.findings == [] and res.data["devices"] == []
    # a second process with 10 of 1,010 us (1% < report_min_share): one process judged
    res = process_sharing.analyze(_two_processes(150, n2=1, len2_us=10), O)
    assert res.findings == [] and res.data["devices"][0]["processes_judged"] == 1
    assert process_sharing.analyze(T(), O).findings == []


# --- no GPU activity + registry ------------------------------------------------------
def test_no_gpu_activity():
    res = no_gpu_activity.analyze(T(api=[api(0, 10, 1, 5)]), O)
    (f,) = res.findings
    assert f.id == "no-gpu-activity" and f.severity == "note" and "tracing" in f.evidence["why"]
    assert no_gpu_activity.analyze(T(kernels=[kern(0, 1)]), O).findings == []
    assert f.evidence["processes"] == 1 and "processes" not in f.evidence["why"]


def test_no_gpu_activity_from_several_processes_names_the_signal():
    """What nsys left of a pool whose workers were terminated (H200, session22_h200): a few API
    calls in each of 4 workers and 1 in the parent, no activity."""
    calls = [api(0, 10, 1, 5, pid=100)] + [api(w * 100 + i, w * 100 + i + 5, 10 * w + i, 7, pid=200 + w)
                                           for w in range(4) for i in range(3)]
    (f,) = no_gpu_activity.analyze(T(api=calls), O).findings
    assert f.evidence["processes"] == 5 and f.evidence["api_calls"] == 13
    assert "The calls come from 5 processes" in f.evidence["why"] and "terminate()" in f.evidence["why"]


def test_registry_runs_all_and_ids_are_contract():
    tr = T(kernels=[kern(i * 100, i * 100 + 50, corr=i + 1) for i in range(40)],
           api=[api(i * 100 - 10, i * 100 + 20, i + 1, 5 + i % 2) for i in range(40)],
           memcpys=[copy(5000, 5010, "h2d"), copy(5020, 5030, "d2h")])
    results = run_all(tr, O)
    assert [r.name for r in results] == list(ANALYZERS)
    for r in results:
        json.dumps(r.data)
        for f in r.findings:
            assert f.id in IDS and f.severity in SEVERITIES and f.recommendation
            json.dumps(f.to_dict())
    empty = run_all(Trace(path="x", format="test"), O)
    assert [f.id for r in empty for f in r.findings] == ["no-gpu-activity"]


def test_thread_label_unwraps_kineto_thread_names():
    """Kineto names a thread 'thread <tid> (<comm>)'; the label shows <comm> once."""
    import pandas as pd

    from recsys_doctor.analyzers._util import thread_labels
    from recsys_doctor.model import Trace

    tr = Trace(path="x", format="kineto-json",
               threads=pd.DataFrame({"pid": [7, 7], "tid": [1313, 9], "name": ["thread 1313 (python3)", "worker"]}))
    assert thread_labels(tr, [7, 7, 7], [1313, 9, 5]) == [
        "pid 7 tid 1313 (python3)", "pid 7 tid 9 (worker)", "pid 7 tid 5"]


def _overlapped_by_rule(tids, s, e):
    """The rule of ``stream_contention._overlap_stats``, one call at a time in plain
    Python: a call is overlapped when some interval of the union of the other threads'
    calls (half-open, touching intervals joined) starts before it ends and ends after it
    starts."""
    out = []
    for i in range(len(s)):
        others = sorted((a, max(a, b)) for t, a, b in zip(tids, s, e) if t != tids[i])
        merged = []
        for a, b in others:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out.append(any(a < e[i] and b > s[i] for a, b in merged))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_stream_contention_overlap_rule_with_points_and_touching_calls(seed):
    """Calls of no length, calls that touch, one thread ending where another begins: the
    per-call flags equal the rule computed call by call."""
    import pandas as pd

    from recsys_doctor.analyzers.stream_contention import _overlap_stats

    r = np.random.default_rng(seed)
    n = int(r.integers(2, 60))
    tids = r.integers(1, int(r.integers(2, 6)), n)
    s = r.integers(0, 40, n)
    e = s + r.choice([0, 0, 1, 2, 3, 5], n)  # many calls of no length; a coarse clock makes ties
    calls = pd.DataFrame({"tid": tids, "api_start": s, "api_end": e})
    _, flags = _overlap_stats(calls)
    assert flags.tolist() == _overlapped_by_rule(tids.tolist(), s.tolist(), e.tolist())


def test_graph_candidate_counts_the_host_syncs_inside_its_sequence():
    """Eight kernels A..H repeated 6x by one thread, launched every 2000 ns; a
    cudaStreamSynchronize after H of every repetition (the request's read-back: a graph of
    A..H ends there) is one sync point and none inside; another after D of every repetition
    is a second point, one inside a graph of the whole body; one after D in only 2 of the 6
    repetitions (a branch most requests skip) is not a point of the body. A body of 2 kernels
    (A B, a sync after each: Rodinia's Gaussian) is reported as an 8-kernel sequence, its
    points counted in one body (2, one inside); a 4-kernel body with one sync (a loop's read-back)
    has none inside, though 2 bodies make the reported sequence."""
    def trace(sync_after):
        ks, calls = [], []
        for i, n in enumerate(c for _ in range(6) for c in "ABCDEFGH"):
            ks.append(kern(i * 2000, i * 2000 + 1000, corr=i + 1, name=n))
            calls.append(api(i * 2000 - 500, i * 2000 - 400, i + 1, 5))
            if sync_after(i // 8, n):
                calls.append(api(i * 2000 + 100, i * 2000 + 1100, 10_000 + i, 5, name="cudaStreamSynchronize"))
        return T(kernels=ks, api=calls)

    cases = {"end": (lambda r, n: n == "H", 1), "middle": (lambda r, n: n in "DH", 2),
             "sometimes": (lambda r, n: n == "H" or (n == "D" and r < 2), 1), "none": (lambda r, n: False, 0)}
    for name, (after, points) in cases.items():
        res = graph_candidate.analyze(trace(after), O)
        (f,) = res.findings
        d = res.data
        assert d["sequence_length"] == 8 and d["sync_points_per_sequence"] == points, name
        assert d["syncs_inside_sequence"] == max(points - 1, 0), name
        inside = d["syncs_inside_sequence"] > 0
        assert d["loop_body_kernels"] == 8
        assert ("; 1 host synchronization inside each 8-kernel loop body" in f.title) == inside, name
        assert f.recommendation.startswith("The repeated sequence waits for the GPU at 2 points of each repetition "
                                           "of its 8-kernel loop body") == inside, name
        if inside:  # (8 kernels, 2 points: segments of 4 are worth capturing)
            assert "capture the 2 segments between them separately" in f.recommendation
    ks = [kern(i * 2000, i * 2000 + 1000, corr=i + 1, name="AB"[i % 2]) for i in range(40)]
    calls = [api(i * 2000 - 500, i * 2000 - 400, i + 1, 5) for i in range(40)]
    calls += [api(i * 2000 + 100, i * 2000 + 1100, 1000 + i, 5, name="cudaThreadSynchronize") for i in range(40)]
    res = graph_candidate.analyze(T(kernels=ks, api=calls), O)
    (f,) = res.findings
    d = res.data
    assert (d["sequence_length"], d["loop_body_kernels"], d["sync_points_per_sequence"], d["syncs_inside_sequence"]) \
        == (8, 2, 2, 1)
    assert "; 1 host synchronization inside each 2-kernel loop body" in f.title and "segments" not in f.recommendation
    ks = [kern(i * 2000, i * 2000 + 1000, corr=i + 1, name="ABCD"[i % 4]) for i in range(40)]
    calls = [api(i * 2000 - 500, i * 2000 - 400, i + 1, 5) for i in range(40)]
    calls += [api(i * 2000 + 100, i * 2000 + 1100, 1000 + i, 5, name="cudaStreamSynchronize") for i in range(3, 40, 4)]
    res = graph_candidate.analyze(T(kernels=ks, api=calls), O)
    d = res.data
    assert (d["sequence_length"], d["loop_body_kernels"], d["sync_points_per_sequence"], d["syncs_inside_sequence"]) \
        == (8, 4, 1, 0)
    assert "inside" not in res.findings[0].title


def test_the_plan_says_to_remove_the_syncs_inside_the_sequence_first():
    from recsys_doctor.planning.planner import _cuda_graphs

    launchy = [SimpleNamespace(id="graph-candidate", severity="high")]
    plain = _cuda_graphs({"sequence_length": 8, "syncs_inside_sequence": 0}, {}, launchy)
    synced = _cuda_graphs({"sequence_length": 8, "syncs_inside_sequence": 3}, {}, launchy)
    assert plain["enabled"] and synced["enabled"] and "remove" not in plain["reason"]
    assert synced["reason"].endswith("first remove the 3 host synchronizations inside it (graph-candidate: a "
                                     "capture fails across them, and the calls then run eagerly)")


def test_graph_candidate_takes_the_step_between_host_syncs_over_a_block_repeated_inside_it():
    """The same 2-kernel block (A B) launched 12 times a query, a cudaStreamSynchronize after
    each query (identical layers, a Python loop over a block): the sequence is the query's 24
    kernels, not the block, with one sync point at its edge; 30 queries by one thread, then by 3
    threads taking turns (their kernels interleave in time, each thread's own order is the
    query). A step of 10 blocks with syncs after the 6th and the 10th (gaps 12 and 8 kernels,
    alternating) is one 20-kernel step with 2 sync points, one inside it."""
    def trace(threads, blocks_between_syncs, queries=30):
        ks, calls, i = [], [], 0
        for _ in range(queries):
            for th in range(threads):
                for nb in blocks_between_syncs:
                    for _ in range(nb):
                        for n in "AB":
                            i += 1
                            ks.append(kern(i * 2000, i * 2000 + 1000, corr=i, name=n))
                            calls.append(api(i * 2000 - 500, i * 2000 - 400, i, 5 + th))
                    calls.append(api(i * 2000 + 100, i * 2000 + 1100, 100_000 + i, 5 + th,
                                     name="cudaStreamSynchronize"))
        return T(kernels=ks, api=calls)

    for threads in (1, 3):
        res = graph_candidate.analyze(trace(threads, (12,)), O)
        d = res.data
        assert (d["sequence_length"], d["loop_body_kernels"], d["inner_period_kernels"]) == (24, 24, 2), threads
        assert (d["sync_points_per_sequence"], d["syncs_inside_sequence"]) == (1, 0), threads
        assert d["sequence_repeats"] == 30 * threads
        (f,) = res.findings
        assert f.title.startswith("A 24-kernel sequence (what a thread launches between two of its host "
                                  "synchronizations; a 2-kernel block repeats inside it) repeats "
                                  f"{30 * threads}x eagerly")
    res = graph_candidate.analyze(trace(1, (6, 4)), O)
    d = res.data
    assert (d["sequence_length"], d["inner_period_kernels"], d["sync_points_per_sequence"],
            d["syncs_inside_sequence"]) == (20, 2, 2, 1)
    assert "capture the 2 segments between them separately" in res.findings[0].recommendation
