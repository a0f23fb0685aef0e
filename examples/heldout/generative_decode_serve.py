"""Generative next-items recommender (SASRec/HSTU-style): a hand-written KV-cache decode loop.

Written the way teams now serve generative retrieval: instead of scoring given candidates, the
model reads each user's click history and *generates* the next ``--steps`` items one at a time,
greedily, with a key/value cache, in a decode loop written by hand as LLM decode loops are.

The model (``GenRec``, an ``nn.Module``; width ``DIM`` = 64, ``HEADS`` = 2 heads of 32): an item
embedding ``nn.Embedding(items, 64)`` and a learned position embedding ``nn.Embedding(--max-len
+ --steps, 64)``, both initialised ``normal(std=0.5)`` (the logits are spread, so no two items
tie for the argmax); ONE causal self-attention block written by hand: ``q``, ``k`` and ``v``
each an ``nn.Linear(64, 64)`` (no output projection), split into 2 heads, attention by
``F.scaled_dot_product_attention``, added back to its input (``h = x + attn(x)``); then a
``LayerNorm`` and a feed-forward ``ff`` (``Linear(64, 256)``, ``GELU``, ``Linear(256, 64)``) with
a residual (``y = h + ff(norm(h))``); the logits are ``y @ item.weight.T`` (tied: one logit an
item, item 0 included). Built after ``torch.manual_seed(seed)``, in eval mode. Two methods:

* ``prefill(hist)``: ``hist`` ``[rows, L]`` int64 (every row of a request has the same L, no
  padding); ``x = item(hist) + pos(arange(L))``, causal attention over the history
  (``is_causal=True``), and returns ``(logits, k_cache, v_cache)``: the logits ``[rows, items]``
  of the last history position, and two caches **newly allocated** by ``torch.zeros`` of shape
  ``[rows, 2, L + steps, 32]`` with the history's keys and values in the first L positions.
* ``forward(last_ids, k_cache, v_cache, pos)``, ONE decode step, called as ``model(...)``:
  ``last_ids`` ``[rows]`` int64 on the device, the caches, and ``pos`` **a plain Python int**
  (the position written: L, L + 1, ...). ``x = self.item(last_ids) + self.pos.weight[pos]``; its key and
  value are **written into the caller's caches in place** (``k_cache[:, :, pos] = k``); its
  query attends over ``k_cache[:, :, : pos + 1]`` and ``v_cache[:, :, : pos + 1]`` (a slice one
  longer every step: **every step has a different shape**), then the residual, the LayerNorm
  and the feed-forward as above; returns the logits ``[rows, items]``.

The decode loop (``decode``, under ``torch.inference_mode()``): ``logits, k_cache, v_cache =
model.prefill(hist)``, ``pos = L``, ``seen = hist``; then ``--steps`` times: mask the items
already in the history or already generated (``logits.scatter_(1, seen, float("-inf"))``),
``nxt = logits.argmax(dim=1)`` and its score ``logits.amax(dim=1)`` (kept on the device),
``seen = torch.cat([seen, nxt[:, None]], dim=1)``, ``logits = model(nxt, k_cache, v_cache,
pos)``, ``pos += 1`` (so ``--steps`` decode calls, the last one filling the caches' last
position; its logits are not used). At the end the generated ids ``[rows, steps]`` come back
with ``.tolist()`` and the scores ``[rows, steps]`` (float32) with ``.cpu().numpy()``.

Requests (``--queries``, made up-front; request rid from ``np.random.default_rng([seed, rid])``,
in this order): one history length ``L = integers(--max-len // 2, --max-len + 1)``, then the
histories ``integers(1, items, (rows, L))`` (int64; ids may repeat within a row); ``--rows``
users a request. The handler moves the history with ``torch.from_numpy(hist).to(dev)`` and
decodes. Three warm-up requests (seed + 1) run first, untimed. Clients: a
``ThreadPoolExecutor(--threads)``, ``pool.map(handle, range(queries))``.

    python generative_decode_serve.py --threads 8 --queries 3000
    python generative_decode_serve.py --device cpu --threads 3 --queries 16 --rows 4 --items 500 --max-len 12 --steps 4

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, steps, rows and checksum: the sum
over requests r (in request order) of (r + 1) * (the sum of its generated ids + the sum of its
scores), in float64 (the ids make it change with any changed argmax); the same for any thread
count.
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, HEADS = 64, 2
HEAD_DIM = DIM // HEADS


class GenRec(nn.Module):
    def __init__(self, items: int, max_len: int, steps: int):
        super().__init__()
        self.steps = steps
        self.item = nn.Embedding(items, DIM)
        self.pos = nn.Embedding(max_len + steps, DIM)
        nn.init.normal_(self.item.weight, std=0.5)
        nn.init.normal_(self.pos.weight, std=0.5)
        self.q = nn.Linear(DIM, DIM)
        self.k = nn.Linear(DIM, DIM)
        self.v = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.ff = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        y = h + self.ff(self.norm(h))
        return y @ self.item.weight.T

    def prefill(self, hist: torch.Tensor):
        rows, length = hist.shape
        x = self.item(hist) + self.pos(torch.arange(length, device=hist.device))  # [rows, L, D]
        q, k, v = (lin(x).view(rows, length, HEADS, HEAD_DIM).transpose(1, 2) for lin in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [rows, H, L, HD]
        h = x[:, -1] + a[:, :, -1].reshape(rows, DIM)  # only the last position's logits are needed
        k_cache = torch.zeros(rows, HEADS, length + self.steps, HEAD_DIM, device=hist.device, dtype=k.dtype)
        v_cache = torch.zeros_like(k_cache)
        k_cache[:, :, :length] = k
        v_cache[:, :, :length] = v
        return self._logits(h), k_cache, v_cache

    def forward(self, last_ids: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int):
        rows = last_ids.shape[0]
        x = self.item(last_ids) + self.pos.weight[pos]  # [rows, D]
        q = self.q(x).view(rows, HEADS, 1, HEAD_DIM)
        k_cache[:, :, pos] = self.k(x).view(rows, HEADS, HEAD_DIM)
        v_cache[:, :, pos] = self.v(x).view(rows, HEADS, HEAD_DIM)
        a = F.scaled_dot_product_attention(q, k_cache[:, :, : pos + 1], v_cache[:, :, : pos + 1])  # [rows, H, 1, HD]
        return self._logits(x + a.reshape(rows, DIM))


def decode(model: GenRec, hist: torch.Tensor, steps: int):
    """Greedy generation of ``steps`` new items a row: (ids as lists, scores [rows, steps])."""
    with torch.inference_mode():
        logits, k_cache, v_cache = model.prefill(hist)
        pos = hist.shape[1]
        seen = hist
        chosen, scores = [], []
        for _ in range(steps):
            logits.scatter_(1, seen, float("-inf"))  # never an item seen or already generated
            nxt = logits.argmax(dim=1)
            chosen.append(nxt)
            scores.append(logits.amax(dim=1))
            seen = torch.cat([seen, nxt[:, None]], dim=1)
            logits = model(nxt, k_cache, v_cache, pos)
            pos += 1
        return torch.stack(chosen, dim=1).tolist(), torch.stack(scores, dim=1).cpu().numpy()


def make_request(seed, rid, rows, items, max_len):
    rng = np.random.default_rng([seed, rid])
    length = int(rng.integers(max_len // 2, max_len + 1))
    return rng.integers(1, items, (rows, length), dtype=np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--rows", type=int, default=8, help="users a request")
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--max-len", type=int, default=32, help="the longest click history")
    ap.add_argument("--steps", type=int, default=8, help="items generated a user")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = GenRec(args.items, args.max_len, args.steps).to(dev).eval()
    requests = [make_request(args.seed, rid, args.rows, args.items, args.max_len) for rid in range(args.queries)]

    for rid in range(3):  # warm-up
        decode(model, torch.from_numpy(make_request(args.seed + 1, rid, args.rows, args.items, args.max_len)).to(dev),
               args.steps)

    def handle(rid):
        t0 = time.perf_counter()
        ids, scores = decode(model, torch.from_numpy(requests[rid]).to(dev), args.steps)
        return ids, scores, (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        results = list(pool.map(handle, range(args.queries)))
    wall = time.perf_counter() - t0

    checksum = 0.0
    for rid, (ids, scores, _) in enumerate(results):
        checksum += (rid + 1) * (float(sum(map(sum, ids))) + float(scores.astype(np.float64).sum()))
    latencies = [ms for _, _, ms in results]
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "generative_decode_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "steps": args.steps, "rows": args.rows,
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
