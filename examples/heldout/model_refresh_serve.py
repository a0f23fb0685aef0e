"""Ranker refreshed while it serves: new weights and a new calibration between request waves.

A team retrains every few minutes and pushes the new model into the running server
without a restart. Requests come in waves of ``--refresh-every``; between two waves (the
pool drained) the refresher installs the next version in one of the four ways teams do,
taken in turn:

* ``inplace``: ``model.load_state_dict(sd)``, copying into the existing parameters;
* ``assign``: ``model.load_state_dict(sd, assign=True)``, the state dict's own tensors
  becoming the parameters (how checkpoints loaded with ``mmap=True`` or onto the meta
  device are installed);
* ``swap``: a new model object built from the state dict replaces the server's reference,
  the old one is dropped;
* ``calibrate``: only the Platt temperature changes, a plain Python float attribute
  (``model.temperature = t``) that ``forward`` divides the logits by.

``--threads`` pool threads (one ``ThreadPoolExecutor`` for the whole run) score requests:
numpy ids with ``torch.as_tensor(ids, device=dev)``, dense features with
``torch.from_numpy(a).to(dev)``, under ``torch.inference_mode()``, results read with
``.cpu().numpy()``.

    python model_refresh_serve.py --threads 4 --queries 3000
    python model_refresh_serve.py --device cpu --threads 2 --queries 40 --refresh-every 8 --batch 16 --vocab 500

The last line is JSON: qps (the waves' serving time, refreshes left out), p50_ms, p99_ms,
threads, queries, versions (how many were served), wave_sums (the sum of each wave's scores)
and checksum (every request's scores, in request order, weighted by position).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_TABLES, N_IDS, N_DENSE = 8, 4, 13
MODES = ("inplace", "assign", "swap", "calibrate")


class Ranker(nn.Module):
    def __init__(self, vocab, dim=32, temperature=1.0):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(vocab, dim, mode="sum") for _ in range(N_TABLES))
        self.dense = nn.Sequential(nn.Linear(N_DENSE, 64), nn.ReLU(), nn.Linear(64, dim))
        self.top = nn.Sequential(nn.Linear(dim * (N_TABLES + 1), 128), nn.ReLU(), nn.Linear(128, 1))
        self.temperature = temperature

    def forward(self, ids, dense):
        feats = [t(ids[:, i]) for i, t in enumerate(self.tables)] + [self.dense(dense)]
        logits = self.top(torch.cat(feats, dim=1)).squeeze(1)
        return torch.sigmoid(logits / self.temperature)


def weights(version, seed, vocab, dev):
    """Version ``version``'s state dict (on ``dev``) and temperature, as the trainer pushes them."""
    torch.manual_seed(seed * 1000 + version)
    sd = {k: v.to(dev) for k, v in Ranker(vocab).state_dict().items()}
    return sd, 0.6 + 0.25 * version


def make_request(seed, rid, batch, vocab):
    rng = np.random.default_rng([seed, rid])
    ids = rng.integers(0, vocab, (batch, N_TABLES, N_IDS))
    return ids, rng.standard_normal((batch, N_DENSE)).astype(np.float32)


class Server:
    def __init__(self, args, dev):
        self.args, self.dev = args, dev
        sd, temp = weights(0, args.seed, args.vocab, dev)
        self.model = self.build(sd, temp)

    def build(self, sd, temp):
        m = Ranker(self.args.vocab, temperature=temp)
        m.load_state_dict(sd)
        return m.to(self.dev).eval()

    def refresh(self, version):
        mode = MODES[(version - 1) % len(MODES)]
        sd, temp = weights(version, self.args.seed, self.args.vocab, self.dev)
        if mode == "inplace":
            self.model.load_state_dict(sd)
        elif mode == "assign":
            self.model.load_state_dict(sd, assign=True)
        elif mode == "swap":
            self.model = self.build(sd, temp)
        if mode in ("calibrate", "swap"):
            self.model.temperature = temp
        return mode

    def score(self, rid):
        ids, dense = make_request(self.args.seed, rid, self.args.batch, self.args.vocab)
        t0 = time.perf_counter()
        with torch.inference_mode():
            ids_t = torch.as_tensor(ids.reshape(len(ids), -1), device=self.dev).view(-1, N_TABLES, N_IDS)
            out = self.model(ids_t, torch.from_numpy(dense).to(self.dev))
            scores = out.cpu().numpy()
        return rid, scores, (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--refresh-every", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    server = Server(args, dev)

    results, latencies, serving, version = {}, [], 0.0, 0
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for start in range(0, args.queries, args.refresh_every):
            if start:
                version += 1
                server.refresh(version)
            t0 = time.perf_counter()
            for rid, scores, ms in pool.map(server.score, range(start, min(start + args.refresh_every, args.queries))):
                results[rid] = scores
                latencies.append(ms)
            serving += time.perf_counter() - t0
    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    waves = [float(np.sum([results[rid].astype(np.float64).sum() for rid in range(s, min(s + args.refresh_every,
                                                                                          args.queries))]))
             for s in range(0, args.queries, args.refresh_every)]
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "model_refresh_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / serving, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "versions": version + 1, "wave_sums": waves, "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
