"""Tiny hand-built traces for analyzer/summary/planner tests (numbers computed by hand)."""

from __future__ import annotations

import pandas as pd

from recsys_doctor.model import Trace


def T(**tables) -> Trace:
    return Trace(path="<hand>", format="test", **{k: pd.DataFrame(v) for k, v in tables.items()})


def kern(start, end, corr=0, pid=1, device=0, stream=7, name="k", grid=(1, 1, 1), in_graph=False):
    return {"start": start, "end": end, "pid": pid, "device": device, "stream": stream, "correlation": corr,
            "name": name, "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2], "block_x": 128,
            "block_y": 1, "block_z": 1, "in_graph": in_graph}


def api(start, end, corr, tid, name="cudaLaunchKernel", pid=1):
    return {"start": start, "end": end, "pid": pid, "tid": tid, "correlation": corr, "name": name,
            "api_class": "runtime"}


def copy(start, end, kind, corr=0, pid=1, device=0, stream=7, nbytes=100, src="pinned", dst="device"):
    return {"start": start, "end": end, "pid": pid, "device": device, "stream": stream, "correlation": corr,
            "bytes": nbytes, "kind": kind, "src_mem": src, "dst_mem": dst, "in_graph": False}


def rng(start, end, tid, name, pid=1, source="nvtx", depth=None):
    return {"start": start, "end": end, "pid": pid, "tid": tid, "name": name, "source": source, "depth": depth}
