"""Part C of issue 23 on the shared traces: kernel labels that keep the culprit's name,
embedding-bound, optimizer-unfused, input-stall and the kernel-mix notes. Every expected
number is computed here from the trace itself (SQL over the nsys export, arithmetic over
the Kineto JSON), not copied from the analyzers' output."""

from __future__ import annotations

import gzip
import json
import sqlite3

import pytest

from recsys_doctor.reports._common import kernel_label, kernel_labels

pytestmark = pytest.mark.shared


def _db(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _kernel_names(path) -> list[str]:
    return [n for (n,) in _db(path).execute(
        """select s.value from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = k.demangledName
           group by s.value order by count(*) desc""")]


def test_labels_keep_the_operator_name(shared_traces):
    names = _kernel_names(shared_traces / "h100" / "wdl_serial_q4_h100.sqlite")
    labels = kernel_labels(names)
    assert len(set(labels.values())) == len(names)  # unique within the report
    top = names[0]  # the most launched kernel, by SQL
    assert "EmbeddingBag_updateOutputKernel_sum_mean" in top
    assert labels[top] == "EmbeddingBag_updateOutputKernel_sum_mean"
    cat = next(n for n in names if "CatArrayBatchedCopy" in n)
    assert labels[cat].startswith("CatArrayBatchedCopy")
    add = next(n for n in names if "vectorized_elementwise_kernel" in n and "CUDAFunctor_add" in n)
    clamp = next(n for n in names if "vectorized_elementwise_kernel" in n and "clamp" in n)
    assert labels[add] == "vectorized_elementwise_kernel<add>"
    assert labels[clamp] == "vectorized_elementwise_kernel<clamp>"
    for n in names:
        assert labels[n] != "native" and not labels[n].startswith("<")


def test_kineto_names_keep_the_operator_name(shared_traces):
    with gzip.open(shared_traces / "h100" / "mmoe_4streams_h100.pt.trace.json.gz") as fh:
        ev = json.load(fh)["traceEvents"]
    names = sorted({e["name"] for e in ev if e.get("cat") == "kernel"})
    labels = kernel_labels(names)
    assert len(set(labels.values())) == len(names)
    lerp = next(n for n in names if "multi_tensor_apply_kernel" in n and "LerpFunctor" in n)
    assert labels[lerp] == "multi_tensor_apply_kernel<LerpFunctor>"
    emb = next(n for n in names if "embedding_backward_feature_kernel" in n)
    assert labels[emb] == "embedding_backward_feature_kernel"


def test_colliding_labels_are_told_apart():
    a = "void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(x)::{lambda(float)#1}>(int, T3)"
    b = "void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(x)::{lambda(long)#1}>(int, T3)"
    assert kernel_label(a) == kernel_label(b) == "elementwise_kernel<direct_copy>"
    got = kernel_labels([a, b, a])
    assert got == {a: "elementwise_kernel<direct_copy>[float]", b: "elementwise_kernel<direct_copy>[long]"}
    c = "void foo<1>(int)"
    d = "void foo<2>(int)"
    assert kernel_labels([c, d]) == {c: "foo", d: "foo#2"}


# --- the findings -----------------------------------------------------------------------
from math import gcd  # noqa: E402

from recsys_doctor.analyzers import run_all  # noqa: E402
from recsys_doctor.loaders import load  # noqa: E402
from recsys_doctor.options import Options  # noqa: E402


def _findings(path):
    return {f.id: f for res in run_all(load(path), Options()) for f in res.findings}


def _events(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def _union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _overlap(a, b):
    """Length of the intersection of two unions of intervals (plain loops)."""
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_embedding_bound_on_wdl_serial(shared_traces):
    path = shared_traces / "h100" / "wdl_serial_q4_h100.sqlite"
    db = _db(path)
    rows = db.execute("""select s.value, count(*), sum(k.end - k.start) from CUPTI_ACTIVITY_KIND_KERNEL k
                         join StringIds s on s.id = k.demangledName group by s.value""").fetchall()
    emb = [(c, t) for n, c, t in rows if "EmbeddingBag" in n]
    n_all, t_all = sum(c for _, c, _ in rows), sum(t for _, _, t in rows)
    n_emb, t_emb = sum(c for c, _ in emb), sum(t for _, t in emb)
    iters = 0
    for _, c, _ in rows:
        iters = gcd(iters, c) if c >= 2 else iters
    f = _findings(path)["embedding-bound"]
    ev = f.evidence
    assert ev["embedding_kernels"] == n_emb == 8580
    assert ev["time_share"] == pytest.approx(t_emb / t_all, abs=1e-4) and 0.68 < ev["time_share"] < 0.69
    assert ev["iterations"] == iters == 165
    assert ev["embedding_launches_per_iteration"] == n_emb / iters == 52
    assert ev["launches_per_iteration"] == n_all / iters == 88
    # the launch cost between two consecutive lookups: gaps between two EmbeddingBag kernels
    # (no other GPU operation in between), each capped at the median launch call
    ops = db.execute("""select k.start, k.end, s.value like '%EmbeddingBag%' from CUPTI_ACTIVITY_KIND_KERNEL k
                        join StringIds s on s.id = k.demangledName
                        union all select start, end, 0 from CUPTI_ACTIVITY_KIND_MEMCPY
                        union all select start, end, 0 from CUPTI_ACTIVITY_KIND_MEMSET order by 1, 2""").fetchall()
    calls = sorted(e - s for s, e in db.execute(
        """select r.start, r.end from CUPTI_ACTIVITY_KIND_RUNTIME r join CUPTI_ACTIVITY_KIND_KERNEL k
           on k.correlationId = r.correlationId join StringIds s on s.id = k.demangledName
           where s.value like '%EmbeddingBag%'"""))
    cap = (calls[len(calls) // 2 - 1] + calls[len(calls) // 2]) / 2 if len(calls) % 2 == 0 else calls[len(calls) // 2]
    assert ev["launch_cost_per_lookup_us"] == pytest.approx(cap / 1000, abs=1e-3)
    per = db.execute("""select r.globalTid % 16777216, sum(k.end - k.start) from CUPTI_ACTIVITY_KIND_RUNTIME r
                        join CUPTI_ACTIVITY_KIND_KERNEL k on k.correlationId = r.correlationId
                        join StringIds s on s.id = k.demangledName where s.value like '%EmbeddingBag%'
                        group by 1 order by 2 desc""").fetchall()
    # no NVTX: the launching threads, each with its share of the lookups' GPU time
    assert [w["thread"].split()[3] for w in f.where] == [str(t) for t, _ in per][:5]
    assert [w["share"] for w in f.where] == pytest.approx([x / t_emb for _, x in per][:5], abs=1e-4)
    assert sum(w["share"] for w in f.where) == pytest.approx(1.0, abs=1e-3)
    lo, hi = ops[0][0], max(e for _, e, _ in ops)
    cut = lo + 0.1 * (hi - lo)  # the steady state starts at or after the first tenth
    reach, whole, after_cut = ops[0][1], 0, 0
    for (_s0, _, e0), (s1, e1, e_1) in zip(ops, ops[1:]):
        if s1 > reach and e0 and e_1:
            whole += min(s1 - reach, cap)
            after_cut += min(s1 - reach, cap) if reach >= cut else 0
        reach = max(reach, e1)
    # what it claims before shared causes are settled: the capped gaps from SQL
    claimed = ev["launch_cost_between_lookups_ns"]
    assert claimed <= after_cut <= whole
    assert claimed == pytest.approx(after_cut, rel=1e-3)  # the steady state starts at the tenth here
    # each gap counted once: stream contention (the 4 threads on one stream) names the root
    # cause of the same gaps and keeps them; embedding-bound keeps only what is left
    shared = ev["shared_idle_ns"]["counted_under"]
    assert "stream-contention" in shared
    assert f.recoverable_ns == claimed - sum(shared.values()) < claimed
    assert kernel_labels([o["name"] for o in ev["offenders"]])[ev["offenders"][0]["name"]] == \
        "EmbeddingBag_updateOutputKernel_sum_mean"


def test_optimizer_foreach_on_mmoe(shared_traces):
    path = shared_traces / "h100" / "mmoe_4streams_h100.pt.trace.json.gz"
    ev = _events(path)
    kern = [e for e in ev if e.get("cat") == "kernel"]
    mta = [e for e in kern if "multi_tensor_apply" in e["name"]]
    steps = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")]
    share = sum(e["dur"] for e in mta) / sum(e["dur"] for e in kern)
    f = _findings(path)["optimizer-unfused"]
    assert f.evidence["kind"] == "foreach" and f.evidence["optimizer"] == "Adam"
    assert f.evidence["gpu_time_share"] == pytest.approx(share, abs=1e-4) and round(share, 3) == 0.415
    assert f.evidence["launches_per_step"] == pytest.approx(len(mta) / len(steps), abs=0.05) == 25
    # what it claims: idle inside the step ranges plus half the foreach time, no more
    step_time = sum(e["dur"] for e in steps) * 1000
    half = sum(e["dur"] for e in mta) * 1000 / 2
    assert 0 < f.recoverable_ns <= step_time + half + 1
    assert "fused=True" in f.recommendation


def _dlrm(shared_traces, n=0):
    return next((shared_traces / "kineto").glob(f"*dlrm_kineto__worker{n}_*.json"))


def test_optimizer_per_parameter_on_dlrm(shared_traces):
    path = _dlrm(shared_traces)
    ev = _events(path)
    step = next(e for e in ev if e["name"].startswith("Optimizer.step#"))
    prof = next(e for e in ev if e["name"].startswith("ProfilerStep#"))
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    inside = [k for k in ev if k.get("cat") == "kernel" and (c := launch.get(k["args"].get("correlation")))
              and c["tid"] == step["tid"] and step["ts"] <= c["ts"] < step["ts"] + step["dur"]]
    f = _findings(path)["optimizer-unfused"]
    assert f.evidence["kind"] == "per-parameter" and f.evidence["optimizer"] == "Adagrad"
    assert f.evidence["optimizer_kernels"] == len(inside)
    assert not any("multi_tensor_apply" in k["name"] for k in inside)
    assert f.evidence["cpu_ms_per_step"] == pytest.approx(step["dur"] / 1000, abs=1e-3)
    assert f.evidence["cpu_share_of_step"] == pytest.approx(step["dur"] / prof["dur"], abs=1e-4)
    # recoverable: the GPU idle inside the step range (the pid's kernels, copies, memsets)
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")])
    idle = step["dur"] - _overlap([(step["ts"], step["ts"] + step["dur"])], busy)
    assert f.recoverable_ns == pytest.approx(idle * 1000, abs=1000)
    assert "foreach=True" in f.recommendation


def test_input_stall_on_dlrm(shared_traces):
    path = _dlrm(shared_traces)
    ev = _events(path)
    names = ("enumerate(DataLoader)", "## copy_batch_to_gpu ##", "## wait_for_batch ##")
    rngs = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith(names)]
    assert len(rngs) == 3
    prof = next(e for e in ev if e["name"].startswith("ProfilerStep#"))
    inp = _union([(e["ts"], e["ts"] + e["dur"]) for e in rngs])
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")])
    total = sum(e - s for s, e in inp)
    idle = total - _overlap(inp, busy)
    f = _findings(path)["input-stall"]
    assert f.evidence["input_time_ms"] == pytest.approx(total / 1000, abs=1e-3)
    assert f.evidence["gpu_idle_during_input_ms"] == pytest.approx(idle / 1000, abs=1e-3) and idle > 1000
    # recoverable: only the idle between GPU operations (inside the analysis window), the
    # same intervals intersected with the gaps between the step's GPU operations
    first, last = min(s for s, _ in busy), max(e for _, e in busy)
    clip = [(max(s, first), min(e, last)) for s, e in inp if min(e, last) > max(s, first)]
    inside = sum(e - s for s, e in clip) - _overlap(clip, busy)
    assert f.recoverable_ns == pytest.approx(inside * 1000, abs=1000) and 0 < f.recoverable_ns < idle * 1000
    assert f.evidence["share_of_step"] == pytest.approx(idle / prof["dur"], abs=1e-4)
    loader = next(e for e in rngs if e["name"].startswith("enumerate"))
    top = f.where[0]
    assert top["nvtx"].startswith("enumerate(DataLoader)")
    assert top["share"] == pytest.approx(loader["dur"] / total, abs=1e-3)  # nested time counted once
    assert "pin_memory" in f.recommendation and "TrainPipelineSparseDist" in f.recommendation


def _per_stream_overlap(kern):
    by = {}
    for e in kern:
        by.setdefault(e["args"]["stream"], []).append((e["ts"], e["ts"] + e["dur"]))
    per = {s: _union(iv) for s, iv in by.items()}
    total = sum(e - s for u in per.values() for s, e in u)
    union = sum(e - s for s, e in _union([x for u in per.values() for x in u]))
    return len(per), total - union, total


def test_streams_never_overlap_on_mmoe_and_not_on_torchrec(shared_traces):
    path = shared_traces / "h100" / "mmoe_4streams_h100.pt.trace.json.gz"
    ev = _events(path)
    n, overlap, _ = _per_stream_overlap([e for e in ev if e.get("cat") == "kernel"])
    waits = sum(1 for e in ev if e.get("cat") == "cuda_runtime" and e["name"] == "cudaStreamWaitEvent")
    assert (n, overlap, waits) == (5, 0, 96)
    f = _findings(path)["streams-never-overlap"]
    assert f.severity == "note" and f.recoverable_ns == 0
    assert f.evidence["stream_wait_event_calls"] == waits
    assert f.evidence["devices"][0]["streams"] == n and f.evidence["devices"][0]["overlap_us"] == 0
    trec = next((shared_traces / "kineto").glob("*torchrec*54105*.json"))
    _, overlap, total = _per_stream_overlap([e for e in _events(trec) if e.get("cat") == "kernel"])
    assert overlap / total > 0.2
    assert "streams-never-overlap" not in _findings(trec)


def test_copy_and_fp32_gemm_notes_on_torchrec(shared_traces):
    path = next((shared_traces / "kineto").glob("*torchrec*54105*.json"))
    kern = [e for e in _events(path) if e.get("cat") == "kernel"]
    total = sum(e["dur"] for e in kern)
    sgemm = sum(e["dur"] for e in kern if "sgemm" in e["name"]) / total
    copy = sum(e["dur"] for e in kern if "CatArrayBatchedCopy" in e["name"] or "direct_copy_kernel" in e["name"]) / total
    f = _findings(path)
    assert f["fp32-gemm"].evidence["time_share"] == pytest.approx(sgemm, abs=1e-4) and round(sgemm, 2) == 0.33
    assert f["copy-kernels"].evidence["time_share"] == pytest.approx(copy, abs=1e-4) and round(copy, 2) == 0.17
    for fid in ("fp32-gemm", "copy-kernels"):
        assert f[fid].severity == "note" and f[fid].recoverable_ns == 0
    assert "bfloat16" in f["fp32-gemm"].recommendation and "tf32" in f["fp32-gemm"].recommendation.lower()


def test_no_recsys_finding_where_there_is_no_such_work(shared_traces):
    """torch_matmul (matmul, relu, sum, .cpu()): no embeddings, no optimizer, no input ranges."""
    f = _findings(shared_traces / "h100" / "torch_matmul_2threads_h100.sqlite")
    for fid in ("embedding-bound", "optimizer-unfused", "input-stall", "streams-never-overlap", "copy-kernels"):
        assert fid not in f


def test_optimizer_not_judged_for_shampoo_and_comm_not_counted(shared_traces):
    """HTA's sampled rank steps Shampoo (under an EMA wrapper), whose step holds NCCL
    sends: no foreach/fused remedy exists for it, and NCCL is never an optimizer kernel."""
    path = next((shared_traces / "kineto").glob("*timeline_analysis__sampled_rank-0*"))
    ev = _events(path)
    steps = {e["name"] for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")}
    assert any("Shampoo" in s for s in steps)
    res = next(r for r in run_all(load(path), Options()) if r.name == "optimizer-unfused")
    assert not res.findings and "Shampoo" in res.data["not_judged"]
    assert not any("nccl" in (o["name"] or "").lower() for o in res.data["offenders"])
