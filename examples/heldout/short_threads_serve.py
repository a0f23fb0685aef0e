"""Wide&deep scorer whose serving threads live for one request, or for one wave of them.

Written the way a small HTTP-style service is often written: ``--spawn request`` starts a
new ``threading.Thread`` for every request (as ``socketserver.ThreadingMixIn`` does for
every connection), at most ``--threads`` alive at once (a ``BoundedSemaphore``); ``--spawn
wave`` makes a new ``ThreadPoolExecutor(--threads)`` for every ``--wave`` requests (``with
ThreadPoolExecutor(...) as pool: pool.map(...)`` inside the loop). No serving thread lives
long. A request is a numpy float32 dense block and int64 ids (32-128 rows; most are
full); the handler copies them with ``torch.tensor(a, device=dev)`` and
``torch.from_numpy(a).cuda()``-style ``.to(dev)``, and reads the scores with ``.tolist()``,
under ``torch.no_grad()``.

    python short_threads_serve.py --threads 8 --queries 4000
    python short_threads_serve.py --device cpu --threads 2 --queries 24 --rows 16 --vocab 500 --spawn wave

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, spawn, threads_started (the
threads that served a timed request), partial_requests and checksum (every request's scores, in
request order, weighted by position: the same for any thread count and either spawn mode).
"""

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_DENSE, FIELDS, DIM = 16, 6, 24


class WideDeep(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.wide = nn.EmbeddingBag(vocab * FIELDS, 1, mode="sum")
        self.embs = nn.ModuleList([nn.Embedding(vocab, DIM) for _ in range(FIELDS)])
        self.deep = nn.Sequential(nn.Linear(N_DENSE + FIELDS * DIM, 256), nn.ReLU(),
                                  nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))
        self.register_buffer("field_base", torch.arange(FIELDS) * vocab)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        wide = self.wide(ids + self.field_base)  # each row's ids, one bag a row
        deep = self.deep(torch.cat([dense] + [e(ids[:, k]) for k, e in enumerate(self.embs)], dim=1))
        return torch.sigmoid(wide + deep).squeeze(1)


def make_request(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    n = rows if rng.random() < 0.8 else int(rng.integers(max(1, rows // 4), rows))
    dense = rng.standard_normal((n, N_DENSE)).astype(np.float32)
    ids = rng.integers(0, vocab, (n, FIELDS), dtype=np.int64)
    return dense, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8, help="serving threads alive at once")
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--spawn", choices=("request", "wave"), default="request",
                    help="a new thread per request, or a new pool per wave of requests")
    ap.add_argument("--wave", type=int, default=32, help="requests per pool (--spawn wave)")
    ap.add_argument("--rows", type=int, default=128, help="rows of the largest request")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = WideDeep(args.vocab).to(dev).eval()
    results, latencies, names = {}, [], set()

    def handle(rid, dense_np, ids_np):
        t0 = time.perf_counter()
        with torch.no_grad():
            dense = torch.tensor(dense_np, device=dev)
            ids = torch.from_numpy(ids_np).to(dev)
            scores = model(dense, ids).tolist()
        results[rid] = scores
        latencies.append((time.perf_counter() - t0) * 1e3)
        names.add(threading.current_thread().name)

    for rid in range(3):  # warm-up, on the main thread
        handle(-1 - rid, *make_request(args.seed + 1, rid, args.rows, args.vocab))
    latencies.clear()
    names.clear()

    requests = [make_request(args.seed, rid, args.rows, args.vocab) for rid in range(args.queries)]
    t0 = time.perf_counter()
    if args.spawn == "request":
        slots = threading.BoundedSemaphore(args.threads)

        def one(rid):
            try:
                handle(rid, *requests[rid])
            finally:
                slots.release()

        threads = []
        for rid in range(args.queries):
            slots.acquire()
            t = threading.Thread(target=one, args=(rid,), name=f"request-{rid}")
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    else:
        for lo in range(0, args.queries, args.wave):
            ids = range(lo, min(args.queries, lo + args.wave))
            with ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix=f"wave{lo}") as pool:
                list(pool.map(lambda rid: handle(rid, *requests[rid]), ids))
    wall = time.perf_counter() - t0

    flat = np.concatenate([np.asarray(results[rid], dtype=np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "short_threads_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "spawn": args.spawn, "threads_started": len(names),
                      "partial_requests": sum(1 for d, _ in requests if len(d) < args.rows),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
