"""Two-tower candidate retrieval served from an asyncio front end.

The item tower embeds the whole catalog once at start-up; the matrix stays on the device.
Per request (a few users with their last-N clicked items, as Python lists from the
session store), the handler builds ``torch.tensor(list_of_ids, device=dev)``, runs the
query tower, scores the catalog with one matmul and returns ``torch.topk(scores, k).indices``
moved to the host with ``.cpu()``. The asyncio loop hands each request to a thread pool
with ``loop.run_in_executor``.

    python two_tower_retrieval.py --threads 8 --queries 6000
    python two_tower_retrieval.py --device cpu --threads 2 --queries 40 --items 2000 --users 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every returned
item id in request order, weighted by position).
"""

import argparse
import asyncio
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Tower(nn.Module):
    def __init__(self, d_in, dim):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d_in, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, dim))

    def forward(self, x):
        return F.normalize(self.mlp(x), dim=-1)


class QueryTower(nn.Module):
    def __init__(self, n_users, item_emb, dim):
        super().__init__()
        self.user = nn.Embedding(n_users, 32)
        self.item_emb = item_emb  # shared with the item tower
        self.tower = Tower(32 + item_emb.embedding_dim, dim)

    def forward(self, user_ids, history):
        mask = (history > 0).unsqueeze(-1).float()  # id 0 pads short histories
        hist = (self.item_emb(history) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.tower(torch.cat([self.user(user_ids), hist], dim=1))


def session(seed, rid, users_per_request, n_users, n_items, history_len):
    rnd = random.Random(seed * 1_000_003 + rid)
    users = [rnd.randrange(n_users) for _ in range(users_per_request)]
    history = []
    for _ in users:
        clicks = [rnd.randrange(1, n_items) for _ in range(rnd.randint(1, history_len))]
        history.append(clicks + [0] * (history_len - len(clicks)))
    return users, history


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=6000)
    ap.add_argument("--users-per-request", type=int, default=16)
    ap.add_argument("--history", type=int, default=20, help="last-N clicked items per user")
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("-k", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    item_emb = nn.Embedding(args.items, 48, padding_idx=0)
    item_tower = Tower(48, args.dim).to(dev).eval()
    query_tower = QueryTower(args.users, item_emb, args.dim).to(dev).eval()
    with torch.no_grad():
        catalog = torch.cat([item_tower(query_tower.item_emb(ids))
                             for ids in torch.arange(args.items, device=dev).split(65536)])

    def retrieve(users, history):
        with torch.no_grad():
            q = query_tower(torch.tensor(users, device=dev), torch.tensor(history, device=dev))
            scores = q @ catalog.T
            return torch.topk(scores, args.k, dim=1).indices.cpu()

    def request(rid):
        return session(args.seed, rid, args.users_per_request, args.users, args.items, args.history)

    for rid in range(-3, 0):  # warm-up
        retrieve(*request(rid))

    results, latencies = {}, []

    async def client(pending):
        loop = asyncio.get_running_loop()
        while pending:
            rid = pending.pop()
            users, history = request(rid)
            t0 = time.perf_counter()
            results[rid] = await loop.run_in_executor(None, retrieve, users, history)
            latencies.append((time.perf_counter() - t0) * 1e3)

    async def serve():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=args.threads))
        pending = list(range(args.queries - 1, -1, -1))
        await asyncio.gather(*(client(pending) for _ in range(args.threads)))

    t0 = time.perf_counter()
    asyncio.run(serve())
    wall = time.perf_counter() - t0

    ids = torch.cat([results[rid].flatten() for rid in range(args.queries)]).numpy().astype(np.float64)
    checksum = float(ids @ np.linspace(1.0, 2.0, ids.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "two_tower_retrieval", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
