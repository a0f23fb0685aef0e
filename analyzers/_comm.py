"""Communication kernels: which kernels move data between GPUs, what collective each is,
and how much of their time runs under compute.

Shared by the ``comm-exposed`` analyzer (one trace) and :mod:`recsys_doctor.diagnose.ranks`
(many rank traces), so both count the same kernels and the same overlap.

Communication kernels are those whose name says NCCL/RCCL (``ncclKernel_*``,
``ncclDevKernel_*``), NVSHMEM or DeepEP (expert-parallel dispatch/combine): they use few
blocks by design and spend much of their time waiting for the peer ranks. Compute is every
other kernel plus CUDA-graph executions (copies and memsets are neither, as in HTA's
comm/compute overlap, which these numbers equal on the DLRM ranks).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np

from ..model import Trace
from ..options import Options
from ._arrays import merge_intervals
from ._util import per_value, str_contains

__all__ = ["COMM_RE", "comm_mask", "collective_kinds", "Overlap", "overlap", "comm_overlap_by_device"]

#: kernel names of inter-GPU communication: the default of ``Options.comm_kernel_pattern``
#: (small-grid and comm-exposed take the options' pattern; ranks and the planner this one)
COMM_RE = re.compile(Options.comm_kernel_pattern)
_KIND_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)", re.IGNORECASE)


def comm_mask(trace: Trace, pattern: str | None = None) -> np.ndarray:
    """True for the kernels (rows of ``trace.kernels``) that are communication (names
    matching ``pattern``, default :data:`COMM_RE`)."""
    k = trace.kernels
    rx = COMM_RE if pattern is None else re.compile(pattern)
    return str_contains(k["name"], rx).to_numpy(bool) if len(k) else np.zeros(0, dtype=bool)


def _kind(name: Any) -> str:
    if not isinstance(name, str):
        return "other"
    m = _KIND_RE.search(name)
    if m:
        return m.group(1)
    low = name.lower()
    return "dispatch/combine" if "deep" in low else ("nvshmem" if "nvshmem" in low else "other")


def collective_kinds(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The collective of each kernel row (``SendRecv`` - all-to-all and point-to-point -,
    ``AllReduce``, ``AllGather``, ``ReduceScatter``, ``Broadcast``, ...), one regex per
    distinct name."""
    return per_value(trace.kernels["name"], _kind, rows)


class Overlap(NamedTuple):
    """Union lengths (ns): compute, communication, and communication under compute."""

    compute_ns: int
    comm_ns: int
    hidden_ns: int

    @property
    def exposed_ns(self) -> int:
        return self.comm_ns - self.hidden_ns


def overlap(cs: np.ndarray, ce: np.ndarray, ms: np.ndarray, me: np.ndarray, lo: int | None = None) -> Overlap:
    """Compute intervals ``[cs, ce)`` against communication intervals ``[ms, me)``; with
    ``lo``, only the time from ``lo`` on counts (the steady state)."""
    if lo is not None:
        cs, ce = np.maximum(cs, lo), np.maximum(ce, lo)
        ms, me = np.maximum(ms, lo), np.maximum(me, lo)
    comp = merge_intervals(cs, ce)
    comm = merge_intervals(ms, me)
    both = merge_intervals(np.concatenate([comp[0], comm[0]]), np.concatenate([comp[1], comm[1]]))
    c, m = int((comp[1] - comp[0]).sum()), int((comm[1] - comm[0]).sum())
    return Overlap(c, m, c + m - int((both[1] - both[0]).sum()))


def comm_overlap_by_device(trace: Trace, comm: np.ndarray | None = None) -> dict[int, dict[str, Any]]:
    """Per device with communication kernels: its compute/comm intervals as arrays
    (``cs, ce, ms, me``), the kernel rows of its communication (``rows``) and the
    :class:`Overlap` over the whole trace (``all``)."""
    k = trace.kernels
    comm = comm_mask(trace) if comm is None else comm
    if not comm.any():
        return {}
    kdev = k["device"].to_numpy(np.int64)
    ks, ke = k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    g = trace.graphs
    gdev = g["device"].to_numpy(np.int64)
    gs, ge = g["start"].to_numpy(np.int64), g["end"].to_numpy(np.int64)
    out: dict[int, dict[str, Any]] = {}
    for d in np.unique(kdev[comm]):
        on = kdev == d
        cm, mm, gm = on & ~comm, on & comm, gdev == d
        cs, ce = np.concatenate([ks[cm], gs[gm]]), np.concatenate([ke[cm], ge[gm]])
        rows = np.flatnonzero(mm)
        out[int(d)] = {"cs": cs, "ce": ce, "ms": ks[rows], "me": ke[rows], "rows": rows,
                       "all": overlap(cs, ce, ks[rows], ke[rows])}
    return out
