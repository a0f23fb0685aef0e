"""A plain serving script, the way one is usually written: no recsys_doctor in it.

8 client threads send wide&deep queries back to back (the model of ``wdl_serving.py``,
batch 256): each query copies its pinned host inputs to the GPU tensor by tensor, runs
the model eagerly under ``no_grad`` and brings the output back with ``.cpu()`` (which
waits for it). Every thread uses PyTorch's default stream, so all of them launch into,
and wait on, one stream.

The last line printed is a JSON object (``qps``, ``p50_ms``, ``p99_ms``, ``queries``,
``threads``) - what ``recsys-doctor profile --apply`` reads to measure the script before
and after applying a plan, without changing a line here:

    python examples/plain_serving_script.py --threads 8 --duration 2
    recsys-doctor profile --apply examples/plain_serving_script.py
    recsys-doctor apply plan.json -- python examples/plain_serving_script.py
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wdl_serving import WideDeep, host_query  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of measurement")
    ap.add_argument("--warmup", type=int, default=10, help="queries per thread before measuring")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=100_000)
    a = ap.parse_args()

    torch.manual_seed(0)
    model = WideDeep(a.vocab).cuda().eval()
    queries = []
    for k in range(a.threads):
        torch.manual_seed(1000 + k)
        queries.append(host_query(a.batch, a.vocab))

    def one_query(q):
        dense, idx, offs = q
        with torch.no_grad():
            out = model(dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                        offs.to("cuda", non_blocking=True))
        return out.cpu()

    lat_ms, wall, checksum = serve(one_query, queries, a.warmup, a.duration)
    n = len(lat_ms)

    def pct(q: float) -> float:  # nearest rank
        return lat_ms[max(0, min(n - 1, int(-(-q * n // 100)) - 1))]

    print(json.dumps({"script": "plain_serving_script", "threads": a.threads, "queries": n,
                      "qps": round(n / wall, 1), "p50_ms": round(pct(50), 3), "p99_ms": round(pct(99), 3),
                      "checksum": round(checksum, 4)}), flush=True)


def serve(one_query, queries: list, warmup: int, duration: float) -> tuple[list[float], float, float]:
    """One client thread per query in ``queries``: ``warmup`` queries each, then all of
    them back to back for ``duration`` seconds. Returns every latency (ms, sorted), the
    window's wall time and the sum of the last outputs (the same with or without a plan)."""
    threads = len(queries)
    lat: list[list[float]] = [[] for _ in range(threads)]
    stop_at = [0.0]
    start = [0.0]

    def open_window() -> None:  # run once, when every client has warmed up
        start[0] = time.perf_counter()
        stop_at[0] = start[0] + duration

    ready = threading.Barrier(threads + 1, action=open_window)
    checks: list[float] = [0.0] * threads

    def client(k: int) -> None:
        q = queries[k]
        for _ in range(warmup):
            one_query(q)
        ready.wait()
        mine = lat[k]
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            out = one_query(q)
            mine.append(time.perf_counter() - t0)
        checks[k] = float(out.sum())

    workers = [threading.Thread(target=client, args=(k,), name=f"client-{k}") for k in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start[0]
    return sorted(x * 1e3 for row in lat for x in row), wall, sum(checks)


if __name__ == "__main__":
    main()
