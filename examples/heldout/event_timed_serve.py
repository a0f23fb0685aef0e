"""Load test of a weighted-bag ranker that times each request on the GPU with CUDA events.

Written the way a team's own benchmark script often is: every request is timed twice, on the
host (``time.perf_counter`` around the whole request) and on the GPU (a
``torch.cuda.Event(enable_timing=True)`` pair recorded around the model call, read with
``elapsed_time`` after a device-wide ``torch.cuda.synchronize()``). The inputs are pinned per
request (``torch.from_numpy(a).pin_memory()``) and copied with ``.cuda(non_blocking=True)``.

The model pools multi-hot ids with per-id weights (``nn.EmbeddingBag(mode="sum")`` with
``per_sample_weights``: a user's category affinities) beside a dense MLP. A request holds
``--batch`` rows of 1-6 weighted ids in each of 4 fields, padded the usual way to a fixed 6
a row (2-D ids, the padding's weight 0), so every request has the same shapes.

Clients are plain ``threading.Thread`` workers taking request numbers from a shared
``itertools.count`` under a ``threading.Lock``. Scores are read with ``.cpu().numpy()``.

    python event_timed_serve.py --threads 8 --queries 3000
    python event_timed_serve.py --device cpu --threads 2 --queries 24 --batch 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, gpu_p50_ms (the events' median, null on the CPU),
threads, queries and checksum (every request's scores in request order, position-weighted:
the same for any thread count).
"""

import argparse
import itertools
import json
import threading
import time

import numpy as np
import torch
import torch.nn as nn

FIELDS, N_DENSE, DIM, MAX_IDS = 4, 8, 32, 6


class WeightedBags(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(vocab, DIM, mode="sum") for _ in range(FIELDS))
        self.dense = nn.Linear(N_DENSE, DIM)
        self.mlp = nn.Sequential(nn.Linear((FIELDS + 1) * DIM, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, ids, weights):
        pooled = [bag(ids[k], per_sample_weights=weights[k]) for k, bag in enumerate(self.bags)]
        return torch.sigmoid(self.mlp(torch.cat([torch.relu(self.dense(dense))] + pooled, dim=1))).squeeze(1)


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((batch, N_DENSE)).astype(np.float32)
    ids, weights = [], []
    for _ in range(FIELDS):
        counts = rng.integers(1, MAX_IDS + 1, batch)
        real = np.arange(MAX_IDS)[None, :] < counts[:, None]
        ids.append(np.where(real, rng.integers(0, vocab, (batch, MAX_IDS)), 0))
        weights.append(np.where(real, rng.random((batch, MAX_IDS)), 0.0).astype(np.float32))
    return dense, ids, weights


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    on_gpu = dev.type == "cuda"

    torch.manual_seed(args.seed)
    model = WeightedBags(args.vocab).to(dev).eval()

    def move(a):
        t = torch.from_numpy(a)
        return t.pin_memory().cuda(non_blocking=True) if on_gpu else t

    def score(dense, ids, weights):
        with torch.no_grad():
            args_ = (move(dense), [move(i) for i in ids], [move(w) for w in weights])
            if on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            out = model(*args_)
            gpu_ms = None
            if on_gpu:
                end.record()
                torch.cuda.synchronize()
                gpu_ms = start.elapsed_time(end)
            return out.cpu().numpy(), gpu_ms

    for rid in range(3):  # warm-up
        score(*make_request(args.seed + 1, rid, args.batch, args.vocab))

    counter, lock = itertools.count(), threading.Lock()
    results, host_ms, gpu_ms = {}, [], []

    def worker():
        while True:
            with lock:
                rid = next(counter)
            if rid >= args.queries:
                return
            req = make_request(args.seed, rid, args.batch, args.vocab)
            t0 = time.perf_counter()
            scores, g = score(*req)
            host_ms.append((time.perf_counter() - t0) * 1e3)
            if g is not None:
                gpu_ms.append(g)
            results[rid] = scores

    threads = [threading.Thread(target=worker) for _ in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    flat = np.concatenate([results[rid] for rid in range(args.queries)]).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(host_ms, [50, 99])
    print(json.dumps({"script": "event_timed_serve", "threads": args.threads, "queries": len(host_ms),
                      "qps": round(len(host_ms) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3),
                      "gpu_p50_ms": round(float(np.median(gpu_ms)), 4) if gpu_ms else None,
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
