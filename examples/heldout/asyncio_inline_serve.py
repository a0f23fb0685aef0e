"""Multi-task (MMoE) scorer in an asyncio server that calls the model inline, on the event loop.

The way many async web services are written: every request is a coroutine on ONE event loop
(``asyncio.gather`` over ``--concurrency`` connections, each awaiting its next request from an
``asyncio.Queue`` fed by a producer). A handler awaits its feature lookup (``await
asyncio.sleep(0)`` stands for the I/O), builds the inputs with ``torch.from_numpy(a).to(dev)``
and ``torch.as_tensor(list, device=dev)``, calls the model directly (no executor, no thread:
the whole service runs on the main thread), and answers with ``.cpu().tolist()`` of each
task's scores. The model: 4 experts, 3 tasks each with its own gate and tower, many small
kernels per request (launch-bound on a GPU). Under ``torch.inference_mode()``.

    python asyncio_inline_serve.py --concurrency 16 --queries 4000
    python asyncio_inline_serve.py --device cpu --queries 24 --batch 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads (1: the loop's), concurrency, queries and
checksum (every request's scores of every task, in request order, weighted by position).
"""

import argparse
import asyncio
import json
import time

import numpy as np
import torch
import torch.nn as nn

N_IDS, N_DENSE, TASKS, EXPERTS = 8, 12, 3, 4


class MMoE(nn.Module):
    def __init__(self, vocab, dim=16, hidden=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        d_in = N_IDS * dim + N_DENSE
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
                                     for _ in range(EXPERTS))
        self.gates = nn.ModuleList(nn.Linear(d_in, EXPERTS) for _ in range(TASKS))
        self.towers = nn.ModuleList(nn.Sequential(nn.Linear(hidden, 32), nn.ReLU(), nn.Linear(32, 1))
                                    for _ in range(TASKS))

    def forward(self, ids, dense):
        x = torch.cat([self.emb(ids).flatten(1), dense], dim=1)
        ex = torch.stack([e(x) for e in self.experts], dim=1)  # [b, E, h]
        outs = []
        for gate, tower in zip(self.gates, self.towers):
            w = torch.softmax(gate(x), dim=1).unsqueeze(2)
            outs.append(torch.sigmoid(tower((w * ex).sum(1)).squeeze(1)))
        return outs


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    ids = rng.integers(0, vocab, (batch, N_IDS)).tolist()  # as the feature store returns them
    return ids, rng.random((batch, N_DENSE), dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = MMoE(args.vocab).to(dev).eval()

    async def handle(rid, seed):
        ids, dense = make_request(seed, rid, args.batch, args.vocab)
        await asyncio.sleep(0)  # the feature lookup
        t0 = time.perf_counter()
        with torch.inference_mode():
            scores = model(torch.as_tensor(ids, device=dev), torch.from_numpy(dense).to(dev))
            out = [s.cpu().tolist() for s in scores]
        return out, (time.perf_counter() - t0) * 1e3

    async def serve():
        for rid in range(3):  # warm-up
            await handle(rid, args.seed + 1)
        todo: asyncio.Queue = asyncio.Queue()
        for rid in range(args.queries):
            todo.put_nowait(rid)
        results, latencies = {}, []

        async def connection():
            while not todo.empty():
                rid = todo.get_nowait()
                results[rid], ms = await handle(rid, args.seed)
                latencies.append(ms)

        t0 = time.perf_counter()
        await asyncio.gather(*[connection() for _ in range(args.concurrency)])
        return results, latencies, time.perf_counter() - t0

    results, latencies, wall = asyncio.run(serve())
    flat = np.concatenate([np.asarray(results[rid], dtype=np.float64).ravel() for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "asyncio_inline_serve", "threads": 1, "concurrency": args.concurrency,
                      "queries": len(latencies), "qps": round(len(latencies) / wall, 1),
                      "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "checksum": checksum}),
                 flush=True)


if __name__ == "__main__":
    main()
