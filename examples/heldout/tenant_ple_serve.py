"""Multi-tenant multi-task ranker: one PLE model per market, served by an asyncio front end.

Written the way a marketplace serving several markets often writes it. ``--tenants`` separate
PLE (Progressive Layered Extraction) models, one per market, kept in a dict ``models = {"m0":
PLE(...), ...}``, each built after its own ``torch.manual_seed(seed + k)`` and **of its own
size**: expert width 64 or 128 in turn, 2 tasks (ctr, cvr) or 3 (ctr, cvr, dwell). A PLE: 6
fields' embeddings (dim 16) beside the dense features, 2 shared experts and 2 experts per
task (small MLPs), a gate per task (a softmax over its own experts and the shared ones) and a
tower per task with a sigmoid; ``forward(dense, ids)`` returns a dict of [rows] tensors, one a
task, in insertion order.

A request is ``(tenant, dense, ids)``: the market drawn with a skew (the hot one, ``m0``, has
half the traffic), 20 to ``--max-rows`` candidates (the row count changes every request). The
handler moves the inputs with ``torch.from_numpy(dense).to(dev, non_blocking=True)``
(pageable) and ``torch.as_tensor(ids, device=dev)``, calls ``models[tenant](dense, ids)``
under ``torch.inference_mode()``, then blends the tasks on the device **outside** the model
and outside inference mode (``ctr * (1 + cvr)``, plus ``0.1 * dwell`` where the market has
it), takes ``torch.topk``, reads the best positions and scores with ``.cpu().numpy()`` and
the sum of the per-task means with ``.item()``.

Clients: ``asyncio.run(main())``; ``--threads`` worker coroutines take request ids from an
``asyncio.Queue`` (one ``None`` each at the end) and ``await loop.run_in_executor(pool,
handle, rid)`` on a ``ThreadPoolExecutor(max_workers=--threads)``. A short warm-up first
(2 x ``--threads`` requests of another seed, on the same pool; not timed, not in the checksum).

    python tenant_ple_serve.py --threads 8 --queries 3000
    python tenant_ple_serve.py --device cpu --queries 24 --tenants 3 --vocab 500 --max-rows 32 --top 5

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, tenants_seen (markets in the
timed window) and checksum (every request's top-k scores in request order, position-weighted,
plus 1e-6 x their positions weighted the same way, plus the sum of the requests' ``.item()``
values: the same for any thread count).
"""

import argparse
import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

FIELDS, DIM, N_DENSE, OUT = 6, 16, 10, 32
TASKS = ("ctr", "cvr", "dwell")
HOT = 0  # the market with half the traffic


def expert(d_in: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, OUT), nn.ReLU())


class PLE(nn.Module):
    def __init__(self, vocab: int, width: int, tasks, n_shared: int = 2, n_own: int = 2):
        super().__init__()
        self.tasks = tuple(tasks)
        d_in = N_DENSE + FIELDS * DIM
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(FIELDS))
        self.shared = nn.ModuleList(expert(d_in, width) for _ in range(n_shared))
        self.experts = nn.ModuleDict({t: nn.ModuleList(expert(d_in, width) for _ in range(n_own)) for t in self.tasks})
        self.gates = nn.ModuleDict({t: nn.Linear(d_in, n_own + n_shared) for t in self.tasks})
        self.towers = nn.ModuleDict({t: nn.Sequential(nn.Linear(OUT, 16), nn.ReLU(), nn.Linear(16, 1))
                                     for t in self.tasks})

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> dict:
        x = torch.cat([dense] + [e(ids[:, f]) for f, e in enumerate(self.embs)], dim=1)
        shared = [e(x) for e in self.shared]
        out = {}
        for t in self.tasks:
            ex = torch.stack([e(x) for e in self.experts[t]] + shared, dim=1)  # [rows, own + shared, OUT]
            w = torch.softmax(self.gates[t](x), dim=1).unsqueeze(2)
            out[t] = torch.sigmoid(self.towers[t]((w * ex).sum(1))).squeeze(1)
        return out


def tenant_shape(k: int):
    """Market k's expert width and tasks."""
    return (64, 128)[k % 2], TASKS if k % 3 == 0 else TASKS[:2]


def build_models(tenants: int, vocab: int, seed: int, dev="cpu") -> dict:
    models = {}
    for k in range(tenants):
        torch.manual_seed(seed + k)
        width, tasks = tenant_shape(k)
        models[f"m{k}"] = PLE(vocab, width, tasks).to(dev).eval()
    return models


def make_request(seed, rid, tenants, vocab, max_rows):
    """(tenant, dense [rows, N_DENSE] float32, ids [rows, FIELDS] int64), rows 20..max_rows."""
    rng = np.random.default_rng([seed, rid])
    p = np.full(tenants, 0.5 / max(1, tenants - 1))
    p[HOT] = 0.5 if tenants > 1 else 1.0
    k = int(rng.choice(tenants, p=p))
    n = int(rng.integers(min(20, max_rows), max_rows + 1))
    return f"m{k}", rng.standard_normal((n, N_DENSE)).astype(np.float32), rng.integers(0, vocab, (n, FIELDS))


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tenants", type=int, default=6, help="markets, one model each")
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--max-rows", type=int, default=200, help="candidates a request: 20 to this")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device(args.device)
    models = build_models(args.tenants, args.vocab, args.seed, dev)

    def handle(rid, seed=args.seed):
        tenant, dense_np, ids_np = make_request(seed, rid, args.tenants, args.vocab, args.max_rows)
        t0 = time.perf_counter()
        dense = torch.from_numpy(dense_np).to(dev, non_blocking=True)
        ids = torch.as_tensor(ids_np, device=dev)
        with torch.inference_mode():
            out = models[tenant](dense, ids)
        score = out["ctr"] * (1 + out["cvr"])  # the blend, on the device, outside the model
        if "dwell" in out:
            score = score + 0.1 * out["dwell"]
        best = torch.topk(score, min(args.top, len(ids_np)))
        top_pos, top_scores = best.indices.cpu().numpy(), best.values.cpu().numpy()
        means = torch.stack([v.mean() for v in out.values()]).sum().item()
        return tenant, top_scores, top_pos, means, (time.perf_counter() - t0) * 1e3

    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        await asyncio.gather(*[loop.run_in_executor(pool, handle, rid, args.seed + 1)
                               for rid in range(2 * args.threads)])  # warm-up
        queue: asyncio.Queue = asyncio.Queue()
        for rid in range(args.queries):
            queue.put_nowait(rid)
        for _ in range(args.threads):
            queue.put_nowait(None)
        results = {}

        async def worker():
            while (rid := await queue.get()) is not None:
                results[rid] = await loop.run_in_executor(pool, handle, rid)

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(args.threads)])
        wall = time.perf_counter() - t0

    done = [results[rid] for rid in range(args.queries)]
    scores = np.concatenate([s for _, s, _, _, _ in done]).astype(np.float64)
    pos = np.concatenate([p for _, _, p, _, _ in done]).astype(np.float64)
    checksum = float(scores @ np.linspace(1.0, 2.0, scores.size)) \
        + 1e-6 * float(pos @ np.linspace(1.0, 2.0, pos.size)) + sum(m for _, _, _, m, _ in done)
    p50, p99 = np.percentile([ms for *_, ms in done], [50, 99])
    print(json.dumps({"script": "tenant_ple_serve", "qps": round(len(done) / wall, 1),
                      "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "threads": args.threads,
                      "queries": len(done), "tenants_seen": len({t for t, *_ in done}), "checksum": checksum}),
          flush=True)


if __name__ == "__main__":
    asyncio.run(main())
