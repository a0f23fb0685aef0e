"""Wide&deep ranker served through ``torch.nn.DataParallel`` on one GPU, from a DataParallel checkpoint.

Written the way serving code inherited from a training repository often is: the training
script wrapped its model in ``nn.DataParallel`` and saved the wrapper's ``state_dict`` (every
key prefixed ``module.``), so the server wraps its model the same way, even on one GPU, just
to load that checkpoint: ``model = nn.DataParallel(WideDeep(vocab))`` (``device_ids=None``:
every visible GPU), ``torch.save(model.state_dict(), path)`` into a temporary folder, then a
fresh wrapped model's ``load_state_dict(torch.load(path, weights_only=True))`` and ``.eval()``.
On the CPU (``--device cpu``) the model is left unwrapped: it is wrapped only when
``torch.cuda.is_available() and dev.type == "cuda"``.

The model: a wide ``nn.EmbeddingBag(mode="sum")`` of width 1 over the 10 fields' ids, offset
per field into one table, beside 10 ``nn.Embedding(vocab, 16)`` concatenated with 13 dense
features into an MLP (256-128-1); the output is the sigmoid of wide + deep, the logit divided
by a ``temperature`` keyword argument (a Python float, scattered by DataParallel with the
tensors: ``model(dense, ids, temperature=1.0)``). DataParallel's ``forward`` scatters the
inputs to its device itself, then, on one GPU, calls the module directly.

A request is a numpy float32 dense block and int64 ids (16 to ``--max-rows`` rows: the row
count changes every request). The handler moves them with ``torch.from_numpy(a).cuda()``
(pageable) and reads the scores with ``scores.cpu().numpy()``, under ``torch.no_grad()``.
Clients: ``--threads`` ``threading.Thread`` workers pulling request ids from a pre-filled
``queue.Queue`` (one ``None`` sentinel each), results stored by request id. A few warm-up
requests run on the main thread first.

    python dataparallel_serve.py --threads 8 --queries 3000
    python dataparallel_serve.py --device cpu --threads 2 --queries 24 --vocab 500 --max-rows 48

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, wrapped (whether the model is a
DataParallel: false on the CPU) and checksum (every request's scores in request order,
position-weighted: the same for any thread count).
"""

import argparse
import json
import os
import queue
import tempfile
import threading
import time

import numpy as np
import torch
import torch.nn as nn

N_DENSE, FIELDS, DIM = 13, 10, 16
MIN_ROWS = 16
TEMPERATURE = 1.0


class WideDeep(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.wide = nn.EmbeddingBag(vocab * FIELDS, 1, mode="sum")  # one table, a slice per field
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(FIELDS))
        self.mlp = nn.Sequential(nn.Linear(N_DENSE + FIELDS * DIM, 256), nn.ReLU(),
                                 nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))
        self.register_buffer("field_base", torch.arange(FIELDS) * vocab)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        wide = self.wide(ids + self.field_base)  # [rows, 1]: each row's 10 ids, one bag a row
        deep = self.mlp(torch.cat([dense] + [e(ids[:, k]) for k, e in enumerate(self.embs)], dim=1))
        return torch.sigmoid((wide + deep) / temperature).squeeze(1)


def make_request(seed, rid, vocab, max_rows):
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(min(MIN_ROWS, max_rows), max_rows + 1))
    return rng.standard_normal((n, N_DENSE)).astype(np.float32), rng.integers(0, vocab, (n, FIELDS), dtype=np.int64)


def build(vocab: int, dev: torch.device) -> nn.Module:
    model = WideDeep(vocab).to(dev)
    if torch.cuda.is_available() and dev.type == "cuda":
        model = nn.DataParallel(model)  # device_ids=None: every visible GPU
    return model


def load_model(vocab: int, seed: int, dev: torch.device) -> nn.Module:
    """As the training run left it: the (wrapped) model's state_dict saved, loaded into a fresh one."""
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "widedeep.pt")
        torch.save(build(vocab, dev).state_dict(), path)  # keys "module.*" when wrapped
        model = build(vocab, dev)
        model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    model = load_model(args.vocab, args.seed, dev)
    on_gpu = dev.type == "cuda"

    def handle(dense_np, ids_np):
        t0 = time.perf_counter()
        with torch.no_grad():
            dense, ids = torch.from_numpy(dense_np), torch.from_numpy(ids_np)
            if on_gpu:
                dense, ids = dense.cuda(), ids.cuda()
            scores = model(dense, ids, temperature=TEMPERATURE)
            out = scores.cpu().numpy()
        return out, (time.perf_counter() - t0) * 1e3

    for k in range(4):  # warm-up
        handle(*make_request(args.seed + 1, k, args.vocab, args.max_rows))

    work = queue.Queue()
    for rid in range(args.queries):
        work.put(rid)
    for _ in range(args.threads):
        work.put(None)
    results, latencies = {}, {}

    def worker():
        while (rid := work.get()) is not None:
            req = make_request(args.seed, rid, args.vocab, args.max_rows)
            results[rid], latencies[rid] = handle(*req)

    threads = [threading.Thread(target=worker, name=f"client-{i}") for i in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    flat = np.concatenate([results[rid] for rid in range(args.queries)]).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(list(latencies.values()), [50, 99])
    print(json.dumps({"script": "dataparallel_serve", "threads": args.threads, "queries": len(results),
                      "qps": round(len(results) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "wrapped": isinstance(model, nn.DataParallel),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
