"""DeepFM scorer on a pool of worker processes (to get around the GIL), each with two threads.

The parent process builds the request stream and hands request ids to ``--procs`` worker
processes started with ``multiprocessing.get_context("spawn")`` over a ``Queue``; each
worker builds the model from the same seed on its own CUDA context, runs ``--threads``
serving threads (``concurrent.futures.ThreadPoolExecutor``) that take ids from the queue,
rebuild the request from its id, move it with ``torch.from_numpy(a).to(dev)`` and
``torch.as_tensor(ids, device=dev)``, score it under ``torch.inference_mode()`` and send
``(rid, scores.cpu().numpy(), ms)`` back over a result ``Queue``. The clock starts once every
worker has warmed up and said so; a ``None`` per thread stops the workers.

    python mp_pool_serve.py --procs 2 --threads 2 --queries 4000
    python mp_pool_serve.py --device cpu --procs 2 --threads 2 --queries 24 --batch 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, procs, threads (per process), queries and
checksum (every request's scores, in request order, weighted by position: the same for any
process or thread count).
"""

import argparse
import json
import multiprocessing as mp
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_FIELDS, N_DENSE = 20, 8


class DeepFM(nn.Module):
    def __init__(self, vocab, dim=16):
        super().__init__()
        self.first = nn.Embedding(vocab, 1)
        self.emb = nn.Embedding(vocab, dim)
        self.dense = nn.Linear(N_DENSE, dim)
        self.dnn = nn.Sequential(nn.Linear((N_FIELDS + 1) * dim, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                                 nn.Linear(200, 1))

    def forward(self, ids, dense):
        e = torch.cat([self.emb(ids), self.dense(dense).unsqueeze(1)], dim=1)  # [b, F+1, d]
        fm = 0.5 * (e.sum(1).pow(2) - e.pow(2).sum(1)).sum(1)
        return torch.sigmoid(self.first(ids).sum((1, 2)) + fm + self.dnn(e.flatten(1)).squeeze(1))


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    return rng.integers(0, vocab, (batch, N_FIELDS)), rng.random((batch, N_DENSE), dtype=np.float32)


def worker(args, todo, done):
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = DeepFM(args.vocab).to(dev).eval()

    def score(rid, seed):
        ids, dense = make_request(seed, rid, args.batch, args.vocab)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model(torch.as_tensor(ids, device=dev), torch.from_numpy(dense).to(dev))
            scores = out.cpu().numpy()
        return scores, (time.perf_counter() - t0) * 1e3

    for rid in range(3):  # warm-up on this process's context
        score(rid, args.seed + 1)
    done.put("ready")

    def serve():
        while True:
            rid = todo.get()
            if rid is None:
                return
            scores, ms = score(rid, args.seed)
            done.put((rid, scores, ms))

    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for f in [pool.submit(serve) for _ in range(args.threads)]:
            f.result()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="serving threads per process")
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    todo, done = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(args, todo, done), name=f"scorer-{p}") for p in range(args.procs)]
    for p in procs:
        p.start()
    for _ in procs:  # every worker warmed up
        assert done.get() == "ready"
    t0 = time.perf_counter()
    for rid in range(args.queries):
        todo.put(rid)
    for _ in range(args.procs * args.threads):
        todo.put(None)
    results, latencies = {}, []
    for _ in range(args.queries):
        rid, scores, ms = done.get()
        results[rid] = scores
        latencies.append(ms)
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"worker {p.name} exited with {p.exitcode}")

    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "mp_pool_serve", "procs": args.procs, "threads": args.threads,
                      "queries": len(latencies), "qps": round(len(latencies) / wall, 1),
                      "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "checksum": checksum}),
                 flush=True)


if __name__ == "__main__":
    main()
