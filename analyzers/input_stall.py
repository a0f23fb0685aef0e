"""Input-stall: the GPU waits while the next batch is loaded or copied to it.

Evidence: the CPU ranges that load or stage input - ``enumerate(DataLoader)#...``,
TorchRec's ``## copy_batch_to_gpu ##`` / ``## wait_for_batch ##``, NVTX ranges named for
data loading (:data:`INPUT_RANGES`) - their time per step and share of the profiler
step, the copies launched inside them (and how many come from pageable memory). Only
what is on the critical path counts: the part of those ranges during which no GPU
operation of the process ran. Ranges are clipped to the ``ProfilerStep#N`` step that
contains them (the GPU idle before a step's first kernel is the stall), or, without
steps, to the steady state. Reported when that idle reaches ``Options.report_min_share``
of the profiler step (or of the steady window); the recoverable time is that idle.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import enclosing_range, where_shares
from ._arrays import merge_intervals
from ._cpu_ranges import gpu_idle_within, profiler_steps, ranges_matching
from ._ops import launches, op_table
from ._recoverable import claims_within, examples, finish, report, steady_starts, steady_window
from ._util import norm_name, per_value, r, str_is

__all__ = ["analyze", "INPUT_RANGES"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "input-stall": {
        "copies_in_input": "number", "copy_bytes_in_input": "number", "gpu_idle_between_gpu_work_ms": "ms",
        "gpu_idle_during_input_ms": "ms", "input_ms_per_step": "number", "input_ranges": "number",
        "input_time_ms": "ms", "pageable_copies_in_input": "number", "profiler_step_ms": "ms",
        "profiler_steps": "number", "share_of_step": "share",
    },
}

#: names of ranges that load or stage a batch (case-insensitive)
INPUT_RANGES = (r"(?i)enumerate\(DataLoader\)|DataLoaderIter|copy_batch_to_(?:gpu|device)|batch_to_(?:gpu|device)|"
                r"wait_for_batch|data_?load(?:er|ing)?\b|next_batch|load_batch|get_batch")


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="input-stall")
    rows = ranges_matching(trace, INPUT_RANGES)
    if not rows.size or not len(op_table(trace)):
        res.data = {"input_ranges": int(rows.size)}
        return res
    rg = trace.ranges
    pid = rg["pid"].to_numpy(np.int64)[rows]
    s, e = _clip(trace, rows, options)
    keep = e > s
    idle, total = gpu_idle_within(trace, pid[keep], s[keep], e[keep])
    n_steps, step_ns = profiler_steps(trace)
    data = res.data = _evidence(trace, rows, keep, s, e, total, idle, n_steps, step_ns)
    base = step_ns * n_steps if step_ns else steady_window(trace, options)
    if not base or idle / base < options.report_min_share:
        return res
    # what it could win inside the analysis window: the idle gaps between GPU work that the
    # input ranges cover (idle before the first GPU operation is outside every window)
    claims = claims_within(trace, options, pid[keep], s[keep], e[keep])
    inside = int(claims["claim_ns"].sum())
    data["gpu_idle_between_gpu_work_ms"] = r(inside / 1e6, 3)
    names = per_value(rg["name"], norm_name, rows[keep])
    per = f" ({data['share_of_step']:.0%} of the step)" if data.get("share_of_step") is not None else ""
    f = report(
        res, "input-stall",
        title=(f"The GPU waits {idle / 1e6:.2f} ms for input{per}: data loading and batch copies on the critical "
               f"path" + (f" ({inside / 1e6:.2f} ms of it between GPU work, the rest before the first GPU "
                          "operation)" if inside < idle else "")),
        evidence=data, where=where_shares(names, _exclusive(trace, rows[keep], s[keep], e[keep]), key="nvtx",
                                          top=options.top_n),
        recommendation=(
            "Take input off the critical path: DataLoader(pin_memory=True, num_workers>0, "
            "persistent_workers=True, prefetch_factor) and .to(device, non_blocking=True) copies; "
            "copy the next batch on a side stream while this one trains (TorchRec TrainPipelineSparseDist, "
            "a CUDA-stream prefetcher)."),
        action="prefetch the next batch on a side stream with pinned, non-blocking copies")
    f.examples = examples(trace, start=s[keep], end=e[keep], pid=pid[keep],
                          tid=rg["tid"].to_numpy(np.int64)[rows][keep], what=list(names),
                          n=options.examples_per_finding)
    finish(f, inside, steady_window(trace, options), options, claims=claims)
    return res


def _exclusive(trace: Trace, rows: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Each (clipped) input range's own time: its length less that of the input ranges
    nested in it (``enumerate(DataLoader)`` inside ``## copy_batch_to_gpu ##`` counts once)."""
    sub = trace.ranges.iloc[rows]
    ln = (e - s).astype(float)
    parent = enclosing_range(sub, sub["pid"], sub["tid"], sub["start"].to_numpy(np.int64) - 1)
    ok = parent >= 0
    return ln - np.bincount(parent[ok], weights=ln[ok], minlength=len(rows))


def _clip(trace: Trace, rows: np.ndarray, options: Options) -> tuple[np.ndarray, np.ndarray]:
    """Each input range clipped to the profiler step it starts in (dropped, as an empty
    interval, when it starts in none), or, where the trace has no steps, to the steady
    state: from the earliest steady-state start to the last GPU operation."""
    rg = trace.ranges
    s = rg["start"].to_numpy(np.int64)[rows]
    e = rg["end"].to_numpy(np.int64)[rows]
    st = ranges_matching(trace, r"^ProfilerStep#\d+$")
    if st.size:
        ss, se = merge_intervals(rg["start"].to_numpy(np.int64)[st], rg["end"].to_numpy(np.int64)[st])
        i = np.searchsorted(ss, s, side="right") - 1
        ok = (i >= 0) & (s < se[np.maximum(i, 0)])
        return s, np.where(ok, np.minimum(e, se[np.maximum(i, 0)]), s)
    cut = steady_starts(trace, options)
    lo = min(cut.values()) if cut else 0
    hi = int(op_table(trace)["end"].max())
    return np.clip(s, lo, hi), np.clip(e, lo, hi)


def _evidence(trace: Trace, rows: np.ndarray, keep: np.ndarray, s: np.ndarray, e: np.ndarray, total: int,
              idle: int, n_steps: int, step_ns: float | None) -> dict[str, Any]:
    data: dict[str, Any] = {"input_ranges": int(rows.size), "input_time_ms": r(total / 1e6, 3),
                            "gpu_idle_during_input_ms": r(idle / 1e6, 3)}
    if step_ns:
        data.update(profiler_steps=n_steps, profiler_step_ms=r(step_ns / 1e6, 3),
                    input_ms_per_step=r(total / n_steps / 1e6, 3), share_of_step=r(idle / (step_ns * n_steps)))
    rg = trace.ranges
    j = launches(trace, ("memcpy",))
    if len(j) and keep.any():
        sub = rg.iloc[rows[keep]]
        inside = enclosing_range(sub, j["pid"], j["tid"], j["api_start"]) >= 0
        if inside.any():
            m = trace.memcpys
            at = j["row"].to_numpy(np.int64)[inside]
            data["copies_in_input"] = int(at.size)
            data["copy_bytes_in_input"] = int(m["bytes"].to_numpy(np.int64)[at].sum())
            data["pageable_copies_in_input"] = int(str_is(m["src_mem"], "pageable", at).sum()
                                                   + str_is(m["dst_mem"], "pageable", at).sum())
    return data
