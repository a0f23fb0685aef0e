"""DeepFM CTR model behind a small JSON-over-HTTP service written with the standard library.

Written the way a small Flask-like service often is when its authors avoid a framework: an
``http.server.ThreadingHTTPServer`` on 127.0.0.1 (an ephemeral port), its handler speaking
``HTTP/1.1`` so connections stay open (``disable_nagle_algorithm``: no delayed-ACK stalls),
``daemon_threads = True``. The server makes one handler thread per client connection and each
serves many requests, so the threads that call the model are the server's, started as the
clients connect; ``serve_forever()`` runs in a background thread. ``do_POST`` reads
``Content-Length`` bytes, ``json.loads`` a body ``{"rid": ..., "dense": [[...]], "ids":
[[...]]}`` (16-128 rows, a different count almost every request), moves the Python lists with
``torch.tensor(..., device=dev)``, scores them in a ``with torch.inference_mode():`` block and
answers ``{"rid": ..., "scores": [...]}`` from ``scores.cpu().tolist()``. ``--threads`` client
threads each keep one ``http.client.HTTPConnection`` for all their requests, taking request ids
from a shared ``itertools.count`` under a lock; each warms up with two requests of its own first.

    python http_json_serve.py --threads 8 --queries 3000
    python http_json_serve.py --device cpu --threads 2 --queries 24 --vocab 500 --max-rows 16

The last line is JSON: qps, p50_ms, p99_ms (a client's round trip), threads, queries and
checksum (every request's scores in request order, position-weighted: the same for any
thread count).
"""

import argparse
import http.client
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch
import torch.nn as nn

N_DENSE, FIELDS, DIM = 13, 8, 16


class DeepFM(nn.Module):
    """First-order weights, an FM interaction over the field embeddings, a deep MLP."""

    def __init__(self, vocab: int):
        super().__init__()
        self.first = nn.ModuleList(nn.Embedding(vocab, 1) for _ in range(FIELDS))
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(FIELDS))
        self.linear = nn.Linear(N_DENSE, 1)
        self.deep = nn.Sequential(
            nn.Linear(FIELDS * DIM + N_DENSE, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1)
        )
        for e in [*self.first, *self.embs]:
            nn.init.normal_(e.weight, std=0.1)  # small, as a trained model's are: the FM term stays O(1)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        first = self.linear(dense).squeeze(1) + sum(w(ids[:, k]).squeeze(1) for k, w in enumerate(self.first))
        v = torch.stack([e(ids[:, k]) for k, e in enumerate(self.embs)], dim=1)  # [rows, FIELDS, DIM]
        fm = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)
        deep = self.deep(torch.cat([v.flatten(1), dense], dim=1)).squeeze(1)
        return torch.sigmoid(first + fm + deep)


def make_request(seed, rid, vocab, max_rows):
    """The JSON body of request ``rid``: Python lists, as a client would send them."""
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(max(1, max_rows // 8), max_rows + 1))
    dense = rng.standard_normal((n, N_DENSE)).astype(np.float32)
    return {"rid": rid, "dense": dense.tolist(), "ids": rng.integers(0, vocab, (n, FIELDS)).tolist()}


class ScoreHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one handler thread serves a client's requests
    disable_nagle_algorithm = True
    model: nn.Module
    dev: torch.device

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        dense = torch.tensor(body["dense"], dtype=torch.float32, device=self.dev)
        ids = torch.tensor(body["ids"], dtype=torch.long, device=self.dev)
        with torch.inference_mode():
            scores = self.model(dense, ids)
        out = json.dumps({"rid": body["rid"], "scores": scores.cpu().tolist()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format, *args):  # quiet: no access log on stderr
        pass


def post(conn, body):
    conn.request("POST", "/score", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    assert resp.status == 200 and answer["rid"] == body["rid"], (resp.status, answer.get("rid"))
    return answer["scores"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8, help="client threads, one connection each")
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--max-rows", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    ScoreHandler.model, ScoreHandler.dev = DeepFM(args.vocab).to(dev).eval(), dev
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScoreHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http-server", daemon=True).start()
    port = server.server_address[1]

    rids, lock = itertools.count(), threading.Lock()
    start = threading.Barrier(args.threads + 1, timeout=300)
    results, latencies = {}, []

    def client(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for j in range(2):  # warm-up, not timed: another seed
            post(conn, make_request(args.seed + 1, 2 * k + j, args.vocab, args.max_rows))
        start.wait()
        while True:
            with lock:
                rid = next(rids)
            if rid >= args.queries:
                break
            body = make_request(args.seed, rid, args.vocab, args.max_rows)
            t0 = time.perf_counter()
            results[rid] = post(conn, body)
            latencies.append((time.perf_counter() - t0) * 1e3)
        conn.close()

    clients = [threading.Thread(target=client, args=(k,), name=f"client-{k}") for k in range(args.threads)]
    for t in clients:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in clients:
        t.join()
    wall = time.perf_counter() - t0
    server.shutdown()
    server.server_close()

    flat = np.concatenate([np.asarray(results[rid], dtype=np.float64) for rid in range(args.queries)])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    head = {"script": "http_json_serve", "threads": args.threads, "queries": len(latencies)}
    times = {"qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3)}
    print(json.dumps({**head, **times, "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
