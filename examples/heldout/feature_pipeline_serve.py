"""Two-stage server: a feature thread prepares every request on the GPU, model threads score them.

A team splits its server the way a feature service and a ranking service are split: one
``--feature-threads`` stage turns each raw request into model inputs on the GPU - ids moved with
``torch.as_tensor(ids, device=dev)`` and hashed into the vocabulary there, dense features moved
with ``torch.from_numpy(a).to(dev)`` and normalized there with the training set's mean and
standard deviation (GPU tensors) - and hands the GPU tensors over a bounded ``queue.Queue`` to
``--threads`` model threads, which call the model and read the scores with ``.cpu().numpy()``.
Nothing synchronizes between the stages: on PyTorch's one default stream the model's kernels run
after the feature kernels anyway.

    python feature_pipeline_serve.py --threads 4 --queries 3000
    python feature_pipeline_serve.py --device cpu --threads 2 --queries 24 --batch 16 --vocab 500

The last line is JSON: qps, p50_ms (from the request's features being queued to its scores),
p99_ms, threads, feature_threads, queries and checksum (every request's scores, in request order,
weighted by position).
"""

import argparse
import json
import queue
import threading
import time

import numpy as np
import torch
import torch.nn as nn

N_IDS, N_DENSE, RAW_ID_SPACE = 16, 13, 2**40


class WideDeep(nn.Module):
    def __init__(self, vocab, dim=16):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="sum")
        self.wide = nn.EmbeddingBag(vocab, 1, mode="sum")
        self.deep = nn.Sequential(nn.Linear(dim + N_DENSE, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                  nn.Linear(128, 1))

    def forward(self, ids, dense):
        deep = self.deep(torch.cat([self.emb(ids), dense], dim=1))
        return torch.sigmoid(deep + self.wide(ids)).squeeze(1)


def make_request(seed, rid, batch):
    rng = np.random.default_rng([seed, rid])
    raw_ids = rng.integers(0, RAW_ID_SPACE, (batch, N_IDS))
    return raw_ids, (rng.standard_normal((batch, N_DENSE)) * 3.0 + 1.0).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=4, help="model threads")
    ap.add_argument("--feature-threads", type=int, default=1)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = WideDeep(args.vocab).to(dev).eval()
    mean = torch.full((N_DENSE,), 1.0, device=dev)
    std = torch.full((N_DENSE,), 3.0, device=dev)

    todo: queue.Queue = queue.Queue()
    for rid in range(args.queries):
        todo.put(rid)
    ready: queue.Queue = queue.Queue(maxsize=64)
    results, latencies, lock = {}, [], threading.Lock()

    def features():
        with torch.no_grad():
            while True:
                try:
                    rid = todo.get_nowait()
                except queue.Empty:
                    return
                raw_ids, dense = make_request(args.seed, rid, args.batch)
                ids = torch.remainder(torch.as_tensor(raw_ids, device=dev), args.vocab)
                x = (torch.from_numpy(dense).to(dev) - mean) / std
                ready.put((rid, ids, x, time.perf_counter()))

    def scorer():
        with torch.no_grad():
            while True:
                item = ready.get()
                if item is None:
                    return
                rid, ids, x, t0 = item
                scores = model(ids, x).cpu().numpy()
                ms = (time.perf_counter() - t0) * 1e3
                with lock:
                    results[rid] = scores
                    latencies.append(ms)

    feeders = [threading.Thread(target=features, name=f"features-{i}") for i in range(args.feature_threads)]
    scorers = [threading.Thread(target=scorer, name=f"scorer-{i}") for i in range(args.threads)]
    t0 = time.perf_counter()
    for t in feeders + scorers:
        t.start()
    for t in feeders:
        t.join()
    for _ in scorers:
        ready.put(None)
    for t in scorers:
        t.join()
    wall = time.perf_counter() - t0
    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "feature_pipeline_serve", "threads": args.threads,
                      "feature_threads": args.feature_threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
