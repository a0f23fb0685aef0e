"""Two-tower retrieval scorer served by a ``concurrent.futures.ProcessPoolExecutor`` of worker processes.

The way a team that moved from ``multiprocessing.Pool`` to ``concurrent.futures`` writes it: a
``ProcessPoolExecutor(max_workers=--procs, mp_context=multiprocessing.get_context("spawn"),
initializer=init, initargs=(device, vocab, seed, barrier))``. The initializer builds the model in
each worker from the same seed (``torch.manual_seed(seed)`` on the CPU, then the model, then
``.to(device).eval()``), keeps it in a module global and warms it up with two requests of seed
``seed + 1`` (scored and thrown away). Workers are spawned as tasks are submitted, so the parent
first submits ``--procs`` ``ready`` tasks, each waiting on a ``--procs``-party barrier (given to the
workers through ``initargs``): every worker is started and warm before the clock starts. Then the
parent submits every request with ``executor.map(score, requests, chunksize=4)`` (results in
request order); ``score`` runs on the worker's main thread (no thread of its own), moves the numpy
arrays with ``torch.from_numpy(a).to(dev)`` and the request's offsets, a Python list, with
``torch.tensor(offsets, device=dev)``, calls the model under ``torch.no_grad()``, and returns
``(topk_values.cpu().numpy(), topk_indices.cpu().numpy(), ms)`` (``ms``: the time it took). The
``with ProcessPoolExecutor(...)`` block ends normally: ``shutdown(wait=True)``, the workers exit
on their own (unlike a ``Pool``'s ``terminate()``).

The model (``TwoTower``, an ``nn.Module``; PyTorch's default initializations, its modules made in
this order, nothing re-drawn):

* ``user.bags``: an ``nn.ModuleList`` of 3 ``nn.EmbeddingBag(vocab, 32, mode="sum")``, field 0
  first;
* ``user.dense``: ``nn.Sequential(nn.Linear(8, 32), nn.ReLU())`` over the 8 dense features;
* ``user.mlp``: ``nn.Sequential(nn.Linear(4 * 32, 64), nn.ReLU(), nn.Linear(64, 32))``;
* ``item.emb``: ``nn.Embedding(vocab, 32)``;
* ``item.mlp``: ``nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))``.

``forward(dense, values, offsets, items)`` (dense ``[1, 8]`` float32; values int64, the three
fields' ids concatenated, field 0 first; offsets ``[3]`` int64, each field's start in values;
items ``[c]`` int64 candidate ids): field ``f``'s vector is row ``f`` of ``user.bags[f](values,
offsets)`` (the sum of table ``f``'s rows at field ``f``'s ids); ``u = user.mlp(cat([field 0,
field 1, field 2, user.dense(dense)], 1))`` (``[1, 32]``); ``v = item.mlp(item.emb(items))``
(``[c, 32]``); ``scores = (F.normalize(u, dim=1) @ F.normalize(v, dim=1).T)[0]`` (cosines,
``[c]``); returns ``torch.topk(scores, 10)`` (the 10 best scores, best first, and their positions
among the request's candidates).

Requests (``--queries`` of them, made up-front by the parent): request ``rid`` is drawn from
``np.random.default_rng([seed, rid])``, in this order: the dense features ``standard_normal((1,
8))`` as float32; for field 0, 1, 2 in turn its id count ``integers(1, 7)`` then its ids
``integers(0, vocab, count)`` (int64); the candidate count ``integers(50, 301)``; the candidates
``choice(vocab, count, replace=False)`` (distinct ids, int64: **the candidate count changes every
request**). The offsets are ``[0, n0, n0 + n1]`` for id counts ``n0, n1``. One user a request;
``--vocab`` must be at least 300.

    python executor_procs_serve.py --procs 4 --queries 3000
    python executor_procs_serve.py --device cpu --procs 2 --queries 24 --vocab 500

The last line is JSON: script, procs, queries, qps, p50_ms, p99_ms, candidates_total (the
candidate count over all requests) and checksum: every request's 10 top-k values concatenated in
request order, as float64, dotted with ``np.linspace(1.0, 2.0, n)`` for ``n`` values in all, plus
the sum of every top-k position as a float (so both the scores and the chosen candidates count;
the same for any process count, each request scored alone; the weights are continuous and the
candidates distinct, so no two scores tie).
"""

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FIELDS, N_DENSE, DIM, HIDDEN, K = 3, 8, 32, 64, 10
MIN_IDS, MAX_IDS, MIN_CANDS, MAX_CANDS = 1, 6, 50, 300

_model = None
_dev = None
_barrier = None


class UserTower(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(vocab, DIM, mode="sum") for _ in range(FIELDS))
        self.dense = nn.Sequential(nn.Linear(N_DENSE, DIM), nn.ReLU())
        self.mlp = nn.Sequential(nn.Linear((FIELDS + 1) * DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DIM))

    def forward(self, dense: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        fields = [bag(values, offsets)[f:f + 1] for f, bag in enumerate(self.bags)]  # field f through table f
        return self.mlp(torch.cat([*fields, self.dense(dense)], dim=1))


class ItemTower(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DIM))

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(items))


class TwoTower(nn.Module):
    """Cosine of a user tower (multi-hot bags and dense features) and an item tower; the top 10."""

    def __init__(self, vocab: int):
        super().__init__()
        self.user = UserTower(vocab)
        self.item = ItemTower(vocab)

    def forward(self, dense, values, offsets, items):
        u = F.normalize(self.user(dense, values, offsets), dim=1)
        v = F.normalize(self.item(items), dim=1)
        return torch.topk((u @ v.T)[0], K)


def make_request(seed: int, rid: int, vocab: int):
    """(dense float32 [1, 8], values int64, offsets list of 3 ints, candidates int64) of request ``rid``."""
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((1, N_DENSE)).astype(np.float32)
    fields = []
    for _ in range(FIELDS):
        n = int(rng.integers(MIN_IDS, MAX_IDS + 1))
        fields.append(rng.integers(0, vocab, n, dtype=np.int64))
    n_cand = int(rng.integers(MIN_CANDS, MAX_CANDS + 1))
    candidates = rng.choice(vocab, n_cand, replace=False).astype(np.int64)
    offsets = np.cumsum([0] + [len(f) for f in fields[:-1]]).tolist()
    return dense, np.concatenate(fields), offsets, candidates


def init(device: str, vocab: int, seed: int, barrier) -> None:
    """The executor's initializer: the model built in this worker from the seed, warmed up."""
    global _model, _dev, _barrier
    _dev, _barrier = torch.device(device), barrier
    torch.manual_seed(seed)
    _model = TwoTower(vocab).to(_dev).eval()
    for rid in range(2):  # warm-up on this process, another seed, answered to no one
        score(make_request(seed + 1, rid, vocab))


def ready() -> int:
    """Holds this worker until every worker is up (so each of ``--procs`` such tasks has its own)."""
    _barrier.wait(timeout=600)
    return os.getpid()


def score(request):
    dense, values, offsets, candidates = request
    t0 = time.perf_counter()
    with torch.no_grad():
        top = _model(torch.from_numpy(dense).to(_dev), torch.from_numpy(values).to(_dev),
                     torch.tensor(offsets, device=_dev), torch.from_numpy(candidates).to(_dev))
        values_out, indices_out = top.values.cpu().numpy(), top.indices.cpu().numpy()
    return values_out, indices_out, (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=4, help="worker processes")
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.vocab < MAX_CANDS or args.procs < 1:
        ap.error(f"need --vocab >= {MAX_CANDS} (distinct candidates) and --procs >= 1")

    requests = [make_request(args.seed, rid, args.vocab) for rid in range(args.queries)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(args.procs)
    with ProcessPoolExecutor(max_workers=args.procs, mp_context=ctx, initializer=init,
                             initargs=(args.device, args.vocab, args.seed, barrier)) as executor:
        pids = [f.result(timeout=600) for f in [executor.submit(ready) for _ in range(args.procs)]]
        assert len(set(pids)) == args.procs, pids  # every worker started and warm
        t0 = time.perf_counter()
        out = list(executor.map(score, requests, chunksize=4))
        wall = time.perf_counter() - t0

    flat = np.concatenate([v.astype(np.float64) for v, _, _ in out])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size)) + float(sum(int(i.sum()) for _, i, _ in out))
    p50, p99 = np.percentile([ms for _, _, ms in out], [50, 99])
    print(json.dumps({"script": "executor_procs_serve", "procs": args.procs, "queries": len(out),
                      "qps": round(len(out) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3),
                      "candidates_total": int(sum(len(c) for *_, c in requests)), "checksum": checksum}),
          flush=True)


if __name__ == "__main__":
    main()
