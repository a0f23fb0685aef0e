"""DeepFM scorer served by a separate server process that the load generator starts and kills.

Written the way a team tests its model server: the server is this same file run with
``--serve``, started by the load generator with ``subprocess.Popen([sys.executable, __file__,
"--serve", ...])`` and ended with ``proc.terminate(); proc.wait(timeout=60)``. The server does not
handle SIGTERM itself: it is killed by it (its return code is ``-15``). So **the process that calls
the model is not the one that was started, and it never exits on its own**.

The server process builds the model after ``torch.manual_seed(seed)`` on the CPU, moves it to
``--device``, in eval mode, warms it up with two requests of seed ``seed + 1`` (not served to
anyone), then serves over a local TCP socket: a ``socketserver.ThreadingTCPServer`` bound to
127.0.0.1, port 0 (``daemon_threads``; each connection handled in its own thread, which serves
every request of that connection), ``serve_forever()`` on its main thread. Its **first stdout line
is its port number**, which the parent reads to connect. Every message either way is length-prefixed:
a little-endian uint32 byte count (``struct`` ``"<I"``), then that many bytes. A request's bytes are
a 12-byte header ``struct.pack("<qi", rid, rows)``, then the dense features (float32 ``[rows, 13]``,
C order), then the ids (int64 ``[rows, 8]``); the handler reads them back with ``np.frombuffer``,
moves each with ``torch.from_numpy(a).to(dev)``, scores under ``torch.inference_mode()`` and
answers with the length-prefixed ``scores.cpu().numpy().tobytes()`` (float32 ``[rows]``).

The model (``DeepFM``, an ``nn.Module``; PyTorch's default initializations, its modules made in
this order, then re-drawn as said):

* ``first``: an ``nn.ModuleList`` of 8 ``nn.Embedding(vocab, 1)`` (a first-order weight per id),
  field 0 first;
* ``embs``: an ``nn.ModuleList`` of 8 ``nn.Embedding(vocab, 16)``, field 0 first;
* ``linear``: ``nn.Linear(13, 1)`` over the dense features;
* ``deep``: ``nn.Sequential(nn.Linear(8 * 16 + 13, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
  nn.Linear(64, 1))``;
* then every embedding's weight is re-drawn with ``nn.init.normal_(w, std=0.1)``, in the order
  ``first[0..7]``, then ``embs[0..7]`` (small, as a trained model's are: the FM term stays O(1)).

``forward(dense, ids)`` (dense ``[rows, 13]`` float32, ids ``[rows, 8]`` int64 in ``[0, vocab)``):
``first = linear(dense) + sum_f first[f](ids[:, f])`` (``[rows, 1]``); ``v = stack([embs[f](ids[:,
f]) for f], 1)`` (``[rows, 8, 16]``); ``fm = 0.5 * (v.sum(1) ** 2 - (v ** 2).sum(1)).sum(1)``;
``deep = deep(cat([v.flatten(1), dense], 1))``; ``score = sigmoid(first.squeeze(1) + fm +
deep.squeeze(1))``.

Requests (``--queries`` of them, made up-front by the parent): request ``rid`` is drawn from
``np.random.default_rng([seed, rid])``, in this order: ``rows = integers(16, max_rows + 1)``
(``--max-rows``, 128: **the row count changes every request**); the dense features
``standard_normal((rows, 13))`` as float32; the ids ``integers(0, vocab, (rows, 8))`` (int64).

The load generator (the parent): starts the server, reads its port, then ``--threads`` client
threads (``concurrent.futures.ThreadPoolExecutor.map`` over the request ids, results in request
order), **each keeping one persistent connection** (a socket in a ``threading.local()``, made at
its first request, ``TCP_NODELAY``) for every request it sends; a request's latency is its round
trip. When all are answered it closes the sockets, terminates the server and waits for it.

    python subprocess_server_serve.py --threads 8 --queries 3000
    python subprocess_server_serve.py --device cpu --threads 3 --queries 24 --vocab 500

The last line is JSON: script, threads, queries, qps, p50_ms, p99_ms, rows_total (the row count
over all requests), server_exit (the server's return code: ``-15``, killed by SIGTERM) and checksum
(every request's scores concatenated in request order, as float64, dotted with ``np.linspace(1.0,
2.0, n)`` for ``n`` scores in all: the same for any thread count, each request scored alone).
"""

import argparse
import json
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn

N_DENSE, FIELDS, DIM, MIN_ROWS = 13, 8, 16, 16
LEN = struct.Struct("<I")  # every message's byte count
HEAD = struct.Struct("<qi")  # a request's id and row count


class DeepFM(nn.Module):
    """First-order weights, an FM interaction over the field embeddings, a deep MLP."""

    def __init__(self, vocab: int):
        super().__init__()
        self.first = nn.ModuleList(nn.Embedding(vocab, 1) for _ in range(FIELDS))
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(FIELDS))
        self.linear = nn.Linear(N_DENSE, 1)
        self.deep = nn.Sequential(nn.Linear(FIELDS * DIM + N_DENSE, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                  nn.Linear(64, 1))
        for e in [*self.first, *self.embs]:
            nn.init.normal_(e.weight, std=0.1)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        first = self.linear(dense) + sum(w(ids[:, f]) for f, w in enumerate(self.first))
        v = torch.stack([e(ids[:, f]) for f, e in enumerate(self.embs)], dim=1)  # [rows, FIELDS, DIM]
        fm = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)
        deep = self.deep(torch.cat([v.flatten(1), dense], dim=1))
        return torch.sigmoid(first.squeeze(1) + fm + deep.squeeze(1))


def make_request(seed: int, rid: int, vocab: int, max_rows: int):
    """(dense float32 [rows, 13], ids int64 [rows, 8]) of request ``rid``."""
    rng = np.random.default_rng([seed, rid])
    rows = int(rng.integers(MIN_ROWS, max_rows + 1))
    dense = rng.standard_normal((rows, N_DENSE)).astype(np.float32)
    ids = rng.integers(0, vocab, (rows, FIELDS), dtype=np.int64)
    return dense, ids


def encode(rid: int, dense: np.ndarray, ids: np.ndarray) -> bytes:
    body = HEAD.pack(rid, len(dense)) + dense.tobytes() + ids.tobytes()
    return LEN.pack(len(body)) + body


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf, got = bytearray(n), 0
    view = memoryview(buf)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return buf


# ---- the server process (this file run with --serve) ----

class ScoreHandler(socketserver.StreamRequestHandler):
    disable_nagle_algorithm = True
    model: nn.Module
    dev: torch.device

    def handle(self):  # one thread a connection, every request of that connection
        while True:
            size = self.rfile.read(LEN.size)
            if len(size) < LEN.size:
                return  # the client closed its connection
            body = bytearray(self.rfile.read(LEN.unpack(size)[0]))  # writable: torch.from_numpy takes it
            rid, rows = HEAD.unpack_from(body)
            dense = np.frombuffer(body, np.float32, rows * N_DENSE, HEAD.size).reshape(rows, N_DENSE)
            ids = np.frombuffer(body, np.int64, rows * FIELDS, HEAD.size + dense.nbytes).reshape(rows, FIELDS)
            with torch.inference_mode():
                scores = self.model(torch.from_numpy(dense).to(self.dev), torch.from_numpy(ids).to(self.dev))
            out = scores.cpu().numpy().tobytes()
            self.wfile.write(LEN.pack(len(out)) + out)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(args) -> None:
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = DeepFM(args.vocab).to(dev).eval()
    with torch.inference_mode():
        for rid in range(2):  # warm-up, another seed, answered to no one
            dense, ids = make_request(args.seed + 1, rid, args.vocab, args.max_rows)
            model(torch.from_numpy(dense).to(dev), torch.from_numpy(ids).to(dev)).cpu()
    ScoreHandler.model, ScoreHandler.dev = model, dev
    with Server(("127.0.0.1", 0), ScoreHandler) as server:
        print(server.server_address[1], flush=True)  # the port: the first stdout line
        server.serve_forever()  # until SIGTERM kills the process


# ---- the load generator (the parent) ----

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8, help="client threads, one connection each")
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--max-rows", type=int, default=128)
    ap.add_argument("--serve", action="store_true", help="be the server process (the parent starts it)")
    args = ap.parse_args()
    if args.max_rows < MIN_ROWS or args.vocab < 1:
        ap.error(f"need --max-rows >= {MIN_ROWS} and --vocab >= 1")
    if args.serve:
        serve(args)
        return

    requests = [make_request(args.seed, rid, args.vocab, args.max_rows) for rid in range(args.queries)]
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--device", args.device, "--seed", str(args.seed),
                             "--vocab", str(args.vocab), "--max-rows", str(args.max_rows)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"the server printed no port (exit {proc.wait()})")
        port = int(line)

        local, lock, sockets = threading.local(), threading.Lock(), []

        def connection() -> socket.socket:
            sock = getattr(local, "sock", None)
            if sock is None:
                sock = local.sock = socket.create_connection(("127.0.0.1", port), timeout=300)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with lock:
                    sockets.append(sock)
            return sock

        def handle(rid):
            dense, ids = requests[rid]
            sock = connection()
            t0 = time.perf_counter()
            sock.sendall(encode(rid, dense, ids))
            size = LEN.unpack(recv_exact(sock, LEN.size))[0]
            scores = np.frombuffer(recv_exact(sock, size), dtype=np.float32)
            ms = (time.perf_counter() - t0) * 1e3
            assert scores.shape == (len(dense),), (rid, scores.shape)
            return scores, ms

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.threads) as pool:
            done = list(pool.map(handle, range(args.queries)))
        wall = time.perf_counter() - t0
        for sock in sockets:
            sock.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()

    flat = np.concatenate([scores.astype(np.float64) for scores, _ in done])
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile([ms for _, ms in done], [50, 99])
    print(json.dumps({"script": "subprocess_server_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "rows_total": int(sum(len(d) for d, _ in requests)),
                      "server_exit": proc.returncode, "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
