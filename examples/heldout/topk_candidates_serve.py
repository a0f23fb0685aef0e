"""Candidate ranker that returns the best items itself: ``forward`` ends in a ``topk``.

Each request brings a user and 50 to 400 candidate items (the candidate count changes with
every request). The model scores every candidate and returns the ``--k`` best as
``(scores, positions)`` - ``torch.topk`` inside ``forward``, so the script gets the winners
without copying every score back. The script maps the positions to item ids on the host.
Inputs from numpy with ``torch.as_tensor(a, device=dev)``; results ``.cpu().numpy()``;
``ThreadPoolExecutor.map``, ``torch.no_grad()``.

    python topk_candidates_serve.py --threads 4 --queries 3000
    python topk_candidates_serve.py --device cpu --threads 2 --queries 24 --items 2000

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every request's
chosen item ids and scores, in request order, weighted by position).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

DIM, N_FEAT = 32, 8


class TopKRanker(nn.Module):
    def __init__(self, users, items, k):
        super().__init__()
        self.k = k
        self.user = nn.Embedding(users, DIM)
        self.item = nn.Embedding(items, DIM)
        self.mlp = nn.Sequential(nn.Linear(3 * DIM + N_FEAT, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, user, items, feats):
        u = self.user(user).expand(items.shape[0], -1)
        i = self.item(items)
        scores = self.mlp(torch.cat([u, i, u * i, feats], dim=1)).squeeze(1)
        return torch.topk(scores, self.k)


def make_request(seed, rid, users, items):
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(50, 401))
    return (np.array([rng.integers(0, users)]), rng.choice(items, n, replace=False),
            rng.standard_normal((n, N_FEAT)).astype(np.float32))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = TopKRanker(args.users, args.items, args.k).to(dev).eval()

    def rank(rid):
        user, items, feats = make_request(args.seed, rid, args.users, args.items)
        t0 = time.perf_counter()
        with torch.no_grad():
            best = model(torch.as_tensor(user, device=dev), torch.as_tensor(items, device=dev),
                         torch.as_tensor(feats, device=dev))
            scores, pos = best.values.cpu().numpy(), best.indices.cpu().numpy()
        return rid, items[pos], scores, (time.perf_counter() - t0) * 1e3

    results, latencies = {}, []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for rid, chosen, scores, ms in pool.map(rank, range(args.queries)):
            results[rid] = np.concatenate([chosen.astype(np.float64), scores.astype(np.float64)])
            latencies.append(ms)
    wall = time.perf_counter() - t0
    flat = np.concatenate([results[rid] for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "topk_candidates_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
