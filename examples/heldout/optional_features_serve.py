"""Ranker called with keyword features, some of them optional and missing per request, from asyncio.

Written the way a team whose feature store does not have every feature for every request
serves: the request is a dict of named numpy arrays, features the store could not fill are
simply **absent from the dict**, and the model takes them as keyword arguments with ``None``
defaults, branching in ``forward`` on which ones came. So the model's calls differ in which
keywords they pass, not only in their shapes, and one of its outputs is not a tensor.

The model (``OptionalFeatureRanker``, an ``nn.Module``, built after ``torch.manual_seed(seed)``,
in eval mode; its parameters made in this order): ``user_emb`` and ``item_emb``, each an
``nn.Embedding(vocab, 32)`` initialized ``normal_(std=0.1)``; ``cold_user``, a learned
``nn.Parameter`` of 32 values (``0.1 * torch.randn(32)``); ``context_proj``, an
``nn.Linear(4, 32)``; ``dense_proj``, an ``nn.Linear(13, 32)`` (no activation); ``mlp``, an
``nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))``; and ``version``, a plain
Python string attribute (``"ranker-2024.06"``). Its signature is keyword-only::

    forward(self, *, user_id, item_ids, dense, history=None, history_len=None, context=None,
            temperature: float = 1.0)

``user = user_emb(user_id)``; ``if context is not None:`` ``user = user + context_proj(context)``;
``item = item_emb(item_ids)``; ``if history is not None:`` the masked mean of ``item_emb`` over
each row's first ``history_len`` positions of ``history`` (the mask made on the device,
``torch.arange(H, device=history.device) < history_len[:, None]``; the sum of the masked
embeddings divided by ``history_len``), else ``cold_user`` expanded to ``[rows, 32]``; then
``logit = mlp(cat([user, item, history-or-cold, dense_proj(dense)], 1)).squeeze(1) / temperature``
and the output is the dict ``{"score": torch.sigmoid(logit), "logit": logit, "model_version":
self.version}`` (the last a string leaf, not a tensor).

Requests: request ``rid`` is drawn from ``np.random.default_rng([seed, rid])``, in this order:
``rows = integers(8, max_rows + 1)``; ``user_id = integers(0, vocab, rows)``; ``item_ids =
integers(0, vocab, rows)``; ``dense = standard_normal((rows, 13))`` as float32; one ``random()``:
below 0.6 the user is known and has a history, then ``history = integers(0, vocab, (rows, 20))``
and ``history_len = integers(1, 21, rows)`` (both int64; the positions at or past a row's length
then set to 0, the padding id); one more ``random()``: below 0.5 the request has a context, then
``context = standard_normal((rows, 4))`` as float32. The two draws are made for every request,
the arrays only when their feature is present. The temperature is 2.0 for every 10th request
(``rid % 10 == 0``), 1.0 for the others, passed as a Python float keyword.

The handler makes request ``rid``'s features dict ``{name: array}`` on the CPU (a missing
feature is absent from it), moves it with ``{k: torch.as_tensor(v, device=dev) for k, v in
feats.items()}``, calls ``model(**feats_on_dev, temperature=t)`` under
``torch.inference_mode()``, checks that ``out["model_version"]`` is the expected version string
and reads ``out["score"].cpu().numpy()``.

Clients: ``asyncio.run(main())``; the loop's default executor is set to a
``ThreadPoolExecutor(max_workers=--threads)`` (``loop.set_default_executor``); main creates one
task a request (``--queries`` of them), each ``async with sem:`` (an
``asyncio.Semaphore(--threads)``) ``await asyncio.to_thread(handle, rid)``, and gathers them.
A request's latency is measured around its ``to_thread`` await.

    python optional_features_serve.py --threads 8 --queries 3000
    python optional_features_serve.py --device cpu --threads 3 --queries 24 --vocab 500 --max-rows 32

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, with_history and with_context
(how many requests had each optional feature) and checksum (the sum over requests ``r`` of
``(r + 1)`` times the float64 sum of that request's scores: the same for any thread count).
"""

import argparse
import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_CONTEXT, DIM, H = 13, 4, 32, 20
P_HISTORY, P_CONTEXT = 0.6, 0.5
VERSION = "ranker-2024.06"


class OptionalFeatureRanker(nn.Module):
    def __init__(self, vocab: int, version: str = VERSION):
        super().__init__()
        self.user_emb = nn.Embedding(vocab, DIM)
        self.item_emb = nn.Embedding(vocab, DIM)
        nn.init.normal_(self.user_emb.weight, std=0.1)
        nn.init.normal_(self.item_emb.weight, std=0.1)
        self.cold_user = nn.Parameter(0.1 * torch.randn(DIM))
        self.context_proj = nn.Linear(N_CONTEXT, DIM)
        self.dense_proj = nn.Linear(N_DENSE, DIM)
        self.mlp = nn.Sequential(nn.Linear(4 * DIM, 64), nn.ReLU(), nn.Linear(64, 1))
        self.version = version

    def forward(
        self,
        *,
        user_id,
        item_ids,
        dense,
        history=None,
        history_len=None,
        context=None,
        temperature: float = 1.0,
    ):
        user = self.user_emb(user_id)
        if context is not None:
            user = user + self.context_proj(context)
        item = self.item_emb(item_ids)
        if history is not None:
            mask = (
                torch.arange(history.shape[1], device=history.device)
                < history_len[:, None]
            )
            summed = (self.item_emb(history) * mask.unsqueeze(2)).sum(1)
            hist = summed / history_len[:, None].clamp(min=1).to(summed.dtype)
        else:
            hist = self.cold_user.expand(user_id.shape[0], DIM)
        x = torch.cat([user, item, hist, self.dense_proj(dense)], dim=1)
        logit = self.mlp(x).squeeze(1) / temperature
        return {
            "score": torch.sigmoid(logit),
            "logit": logit,
            "model_version": self.version,
        }


def make_request(seed: int, rid: int, vocab: int, max_rows: int):
    """(features dict of numpy arrays, the optional ones absent when missing; temperature)."""
    rng = np.random.default_rng([seed, rid])
    rows = int(rng.integers(8, max_rows + 1))
    feats = {
        "user_id": rng.integers(0, vocab, rows),
        "item_ids": rng.integers(0, vocab, rows),
        "dense": rng.standard_normal((rows, N_DENSE)).astype(np.float32),
    }
    if rng.random() < P_HISTORY:
        history = rng.integers(0, vocab, (rows, H))
        history_len = rng.integers(1, H + 1, rows)
        history[np.arange(H)[None, :] >= history_len[:, None]] = 0  # padding
        feats["history"], feats["history_len"] = history, history_len
    if rng.random() < P_CONTEXT:
        feats["context"] = rng.standard_normal((rows, N_CONTEXT)).astype(np.float32)
    return feats, 2.0 if rid % 10 == 0 else 1.0


async def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument(
        "--max-rows", type=int, default=128, help="rows a request: 8 to this"
    )
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = OptionalFeatureRanker(args.vocab).to(dev).eval()

    def handle(rid):
        feats, t = make_request(args.seed, rid, args.vocab, args.max_rows)
        feats_on_dev = {k: torch.as_tensor(v, device=dev) for k, v in feats.items()}
        with torch.inference_mode():
            out = model(**feats_on_dev, temperature=t)
        if out["model_version"] != VERSION:
            raise RuntimeError(
                f"request {rid}: model version {out['model_version']!r}, expected {VERSION!r}"
            )
        return out["score"].cpu().numpy(), "history" in feats, "context" in feats

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=args.threads))
    sem = asyncio.Semaphore(args.threads)

    async def one(rid):
        async with sem:
            t0 = time.perf_counter()
            result = await asyncio.to_thread(handle, rid)
            return result, (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(one(rid)) for rid in range(args.queries)]
    done = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0

    checksum = 0.0
    for rid, ((scores, _, _), _) in enumerate(done):
        checksum += (rid + 1) * float(np.sum(scores, dtype=np.float64))
    p50, p99 = np.percentile([ms for _, ms in done], [50, 99])
    print(
        json.dumps(
            {
                "script": "optional_features_serve",
                "qps": round(len(done) / wall, 1),
                "p50_ms": round(float(p50), 3),
                "p99_ms": round(float(p99), 3),
                "threads": args.threads,
                "queries": len(done),
                "with_history": sum(h for (_, h, _), _ in done),
                "with_context": sum(c for (_, _, c), _ in done),
                "checksum": checksum,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
