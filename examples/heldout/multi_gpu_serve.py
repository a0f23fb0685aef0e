"""Wide&deep ranker served by one process over every GPU of the machine: a replica per GPU.

Written the way a team scales a single-process server to a multi-GPU box without a framework:
the model is built once on the CPU, ``copy.deepcopy``-ed onto each GPU, and worker thread ``k``
serves requests from a shared queue with replica ``k % n_gpus``. Each worker does what such
workers usually do at their start, ``torch.cuda.set_device(i)``, and then moves its inputs in
both styles found in the wild: the dense features with ``torch.from_numpy(a).cuda()`` (the
current device: the worker's GPU) and the ids with ``torch.as_tensor(ids, device=f"cuda:{i}")``
(an explicit device). Scores come back with ``.cpu().numpy()`` under ``torch.inference_mode()``.

The model: a wide ``EmbeddingBag(mode="sum")`` over ``N_FIELDS`` fields' ids offset into one
table, ``N_FIELDS`` field embeddings concatenated with 13 dense features, an MLP 256-128-1,
a sigmoid. Requests (``--queries`` of 64-256 rows, made up-front from ``np.random.default_rng
([seed, rid])``) are answered in any order; the checksum puts them back in request order.

    python multi_gpu_serve.py --threads 8 --queries 4000
    python multi_gpu_serve.py --device cpu --replicas 2 --threads 3 --queries 40 --vocab 500

``--replicas`` (default: every visible GPU; on the CPU, that many CPU copies) says how many
replicas to serve from. The last line is JSON: qps, p50_ms, p99_ms, threads, queries,
replicas, per_replica (requests each replica served) and checksum (every request's scores, in
request order, weighted by position: the same for any thread or replica count, the replicas
being exact copies on GPUs of one kind).
"""

import argparse
import copy
import json
import queue
import threading
import time

import numpy as np
import torch
import torch.nn as nn

N_FIELDS, N_DENSE, DIM = 10, 13, 16


class WideDeep(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.register_buffer("offsets", torch.arange(N_FIELDS) * vocab)
        self.wide = nn.EmbeddingBag(N_FIELDS * vocab, 1, mode="sum")
        self.emb = nn.Embedding(N_FIELDS * vocab, DIM)
        self.mlp = nn.Sequential(nn.Linear(N_FIELDS * DIM + N_DENSE, 256), nn.ReLU(), nn.Linear(256, 128),
                                 nn.ReLU(), nn.Linear(128, 1))

    def forward(self, ids, dense):
        idx = ids + self.offsets
        wide = self.wide(idx).squeeze(1)
        deep = self.mlp(torch.cat([self.emb(idx).flatten(1), dense], dim=1)).squeeze(1)
        return torch.sigmoid(wide + deep)


def make_request(seed, rid, vocab):
    rng = np.random.default_rng([seed, rid])
    rows = int(rng.integers(64, 257))
    ids = rng.integers(0, vocab, (rows, N_FIELDS))
    dense = rng.standard_normal((rows, N_DENSE)).astype(np.float32)
    return ids, dense


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--replicas", type=int, default=0, help="0: every visible GPU")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    gpu = args.device.startswith("cuda")
    n = args.replicas or (torch.cuda.device_count() if gpu else 1)

    torch.manual_seed(args.seed)
    base = WideDeep(args.vocab).eval()
    devices = [f"cuda:{i}" for i in range(n)] if gpu else ["cpu"] * n
    replicas = [copy.deepcopy(base).to(d) for d in devices]

    def score(i, ids, dense):
        with torch.inference_mode():
            if gpu:
                d = torch.from_numpy(dense).cuda()  # the worker's current device
                x = torch.as_tensor(ids, device=devices[i])
            else:
                d, x = torch.from_numpy(dense), torch.as_tensor(ids)
            return replicas[i](x, d).cpu().numpy()

    requests = [make_request(args.seed, rid, args.vocab) for rid in range(args.queries)]
    todo = queue.Queue()
    for rid in range(args.queries):
        todo.put(rid)
    results, latencies, served = {}, [], [0] * args.threads
    ready = threading.Barrier(args.threads + 1)

    def worker(k):
        i = k % n
        if gpu:
            torch.cuda.set_device(i)
        for w in range(3):  # warm-up: kernels picked, memory allocated on this worker's GPU
            score(i, *make_request(args.seed + 1, k * 10 + w, args.vocab))
        ready.wait()
        while True:
            try:
                rid = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            results[rid] = score(i, *requests[rid])
            latencies.append((time.perf_counter() - t0) * 1e3)
            served[k] += 1  # (one writer a slot)

    workers = [threading.Thread(target=worker, args=(k,), name=f"gpu-worker-{k}") for k in range(args.threads)]
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
    print(json.dumps({"script": "multi_gpu_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "replicas": n, "per_replica": [sum(served[i::n]) for i in range(n)],
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
