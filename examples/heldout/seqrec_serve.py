"""Sequential recommender (BST-style): a Transformer over each user's recent clicks scores candidates.

Written the way a sequence-model ranking service is often written. A request is a batch of
``--users`` users, each with a click history of 5 to ``--max-len`` item ids (a Python list,
most recent last: every user's length differs) and ``--cands`` candidate items (a numpy
array). The handler builds one CPU tensor per history (``torch.tensor(h)``), pads them with
``torch.nn.utils.rnn.pad_sequence`` (so the padded width is the longest history of the
request, and changes from request to request), moves the block with ``.to(dev)`` and the
candidates with ``torch.from_numpy(c).to(dev, non_blocking=True)`` (pageable memory), and
makes the key-padding mask on the device (``hist == PAD``). The model: item and position
embeddings, a two-layer ``nn.TransformerEncoder`` (``batch_first``, ``src_key_padding_mask``:
in eval mode under ``torch.inference_mode()`` PyTorch runs it on its nested-tensor fast
path), a masked mean over the history, then each candidate's score: a dot product with the
user vector plus an MLP over both. Outside the model the handler takes ``torch.topk`` of
the scores and reads ``.indices.cpu().numpy()`` (mapped to item ids) and the scores with
``.cpu().numpy()``.

Clients: ``--threads`` worker threads take requests off a ``queue.Queue`` until each meets a
``None`` (one sentinel a worker).

    python seqrec_serve.py --threads 8 --queries 3000
    python seqrec_serve.py --device cpu --threads 2 --queries 24 --users 4 --items 500 --max-len 12 --cands 10

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, widths (how many padded widths
the requests had) and checksum (every candidate's score of every request in request order,
position-weighted, plus 1e-6 x the top items' ids: the same for any thread count).
"""

import argparse
import json
import queue
import threading
import time

import numpy as np
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence

PAD = 0
DIM, HEADS = 64, 4


class SeqRec(nn.Module):
    def __init__(self, items: int, max_len: int):
        super().__init__()
        self.item = nn.Embedding(items, DIM, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, DIM)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, dim_feedforward=4 * DIM, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, hist: torch.Tensor, pad_mask: torch.Tensor, cands: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(hist.shape[1], device=hist.device)
        x = self.encoder(self.item(hist) + self.pos(positions), src_key_padding_mask=pad_mask)
        keep = (~pad_mask).unsqueeze(-1).to(x.dtype)
        user = (x * keep).sum(1) / keep.sum(1)  # [B, D]: the mean over each user's real clicks
        c = self.item(cands)  # [B, C, D]
        pair = torch.cat([user.unsqueeze(1).expand_as(c), c], dim=-1)
        return torch.sigmoid((c * user.unsqueeze(1)).sum(-1) + self.mlp(pair).squeeze(-1))  # [B, C]


def make_request(seed, rid, users, items, max_len, cands):
    rng = np.random.default_rng([seed, rid])
    hists = [rng.integers(1, items, int(rng.integers(5, max_len + 1))).tolist() for _ in range(users)]
    return hists, rng.integers(1, items, (users, cands), dtype=np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--users", type=int, default=32, help="users a request")
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--max-len", type=int, default=50, help="the longest click history")
    ap.add_argument("--cands", type=int, default=64, help="candidates a user")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = SeqRec(args.items, args.max_len).to(dev).eval()

    def handle(hists, cands_np):
        with torch.inference_mode():
            hist = pad_sequence([torch.tensor(h) for h in hists], batch_first=True, padding_value=PAD).to(dev)
            cands = torch.from_numpy(cands_np).to(dev, non_blocking=True)
            scores = model(hist, hist == PAD, cands)
            best = torch.topk(scores, args.top, dim=1)
            top_items = np.take_along_axis(cands_np, best.indices.cpu().numpy(), axis=1)
            return scores.cpu().numpy(), top_items, hist.shape[1]

    for rid in range(3):  # warm-up
        handle(*make_request(args.seed + 1, rid, args.users, args.items, args.max_len, args.cands))

    requests = queue.Queue()
    for rid in range(args.queries):
        requests.put(rid)
    for _ in range(args.threads):
        requests.put(None)
    results, latencies, widths = {}, [], set()

    def worker():
        while (rid := requests.get()) is not None:
            req = make_request(args.seed, rid, args.users, args.items, args.max_len, args.cands)
            t0 = time.perf_counter()
            scores, top_items, width = handle(*req)
            latencies.append((time.perf_counter() - t0) * 1e3)
            results[rid] = (scores, top_items)
            widths.add(width)

    threads = [threading.Thread(target=worker, name=f"worker-{k}") for k in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    scores = np.concatenate([results[rid][0].ravel() for rid in range(args.queries)]).astype(np.float64)
    top = np.concatenate([results[rid][1].ravel() for rid in range(args.queries)]).astype(np.float64)
    checksum = float(scores @ np.linspace(1.0, 2.0, scores.size)) + 1e-6 * float(top @ np.linspace(1.0, 2.0, top.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "seqrec_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "widths": len(widths), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
