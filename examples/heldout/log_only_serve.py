"""Two-tower style scorer that logs, and prints no throughput of its own.

Written the way a service's smoke test often is: the ``logging`` module reports progress
(``INFO scored 500/3000 requests``), and the last line is a JSON summary of what was served -
the request count and a checksum - with no queries/s, no latency. A request is a user feature
block and candidate item ids (numpy; 64-256 candidates, most full); the handler moves them with
``torch.from_numpy(a).to(dev)`` and ``torch.as_tensor(ids, device=dev)``, scores every candidate
against the user under ``torch.inference_mode()`` and reads the scores with ``.cpu().numpy()``.
Clients are ``ThreadPoolExecutor(--threads).map``.

    python log_only_serve.py --threads 8 --queries 4000
    python log_only_serve.py --device cpu --threads 2 --queries 24 --rows 16 --vocab 500

The last line is JSON: served, threads, queries and checksum (every request's scores, in
request order, weighted by position: the same for any thread count). No qps: a tool that wants
one must measure it itself.
"""

import argparse
import json
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_USER, DIM = 24, 32
log = logging.getLogger("scorer")


class TwoTower(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.user = nn.Sequential(nn.Linear(N_USER, 128), nn.ReLU(), nn.Linear(128, DIM))
        self.items = nn.Embedding(vocab, DIM)
        self.item_mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))
        self.bias = nn.Embedding(vocab, 1)

    def forward(self, user: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        u = self.user(user)  # [1, DIM]
        v = self.item_mlp(self.items(ids))  # [n, DIM]
        return torch.sigmoid(v @ u.squeeze(0) + self.bias(ids).squeeze(1))


def make_request(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    n = rows if rng.random() < 0.75 else int(rng.integers(max(1, rows // 4), rows))
    user = rng.standard_normal((1, N_USER)).astype(np.float32)
    ids = rng.integers(0, vocab, n, dtype=np.int64)
    return user, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--rows", type=int, default=256, help="candidates of the largest request")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = TwoTower(args.vocab).to(dev).eval()

    @torch.inference_mode()
    def score(req):
        user, ids = req
        return model(torch.from_numpy(user).to(dev), torch.as_tensor(ids, device=dev)).cpu().numpy()

    requests = [make_request(args.seed, rid, args.rows, args.vocab) for rid in range(args.queries)]
    results = []
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for k, out in enumerate(pool.map(score, requests), 1):
            results.append(out)
            if k % max(1, args.queries // 6) == 0:
                log.info("scored %d/%d requests", k, args.queries)
    flat = np.concatenate(results).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    print(json.dumps({"script": "log_only_serve", "served": len(results), "threads": args.threads,
                      "queries": args.queries, "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
