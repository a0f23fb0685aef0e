"""Benchmark a DeepFM CTR model behind a thread pool, the way the ranking service calls it.

Each request arrives as a pandas DataFrame (26 categorical columns C1..C26, 13 numeric
columns I1..I13, one row per ad). The handler turns every column into a tensor on the
device with ``torch.as_tensor(df[col].values, device=dev)``, scores the rows under
``torch.inference_mode()`` and returns the CTRs as a Python list (``.tolist()``).
Requests are submitted to a ``concurrent.futures.ThreadPoolExecutor``.

    python deepfm_serve.py --threads 8 --queries 3000
    python deepfm_serve.py --device cpu --threads 2 --queries 40 --rows 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (all returned
CTRs in request order, weighted by position).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

SPARSE = [f"C{i}" for i in range(1, 27)]
DENSE = [f"I{i}" for i in range(1, 14)]


class DeepFM(nn.Module):
    """First-order weights + FM pairwise term + a DNN over the same field embeddings."""

    def __init__(self, vocab, dim=10, hidden=(400, 400, 400)):
        super().__init__()
        nf = len(SPARSE)
        self.register_buffer("field_offsets", torch.arange(nf) * vocab)
        self.embedding = nn.Embedding(nf * vocab, dim)
        self.linear = nn.Embedding(nf * vocab, 1)
        self.dense_linear = nn.Linear(len(DENSE), 1)
        layers, width = [], nf * dim + len(DENSE)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Dropout(0.2)]
            width = h
        self.dnn = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, sparse, dense):
        idx = sparse + self.field_offsets
        emb = self.embedding(idx)                                     # (B, F, D)
        first = self.linear(idx).sum(dim=1) + self.dense_linear(dense)
        fm = 0.5 * (emb.sum(dim=1).pow(2) - emb.pow(2).sum(dim=1)).sum(dim=1, keepdim=True)
        deep = self.dnn(torch.cat([emb.flatten(1), dense], dim=1))
        return torch.sigmoid(first + fm + deep).squeeze(1)


def request_frame(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    cols = {c: rng.zipf(1.3, rows) % vocab for c in SPARSE}
    cols.update({c: np.log1p(rng.poisson(4.0, rows)).astype(np.float32) for c in DENSE})
    return pd.DataFrame(cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--rows", type=int, default=128, help="ads per request")
    ap.add_argument("--vocab", type=int, default=50_000, help="ids per categorical column")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = DeepFM(args.vocab).to(dev)
    model.eval()

    def predict(df):
        with torch.inference_mode():
            sparse = torch.stack([torch.as_tensor(df[c].values, device=dev) for c in SPARSE], dim=1)
            dense = torch.stack([torch.as_tensor(df[c].values, device=dev) for c in DENSE], dim=1)
            return model(sparse, dense).tolist()

    def handle(req):
        rid, df = req
        t0 = time.perf_counter()
        ctr = predict(df)
        return rid, ctr, (time.perf_counter() - t0) * 1e3

    for i in range(3):  # warm-up: first calls allocate and pick kernels
        predict(request_frame(args.seed + 1, i, args.rows, args.vocab))

    # the requests, as they arrive from the frontend: built before the clock starts (the load
    # generator's work, not the service's)
    frames = [(rid, request_frame(args.seed, rid, args.rows, args.vocab)) for rid in range(args.queries)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        done = list(pool.map(handle, frames))
    wall = time.perf_counter() - t0

    latencies = [ms for _, _, ms in done]
    ctrs = np.array([x for _, ctr, _ in sorted(done, key=lambda d: d[0]) for x in ctr])
    checksum = float(ctrs @ np.linspace(1.0, 2.0, ctrs.size))
    print(json.dumps({"script": "deepfm_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1),
                      "p50_ms": round(float(np.percentile(latencies, 50)), 3),
                      "p99_ms": round(float(np.percentile(latencies, 99)), 3),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
