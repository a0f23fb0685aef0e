"""Optimizer-unfused: the optimizer step costs a share of the GPU or the CPU that a fused
optimizer would not.

Three ways to run ``optimizer.step()``, each a step up from the one before: a Python loop
over the parameters (``foreach=False``: several tiny kernels per parameter and per op,
``aten::add_``/``mul_``/``addcdiv_`` under ``Optimizer.step#*``), foreach
(``torch._foreach_*``: one ``multi_tensor_apply_kernel`` per op over all parameters,
still one pass over memory per op), fused (``fused=True``, apex, FBGEMM's optimizer in
TBE: one pass). Only elementwise ``torch.optim`` optimizers (:data:`ELEMENTWISE`) are
judged; communication kernels never count as optimizer kernels. Which one the trace shows is decided from the kernels launched inside
the ``Optimizer.step#<Class>.step`` ranges (where the trace has them) and from the kernel
names (``multi_tensor_apply``, ``Fused*``). Reported (for per-parameter and foreach
steps) when the optimizer's kernels reach ``Options.report_min_share`` of kernel time or
its step ranges that share of the profiler step (or of the window).

Recoverable time: the steady-state GPU idle inside the optimizer's step ranges (the
launch overhead that fewer launches remove) plus, for foreach, half the foreach kernels'
steady-state GPU time (fused Adam reads and writes parameters and state once, foreach
once per op: ~7 tensor passes against ~19; half is the conservative end).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._attribution import enclosing_range
from ._cpu_ranges import gpu_idle_within, profiler_steps, ranges_matching
from ._kernel_classes import COMM, OPT_FOREACH, OPT_FUSED, kernel_classes, kernel_durations, kernel_where, offenders
from ._ops import launches
from ._recoverable import claims_within, examples, finish, report, steady_starts, steady_window
from ._util import r, take_str

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "optimizer-unfused": {
        "count": "number", "cpu_ms_per_step": "number", "cpu_share_of_step": "share",
        "foreach_kernels": "number", "fused_kernels": "number", "gpu_time_share": "share",
        "half_foreach_time_ns": "ns", "idle_in_step_ranges_ns": "ns", "launches_per_step": "number",
        "median_us": "us", "optimizer_kernels": "number", "optimizer_time_us": "us", "other_kernels": "number",
        "profiler_step_ms": "ms", "step_ranges": "number", "total_us": "us",
    },
}

_STEP = r"^Optimizer\.step#"
#: torch.optim classes whose update is elementwise, so that foreach and fused forms exist
#: (fused: Adam, AdamW, SGD, Adagrad); a step of another optimizer (Shampoo, an EMA
#: wrapper, a custom one) is measured but not judged
ELEMENTWISE = {"Adam", "AdamW", "SGD", "Adagrad", "RMSprop", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop",
               "SparseAdam", "LAMB", "Lamb", "Lion"}
_NEXT = {"per-parameter": "foreach=True (or straight to fused=True)", "foreach": "fused=True"}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    if not len(trace.kernels):
        return AnalysisResult(name="optimizer-unfused", data={"kernels": 0})
    res = AnalysisResult(name="optimizer-unfused")
    k = trace.kernels
    cls = kernel_classes(trace)
    dur = kernel_durations(trace)
    steps = ranges_matching(trace, _STEP)
    in_step = _launched_in(trace, steps)
    opt = (in_step | (cls == OPT_FOREACH) | (cls == OPT_FUSED)) & (cls != COMM)
    data = res.data = _evidence(trace, cls, dur, opt, steps, options)
    if not opt.any() or data["kind"] == "fused":
        return res
    unknown = sorted(set(data.get("optimizer", "").split(", ")) - ELEMENTWISE - {""})
    if unknown:
        data["not_judged"] = f"{', '.join(unknown)}: not an elementwise torch.optim optimizer"
        return res
    share = max(data["gpu_time_share"] or 0, data.get("cpu_share_of_step") or 0)
    if share < options.report_min_share:
        return res
    st = steady_starts(trace, options)
    cut = min(st.values()) if st else 0
    rg = trace.ranges
    live = steps[rg["start"].to_numpy(np.int64)[steps] >= cut] if steps.size else steps
    idle = gpu_idle_within(trace, rg["pid"].to_numpy(np.int64)[live], rg["start"].to_numpy(np.int64)[live],
                           rg["end"].to_numpy(np.int64)[live])[0] if live.size else 0
    foreach = (cls == OPT_FOREACH) & (k["start"].to_numpy(np.int64) >= cut)
    half = int(dur[foreach].sum()) // 2 if data["kind"] == "foreach" else 0
    data.update(idle_in_step_ranges_ns=int(idle), half_foreach_time_ns=half)
    kind, name = data["kind"], data.get("optimizer") or "the optimizer"
    f = report(
        res, "optimizer-unfused",
        title=(f"{name} runs {kind} ({'multi_tensor_apply' if kind == 'foreach' else 'one kernel per op per parameter'}"
               f"): {data['gpu_time_share']:.0%} of kernel time, {data['launches_per_step']:g} launches a step"
               + (f", {data['cpu_share_of_step']:.0%} of the step on the CPU" if data.get("cpu_share_of_step") else "")),
        evidence=data, where=kernel_where(trace, np.flatnonzero(opt), options.top_n, dur[opt]),
        recommendation=(
            f"Take the next step up: {_NEXT[kind]}. torch.optim.Adam/AdamW/SGD/Adagrad(fused=True) runs the "
            "whole update in one pass over parameters and state; for embedding tables let FBGEMM fuse the "
            "optimizer into the TBE backward (EmbOptimType, TorchRec fused optimizer); with a fixed set of "
            "parameters the step can also be captured in a CUDA graph (capturable=True)."),
        action=f"switch the optimizer to {_NEXT[kind].split(' (')[0]}")
    if live.size:
        f.examples = examples(trace, start=rg["start"].to_numpy(np.int64)[live], end=rg["end"].to_numpy(np.int64)[live],
                              pid=rg["pid"].to_numpy(np.int64)[live], tid=rg["tid"].to_numpy(np.int64)[live],
                              what="optimizer step (CPU)", n=options.examples_per_finding)
    else:
        sel = np.flatnonzero(opt & (k["start"].to_numpy(np.int64) >= cut))
        f.examples = examples(trace, start=k["start"].to_numpy(np.int64)[sel], end=k["end"].to_numpy(np.int64)[sel],
                              pid=k["pid"].to_numpy(np.int64)[sel], device=k["device"].to_numpy(np.int64)[sel],
                              stream=k["stream"].to_numpy(np.int64)[sel], what="optimizer kernel",
                              n=options.examples_per_finding)
    finish(f, idle + half, steady_window(trace, options), options,
           claims=claims_within(trace, options, rg["pid"].to_numpy(np.int64)[live], rg["start"].to_numpy(np.int64)[live],
                                rg["end"].to_numpy(np.int64)[live]))
    return res


def _launched_in(trace: Trace, steps: np.ndarray) -> np.ndarray:
    """Which kernels were launched inside an optimizer step range on the launching thread."""
    out = np.zeros(len(trace.kernels), dtype=bool)
    if not steps.size:
        return out
    j = launches(trace, ("kernel",))
    if not len(j):
        return out
    hit = enclosing_range(trace.ranges.iloc[steps], j["pid"], j["tid"], j["api_start"]) >= 0
    out[j["row"].to_numpy(np.int64)[hit]] = True
    return out


def _evidence(trace: Trace, cls: np.ndarray, dur: np.ndarray, opt: np.ndarray, steps: np.ndarray,
              options: Options) -> dict[str, Any]:
    n_fused, n_foreach = int((opt & (cls == OPT_FUSED)).sum()), int((opt & (cls == OPT_FOREACH)).sum())
    n_other = int(opt.sum()) - n_fused - n_foreach
    kind = None if not opt.any() else "fused" if n_fused and n_fused >= max(n_foreach, n_other) else (
        "foreach" if n_foreach >= n_other else "per-parameter")
    total = int(dur.sum())
    rg = trace.ranges
    n_steps = len(steps) or None
    data: dict[str, Any] = {
        "kind": kind, "optimizer_kernels": int(opt.sum()), "fused_kernels": n_fused, "foreach_kernels": n_foreach,
        "other_kernels": n_other, "optimizer_time_us": r(dur[opt].sum() / 1000, 3),
        "gpu_time_share": r(dur[opt].sum() / total) if total else None,
        "step_ranges": len(steps), "launches_per_step": r(opt.sum() / (n_steps or 1), 1),
    }
    if steps.size:
        names = {re.sub(r"^Optimizer\.step#|\.step$", "", str(n)) for n in take_str(rg["name"], steps)}
        data["optimizer"] = ", ".join(sorted(names))
        cpu = (rg["end"].to_numpy(np.int64) - rg["start"].to_numpy(np.int64))[steps]
        data["cpu_ms_per_step"] = r(cpu.mean() / 1e6, 3)
        n, step_ns = profiler_steps(trace)
        if step_ns:
            data["profiler_step_ms"] = r(step_ns / 1e6, 3)
            data["cpu_share_of_step"] = r(cpu.mean() / step_ns)
    data["offenders"] = offenders(trace, np.flatnonzero(opt), dur, options.top_n)
    return data
