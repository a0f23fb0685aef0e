"""The multi-stream plan: what the stream-group runtime should do about the findings.

:func:`make_plan` turns findings (and the analyzers' numbers) into a JSON document that
the runtime (``recsys_doctor.runtime``) reads. Every choice names the findings that
justify it (``because``) and says why in one line (``reason``), so a user can see which
evidence drives which knob.

Plan JSON (``schema`` 1)::

    {
      "schema": 1,
      "kind": "serving" | "training",     # training: autograd threads or step/optimizer/
                                          # backward annotations in the trace
      "stream_groups": {                  # independent (compute stream [+ copy stream]) sets
        "count": int,                     # 1 = leave as is
        "because": [finding ids], "reason": str
      },
      "merge_copy_compute": {             # put a group's H2D/D2H copies on its compute stream
        "enabled": bool,                  # (small latency-bound copies: no overlap to win,
        "because": [...], "reason": str   #  one stream fewer to order/sync)
      },
      "per_stream_allocators": {          # one caching-allocator pool per group, so groups
        "enabled": bool,                  # never wait on each other's frees
        "because": [...], "reason": str
      },
      "cuda_graphs": {                    # capture the steady-state sequence once per group
        "enabled": bool,
        "already_graphed_share": float | None,   # share of GPU busy time already in graphs
        "sequence_length": int | None,           # repeated eager kernel sequence, if found
        "because": [...], "reason": str
      },
      "range_assignment": {               # training: which NVTX/record_function ranges run
        "enabled": bool,                  # on which group (independent sibling branches,
        "family": str | None,             # e.g. expert_0..7, round-robin over the groups)
        "assignments": [{"nvtx": str, "group": int}],
        "because": [...], "reason": str
      },
      "findings": [finding ids, most severe first]
    }
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from ._branches import launching_threads, sibling_streams
from ..findings import AnalysisResult, Finding
from ..model import Trace
from ..options import Options

__all__ = ["make_plan", "PLAN_SCHEMA", "detect_kind", "sibling_families"]

PLAN_SCHEMA = 1

_TRAINING_RANGE_RE = re.compile(r"ProfilerStep|optimizer|backward|autograd|zero_grad", re.IGNORECASE)
_TRAINING_THREAD_RE = re.compile(r"autograd", re.IGNORECASE)
_SIBLING_RE = re.compile(r"^(.*?[^\d])(\d+)$")
_ID_PREFIX_RE = re.compile(r"(?:\bid|seq|#|=|:)\s*$", re.IGNORECASE)


def detect_kind(trace: Trace) -> str:
    """``training`` when the trace shows a backward pass or an optimizer/step loop."""
    names = trace.threads["name"].dropna().astype(str)
    if names.str.contains(_TRAINING_THREAD_RE).any():
        return "training"
    r = trace.ranges
    if len(r):
        ann = r.loc[r["source"].astype(object) != "cpu_op", "name"].dropna().astype(str)
        if ann.str.contains(_TRAINING_RANGE_RE).any():
            return "training"
        ops = r.loc[r["source"].astype(object) == "cpu_op", "name"].dropna().astype(str)
        if ops.str.contains(r"autograd::engine|Backward", regex=True).any():
            return "training"
    return "serving"


def sibling_families(trace: Trace) -> list[dict[str, Any]]:
    """Families of sibling code regions: annotation (non-aten) ranges at the same depth
    whose names differ only by a trailing index (``expert_0`` .. ``expert_7``), with at
    least two distinct indices numbered from 0 or 1 without large holes, the prefix not
    an id or sequence label (``op_id = N``, ``seq N``). Largest family first."""
    r = trace.ranges
    if len(r) == 0:
        return []
    r = r[r["source"].astype(object) != "cpu_op"]
    names = r["name"].astype(object)
    fam = []
    for (name, depth) in pd.DataFrame({"n": names, "d": r["depth"].astype("Int64").fillna(-1)}).drop_duplicates() \
            .itertuples(index=False):
        if not isinstance(name, str):
            continue
        m = _SIBLING_RE.match(name)
        if m and "#" not in m.group(1)[-1:]:  # ProfilerStep#3 is an iteration, not a branch
            fam.append((m.group(1), int(depth), int(m.group(2)), name))
    if not fam:
        return []
    df = pd.DataFrame(fam, columns=["prefix", "depth", "idx", "name"])
    out = []
    for (prefix, depth), g in df.groupby(["prefix", "depth"]):
        members = g.drop_duplicates("idx").sort_values("idx")
        idx = members["idx"]
        # branches are numbered 0..N-1 or 1..N (expert_0..7); ids and sequence numbers
        # (``aten::copy_, op_id = 314298``) number a chain of dependent calls, not branches
        dense = idx.min() <= 1 and idx.max() - idx.min() < 2 * len(idx)
        if len(members) >= 2 and dense and not _ID_PREFIX_RE.search(prefix):
            out.append({"prefix": prefix, "depth": depth, "members": members["name"].tolist()})
    out.sort(key=lambda x: -len(x["members"]))
    return out


def _ids(findings: list[Finding], *ids: str, severities: tuple[str, ...] = ("high", "medium", "low")) -> list[str]:
    have = {f.id for f in findings if f.severity in severities}
    return [i for i in ids if i in have]


def make_plan(trace: Trace, findings: list[Finding], results: list[AnalysisResult], options: Options) -> dict[str, Any]:
    """Propose stream groups, copy/compute merging, allocators, CUDA graphs and (training)
    the range-to-group assignment. See the module docstring for the JSON."""
    data = {r.name: r.data for r in results}
    byid = {f.id: f for f in findings}
    kind = detect_kind(trace)
    families = sibling_families(trace) if kind == "training" else []
    groups = _stream_groups(trace, options, data, byid, findings, families, max(1, int(options.max_stream_groups)))
    n_groups = groups["count"]
    alloc = {"enabled": n_groups > 1, "because": list(groups["because"]) if n_groups > 1 else [],
             "reason": ("each group frees and reuses its own blocks without cross-stream waits"
                        if n_groups > 1 else "one group: the default allocator is enough")}
    return {
        "schema": PLAN_SCHEMA,
        "kind": kind,
        "stream_groups": groups,
        "merge_copy_compute": _merge_copy_compute(data.get("memcpy-ping-pong", {}), byid, findings, options),
        "per_stream_allocators": alloc,
        "cuda_graphs": _cuda_graphs(data.get("graph-candidate", {}), byid, findings),
        "range_assignment": _range_assignment(kind, families, groups),
        "findings": [f.id for f in findings],
    }


def _stream_groups(trace: Trace, options: Options, data: dict[str, Any], byid: dict[str, Finding],
                   findings: list[Finding], families: list[dict[str, Any]], cap: int) -> dict[str, Any]:
    """How many stream groups, from what the trace shows (:mod:`._branches`): one per
    thread launching concurrently into one stream (a stream-contention finding above note),
    or one per concurrent launching thread that has its own stream already, or (training)
    one per independent sibling branch (NVTX family, or sibling streams running replicas
    of one module); all capped at ``max_stream_groups``. A note-severity finding never
    makes groups."""
    contended = [s for s in data.get("stream-contention", {}).get("streams", []) if s.get("contended")]
    real = _ids(findings, "stream-contention")
    cap_note = (lambda want: f" (capped at {cap})" if want > cap else "")
    if real and contended:
        want = max(s["concurrent_threads"] for s in contended)
        return {"count": min(cap, want), "because": real,
                "reason": f"{want} CPU threads launch concurrently into one stream: one group per thread"
                          + cap_note(want)}
    threads = launching_threads(trace, options)
    launchy = _ids(findings, "launch-bound", "short-kernels", "graph-candidate", "small-grid")
    if threads["concurrent"] >= 2:
        if threads["processes"] > 1:  # (a process's groups are its own streams: they hold its threads, not another's)
            return _process_groups(threads, launchy or real, cap, cap_note)
        want = threads["concurrent"]
        where = ("each into its own stream already" if threads["own_streams"] else "into shared streams")
        return {"count": min(cap, want), "because": launchy or real,
                "reason": f"{want} CPU threads launch concurrently on device {threads['device']}, {where}: "
                          f"one group per thread{cap_note(want)}"}
    sib = sibling_streams(trace, options)
    if families:
        f0 = families[0]
        n = min(cap, len(f0["members"]))
        return {"count": n, "because": _ids(findings, "small-grid", "launch-bound", "short-kernels"),
                "reason": f"{len(f0['members'])} independent sibling branches ({f0['prefix']}N) can run "
                          f"concurrently on {n} groups"}
    if sib["streams"] >= 2 and launchy:
        n = min(cap, sib["streams"])
        ran = ("never run at the same time" if sib["overlap_ns"] == 0
               else f"run at the same time for only {sib['overlap_ns'] / 1e6:.3f} ms")
        return {"count": n, "because": launchy,
                "reason": f"{sib['streams']} streams run the same {sib['kernels_each']} kernels each (replicas of "
                          "one module: sibling branches" + (f", forked and joined by {sib['wait_events']} "
                                                            "cudaStreamWaitEvent calls" if sib["wait_events"] else "")
                          + f") but {ran}: keep {n} groups and launch them without waiting on one thread "
                          "(CUDA graphs) so they overlap"}
    n_thr = threads["threads"]
    why = ("one CPU thread launches at a time" if n_thr <= 1 else
           f"the {n_thr} launching threads take turns (one launches at a time)")
    if contended:
        why += "; the stream-contention note is too small to act on"
    if sib["streams"] >= 2:
        why += (f"; {sib['streams']} streams run sibling branches already and no finding says the GPU waits "
                "for launches")
    else:
        why += " and no independent sibling branches were found"
    return {"count": 1, "because": [], "reason": why}


def _process_groups(threads: dict[str, Any], because: list[str], cap: int, cap_note: Any) -> dict[str, Any]:
    """Stream groups where the concurrent launching threads belong to several processes: one
    per thread that launches concurrently within one process (``per_process``), since a
    process's stream groups hold its own threads only and the processes, each in its own CUDA
    context, time-slice the GPU unless MPS runs (the processes-share-gpu note)."""
    want, procs, per = threads["concurrent"], threads["processes"], max(1, threads["per_process"])
    who = f"{want} CPU threads of {procs} processes launch concurrently on device {threads['device']}"
    apart = "their kernels time-slice between the processes' CUDA contexts unless MPS runs"
    if per == 1:
        return {"count": 1, "because": [],
                "reason": f"{who}, one per process: a process's stream groups hold its own threads, so one "
                          f"group each ({apart})"}
    return {"count": min(cap, per), "because": because,
            "reason": f"{who}, up to {per} in one process: one group per thread of a process{cap_note(per)} "
                      f"({apart})"}


def _merge_copy_compute(mp: dict[str, Any], byid: dict[str, Finding], findings: list[Finding],
                        options: Options) -> dict[str, Any]:
    """Merge a group's copy and compute streams when its copies are small and interleaved
    with compute (nothing to overlap, only event syncs to save)."""
    small_latency = bool(mp.get("h2d", 0) + mp.get("d2h", 0)) and mp.get("median_copy_bytes", 1 << 62) <= options.small_copy_bytes
    interleaved = mp.get("direction_switches", 0) > 0 or (mp.get("small_copies_per_unit") or 0) >= options.many_copies_per_unit
    if "memcpy-ping-pong" in byid and small_latency and interleaved:
        return {"enabled": True, "because": ["memcpy-ping-pong"],
                "reason": f"copies are small (median {mp.get('median_copy_bytes')} B) and interleaved with compute: "
                          "a separate copy stream adds event syncs without overlap to gain"}
    if mp.get("h2d", 0) + mp.get("d2h", 0):
        return {"enabled": False, "because": _ids(findings, "memcpy-ping-pong"),
                "reason": "copies are large or not interleaved: keep a copy stream per group to overlap them"}
    return {"enabled": False, "because": [], "reason": "no host<->device copies in the trace"}


def _cuda_graphs(gc: dict[str, Any], byid: dict[str, Finding], findings: list[Finding]) -> dict[str, Any]:
    """Graphs when the GPU waits on eager launches, unless most work is graphed already."""
    already = gc.get("graphed_busy_share")
    launchy = _ids(findings, "launch-bound", "short-kernels", "graph-candidate")
    common = {"already_graphed_share": already, "sequence_length": gc.get("sequence_length")}
    if already is not None and already >= 0.5:
        return {"enabled": False, **common, "because": ["graph-candidate"] if "graph-candidate" in byid else [],
                "reason": f"{already:.0%} of GPU work already runs in CUDA graphs"}
    if launchy:
        inside = int(gc.get("syncs_inside_sequence") or 0)
        return {"enabled": True, **common, "because": launchy,
                "reason": "the GPU waits on eager launches of short kernels: capture the repeated sequence "
                          "once per group and replay it"
                          + (f"; first remove the {inside} host synchronizations inside it (graph-candidate: a "
                             "capture fails across them, and the calls then run eagerly)" if inside else "")}
    return {"enabled": False, **common, "because": [],
            "reason": "not launch-bound: graphs would not pay for their static buffers"}


def _range_assignment(kind: str, families: list[dict[str, Any]], groups: dict[str, Any]) -> dict[str, Any]:
    """Training: the first sibling family's ranges round-robin over the groups."""
    n_groups = groups["count"]
    if kind == "training" and families and n_groups > 1:
        f0 = families[0]
        assign = [{"nvtx": name, "group": i % n_groups} for i, name in enumerate(f0["members"])]
        return {"enabled": True, "family": f0["prefix"], "assignments": assign,
                "because": list(groups["because"]),
                "reason": f"sibling ranges {f0['members'][0]}..{f0['members'][-1]} are independent: "
                          f"round-robin over {n_groups} groups"}
    return {"enabled": False, "family": None, "assignments": [], "because": [],
            "reason": ("serving: requests, not ranges, map to groups" if kind == "serving"
                       else "no independent sibling ranges found")}
