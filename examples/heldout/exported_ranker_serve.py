"""DCN-v2 ranker served as an exported graph artefact (torch.export, FX or TorchScript trace).

Written the way a team deploys a ranker in 2025-2026: the trained eager model is turned into a
graph artefact once at start-up and only that artefact serves; the eager module is dropped. The
process sets ``PYTORCH_CUDA_ALLOC_CONF`` to ``expandable_segments:True`` (``os.environ.setdefault``,
before ``import torch``), then ``torch.set_float32_matmul_precision("high")`` and
``torch.backends.cudnn.benchmark = True`` right after the imports, as production launchers do.

The model (``DCNv2Ranker``, ``forward(ids, dense)``; ids ``[rows, 8]`` int64, dense ``[rows, 13]``
float32), its modules built in this order after ``torch.manual_seed(seed)``:

* ``tables``: 8 fields, ``nn.Embedding(vocab, 16)`` each; field k looks up ``ids[:, k]``;
* ``cross``: 2 cross layers, ``nn.Linear(141, 141)`` each;
* ``deep``: ``nn.Sequential(Linear(141, 256), ReLU, Linear(256, 128), ReLU)``;
* ``head``: ``nn.Linear(269, 1)``.

``x0`` is the 8 fields' embeddings then the 13 dense features, concatenated (8 * 16 + 13 = 141
wide); the cross network runs ``x_{l+1} = x0 * (W_l x_l + b_l) + x_l`` from ``x_0 = x0`` for both
layers; the deep MLP runs on ``x0`` in parallel; the cross output and the deep output are
concatenated (141 + 128 = 269) into ``head``, one logit a row (``squeeze(-1)``). It returns a dict
``{"ctr": sigmoid(logit), "logit": logit}``, both ``[rows]``. Eval mode, moved to ``--device``.

The artefact (``--export``):

* ``export`` (default): ``torch.export.export(model, (ids, dense), dynamic_shapes=...)`` on an
  example of ``--max-rows`` rows, dim 0 of both inputs one ``torch.export.Dim("rows", min=2,
  max=--max-rows)``; the ``ExportedProgram`` is written with ``torch.export.save`` to a file in a
  temporary folder and read back with ``torch.export.load`` (a deployment's round trip), then
  ``ep.module()``, an unlifted ``torch.fx.GraphModule`` with torch.export's input-check hooks, is
  served;
* ``fx``: ``torch.fx.symbolic_trace(model)``, a ``torch.fx.GraphModule``;
* ``trace``: ``torch.jit.trace(model, (ids, dense), strict=False)`` on the same example (a dict
  output needs ``strict=False``), a ``torch.jit.ScriptModule``; no freezing, no
  ``optimize_for_inference``.

Requests: request ``rid`` (0 to ``--queries`` - 1) from ``np.random.default_rng([seed, rid])``, in
this order: its row count, ``integers(lo, max_rows + 1)`` with ``lo = max(2, max_rows // 8)`` (so
always inside the Dim's range); its ids, ``integers(0, vocab, (rows, 8), dtype=np.int64)``; its
dense features, ``standard_normal((rows, 13))`` as float32. All are made up-front. A warm-up of 3
requests made the same way from seed + 1 runs before the clock starts; their outputs are dropped.

The handler (under ``torch.inference_mode()``) moves the ids with ``torch.as_tensor(ids,
device=dev)`` and the dense features with ``torch.from_numpy(dense).to(dev, non_blocking=True)``
(pageable memory), calls the artefact and reads ``out["ctr"].cpu().numpy()`` and
``out["logit"].cpu().numpy()``. Clients: ``--threads`` ``threading.Thread`` workers pulling
request ids from a ``queue.Queue`` (one ``None`` sentinel a worker ends it), storing the outputs
in a list by request id.

    python exported_ranker_serve.py --threads 8 --queries 4000
    python exported_ranker_serve.py --threads 8 --queries 4000 --export trace
    python exported_ranker_serve.py --device cpu --threads 3 --queries 24 --vocab 500 --max-rows 32

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, export (the mode), artefact (the
type name of the served object, ``type(served).__name__``: ``GraphModule`` for export;
``DCNv2Ranker`` for fx, whose ``GraphModule`` takes the traced root's class name;
``TopLevelTracedModule``, a ``torch.jit.ScriptModule``, for trace) and checksum: the sum over
requests r of (r + 1) * (the sum of r's ctr + 0.01 * the sum of r's logits), in float64, so the
same for any thread count.
"""

import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import argparse  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

torch.set_float32_matmul_precision("high")
torch.backends.cudnn.benchmark = True

FIELDS, N_DENSE, DIM, CROSS = 8, 13, 16, 2
WIDTH = FIELDS * DIM + N_DENSE  # 141


class DCNv2Ranker(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tables = nn.ModuleList([nn.Embedding(vocab, DIM) for _ in range(FIELDS)])
        self.cross = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(CROSS)])
        self.deep = nn.Sequential(
            nn.Linear(WIDTH, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU()
        )
        self.head = nn.Linear(WIDTH + 128, 1)

    def forward(self, ids, dense):
        embs = [table(ids[:, k]) for k, table in enumerate(self.tables)]
        x0 = torch.cat(embs + [dense], dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        logit = self.head(torch.cat([x, self.deep(x0)], dim=1)).squeeze(-1)
        return {"ctr": torch.sigmoid(logit), "logit": logit}


def make_request(seed, rid, max_rows, vocab):
    rng = np.random.default_rng([seed, rid])
    rows = int(rng.integers(max(2, max_rows // 8), max_rows + 1))
    ids = rng.integers(0, vocab, (rows, FIELDS), dtype=np.int64)
    dense = rng.standard_normal((rows, N_DENSE)).astype(np.float32)
    return ids, dense


def build_artefact(model, mode, max_rows, dev):
    """The graph artefact that serves in place of ``model``."""
    ids = torch.zeros(max_rows, FIELDS, dtype=torch.int64, device=dev)
    dense = torch.zeros(max_rows, N_DENSE, device=dev)
    if mode == "export":
        rows = torch.export.Dim("rows", min=2, max=max_rows)
        ep = torch.export.export(
            model, (ids, dense), dynamic_shapes=({0: rows}, {0: rows})
        )
        with (
            tempfile.TemporaryDirectory() as tmp
        ):  # as deployed: saved, shipped, loaded
            path = os.path.join(tmp, "ranker.pt2")
            torch.export.save(ep, path)
            ep = torch.export.load(path)
        return ep.module()
    if mode == "fx":
        return torch.fx.symbolic_trace(model)
    if mode == "trace":
        return torch.jit.trace(model, (ids, dense), strict=False)
    raise ValueError(mode)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--export", choices=("export", "fx", "trace"), default="export")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    model = DCNv2Ranker(args.vocab).to(dev).eval()
    served = build_artefact(model, args.export, args.max_rows, dev)
    del model  # only the artefact serves

    def score(ids, dense):
        with torch.inference_mode():
            out = served(
                torch.as_tensor(ids, device=dev),
                torch.from_numpy(dense).to(dev, non_blocking=True),
            )
            return out["ctr"].cpu().numpy(), out["logit"].cpu().numpy()

    for k in range(3):  # warm-up
        score(*make_request(args.seed + 1, k, args.max_rows, args.vocab))

    requests = [
        make_request(args.seed, rid, args.max_rows, args.vocab)
        for rid in range(args.queries)
    ]
    todo = queue.Queue()
    for rid in range(args.queries):
        todo.put(rid)
    for _ in range(args.threads):
        todo.put(None)
    results = [None] * args.queries
    latencies = []
    lock = threading.Lock()

    def work():
        while True:
            rid = todo.get()
            if rid is None:
                return
            t0 = time.perf_counter()
            results[rid] = score(*requests[rid])
            ms = (time.perf_counter() - t0) * 1e3
            with lock:
                latencies.append(ms)

    threads = [
        threading.Thread(target=work, name=f"client-{k}") for k in range(args.threads)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    checksum = 0.0
    for rid, (ctr, logit) in enumerate(results):
        part = ctr.astype(np.float64).sum() + 0.01 * logit.astype(np.float64).sum()
        checksum += (rid + 1) * float(part)
    p50, p99 = np.percentile(latencies, [50, 99])
    print(
        json.dumps(
            {
                "script": "exported_ranker_serve",
                "threads": args.threads,
                "queries": len(latencies),
                "qps": round(len(latencies) / wall, 1),
                "p50_ms": round(float(p50), 3),
                "p99_ms": round(float(p99), 3),
                "export": args.export,
                "artefact": type(served).__name__,
                "checksum": checksum,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
