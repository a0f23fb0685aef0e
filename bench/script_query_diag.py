"""The plain script's query (``examples/plain_serving_script.py``) in-process, several ways.

    python bench/script_query_diag.py MODE THREADS GROUPS [DURATION]

Runs the script's own client loop (``serve``) with ``THREADS`` clients and prints one JSON
line (mode, threads, groups, qps, p99_ms, checksum). MODE:

* ``eager``: the script's query as it is.
* ``hook``: under the start-up hook (``_autoapply.activate``, ``GROUPS`` graphed groups).
* ``hook_biglock``: the hook, with one process-wide lock around the copies and the model call.
* ``hook_tolock``: the hook, the lock taken at the thread's first ``Tensor.to`` of a query and
  released after the model call.
* ``hook_pack``: the hook, with ``Tensor.to`` replaced by a minimal packer (bytes memmoved into
  a per-thread pinned buffer, a reused device view returned, one copy before the model call).
  It keeps no safety at all (no flush on first use, no check that a view is free): an upper
  bound for packing the copies in the hook, not something to ship.
* ``floor``: that packer plus a CUDA graph per thread whose static inputs are the packed views,
  replayed directly with no hook.
* ``prepacked``: inputs already in one pinned buffer (``bench/serve_anchors.py``
  ``graph_prepacked``) through the same loop.

Environment knobs (each 0/1 unless said): ``SYNC`` (synchronize the stream before ``.cpu()``),
``PINOUT`` (fetch the output through a pinned buffer instead of ``.cpu()``), ``ONE_THREAD``
(``torch.set_num_threads(1)``), ``SWITCH`` (seconds, ``sys.setswitchinterval``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import torch

PINOUT = bool(int(os.environ.get("PINOUT", "0")))
ONE_THREAD = bool(int(os.environ.get("ONE_THREAD", "0")))
SWITCH = float(os.environ.get("SWITCH", "0"))
SYNC = bool(int(os.environ.get("SYNC", "0")))
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import plain_serving_script as pss  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import serve_anchors  # noqa: E402
from wdl_serving import WideDeep, host_query  # noqa: E402


def main() -> None:
    mode, threads, groups = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dur = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    if ONE_THREAD:
        torch.set_num_threads(1)
    if SWITCH:
        sys.setswitchinterval(SWITCH)
    if mode not in ("eager", "floor", "prepacked"):
        from recsys_doctor.applying import _autoapply

        _autoapply.activate({"runtime": {"groups": groups, "cuda_graphs": True}})
    torch.manual_seed(0)
    model = WideDeep(100_000).cuda().eval()
    queries = []
    for k in range(threads):
        torch.manual_seed(1000 + k)
        queries.append(host_query(256, 100_000))
    big = threading.Lock()
    big2 = threading.RLock()
    tls = threading.local()

    if mode == "hook_tolock":
        orig_to = torch.Tensor.to

        def to(self, *a, **k):
            if not getattr(tls, "held", False):
                big.acquire()
                tls.held = True
            return orig_to(self, *a, **k)

        torch.Tensor.to = to

    if mode in ("hook_pack", "floor"):
        import ctypes

        orig_to = torch.Tensor.to
        memmove = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
            ctypes._memmove_addr)

        def stage():
            st = getattr(tls, "st", None)
            if st is None:
                st = tls.st = {"host": torch.empty(1 << 20, dtype=torch.uint8).pin_memory(),
                               "dev": torch.empty(1 << 20, dtype=torch.uint8, device="cuda"),
                               "off": 0, "i": 0, "views": {}}
                st["hptr"] = st["host"].data_ptr()
            return st

        def to(self, *a, **k):
            if self.is_cuda:
                return orig_to(self, *a, **k)
            st = stage()
            n = self.nbytes
            off = st["off"]
            memmove(st["hptr"] + off, self.data_ptr(), n)
            key = (st["i"], self.dtype, self.shape)
            v = st["views"].get(key)
            if v is None:
                v = st["views"][key] = st["dev"][off:off + n].view(self.dtype).view(self.shape)
            st["off"] = off + (n + 255) // 256 * 256
            st["i"] += 1
            return v

        torch.Tensor.to = to

    def flush():
        st = tls.st
        st["dev"][:st["off"]].copy_(st["host"][:st["off"]], non_blocking=True)
        st["off"] = st["i"] = 0

    ncap = [0]

    def tocpu(o):
        if not PINOUT:
            return o.cpu()
        h = getattr(tls, "pin", None)
        if h is None or h.shape != o.shape:
            h = tls.pin = torch.empty(o.shape, dtype=o.dtype).pin_memory()
        h.copy_(o, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return h.clone()

    def floor_query(dense, idx, offs):  # staged copies + a graph per thread whose static inputs are the views
        args = (dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                offs.to("cuda", non_blocking=True))
        flush()
        gr = getattr(tls, "graph", None)
        if gr is None:
            s = torch.cuda.current_stream()
            s.synchronize()
            model(*args)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=torch.cuda.Stream(), capture_error_mode="thread_local"):
                o = model(*args)
            tls.graph = gr = (g, o)
            ncap[0] += 1
        gr[0].replay()
        o = gr[1].clone()
        if SYNC:
            torch.cuda.current_stream().synchronize()
        return tocpu(o)

    def prepacked_query(q):  # bench/serve_anchors.py graph_prepacked, through the script's loop
        fn = getattr(tls, "pp", None)
        if fn is None:
            with big2:
                fn = tls.pp = serve_anchors._graph_client(model, q, "graph_prepacked")
                ncap[0] += 1
        return fn()

    def one_query(q):
        dense, idx, offs = q
        with torch.no_grad():
            if mode == "prepacked":
                if ncap[0] < threads:
                    with big2:
                        return prepacked_query(q)
                return prepacked_query(q)
            if mode == "floor" and ncap[0] < threads:  # captures alone: nothing else runs meanwhile
                with big:
                    return floor_query(dense, idx, offs)
            if mode == "floor":
                return floor_query(dense, idx, offs)
            if mode == "hook_pack":
                args = (dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                        offs.to("cuda", non_blocking=True))
                flush()
                o = model(*args)
                if SYNC:
                    torch.cuda.current_stream().synchronize()
                return tocpu(o)
            if mode == "hook_biglock":
                with big:
                    out = model(dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                                offs.to("cuda", non_blocking=True))
            else:
                out = model(dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                            offs.to("cuda", non_blocking=True))
                if getattr(tls, "held", False):
                    tls.held = False
                    big.release()
        if SYNC:
            torch.cuda.current_stream().synchronize()
        return tocpu(out)

    if mode in ("floor", "prepacked"):
        pss_serve = pss.serve

        def serve(fn, qs, w, d):  # each client on its own stream, as the hook gives it
            def with_stream(q):
                s = getattr(tls, "stream", None)
                if s is None:
                    s = tls.stream = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    return fn(q)
            return pss_serve(with_stream, qs, w, d)
        pss.serve = serve
    lat, wall, checksum = pss.serve(one_query, queries, 10, dur)
    n = len(lat)
    p99 = lat[max(0, min(n - 1, int(-(-99 * n // 100)) - 1))]
    print(json.dumps({"mode": mode + ("+sync" if SYNC else "") + ("+pinout" if PINOUT else "") + ("+t1" if ONE_THREAD else "") + (f"+sw{SWITCH}" if SWITCH else ""), "threads": threads, "groups": groups, "qps": round(n / wall, 1),
                      "p99_ms": round(p99, 3), "checksum": round(checksum, 4)}), flush=True)


if __name__ == "__main__":
    main()
