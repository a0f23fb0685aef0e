"""The strongest thing a user could write instead of ``examples/scripts/dlrm_numpy_serve.py``
under the hook: the same script (its model, seed, requests, client loop, checksum) with the
scoring hand-written around one CUDA graph per client thread.

Each thread owns a CUDA stream, pinned host buffers for its dense features and ids, and a graph
captured once (in the main thread, before the clients start) that copies those buffers to the
device, runs the model and copies the scores into a pinned host buffer; the thread makes that
stream its current one, which ``graph.replay()`` launches on. A query is
``np.copyto`` of its two arrays into the pinned buffers, ``graph.replay()``, ``stream.synchronize()``
and a NumPy copy of the scores: no PyTorch op, no allocation, one synchronization.

    python bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 3000

Same arguments and the same JSON line as the script (``"script": "dlrm_graph_serve"``); the
checksum equals the script's for the same ``--queries`` and ``--seed``. CUDA only.
"""

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "scripts"))
import dlrm_numpy_serve as dlrm  # noqa: E402 - the script this server stands for (its main() is not run)


class GraphWorker:
    """One client thread's stream, pinned buffers and captured graph."""

    def __init__(self, model, batch, offsets_np, variant="np"):
        self.offsets_np = offsets_np  # (the script's offsets: its from_numpy calls, in the variants)
        self.stream = torch.cuda.Stream()
        self.h_dense = torch.zeros((batch, dlrm.N_DENSE), dtype=torch.float32).pin_memory()
        self.h_ids = torch.zeros((dlrm.N_SPARSE, batch), dtype=torch.int64).pin_memory()  # zeros: valid ids for the warm-up
        self.np_dense, self.np_ids = self.h_dense.numpy(), self.h_ids.numpy()
        with torch.cuda.stream(self.stream), torch.no_grad():
            self.d_offsets = torch.from_numpy(offsets_np).to("cuda", non_blocking=True)
            self.d_dense = self.h_dense.to("cuda", non_blocking=True)
            self.d_ids = self.h_ids.to("cuda", non_blocking=True)
            for _ in range(3):  # warm-up on the capture stream (cuBLAS handles, allocator)
                out = model(self.d_dense, self.d_ids, self.d_offsets)
        self.stream.synchronize()
        self.h_out = torch.empty(out.shape, dtype=out.dtype).pin_memory()
        self.np_out = self.h_out.numpy()
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, stream=self.stream):
            self.d_dense.copy_(self.h_dense, non_blocking=True)
            self.d_ids.copy_(self.h_ids, non_blocking=True)
            out = model(self.d_dense, self.d_ids, self.d_offsets)
            if variant not in ("devout", "cpu_only"):
                self.h_out.copy_(out, non_blocking=True)
        self.d_out = out  # the graph's static output on the device
        torch.cuda.synchronize()
        self.score = {"np": self.score, "from_numpy": self.score_from_numpy, "devout": self.score_devout,
                      "clone_only": self.score_clone_only, "cpu_only": self.score_cpu_only}[variant]

    def score(self, dense, ids):
        """One query, on the calling thread's current stream: the client sets it to this
        worker's stream once (``CUDAGraph.replay`` launches on the current stream, not on the
        stream it was captured on)."""
        np.copyto(self.np_dense, dense)
        np.copyto(self.np_ids, ids)
        self.graph.replay()
        self.stream.synchronize()
        return self.np_out.copy()

    # -- the ablation: what the script's own calls around such a graph cost (--variant) ---------
    # (each variant spelled out in full, no shared helper: what a query times is exactly its lines;
    # the client loop and checksum below are the script's own, copied so that both time the same work)
    def score_from_numpy(self, dense, ids):
        """``np``, plus the script's three ``torch.from_numpy`` tensors made and dropped."""
        a, b, c = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(self.offsets_np)
        np.copyto(self.np_dense, dense)
        np.copyto(self.np_ids, ids)
        del a, b, c
        self.graph.replay()
        self.stream.synchronize()
        return self.np_out.copy()

    def score_devout(self, dense, ids):
        """``from_numpy``, and the scores read as the hook hands them to the script: the graph
        leaves them on the device, the replay's output is a clone of them, read back with the
        script's own ``.cpu().numpy()`` (its synchronization)."""
        a, b, c = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(self.offsets_np)
        np.copyto(self.np_dense, dense)
        np.copyto(self.np_ids, ids)
        del a, b, c
        self.graph.replay()
        out = self.d_out.clone()
        return out.cpu().numpy()

    def score_clone_only(self, dense, ids):
        """``from_numpy``, and the replay's output cloned on the device (and dropped), the scores
        read from the graph's own device-to-host copy as in ``np``: what the clone alone costs."""
        a, b, c = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(self.offsets_np)
        np.copyto(self.np_dense, dense)
        np.copyto(self.np_ids, ids)
        del a, b, c
        self.graph.replay()
        out = self.d_out.clone()
        self.stream.synchronize()
        del out
        return self.np_out.copy()

    def score_cpu_only(self, dense, ids):
        """``from_numpy``, and the scores read with ``.cpu().numpy()`` of the graph's static output
        (no clone): what the read-back alone costs."""
        a, b, c = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(self.offsets_np)
        np.copyto(self.np_dense, dense)
        np.copyto(self.np_ids, ids)
        del a, b, c
        self.graph.replay()
        return self.d_out.cpu().numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4000, help="timed requests, all threads together")
    ap.add_argument("--warmup", type=int, default=5, help="requests per thread before timing")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", choices=("np", "from_numpy", "devout", "clone_only", "cpu_only"), default="np",
                    help="np: the server above; from_numpy: plus the script's torch.from_numpy calls; devout: "
                         "plus the scores cloned on the device and read with .cpu().numpy(), as under the hook; "
                         "clone_only / cpu_only: one of those two alone")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model = dlrm.DLRM(args.vocab).to("cuda").eval()
    offsets_np = np.arange(args.batch, dtype=np.int64)
    workers = [GraphWorker(model, args.batch, offsets_np, args.variant) for _ in range(args.threads)]

    requests = queue.Queue()
    for rid in range(args.queries):
        requests.put(rid)
    results, latencies = {}, []
    ready = threading.Barrier(args.threads + 1)

    def client(k):
        torch.cuda.set_stream(workers[k].stream)  # this thread's stream, for good
        score = workers[k].score
        for i in range(args.warmup):
            score(*dlrm.make_request(args.seed + 1, k * 1000 + i, args.batch, args.vocab))
        ready.wait()
        while True:
            try:
                rid = requests.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            results[rid] = score(*dlrm.make_request(args.seed, rid, args.batch, args.vocab))
            latencies.append((time.perf_counter() - t0) * 1e3)

    threads = [threading.Thread(target=client, args=(k,), name=f"client-{k}") for k in range(args.threads)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    flat = np.concatenate([results[rid] for rid in range(args.queries)]).astype(np.float64)
    checksum = float(flat @ np.linspace(1.0, 2.0, flat.size))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "dlrm_graph_serve", "variant": args.variant, "threads": args.threads, "queries": len(latencies),
                      "qps": round(len(latencies) / wall, 1), "p50_ms": round(float(p50), 3),
                      "p99_ms": round(float(p99), 3), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
