"""DLRM scorer with a freshness boost that only runs when the batch holds fresh items.

A request is a batch of impressions: 13 dense features (float64, as numpy makes them),
16 categorical ids (int32) and a per-row ``fresh`` flag (the item was listed in the last
day). About 40% of requests hold fresh items. The model's ``forward`` checks ``if
fresh.sum() > 0:`` (a host synchronization inside the model) and only then runs the boost
tower over the fresh rows, so two kinds of calls alternate with the same shapes; the
warm-up replays old traffic (no fresh item), so the first calls all take one branch.

The service picks its card by index: ids go over with ``.cuda(gpu)``, flags with
``.to(gpu)`` (``gpu`` an int), the dense block with ``.to(device=dev, dtype=torch.float32)``
(converted on the way). Results are read with ``.item()`` (best score, how many fresh items
scored above 0.5) and ``.cpu().numpy()``. Clients are ``threading.Thread`` subclasses, each
serving a fixed shard of the requests (every N-th), inside one ``torch.no_grad()`` block
for the thread's whole run.

    python fresh_boost_dlrm.py --threads 8 --queries 4000
    python fresh_boost_dlrm.py --device cpu --threads 2 --queries 24 --batch 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, fresh_requests and checksum
(every request's best score, fresh count and scores, in request order, weighted by
position: the same for any thread count).
"""

import argparse
import json
import threading
import time

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_SPARSE = 13, 16


def mlp(*sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class FreshDLRM(nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.bottom = mlp(N_DENSE, 256, 128, dim)
        self.tables = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(N_SPARSE))
        n = N_SPARSE + 1
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)
        self.top = mlp(dim + n * (n - 1) // 2, 512, 256, 1)
        self.boost = mlp(2 * dim, 64, 1)  # item id embedding + dense summary, fresh rows only

    def forward(self, dense, ids, fresh):
        x = torch.relu(self.bottom(dense))
        emb = [t(ids[:, k]) for k, t in enumerate(self.tables)]
        feats = torch.stack([x] + emb, dim=1)
        z = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]
        logit = self.top(torch.cat([x, z], dim=1)).squeeze(1)
        if fresh.sum() > 0:  # most batches have no new item: skip the tower
            logit = logit + fresh * self.boost(torch.cat([emb[0], x], dim=1)).squeeze(1)
        return torch.sigmoid(logit)


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    dense = np.log1p(rng.exponential(2.0, (batch, N_DENSE)))                   # float64
    ids = rng.integers(0, vocab, (batch, N_SPARSE)).astype(np.int32)
    fresh = np.zeros(batch, dtype=np.float32)
    if rng.random() < 0.4:
        fresh[rng.choice(batch, size=max(1, batch // 10), replace=False)] = 1.0
    return dense, ids, fresh


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=256, help="impressions per request")
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    gpu = (dev.index or 0) if dev.type == "cuda" else None  # the card this process serves on

    torch.manual_seed(args.seed)
    model = FreshDLRM(args.vocab).to(dev).eval()

    def score(dense_np, ids_np, fresh_np):
        ids, fresh = torch.from_numpy(ids_np), torch.from_numpy(fresh_np)
        if gpu is not None:
            ids, fresh = ids.cuda(gpu), fresh.to(gpu)
        dense = torch.from_numpy(dense_np).to(device=dev, dtype=torch.float32)
        probs = model(dense, ids, fresh)
        best = probs.max().item()
        fresh_hits = (probs * fresh > 0.5).sum().item()
        return best, fresh_hits, probs.cpu().numpy()

    class Client(threading.Thread):
        def __init__(self, k):
            super().__init__(name=f"client-{k}")
            self.rids = range(k, args.queries, args.threads)
            self.results, self.latencies, self.fresh_requests = {}, [], 0

        def run(self):
            with torch.no_grad():
                for rid in self.rids:
                    req = make_request(args.seed, rid, args.batch, args.vocab)
                    t0 = time.perf_counter()
                    self.results[rid] = score(*req)
                    self.latencies.append((time.perf_counter() - t0) * 1e3)
                    self.fresh_requests += bool(req[2].any())

    with torch.no_grad():  # warm-up on replayed old traffic: no item is fresh any more
        for rid in range(3):
            dense, ids, fresh = make_request(args.seed + 1, rid, args.batch, args.vocab)
            score(dense, ids, np.zeros_like(fresh))

    clients = [Client(k) for k in range(args.threads)]
    t0 = time.perf_counter()
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    wall = time.perf_counter() - t0

    results = {rid: r for c in clients for rid, r in c.results.items()}
    latencies = [ms for c in clients for ms in c.latencies]
    flat = np.concatenate([np.concatenate([[best, hits], probs.astype(np.float64)])
                           for best, hits, probs in (results[rid] for rid in range(args.queries))])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "fresh_boost_dlrm", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "fresh_requests": sum(c.fresh_requests for c in clients),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
