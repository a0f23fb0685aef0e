"""DLRM served with its requests carried in dataclasses: a ``Batch`` in, a dict out.

Written the way a team that types its code writes a ranking service. Each multi-hot field of
a request is a ``@dataclass(frozen=True) SparseFeatures(values, offsets)``; a request is a
``@dataclass Batch(dense, sparse, candidate_ids)`` whose ``n`` (its row count) is no
constructor argument but set in ``__post_init__``, and whose method ``to(device)`` returns a
new ``Batch`` with every tensor moved by ``.to(device, non_blocking=True)`` (pageable memory).
The handler builds the ``Batch`` from numpy on the CPU, then ``batch = batch.to(dev)`` and
``model(batch)``: **the model takes one dataclass argument**, whose tensors sit in its fields
and in a list of frozen dataclasses. Every request has its own row count (32 to
``--max-rows``) and 1-4 ids per field and row, so every values tensor has its own length.

The model: a DLRM (bottom MLP over 13 dense features, 8 multi-hot fields through
``nn.EmbeddingBag(vocab, 16, mode="sum")`` with values and offsets, pairwise dot interactions
by ``torch.bmm``, a top MLP, a sigmoid). ``forward`` reads ``batch.dense``,
``batch.sparse[k].values`` / ``.offsets`` and ``batch.n`` (a Python int), and returns a plain
dict ``{"score": ..., "ids": batch.candidate_ids}``: **the candidate ids, an input, passed
through unchanged as an output**. The handler reads both with ``.cpu().numpy()`` under
``torch.inference_mode()`` and orders the candidates by score on the host (``np.argsort``),
keeping the top 10. Clients: ``pool.submit`` per request id on a
``ThreadPoolExecutor(max_workers=--threads)``, the results collected in request order.

    python dataclass_batch_serve.py --threads 8 --queries 3000
    python dataclass_batch_serve.py --device cpu --threads 2 --queries 24 --vocab 500 --max-rows 48

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every request's
scores in request order, position-weighted, plus 1e-6 x the top 10 candidate ids of every
request weighted the same way: the same for any thread count).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

N_DENSE, FIELDS, DIM, MAX_IDS, TOP = 13, 8, 16, 4, 10


@dataclass(frozen=True)
class SparseFeatures:
    """One multi-hot field of a request: every row's ids back to back, and where each row starts."""
    values: torch.Tensor
    offsets: torch.Tensor


@dataclass
class Batch:
    dense: torch.Tensor
    sparse: list[SparseFeatures]
    candidate_ids: torch.Tensor
    n: int = field(init=False)

    def __post_init__(self):
        self.n = self.dense.shape[0]

    def to(self, device) -> "Batch":
        return Batch(dense=self.dense.to(device, non_blocking=True),
                     sparse=[SparseFeatures(f.values.to(device, non_blocking=True),
                                            f.offsets.to(device, non_blocking=True)) for f in self.sparse],
                     candidate_ids=self.candidate_ids.to(device, non_blocking=True))


class DLRM(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
        self.bags = nn.ModuleList(nn.EmbeddingBag(vocab, DIM, mode="sum") for _ in range(FIELDS))
        n = FIELDS + 1
        self.top = nn.Sequential(nn.Linear(DIM + n * (n - 1) // 2, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        x = self.bottom(batch.dense)
        pooled = [bag(f.values, f.offsets) for bag, f in zip(self.bags, batch.sparse)]
        feats = torch.cat([x] + pooled, dim=1).view(batch.n, FIELDS + 1, DIM)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(FIELDS + 1, FIELDS + 1, offset=1, device=x.device)
        score = torch.sigmoid(self.top(torch.cat([x, inter[:, i, j]], dim=1))).squeeze(1)
        return {"score": score, "ids": batch.candidate_ids}


def make_request(seed, rid, vocab, max_rows) -> Batch:
    """A CPU Batch: 32 to max_rows rows (fewer only where max_rows is), 1-4 ids per field and row."""
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(min(32, max_rows), max_rows + 1))
    dense = rng.standard_normal((n, N_DENSE)).astype(np.float32)
    sparse = []
    for _ in range(FIELDS):
        lengths = rng.integers(1, MAX_IDS + 1, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        values = rng.integers(0, vocab, int(lengths.sum()), dtype=np.int64)
        sparse.append(SparseFeatures(torch.from_numpy(values), torch.from_numpy(offsets)))
    cands = rng.integers(0, vocab, n, dtype=np.int64)
    return Batch(dense=torch.from_numpy(dense), sparse=sparse, candidate_ids=torch.from_numpy(cands))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = DLRM(args.vocab).to(dev).eval()

    def handle(rid, seed=args.seed):
        batch = make_request(seed, rid, args.vocab, args.max_rows)
        t0 = time.perf_counter()
        with torch.inference_mode():
            batch = batch.to(dev)
            out = model(batch)
            scores = out["score"].cpu().numpy()
            ids = out["ids"].cpu().numpy()
        best = ids[np.argsort(-scores, kind="stable")[:TOP]]
        return scores, best, (time.perf_counter() - t0) * 1e3

    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for f in [pool.submit(handle, k, args.seed + 1) for k in range(2 * args.threads)]:
            f.result()  # warm-up
        t0 = time.perf_counter()
        futures = [pool.submit(handle, rid) for rid in range(args.queries)]
        done = [f.result() for f in futures]
        wall = time.perf_counter() - t0

    scores = np.concatenate([s for s, _, _ in done]).astype(np.float64)
    top = np.concatenate([b for _, b, _ in done]).astype(np.float64)
    checksum = float(scores @ np.linspace(1.0, 2.0, scores.size)) + 1e-6 * float(top @ np.linspace(1.0, 2.0, top.size))
    p50, p99 = np.percentile([ms for _, _, ms in done], [50, 99])
    print(json.dumps({"script": "dataclass_batch_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
