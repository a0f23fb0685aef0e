"""The strongest thing a user could write instead of ``examples/scripts/deepfm_serve.py`` under the
hook: the same script (its model, seed, requests as pandas DataFrames, thread pool, checksum) with the
scoring hand-written around one CUDA graph per pool thread.

The script moves each of its 39 columns with ``torch.as_tensor(df[col].values, device=dev)`` (39
blocking copies from pageable memory), stacks them on the GPU, scores and reads the CTRs with
``.tolist()``. Its model inputs are products of GPU ops on those copies (``torch.stack``), so the
hook's thread graphs, which take over copies made straight into a model call, never learn it (the
suite: declined). Here each pool thread owns a CUDA stream, pinned host buffers shaped as the stacked
inputs (rows x 26 ids, rows x 13 dense features) and a graph captured once (in the main thread,
before the pool starts) that copies those buffers to the device, runs the model and copies the CTRs
into a pinned host buffer. A query is ``np.stack`` of the DataFrame's columns into the pinned
buffers (the same column values the script copies), ``graph.replay()`` on the thread's stream, one
``stream.synchronize()`` and ``.tolist()`` of the host CTRs.

    python bench/apply/handwritten/deepfm_graph_serve.py --threads 4 --queries 3000

Same arguments and the same JSON line as the script (``"script": "deepfm_graph_serve"``); the
checksum equals the script's for the same ``--queries``, ``--rows`` and ``--seed``. CUDA only.
"""

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "scripts"))
import deepfm_serve as dfm  # noqa: E402 - the script this server stands for (its main() is not run)


class GraphWorker:
    """One pool thread's stream, pinned buffers and captured graph."""

    def __init__(self, model, rows):
        self.stream = torch.cuda.Stream()
        # zeros: valid ids (and features) for the warm-up and the capture
        self.h_sparse = torch.zeros((rows, len(dfm.SPARSE)), dtype=torch.int64).pin_memory()
        self.h_dense = torch.zeros((rows, len(dfm.DENSE)), dtype=torch.float32).pin_memory()
        self.np_sparse, self.np_dense = self.h_sparse.numpy(), self.h_dense.numpy()
        with torch.cuda.stream(self.stream), torch.inference_mode():
            self.d_sparse = self.h_sparse.to("cuda", non_blocking=True)
            self.d_dense = self.h_dense.to("cuda", non_blocking=True)
            for _ in range(3):  # warm-up on the capture stream (cuBLAS handles, allocator)
                out = model(self.d_sparse, self.d_dense)
        self.stream.synchronize()
        self.h_out = torch.empty(out.shape, dtype=out.dtype).pin_memory()
        self.np_out = self.h_out.numpy()
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph, stream=self.stream):
            self.d_sparse.copy_(self.h_sparse, non_blocking=True)
            self.d_dense.copy_(self.h_dense, non_blocking=True)
            out = model(self.d_sparse, self.d_dense)
            self.h_out.copy_(out, non_blocking=True)
        torch.cuda.synchronize()

    def predict(self, df):
        """One request, on the calling thread's current stream (this worker's: ``CUDAGraph.replay``
        launches on the current stream, not on the stream it was captured on)."""
        np.stack([df[c].values for c in dfm.SPARSE], axis=1, out=self.np_sparse)
        np.stack([df[c].values for c in dfm.DENSE], axis=1, out=self.np_dense)
        self.graph.replay()
        self.stream.synchronize()
        return self.np_out.tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--rows", type=int, default=128, help="ads per request")
    ap.add_argument("--vocab", type=int, default=50_000, help="ids per categorical column")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model = dfm.DeepFM(args.vocab).to("cuda")
    model.eval()
    free = [GraphWorker(model, args.rows) for _ in range(args.threads)]
    lock, mine = threading.Lock(), threading.local()

    def worker():
        """This pool thread's worker, taken from ``free`` at its first request (its stream made its
        current one for good)."""
        w = getattr(mine, "w", None)
        if w is None:
            with lock:
                w = mine.w = free.pop()
            torch.cuda.set_stream(w.stream)
        return w

    def handle(req):  # the script's handler, timing what its predict times
        rid, df = req
        t0 = time.perf_counter()
        ctr = worker().predict(df)
        return rid, ctr, (time.perf_counter() - t0) * 1e3

    # (the script warms up on the main thread; here each pool thread's graph was warmed up at capture)
    frames = [(rid, dfm.request_frame(args.seed, rid, args.rows, args.vocab)) for rid in range(args.queries)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        done = list(pool.map(handle, frames))
    wall = time.perf_counter() - t0

    latencies = [ms for _, _, ms in done]
    ctrs = np.array([x for _, ctr, _ in sorted(done, key=lambda d: d[0]) for x in ctr])
    checksum = float(ctrs @ np.linspace(1.0, 2.0, ctrs.size))
    print(json.dumps({"script": "deepfm_graph_serve", "threads": args.threads, "queries": len(done),
                      "qps": round(len(done) / wall, 1),
                      "p50_ms": round(float(np.percentile(latencies, 50)), 3),
                      "p99_ms": round(float(np.percentile(latencies, 99)), 3),
                      "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
