"""Two-tower retrieval and a re-ranker in one module, served through a method of its own, never ``model(...)``.

Written the way a team whose model object is a small service API serves: the ``nn.Module``
holds its towers as submodules and exposes ``recommend(...)``, a plain method decorated with
``@torch.no_grad()``; its ``forward`` raises (``"use recommend()"``). So the model object is
never called: what runs through ``nn.Module.__call__`` are its submodules, called from inside
the method, ``self.user_tower(...)``, ``self.item_tower(...)`` and ``self.reranker(...)``,
each a top-level module call of its own, with tensor work of the method's between them (a
matmul, two ``torch.topk``, gathers) and a Python int argument (``k``).

The model (``Recommender``, an ``nn.Module``, built after ``torch.manual_seed(seed)``, in eval
mode; PyTorch's default initializations, its parameters made in this order):

* ``user_tower`` (``UserTower``): ``bag``, an ``nn.EmbeddingBag(vocab, 32, mode="mean")``
  over the user's recent item ids (``bag(ids, offsets)``: one bag per offset); then ``fc1``, an
  ``nn.Linear(32, 64)``, a ReLU and ``fc2``, an ``nn.Linear(64, 32)``: ``u = fc2(relu(fc1(bag)))``,
  ``[1, 32]`` for a request's one user;
* ``item_tower`` (``ItemTower``): ``emb``, an ``nn.Embedding(vocab, 32)``, then ``proj``, an
  ``nn.Linear(32, 32)`` (no activation): ``items = proj(emb(ids))``, ``[C, 32]``;
* ``reranker``: ``nn.Sequential(nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 1))`` over the
  concatenation ``[u, item, u * item]`` of a shortlisted pair;
* ``shortlist``, a plain Python int attribute (``--shortlist``, 32).

``forward`` raises ``NotImplementedError``. The method::

    @torch.no_grad()
    def recommend(self, history_ids, history_offsets, candidate_ids, k):

``u = self.user_tower(history_ids, history_offsets)`` (``[1, 32]``); ``items =
self.item_tower(candidate_ids)`` (``[C, 32]``); ``scores = (u @ items.T).squeeze(0)`` (``[C]``,
the dot products); ``pre = torch.topk(scores, self.shortlist)`` on the device;
``short = items[pre.indices]``; ``ue = u.expand(self.shortlist, 32)``; ``r =
self.reranker(torch.cat([ue, short, ue * short], dim=1)).squeeze(1)`` (``[shortlist]``, the
re-ranker's logits); ``top = torch.topk(r, k)``; it returns ``(candidate_ids[pre.indices[
top.indices]], top.values)``: the ``k`` best items' ids (int64) and their re-ranker logits
(float32), best first.

Requests (``--queries`` of them, made up-front): request ``rid`` is drawn from
``np.random.default_rng([seed, rid])``, in this order: ``n_hist = integers(5, 51)``;
``history = integers(0, vocab, n_hist)`` (int64, the user's recent item ids, repeats allowed);
``n_cand = integers(64, 257)``; ``candidates = choice(vocab, n_cand, replace=False)`` (int64,
distinct ids, the retrieval stage's candidates: **the row count of the item tower changes every
request**). The offsets are ``np.zeros(1, dtype=np.int64)`` (one bag, no draw).

The handler moves the history with ``torch.as_tensor(history, device=dev)``, the offsets with
``torch.as_tensor(offsets, device=dev)`` and the candidates with
``torch.from_numpy(candidates).to(dev, non_blocking=True)`` (pageable), calls
``model.recommend(history, offsets, candidates, args.k)`` under ``torch.inference_mode()``
(``--k``, 10, a Python int), and reads the ids with ``top_ids.tolist()`` and the scores with
``top_scores.cpu().numpy()``. A request's latency is measured around all of that.

Clients: ``concurrent.futures.ThreadPoolExecutor(max_workers=--threads)``, ``pool.map(handle,
range(queries))`` (results in request order).

    python method_api_serve.py --threads 8 --queries 3000
    python method_api_serve.py --device cpu --threads 3 --queries 24 --vocab 500

The last line is JSON: script, qps, p50_ms, p99_ms, threads, queries, candidates_total (the
candidate count over all requests), id_checksum (an int: the sum over requests ``r`` of
``(r + 1)`` times the sum of the ids returned) and checksum (the sum over requests ``r`` of
``(r + 1)`` times (the sum of the ids returned plus the float64 sum of the scores returned),
in float64: the same for any thread count).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

DIM, HIDDEN = 32, 64
MIN_HIST, MAX_HIST = 5, 50
MIN_CANDS, MAX_CANDS = 64, 256


class UserTower(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, DIM, mode="mean")
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, ids, offsets):
        return self.fc2(torch.relu(self.fc1(self.bag(ids, offsets))))


class ItemTower(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, DIM)
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, ids):
        return self.proj(self.emb(ids))


class Recommender(nn.Module):
    def __init__(self, vocab: int, shortlist: int = 32):
        super().__init__()
        self.user_tower = UserTower(vocab)
        self.item_tower = ItemTower(vocab)
        self.reranker = nn.Sequential(nn.Linear(3 * DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
        self.shortlist = shortlist

    def forward(self, *args, **kwargs):
        raise NotImplementedError("Recommender is served through recommend(), not called: use recommend()")

    @torch.no_grad()
    def recommend(self, history_ids, history_offsets, candidate_ids, k):
        u = self.user_tower(history_ids, history_offsets)  # [1, DIM]
        items = self.item_tower(candidate_ids)  # [C, DIM]
        scores = (u @ items.T).squeeze(0)  # [C]
        pre = torch.topk(scores, self.shortlist)
        short = items[pre.indices]
        ue = u.expand(self.shortlist, DIM)
        r = self.reranker(torch.cat([ue, short, ue * short], dim=1)).squeeze(1)
        top = torch.topk(r, k)
        return candidate_ids[pre.indices[top.indices]], top.values


def make_request(seed: int, rid: int, vocab: int):
    """(history ids, offsets, candidate ids) of request ``rid``, all int64 numpy arrays."""
    rng = np.random.default_rng([seed, rid])
    n_hist = int(rng.integers(MIN_HIST, MAX_HIST + 1))
    history = rng.integers(0, vocab, n_hist)
    n_cand = int(rng.integers(MIN_CANDS, MAX_CANDS + 1))
    candidates = rng.choice(vocab, n_cand, replace=False)
    return history, np.zeros(1, dtype=np.int64), candidates


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shortlist", type=int, default=32, help="candidates kept by the dot product for the re-ranker")
    ap.add_argument("--k", type=int, default=10, help="items returned a request")
    args = ap.parse_args()
    if args.vocab < MAX_CANDS:
        ap.error(f"--vocab must be at least {MAX_CANDS} (the candidates are distinct ids)")
    if not 0 < args.k <= args.shortlist <= MIN_CANDS:
        ap.error(f"need 0 < --k <= --shortlist <= {MIN_CANDS}")
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = Recommender(args.vocab, args.shortlist).to(dev).eval()
    requests = [make_request(args.seed, rid, args.vocab) for rid in range(args.queries)]

    def handle(rid):
        history, offsets, candidates = requests[rid]
        t0 = time.perf_counter()
        hist_t = torch.as_tensor(history, device=dev)
        offs_t = torch.as_tensor(offsets, device=dev)
        cand_t = torch.from_numpy(candidates).to(dev, non_blocking=True)
        with torch.inference_mode():
            top_ids, top_scores = model.recommend(hist_t, offs_t, cand_t, args.k)
        ids = top_ids.tolist()
        scores = top_scores.cpu().numpy()
        return ids, scores, (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        done = list(pool.map(handle, range(args.queries)))
    wall = time.perf_counter() - t0

    id_checksum, checksum = 0, 0.0
    for rid, (ids, scores, _) in enumerate(done):
        id_checksum += (rid + 1) * sum(ids)
        checksum += (rid + 1) * (float(sum(ids)) + float(np.sum(scores, dtype=np.float64)))
    p50, p99 = np.percentile([ms for _, _, ms in done], [50, 99])
    print(json.dumps({"script": "method_api_serve", "qps": round(len(done) / wall, 1),
                      "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3),
                      "threads": args.threads, "queries": len(done),
                      "candidates_total": int(sum(len(c) for _, _, c in requests)),
                      "id_checksum": id_checksum, "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
