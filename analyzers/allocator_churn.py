"""Allocator churn: ``cudaMalloc``/``cudaFree`` in the steady state leave the GPU idle.

PyTorch's caching allocator normally keeps device memory once it has it; a steady-state
``cudaMalloc`` means the cache missed (a new block size, fragmentation, memory pressure),
and a ``cudaFree`` means the cache was emptied (``torch.cuda.empty_cache()``, an
out-of-memory retry, a non-caching allocator). Each is a slow driver call (milliseconds
for large blocks), and ``cudaFree`` synchronizes the device: the GPU drains and then waits,
idle, until the calls return and the host launches again. CUDA graphs do not remove this.

Calls whose innermost code region is a warm-up range (``Options.warmup_range_pattern``)
fill the cache once: they are start-up, not churn, and their gaps are not counted.

Evidence: the allocator calls (``Options.allocator_api_pattern``) in the whole trace and in
the steady state, count and time per API name, how many synchronize (the frees), the idle
gaps they cover (a gap is the allocator's when allocator calls of its process cover at
least ``Options.allocator_gap_share`` of it; ``launch-bound``, ``short-kernels`` and
``graph-candidate`` leave those gaps alone), and where the calls come from (code region,
aten op, thread). Reported when the steady-state allocator gaps reach
``Options.report_min_share`` of the steady window. Recoverable time: those gaps (the GPU
was idle only because of the allocator). Severity follows from it (docs/findings.md).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import any_region, attribute, where_shares
from ._framework import idiom
from ._recoverable import allocator_gap, examples, finish, idle_gaps, report, steady_starts, steady_window
from ._arrays import merge_intervals
from ._util import coverage_at, r, str_contains, take_str, thread_label_codes

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "allocator-churn": {
        "allocator_gaps": "number", "allocator_idle_ns": "ns", "calls": "number", "count": "number",
        "idle_ns": "ns", "steady_allocator_idle_ns": "ns", "steady_idle_share": "share",
        "syncing_frees": "number", "time_ms": "ms", "warmup_calls": "number",
    },
}

#: allocator calls that synchronize the device (the frees; the mallocs do not wait for it)
_SYNCING = re.compile(r"Free")


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="allocator-churn")
    api = trace.api
    m = (str_contains(api["name"], re.compile(options.allocator_api_pattern)).to_numpy(bool) if len(api)
         else np.zeros(0, bool))
    if not m.any():
        res.data = {"calls": 0}
        return res
    al = api[m]
    st = steady_starts(trace, options)
    cut = min(st.values()) if st else int(al["start"].min())
    warm = _in_warmup(trace, al, options)
    steady = (al["start"].to_numpy(np.int64) >= cut) & ~warm
    gaps = idle_gaps(trace, options)
    ag = allocator_gap(trace, options) if len(gaps) else np.zeros(0, bool)
    sg = ag & gaps["steady"].to_numpy(bool) & ~_warmup_gaps(al[warm], gaps, options) if len(gaps) else ag
    rec = int(gaps["ns"].to_numpy(np.int64)[sg].sum()) if len(gaps) else 0
    window = steady_window(trace, options)
    data = res.data = _evidence(al, steady, gaps, ag, rec, window)
    data["warmup_calls"] = int(warm.sum())
    if not steady.any() or not window or rec / window < options.report_min_share:
        return res
    s = data["steady"]
    f = report(
        res, "allocator-churn",
        title=(f"{s['calls']} allocator calls in the steady state ({_per_name(s['per_api'])}; "
               f"{s['time_ms']:.1f} ms) leave the GPU idle {rec / 1e6:.1f} ms "
               f"({rec / window:.0%} of the steady state)"),
        evidence=data, where=_where(trace, al[steady], options),
        recommendation=idiom(trace, "keep_memory"), action=idiom(trace, "keep_memory_action"))
    gs = gaps[sg]
    f.examples = examples(trace, start=gs["start"], end=gs["end"], pid=gs["pid"], device=gs["device"],
                          stream=gs["stream"], what="GPU idle while the host is in cudaMalloc/cudaFree",
                          n=options.examples_per_finding)
    finish(f, rec, window, options, claims=gs)
    return res


def _in_warmup(trace: Trace, al: pd.DataFrame, options: Options) -> np.ndarray:
    """Per allocator call: whether its innermost code region is a warm-up range
    (``Options.warmup_range_pattern``): start-up, not churn."""
    reg = attribute(trace, al["pid"].to_numpy(np.int64), al["tid"].to_numpy(np.int64),
                    al["start"].to_numpy(np.int64))
    if not any_region(reg):
        return np.zeros(len(al), bool)
    rx = re.compile(options.warmup_range_pattern)
    return np.fromiter((isinstance(x, str) and rx.search(x) is not None for x in reg), bool, len(reg))


def _warmup_gaps(warm: pd.DataFrame, gaps: pd.DataFrame, options: Options) -> np.ndarray:
    """Per idle gap: whether warm-up allocator calls (of its process) cover enough of it
    to make it an allocator gap on their own."""
    out = np.zeros(len(gaps), bool)
    for pid in np.unique(warm["pid"].to_numpy(np.int64)):
        w = warm[warm["pid"].to_numpy(np.int64) == pid]
        ms, me = merge_intervals(w["start"].to_numpy(np.int64), w["end"].to_numpy(np.int64))
        at = np.flatnonzero(gaps["pid"].to_numpy(np.int64) == pid)
        gs, ge = gaps["start"].to_numpy(np.int64)[at], gaps["end"].to_numpy(np.int64)[at]
        out[at] = coverage_at(ms, me, ge) - coverage_at(ms, me, gs) >= options.allocator_gap_share * (ge - gs)
    return out


def _evidence(al: pd.DataFrame, steady: np.ndarray, gaps: pd.DataFrame, ag: np.ndarray, rec: int,
              window: int) -> dict[str, Any]:
    """Allocator calls (all and steady-state: count, ms, per API name, syncing frees) and
    the idle gaps they cover."""
    dur = (al["end"] - al["start"]).to_numpy(np.int64)
    names = take_str(al["name"])
    gl = gaps["ns"].to_numpy(np.int64) if len(gaps) else np.zeros(0, np.int64)

    def calls(sel: np.ndarray) -> dict[str, Any]:
        per = pd.DataFrame({"name": names[sel], "dur": dur[sel]}).groupby("name")["dur"].agg(["size", "sum"])
        per = per.sort_values("sum", ascending=False)
        return {"calls": int(sel.sum()), "time_ms": r(int(dur[sel].sum()) / 1e6, 3),
                "syncing_frees": int(sum(int(c["size"]) for n, c in per.iterrows() if _SYNCING.search(str(n)))),
                "per_api": {str(n): {"count": int(c["size"]), "time_ms": r(int(c["sum"]) / 1e6, 3)}
                            for n, c in per.iterrows()}}

    return {"all": calls(np.ones(len(al), bool)), "steady": calls(steady),
            "allocator_gaps": int(ag.sum()), "allocator_idle_ns": int(gl[ag].sum()),
            "steady_allocator_idle_ns": rec, "idle_ns": int(gl.sum()),
            "steady_idle_share": r(rec / window) if window else None}


def _per_name(per: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{v['count']} {n} {v['time_ms']:.1f} ms" for n, v in list(per.items())[:3])


def _where(trace: Trace, al: pd.DataFrame, options: Options) -> list[dict]:
    """Code regions, aten ops and threads issuing the calls, by call time."""
    dur = (al["end"] - al["start"]).to_numpy(np.int64)
    pid, tid, t = al["pid"].to_numpy(np.int64), al["tid"].to_numpy(np.int64), al["start"].to_numpy(np.int64)
    where: list[dict] = []
    reg = attribute(trace, pid, tid, t)
    if any_region(reg):
        where += where_shares(reg, dur, key="nvtx", top=options.top_n)
    ops = attribute(trace, pid, tid, t, cpu_ops=True)
    if any_region(ops):
        where += where_shares(ops, dur, key="cpu_op", top=options.top_n)
    where += where_shares(thread_label_codes(trace, pid, tid), dur, key="thread", top=options.top_n)
    return where
