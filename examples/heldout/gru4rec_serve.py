"""Session recommender (GRU4Rec-style): a GRU over each session's clicks scores candidate items.

Written the way a session-based recommendation service is often written. A request is
``--sessions`` sessions, each with 2 to ``--max-len`` clicks (item ids, most recent last),
right-padded with 0 to a fixed width of ``--max-len``: **every request has the same tensor
shapes, but its sessions' lengths differ**, and only the lengths say which clicks are real.
The handler moves the padded clicks with ``torch.from_numpy(a).to(dev)``, keeps the lengths
on the CPU (``torch.from_numpy(lens)``, int64: ``pack_padded_sequence`` requires them there)
and moves the ``--cands`` candidates of each session with ``torch.as_tensor(c, device=dev)``.
The model: an item embedding, ``torch.nn.utils.rnn.pack_padded_sequence(emb, lengths,
batch_first=True, enforce_sorted=False)``, a one-layer ``nn.GRU`` whose final hidden state
``h_n`` (each session's state after its last real click) is projected by a Linear back to
the embedding width, then a dot product with each candidate's embedding. ``torch.topk`` is
taken **outside** the model, in the handler; the best positions are read with
``.cpu().numpy()`` and mapped to item ids on the host, and the best scores with
``.cpu().numpy()``. A call replayed for other lengths than its own gives other scores.

Clients: ``ThreadPoolExecutor(max_workers=--threads).map(handle, range(queries))``, the
handler decorated with ``@torch.no_grad()``, the model in eval mode.

    python gru4rec_serve.py --threads 8 --queries 3000
    python gru4rec_serve.py --device cpu --queries 24 --sessions 4 --items 500 --max-len 8 --cands 10 --top 3

The last line is JSON: qps, p50_ms, p99_ms, threads, queries and checksum (the top-k scores of
every session of every request in request order, position-weighted, plus 1e-6 x the top
items' ids weighted the same way: the same for any thread count).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence

PAD = 0
DIM, HIDDEN = 64, 128


class GRU4Rec(nn.Module):
    def __init__(self, items: int):
        super().__init__()
        self.item = nn.Embedding(items, DIM, padding_idx=PAD)
        self.gru = nn.GRU(DIM, HIDDEN, num_layers=1, batch_first=True)
        self.proj = nn.Linear(HIDDEN, DIM)

    def forward(self, clicks: torch.Tensor, lengths: torch.Tensor, cands: torch.Tensor) -> torch.Tensor:
        emb = self.item(clicks)  # [S, L, D], L the fixed padded width
        packed = pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
        _, h_n = self.gru(packed)  # [1, S, H]: each session's state after its last real click
        user = self.proj(h_n[-1])  # [S, D]
        return torch.bmm(self.item(cands), user.unsqueeze(-1)).squeeze(-1)  # [S, C]


def make_request(seed, rid, sessions, items, max_len, cands):
    """Padded clicks [sessions, max_len] (0 past each session's length), the lengths (2 to
    max_len), and the candidates [sessions, cands]."""
    rng = np.random.default_rng([seed, rid])
    lens = rng.integers(2, max_len + 1, sessions)
    clicks = np.full((sessions, max_len), PAD, dtype=np.int64)
    for s, n in enumerate(lens):
        clicks[s, :n] = rng.integers(1, items, n)
    return clicks, lens, rng.integers(1, items, (sessions, cands), dtype=np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--sessions", type=int, default=16, help="sessions a request")
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--max-len", type=int, default=20, help="the padded width (the longest session)")
    ap.add_argument("--cands", type=int, default=100, help="candidates a session")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = GRU4Rec(args.items).to(dev).eval()

    @torch.no_grad()
    def serve(a, lens, c):
        clicks = torch.from_numpy(a).to(dev)
        lengths = torch.from_numpy(lens)  # stays on the CPU
        cands = torch.as_tensor(c, device=dev)
        scores = model(clicks, lengths, cands)
        best = torch.topk(scores, args.top, dim=1)
        top_items = np.take_along_axis(c, best.indices.cpu().numpy(), axis=1)
        return best.values.cpu().numpy(), top_items

    def handle(rid, seed=args.seed):
        req = make_request(seed, rid, args.sessions, args.items, args.max_len, args.cands)
        t0 = time.perf_counter()
        top_scores, top_items = serve(*req)
        return top_scores, top_items, (time.perf_counter() - t0) * 1e3

    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        list(pool.map(lambda rid: handle(rid, args.seed + 1), range(2 * args.threads)))  # warm-up
        t0 = time.perf_counter()
        done = list(pool.map(handle, range(args.queries)))
        wall = time.perf_counter() - t0

    scores = np.concatenate([s.ravel() for s, _, _ in done]).astype(np.float64)
    top = np.concatenate([t.ravel() for _, t, _ in done]).astype(np.float64)
    checksum = float(scores @ np.linspace(1.0, 2.0, scores.size)) + 1e-6 * float(top @ np.linspace(1.0, 2.0, top.size))
    p50, p99 = np.percentile([ms for _, _, ms in done], [50, 99])
    print(json.dumps({"script": "gru4rec_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
