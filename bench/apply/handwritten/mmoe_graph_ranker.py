"""The strongest thing a user could write instead of ``examples/scripts/mmoe_ranker.py`` under
the hook: the same script (its model, seed, requests, client loop, checksum) with the ranking
hand-written around one CUDA graph per client thread.

Each thread owns a CUDA stream, pinned host buffers for its ids and dense features, and a graph
captured once (in the main thread, before the clients start) that copies those buffers to the
device, runs the model, blends the three heads, takes the best score and stacks the per-item
scores, and copies both into pinned host buffers; the thread makes that stream its current one,
which ``graph.replay()`` launches on. A query is ``np.copyto`` of its two arrays,
``graph.replay()``, ONE ``stream.synchronize()`` (the script synchronizes twice: ``.item()`` and
``.cpu()``), a float and a copy of the per-item scores.

    python bench/apply/handwritten/mmoe_graph_ranker.py --threads 4 --queries 3000

Same arguments and the same JSON line as the script (``"script": "mmoe_graph_ranker"``); the
checksum equals the script's for the same ``--queries`` and ``--seed``. CUDA only.
"""

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "scripts"))
import mmoe_ranker as mmoe  # noqa: E402 - the script this server stands for (its main() is not run)


class GraphWorker:
    """One client thread's stream, pinned buffers and captured graph."""

    def __init__(self, model, items):
        self.model = model
        self.stream = torch.cuda.Stream()
        self.h_ids = torch.zeros((items, mmoe.N_SPARSE), dtype=torch.int64).pin_memory()  # zeros: valid ids for the warm-up
        self.h_dense = torch.zeros((items, mmoe.N_DENSE), dtype=torch.float32).pin_memory()
        self.np_ids, self.np_dense = self.h_ids.numpy(), self.h_dense.numpy()
        with torch.cuda.stream(self.stream), torch.no_grad():
            self.d_ids = self.h_ids.to("cuda", non_blocking=True)
            self.d_dense = self.h_dense.to("cuda", non_blocking=True)
            for _ in range(3):  # warm-up on the capture stream
                best, per_item = self._rank()
        self.stream.synchronize()
        self.h_best = torch.empty(best.shape, dtype=best.dtype).pin_memory()
        self.h_per = torch.empty(per_item.shape, dtype=per_item.dtype).pin_memory()
        self.np_best, self.np_per = self.h_best.numpy(), self.h_per.numpy()
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, stream=self.stream):
            self.d_ids.copy_(self.h_ids, non_blocking=True)
            self.d_dense.copy_(self.h_dense, non_blocking=True)
            best, per_item = self._rank()
            self.h_best.copy_(best, non_blocking=True)
            self.h_per.copy_(per_item, non_blocking=True)
        torch.cuda.synchronize()

    def _rank(self):
        click, convert, watch = self.model(self.d_ids, self.d_dense)
        blended = click * convert.pow(0.5) * torch.log1p(watch)
        return blended.max(), torch.stack([click, convert, watch], dim=1)

    def rank(self, ids_np, dense_np):
        """One query, on the calling thread's current stream: the client sets it to this
        worker's stream once (``CUDAGraph.replay`` launches on the current stream, not on the
        stream it was captured on)."""
        np.copyto(self.np_ids, ids_np)
        np.copyto(self.np_dense, dense_np)
        self.graph.replay()
        self.stream.synchronize()
        return float(self.np_best), torch.from_numpy(self.np_per.copy())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--items", type=int, default=200, help="items ranked per request")
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model = mmoe.MMoE(args.vocab).to("cuda").eval()
    workers = [GraphWorker(model, args.items) for _ in range(args.threads)]

    lock = threading.Lock()
    counter = iter(range(args.queries))
    results, latencies = {}, []

    def client(k):
        torch.cuda.set_stream(workers[k].stream)  # this thread's stream, for good
        rank = workers[k].rank
        while True:
            with lock:
                rid = next(counter, None)
            if rid is None:
                break
            req = mmoe.make_request(args.seed, rid, args.items, args.vocab)
            t0 = time.perf_counter()
            results[rid] = rank(*req)
            latencies.append((time.perf_counter() - t0) * 1e3)

    for k in range(args.threads):  # warm-up (the script warms up 3 calls on its main thread)
        with torch.cuda.stream(workers[k].stream):
            workers[k].rank(*mmoe.make_request(args.seed + 1, k, args.items, args.vocab))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    flat = np.concatenate([np.concatenate([[best], per_item.numpy().ravel()])
                           for best, per_item in (results[rid] for rid in range(args.queries))])
    checksum = float(flat.astype(np.float64) @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "mmoe_graph_ranker", "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
