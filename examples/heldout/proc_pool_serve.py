"""Ranker served by a ``multiprocessing.Pool``: each worker process scores on its main thread.

The way a team that has given up on threads (the GIL) writes it: a ``spawn`` pool of
``--procs`` processes, each building the model from the same seed in its initializer on its
own CUDA context and warming it up. The parent sends each request's numpy arrays with
``pool.imap(score, requests, chunksize=1)``; a worker moves them with
``torch.from_numpy(a).to(dev)`` and ``torch.as_tensor(ids, device=dev)``, scores them under
``torch.no_grad()`` on its main thread (no thread of its own) and returns
``scores.cpu().numpy()`` and the time it took. Requests hold 32 to 128 rows.

    python proc_pool_serve.py --procs 4 --queries 4000
    python proc_pool_serve.py --device cpu --procs 2 --queries 24 --rows 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, procs, queries, partial_requests and checksum
(every request's scores, in request order, weighted by position: the same for any process
count).
"""

import argparse
import json
import multiprocessing as mp
import time

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_FIELDS, HOT = 10, 6, 4

_model = None
_dev = None


class Ranker(nn.Module):
    """Multi-hot fields pooled by EmbeddingBag, concatenated with a dense projection, an MLP."""

    def __init__(self, vocab: int, dim: int = 24):
        super().__init__()
        self.bags = nn.ModuleList([nn.EmbeddingBag(vocab, dim, mode="mean") for _ in range(N_FIELDS)])
        self.dense = nn.Linear(N_DENSE, dim)
        self.mlp = nn.Sequential(nn.Linear((N_FIELDS + 1) * dim, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        pooled = [bag(ids[:, k]) for k, bag in enumerate(self.bags)]  # ids: [rows, fields, HOT]
        return torch.sigmoid(self.mlp(torch.cat([self.dense(dense), *pooled], dim=1))).squeeze(1)


def make_request(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    n = rows if rng.random() < 0.7 else int(rng.integers(max(1, rows // 4), rows))
    return rng.standard_normal((n, N_DENSE)).astype(np.float32), rng.integers(0, vocab, (n, N_FIELDS, HOT))


def init(device: str, vocab: int, seed: int, rows: int, ready) -> None:
    global _model, _dev
    _dev = torch.device(device)
    torch.manual_seed(seed)
    _model = Ranker(vocab).to(_dev).eval()
    for rid in range(3):  # warm-up on this process's context
        score(make_request(seed + 1, rid, rows, vocab))
    ready.wait()  # (the clock starts once every worker is warm)


def score(request):
    dense, ids = request
    t0 = time.perf_counter()
    with torch.no_grad():
        out = _model(torch.from_numpy(dense).to(_dev), torch.as_tensor(ids, device=_dev))
        scores = out.cpu().numpy()
    return scores, (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--rows", type=int, default=128, help="rows of the largest request")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    requests = [make_request(args.seed, rid, args.rows, args.vocab) for rid in range(args.queries)]
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(args.procs + 1)
    with ctx.Pool(args.procs, initializer=init, initargs=(args.device, args.vocab, args.seed, args.rows, ready)) as pool:
        ready.wait(timeout=600)
        t0 = time.perf_counter()
        out = list(pool.imap(score, requests, chunksize=1))
        wall = time.perf_counter() - t0

    flat = np.concatenate([s.astype(np.float64) for s, _ in out])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    latencies = [ms for _, ms in out]
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "proc_pool_serve", "procs": args.procs, "queries": len(out),
                      "qps": round(len(out) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3),
                      "partial_requests": sum(1 for d, _ in requests if len(d) < args.rows),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
