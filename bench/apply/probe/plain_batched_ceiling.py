"""How far the runtime's batched ``served`` takes the plain script's own client loop (issue 25,
``examples/plain_serving_script.py``): the script's ``serve()`` loop and queries, with
``one_query`` replaced. Prints one JSON line.

    python bench/apply/probe/plain_batched_ceiling.py MODE THREADS [GROUPS]

MODE: ``eager`` (the script's own one_query), ``served`` (``served(*host_query)``),
``served_to`` (the same, after 28 calls of a small Python function a query: what a hook
intercepting the script's 28 ``.to()`` calls would add at the least), ``served_dev`` (served, then
the host output copied to the GPU and back with ``.cpu()``: a hook returning device tensors)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples"))
from plain_serving_script import serve  # noqa: E402
from wdl_serving import WideDeep, host_query  # noqa: E402


def main() -> None:
    mode, threads = sys.argv[1], int(sys.argv[2])
    groups = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.manual_seed(0)
    model = WideDeep(100_000).cuda().eval()
    queries = []
    for k in range(threads):
        torch.manual_seed(1000 + k)
        queries.append(host_query(256, 100_000))
    s = None
    if mode == "eager":
        def one_query(q):
            dense, idx, offs = q
            with torch.no_grad():
                out = model(dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                            offs.to("cuda", non_blocking=True))
            return out.cpu()
    else:
        from recsys_doctor.runtime import serve as rserve

        s = rserve(model, queries[0], groups=groups, merge=True, graphs=True, batching=True, max_batch=32)

        def noop(t, *a, **k):
            return t

        if mode == "served":
            def one_query(q):
                return s(*q)
        elif mode == "served_to":
            def one_query(q):
                dense, idx, offs = q
                a = (noop(dense, "cuda", non_blocking=True), [noop(t, "cuda", non_blocking=True) for t in idx],
                     noop(offs, "cuda", non_blocking=True))
                return s(*a)
        elif mode == "served_dev":
            def one_query(q):
                return s(*q).to("cuda", non_blocking=True).cpu()
        else:
            raise SystemExit(f"unknown mode {mode}")
    t0 = time.perf_counter()
    lat, wall, checksum = serve(one_query, queries, 10, 3.0)
    n = len(lat)
    row = {"mode": mode, "threads": threads, "groups": groups, "qps": round(n / wall, 1),
           "p50_ms": round(lat[n // 2], 3), "p99_ms": round(lat[min(n - 1, int(n * 0.99))], 3),
           "checksum": round(checksum, 4), "wall_s": round(time.perf_counter() - t0, 1)}
    if s is not None:
        row["batch_sizes"] = s.stats()["batching"].get("batch_sizes")
        s.close()
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
