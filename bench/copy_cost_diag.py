"""Diagnostic: host cost of the plain script's 28 per-tensor H2D copies of one query, per way.

    python bench/copy_cost_diag.py [THREADS...]       (WAYS=to,cu,... picks the ways)

Ways: ``to`` (the script's ``t.to("cuda", non_blocking=True)``), ``copy_`` into preallocated
device tensors, ``cu`` (``cuMemcpyHtoDAsync`` through cuda-python into preallocated device
tensors), ``pack`` (host memcpy of the 28 tensors into one pinned buffer with
``torch.cat(out=)``, then one ``copy_``), ``memmove`` (28 ctypes memmoves into one pinned
buffer, then one ``copy_``), ``sync_only`` (nothing but the synchronize). Each thread uses
its own stream; per thread count, the whole loop's queries/s (synchronizing the stream once per query, like the script's ``.cpu()``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from wdl_serving import host_query  # noqa: E402


def main() -> None:
    counts = [int(x) for x in sys.argv[1:]] or [1, 8]
    from cuda.bindings import driver as cu

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    res = {}
    import ctypes

    memmove = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
        ctypes._memmove_addr)
    ways = os.environ.get("WAYS", "to,cu,pack,memmove,sync_only").split(",")
    for way in ways:
        for n in counts:
            qs = []
            for k in range(n):
                torch.manual_seed(1000 + k)
                dense, idx, offs = host_query(256, 100_000)
                srcs = [dense, *idx, offs]
                dsts = [torch.empty_like(s, device="cuda") for s in srcs]
                flat = [s.reshape(-1).view(torch.uint8) for s in srcs]
                stage = torch.empty(sum(f.numel() for f in flat), dtype=torch.uint8).pin_memory()
                stage2 = torch.empty(sum(f.numel() + 256 for f in flat), dtype=torch.uint8).pin_memory()
                dev = torch.empty_like(stage, device="cuda")
                qs.append((srcs, dsts, flat, stage, dev, torch.cuda.Stream(), stage2, torch.empty_like(stage2, device="cuda")))
            counter = [0] * n
            stop = [0.0]
            barrier = threading.Barrier(n + 1)

            def client(i: int) -> None:
                srcs, dsts, flat, stage, dev, s, stage2, dev2 = qs[i]
                ptrs = [(d.data_ptr(), x.data_ptr(), x.numel() * x.element_size()) for d, x in zip(dsts, srcs)]
                hs = cu.CUstream(s.cuda_stream)
                with torch.cuda.stream(s):
                    barrier.wait()
                    c = 0
                    while time.perf_counter() < stop[0]:
                        if way == "to":
                            outs = [t.to("cuda", non_blocking=True) for t in srcs]
                        elif way == "copy_":
                            for d, x in zip(dsts, srcs):
                                d.copy_(x, non_blocking=True)
                        elif way == "cu":
                            for d, x, nb in ptrs:
                                cu.cuMemcpyHtoDAsync(d, x, nb, hs)
                        elif way == "memmove":
                            hp = stage2.data_ptr()
                            off = 0
                            for x in srcs:
                                n = x.nbytes
                                memmove(hp + off, x.data_ptr(), n)
                                off += (n + 255) // 256 * 256
                            dev2.copy_(stage2, non_blocking=True)
                        elif way == "pack":
                            torch.cat(flat, out=stage)
                            dev.copy_(stage, non_blocking=True)
                        s.synchronize()
                        c += 1
                    counter[i] = c

            ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
            for t in ts:
                t.start()
            stop[0] = time.perf_counter() + 1.5
            t0 = time.perf_counter()
            barrier.wait()
            for t in ts:
                t.join()
            wall = time.perf_counter() - t0
            res[f"{way}_{n}"] = round(sum(counter) / wall, 1)
            print(way, n, res[f"{way}_{n}"], "q/s", flush=True)
    print(json.dumps({"copies": res}))


if __name__ == "__main__":
    main()
