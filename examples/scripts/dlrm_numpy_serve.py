"""Load test for a DLRM scoring service: client threads pull requests off a queue.

A request is one batch of impressions: 13 dense features and 26 categorical ids per sample
(Criteo-style, one id per feature), built with numpy the way the feature service hands them
over. Each client thread moves them with ``torch.from_numpy(x).cuda()``, scores the batch
under ``torch.no_grad()`` and reads the scores back with ``.cpu().numpy()``.

    python dlrm_numpy_serve.py --threads 8 --queries 4000
    python dlrm_numpy_serve.py --device cpu --threads 2 --queries 40 --batch 16 --vocab 1000

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every timed
request's scores, in request order, weighted by position: the same for any thread count).
"""

import argparse
import json
import queue
import threading
import time

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_SPARSE = 13, 26


def mlp(sizes, sigmoid=False):
    layers = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    layers[-1] = nn.Sigmoid() if sigmoid else layers[-1]
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, vocab, dim=16, bottom=(512, 256), top=(512, 256)):
        super().__init__()
        self.bottom = mlp([N_DENSE, *bottom, dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(vocab, dim, mode="sum") for _ in range(N_SPARSE))
        n = N_SPARSE + 1
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)
        self.top = mlp([dim + n * (n - 1) // 2, *top, 1], sigmoid=True)

    def forward(self, dense, ids, offsets):
        x = self.bottom(dense)
        feats = [x] + [t(ids[k], offsets) for k, t in enumerate(self.tables)]
        t = torch.stack(feats, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]  # pairwise dot interaction
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    dense = np.log1p(rng.exponential(3.0, (batch, N_DENSE))).astype(np.float32)
    ids = rng.integers(0, vocab, (N_SPARSE, batch), dtype=np.int64)
    return dense, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000, help="timed requests, all threads together")
    ap.add_argument("--warmup", type=int, default=5, help="requests per thread before timing")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    use_cuda = args.device.startswith("cuda")

    torch.manual_seed(args.seed)
    model = DLRM(args.vocab).to(args.device).eval()
    offsets_np = np.arange(args.batch, dtype=np.int64)

    def to_device(a):
        t = torch.from_numpy(a)
        return t.cuda() if use_cuda else t

    def score(dense, ids):
        with torch.no_grad():
            out = model(to_device(dense), to_device(ids), to_device(offsets_np))
        return out.cpu().numpy()

    requests = queue.Queue()
    for rid in range(args.queries):
        requests.put(rid)
    results, latencies = {}, []
    ready = threading.Barrier(args.threads + 1)

    def client(k):
        for i in range(args.warmup):
            score(*make_request(args.seed + 1, k * 1000 + i, args.batch, args.vocab))
        ready.wait()
        while True:
            try:
                rid = requests.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            results[rid] = score(*make_request(args.seed, rid, args.batch, args.vocab))
            latencies.append((time.perf_counter() - t0) * 1e3)

    workers = [threading.Thread(target=client, args=(k,), name=f"client-{k}") for k in range(args.threads)]
    for w in workers:
        w.start()
    ready.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0

    flat = np.concatenate([results[rid] for rid in range(args.queries)]).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "dlrm_numpy_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
