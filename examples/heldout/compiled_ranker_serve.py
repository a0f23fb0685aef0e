"""Ranker compiled with ``torch.compile``, served from a thread pool.

A team on PyTorch 2 compiles its model once at start-up (``--mode default`` or
``reduce-overhead``, which makes Inductor capture CUDA graphs of its own) and warms it up
on the main thread; ``--threads`` pool threads (``ThreadPoolExecutor.map``) then score
requests of a fixed size: numpy features moved with ``torch.from_numpy(a).to(dev,
non_blocking=True)``, ids with ``torch.as_tensor(ids, device=dev)``, results read with
``.cpu().numpy()``, under ``torch.no_grad()``.

    python compiled_ranker_serve.py --threads 4 --queries 3000
    python compiled_ranker_serve.py --device cpu --threads 2 --queries 24 --batch 16 --vocab 500 --mode none

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, mode and checksum (every
request's scores, in request order, weighted by position).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_IDS, N_DENSE = 6, 10


class Ranker(nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim + N_DENSE, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, ids, dense):
        return torch.sigmoid(self.mlp(torch.cat([self.emb(ids), dense], dim=1))).squeeze(1)


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    return rng.integers(0, vocab, (batch, N_IDS)), rng.standard_normal((batch, N_DENSE)).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="default", help="torch.compile mode, or none")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = Ranker(args.vocab).to(dev).eval()
    if args.mode != "none":
        model = torch.compile(model, mode=args.mode)

    def score(rid, seed=args.seed):
        ids, dense = make_request(seed, rid, args.batch, args.vocab)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model(torch.as_tensor(ids, device=dev), torch.from_numpy(dense).to(dev, non_blocking=True))
            scores = out.cpu().numpy()
        return rid, scores, (time.perf_counter() - t0) * 1e3

    for rid in range(5):  # compile and warm up on the main thread
        score(rid, args.seed + 1)

    results, latencies = {}, []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for rid, scores, ms in pool.map(score, range(args.queries)):
            results[rid] = scores
            latencies.append(ms)
    wall = time.perf_counter() - t0
    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "compiled_ranker_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "mode": args.mode, "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
