"""Where one lone client's query goes on the host (issue 24, Q=1): ``served(*tensors)`` with
batching, one thread, phase by phase (perf_counter_ns around each step of the lone path), beside
the pre-packed hand-roll of the sweep in the same process.

    python bench/serving/lone_probe.py      # one JSON line per measurement
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "examples"))
N = 3000


def _loop(fn, n=N):
    for _ in range(200):
        fn()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1e3


def _timed(obj, name, acc):
    orig = getattr(obj, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter_ns()
        try:
            return orig(*a, **k)
        finally:
            acc[name] = acc.get(name, 0) + time.perf_counter_ns() - t0
    setattr(obj, name, wrapper)
    return orig


def main() -> None:
    import torch
    from serve_anchors import VOCAB, _graph_client, _queries
    from wdl_serving import WideDeep

    from recsys_doctor.runtime import serve
    from recsys_doctor.runtime import _batched_cuda as bc

    torch.manual_seed(0)
    model = WideDeep(VOCAB).cuda().eval()
    q = _queries(1)[0]
    hand = _graph_client(model, q, "graph_prepacked")
    served = serve(model, q, groups=4, merge=True, graphs=True, slots_per_group=2, batching=True, max_batch=32)
    out = {"handroll_us": _loop(hand), "served_us": _loop(lambda: served(*q))}
    out["handroll_us_again"] = _loop(hand)
    # the phases of the lone path, timed one by one (each wrapper adds ~0.2 us)
    acc: dict[str, int] = {}
    w = served._bworkers[0]
    fp = served._fp
    for obj, name in ((served, "_batch_leaves"), (served._batcher, "_run_lent"), (bc, "stage_batch"),
                      (fp, "htod"), (fp, "launch"), (fp, "dtoh"), (fp, "record"), (fp, "wait")):
        _timed(obj, name, acc)
    for wk in served._bworkers:
        _timed(wk, "start", acc)
        _timed(wk, "finish", acc)
    total = _loop(lambda: served(*q))
    n = N + 200
    out["served_timed_us"] = total
    out["phases_us"] = {k: round(v / n / 1e3, 2) for k, v in acc.items()}
    out["lent"] = served.stats()["batching"].get("batch_sizes")
    print(json.dumps(out, default=str), flush=True)
    served.close()


if __name__ == "__main__":
    main()
