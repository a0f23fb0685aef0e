"""Benchmark of the stream-group runtime against plain PyTorch, in one run (H100).

Serving: wide&deep (26 sparse EmbeddingBag features, 13 dense, 3-layer MLP, batch 256),
Q closed-loop client threads, each query: host inputs -> device -> model -> host.
  eager_1stream   : all threads on one shared stream, eager PyTorch (per-tensor copies)
  graph_shared    : one CUDA graph per thread, replayed on one shared stream
  runtime_gG_m|u  : recsys_doctor.runtime.serve with G groups, merged (m) or unmerged (u)
Training: MMoE step (26 embeddings, 8 experts, 4 towers, Adam, batch 512):
  eager_1stream, graph_1stream (whole-step graph), runtime_eager_streams,
  runtime_graph_streams (experts and task heads on branch streams inside the graph).
Memory: 100k queries through the best Q=8 runtime configuration, memory before/after.

    OUT=dir python bench/runtime/runtime_bench.py     # writes dir/runtime_bench.json
Env: DUR (seconds per serving config, default 1.5), QS (default 1,4,8), BENCH_GROUPS (1,2,4,8;
not GROUPS, a bash built-in),
MEMQ (queries of the memory check, default 100000), SKIP (comma list: serve,train,mem).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import threading
import time

import torch
import torch.nn as nn

from recsys_doctor.runtime import BranchStreams, serve

try:
    import pynvml

    pynvml.nvmlInit()
    NVML = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception:  # noqa: BLE001
    NVML = None

VOCAB, BATCH = 200_000, 256
DUR = float(os.environ.get("DUR", 1.5))
QS = [int(q) for q in os.environ.get("QS", "1,4,8").split(",")]
GROUPS = [int(g) for g in os.environ.get("BENCH_GROUPS", "1,2,4,8").split(",")]
SKIP = set(filter(None, os.environ.get("SKIP", "").split(",")))


# the wide&deep model, its query inputs and its hand-written serving loop are the
# examples' (identical layers: 26 EmbeddingBag deep + 26 wide, MLP 429-512-256-1), here
# with the probe's 200k vocabulary
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import wdl_serving  # noqa: E402
from wdl_serving import WideDeep  # noqa: E402


def WDL() -> nn.Module:  # noqa: N802 - keeps the benchmark's config names
    return WideDeep(VOCAB)


def host_query(seed):
    return wdl_serving.host_query(BATCH, VOCAB, generator=torch.Generator().manual_seed(seed))


class Sampler(threading.Thread):
    def __init__(s):
        super().__init__(daemon=True)
        s.vals, s.stop = [], False

    def run(s):
        while not s.stop and NVML is not None:
            s.vals.append(pynvml.nvmlDeviceGetUtilizationRates(NVML).gpu)
            time.sleep(0.05)


def closed_loop(Q, make_worker):
    """Q threads, each running make_worker(k)() -> one query, back to back for DUR s (the
    examples' closed loop, without NVTX ranges), NVML sampled meanwhile."""
    workers = [make_worker(k) for k in range(Q)]
    samp = Sampler()
    samp.start()
    all_l, wall = wdl_serving.closed_loop(Q, DUR, lambda k: workers[k](), ranges=False)
    samp.stop = True
    samp.join()
    util = round(statistics.mean(samp.vals[2:]), 1) if len(samp.vals) > 3 else None
    return dict(queries=len(all_l), qps=round(len(all_l) / wall, 1),
                p50_ms=round(all_l[len(all_l) // 2] * 1e3, 3),
                p99_ms=round(all_l[min(len(all_l) - 1, int(len(all_l) * 0.99))] * 1e3, 3), gpu_util=util)


def baseline_workers(model, Q, use_graph, queries):
    """Plain PyTorch, every client on one shared stream: the examples' serving query, eager or
    one CUDA graph per client (``wdl_serving.prepare_client``/``query``)."""
    shared = torch.cuda.Stream()
    states = [wdl_serving.prepare_client(model, shared, queries[k % len(queries)], use_graph) for k in range(Q)]

    def make(k):
        st = states[k]
        return lambda: wdl_serving.query(model, st)
    return make, states


def bench_serving(model, queries):
    rows = []
    for Q in QS:
        for name, use_graph in (("eager_1stream", False), ("graph_shared", True)):
            make, states = baseline_workers(model, Q, use_graph, queries)
            r = closed_loop(Q, make)
            del states
            r.update(config=name, Q=Q)
            rows.append(r)
            print(json.dumps(r), flush=True)
        for G in GROUPS:
            for merge in (True, False):
                with serve(model, queries[0], groups=G, merge=merge, graphs=True) as served:
                    def make(k, served=served):
                        q = queries[k % len(queries)]
                        return lambda: served(*q)
                    r = closed_loop(Q, make)
                    r.update(config=f"runtime_g{G}_{'m' if merge else 'u'}", Q=Q, groups=G, merge=merge,
                             fallbacks=served.stats()["fallbacks"])
                rows.append(r)
                print(json.dumps(r), flush=True)
                torch.cuda.synchronize()
    return rows


def check_outputs(model, queries):
    """The benchmarked runtime computes what eager computes (checked once per run)."""
    with torch.no_grad():
        refs = [model(q[0].cuda(), [t.cuda() for t in q[1]], q[2].cuda()).cpu() for q in queries]
    with serve(model, queries[0], groups=4) as served:
        got = [served(*q) for q in queries]
    return max(float((a - b).abs().max()) for a, b in zip(got, refs))


def mem_growth(model, queries, G, merge, n_total):
    import resource

    from cuda.bindings import driver

    with serve(model, queries[0], groups=G, merge=merge) as served:
        Q = 8
        per = n_total // Q

        def run(n):
            def w(k):
                q = queries[k % len(queries)]
                for _ in range(n):
                    served(*q)
            ths = [threading.Thread(target=w, args=(k,)) for k in range(Q)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
        run(500)
        torch.cuda.synchronize()
        snap = lambda: dict(cuda_free=int(driver.cuMemGetInfo()[1]), torch_reserved=torch.cuda.memory_reserved(),
                            torch_allocated=torch.cuda.memory_allocated(), pools=served.manager.pool_stats(),
                            max_rss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        before = snap()
        t0 = time.perf_counter()
        run(per)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        after = snap()
    return dict(queries=per * Q, threads=Q, groups=G, merge=merge, seconds=round(wall, 2), before=before,
                after=after, device_bytes_growth=before["cuda_free"] - after["cuda_free"],
                torch_reserved_growth=after["torch_reserved"] - before["torch_reserved"],
                rss_growth_kb=after["max_rss_kb"] - before["max_rss_kb"])


# ----------------------------------------------------------------------------- training
TB, F, T, TVOC = 512, 26, 4, 100_000


# the examples' MMoE (same sizes: 26 features x 16, 8 experts 416-128-128-64, 4 tasks)
from mmoe_training import MMoE, warm_up_aside  # noqa: E402


def bench_train(name, streams, graph, steps=200):
    torch.manual_seed(0)
    m = MMoE(TVOC, streams=streams).cuda()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, capturable=graph)
    ids = torch.randint(0, TVOC, (TB, F), device="cuda")
    y = torch.rand(TB, T, device="cuda")
    lossf = nn.BCEWithLogitsLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        loss = lossf(m(ids), y)
        loss.backward()
        opt.step()
        return loss
    warm_up_aside(step, 5)
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
    else:
        run = step
    for _ in range(10):
        run()
    torch.cuda.synchronize()
    samp = Sampler()
    samp.start()
    times = []
    for rep in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    samp.stop = True
    samp.join()
    util = round(statistics.mean(samp.vals[1:]), 1) if len(samp.vals) > 2 else None
    r = dict(config=name, step_ms=round(statistics.median(times), 4), step_ms_reps=[round(t, 4) for t in times],
             gpu_util=util)
    print(json.dumps(r), flush=True)
    return r


def main():
    out_dir = os.environ.get("OUT", ".")
    drv = pynvml.nvmlSystemGetDriverVersion() if NVML is not None else None
    meta = dict(gpu=torch.cuda.get_device_name(), driver=drv, cuda=torch.version.cuda, torch=torch.__version__,
                python=platform.python_version(), batch=BATCH, dur_s=DUR,
                time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    try:
        import cuda.bindings
        import cuda.core
        meta.update(cuda_bindings=cuda.bindings.__version__, cuda_core=cuda.core.__version__)
    except Exception:  # noqa: BLE001
        pass
    print(json.dumps(meta), flush=True)
    res = dict(meta=meta)
    torch.manual_seed(0)
    model = WDL().cuda().eval()
    queries = [host_query(s) for s in range(16)]
    res["serving_max_abs_diff_vs_eager"] = check_outputs(model, queries[:8])
    if "serve" not in SKIP:
        res["serving"] = rows = bench_serving(model, queries)
        summary = {}
        for Q in QS:
            at = [r for r in rows if r["Q"] == Q]
            eager = next(r for r in at if r["config"] == "eager_1stream")
            gs = next(r for r in at if r["config"] == "graph_shared")
            best = max((r for r in at if r["config"].startswith("runtime")), key=lambda r: r["qps"])
            summary[Q] = dict(best=best["config"], qps=best["qps"], p99_ms=best["p99_ms"],
                              x_eager_qps=round(best["qps"] / eager["qps"], 2),
                              p99_over_eager=round(best["p99_ms"] / eager["p99_ms"], 3),
                              x_graph_shared_qps=round(best["qps"] / gs["qps"], 2),
                              x_best_baseline_qps=round(best["qps"] / max(eager["qps"], gs["qps"]), 2))
            print(f"Q={Q}: {json.dumps(summary[Q])}", flush=True)
        res["serving_summary"] = summary
    if "train" not in SKIP:
        tr = [bench_train("eager_1stream", False, False), bench_train("graph_1stream", False, True)]
        with BranchStreams(8) as bs:
            tr += [bench_train("runtime_eager_8streams", bs, False), bench_train("runtime_graph_8streams", bs, True)]
        with BranchStreams(4) as bs:
            tr += [bench_train("runtime_graph_4streams", bs, True)]
        res["training"] = tr
        by = {r["config"]: r["step_ms"] for r in tr}
        best = min((r for r in tr if r["config"].startswith("runtime_graph")), key=lambda r: r["step_ms"])
        res["training_summary"] = dict(best=best["config"], step_ms=best["step_ms"],
                                       x_eager=round(by["eager_1stream"] / best["step_ms"], 3),
                                       x_graph_1stream=round(by["graph_1stream"] / best["step_ms"], 3))
        print(json.dumps(res["training_summary"]), flush=True)
    if "mem" not in SKIP:
        best8 = res.get("serving_summary", {}).get(8, {}).get("best", "runtime_g4_m")
        G = int(best8.split("_g")[1].split("_")[0])
        res["memory"] = mem_growth(model, queries, G, best8.endswith("_m"), int(os.environ.get("MEMQ", 100_000)))
        print(json.dumps(res["memory"]), flush=True)
    path = os.path.join(out_dir, "runtime_bench.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
