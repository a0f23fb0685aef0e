"""Probe (issue 24): can a batch's host-to-device copy read the callers' own tensors instead of
the driver's staging copy? For k wide&deep queries (28 tensors each, 228 KB; pinned, as the
sweep makes them, and a pageable clone of them) it compares

* A: ``torch._foreach_copy_`` into one pinned staging buffer (what the runtime's batch driver
  does) + ONE host-to-device copy;
* B: ONE ``cuMemcpyBatchAsync`` (through ctypes, keeping the GIL; the CUDA 13 signature,
  ``cuMemcpyBatchAsync_v2``, where the driver has it) of the 28 x k pieces straight from the
  callers' tensors into the device buffer, with the stream-order and any-order source
  access attributes.

Per call: CPU time (perf_counter; for B including reading the 28 x k data pointers), GPU
time (CUDA events around it), medians of 30; B's device bytes compared with A's.
Writes ``$OUT/batch_memcpy_probe.json``; results in bench/serving/results/batch_memcpy_h100/.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "examples"))

import torch  # noqa: E402
from serve_anchors import _flat, _queries  # noqa: E402


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Attr(ctypes.Structure):  # CUmemcpyAttributes
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", Loc), ("dstLocHint", Loc), ("flags", ctypes.c_uint)]


LIB = ctypes.PyDLL("libcuda.so.1")
try:
    FN, V2 = LIB.cuMemcpyBatchAsync_v2, True
except AttributeError:
    FN, V2 = LIB.cuMemcpyBatchAsync, False
FN.restype = ctypes.c_int
ORDER = {"stream": 1, "during_call": 2, "any": 3}  # CUmemcpySrcAccessOrder


def batch_copy(dsts: list[int], srcs: list[int], sizes: list[int], stream: int, order: str) -> int:
    n = len(dsts)
    d = (ctypes.c_uint64 * n)(*dsts)
    s = (ctypes.c_uint64 * n)(*srcs)
    z = (ctypes.c_size_t * n)(*sizes)
    a = Attr(ORDER[order], Loc(0, 0), Loc(1, 0), 0)  # no source hint; destination: device 0
    idx = (ctypes.c_size_t * 1)(0)
    if V2:
        return FN(d, s, z, ctypes.c_size_t(n), ctypes.byref(a), idx, ctypes.c_size_t(1), ctypes.c_void_p(stream))
    fail = ctypes.c_size_t(0)
    return FN(d, s, z, ctypes.c_size_t(n), ctypes.byref(a), idx, ctypes.c_size_t(1), ctypes.byref(fail),
              ctypes.c_void_p(stream))


def _median(xs: list[float], scale: float) -> float:
    return round(sorted(xs)[len(xs) // 2] * scale, 1)


def _timed(stream: torch.cuda.Stream, host_part, device_part) -> tuple[float, float]:
    """CPU seconds of host_part() + device_part() and GPU ms between events around them."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        e0.record()
        t0 = time.perf_counter()
        host_part()
        device_part()
        cpu = time.perf_counter() - t0
        e1.record()
    e1.synchronize()
    return cpu, e0.elapsed_time(e1)


def probe_k(k: int, qs: list[list[torch.Tensor]], block: int, s: torch.cuda.Stream) -> dict:
    leaves = [t for q in qs[:k] for t in q]
    host = torch.empty(k * block, dtype=torch.uint8, pin_memory=True)
    views, off = [], 0
    for t in leaves:
        views.append(host[off:off + t.nbytes].view(t.dtype).view(t.shape))
        off += t.nbytes
    dev_a = torch.empty(k * block, dtype=torch.uint8, device="cuda")
    dev_b = torch.zeros_like(dev_a)
    offs = [0]
    for t in leaves[:-1]:
        offs.append(offs[-1] + t.nbytes)
    dsts = [dev_b.data_ptr() + o for o in offs]
    row: dict = {"k": k}
    cpu, gpu = [], []
    for _ in range(30):
        c, g = _timed(s, lambda: torch._foreach_copy_(views, leaves), lambda: dev_a.copy_(host, non_blocking=True))
        cpu.append(c)
        gpu.append(g)
    row["A_cpu_us"], row["A_gpu_us"] = _median(cpu, 1e6), _median(gpu, 1e3)
    for kind in ("pinned", "pageable"):
        src = leaves if kind == "pinned" else [t.clone() for t in leaves]
        for order in ("stream", "any"):
            cpu, gpu, rcs = [], [], set()
            for _ in range(30):
                dev_b.zero_()
                torch.cuda.synchronize()

                def copy(src=src, order=order, rcs=rcs):
                    rcs.add(batch_copy(dsts, [t.data_ptr() for t in src], [t.nbytes for t in src], s.cuda_stream, order))

                c, g = _timed(s, copy, lambda: None)
                cpu.append(c)
                gpu.append(g)
            row[f"B_{kind}_{order}"] = {"rc": sorted(rcs), "cpu_us": _median(cpu, 1e6), "gpu_us": _median(gpu, 1e3),
                                        "equal": bool(torch.equal(dev_a, dev_b))}
    return row


def main() -> None:
    torch.cuda.init()
    qs = [_flat(q) for q in _queries(32)]
    block = sum(t.nbytes for t in qs[0])
    out: dict = {"v2": V2, "block": block, "rows": []}
    s = torch.cuda.Stream()
    for k in (1, 4, 8, 16, 32):
        row = probe_k(k, qs, block, s)
        print(json.dumps(row), flush=True)
        out["rows"].append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "batch_memcpy_probe.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
