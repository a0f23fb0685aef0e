"""Nightly offline batch scoring: a DCN-style ranker scores every row of a day's table through a DataLoader.

The way a team writes its nightly scoring job: the day's impressions are a map-style
``torch.utils.data.Dataset`` held in memory (numpy arrays), read by a
``torch.utils.data.DataLoader(batch_size=--batch, shuffle=False, num_workers=--workers,
pin_memory=True on CUDA, drop_last=False, collate_fn=collate, persistent_workers=False)``, so
**the last batch is partial**, and a ``collate_fn`` that returns **a dict of tensors**
(``row_id`` int64 ``[b]``, ``dense`` float32 ``[b, 13]``, ``ids`` int64 ``[b, 8]``). One loop on the
main thread consumes it: each batch's tensors are moved with ``{k: v.to(dev, non_blocking=True)}``
(pinned by the DataLoader's pin-memory thread on CUDA), the model is called under
``torch.inference_mode()``, the scores come back with ``.cpu().numpy()`` and are stored by row id
(the row ids read from the host batch). ``--workers`` (the DataLoader's worker processes, 0: the
main thread loads) is its clients knob. Before the clock starts, ``--warmup`` full batches of
another table (seed ``seed + 1``) are scored through a small loader of their own
(``num_workers=0``). Each timed batch is timed from its arrival from the loader to its scores on
the host; the throughput is batches per second over the whole timed loop (the workers' start
included, as the job pays it).

The table (``Impressions(rows, vocab, seed)``): ``rng = np.random.default_rng(seed)``, then, in this
order, ``dense = np.log1p(rng.exponential(2.0, (rows, 13))).astype(np.float32)``, ``ids =
rng.integers(0, vocab, (rows, 8), dtype=np.int64)`` and ``row_id = rng.permutation(rows)`` (the
table is not sorted by id). ``__getitem__(i)`` returns ``(row_id[i], dense[i], ids[i])``. ``rows`` is
``--rows``, by default ``queries * batch - batch // 3``: ``--queries`` batches, the last one short by
``batch // 3`` rows. The JSON line's ``queries`` is the number of batches scored,
``ceil(rows / batch)``.

The model (``Ranker(vocab)``, built on the CPU right after ``torch.manual_seed(seed)``, then
``.to(dev).eval()``; PyTorch's default initializations, its modules made in this order, nothing
re-drawn):

* ``embs``: an ``nn.ModuleList`` of 8 ``nn.Embedding(vocab, 16)``, feature 0 first;
* ``bottom``: ``nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 16))`` over the dense features;
* ``cross``: an ``nn.ModuleList`` of 2 ``nn.Linear(144, 144)`` (DCN-v2 cross layers);
* ``head``: ``nn.Sequential(nn.Linear(144, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))``.

``forward(dense, ids)``: ``x0 = cat([bottom(dense), embs[0](ids[:, 0]), ..., embs[7](ids[:, 7])], 1)``
(``[b, 144]``); ``x = x0``, then for each cross layer ``x = x0 * cross[l](x) + x``; returns
``sigmoid(head(x)).squeeze(1)`` (``[b]``, each row scored on its own).

    python offline_scoring_serve.py --workers 2 --queries 2000
    python offline_scoring_serve.py --device cpu --workers 0 --queries 6 --batch 16 --vocab 500

The last line is JSON: script, workers, queries (batches scored), rows, last_batch (the last
batch's row count), qps (batches per second), p50_ms, p99_ms (per batch) and checksum: every
row's score, as float64, in row-id order, dotted with ``np.linspace(1.0, 2.0, rows)`` (the same
for any worker count: the batches are the same, in the same order).
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

N_DENSE, N_SPARSE, DIM, N_CROSS = 13, 8, 16, 2


class Impressions(Dataset):
    """A day's impressions, in memory: row i is (row id, 13 dense features, 8 categorical ids)."""

    def __init__(self, rows: int, vocab: int, seed: int):
        rng = np.random.default_rng(seed)
        self.dense = np.log1p(rng.exponential(2.0, (rows, N_DENSE))).astype(np.float32)
        self.ids = rng.integers(0, vocab, (rows, N_SPARSE), dtype=np.int64)
        self.row_id = rng.permutation(rows)

    def __len__(self):
        return len(self.row_id)

    def __getitem__(self, i):
        return self.row_id[i], self.dense[i], self.ids[i]


def collate(samples):
    return {
        "row_id": torch.tensor([s[0] for s in samples], dtype=torch.int64),
        "dense": torch.from_numpy(np.stack([s[1] for s in samples])),
        "ids": torch.from_numpy(np.stack([s[2] for s in samples])),
    }


class Ranker(nn.Module):
    """Embeddings and a dense MLP, two DCN-v2 cross layers, an MLP head, a sigmoid."""

    def __init__(self, vocab: int):
        super().__init__()
        width = (N_SPARSE + 1) * DIM
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(N_SPARSE))
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM))
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(N_CROSS))
        self.head = nn.Sequential(nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense, ids):
        x0 = torch.cat([self.bottom(dense)] + [emb(ids[:, f]) for f, emb in enumerate(self.embs)], dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return torch.sigmoid(self.head(x)).squeeze(1)


def loader_for(dataset, args, workers, pin):
    return DataLoader(dataset, batch_size=args.batch, shuffle=False, num_workers=workers, collate_fn=collate,
                      pin_memory=pin, drop_last=False, persistent_workers=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (0: the main thread)")
    ap.add_argument("--queries", type=int, default=2000, help="batches to score (the last one partial)")
    ap.add_argument("--rows", type=int, default=None, help="rows to score (default: queries * batch - batch // 3)")
    ap.add_argument("--warmup", type=int, default=3, help="full batches of another table scored before timing")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    rows = args.rows if args.rows is not None else args.queries * args.batch - args.batch // 3
    if rows < 1 or args.batch < 1 or args.workers < 0:
        ap.error("need at least one row, --batch >= 1 and --workers >= 0")
    dev = torch.device(args.device)
    pin = dev.type == "cuda"

    torch.manual_seed(args.seed)
    model = Ranker(args.vocab).to(dev).eval()

    with torch.inference_mode():
        if args.warmup > 0:
            for batch in loader_for(Impressions(args.warmup * args.batch, args.vocab, args.seed + 1), args, 0, pin):
                on_dev = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
                model(on_dev["dense"], on_dev["ids"]).cpu().numpy()

        table = Impressions(rows, args.vocab, args.seed)
        scores = np.full(rows, np.nan, dtype=np.float32)
        seen = np.zeros(rows, dtype=np.int64)
        latencies, last_batch = [], 0
        t0 = time.perf_counter()
        for batch in loader_for(table, args, args.workers, pin):
            t = time.perf_counter()
            on_dev = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
            out = model(on_dev["dense"], on_dev["ids"]).cpu().numpy()
            row_id = batch["row_id"].numpy()
            scores[row_id] = out
            seen[row_id] += 1
            latencies.append((time.perf_counter() - t) * 1e3)
            last_batch = len(row_id)
        wall = time.perf_counter() - t0

    assert np.all(seen == 1), "every row scored exactly once"
    assert len(latencies) == -(-rows // args.batch)
    checksum = float(scores.astype(np.float64) @ np.linspace(1.0, 2.0, rows))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "offline_scoring_serve", "workers": args.workers, "queries": len(latencies),
                      "rows": rows, "last_batch": last_batch, "qps": round(len(latencies) / wall, 1),
                      "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "checksum": checksum}),
          flush=True)


if __name__ == "__main__":
    main()
