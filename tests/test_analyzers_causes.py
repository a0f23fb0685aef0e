"""Issue 23 rules on tiny hand-built traces (numbers by hand): small grids beside other
streams and communication kernels, allocator gaps, a slow step, and one idle gap counted
once when two findings claim it."""

from __future__ import annotations

import pytest

from recsys_doctor.analyzers import allocator_churn, launch_bound, run_all, small_grid, step_variance
from recsys_doctor.errors import BadInputError
from recsys_doctor.options import Options

from _tracebuild import T, api, copy, kern, rng

O = Options()
H100 = [{"device": 0, "name": "H100", "sm_count": 132}]


def test_small_grid_counts_only_time_no_other_stream_fills():
    # tiny (33 blocks of 132) runs 0..1000 on stream 7; stream 8 runs 0..400 and 900..1200:
    # alone 400..900 = 500 ns, 3/4 of the SMs empty -> 375 ns; the NCCL kernel is not judged
    ks = [kern(0, 1000, grid=(33, 1, 1), name="tiny"), kern(0, 400, stream=8, grid=(264, 1, 1)),
          kern(900, 1200, stream=8, grid=(264, 1, 1)),
          kern(1200, 9200, stream=9, grid=(8, 1, 1), name="ncclDevKernel_SendRecv(ncclDevComm*)")]
    res = small_grid.analyze(T(kernels=ks, devices=H100), O.with_overrides(startup_fraction=0))
    d = res.data
    assert d["communication_kernels_excluded"] == 1 and d["communication_time_excluded_us"] == 8.0
    assert d["kernels_judged"] == 3 and d["small_grid_kernels"] == 1
    assert d["unused_sm_time_ns"] == 375 and d["small_grid_alone_time_us"] == 0.5
    (f,) = res.findings
    assert f.recoverable_ns == 375


def test_comm_kernel_pattern_is_an_option():
    assert Options().with_overrides({"comm_kernel_pattern": "^tiny$"}).comm_kernel_pattern == "^tiny$"
    with pytest.raises(BadInputError):
        Options(comm_kernel_pattern="(")


U = 1000  # the allocator trace in microseconds (the evidence is rounded to microseconds)


def _alloc_trace():
    # kernels every 1000 us; between 3000 and 10_000 us the host is in cudaFree + cudaMalloc
    ks = [kern(i * 1000 * U, (i * 1000 + 500) * U, corr=i + 1) for i in range(4)] + \
         [kern((10_000 + i * 1000) * U, (10_500 + i * 1000) * U, corr=10 + i) for i in range(6)]
    calls = [api((i * 1000 - 200) * U, (i * 1000 - 100) * U, i + 1, 5) for i in range(4)] + \
            [api(3_600 * U, 6_000 * U, 0, 5, name="cudaFree"), api(6_000 * U, 9_700 * U, 0, 5, name="cudaMalloc")] + \
            [api((10_000 + i * 1000 - 200) * U, (10_000 + i * 1000 - 100) * U, 10 + i, 5) for i in range(6)]
    steps = [rng(a * U, b * U, 5, f"ProfilerStep#{i + 1}", source="user_annotation", depth=0)
             for i, (a, b) in enumerate([(-300, 3_550), (3_550, 9_950), (9_950, 12_550), (12_550, 15_550)])]
    return T(kernels=ks, api=calls, ranges=steps)


def test_allocator_gap_is_not_a_launch_wait():
    tr = _alloc_trace()
    o = O.with_overrides(startup_fraction=0)
    lb = launch_bound.analyze(tr, o).data
    # gap 3500..10_000 us (6500 us): cudaFree+cudaMalloc cover 3600..9700 = 6100 us >= half
    assert lb["allocator_idle_ns"] == 6500 * U and lb["devices"]["0"]["allocator_gaps"] == 1
    (f,) = allocator_churn.analyze(tr, o).findings
    assert f.recoverable_ns == 6500 * U and f.evidence["steady"]["calls"] == 2
    assert f.evidence["steady"]["per_api"]["cudaMalloc"] == {"count": 1, "time_ms": 3.7}
    assert f.evidence["steady"]["syncing_frees"] == 1


def test_step_variance_names_the_slow_step():
    tr = _alloc_trace()
    o = O.with_overrides(startup_fraction=0)
    (f,) = step_variance.analyze(tr, o).findings
    # steps 3850, 6400, 2600, 3000 us: median 3425; step 2 is 1.87x and holds the allocator
    assert f.evidence["median_step_ms"] == 3.425
    (out,) = f.evidence["outliers"]
    assert out["step"] == "ProfilerStep#2" and out["x_median"] == 1.87
    assert [x["api"] for x in out["extra_api"]] == ["cudaMalloc", "cudaFree"]
    # idle inside it 6500 us, its excess over the median 6400 - 3425 = 2975 us
    assert f.recoverable_ns == 2975 * U


def test_one_gap_counted_once_under_the_root_cause():
    tr = _alloc_trace()
    found = {f.id: f for r in run_all(tr, O.with_overrides(startup_fraction=0)) for f in r.findings}
    a, s = found["allocator-churn"], found["step-variance"]
    assert a.recoverable_ns == 6500 * U and s.recoverable_ns == 0
    assert s.evidence["shared_cause_with"] == ["allocator-churn"]
    # the slow step claimed the part of the allocator gap inside it: 3550..9950 us
    assert s.evidence["shared_idle_ns"]["counted_under"] == {"allocator-churn": 6400 * U}
    assert a.evidence["shared_idle_ns"]["also_counted_by"] == {"step-variance": 6400 * U}
    assert "Shared cause" in s.recommendation and s.severity == "note"


def test_memcpy_round_trip_and_sync_share_a_cause():
    # kernel, a 4-byte D2H with a blocking cudaMemcpy, then the GPU waits for the host
    ks, cps, calls = [], [], []
    for i in range(4):
        t = i * 10_000
        ks.append(kern(t, t + 1000, corr=3 * i + 1))
        cps.append(copy(t + 1000, t + 1100, "d2h", corr=3 * i + 2, nbytes=4, dst="pageable"))
        calls += [api(t - 300, t - 100, 3 * i + 1, 5), api(t + 900, t + 1200, 3 * i + 2, 5, name="cudaMemcpy")]
    found = {f.id: f for r in run_all(T(kernels=ks, memcpys=cps, api=calls), O.with_overrides(startup_fraction=0))
             for f in r.findings}
    mp, sy = found["memcpy-ping-pong"], found["sync-api"]
    # three round trips of 8900 ns after the copies: memcpy-ping-pong's, once
    assert mp.evidence["round_trip_idle_ns"] == 3 * 8900
    assert mp.recoverable_ns - mp.evidence["merge_copies_saving_ns"] == 3 * 8900
    assert sy.recoverable_ns == 0 and sy.evidence["shared_idle_ns"]["counted_under"]["memcpy-ping-pong"] == 3 * 8900
    assert "launch-bound" not in found or found["launch-bound"].recoverable_ns == 0


@pytest.mark.parametrize("name, comm", [
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", True),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", True),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", True),
    ("void deep_ep::internode_ll::combine<false>(void*, int*)", True),
    ("void moe_dispatch_kernel(float const*, int*)", True),
    ("void at::native::all_to_all_single_kernel(float*)", True),
    ("void cross_device_reduce_1stage<float, 8>(RankData*, RankSignals)", True),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 64, 64>(float*)", False),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(float*)", False),
    ("void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float>(float*)", False),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8", False),
])
def test_comm_kernel_pattern_names(name, comm):
    import re
    assert bool(re.search(O.comm_kernel_pattern, name)) is comm


def test_repeated_operator_ranges_are_no_steps():
    # a repeated top-level NVTX range is a step only when it is named like one
    ks = [kern(i * 1000, i * 1000 + 100, corr=i + 1) for i in range(6)]
    ops = [rng(i * 1000, i * 1000 + (5000 if i == 3 else 500), 5, f"aten::mul, op_id = {i}", depth=0)
           for i in range(6)]
    assert step_variance.analyze(T(kernels=ks, ranges=ops), O).data == {"steps": 0}
    its = [rng(i * 1000, i * 1000 + (900 if i == 3 else 400), 5, "train_step", depth=0) for i in range(6)]
    (f,) = step_variance.analyze(T(kernels=ks, ranges=its), O).findings
    # steps of 400 ns and one of 900 ns: 2.25x the median
    assert f.evidence["outliers"][0]["step"] == "train_step" and f.evidence["outliers"][0]["x_median"] == 2.25
