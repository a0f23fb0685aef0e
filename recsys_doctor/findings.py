"""What an analyzer returns: findings (with evidence) plus numbers for reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["Finding", "AnalysisResult", "SEVERITIES", "severity_for_share", "severity_for_recoverable"]

SEVERITIES = ("high", "medium", "low", "note")


@dataclass
class Finding:
    """One diagnosis.

    ``id`` is the analyzer's stable id (``short-kernels``, ``launch-bound``, ...);
    ``evidence`` holds the numbers that justify it (JSON-serializable); ``where`` lists the
    places it happens, most important first, each a dict with any of ``nvtx``, ``cpu_op``,
    ``thread``, ``stream``, ``device`` and a ``share`` of the finding's total.
    """

    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    recommendation: str
    where: list[dict[str, Any]] = field(default_factory=list)
    #: estimated GPU time (ns) that fixing this finding could win back inside the analysis
    #: window; ``severity`` derives from its share of the window (see docs/findings.md)
    recoverable_ns: int | None = None
    #: ``recoverable_ns`` / analysis window (0..1)
    recoverable_share: float | None = None
    #: 1-3 moments to jump to in Nsight Systems / Perfetto: ``{"start_ns", "duration_ns",
    #: "thread", "stream", "what"}`` on the trace's own clock
    examples: list[dict[str, Any]] = field(default_factory=list)
    #: the first thing to do, in one short line (the verdict's "first action")
    action: str = ""
    #: the idle gaps its recoverable time was counted from (a DataFrame set by
    #: ``analyzers._recoverable.finish``, used and cleared by ``settle_shared_causes``, which
    #: counts each gap once); internal: never in the output
    claims: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, claims=None) if self.claims is not None else self)
        del d["claims"]
        return d


@dataclass
class AnalysisResult:
    """An analyzer's output: zero or more findings plus its numbers (``data``) for reports
    and plots (JSON-serializable)."""

    name: str
    findings: list[Finding] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def severity_for_share(share: float | None, high: float, medium: float) -> str:
    if share is None:
        return "low"
    if share >= high:
        return "high"
    if share >= medium:
        return "medium"
    return "low"


def severity_for_recoverable(share: float | None, high: float, medium: float, low: float) -> str:
    """Severity from the share of the analysis window a fix could win back:
    ``>= high`` high, ``>= medium`` medium, ``>= low`` low, else note (see
    ``Options.recoverable_high`` and docs/findings.md)."""
    if share is None:
        return "note"
    if share >= high:
        return "high"
    if share >= medium:
        return "medium"
    if share >= low:
        return "low"
    return "note"
