"""Ranking service in bfloat16 autocast, with a full-precision shadow score for drift.

A request is a batch of impressions: 24 float features (a numpy float32 block) and 10
categorical ids (numpy int64). The handler moves them with
``torch.as_tensor(dense).to(dev, non_blocking=True)`` (pageable memory: the copy is not
really asynchronous) and ``torch.as_tensor(ids, device=dev)``, then scores the batch under
``torch.autocast(dev.type, dtype=torch.bfloat16)``. Every 16th request is scored a second
time without autocast (the float32 "shadow" score the team watches for bf16 drift), so one
model is called in two precisions with inputs of the same shapes. Answers are
``.float().cpu().numpy()`` of the bf16 scores and ``.item()`` of the largest shadow gap.
The whole handler runs under ``@torch.inference_mode()``. Clients are a
``ThreadPoolExecutor(max_workers=N)``: every request is ``submit``-ted at once and
results are collected with ``as_completed``.

    python amp_ranker_serve.py --threads 8 --queries 4000
    python amp_ranker_serve.py --device cpu --threads 2 --queries 24 --batch 16 --vocab 500

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, shadow_requests and checksum
(every request's scores and shadow gap, in request order, weighted by position: the same
for any thread count).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_IDS, SHADOW_EVERY = 24, 10, 16


class Ranker(nn.Module):
    def __init__(self, vocab, dim=48):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.dense = nn.Sequential(nn.Linear(N_DENSE, 128), nn.GELU(), nn.Linear(128, dim))
        self.norm = nn.LayerNorm(dim * (N_IDS + 1))
        self.head = nn.Sequential(nn.Linear(dim * (N_IDS + 1), 512), nn.GELU(), nn.Linear(512, 256), nn.GELU(),
                                  nn.Linear(256, 1))

    def forward(self, dense, ids):
        e = self.emb(ids).flatten(1)  # [batch, N_IDS * dim]
        x = torch.cat([self.dense(dense), e], dim=1)
        return self.head(self.norm(x)).squeeze(1)


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((batch, N_DENSE), dtype=np.float32)
    ids = rng.zipf(1.3, (batch, N_IDS)).astype(np.int64) % vocab
    return dense, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=128, help="impressions per request")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = Ranker(args.vocab).to(dev).eval()

    @torch.inference_mode()
    def handle(rid, dense_np, ids_np):
        t0 = time.perf_counter()
        dense = torch.as_tensor(dense_np).to(dev, non_blocking=True)
        ids = torch.as_tensor(ids_np, device=dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(dense, ids)
        scores = torch.sigmoid(logits.float())
        gap = 0.0
        if rid % SHADOW_EVERY == 0:  # the full-precision shadow score
            shadow = torch.sigmoid(model(dense, ids))
            gap = (shadow - scores).abs().max().item()
        return rid, scores.cpu().numpy(), gap, (time.perf_counter() - t0) * 1e3

    for rid in range(3):  # warm-up
        handle(rid, *make_request(args.seed + 1, rid, args.batch, args.vocab))
    if dev.type == "cuda":
        torch.cuda.synchronize()

    requests = [make_request(args.seed, rid, args.batch, args.vocab) for rid in range(args.queries)]
    results, latencies = {}, []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        futures = [pool.submit(handle, rid, *req) for rid, req in enumerate(requests)]
        for fut in as_completed(futures):
            rid, scores, gap, ms = fut.result()
            results[rid] = (scores, gap)
            latencies.append(ms)
    wall = time.perf_counter() - t0

    flat = np.concatenate([np.concatenate([results[rid][0].astype(np.float64), [results[rid][1]]])
                           for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "amp_ranker_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3),
                      "shadow_requests": sum(1 for rid in range(args.queries) if rid % SHADOW_EVERY == 0),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
