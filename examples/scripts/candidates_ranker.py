"""Second-stage ranker: every request brings its own number of candidates (50-400).

The retrieval stage hands over a user and a variable-length candidate list; the ranker
scores it in GPU batches of at most ``--max-batch`` rows, so most requests end with a
partial batch. The model takes host tensors and moves them itself (``.to("cuda")``
inside ``forward``), as the team's model class always has. Requests are submitted to a
``ThreadPoolExecutor`` and collected with ``as_completed``.

    python candidates_ranker.py --threads 8 --queries 3000
    python candidates_ranker.py --device cpu --threads 2 --queries 40 --items 5000

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every
candidate's score, in request and candidate order, weighted by position).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import torch
import torch.nn as nn

N_DENSE = 6


class CandidateRanker(nn.Module):
    def __init__(self, n_users, n_items, n_cats, device, dim=32):
        super().__init__()
        self.device = device
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        self.cat = nn.Embedding(n_cats, 8)
        self.mlp = nn.Sequential(nn.Linear(3 * dim + 8 + N_DENSE, 256), nn.ReLU(),
                                 nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, user, items, cats, dense):
        user, items = user.to(self.device), items.to(self.device)
        cats, dense = cats.to(self.device), dense.to(self.device)
        u = self.user(user).expand(items.shape[0], -1)
        i = self.item(items)
        x = torch.cat([u, i, u * i, self.cat(cats), dense], dim=1)
        return torch.sigmoid(self.mlp(x)).squeeze(1)


def candidates(seed, rid, n_users, n_items, n_cats):
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(50, 401))
    items = rng.choice(n_items, size=n, replace=False)
    return {"user": np.array([rng.integers(n_users)]), "items": items, "cats": items % n_cats,
            "dense": rng.random((n, N_DENSE), dtype=np.float32)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--max-batch", type=int, default=128, help="rows per forward")
    ap.add_argument("--users", type=int, default=500_000)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--categories", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model = CandidateRanker(args.users, args.items, args.categories, args.device).to(args.device).eval()

    def rank(req):
        user = torch.from_numpy(req["user"])
        items, cats = torch.from_numpy(req["items"]), torch.from_numpy(req["cats"])
        dense = torch.from_numpy(req["dense"])
        scores = []
        with torch.no_grad():
            for s in range(0, len(items), args.max_batch):
                e = s + args.max_batch
                scores.append(model(user, items[s:e], cats[s:e], dense[s:e]).cpu())
        scores = torch.cat(scores)
        return scores, items[torch.argsort(scores, descending=True)[:20]]

    def handle(rid):
        req = candidates(args.seed, rid, args.users, args.items, args.categories)
        t0 = time.perf_counter()
        scores, _top20 = rank(req)
        return rid, scores, (time.perf_counter() - t0) * 1e3

    for rid in range(3):  # warm-up
        rank(candidates(args.seed + 1, rid, args.users, args.items, args.categories))

    results, latencies = {}, []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for fut in as_completed([pool.submit(handle, rid) for rid in range(args.queries)]):
            rid, scores, ms = fut.result()
            results[rid] = scores
            latencies.append(ms)
    wall = time.perf_counter() - t0

    flat = torch.cat([results[rid] for rid in range(args.queries)]).double().numpy()
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "candidates_ranker", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
