"""Two-stage recommender: a retrieval model picks candidates, a ranking model orders them.

Written the way a feed's serving path often is: every request runs two models, one after the
other, on the GPU. The retrieval tower embeds the user (dense features and recent item ids,
both numpy) and scores every item of the catalogue (``item_emb @ u``); the script masks the
items the user has already seen, in place on that output (``scores[seen] = -inf``, the seen ids
a Python list moved with ``torch.tensor(seen, device=dev)``), and keeps the ``--retrieve`` best
with ``torch.topk``. The ranker then scores those candidates (their ids: GPU tensors that never
left the device) against the user's features, and the script reads the ``--top`` best ids and
scores with ``.tolist()``. Clients are ``ThreadPoolExecutor(--threads).submit`` futures,
under ``torch.no_grad()``.

    python cascade_serve.py --threads 8 --queries 3000
    python cascade_serve.py --device cpu --threads 2 --queries 24 --items 600 --retrieve 40 --top 8

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every request's top
ids and scores, in request order, position-weighted: the same for any thread count).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_DENSE, HIST, DIM = 12, 20, 32


class Retrieval(nn.Module):
    """User tower against a catalogue of item embeddings: one score per item."""

    def __init__(self, items: int):
        super().__init__()
        self.hist = nn.EmbeddingBag(items, DIM, mode="mean")
        self.user = nn.Sequential(nn.Linear(N_DENSE + DIM, 128), nn.ReLU(), nn.Linear(128, DIM))
        self.items = nn.Parameter(torch.randn(items, DIM) * 0.1)

    def forward(self, dense: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        u = self.user(torch.cat([dense, self.hist(history)], dim=1))  # [1, DIM]
        return (self.items @ u.squeeze(0)).contiguous()  # [items]


class Ranker(nn.Module):
    """Scores the retrieved candidates with the user's features: an MLP over both."""

    def __init__(self, items: int):
        super().__init__()
        self.item = nn.Embedding(items, DIM)
        self.mlp = nn.Sequential(nn.Linear(N_DENSE + 2 * DIM, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                 nn.Linear(64, 1))
        self.hist = nn.EmbeddingBag(items, DIM, mode="sum")

    def forward(self, dense: torch.Tensor, history: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        n = cand.shape[0]
        user = torch.cat([dense, self.hist(history)], dim=1).expand(n, -1)
        return self.mlp(torch.cat([user, self.item(cand)], dim=1)).squeeze(1)


def make_request(seed, rid, items):
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((1, N_DENSE)).astype(np.float32)
    history = rng.integers(0, items, (1, HIST), dtype=np.int64)
    seen = sorted({int(i) for i in history[0]})  # a Python list, as a session store returns it
    return dense, history, seen


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--items", type=int, default=50_000, help="catalogue size")
    ap.add_argument("--retrieve", type=int, default=256, help="candidates the retrieval stage keeps")
    ap.add_argument("--top", type=int, default=20, help="items a request returns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    retrieval = Retrieval(args.items).to(dev).eval()
    ranker = Ranker(args.items).to(dev).eval()

    def recommend(req):
        dense_np, hist_np, seen = req
        t0 = time.perf_counter()
        with torch.no_grad():
            dense = torch.from_numpy(dense_np).to(dev)
            history = torch.from_numpy(hist_np).to(dev)
            scores = retrieval(dense, history)
            scores[torch.tensor(seen, device=dev)] = float("-inf")  # never recommend what was seen
            cand = torch.topk(scores, args.retrieve).indices
            ranked = ranker(dense, history, cand)
            best = torch.topk(ranked, args.top)
            out = (cand[best.indices].tolist(), best.values.tolist())
        return out, (time.perf_counter() - t0) * 1e3

    for rid in range(3):  # warm-up
        recommend(make_request(args.seed + 1, rid, args.items))
    requests = [make_request(args.seed, rid, args.items) for rid in range(args.queries)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        futures = [pool.submit(recommend, r) for r in requests]
        done = [f.result() for f in futures]
    wall = time.perf_counter() - t0

    ids = np.array([i for (top_ids, _), _ in done for i in top_ids], dtype=np.float64)
    vals = np.array([v for (_, top_vals), _ in done for v in top_vals], dtype=np.float64)
    w = np.linspace(1.0, 2.0, ids.size)
    checksum = float(ids @ w) * 1e-6 + float(vals @ w)
    lat = [ms for _, ms in done]
    p50, p99 = np.percentile(lat, [50, 99])
    print(json.dumps({"script": "cascade_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1), "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
