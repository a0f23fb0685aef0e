"""Exposed communication: collective time not hidden under compute.

A training rank of a recommender spends much of its step in NCCL: the embedding
all-to-all (``SendRecv`` kernels) of model-parallel tables and the dense gradients'
all-reduce. Time a collective runs while no compute kernel runs on the same device is on
the critical path: the step waits for the network, or for the slowest rank to arrive.
Per device (a rank) this measures, over the communication kernels (:mod:`._comm`):

* ``comm_ns``: the union of the communication kernels; ``comm_share_of_busy`` its share
  of the device's busy kernel time (compute and communication together);
* ``hidden_ns``: the part of it under compute (non-communication kernels and CUDA graphs
  on the same device, any stream) - HTA's comm/compute overlap;
* ``exposed_ns = comm_ns - hidden_ns``, in total and per collective kind (``SendRecv``,
  ``AllReduce``, ...: each kind's own union minus its part under compute).

A kernel that waits for a late peer rank is exposed too: ``advise DIR`` on the ranks'
traces says which rank the others wait for (the stragglers, docs/ranks.md). Reported when
the steady-state exposed time reaches ``Options.report_min_share`` of the steady window.
Recoverable time: the steady-state exposed communication (what overlapping it with compute
could hide at best); severity follows from it (docs/findings.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import where_shares
from ._comm import collective_kinds, comm_mask, comm_overlap_by_device, overlap
from ._recoverable import examples, finish, report, steady_starts, steady_window
from ._util import r, share, stream_label_codes

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "comm-exposed": {
        "comm_kernels": "number", "comm_ns": "ns", "comm_share_of_busy": "share", "compute_ns": "ns",
        "exposed_ns": "ns", "hidden_ns": "ns", "hidden_share": "share", "kernels": "number",
        "steady_exposed_ns": "ns",
    },
}

_REMEDY = (
    "Overlap communication with compute: pipeline the sparse all-to-all of batch i+1 under the dense "
    "forward/backward of batch i (TorchRec TrainPipelineSparseDist), issue collectives asynchronously on "
    "their own stream (async_op=True, DDP/FSDP gradient buckets) so they run under compute, and send fewer, "
    "larger collectives (bucket small all-reduces, fuse the per-table all-to-alls into one); where one rank "
    "arrives late at every collective (advise DIR names the stragglers), rebalance the embedding sharding "
    "(TorchRec planner with measured table costs) or the data so each rank does the same work.")


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="comm-exposed")
    comm = comm_mask(trace, options.comm_kernel_pattern)
    per_dev = comm_overlap_by_device(trace, comm)
    if not per_dev:
        res.data = {"comm_kernels": 0}
        return res
    st = steady_starts(trace, options)
    devices, steady_exposed = {}, 0
    for d, v in per_dev.items():
        devices[str(d)] = _device(trace, v, st.get(d))
        steady_exposed += devices[str(d)].pop("_steady_exposed")
    tot = [v["all"] for v in per_dev.values()]
    comm_ns, hidden = sum(o.comm_ns for o in tot), sum(o.hidden_ns for o in tot)
    busy = sum(o.compute_ns + o.comm_ns - o.hidden_ns for o in tot)
    data = res.data = {
        "comm_kernels": int(comm.sum()), "comm_ns": comm_ns, "hidden_ns": hidden, "exposed_ns": comm_ns - hidden,
        "hidden_share": r(share(hidden, comm_ns)), "comm_share_of_busy": r(share(comm_ns, busy)),
        "steady_exposed_ns": int(steady_exposed), "devices": devices}
    window = steady_window(trace, options)
    if window <= 0 or steady_exposed < options.report_min_share * window:
        return res
    kinds = _kinds_total(devices)
    top = ", ".join(f"{k} {v['exposed_ns'] / 1e6:,.2f} ms" for k, v in kinds[:3])
    f = report(res, "comm-exposed",
               title=(f"{(comm_ns - hidden) / 1e6:,.2f} ms of communication not hidden under compute "
                      f"({data['hidden_share']:.1%} of {comm_ns / 1e6:,.2f} ms hidden; {top})"),
               evidence=data, recommendation=_REMEDY,
               where=_where(trace, comm, options),
               action="overlap the collectives with compute (pipeline the all-to-all, async bucketed collectives)")
    k = trace.kernels
    rows = np.flatnonzero(comm)
    f.examples = examples(trace, start=k["start"].to_numpy(np.int64)[rows], end=k["end"].to_numpy(np.int64)[rows],
                          pid=k["pid"].to_numpy(np.int64)[rows], device=k["device"].to_numpy(np.int64)[rows],
                          stream=k["stream"].to_numpy(np.int64)[rows],
                          what=[f"{c} collective kernel" for c in collective_kinds(trace, rows)],
                          n=options.examples_per_finding)
    finish(f, steady_exposed, window, options)
    return res


def _device(trace: Trace, v: dict[str, Any], lo: int | None) -> dict[str, Any]:
    """One device's totals, per collective kind, and its steady-state exposed time."""
    o = v["all"]
    kind = collective_kinds(trace, v["rows"])
    per_kind = {}
    for c in sorted(set(kind.tolist())):
        m = kind == c
        ok = overlap(v["cs"], v["ce"], v["ms"][m], v["me"][m])
        per_kind[c] = {"kernels": int(m.sum()), "comm_ns": ok.comm_ns, "exposed_ns": ok.exposed_ns,
                       "hidden_share": r(share(ok.hidden_ns, ok.comm_ns))}
    steady = overlap(v["cs"], v["ce"], v["ms"], v["me"], lo) if lo is not None else o
    return {"comm_ns": o.comm_ns, "hidden_ns": o.hidden_ns, "exposed_ns": o.exposed_ns,
            "compute_ns": o.compute_ns, "hidden_share": r(share(o.hidden_ns, o.comm_ns)),
            "comm_share_of_busy": r(share(o.comm_ns, o.compute_ns + o.comm_ns - o.hidden_ns)),
            "by_kind": per_kind, "_steady_exposed": steady.exposed_ns}


def _kinds_total(devices: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    tot: dict[str, dict[str, int]] = {}
    for d in devices.values():
        for c, v in d["by_kind"].items():
            t = tot.setdefault(c, {"exposed_ns": 0, "comm_ns": 0})
            t["exposed_ns"] += v["exposed_ns"]
            t["comm_ns"] += v["comm_ns"]
    return sorted(tot.items(), key=lambda kv: -kv[1]["exposed_ns"])


def _where(trace: Trace, comm: np.ndarray, options: Options) -> list[dict[str, Any]]:
    """The streams the collectives run on, by kernel time."""
    k = trace.kernels
    rows = np.flatnonzero(comm)
    dur = (k["end"].to_numpy(np.int64) - k["start"].to_numpy(np.int64))[rows]
    return where_shares(stream_label_codes(k["pid"].iloc[rows], k["device"].iloc[rows], k["stream"].iloc[rows]),
                        dur, key="stream", top=options.top_n)
