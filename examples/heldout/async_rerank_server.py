"""Re-ranking service on asyncio: each request brings its own number of candidates (50-400).

A DIN-style model: every candidate attends over the user's recent clicks, then an MLP
scores [user, item, interest, item * interest, item features]. The request arrives as
Python lists (candidate ids, click history) and one numpy array of per-candidate
features. The handler moves the lists with ``torch.tensor(ids, dtype=torch.long).to(dev,
non_blocking=True)`` and the array with ``torch.as_tensor(feats, device=args.device)``
(``cuda:0`` by default), passes the model a dict of tensors and gets a dict back
(``ctr``, ``score``); the whole request goes through the model in one call, so the batch
size changes from call to call. It runs under ``torch.inference_mode()`` and answers with
``torch.topk(out["score"], k).indices.cpu().numpy()`` and ``out["ctr"].float().cpu()``.

The server: a producer puts requests on an ``asyncio.Queue``; ``--threads`` handler
coroutines take them and run inference with ``await loop.run_in_executor(pool, infer,
req)`` on a ``ThreadPoolExecutor`` of ``--threads`` workers.

    python async_rerank_server.py --threads 8 --queries 4000
    python async_rerank_server.py --device cpu --threads 2 --queries 24 --items 2000 --users 300

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every request's
ctr of every candidate, then its top-k positions over its number of candidates, in request order, weighted by position:
the same for any thread count).
"""

import argparse
import asyncio
import json
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_FEATS = 8


class DINRanker(nn.Module):
    def __init__(self, n_users, n_items, dim=64):
        super().__init__()
        self.dim = dim
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim, padding_idx=0)  # id 0 pads short histories
        self.query = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(4 * dim + N_FEATS, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                 nn.Linear(256, 2))

    def forward(self, features):
        items = self.item(features["items"])                                  # (n, d)
        hist = self.item(features["history"])                                 # (h, d)
        att = self.query(items) @ hist.T / math.sqrt(self.dim)                # (n, h)
        att = att.masked_fill(features["history"] == 0, float("-inf"))
        interest = F.softmax(att, dim=1) @ hist                               # (n, d)
        user = self.user(features["user"]).expand_as(items)
        x = torch.cat([user, items, interest, items * interest, features["feats"]], dim=1)
        ctr_logit, bid = self.mlp(x).unbind(dim=1)
        ctr = torch.sigmoid(ctr_logit)
        return {"ctr": ctr, "score": ctr * F.softplus(bid)}


def make_request(seed, rid, n_users, n_items, history_len):
    rnd = random.Random(seed * 1_000_003 + rid)
    n = rnd.randint(50, 400)
    clicks = [rnd.randrange(1, n_items) for _ in range(rnd.randint(1, history_len))]
    return {"rid": rid, "user": rnd.randrange(n_users), "items": rnd.sample(range(1, n_items), n),
            "history": clicks + [0] * (history_len - len(clicks)),
            "feats": np.random.default_rng([seed, rid]).random((n, N_FEATS), dtype=np.float32)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--history", type=int, default=50, help="recent clicks per user")
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=500_000)
    ap.add_argument("-k", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = DINRanker(args.users, args.items).to(dev).eval()

    def infer(req):
        with torch.inference_mode():
            features = {
                "user": torch.tensor([req["user"]], dtype=torch.long).to(dev, non_blocking=True),
                "items": torch.tensor(req["items"], dtype=torch.long).to(dev, non_blocking=True),
                "history": torch.tensor(req["history"], dtype=torch.long).to(dev, non_blocking=True),
                "feats": torch.as_tensor(req["feats"], device=args.device),
            }
            out = model(features)
            top = torch.topk(out["score"], args.k).indices.cpu().numpy()
            ctr = out["ctr"].float().cpu()
        return ctr, top

    for rid in range(3):  # warm-up
        infer(make_request(args.seed + 1, rid, args.users, args.items, args.history))

    results, latencies = {}, []

    async def handler(requests, loop, pool):
        while True:
            req = await requests.get()
            if req is None:
                return
            t0 = time.perf_counter()
            ctr, top = await loop.run_in_executor(pool, infer, req)
            # top-k positions as fractions of the candidate list: the same weight as a ctr
            results[req["rid"]] = np.concatenate([ctr.numpy().astype(np.float64), top / len(req["items"])])
            latencies.append((time.perf_counter() - t0) * 1e3)

    async def serve():
        loop = asyncio.get_running_loop()
        requests = asyncio.Queue(maxsize=4 * args.threads)
        with ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="infer") as pool:
            handlers = [asyncio.create_task(handler(requests, loop, pool)) for _ in range(args.threads)]
            for rid in range(args.queries):
                await requests.put(make_request(args.seed, rid, args.users, args.items, args.history))
            for _ in handlers:
                await requests.put(None)
            await asyncio.gather(*handlers)

    t0 = time.perf_counter()
    asyncio.run(serve())
    wall = time.perf_counter() - t0

    flat = np.concatenate([results[rid] for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "async_rerank_server", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
