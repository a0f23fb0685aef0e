"""CTR scorer loaded from a checkpoint, frozen, and served by a thread pool with no no_grad.

Written the way a service that grew out of a training repository often is. At the top of the
program ``torch.set_grad_enabled(False)``. That setting belongs to the thread that makes it, so
it reaches the main thread only: the pool's worker threads score with gradients on. The
author froze the model anyway: it is loaded from a checkpoint (``torch.save`` of a
``state_dict`` into a temporary folder, then ``torch.load(..., weights_only=True)`` and
``load_state_dict``), and then ``model.requires_grad_(False)`` and ``model.eval()``.
Nothing requires grad, so the outputs do not either, and ``.numpy()`` works without
``.detach()``.

A request is a numpy block of dense features and a block of ids of 10 single-valued fields
(32-256 rows: each request's row count differs). The handler copies them with
``torch.as_tensor(a).cuda(non_blocking=True)`` (pageable) and reads the scores with
``.cpu().numpy()``. Requests are submitted to a ``ThreadPoolExecutor`` one by one
(``pool.submit``), and the results are collected from the futures in order.

    python frozen_pool_serve.py --threads 8 --queries 3000
    python frozen_pool_serve.py --device cpu --threads 2 --queries 24 --vocab 500 --max-rows 16

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, grad_in_workers (whether the
workers scored with gradients on: true) and checksum (every request's scores in request order,
position-weighted: the same for any thread count).
"""

import argparse
import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

torch.set_grad_enabled(False)  # (the main thread's setting only)

N_DENSE, FIELDS, DIM = 12, 10, 16


class Ranker(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(FIELDS))
        self.dense = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU())
        self.mlp = nn.Sequential(nn.Linear(64 + FIELDS * DIM, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        feats = [self.dense(dense)] + [e(ids[:, k]) for k, e in enumerate(self.embs)]
        return torch.sigmoid(self.mlp(torch.cat(feats, dim=1))).squeeze(1)


def make_request(seed, rid, vocab, max_rows):
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(max(1, max_rows // 8), max_rows + 1))
    return rng.standard_normal((n, N_DENSE)).astype(np.float32), rng.integers(0, vocab, (n, FIELDS))


def load_model(vocab: int, seed: int, dev: torch.device) -> Ranker:
    """The model as a training run would leave it: a state_dict saved to disk, loaded back."""
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ranker.pt")
        torch.save(Ranker(vocab).state_dict(), path)
        model = Ranker(vocab)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.to(dev).requires_grad_(False).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    model = load_model(args.vocab, args.seed, dev)
    grad_seen = set()

    def handle(dense_np, ids_np):
        t0 = time.perf_counter()
        dense = torch.as_tensor(dense_np)
        ids = torch.as_tensor(ids_np)
        if dev.type == "cuda":
            dense, ids = dense.cuda(non_blocking=True), ids.cuda(non_blocking=True)
        scores = model(dense, ids).cpu().numpy()
        grad_seen.add(torch.is_grad_enabled() and threading.current_thread() is not threading.main_thread())
        return scores, (time.perf_counter() - t0) * 1e3

    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for f in [pool.submit(handle, *make_request(args.seed + 1, k, args.vocab, args.max_rows))
                  for k in range(2 * args.threads)]:
            f.result()  # warm-up
        requests = [make_request(args.seed, rid, args.vocab, args.max_rows) for rid in range(args.queries)]
        t0 = time.perf_counter()
        futures = [pool.submit(handle, *req) for req in requests]
        done = [f.result() for f in futures]
        wall = time.perf_counter() - t0

    flat = np.concatenate([s for s, _ in done]).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile([ms for _, ms in done], [50, 99])
    print(json.dumps({"script": "frozen_pool_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "grad_in_workers": grad_seen == {True},
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
