"""DLRM with multi-hot features of varying length, TorchRec-style (values + lengths).

Each request scores ``--batch`` users; each of the ``N_SPARSE`` features holds a variable
number of ids per user (0 to ``--max-len``: recent clicks, followed topics), sent the way a
``KeyedJaggedTensor`` holds them: one flat ``values`` array per feature and the per-user
``lengths``. ``forward`` turns lengths into offsets on the GPU (``torch.cumsum``) and pools
each feature with ``F.embedding_bag(mode="sum")``, so the number of ids, and the shape of
every ``values`` tensor, changes with every request while the batch stays the same.

Inputs from numpy: ``torch.from_numpy(a).to(dev, non_blocking=True)`` for the dense block,
``torch.as_tensor(values, device=dev)`` and ``torch.tensor(lengths.tolist(), device=dev)`` per
feature (a list of tensors passed as one argument); results ``.cpu().numpy()``;
``threading.Thread`` workers pulling request ids from a ``queue.Queue``, ``torch.no_grad()``.

    python jagged_dlrm_serve.py --threads 4 --queries 3000
    python jagged_dlrm_serve.py --device cpu --threads 2 --queries 24 --batch 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, ids (the mean number of ids a
request) and checksum (every request's scores, in request order, weighted by position).
"""

import argparse
import json
import queue
import threading
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_SPARSE, N_DENSE, DIM = 6, 13, 32


class JaggedDLRM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(vocab, DIM) * 0.05) for _ in range(N_SPARSE))
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
        n_int = (N_SPARSE + 1) * N_SPARSE // 2
        self.top = nn.Sequential(nn.Linear(DIM + n_int, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, values, lengths):
        x = self.bottom(dense)
        pooled = []
        for w, v, n in zip(self.weights, values, lengths):
            offsets = torch.cat([n.new_zeros(1), torch.cumsum(n, 0)[:-1]])
            pooled.append(F.embedding_bag(v, w, offsets, mode="sum"))
        z = torch.stack([x] + pooled, dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.tril_indices(N_SPARSE + 1, N_SPARSE + 1, offset=-1, device=z.device)
        return torch.sigmoid(self.top(torch.cat([x, inter[:, i, j]], dim=1))).squeeze(1)


def make_request(seed, rid, batch, vocab, max_len):
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((batch, N_DENSE)).astype(np.float32)
    lengths = [rng.integers(0, max_len + 1, batch) for _ in range(N_SPARSE)]
    values = [rng.integers(0, vocab, int(n.sum())) for n in lengths]
    return dense, values, lengths


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = JaggedDLRM(args.vocab).to(dev).eval()

    todo: queue.Queue = queue.Queue()
    for rid in range(args.queries):
        todo.put(rid)
    results, latencies, n_ids, lock = {}, [], [], threading.Lock()

    def worker():
        with torch.no_grad():
            while True:
                try:
                    rid = todo.get_nowait()
                except queue.Empty:
                    return
                dense, values, lengths = make_request(args.seed, rid, args.batch, args.vocab, args.max_len)
                t0 = time.perf_counter()
                out = model(torch.from_numpy(dense).to(dev, non_blocking=True),
                            [torch.as_tensor(v, device=dev) for v in values],
                            [torch.tensor(n.tolist(), device=dev) for n in lengths])
                scores = out.cpu().numpy()
                ms = (time.perf_counter() - t0) * 1e3
                with lock:
                    results[rid] = scores
                    latencies.append(ms)
                    n_ids.append(sum(len(v) for v in values))

    threads = [threading.Thread(target=worker, name=f"jagged-{i}") for i in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "jagged_dlrm_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "ids": round(float(np.mean(n_ids)), 1),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
