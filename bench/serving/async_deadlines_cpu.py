"""Coroutines through the batcher on the CPU (no GPU, no torch): what a request's timeout costs
the event loop. ``Batcher.infer`` keeps one timer a loop for its requests' timeouts
(``runtime/_deadlines.py``'s ``Deadlines``); before the thirty-first session it wrapped every
request in ``asyncio.wait_for``. Both, and a request with no timeout at all (the floor), run Q
coroutines on one loop in closed loop against 4 workers whose batch "runs" ``GPU_US``
microseconds (a sleep in ``finish``, the GIL released as a GPU wait releases it), 2 driver
threads (``serve``'s default), the 0.5 ms switch interval. Each variant in its own process,
rounds alternating; q/s and the loop thread's CPU time a request.

    python bench/serving/async_deadlines_cpu.py [OUT.json]    # ROUNDS=3 QS=1,8,32,64,128 DUR=1.5 GPU_US=200
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time

VARIANTS = ("deadlines", "wait_for", "no_timeout")


def _batcher_class(variant: str):
    from recsys_doctor.runtime._batcher import Batcher, Pending

    if variant == "deadlines":
        return Batcher

    class Old(Batcher):
        async def infer(self, leaves):
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self.put(Pending(leaves, future=fut, loop=loop))
            return await (asyncio.wait_for(fut, self.timeout_s) if variant == "wait_for" else fut)

    return Old


class Worker:
    def __init__(self, gpu_s: float) -> None:
        self.gpu_s = gpu_s

    def start(self, reqs):
        return reqs

    def finish(self, reqs):
        time.sleep(self.gpu_s)
        return [None] * len(reqs)


def one(variant: str, q: int, dur: float, gpu_us: float) -> dict:
    sys.setswitchinterval(0.0005)
    b = _batcher_class(variant)([Worker(gpu_us / 1e6) for _ in range(4)], max_batch=32, max_queue=256, drivers=2)
    n = [0]

    async def client(stop: float) -> None:
        while time.perf_counter() < stop:
            await b.infer([None])
            n[0] += 1

    async def main() -> float:
        stop = time.perf_counter() + dur
        c0 = time.thread_time()
        await asyncio.gather(*[client(stop) for _ in range(q)])
        return time.thread_time() - c0

    t0 = time.perf_counter()
    cpu = asyncio.run(main())
    wall = time.perf_counter() - t0
    b.close()
    return {"variant": variant, "Q": q, "qps": round(n[0] / wall, 1), "loop_cpu_us_per_request": round(cpu / n[0] * 1e6, 2)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        v, qs, dur, gpu = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
        for q in map(int, qs.split(",")):
            print(json.dumps(one(v, q, dur, gpu)), flush=True)
        return
    out = sys.argv[1] if len(sys.argv) > 1 else None
    qs, dur, gpu = os.environ.get("QS", "1,8,32,64,128"), os.environ.get("DUR", "1.5"), os.environ.get("GPU_US", "200")
    rows = []
    for r in range(int(os.environ.get("ROUNDS", "3"))):
        for v in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            p = subprocess.run([sys.executable, __file__, "--one", v, qs, dur, gpu], capture_output=True, text=True, check=True)
            for line in p.stdout.splitlines():
                rows.append({**json.loads(line), "round": r + 1})
                print(json.dumps(rows[-1]), flush=True)
    env = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
           "cores": os.cpu_count(), "gpu_us": float(gpu), "dur_s": float(dur)}
    print(f"{'variant':12s} " + " ".join(f"{q:>8s}" for q in qs.split(",")))
    for v in VARIANTS:
        cells = []
        for q in map(int, qs.split(",")):
            got = [x["qps"] for x in rows if x["variant"] == v and x["Q"] == q]
            cells.append(f"{sum(got) / len(got):8.0f}")
        print(f"{v:12s} " + " ".join(cells))
    if out:
        with open(out, "w") as fh:
            json.dump({"env": env, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
