"""TorchRec-style ranker whose sparse features arrive as a KeyedJaggedTensor-like object of its own.

Written the way a team that prototyped on TorchRec serves without it: the request's sparse
features are a ``KeyedJagged``, a small plain class (not a dataclass, not a tensor subclass)
that mirrors TorchRec's ``KeyedJaggedTensor``: ``keys``, one flat ``values`` tensor and one
``lengths`` tensor in key-major layout (every row's ids of key 0, then every row's ids of
key 1, ...; ``lengths`` holds ``len(keys) * rows`` counts in the same order), an ``offsets()``
computed on first use and cached (``torch.cumsum`` of the lengths with a leading zero, kept in
``self._offsets``) and a ``to(device)`` that returns a new ``KeyedJagged`` with every tensor
moved by ``.to(device, non_blocking=True)`` (the cached offsets too, when computed). So the
model's input is a custom object holding tensors, and **its value count changes every
request** (each row has 0-4 ids per key): no two requests need have one shape.

The model (``nn.Module``, ``forward(dense, kjt)``): for each key an ``nn.EmbeddingBag(vocab,
16, mode="sum")`` over that key's slice of ``kjt.values()``, its bags given by the cached
offsets of that key's rows less the slice's start; the key boundaries are read on the host
(``kjt.offsets()[::rows].tolist()``, one sync a call, as TorchRec's ``length_per_key()`` is);
the 13 dense features through a dense arch (13-64-16, ReLU after each layer); the dense output
and the keys' pooled embeddings concatenated (``16 * (keys + 1)``) into an over arch
(80-64-1), a sigmoid: one score a row. Built after ``torch.manual_seed(seed)``, in eval mode.

Requests (``--queries`` of ``--rows`` rows, made up-front from ``np.random.default_rng([seed,
rid])``, in this order: the dense features, ``standard_normal((rows, 13))`` as float32; the
lengths, ``integers(0, 5, (keys, rows))``, key-major; the values, ``integers(0, vocab, total)``
for the lengths' total, int64). The handler builds the ``KeyedJagged`` on the CPU with
``torch.from_numpy`` of the values and the flattened lengths, moves it with ``kjt.to(dev)``
(pageable memory, ``non_blocking=True``) and the dense features with
``torch.from_numpy(a).to(dev)``, calls the model under ``torch.inference_mode()`` and reads
the scores with ``.cpu().numpy()``. Clients: a ``ThreadPoolExecutor(--threads)``, one
``submit`` per request, results taken with ``as_completed``.

    python kjt_ranker_serve.py --threads 8 --queries 3000
    python kjt_ranker_serve.py --device cpu --threads 3 --queries 24 --rows 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, values_total (the values count
over all requests) and checksum (every request's scores, in request order, weighted by
position: the same for any thread count).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

KEYS = ("user_clicks", "user_topics", "item_tags", "query_terms")
N_DENSE, DIM, MAX_IDS = 13, 16, 4


class KeyedJagged:
    """Sparse features of one batch: ``keys``, flat ``values`` and per-(key, row) ``lengths``,
    key-major, as TorchRec's ``KeyedJaggedTensor``."""

    def __init__(self, keys, values, lengths):
        self._keys = list(keys)
        self._values = values
        self._lengths = lengths
        self._offsets = None

    def keys(self):
        return self._keys

    def values(self):
        return self._values

    def lengths(self):
        return self._lengths

    def stride(self):
        return self._lengths.numel() // len(self._keys)

    def offsets(self):
        if self._offsets is None:
            self._offsets = F.pad(torch.cumsum(self._lengths, dim=0), (1, 0))
        return self._offsets

    def to(self, device, non_blocking=True):
        out = KeyedJagged(self._keys, self._values.to(device, non_blocking=non_blocking),
                          self._lengths.to(device, non_blocking=non_blocking))
        if self._offsets is not None:
            out._offsets = self._offsets.to(device, non_blocking=non_blocking)
        return out

    def __repr__(self):
        return f"KeyedJagged(keys={self._keys}, values={tuple(self._values.shape)}, stride={self.stride()})"


class KJTRanker(nn.Module):
    def __init__(self, keys, vocab):
        super().__init__()
        self.keys = tuple(keys)
        self.bags = nn.ModuleDict({k: nn.EmbeddingBag(vocab, DIM, mode="sum") for k in self.keys})
        self.dense_arch = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
        self.over_arch = nn.Sequential(nn.Linear(DIM * (len(self.keys) + 1), 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense, kjt):
        rows = kjt.stride()
        offsets, values = kjt.offsets(), kjt.values()
        bounds = offsets[::rows].tolist()  # where each key's values start and end (a host sync)
        pooled = []
        for i, key in enumerate(kjt.keys()):
            lo, hi = bounds[i], bounds[i + 1]
            pooled.append(self.bags[key](values[lo:hi], offsets[i * rows:(i + 1) * rows] - lo))
        x = torch.cat([self.dense_arch(dense), *pooled], dim=1)
        return torch.sigmoid(self.over_arch(x)).squeeze(1)


def make_request(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((rows, N_DENSE)).astype(np.float32)
    lengths = rng.integers(0, MAX_IDS + 1, (len(KEYS), rows))
    values = rng.integers(0, vocab, int(lengths.sum()))
    return dense, values, lengths.reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = KJTRanker(KEYS, args.vocab).to(dev).eval()
    requests = [make_request(args.seed, rid, args.rows, args.vocab) for rid in range(args.queries)]

    def handle(rid):
        dense, values, lengths = requests[rid]
        t0 = time.perf_counter()
        kjt = KeyedJagged(KEYS, torch.from_numpy(values), torch.from_numpy(lengths))
        with torch.inference_mode():
            out = model(torch.from_numpy(dense).to(dev), kjt.to(dev))
            scores = out.cpu().numpy()
        return rid, scores, (time.perf_counter() - t0) * 1e3

    results, latencies = {}, []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        futures = [pool.submit(handle, rid) for rid in range(args.queries)]
        for fut in as_completed(futures):
            rid, scores, ms = fut.result()
            results[rid] = scores
            latencies.append(ms)
    wall = time.perf_counter() - t0

    flat = np.concatenate([results[rid] for rid in range(args.queries)]).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "kjt_ranker_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "values_total": int(sum(len(r[1]) for r in requests)),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
