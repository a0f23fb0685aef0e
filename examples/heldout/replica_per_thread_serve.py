"""xDeepFM ranker served from a replica per worker thread, each made inside its thread.

Written the way a team that wants no two threads sharing one module serves: the model is built
once on the CPU, and the ``ThreadPoolExecutor``'s ``initializer`` (which runs in each worker
thread as it starts) makes that thread's own replica, ``copy.deepcopy(base).to(dev).eval()``,
kept in a ``threading.local()``. So **the models are created and moved to the GPU inside the
worker threads, after those threads started**, one a thread, and each request is served by the
calling thread's replica. Feature hashing runs on the device, inside ``forward``.

The model (``XDeepFM``, an ``nn.Module``, built after ``torch.manual_seed(seed)`` on the CPU, in
eval mode; PyTorch's default initializations, its modules made in this order):

* ``embs``: an ``nn.ModuleList`` of ``F`` (``--fields``, 6) ``nn.Embedding(vocab, 16)``, field 0
  first; and a buffer ``field_offset = torch.arange(F) * 7919`` (int64, no draw);
* ``cin``: an ``nn.ModuleList`` of two ``nn.Conv1d(H * F, 8, 1)`` (with bias), ``H = F`` for the
  first layer and ``H = 8`` for the second;
* ``dnn``: ``nn.Sequential(nn.Linear(F * 16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())``;
* ``wide``: ``nn.Linear(13, 1)`` over the dense features;
* ``head``: ``nn.Linear(16 + 32, 1)``.

``forward(ids, dense)`` (ids ``[rows, F]`` int64 raw ids in ``[0, 2**40)``, dense ``[rows, 13]``
float32): hashing on the device, ``idx = (ids * 1_000_003 + field_offset) % vocab`` (``field_offset``
broadcast over the rows: field ``f`` adds ``f * 7919``); ``x0 = stack([embs[f](idx[:, f]) for f],
dim=1)`` (``[rows, F, 16]``); the CIN, starting from ``h = x0``: for each layer, ``z[:, i * F + j,
:] = h[:, i, :] * x0[:, j, :]`` (``[rows, H * F, 16]``, the outer product over the field axes), ``h
= conv(z)`` (``[rows, 8, 16]``, no activation) and ``h.sum(2)`` pooled (``[rows, 8]``); ``c =
cat([pooled of layer 1, pooled of layer 2], 1)`` (``[rows, 16]``); ``d = dnn(x0.reshape(rows, F *
16))`` (``[rows, 32]``); ``score = sigmoid(head(cat([c, d], 1)) + wide(dense)).squeeze(1)``.

Requests (``--queries`` of them, made up-front): request ``rid`` is drawn from
``np.random.default_rng([seed, rid])``, in this order: ``rows = integers(16, max_rows + 1)``
(``--max-rows``, 96: **the row count changes every request**); the raw ids ``integers(0, 2**40,
(rows, F))`` (int64); the dense features ``standard_normal((rows, 13))``, as float32.

The handler (in a worker thread) takes its thread's replica, moves the ids with
``torch.from_numpy(ids).to(dev, non_blocking=True)`` (pageable) and the dense features with
``torch.as_tensor(dense, device=dev)``, calls the replica under ``torch.no_grad()`` and reads the
scores with ``.tolist()``; it adds ``id(replica)`` to a set under a lock. Clients:
``ThreadPoolExecutor(max_workers=--threads, initializer=...)``, ``pool.map(handle,
range(queries))`` (results in request order).

    python replica_per_thread_serve.py --threads 8 --queries 3000
    python replica_per_thread_serve.py --device cpu --threads 3 --queries 24 --vocab 500

The last line is JSON: script, threads, queries, qps, p50_ms, p99_ms, rows_total (the row count
over all requests), replicas (how many distinct replicas served at least one request: at most
the thread count) and checksum (every request's scores concatenated in request order, as float64,
dotted with ``np.linspace(1.0, 2.0, n)`` for ``n`` scores in all: the same for any thread count,
the replicas being copies of one model).
"""

import argparse
import copy
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

DIM, N_DENSE, CIN_MAPS, CIN_LAYERS = 16, 13, 8, 2
MIN_ROWS, ID_RANGE, HASH_MUL, FIELD_STEP = 16, 2**40, 1_000_003, 7919


class XDeepFM(nn.Module):
    def __init__(self, vocab: int, fields: int = 6):
        super().__init__()
        self.vocab, self.fields = vocab, fields
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(fields))
        self.register_buffer("field_offset", torch.arange(fields, dtype=torch.int64) * FIELD_STEP)
        self.cin = nn.ModuleList(nn.Conv1d(h * fields, CIN_MAPS, 1) for h in [fields] + [CIN_MAPS] * (CIN_LAYERS - 1))
        self.dnn = nn.Sequential(nn.Linear(fields * DIM, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.wide = nn.Linear(N_DENSE, 1)
        self.head = nn.Linear(CIN_MAPS * CIN_LAYERS + 32, 1)

    def forward(self, ids, dense):
        idx = (ids * HASH_MUL + self.field_offset) % self.vocab  # feature hashing, on the device
        x0 = torch.stack([emb(idx[:, f]) for f, emb in enumerate(self.embs)], dim=1)  # [rows, F, DIM]
        rows, h, pooled = x0.shape[0], x0, []
        for conv in self.cin:
            z = (h.unsqueeze(2) * x0.unsqueeze(1)).reshape(rows, -1, DIM)  # [rows, H * F, DIM]
            h = conv(z)  # [rows, CIN_MAPS, DIM]
            pooled.append(h.sum(2))
        d = self.dnn(x0.reshape(rows, -1))
        logit = self.head(torch.cat([*pooled, d], dim=1)) + self.wide(dense)
        return torch.sigmoid(logit).squeeze(1)


def make_request(seed: int, rid: int, fields: int, max_rows: int):
    """(raw ids int64 [rows, fields], dense float32 [rows, 13]) of request ``rid``."""
    rng = np.random.default_rng([seed, rid])
    rows = int(rng.integers(MIN_ROWS, max_rows + 1))
    ids = rng.integers(0, ID_RANGE, (rows, fields), dtype=np.int64)
    dense = rng.standard_normal((rows, N_DENSE)).astype(np.float32)
    return ids, dense


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--fields", type=int, default=6)
    ap.add_argument("--max-rows", type=int, default=96)
    args = ap.parse_args()
    if args.max_rows < MIN_ROWS or args.fields < 1 or args.vocab < 1:
        ap.error(f"need --max-rows >= {MIN_ROWS}, --fields >= 1 and --vocab >= 1")
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    base = XDeepFM(args.vocab, args.fields).eval()
    requests = [make_request(args.seed, rid, args.fields, args.max_rows) for rid in range(args.queries)]

    local = threading.local()
    lock = threading.Lock()
    served = set()

    def make_replica():  # runs in each worker thread as it starts
        local.model = copy.deepcopy(base).to(dev).eval()

    def handle(rid):
        ids, dense = requests[rid]
        model = local.model
        t0 = time.perf_counter()
        ids_t = torch.from_numpy(ids).to(dev, non_blocking=True)
        dense_t = torch.as_tensor(dense, device=dev)
        with torch.no_grad():
            scores = model(ids_t, dense_t).tolist()
        ms = (time.perf_counter() - t0) * 1e3
        with lock:
            served.add(id(model))
        return scores, ms

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads, initializer=make_replica) as pool:
        done = list(pool.map(handle, range(args.queries)))
    wall = time.perf_counter() - t0

    flat = np.asarray([s for scores, _ in done for s in scores], dtype=np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile([ms for _, ms in done], [50, 99])
    print(json.dumps({"script": "replica_per_thread_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "rows_total": int(sum(len(i) for i, _ in requests)),
                      "replicas": len(served), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
