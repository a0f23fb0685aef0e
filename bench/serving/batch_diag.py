"""Where a batch's time goes on the GPU machine (issue 24): the batched runtime's worker
of group 0 driven from this thread, phase by phase (perf_counter_ns), and the GPU time of
its host-to-device copy from the pinned arena against a small pinned buffer (CUDA events).

    python bench/batch_diag.py        # prints one JSON line per measurement
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
sys.path.insert(0, str(HERE.parent / "examples"))


def main() -> None:
    import torch
    from serve_anchors import VOCAB, _queries
    from wdl_serving import WideDeep

    from recsys_doctor.runtime import serve
    from recsys_doctor.runtime._batcher import Pending
    from recsys_doctor.runtime._policy import flatten

    torch.manual_seed(0)
    model = WideDeep(VOCAB).cuda().eval()
    qs = _queries(32)
    served = serve(model, qs[0], groups=4, batching=True)
    w = served._bworkers[0]
    fp, s, blk = served._fp, w.g.compute_i, w.block
    small = torch.empty(blk, dtype=torch.uint8, pin_memory=True)
    for name, src in (("arena", w.arena.ptr), ("small_pinned", small.data_ptr())):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(w.stream):
            a.record()
            for _ in range(50):
                fp.htod(w.dev_in_ptr, src, blk, s)
            b.record()
        b.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(50):
            fp.htod(w.dev_in_ptr, src, blk, s)
        host_us = (time.perf_counter_ns() - t0) / 50e3
        torch.cuda.synchronize()
        print(json.dumps({"htod_one_block_from": name, "gpu_us": round(a.elapsed_time(b) * 1e3 / 50, 1),
                          "host_call_us": round(host_us, 1), "pinned": bool(small.is_pinned()),
                          "arena_pinned": bool(w.arena.buf.is_pinned())}), flush=True)
    for n in (1, 8, 16, 32):
        leaves = [flatten(q, lambda x: isinstance(x, torch.Tensor))[0] for q in qs[:n]]
        reqs = []
        for j in range(n):
            r = Pending(leaves[j], future=object())
            r.slot = j
            w.arena.stage(j, leaves[j])
            reqs.append(r)
        t_stage = time.perf_counter_ns()
        for j in range(n):
            w.arena.stage(j, leaves[j])
        t_stage = (time.perf_counter_ns() - t_stage) / n / 1e3
        for _ in range(5):
            w(reqs)
        t0 = time.perf_counter_ns()
        for _ in range(30):
            w(reqs)
        per = (time.perf_counter_ns() - t0) / 30e3
        print(json.dumps({"batch": n, "worker_call_us": round(per, 1), "stage_per_query_us": round(t_stage, 1)}),
              flush=True)
    print(json.dumps({"bucket_gpu_us": served.bucket_gpu_us()}), flush=True)
    served.close()


if __name__ == "__main__":
    main()
