"""Wide&deep server with a dynamic batcher of its own: clients queue requests, one thread batches them.

The way a team writes one when it wants Triton's dynamic batching without Triton: ``--threads``
client threads each send requests of 1 to ``--max-rows`` rows (numpy arrays) to a
``queue.Queue`` with a ``concurrent.futures.Future`` and wait on ``future.result()``; one batcher
thread takes the first waiting request, then whatever else arrives within ``--max-delay-ms``, up
to ``--batch-rows`` rows, stacks them with ``np.concatenate``, moves them with
``torch.from_numpy(a).to(dev)``, calls the model once, reads the scores back with
``.cpu().numpy()`` and hands each request its rows. So the model sees a different row count
almost every call, and only one thread ever calls it. Under ``torch.inference_mode()``.

    python own_batcher_serve.py --threads 16 --queries 4000
    python own_batcher_serve.py --device cpu --threads 3 --queries 40 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, batches, mean_batch_rows and
checksum (every request's scores, in request order, weighted by position). How requests are
grouped into batches depends on timing; each row's score does not, up to the floating-point
differences of matrix products of different sizes.
"""

import argparse
import json
import queue
import threading
import time
from concurrent.futures import Future

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_SPARSE = 13, 8


class WideDeep(nn.Module):
    def __init__(self, vocab, dim=16):
        super().__init__()
        self.wide = nn.EmbeddingBag(vocab, 1, mode="sum")
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.deep = nn.Sequential(nn.Linear(N_DENSE + dim, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                                  nn.Linear(64, 1))

    def forward(self, dense, ids):
        return torch.sigmoid(self.deep(torch.cat([dense, self.emb(ids)], dim=1)) + self.wide(ids)).squeeze(1)


def make_request(seed, rid, max_rows, vocab):
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(1, max_rows + 1))
    return (rng.standard_normal((n, N_DENSE)).astype(np.float32),
            rng.integers(0, vocab, (n, N_SPARSE), dtype=np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=16, help="client threads")
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--max-rows", type=int, default=32, help="rows of the largest request")
    ap.add_argument("--batch-rows", type=int, default=256, help="rows of the largest batch")
    ap.add_argument("--max-delay-ms", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = WideDeep(args.vocab).to(dev).eval()
    inbox: "queue.Queue" = queue.Queue()
    stats = {"batches": 0, "rows": 0}

    def batcher():
        with torch.inference_mode():
            while True:
                first = inbox.get()
                if first is None:
                    return
                batch, rows = [first], len(first[0])
                deadline = time.perf_counter() + args.max_delay_ms / 1e3
                while rows < args.batch_rows:
                    try:
                        nxt = inbox.get(timeout=max(0.0, deadline - time.perf_counter()))
                    except queue.Empty:
                        break
                    if nxt is None:
                        inbox.put(None)  # (seen again once this batch is served)
                        break
                    if rows + len(nxt[0]) > args.batch_rows:
                        inbox.put(nxt)  # (the next batch's first)
                        break
                    batch.append(nxt)
                    rows += len(nxt[0])
                dense = torch.from_numpy(np.concatenate([b[0] for b in batch])).to(dev)
                ids = torch.from_numpy(np.concatenate([b[1] for b in batch])).to(dev)
                scores = model(dense, ids).cpu().numpy()
                stats["batches"] += 1
                stats["rows"] += rows
                at = 0
                for d, _, fut in batch:
                    fut.set_result(scores[at:at + len(d)])
                    at += len(d)

    requests = [make_request(args.seed, rid, args.max_rows, args.vocab) for rid in range(args.queries)]
    todo: "queue.Queue[int]" = queue.Queue()
    for rid in range(args.queries):
        todo.put(rid)
    results, latencies, lock = {}, [], threading.Lock()

    def client():
        while True:
            try:
                rid = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            fut: Future = Future()
            inbox.put((*requests[rid], fut))
            scores = fut.result(timeout=60)
            ms = (time.perf_counter() - t0) * 1e3
            with lock:
                results[rid] = scores
                latencies.append(ms)

    server = threading.Thread(target=batcher, name="batcher")
    server.start()
    clients = [threading.Thread(target=client, name=f"client-{k}") for k in range(args.threads)]
    t0 = time.perf_counter()
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    wall = time.perf_counter() - t0
    inbox.put(None)
    server.join()

    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "own_batcher_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "batches": stats["batches"],
                      "mean_batch_rows": round(stats["rows"] / max(1, stats["batches"]), 1),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
