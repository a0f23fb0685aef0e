"""DeepFM written as a Triton Inference Server Python backend, driven by an in-process stand-in of the server.

Written the way a team writes ``model.py`` for Triton's Python backend: a ``TritonPythonModel``
class with ``initialize(self, args)``, ``execute(self, requests)`` and ``finalize(self)``, and
nothing else of the server's. Triton is not imported (it is not a pip package of this project);
a small stand-in of the server in this file calls those three methods the way Triton does:

* ``initialize(args)`` gets Triton's ``args`` dict of strings: ``model_config`` (the model's
  configuration as JSON, its ``parameters`` as ``{"seed": {"string_value": "0"}, ...}``),
  ``model_instance_kind`` (``"GPU"`` or ``"CPU"``) and ``model_instance_device_id``; it sets
  ``torch.manual_seed(seed)``, builds the model and moves it to ``cuda:<device id>`` (or the
  CPU), in eval mode;
* ``execute(requests)`` gets **a list of requests, one dynamic batch**, each with ``inputs``, a
  dict of numpy arrays of that request's rows (``DENSE`` float32 ``[n, 13]``, ``SPARSE_IDS``
  int64 ``[n, 8]``; 1-32 rows a request); it ``np.concatenate``s every request's rows, moves
  each input with **one** ``torch.from_numpy(a).to(dev)``, calls the model once on the whole
  batch under ``torch.no_grad()``, splits the scores back by the requests' row counts with
  ``torch.split`` and returns a list of responses, one a request in order, each with
  ``outputs = {"SCORE": part.cpu().numpy()}``;
* ``finalize()`` drops the model when the server stops.

The stand-in server: ``--threads`` client threads, each taking request numbers from a shared
queue and sending that request to the server's ``queue.Queue`` with a ``threading.Event`` of its
own, then waiting on it. One scheduler thread is the dynamic batcher, as Triton's: it takes the
first queued request, then whatever else arrives within ``--max-delay-ms``, up to
``--max-batch`` requests (Triton's batcher waits up to ``max_queue_delay_microseconds`` for a
batch to fill; its ``max_batch_size`` counts rows, this one's bound counts requests), calls
``execute`` on them, stores each response on its request and sets its event. So the model sees
a different row count almost every call, and only the scheduler thread calls it.

The model: DeepFM over 8 fields' ids offset into shared tables: a first-order weight per id
(``nn.Embedding(8 * vocab, 1)``), an FM term over the fields' 16-wide embeddings
(``0.5 * ((sum e)^2 - sum e^2)`` summed over the width), a deep MLP (8 * 16 + 13 dense
features, 128-64-1) on the embeddings and the dense features, their sum through a sigmoid. No
term mixes rows (no BatchNorm, no dropout, eval mode), so a row's score does not depend on the
batch it was served in.

Requests (``--queries``, made up-front from ``np.random.default_rng([seed, rid])``, in this
order: the row count ``integers(1, 33)``, the dense features ``standard_normal((n, 13))`` as
float32, the ids ``integers(0, vocab, (n, 8))``).

    python triton_backend_serve.py --threads 16 --queries 4000
    python triton_backend_serve.py --device cpu --threads 3 --queries 40 --vocab 500 --max-delay-ms 20

The last line is JSON: qps, p50_ms, p99_ms, threads, queries, batches (how many ``execute``
calls), mean_batch (requests per ``execute``) and checksum (every request's scores, in request
order, weighted by position). How requests are grouped into batches depends on timing; each
row's score does not, up to the floating-point differences of matrix products of different
sizes: checksums agree to rounding across runs and thread counts, not exactly.
"""

import argparse
import json
import queue
import threading
import time

import numpy as np
import torch
import torch.nn as nn

N_FIELDS, N_DENSE, DIM, MAX_ROWS = 8, 13, 16, 32


class DeepFM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.register_buffer("offsets", torch.arange(N_FIELDS) * vocab)
        self.first = nn.Embedding(N_FIELDS * vocab, 1)
        self.emb = nn.Embedding(N_FIELDS * vocab, DIM)
        self.deep = nn.Sequential(nn.Linear(N_FIELDS * DIM + N_DENSE, 128), nn.ReLU(), nn.Linear(128, 64),
                                  nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense, ids):
        idx = ids + self.offsets
        first = self.first(idx).sum(dim=(1, 2))
        e = self.emb(idx)
        fm = 0.5 * (e.sum(dim=1).pow(2) - e.pow(2).sum(dim=1)).sum(dim=1)
        deep = self.deep(torch.cat([e.flatten(1), dense], dim=1)).squeeze(1)
        return torch.sigmoid(first + fm + deep)


class InferenceRequest:
    """What the stand-in server hands ``execute``: a request's named numpy inputs."""

    def __init__(self, inputs):
        self.inputs = inputs
        self.response = None
        self.done = threading.Event()


class InferenceResponse:
    def __init__(self, outputs):
        self.outputs = outputs


class TritonPythonModel:
    """The backend, as Triton's Python backend loads it from ``model.py``."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        if args["model_instance_kind"] == "GPU":
            self.device = torch.device(f"cuda:{args['model_instance_device_id']}")
        else:
            self.device = torch.device("cpu")
        torch.manual_seed(int(params["seed"]))
        self.model = DeepFM(int(params["vocab"])).to(self.device).eval()
        self.output_name = config["output"][0]["name"]

    def execute(self, requests):
        counts = [len(r.inputs["DENSE"]) for r in requests]
        dense = torch.from_numpy(np.concatenate([r.inputs["DENSE"] for r in requests])).to(self.device)
        ids = torch.from_numpy(np.concatenate([r.inputs["SPARSE_IDS"] for r in requests])).to(self.device)
        with torch.no_grad():
            scores = self.model(dense, ids)
        return [InferenceResponse({self.output_name: part.cpu().numpy()}) for part in torch.split(scores, counts)]

    def finalize(self):
        self.model = None


class StandInServer:
    """Triton's part: one model instance, a dynamic batcher on one scheduler thread."""

    def __init__(self, backend, max_batch, max_delay_ms):
        self.backend, self.max_batch, self.max_delay = backend, max_batch, max_delay_ms / 1e3
        self.inbox = queue.Queue()
        self.batches, self.batched = 0, 0
        self.scheduler = threading.Thread(target=self._schedule, name="triton-scheduler")

    def start(self):
        self.scheduler.start()

    def enqueue(self, inputs):
        req = InferenceRequest(inputs)
        self.inbox.put(req)
        return req

    def infer(self, inputs):
        req = self.enqueue(inputs)
        if not req.done.wait(timeout=60):
            raise TimeoutError("no response in 60 s")
        return req.response

    def stop(self):
        self.inbox.put(None)
        self.scheduler.join()
        self.backend.finalize()

    def _schedule(self):
        while True:
            first = self.inbox.get()
            if first is None:
                return
            batch = [first]
            deadline = time.perf_counter() + self.max_delay
            while len(batch) < self.max_batch:
                try:
                    nxt = self.inbox.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if nxt is None:
                    self.inbox.put(None)  # (seen again once this batch is served)
                    break
                batch.append(nxt)
            responses = self.backend.execute(batch)
            self.batches += 1
            self.batched += len(batch)
            for req, resp in zip(batch, responses):
                req.response = resp
                req.done.set()


def backend_args(seed, vocab, device, max_batch=16, max_delay_ms=1.0):
    """Triton's ``args`` for ``initialize``: strings, the model configuration as JSON."""
    dev = torch.device(device)
    config = {"name": "deepfm", "backend": "python", "max_batch_size": max_batch * MAX_ROWS,
              "input": [{"name": "DENSE", "data_type": "TYPE_FP32", "dims": [N_DENSE]},
                        {"name": "SPARSE_IDS", "data_type": "TYPE_INT64", "dims": [N_FIELDS]}],
              "output": [{"name": "SCORE", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}],
              "dynamic_batching": {"max_queue_delay_microseconds": int(max_delay_ms * 1000)},
              "parameters": {"seed": {"string_value": str(seed)}, "vocab": {"string_value": str(vocab)}}}
    return {"model_config": json.dumps(config), "model_name": "deepfm", "model_version": "1",
            "model_instance_kind": "GPU" if dev.type == "cuda" else "CPU",
            "model_instance_device_id": str(dev.index or 0)}


def make_request(seed, rid, vocab):
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(1, MAX_ROWS + 1))
    return {"DENSE": rng.standard_normal((n, N_DENSE)).astype(np.float32),
            "SPARSE_IDS": rng.integers(0, vocab, (n, N_FIELDS))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=16, help="client threads")
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--max-batch", type=int, default=16, help="requests of the largest dynamic batch")
    ap.add_argument("--max-delay-ms", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    backend = TritonPythonModel()
    backend.initialize(backend_args(args.seed, args.vocab, args.device, args.max_batch, args.max_delay_ms))
    server = StandInServer(backend, args.max_batch, args.max_delay_ms)
    server.start()

    requests = [make_request(args.seed, rid, args.vocab) for rid in range(args.queries)]
    todo: "queue.Queue[int]" = queue.Queue()
    for rid in range(args.queries):
        todo.put(rid)
    results, latencies, lock = {}, [], threading.Lock()

    def client():
        while True:
            try:
                rid = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            resp = server.infer(requests[rid])
            ms = (time.perf_counter() - t0) * 1e3
            with lock:
                results[rid] = resp.outputs["SCORE"]
                latencies.append(ms)

    clients = [threading.Thread(target=client, name=f"client-{k}") for k in range(args.threads)]
    t0 = time.perf_counter()
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    wall = time.perf_counter() - t0
    server.stop()

    flat = np.concatenate([results[rid] for rid in range(args.queries)]).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "triton_backend_serve", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "batches": server.batches,
                      "mean_batch": round(server.batched / max(1, server.batches), 2),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
