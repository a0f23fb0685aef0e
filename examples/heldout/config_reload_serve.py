"""Ranker whose ``forward`` reads live configuration that an admin reloader changes while it serves.

Written the way a ranking service with feature flags and a hot-reloaded serving config often
is: the weights never change, but ``forward`` reads three kinds of configuration from outside
its own parameters, all plain Python values used in tensor arithmetic:

* ``FLAGS``, a module-level dict (``{"blend": 0.5, "use_freshness": False, "fresh_weight":
  0.3}``): ``FLAGS["blend"]`` weighs the deep logit against a wide linear logit over the dense
  features (``blend * deep + (1 - blend) * wide``), and ``if FLAGS["use_freshness"]:`` adds
  ``FLAGS["fresh_weight"] * freshness`` (a per-row input);
* ``TEMPERATURE``, a module-level float (1.0 at start) the logits are divided by, rebound by
  the reloader with ``global TEMPERATURE``;
* ``model.cfg``, a mutable ``@dataclass ServingConfig(clip, bias)`` (``clip=1.0``,
  ``bias=0.0`` at start) that the reloader changes **in place** (``model.cfg.clip = ...``):
  ``logits.clamp(-cfg.clip, cfg.clip) + cfg.bias``.

The output is ``torch.sigmoid`` of that, one score a row. None of these is a tensor, and none
is set through the model's own ``__setattr__``: the dict is mutated, the global rebound, the
dataclass's fields assigned. A CUDA graph captured in the first wave bakes every one of them
into its kernels as it was then (the blend, the temperature, the clip and the bias as kernel
scalars, the ``if`` as the branch taken, without freshness): replayed for a later wave it
would give the first configuration's numbers, wrong scores, for every later wave.

The model: ``N_TABLES`` ``nn.EmbeddingBag(vocab, 16, mode="sum")`` tables, each over
``N_IDS`` fixed ids a row (``ids`` of shape ``[rows, N_TABLES, N_IDS]``), beside 13 dense
features through a small MLP (13-32-16); a top MLP (80-64-1) gives the deep logit; the wide
logit is ``nn.Linear(13, 1)`` of the dense features. Built after ``torch.manual_seed(seed)``.

Requests (``--queries`` of ``--rows`` rows, made up-front from ``np.random.default_rng([seed,
rid])``: int64 ids, float32 dense features, float32 freshness in [0, 1)) come in waves of
``--reload-every``. One ``ThreadPoolExecutor(--threads)`` serves the whole run: a wave is
submitted, every one of its futures waited for (the pool drains), then the reloader, on the
main thread, applies change number ``w`` before wave ``w`` (w = 1, 2, ...): the kind is
``CHANGES[(w - 1) % 6]`` and ``n = (w - 1) // 6`` is how many of that kind came before:

* ``blend``: ``FLAGS["blend"] = BLENDS[n % 4]`` (0.8, 0.35, 0.65, 0.2);
* ``freshness``: ``FLAGS["use_freshness"] = not FLAGS["use_freshness"]`` (on, off, on, ...);
* ``temperature``: ``TEMPERATURE = TEMPS[n % 4]`` (1.6, 0.7, 1.25, 0.5);
* ``clip``: ``model.cfg.clip = CLIPS[n % 4]`` (0.4, 2.5, 0.7, 1.5);
* ``bias``: ``model.cfg.bias = BIASES[n % 4]`` (0.3, -0.2, 0.15, -0.35);
* ``reload``: every value set again to what it is (the config "file" re-read, nothing changed).

With the defaults (3,000 requests, waves of 150) that is 20 waves and 19 reloads, every kind
at least three times; at the tiny sizes below 8 waves and 7 reloads, every kind at least once.
A handler moves a request with ``torch.as_tensor(ids, device=dev)`` and
``torch.from_numpy(a).to(dev)``, scores it under ``torch.inference_mode()`` and reads the
scores with ``.cpu().numpy()``.

    python config_reload_serve.py --threads 8 --queries 3000
    python config_reload_serve.py --device cpu --threads 2 --queries 48 --reload-every 6 --rows 16 --vocab 500

The last line is JSON: qps (the waves' serving time, reloads left out), p50_ms, p99_ms,
threads, queries, reloads (how many were applied), wave_sums (the sum of each wave's scores)
and checksum (every request's scores, in request order, weighted by position: the same for
any thread count).
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

N_TABLES, N_IDS, N_DENSE, DIM = 4, 3, 13, 16
CHANGES = ("blend", "freshness", "temperature", "clip", "bias", "reload")
BLENDS = (0.8, 0.35, 0.65, 0.2)
TEMPS = (1.6, 0.7, 1.25, 0.5)
CLIPS = (0.4, 2.5, 0.7, 1.5)
BIASES = (0.3, -0.2, 0.15, -0.35)

FLAGS = {"blend": 0.5, "use_freshness": False, "fresh_weight": 0.3}
TEMPERATURE = 1.0


@dataclass
class ServingConfig:
    clip: float
    bias: float


class Ranker(nn.Module):
    def __init__(self, vocab, cfg):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(vocab, DIM, mode="sum") for _ in range(N_TABLES))
        self.dense = nn.Sequential(nn.Linear(N_DENSE, 32), nn.ReLU(), nn.Linear(32, DIM))
        self.top = nn.Sequential(nn.Linear(DIM * (N_TABLES + 1), 64), nn.ReLU(), nn.Linear(64, 1))
        self.wide = nn.Linear(N_DENSE, 1)
        self.cfg = cfg

    def forward(self, ids, dense, freshness):
        feats = [t(ids[:, i]) for i, t in enumerate(self.tables)] + [self.dense(dense)]
        deep = self.top(torch.cat(feats, dim=1)).squeeze(1)
        logits = FLAGS["blend"] * deep + (1.0 - FLAGS["blend"]) * self.wide(dense).squeeze(1)
        if FLAGS["use_freshness"]:
            logits = logits + FLAGS["fresh_weight"] * freshness
        logits = logits / TEMPERATURE
        return torch.sigmoid(logits.clamp(-self.cfg.clip, self.cfg.clip) + self.cfg.bias)


def make_request(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    ids = rng.integers(0, vocab, (rows, N_TABLES, N_IDS))
    dense = rng.standard_normal((rows, N_DENSE)).astype(np.float32)
    return ids, dense, rng.random(rows).astype(np.float32)


def reload_config(model, w):
    """The admin reloader: change number ``w`` (before wave ``w``); returns its kind."""
    global TEMPERATURE
    kind, n = CHANGES[(w - 1) % len(CHANGES)], (w - 1) // len(CHANGES)
    if kind == "blend":
        FLAGS["blend"] = BLENDS[n % len(BLENDS)]
    elif kind == "freshness":
        FLAGS["use_freshness"] = not FLAGS["use_freshness"]
    elif kind == "temperature":
        TEMPERATURE = TEMPS[n % len(TEMPS)]
    elif kind == "clip":
        model.cfg.clip = CLIPS[n % len(CLIPS)]
    elif kind == "bias":
        model.cfg.bias = BIASES[n % len(BIASES)]
    else:  # the config re-read: the same values written back
        FLAGS.update(dict(FLAGS))
        TEMPERATURE = float(TEMPERATURE)
        model.cfg.clip, model.cfg.bias = float(model.cfg.clip), float(model.cfg.bias)
    return kind


class Server:
    def __init__(self, model, requests, dev):
        self.model, self.requests, self.dev = model, requests, dev

    def score(self, rid):
        ids, dense, fresh = self.requests[rid]
        t0 = time.perf_counter()
        with torch.inference_mode():
            ids_t = torch.as_tensor(ids, device=self.dev)
            out = self.model(ids_t, torch.from_numpy(dense).to(self.dev), torch.from_numpy(fresh).to(self.dev))
            scores = out.cpu().numpy()
        return rid, scores, (time.perf_counter() - t0) * 1e3


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--reload-every", type=int, default=150)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = Ranker(args.vocab, ServingConfig(clip=1.0, bias=0.0)).to(dev).eval()
    requests = [make_request(args.seed, rid, args.rows, args.vocab) for rid in range(args.queries)]
    server = Server(model, requests, dev)

    results, latencies, serving, reloads, waves = {}, [], 0.0, 0, []
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        for w, start in enumerate(range(0, args.queries, args.reload_every)):
            if w:
                reload_config(model, w)
                reloads += 1
            t0 = time.perf_counter()
            futures = [pool.submit(server.score, rid)
                       for rid in range(start, min(start + args.reload_every, args.queries))]
            wait(futures)
            serving += time.perf_counter() - t0
            total = 0.0
            for f in futures:
                rid, scores, ms = f.result()
                results[rid] = scores
                latencies.append(ms)
                total += float(scores.astype(np.float64).sum())
            waves.append(total)
    flat = np.concatenate([results[rid].astype(np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "config_reload_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / serving, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "reloads": reloads, "wave_sums": waves,
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
