"""DCN-v2 CTR/CVR scorer fed from pandas: the feature service hands over one DataFrame a request.

A request is a frame of candidate ads: 20 id columns (``id_0``..``id_19``, int64), 12
float32 feature columns (``f_0``..``f_11``) and a ``country`` column of pandas
``category`` dtype. The handler builds each input in one call from a block of columns,
``torch.tensor(df[cols].values, device=dev)``, and the country from its category codes
(int8, widened on the device). The model takes a ``Batch`` namedtuple and returns a
``Scores`` namedtuple (ctr, cvr). ``predict`` is decorated with ``@torch.no_grad()``; the
service answers with ``.tolist()`` of both heads and the best ad's row from ``.item()``.
Clients are ``ThreadPoolExecutor(max_workers=N).map(handle, requests)``.

    python dcn_frame_serve.py --threads 8 --queries 4000
    python dcn_frame_serve.py --device cpu --threads 2 --queries 24 --rows 8 --vocab 300

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (every request's
ctr, cvr and best row, in request order, weighted by position: the same for any thread
count).
"""

import argparse
import json
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

IDS = [f"id_{i}" for i in range(20)]
FEATS = [f"f_{i}" for i in range(12)]
COUNTRIES = ["us", "br", "in", "de", "jp", "fr", "mx", "gb", "id", "tr"]

Batch = namedtuple("Batch", ["dense", "sparse", "country"])
Scores = namedtuple("Scores", ["ctr", "cvr"])


class DCNv2(nn.Module):
    """Embeddings -> x0; a cross network (x_{l+1} = x0 * W x_l + x_l) beside a deep MLP;
    two heads over both."""

    def __init__(self, vocab, dim=16, n_cross=3, hidden=(512, 256)):
        super().__init__()
        self.register_buffer("offsets", torch.arange(len(IDS)) * vocab)
        self.emb = nn.Embedding(len(IDS) * vocab, dim)
        self.country = nn.Embedding(len(COUNTRIES), 8)
        d = len(IDS) * dim + 8 + len(FEATS)
        self.cross = nn.ModuleList(nn.Linear(d, d) for _ in range(n_cross))
        layers, width = [], d
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.deep = nn.Sequential(*layers)
        self.ctr = nn.Linear(d + width, 1)
        self.cvr = nn.Linear(d + width, 1)

    def forward(self, batch):
        x0 = torch.cat([self.emb(batch.sparse + self.offsets).flatten(1), self.country(batch.country),
                        batch.dense], dim=1)
        x = x0
        for w in self.cross:
            x = x0 * w(x) + x
        h = torch.cat([x, self.deep(x0)], dim=1)
        return Scores(ctr=torch.sigmoid(self.ctr(h)).squeeze(1), cvr=torch.sigmoid(self.cvr(h)).squeeze(1))


def request_frame(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    cols = {c: rng.integers(0, vocab, rows) for c in IDS}
    cols.update({c: rng.standard_normal(rows).astype(np.float32) for c in FEATS})
    cols["country"] = pd.Categorical(rng.choice(COUNTRIES, rows), categories=COUNTRIES)
    return pd.DataFrame(cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--rows", type=int, default=200, help="ads per request")
    ap.add_argument("--vocab", type=int, default=50_000, help="ids per id column")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = DCNv2(args.vocab).to(dev).eval()

    @torch.no_grad()
    def predict(df):
        batch = Batch(dense=torch.tensor(df[FEATS].values, device=dev),
                      sparse=torch.tensor(df[IDS].values, device=dev),
                      country=torch.tensor(df["country"].cat.codes.values, device=dev).long())
        scores = model(batch)
        best = torch.argmax(scores.ctr * scores.cvr).item()
        return scores.ctr.tolist(), scores.cvr.tolist(), best

    def handle(req):
        rid, df = req
        t0 = time.perf_counter()
        ctr, cvr, best = predict(df)
        return rid, ctr + cvr + [best], (time.perf_counter() - t0) * 1e3

    for i in range(3):  # warm-up
        predict(request_frame(args.seed + 1, i, args.rows, args.vocab))

    # the frames as the feature service sends them: built before the clock starts
    frames = [(rid, request_frame(args.seed, rid, args.rows, args.vocab)) for rid in range(args.queries)]
    pool = ThreadPoolExecutor(max_workers=args.threads)
    t0 = time.perf_counter()
    done = list(pool.map(handle, frames))
    wall = time.perf_counter() - t0
    pool.shutdown()

    out = dict((rid, values) for rid, values, _ in done)
    flat = np.array([v for rid in range(args.queries) for v in out[rid]], dtype=np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    latencies = [ms for _, _, ms in done]
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "dcn_frame_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
