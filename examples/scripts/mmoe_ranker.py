"""Multi-task (MMoE) ranker for a feed: click, conversion and watch time from shared experts.

Each client thread owns pinned host buffers; per request it fills them from the
request's numpy arrays and moves them with ``.to(device, non_blocking=True)``. The model
returns three heads; the service reads the best blended score with ``.item()`` (it goes
in the response header) and the per-item scores with ``.cpu()``.

    python mmoe_ranker.py --threads 8 --queries 4000
    python mmoe_ranker.py --device cpu --threads 2 --queries 40 --items 32 --vocab 1000

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every request's
best score and per-item scores, in request order, weighted by position).
"""

import argparse
import json
import threading
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_SPARSE, N_DENSE, TASKS = 16, 8, ("click", "convert", "watch")


def mlp(*sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class MMoE(nn.Module):
    def __init__(self, vocab, dim=16, n_experts=6, expert_dim=128):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(N_SPARSE))
        d_in = N_SPARSE * dim + N_DENSE
        self.experts = nn.ModuleList(mlp(d_in, 256, expert_dim) for _ in range(n_experts))
        self.gates = nn.ModuleList(nn.Linear(d_in, n_experts) for _ in TASKS)
        self.towers = nn.ModuleList(mlp(expert_dim, 64, 1) for _ in TASKS)

    def forward(self, ids, dense):
        x = torch.cat([e(ids[:, k]) for k, e in enumerate(self.emb)] + [dense], dim=1)
        experts = torch.stack([F.relu(e(x)) for e in self.experts], dim=1)         # (B, E, D)
        outs = []
        for gate, tower in zip(self.gates, self.towers):
            w = F.softmax(gate(x), dim=1).unsqueeze(-1)                             # (B, E, 1)
            outs.append(tower((w * experts).sum(dim=1)).squeeze(1))
        click, convert, watch = outs
        return torch.sigmoid(click), torch.sigmoid(convert), F.softplus(watch)


def make_request(seed, rid, items, vocab):
    rng = np.random.default_rng([seed, rid])
    ids = rng.integers(0, vocab, (items, N_SPARSE), dtype=np.int64)
    dense = rng.standard_normal((items, N_DENSE), dtype=np.float32)
    return ids, dense


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--items", type=int, default=200, help="items ranked per request")
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    pin = device.type == "cuda"

    torch.manual_seed(args.seed)
    model = MMoE(args.vocab).to(device).eval()

    local = threading.local()

    def rank(ids_np, dense_np):
        if not hasattr(local, "ids"):  # this thread's staging buffers
            local.ids = torch.empty(ids_np.shape, dtype=torch.int64, pin_memory=pin)
            local.dense = torch.empty(dense_np.shape, dtype=torch.float32, pin_memory=pin)
        local.ids.copy_(torch.from_numpy(ids_np))
        local.dense.copy_(torch.from_numpy(dense_np))
        with torch.no_grad():
            click, convert, watch = model(local.ids.to(device, non_blocking=True),
                                          local.dense.to(device, non_blocking=True))
            blended = click * convert.pow(0.5) * torch.log1p(watch)
            best = blended.max().item()
            per_item = torch.stack([click, convert, watch], dim=1).cpu()
        return best, per_item

    lock = threading.Lock()
    counter = iter(range(args.queries))
    results, latencies = {}, []

    def client():
        while True:
            with lock:
                rid = next(counter, None)
            if rid is None:
                break
            req = make_request(args.seed, rid, args.items, args.vocab)
            t0 = time.perf_counter()
            results[rid] = rank(*req)
            latencies.append((time.perf_counter() - t0) * 1e3)

    for i in range(3):  # warm-up
        rank(*make_request(args.seed + 1, i, args.items, args.vocab))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    flat = np.concatenate([np.concatenate([[best], per_item.numpy().ravel()])
                           for best, per_item in (results[rid] for rid in range(args.queries))])
    checksum = float(flat.astype(np.float64) @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "mmoe_ranker", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
