"""``advise``: load a trace, run every registered analyzer, propose a plan.

This is the library entry point behind ``recsys-doctor advise``; the CLI only parses
options, calls :func:`advise`, and renders the :class:`AdviseResult`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .._util.files import file_sha256_started
from ..errors import BadInputError
from ..findings import Finding
from ..model import Trace
from ..options import Options

__all__ = ["AdviseResult", "advise", "advise_trace", "SCHEMA_VERSION", "restrict"]

#: version of the JSON contract printed by ``advise --json``
SCHEMA_VERSION = 1

_SEV_ORDER = {"high": 0, "medium": 1, "low": 2, "note": 3}

#: traces with at least this many rows (all tables) run their analyzers in two processes
PARALLEL_ANALYSIS_ROWS = 500_000


@dataclass
class AdviseResult:
    """Everything ``advise`` found about one trace; every renderer takes this object."""

    trace_info: dict[str, Any]
    summary: dict[str, Any]
    findings: list[Finding]
    plan: dict[str, Any]
    analyses: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the loaded (and possibly restricted) trace, for renderers that plot raw events;
    #: not part of the JSON contract
    trace: Trace | None = None

    #: one line of what is wrong, the expected gain and the first action (additive JSON key)
    verdict: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "verdict": self.verdict,
            "trace": self.trace_info,
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
            "plan": self.plan,
            "analyses": self.analyses,
        }


def trace_span(trace: Trace) -> tuple[int, int] | None:
    """First start and last end of any event of the trace (ns, on the trace's own clock:
    the clock of ``--start``/``--end``, the plots and the example moments)."""
    lo, hi = None, None
    for t in trace.TABLES:
        df = getattr(trace, t)
        if len(df) and "start" in df.columns and "end" in df.columns:
            a, b = int(df["start"].min()), int(df["end"].max())
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return None if lo is None or hi is None else (lo, hi)


def _s(ns: int) -> str:
    return f"{ns / 1e9:.6f} s"


def restrict(trace: Trace, *, nvtx: str | None = None, start_ns: int | None = None,
             end_ns: int | None = None) -> Trace:
    """Restrict a trace to a time window and/or to the span of the NVTX ranges named
    ``nvtx`` (first start to last end of every range with that exact name, or, failing
    that, containing it as a substring). A window that does not overlap the trace's span
    is an error that names the span (a window read off another clock must not quietly
    give an empty trace)."""
    if start_ns is not None and end_ns is not None and end_ns <= start_ns:
        raise BadInputError(f"--end {_s(end_ns)} is {'before' if end_ns < start_ns else 'at'} --start "
                            f"{_s(start_ns)}: the window must end after it starts")
    if start_ns is not None or end_ns is not None:
        span = trace_span(trace)
        if span is not None:
            lo, hi = span
            if (start_ns is not None and start_ns >= hi) or (end_ns is not None and end_ns <= lo):
                raise BadInputError(
                    f"the window {_s(start_ns) if start_ns is not None else '...'} - "
                    f"{_s(end_ns) if end_ns is not None else '...'} lies outside the trace, which spans "
                    f"{_s(lo)} - {_s(hi)} on its own clock (the clock of the plots and --start/--end)")
    if nvtx is not None:
        r = trace.ranges
        m = r["name"] == nvtx
        if not m.any():
            m = r["name"].astype(str).str.contains(nvtx, regex=False)
        if not m.any():
            raise BadInputError(f"no NVTX range or annotation named {nvtx!r} in {trace.path}")
        lo, hi = int(r.loc[m, "start"].min()), int(r.loc[m, "end"].max())
        start_ns = lo if start_ns is None else max(lo, start_ns)
        end_ns = hi if end_ns is None else min(hi, end_ns)
    if start_ns is not None and end_ns is not None and end_ns <= start_ns:
        raise BadInputError(f"empty time window: start {start_ns} ns >= end {end_ns} ns")
    return trace.window(start_ns, end_ns)


def advise_trace(trace: Trace, options: Options | None = None, *, progress: bool = False) -> AdviseResult:
    """Run the summary, every analyzer and the planner over an already loaded trace."""
    from ..analyzers import ANALYZERS, summarize_and_run_all
    from ..analyzers._framework import apply_hint, framework
    from ..loaders._nsys_columns import release_free_memory
    from ..planning.planner import make_plan
    from .._util.progress import progress as progress_bar

    options = options or Options()
    with progress_bar("analyzing", total=len(ANALYZERS) + 1, enabled=None if progress else False) as bar:
        def done(name: str) -> None:
            bar.update(description=f"analyzing: {name} done")
            bar.advance()
            release_free_memory()  # each analyzer's scratch goes back before the next one

        # a large trace: a second process takes the summary and analyzers too (where a
        # second CPU is ours)
        parallel = sum(trace.counts().values()) >= PARALLEL_ANALYSIS_ROWS
        summary, results = summarize_and_run_all(trace, options, on_done=done, parallel=parallel)
        assert summary is not None
    findings = [f for r in results for f in r.findings]
    findings.sort(key=lambda f: (_SEV_ORDER.get(f.severity, 9), -(f.recoverable_ns or 0)))
    plan = make_plan(trace, findings, results, options)
    hint = apply_hint(trace, plan)
    if hint:  # (additive: how to carry the plan out where the runtime, PyTorch's, cannot)
        plan["notes"] = [*plan.get("notes", []), hint]
    span = trace_span(trace)
    rg = trace.ranges
    has_regions = bool(len(rg)) and bool((rg["source"].astype(object) != "cpu_op").any())
    info = {
        "path": trace.path,
        "format": trace.format,
        "counts": trace.counts(),
        "meta": trace.meta,
        # additive: the framework that made the trace, and why it is taken for it
        "framework": framework(trace),
        # additive: the trace's span on its own clock, and the analysis window asked for
        "span_ns": list(span) if span else None,
        "window_ns": (trace.meta.get("window_ns") if isinstance(trace.meta.get("window_ns"), list) else None),
        # additive: how places are named when the trace has no code regions
        "attribution": None if has_regions else (
            "No NVTX ranges or record_function annotations in this trace: places are named by thread "
            "(name and id), stream and CUDA API call; add NVTX ranges around queries/steps to see code regions."),
    }
    analyses = {r.name: r.data for r in results}
    return AdviseResult(trace_info=info, summary=summary, findings=findings, plan=plan,
                        analyses=analyses, trace=trace, verdict=make_verdict(findings, summary, analyses, plan))


def idle_share(summary: dict[str, Any], analyses: dict[str, Any]) -> float | None:
    """The one idle figure every report shows: the share of the window in which the GPU
    runs nothing at all (no kernel, graph, copy or memset), from the launch-bound
    analysis; ``1 - utilization`` when that analysis has no window."""
    lb = analyses.get("launch-bound") or {}
    if lb.get("window_ns"):
        return lb["idle_ns"] / lb["window_ns"]
    u = summary.get("gpu_utilization")
    return None if u is None else 1.0 - u


def plan_line(plan: dict[str, Any]) -> str:
    """The plan in one line: stream groups, graphs, copies."""
    if not plan:
        return ""
    parts = []
    sg = plan.get("stream_groups") or {}
    if sg.get("count"):
        parts.append(f"{sg['count']} stream group{'s' if sg['count'] != 1 else ''}")
    cg = plan.get("cuda_graphs") or {}
    if cg and (cg.get("already_graphed_share") or 0) >= 0.5:
        parts.append("CUDA graphs already in use")
    elif cg:
        parts.append("CUDA graphs " + ("on" if cg.get("enabled") else "off"))
    mc = plan.get("merge_copy_compute") or {}
    if mc.get("enabled"):
        parts.append("copies on the compute stream")
    return ", ".join(parts)


def make_verdict(findings: list[Finding], summary: dict[str, Any], analyses: dict[str, Any],
                 plan: dict[str, Any]) -> dict[str, Any]:
    """What is wrong (the finding that wins most), the expected gain and the first action."""
    u = summary.get("gpu_utilization")
    idle = idle_share(summary, analyses)
    top = next((f for f in findings if f.severity in ("high", "medium", "low")), None)
    out: dict[str, Any] = {"gpu_utilization": u, "idle_share": idle, "plan": plan_line(plan)}
    if u is None:
        out.update(finding=None, severity=None, problem="no GPU kernels in this trace",
                   expected_gain_ns=None, expected_gain_share=None,
                   first_action=(findings[0].action if findings else ""),
                   line="No GPU kernels in this trace: nothing to diagnose; re-capture with CUDA tracing on.")
        return out
    busy = f"GPU busy {u:.0%}"
    if idle is not None:
        copies = max(0.0, 1.0 - u - idle)
        busy += (f", copies only {copies:.0%}" if copies >= 0.005 else "") + f", idle {idle:.0%}"
    if top is None:
        out.update(finding=None, severity=None, problem=None, expected_gain_ns=0, expected_gain_share=0.0,
                   first_action="",
                   line=f"{busy}: no fix is estimated to win back 2% or more of the steady state.")
        return out
    gain_ms = (top.recoverable_ns or 0) / 1e6
    share = top.recoverable_share or 0.0
    out.update(finding=top.id, severity=top.severity, problem=top.title,
               expected_gain_ns=top.recoverable_ns, expected_gain_share=share, first_action=top.action,
               line=(f"{busy}. Main problem ({top.severity}): {top.id} - up to {gain_ms:.1f} ms of GPU time "
                     f"({share:.0%} of the steady state) to win back. First: {top.action}."))
    return out


def advise(path: str | os.PathLike[str], options: Options | None = None, *, nvtx: str | None = None,
           start_ns: int | None = None, end_ns: int | None = None, progress: bool = False) -> AdviseResult:
    """Load ``path`` (any supported format), optionally restrict it, and diagnose it."""
    from ..loaders import load
    from .._util.progress import progress as progress_bar

    # the file's hash is worked out on a low-priority thread, in the moments when the
    # load or the analysis leaves a core idle
    hashing = file_sha256_started(path, idle=True)
    with progress_bar(f"loading {os.path.basename(str(path))}", enabled=None if progress else False) as bar:
        trace = load(path, progress=bar)
    # its key takes its place in the metadata now (the JSON keeps the keys in this order)
    sha256 = None
    if "sha256" not in trace.meta:
        trace.meta["sha256"] = None
        sha256 = hashing
    span = trace_span(trace)
    trace = restrict(trace, nvtx=nvtx, start_ns=start_ns, end_ns=end_ns)
    res = advise_trace(trace, options, progress=progress)
    if sha256 is not None:
        res.trace_info["meta"]["sha256"] = sha256()
    if nvtx is not None:
        res.trace_info["nvtx"] = nvtx
    res.trace_info["span_ns"] = list(span) if span else None
    return res
