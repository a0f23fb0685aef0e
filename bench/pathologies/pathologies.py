"""Injected-pathology workloads: one process makes one known GPU-utilization problem.

Each scenario is built to contain exactly the pathology its name says, so a trace of it
can be labeled from its construction (what must and must not be diagnosed), not from
what recsys-doctor happens to print. The traces under ``tests/data/patho_*`` were made
on the lent H100 with::

    nsys profile -t cuda,nvtx,osrt --sample=none --cpuctxsw=none -o /tmp/r \
        python3 bench/pathologies/pathologies.py SCENARIO
    nsys export --type sqlite -o /tmp/r.sqlite /tmp/r.nsys-rep

Scenarios (all serve a small recommender-style MLP unless said otherwise):

``pingpong``
    One thread, NVTX range ``step`` per iteration: a pageable 16 KiB H2D copy, three
    small kernels, a pageable 4-byte D2H read-back (``.cpu()``), ``STEPS`` times. Every
    copy changes direction; every D2H blocks the thread.
``sync_per_query``
    One thread, NVTX range ``query``: pinned async H2D inputs, the MLP forward (eager),
    an async D2H into pinned memory, then ``torch.cuda.synchronize()`` (one
    ``cudaDeviceSynchronize``) after every query.
``threads8_one_stream``
    Eight client threads (named ``client-0`` .. ``client-7``, no NVTX) launching eager
    queries into ONE shared stream, each waiting for its own result.
``graphs_in_use``
    Two client threads, each with its own stream and its own CUDA graph of the MLP
    (captured once after warm-up), replaying one graph per query (NVTX ``query``).
``large_kernels``
    One thread keeping the GPU saturated: 8192x8192 bf16 matmuls enqueued back to back,
    one sync at the very end. No host round trips in the loop.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import torch
import torch.nn as nn

BATCH, IN, HID = 256, 64, 256


def name_thread(name: str) -> None:
    """Set the OS thread name (what nsys records in ThreadNames)."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        pass


class MLP(nn.Module):
    """Eight small Linear+ReLU layers: ~17 short kernels per forward at batch 256."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(IN, HID), nn.ReLU()]
        for _ in range(6):
            layers += [nn.Linear(HID, HID), nn.ReLU()]
        layers += [nn.Linear(HID, 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(x))


def rng(name: str):
    return torch.cuda.nvtx.range(name)


def pingpong(steps: int = 400) -> None:
    w = torch.randn(IN, IN, device="cuda")
    with rng("warmup"):
        for _ in range(5):
            (torch.randn(IN, IN).cuda() @ w).relu().sum().cpu()
    torch.cuda.synchronize()
    for _ in range(steps):
        with rng("step"):
            x = torch.randn(IN, IN).cuda()          # pageable H2D, 16 KiB
            y = (x @ w).relu().sum()                # 3 short kernels
            float(y.cpu())                          # pageable D2H, 4 bytes, blocks


def sync_per_query(queries: int = 400) -> None:
    model = MLP().cuda().eval()
    xh = torch.randn(BATCH, IN).pin_memory()
    oh = torch.empty(BATCH, 1).pin_memory()
    with torch.no_grad():
        x = xh.to("cuda")
        with rng("warmup"):
            for _ in range(3):
                model(x)
        torch.cuda.synchronize()
        for _ in range(queries):
            with rng("query"):
                x.copy_(xh, non_blocking=True)
                out = model(x)
                oh.copy_(out, non_blocking=True)
                torch.cuda.synchronize()


def run_clients(client, threads: int, duration: float) -> None:
    """Run ``client(k, go, stop)`` on ``threads`` threads: each sets up, waits on the barrier
    ``go``, then sends queries while ``time.perf_counter() < stop[0]`` (``duration``
    seconds from when this opens the window)."""
    go = threading.Barrier(threads + 1)
    stop = [0.0]
    ts = [threading.Thread(target=client, args=(k, go, stop)) for k in range(threads)]
    for t in ts:
        t.start()
    stop[0] = time.perf_counter() + duration
    go.wait()
    for t in ts:
        t.join()


def threads8_one_stream(threads: int = 8, duration: float = 0.4) -> None:
    model = MLP().cuda().eval()
    shared = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(shared):
        x0 = torch.randn(BATCH, IN, device="cuda")
        for _ in range(3):
            model(x0)
    torch.cuda.synchronize()

    def client(k: int, go: threading.Barrier, stop: list[float]) -> None:
        name_thread(f"client-{k}")
        xh = torch.randn(BATCH, IN).pin_memory()
        oh = torch.empty(BATCH, 1).pin_memory()
        with torch.no_grad(), torch.cuda.stream(shared):
            x = torch.empty(BATCH, IN, device="cuda")
            go.wait()
            while time.perf_counter() < stop[0]:
                x.copy_(xh, non_blocking=True)
                out = model(x)
                oh.copy_(out, non_blocking=True)
                shared.synchronize()

    run_clients(client, threads, duration)


def graphs_in_use(threads: int = 2, duration: float = 0.4) -> None:
    model = MLP().cuda().eval()
    states = []
    with rng("warmup"), torch.no_grad():
        for _ in range(threads):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                x = torch.randn(BATCH, IN, device="cuda")
                for _ in range(3):
                    model(x)
                s.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
                    out = model(x)
            torch.cuda.synchronize()
            states.append((s, x, out, g))

    def client(k: int, go: threading.Barrier, stop: list[float]) -> None:
        name_thread(f"client-{k}")
        s, x, out, g = states[k]
        xh = torch.randn(BATCH, IN).pin_memory()
        oh = torch.empty(BATCH, 1).pin_memory()
        with torch.cuda.stream(s):
            go.wait()
            while time.perf_counter() < stop[0]:
                with rng("query"):
                    x.copy_(xh, non_blocking=True)
                    g.replay()
                    oh.copy_(out, non_blocking=True)
                    s.synchronize()

    run_clients(client, threads, duration)


def large_kernels(iters: int = 300, n: int = 8192) -> None:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = a @ b  # cuBLAS init + heuristics outside the loop
    torch.cuda.synchronize()
    with rng("train"):
        for _ in range(iters):
            c = torch.matmul(a, b, out=c)
        torch.cuda.synchronize()


SCENARIOS = {f.__name__: f for f in (pingpong, sync_per_query, threads8_one_stream, graphs_in_use, large_kernels)}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        sys.exit(f"usage: pathologies.py {{{'|'.join(SCENARIOS)}}}")
    torch.manual_seed(0)
    name_thread("main")
    t0 = time.perf_counter()
    SCENARIOS[sys.argv[1]]()
    torch.cuda.synchronize()
    print(f"{sys.argv[1]}: {time.perf_counter() - t0:.2f} s", flush=True)
