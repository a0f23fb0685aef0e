"""What-if: how fast would a workload run under a stream-group plan? Estimated from its trace.

``profile --apply`` cannot measure every candidate plan (group count x merged copy/compute
streams x per-stream allocator x CUDA graphs is 32 of them), so it ranks them with this
estimate and measures only the best few. The estimate is deliberately simple, so that it
can be checked by hand and held to account next to the measured numbers:

1. :func:`trace_stats` reduces the trace (inside the measurement window) to per-unit numbers
   (a unit is one query or one training step): GPU time of kernels and of copies, how many
   GPU operations the host launched, the host time spent per unit, and how much of the GPU
   one kernel fills (its grid against the SM count).
2. :func:`estimate` replays those numbers onto a candidate:

   * **host time per unit** ``H``. Eager: every GPU operation costs the measured host time
     per operation ``h = host_ns_per_unit / ops_per_unit`` (Python dispatch plus the launch
     API, as measured), so ``H = ops_per_unit * h``; separate copy streams add
     ``unmerged_extra_ops`` event records/waits. With CUDA graphs the whole unit is one
     query through the runtime's hot path, whose host cost does not depend on the model:
     ``H = graph_host_ns`` (measured on the H100 by ``bench/serving/serve_anchors.py``; the eager
     per-operation cost ``h`` says nothing about it, which is why an older form of this
     model, ``graph_host_ops * h``, predicted the same host-bound number for every group
     count). A plain script under the start-up hook keeps its own ``.to()`` calls, which the
     thread graphs turn into views (``script_copy_host_ns`` each, measured) while the copies
     become memcpy nodes of the graph: ``H = graph_host_ns + copies_per_unit *
     script_copy_host_ns`` and ``copies_per_unit * script_copy_node_ns`` of GPU time instead
     of the packed transfers. Host work of all
     client threads is serialized (one Python interpreter lock), so the host alone allows
     ``1 / H`` units per second.
   * **GPU time per unit** ``D``. Eager: the measured kernel + copy time. With graphs:
     kernel time plus ``graph_node_gap_ns`` per kernel, and the copies packed into one
     transfer each way (``packed_copy_ns``).
   * **overlap** across groups: a group runs its queries one after another on its stream,
     so ``n = min(groups, clients)`` bounds how many queries the GPU works on at once.
     Graphed serving: concurrent graphs of tiny kernels share the memory system and the
     work distributor, a share ``s`` of each one's GPU time cannot overlap
     (``serial_share``, measured), so ``overlap = n / (1 + s (n - 1))`` (Amdahl's law:
     1.5 for 2 groups, 2.0 for 4, 2.4 for 8 with ``s = 1/3``). Otherwise (eager, training):
     a kernel that uses a fraction ``o`` of the SMs (time-weighted mean of its resident
     threads over the GPU's) leaves room for about ``1 / o`` such kernels at once, and
     ``overlap = min(n, 1 / o, max_overlap)``. This is what tells group counts apart: one
     group is GPU-bound at ``1 / D``, more groups raise the GPU limit until the host binds.
   * **serving throughput** ``X = min(1 / H, overlap / D, clients_in_flight / (H + D))``
     where ``clients_in_flight = min(clients, groups * slots)``; latency by Little's law
     ``p50 = clients / X``, and ``p99 = p50 * tail`` with the baseline's own p99/p50 ratio.
   * **training step**: eager ``max(H, D)``; with graphs ``max(H_graph, D_graph)`` where the
     part of the GPU time in kernels that do not fill the GPU (``small_grid_share``) is
     divided by the overlap of ``groups`` branch streams.

Pure: numbers in, numbers out; no torch, no GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..analyzers._util import merge_intervals, union_length
from ..analyzers.no_gpu_activity import reason as no_gpu_reason
from ..errors import BadInputError
from ..model import Trace
from ..plan import DEFAULT_MAX_BATCH, Plan

__all__ = ["TraceStats", "Candidate", "Prediction", "WhatIfCosts", "trace_stats", "estimate", "rank",
           "union_ns", "host_busy_ns"]

_SYNC_API = r"Synchronize|^(?:cuda|cu)Memcpy(?!.*Async)"
_SYNC_RE = __import__("re").compile(_SYNC_API)


@dataclass(frozen=True)
class WhatIfCosts:
    """Constants of the model that the trace cannot tell, each with where it comes from."""

    #: host time of one graphed query through the runtime's hot path (flatten and key the
    #: inputs, one ``_foreach_copy_`` into pinned staging, slot pool, graph launch and event
    #: record through ctypes, the wait, the output clone): the Python interpreter lock is held
    #: for this long per query, whatever the model. Measured on the H100 as the inverse of
    #: the host-bound ``serve`` throughput (``bench/serving/results/serve_anchors_h100.json``).
    #: None: use ``graph_host_ops`` eager-sized operations instead (the older model).
    graph_host_ns: float | None = 60_000.0
    #: with ``graph_host_ns=None``: host operations of one graphed query, each costing the
    #: trace's eager host time per operation.
    graph_host_ops: float = 7.0
    #: most units the GPU overlaps usefully at once, eager and training (tiny memory-bound
    #: kernels share the memory system); measured on the H100 with the hand-written
    #: graph-per-thread server of ``bench/serving/serve_anchors.py`` (8,308 q/s with 8 clients
    #: against 3,579 with one: 2.3x, ``bench/serving/results/serve_anchors_h100.json``). None: no cap.
    max_overlap: float | None = 2.3
    #: graphed serving: the share of a query's GPU time that concurrent groups' graphs
    #: cannot overlap; ``n`` groups overlap ``n / (1 + s (n - 1))``. Fit on the H100 to the
    #: runtime's wide&deep throughput at 2, 4 and 8 groups with 8 clients (5.8k, 7.7-8.4k,
    #: 9.5k q/s against 1 / D = 3.7k: overlaps 1.6, 2.1-2.3, 2.6;
    #: ``bench/apply/results/apply_i8_h100/``, ``bench/serving/results/serve_anchors_fastkey_h100/``). None: the
    #: eager rule (SM share and ``max_overlap``) for graphs too.
    serial_share: float | None = 1 / 3
    #: extra host operations per unit when copies run on their own streams (2 event records
    #: + 2 stream waits per query in the unmerged runtime path).
    unmerged_extra_ops: float = 4.0
    #: GPU gap between consecutive kernels inside a CUDA graph: one graphed wide&deep query
    #: alone takes ~250 us on the H100 (the hand-roll's 3,702 q/s with one client, host
    #: included) for 240 us of kernels and 88 kernels, so well under 1 us each; eager
    #: launches leave far more between them.
    graph_node_gap_ns: float = 200.0
    #: a plain script under the start-up hook, whose copies the thread graphs take over
    #: (``recsys_doctor.applying._autoapply``): host time of one such copy (the hook's ``.to()``:
    #: its checks and the view it hands out, under 8 threads sharing the interpreter lock)
    #: and GPU time of one memcpy node of the thread's graph (small pinned host-to-device
    #: copies, one after another). Fit on the H100 to the plain script's measured g4 and g1
    #: throughput (4,164 and 2,431 q/s with 8 clients, 30.1 copies a query;
    #: ``bench/apply/results/thread_graphs_h100/first_run/``): 4,164 q/s is host-bound, so 60 us
    #: + 30.1 copies x 6 us = 241 us a query; g1 is GPU-bound, so 411 us = 240 us of kernels
    #: + 88 x 0.2 us + 30.1 x 5 us. None: the older rule, each copy at the trace's eager host
    #: time per operation and the copies packed into one transfer each way.
    script_copy_host_ns: float | None = 6_000.0
    script_copy_node_ns: float | None = 5_000.0
    #: fixed cost of one packed copy (DMA setup) and its bandwidth for small pinned copies.
    copy_fixed_ns: float = 2_000.0
    copy_bytes_per_ns: float = 20.0
    #: queries a group keeps in flight (``RuntimeConfig.slots_per_group``); None: enough
    #: for every client (what ``profile --apply`` configures, see ``apply.runtime_plan``).
    slots_per_group: int | None = None
    #: resident threads per SM (2048 on Volta..Hopper): a kernel's share of the GPU is
    #: ``blocks * threads_per_block / (SMs * this)``, capped at 1.
    threads_per_sm: int = 2048
    #: the GPU time with graphs cannot go below this share of the eager GPU time (keeps the
    #: estimate from promising more than the kernels themselves take).
    min_gpu_share: float = 0.0
    #: dynamic batching (:mod:`recsys_doctor.planning._batching`), from the H100 sweep of e67015b
    #: (``bench/results/serving_sweep_h100.json`` then, ``runtime_batched_call``, wide&deep): host
    #: time per query on the batched path (1e9 / 20,180 q/s at 64 clients, host-bound); the GPU
    #: time one more query adds to a batch, as a share of one query alone (bucket GPU times 239.7
    #: us for 1 query, 756.0 us for 32: (756.0 - 239.7) / 31 / 239.7, ``..._info.json``); the
    #: mean batch as a share of the clients (6.9 of 32, 12.8 of 64, 23.7 of 128 in its
    #: batch-size histograms). Measured bucket costs replace the share (``bucket_gpu_ns``).
    batch_host_ns: float = 49_550.0
    batch_marginal_share: float = 0.069
    batch_fill: float = 0.2
    #: measured GPU ns a batch per bucket size (``ServedModel.bucket_gpu_us()`` x 1e3) and where
    #: from: when given, a batch costs its bucket's (:mod:`._batching`), not the share above.
    bucket_gpu_ns: dict[int, float] | None = None
    bucket_source: str | None = None


@dataclass
class TraceStats:
    """Per-unit numbers of one trace window (a unit: one query or one training step)."""

    units: int
    unit_source: str
    kind: str
    threads: int
    wall_ns: int
    kernel_ns_per_unit: float
    copy_ns_per_unit: float
    kernels_per_unit: float
    copies_per_unit: float
    ops_per_unit: float
    bytes_per_unit: float
    host_ns_per_unit: float
    gpu_busy_ns: int
    sm_count: int | None
    mean_sm_share: float
    small_grid_share: float
    p99_over_p50: float = 1.0

    @property
    def gpu_ns_per_unit(self) -> float:
        return self.kernel_ns_per_unit + self.copy_ns_per_unit

    @property
    def host_ns_per_op(self) -> float:
        return self.host_ns_per_unit / self.ops_per_unit if self.ops_per_unit else 0.0

    @property
    def utilization(self) -> float:
        return self.gpu_busy_ns / self.wall_ns if self.wall_ns else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(gpu_ns_per_unit=self.gpu_ns_per_unit, host_ns_per_op=self.host_ns_per_op,
                 utilization=self.utilization)
        return d


@dataclass(frozen=True)
class Candidate:
    """The part of a :class:`~recsys_doctor.plan.Plan` the what-if prices: its four knobs."""

    groups: int
    merge_streams: bool = True
    per_stream_allocator: bool = True
    cuda_graphs: bool = True
    #: dynamic batching of concurrent queries (serving), up to ``max_batch`` a batch
    batching: bool = False
    max_batch: int = DEFAULT_MAX_BATCH

    @property
    def label(self) -> str:
        return (f"g{self.groups} {'merged' if self.merge_streams else 'split'} "
                f"{'own-pool' if self.per_stream_allocator else 'shared-pool'} "
                f"{'graphs' if self.cuda_graphs else 'eager'}"
                + (f" batched<={self.max_batch}" if self.batching else ""))

    @classmethod
    def from_plan(cls, plan: Plan) -> "Candidate":
        """The knobs of ``plan`` the estimate prices (the rest of a plan does not change it)."""
        return cls(plan.groups, plan.merge_streams, plan.per_stream_allocator, plan.cuda_graphs,
                   plan.batching, plan.max_batch)

    def to_plan(self) -> Plan:
        return Plan(groups=self.groups, merge_streams=self.merge_streams,
                    per_stream_allocator=self.per_stream_allocator, cuda_graphs=self.cuda_graphs,
                    batching=self.batching, max_batch=self.max_batch)

    def to_runtime(self) -> dict[str, Any]:
        """The flat dict :meth:`RuntimeConfig.from_plan` reads (:meth:`Plan.to_runtime`)."""
        return self.to_plan().to_runtime()


@dataclass
class Prediction:
    """The estimate for one candidate. ``qps``/``p50_ms``/``p99_ms`` for serving,
    ``step_ms`` for training; ``bound`` says which limit decided it."""

    candidate: Candidate
    host_ns: float
    gpu_ns: float
    overlap: float
    bound: str
    qps: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    step_ms: float | None = None
    score: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["candidate"] = self.candidate.to_runtime()
        d["label"] = self.candidate.label
        return d


# ------------------------------------------------------------------------------ intervals

def union_ns(starts: Sequence[int] | np.ndarray, ends: Sequence[int] | np.ndarray) -> int:
    """Total length of the union of intervals ``[start, end)`` (ns): the analyzers' one
    interval union (:func:`recsys_doctor.analyzers._util.union_length`)."""
    return union_length(starts, ends)


def host_busy_ns(api: pd.DataFrame) -> int:
    """Time during which at least one CPU thread was doing host work: per thread, from its
    first to its last CUDA API call, minus the time it sat in a blocking call (a
    synchronize or a synchronous copy); then the union over threads. With one Python
    interpreter lock this is the serialized host cost of the window."""
    if len(api) == 0:
        return 0
    busy: list[tuple[int, int]] = []
    for _, g in api.groupby(["pid", "tid"], sort=False):
        lo, hi = int(g["start"].min()), int(g["end"].max())
        blocked = g[g["name"].astype(str).str.contains(_SYNC_RE)]
        cur = lo
        for s, e in zip(*merge_intervals(blocked["start"].to_numpy(np.int64), blocked["end"].to_numpy(np.int64))):
            if s > cur:
                busy.append((cur, min(s, hi)))
            cur = max(cur, e)
        if cur < hi:
            busy.append((cur, hi))
    busy = [(s, e) for s, e in busy if e > s]
    return union_ns([s for s, _ in busy], [e for _, e in busy])


# ------------------------------------------------------------------------------ the stats

def trace_stats(trace: Trace, *, units: int | None = None, kind: str = "serve", unit_range: str | None = None,
                p99_over_p50: float = 1.0, threads_per_sm: int = 2048) -> TraceStats:
    """Reduce ``trace`` (already restricted to the measurement window) to per-unit numbers.

    The unit count is ``units`` when given (the measured call count), else the number of
    ``unit_range`` ranges (``query``/``step``), else the number of device-to-host copies
    (one result copy per query is the serving pattern). ``mean_sm_share`` is the
    time-weighted mean of ``min(1, blocks * threads_per_block / (SMs * threads_per_sm))``;
    ``small_grid_share`` the share of kernel time in kernels with fewer blocks than SMs.
    Raises :class:`BadInputError` when the trace has no GPU work (saying why) or no units.
    """
    k, m, ms = trace.kernels, trace.memcpys, trace.memsets
    if len(k) + len(m) == 0:
        raise BadInputError(f"the trace has no kernels or copies: nothing to estimate from ({no_gpu_reason(trace)})")
    units, source = _count_units(trace, units, unit_range)
    act = trace.gpu_activity()
    lo = int(act["start"].min())
    hi = int(act["end"].max())
    if len(trace.api):
        lo = min(lo, int(trace.api["start"].min()))
        hi = max(hi, int(trace.api["end"].max()))
    kdur = (k["end"] - k["start"]).clip(lower=0).astype("float64")
    mdur = (m["end"] - m["start"]).clip(lower=0).astype("float64")
    sdur = (ms["end"] - ms["start"]).clip(lower=0).astype("float64")
    sm = None
    if len(trace.devices) and trace.devices["sm_count"].notna().any():
        sm = int(trace.devices["sm_count"].dropna().max())
    share, small = _sm_shares(k, kdur.to_numpy(), sm, threads_per_sm)
    threads = int(trace.api.groupby(["pid", "tid"]).ngroups) if len(trace.api) else 1
    return TraceStats(
        units=int(units), unit_source=source, kind=kind, threads=max(1, threads), wall_ns=max(1, hi - lo),
        kernel_ns_per_unit=float(kdur.sum()) / units,
        copy_ns_per_unit=float(mdur.sum() + sdur.sum()) / units,
        kernels_per_unit=len(k) / units,
        copies_per_unit=(len(m) + len(ms)) / units,
        ops_per_unit=(len(k) + len(m) + len(ms)) / units,
        bytes_per_unit=float(m["bytes"].sum()) / units if len(m) else 0.0,
        host_ns_per_unit=host_busy_ns(trace.api) / units,
        gpu_busy_ns=union_ns(act["start"].to_numpy(), act["end"].to_numpy()),
        sm_count=sm, mean_sm_share=share, small_grid_share=small,
        p99_over_p50=max(1.0, float(p99_over_p50)),
    )


def _count_units(trace: Trace, units: int | None, unit_range: str | None) -> tuple[int, str]:
    """The unit count and where it came from: given, ``unit_range`` ranges, or D2H copies."""
    source = "given"
    if units is None and unit_range is not None and len(trace.ranges):
        n = int((trace.ranges["name"].astype(object) == unit_range).sum())
        if n:
            units, source = n, f"{unit_range} ranges"
    if units is None:
        m = trace.memcpys
        n = int((m["kind"].astype(object) == "d2h").sum()) if len(m) else 0
        if n:
            units, source = n, "device-to-host copies"
    if not units or units < 1:
        raise BadInputError("cannot count queries/steps in the trace (no ranges, no result copies)")
    return units, source


def _sm_shares(k: Any, w: np.ndarray, sm: int | None, threads_per_sm: int) -> tuple[float, float]:
    """``(mean_sm_share, small_grid_share)`` of the kernels ``k`` weighted by durations ``w``
    (1.0 and 0.0 without an SM count or kernel time)."""
    if not len(k) or not sm or w.sum() <= 0:
        return 1.0, 0.0

    def dims(prefix: str) -> np.ndarray:
        return (k[f"{prefix}_x"].astype("Float64").fillna(1) * k[f"{prefix}_y"].astype("Float64").fillna(1)
                * k[f"{prefix}_z"].astype("Float64").fillna(1)).astype("float64").to_numpy()

    blocks = dims("grid")
    frac = np.minimum(1.0, blocks * dims("block") / (sm * threads_per_sm))
    return float(np.sum(frac * w) / w.sum()), float(w[blocks < sm].sum() / w.sum())


# ------------------------------------------------------------------------------ the estimate

def _overlap(stats: TraceStats, groups: int, clients: int, max_overlap: float | None = None) -> float:
    cap = 1.0 / stats.mean_sm_share if stats.mean_sm_share > 0 else 1.0
    if max_overlap is not None:
        cap = min(cap, float(max_overlap))
    return max(1.0, min(float(groups), float(clients), cap))


def _graphed_gpu_ns(stats: TraceStats, costs: WhatIfCosts, copies_ns: float) -> float:
    """GPU time of one unit replayed as a CUDA graph: its kernels, a node gap each and
    ``copies_ns``, never below ``min_gpu_share`` of the eager GPU time."""
    gpu = stats.kernel_ns_per_unit + stats.kernels_per_unit * costs.graph_node_gap_ns + copies_ns
    return max(gpu, costs.min_gpu_share * stats.gpu_ns_per_unit)


def estimate(stats: TraceStats, cand: Candidate, *, clients: int | None = None,
             costs: WhatIfCosts = WhatIfCosts(), script: bool = False) -> Prediction:
    """The predicted throughput/latency (serving) or step time (training) of ``cand``; see
    the module docstring for the model. ``script``: a plain script under the start-up hook;
    its own copies stay calls on the host (``script_copy_host_ns`` each, or the trace's
    host time per operation) and become graph nodes on the GPU (``script_copy_node_ns``)."""
    q = int(clients if clients is not None else stats.threads)
    if q < 1:
        raise BadInputError(f"clients must be >= 1, got {q}")
    h = stats.host_ns_per_op
    notes: list[str] = []
    packed_copy_ns = 0.0
    if stats.copies_per_unit:
        directions = min(2.0, stats.copies_per_unit)
        packed_copy_ns = directions * costs.copy_fixed_ns + stats.bytes_per_unit / costs.copy_bytes_per_ns
    if cand.batching and (script or stats.kind == "serve"):  # a script's batching is measured, not priced
        from ._batching import estimate_batched, unpriced_script

        return Prediction(cand, **(unpriced_script() if script else
                                   estimate_batched(stats, cand, q, costs, _graphed_gpu_ns(stats, costs, packed_copy_ns))))
    if cand.cuda_graphs:
        host = costs.graph_host_ns if costs.graph_host_ns is not None else costs.graph_host_ops * h
        copies_ns = packed_copy_ns
        if script:
            per_copy = costs.script_copy_host_ns if costs.script_copy_host_ns is not None else h
            host += stats.copies_per_unit * per_copy
            if costs.script_copy_node_ns is not None:
                copies_ns = stats.copies_per_unit * costs.script_copy_node_ns
        gpu = _graphed_gpu_ns(stats, costs, copies_ns)
    else:
        host = stats.host_ns_per_unit
        gpu = stats.gpu_ns_per_unit
    if not cand.merge_streams and stats.kind == "serve":
        host += costs.unmerged_extra_ops * h
    if not cand.per_stream_allocator and cand.groups > 1:
        notes.append("shared pool: estimated like own pools (the model does not price allocator waits)")
    if stats.kind == "train":
        ov = _overlap(stats, cand.groups, cand.groups, costs.max_overlap)
        par = stats.small_grid_share
        gpu_s = gpu * (1 - par) + gpu * par / ov
        if cand.groups > 1 and not cand.cuda_graphs:
            host += 2 * cand.groups * h  # stream waits/records around each branch set, eagerly launched
        step = max(host, gpu_s)
        bound = "host" if host >= gpu_s else "gpu"
        return Prediction(cand, host, gpu_s, ov, bound, step_ms=step / 1e6, score=-step, notes=notes)
    if cand.cuda_graphs and costs.serial_share is not None:
        n = max(1, min(cand.groups, q))
        ov = n / (1 + costs.serial_share * (n - 1))
    else:
        ov = _overlap(stats, cand.groups, q, costs.max_overlap)
    in_flight = q if costs.slots_per_group is None else min(q, cand.groups * costs.slots_per_group)
    limits = {"host": 1e9 / host if host > 0 else math.inf,
              "gpu": 1e9 * ov / gpu if gpu > 0 else math.inf,
              "clients": 1e9 * in_flight / (host + gpu) if host + gpu > 0 else math.inf}
    bound = min(limits, key=lambda k: limits[k])
    x = limits[bound]
    if in_flight < q:
        notes.append(f"{q} clients share {in_flight} slots: some wait for a slot")
    p50 = q / x * 1e3 if x > 0 else math.inf
    return Prediction(cand, host, gpu, ov, bound, qps=x, p50_ms=p50, p99_ms=p50 * stats.p99_over_p50,
                      score=x, notes=notes)


def rank(stats: TraceStats, cands: Sequence[Candidate], *, clients: int | None = None,
         prefer: Candidate | None = None, costs: WhatIfCosts = WhatIfCosts(),
         script: bool = False) -> list[Prediction]:
    """Predictions for ``cands`` (``script``: see :func:`estimate`), best first. Ties (equal
    estimates within 0.5%) go to ``prefer`` (the advisor's plan), then to fewer groups,
    then to own pools."""
    preds = [estimate(stats, c, clients=clients, costs=costs, script=script) for c in cands]
    best = max((p.score for p in preds), default=0.0)

    def key(p: Prediction) -> tuple[float, int, int, int]:
        s = p.score
        bucket = round(s / (abs(best) * 0.005)) if best else 0  # 0.5% buckets
        return (-bucket, 0 if prefer is not None and p.candidate == prefer else 1, p.candidate.groups,
                0 if p.candidate.per_stream_allocator else 1)

    return sorted(preds, key=key)
