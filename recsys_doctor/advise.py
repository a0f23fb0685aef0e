"""``advise``: load a trace, run every registered analyzer, propose a plan.

This is the library entry point behind ``recsys-doctor advise``; the CLI only parses
options, calls :func:`advise`, and renders the :class:`AdviseResult`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import BadInputError
from .findings import AnalysisResult, Finding
from .model import Trace
from .options import Options

__all__ = ["AdviseResult", "advise", "advise_trace", "SCHEMA_VERSION", "restrict"]

#: version of the JSON contract printed by ``advise --json``
SCHEMA_VERSION = 1

_SEV_ORDER = {"high": 0, "medium": 1, "low": 2, "note": 3}


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "trace": self.trace_info,
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
            "plan": self.plan,
            "analyses": self.analyses,
        }


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def restrict(trace: Trace, *, nvtx: str | None = None, start_ns: int | None = None,
             end_ns: int | None = None) -> Trace:
    """Restrict a trace to a time window and/or to the span of the NVTX ranges named
    ``nvtx`` (first start to last end of every range with that exact name, or, failing
    that, containing it as a substring)."""
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
    from .analyzers import ANALYZERS, run_all
    from .analyzers.summary import summarize
    from .planner import make_plan
    from .progress import progress as progress_bar

    options = options or Options()
    with progress_bar("analyzing", total=len(ANALYZERS) + 1, enabled=None if progress else False) as bar:
        summary = summarize(trace)
        bar.advance()

        def done(name: str) -> None:
            bar.update(description=f"analyzing: {name} done")
            bar.advance()

        results: list[AnalysisResult] = run_all(trace, options, on_done=done)
    findings = [f for r in results for f in r.findings]
    findings.sort(key=lambda f: (_SEV_ORDER.get(f.severity, 9), -(f.recoverable_ns or 0)))
    plan = make_plan(trace, findings, results, options)
    info = {
        "path": trace.path,
        "format": trace.format,
        "counts": trace.counts(),
        "meta": trace.meta,
    }
    return AdviseResult(trace_info=info, summary=summary, findings=findings, plan=plan,
                        analyses={r.name: r.data for r in results}, trace=trace)


def advise(path: str | os.PathLike[str], options: Options | None = None, *, nvtx: str | None = None,
           start_ns: int | None = None, end_ns: int | None = None, progress: bool = False) -> AdviseResult:
    """Load ``path`` (any supported format), optionally restrict it, and diagnose it."""
    from .loaders import load
    from .progress import progress as progress_bar

    with progress_bar(f"loading {os.path.basename(str(path))}", enabled=None if progress else False):
        trace = load(path, progress=progress)
    trace.meta.setdefault("sha256", _file_sha256(str(path)))
    trace = restrict(trace, nvtx=nvtx, start_ns=start_ns, end_ns=end_ns)
    res = advise_trace(trace, options, progress=progress)
    if nvtx is not None:
        res.trace_info["nvtx"] = nvtx
    return res
