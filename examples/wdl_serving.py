"""Wide&deep-style serving workload: Q client threads send queries back to back.

Each query: host inputs (26 sparse id lists + 13 dense features, batch 256, pinned) are
copied to the GPU tensor by tensor, the model runs, the output comes back to the host,
and the thread waits for it. This is the classic low-utilization recommender pattern:
~90 kernels per query, most of them shorter than 10 us.

Modes:
  eager   plain PyTorch eager forward
  graphs  one CUDA graph per client thread (captured after warm-up), replayed per query
Streams:
  shared      every thread launches into ONE stream (the contention case)
  per-thread  one stream per client thread

NVTX ranges mark the phases: ``warmup``, ``measure`` and every ``query``.

  python examples/wdl_serving.py --threads 4 --mode eager --streams shared --duration 0.5
  python examples/wdl_serving.py --threads 2 --duration 0.1 --kineto trace.json

It is also the source of the sample trace shipped with recsys-doctor
(``recsys_doctor/data/README.md`` says exactly how that was made).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time

import torch
import torch.nn as nn

try:  # the nvtx package when present, else PyTorch's own NVTX bindings
    import nvtx as _nvtx

    def annotate(name: str):  # noqa: D103
        return _nvtx.annotate(name, domain="recsys_doctor.example")
except ImportError:  # pragma: no cover - depends on the machine
    def annotate(name: str):  # noqa: D103
        return torch.cuda.nvtx.range(name)

N_SPARSE, N_DENSE, DIM, HOT = 26, 13, 16, 4


class WideDeep(nn.Module):
    """26 EmbeddingBag features (deep, dim 16) + 26 wide (dim 1) + 13 dense + 3-layer MLP
    (``hidden``, ``hidden // 2``, 1). The one wide&deep definition: the other examples,
    the benchmarks and the GPU tests import it with their own sizes."""

    def __init__(self, vocab: int = 100_000, *, n_sparse: int = N_SPARSE, hidden: int = 512,
                 dim: int = DIM, n_dense: int = N_DENSE) -> None:
        super().__init__()
        self.embs = nn.ModuleList([nn.EmbeddingBag(vocab, dim, mode="sum") for _ in range(n_sparse)])
        self.wide = nn.ModuleList([nn.EmbeddingBag(vocab, 1, mode="sum") for _ in range(n_sparse)])
        self.mlp = nn.Sequential(nn.Linear(n_sparse * dim + n_dense, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden // 2), nn.ReLU(), nn.Linear(hidden // 2, 1))

    def forward(self, dense, idx, offs):
        e = [m(i, offs) for m, i in zip(self.embs, idx)]
        w = self.wide[0](idx[0], offs)
        for m, i in zip(self.wide[1:], idx[1:]):
            w = w + m(i, offs)
        return torch.sigmoid(self.mlp(torch.cat(e + [dense], 1)) + w)


def host_query(batch: int, vocab: int, generator: torch.Generator | None = None):
    """One query's host inputs, pinned: 13 dense features and ``HOT`` ids per sample for
    each of the 26 sparse features (``generator``: a seeded one, else torch's global RNG)."""
    dense = torch.randn(batch, N_DENSE, generator=generator).pin_memory()
    idx = [torch.randint(0, vocab, (batch * HOT,), generator=generator).pin_memory() for _ in range(N_SPARSE)]
    offs = torch.arange(0, batch * HOT, HOT).pin_memory()
    return dense, idx, offs


def prepare_client(model: nn.Module, stream: torch.cuda.Stream, hq, graph: bool) -> dict:
    """One client's device side on ``stream``: its inputs copied to the GPU, a pinned host
    output, 3 warm-up forwards and, with ``graph``, the forward captured as a CUDA graph."""
    st = {"stream": stream, "hq": hq, "graph": None}
    with torch.cuda.stream(stream), torch.no_grad():
        st["dense"] = hq[0].to("cuda", non_blocking=True)
        st["idx"] = [t.to("cuda", non_blocking=True) for t in hq[1]]
        st["offs"] = hq[2].to("cuda", non_blocking=True)
        st["out_h"] = torch.empty(hq[0].shape[0], 1).pin_memory()
        for _ in range(3):
            st["out"] = model(st["dense"], st["idx"], st["offs"])
        stream.synchronize()
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
                st["out"] = model(st["dense"], st["idx"], st["offs"])
            st["graph"] = g
    torch.cuda.synchronize()
    return st


def query(model: nn.Module, st: dict) -> None:
    """One query of a prepared client: host inputs -> GPU tensor by tensor, the model (or its
    graph), output -> pinned host memory, and wait for it on the client's stream."""
    s, hq, g = st["stream"], st["hq"], st["graph"]
    with torch.cuda.stream(s), torch.no_grad():
        st["dense"].copy_(hq[0], non_blocking=True)
        for d, h in zip(st["idx"], hq[1]):
            d.copy_(h, non_blocking=True)
        if g is not None:
            g.replay()
        else:
            st["out"] = model(st["dense"], st["idx"], st["offs"])
        st["out_h"].copy_(st["out"], non_blocking=True)
        s.synchronize()


def closed_loop(threads: int, duration: float, one_query, ranges: bool = True) -> tuple[list[float], float]:
    """``threads`` client threads call ``one_query(k)`` back to back for ``duration`` seconds
    (with ``ranges``, each call an NVTX ``query`` range and the window an NVTX ``measure``
    range); returns every call's latency in seconds, sorted, and the window's wall time."""
    mark = annotate if ranges else (lambda name: contextlib.nullcontext())
    lat: list[list[float]] = [[] for _ in range(threads)]
    go = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def client(k: int) -> None:
        go.wait()
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            with mark("query"):
                one_query(k)
            lat[k].append(time.perf_counter() - t0)

    workers = [threading.Thread(target=client, args=(k,), name=f"client-{k}") for k in range(threads)]
    for w in workers:
        w.start()
    with mark("measure"):
        t0 = time.perf_counter()
        stop_at[0] = t0 + duration
        go.wait()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
    return sorted(x for row in lat for x in row), wall


def run(threads: int, mode: str, streams: str, duration: float, batch: int, vocab: int) -> dict:
    model = WideDeep(vocab).cuda().eval()
    shared = torch.cuda.Stream()
    with annotate("warmup"):
        states = [prepare_client(model, torch.cuda.Stream() if streams == "per-thread" else shared,
                                 host_query(batch, vocab), graph=mode == "graphs") for _ in range(threads)]
    all_l, wall = closed_loop(threads, duration, lambda k: query(model, states[k]))
    return {"threads": threads, "mode": mode, "streams": streams, "queries": len(all_l),
            "qps": round(len(all_l) / wall, 1),
            "p50_ms": round(statistics.median(all_l) * 1e3, 3) if all_l else None,
            "p99_ms": round(all_l[min(len(all_l) - 1, int(len(all_l) * 0.99))] * 1e3, 3) if all_l else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--mode", choices=["eager", "graphs"], default="eager")
    ap.add_argument("--streams", choices=["shared", "per-thread"], default="shared")
    ap.add_argument("--duration", type=float, default=1.0, help="seconds of measured load")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--kineto", metavar="PATH", help="capture with torch.profiler and write Chrome-trace JSON here")
    a = ap.parse_args()
    torch.manual_seed(0)
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    if a.kineto:
        from torch.profiler import ProfilerActivity, profile

        ctx = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    with ctx as prof:
        res = run(a.threads, a.mode, a.streams, a.duration, a.batch, a.vocab)
    if a.kineto:
        prof.export_chrome_trace(a.kineto)
    res["gpu"] = torch.cuda.get_device_name()
    res["torch"] = torch.__version__
    print(json.dumps(res))


if __name__ == "__main__":
    main()
