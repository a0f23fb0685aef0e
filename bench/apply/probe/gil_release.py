"""Which calls on a hooked query's path give the interpreter lock (GIL) up? With 4 client
threads, each time a call releases the GIL its thread must wait to get it back (~56 us a time
in the hooked DLRM script, ``bench/apply/results/hostprof_h100/``), so a call that releases it
costs far more than its own run time. Method: a second thread spins in pure Python, wanting the
GIL (switch interval 1 ms); each call is made in a loop for 0.2 s. A call that keeps the GIL
runs hundreds of thousands of times (the spinner gets the GIL only when the 1 ms interval
forces a switch); one that releases it runs a few thousand times (the spinner takes the GIL
at each release and keeps it for the interval). ``keep``: the result is kept alive (the
creation alone); ``drop``: dropped at once (its deallocation counted too).

    python bench/apply/probe/gil_release.py [--cuda]     # one JSON line per call
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import torch


def cases(cuda: bool):
    x = torch.zeros(32, 256)
    a = np.zeros((32, 256), dtype=np.float32)
    small = np.zeros(256, dtype=np.float32)
    yield "tensor.is_contiguous()", lambda: x.is_contiguous()
    yield "tensor.data_ptr()", lambda: x.data_ptr()
    yield "tensor.shape", lambda: x.shape
    yield "torch._C._dispatch_keys(t)", lambda: torch._C._dispatch_keys(x)
    yield "tensor.is_neg()", lambda: x.is_neg()
    yield "tensor.is_complex()", lambda: x.is_complex()
    yield "tensor.is_pinned()", lambda: x.is_pinned()
    yield "tensor.numpy()", lambda: x.numpy()
    yield "torch.from_numpy(a)", lambda: torch.from_numpy(a)
    yield "tensor[i]", lambda: x[3]
    yield "tensor.view(-1)", lambda: x.view(-1)
    yield "numpy a[i]", lambda: a[3]
    yield "numpy copy, 256 items", lambda: small.copy()
    yield "numpy copy, 8192 items", lambda: a.copy()
    if cuda:
        g = torch.zeros(32, 256, device="cuda")
        ev = torch.cuda.Event()
        ev.record()
        s = torch.cuda.current_stream()
        yield "cuda event.record()", lambda: ev.record()
        yield "cuda event.query()", lambda: ev.query()
        yield "torch.cuda.current_stream()", lambda: torch.cuda.current_stream()
        yield "torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0)
        yield "cuda tensor.clone()", lambda: g.clone()
        yield "cuda tensor.cpu() (32 KB)", lambda: g.cpu()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g.add_(1)
        yield "CUDAGraph.replay()", lambda: graph.replay()
        s.synchronize()


def main() -> None:
    cuda = "--cuda" in sys.argv
    sys.setswitchinterval(0.001)
    stop = [False]

    def spin() -> None:
        while not stop[0]:
            pass

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    pc = time.perf_counter
    for name, fn in cases(cuda):
        fn()
        row = {"call": name}
        for mode in ("keep", "drop"):
            kept = []
            n, t1 = 0, pc()
            while pc() - t1 < 0.2:
                r = fn()
                n += 1
                if mode == "keep":
                    kept.append(r)
            row[f"calls_{mode}"] = n
            del kept
        print(json.dumps(row), flush=True)
        if cuda:
            torch.cuda.synchronize()
    stop[0] = True


if __name__ == "__main__":
    main()
