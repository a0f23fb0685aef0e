"""DLRM-style scorer whose worker pool is up before the model is on the GPU.

Written the way a service that starts fast is written: the process makes its
``ThreadPoolExecutor`` first and uses it to build the embedding tables in parallel (one
shard a worker, on the CPU, as a loader reading table shards from disk would), then moves
the model to the GPU and serves requests through the same pool. So every pool thread was
started before CUDA was initialized. A request is a numpy float32 dense block and int64 ids
(64-256 rows; most are full); the handler copies them with ``torch.as_tensor(a,
device=dev)`` and ``torch.from_numpy(a).to(dev)``, and reads the scores with
``.cpu().numpy()``, under ``torch.inference_mode()``. Clients are the pool's
``submit`` calls, ``--threads`` in flight at a time.

    python early_pool_serve.py --threads 8 --queries 4000
    python early_pool_serve.py --device cpu --threads 2 --queries 24 --rows 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, pool_threads_before_cuda (the
pool's threads alive when the model moved to the device), partial_requests and checksum
(every request's scores, in request order, weighted by position: the same for any thread
count).
"""

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_SPARSE, DIM = 13, 8, 32


class DLRM(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
        self.tables = nn.ModuleList([nn.Embedding(vocab, DIM) for _ in range(N_SPARSE)])
        n = N_SPARSE + 1
        self.top = nn.Sequential(nn.Linear(DIM + n * (n - 1) // 2, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        feats = torch.stack([x] + [t(ids[:, k]) for k, t in enumerate(self.tables)], dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], offset=1, device=dense.device)
        return torch.sigmoid(self.top(torch.cat([x, inter[:, i, j]], dim=1))).squeeze(1)


def load_shard(seed: int, k: int, vocab: int) -> np.ndarray:
    """Table ``k``'s rows, as a loader would read them from a file."""
    rng = np.random.default_rng([seed, 1000 + k])
    return (rng.standard_normal((vocab, DIM)) * 0.05).astype(np.float32)


def make_request(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    n = rows if rng.random() < 0.75 else int(rng.integers(max(1, rows // 4), rows))
    dense = rng.standard_normal((n, N_DENSE)).astype(np.float32)
    ids = rng.integers(0, vocab, (n, N_SPARSE), dtype=np.int64)
    return dense, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--rows", type=int, default=256, help="rows of the largest request")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    pool = ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="scorer")
    shards = list(pool.map(lambda k: load_shard(args.seed, k, args.vocab), range(N_SPARSE)))
    torch.manual_seed(args.seed)
    model = DLRM(args.vocab)
    with torch.no_grad():
        for table, rows in zip(model.tables, shards):
            table.weight.copy_(torch.from_numpy(rows))
    early = sum(1 for t in threading.enumerate() if t.name.startswith("scorer"))
    model = model.to(dev).eval()

    @torch.inference_mode()
    def score(dense_np, ids_np):
        t0 = time.perf_counter()
        dense = torch.from_numpy(dense_np).to(dev)
        ids = torch.as_tensor(ids_np, device=dev)
        out = model(dense, ids).cpu().numpy()
        return out, (time.perf_counter() - t0) * 1e3

    for rid in range(3):  # warm-up
        pool.submit(score, *make_request(args.seed + 1, rid, args.rows, args.vocab)).result()

    requests = [make_request(args.seed, rid, args.rows, args.vocab) for rid in range(args.queries)]
    t0 = time.perf_counter()
    futures, results, latencies = {}, {}, []
    for rid in range(args.queries):
        if len(futures) >= args.threads:  # at most --threads requests in flight
            done, _ = wait(list(futures), return_when="FIRST_COMPLETED")
            for f in done:
                results[futures.pop(f)], ms = f.result()
                latencies.append(ms)
        futures[pool.submit(score, *requests[rid])] = rid
    for f in list(futures):
        results[futures.pop(f)], ms = f.result()
        latencies.append(ms)
    wall = time.perf_counter() - t0
    pool.shutdown()

    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "early_pool_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "pool_threads_before_cuda": early,
                      "partial_requests": sum(1 for d, _ in requests if len(d) < args.rows),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
