"""The gate's rules (``check``) and the run-to-run comparison (``compare``); see the
package docstring of :mod:`recsys_doctor.gate` for what each rule means."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._util.format import pct
from ..history.row import flatten_summary
from ..errors import BadInputError
from .baseline import METRIC, Baseline, as_dict, findings_of, num

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["DEFAULT_MAX_DROP", "DEFAULT_FAIL_ON", "SEVERITY_RANK", "RuleResult", "CheckResult", "CompareResult",
           "check", "compare"]

#: allowed absolute utilization drop when only a baseline is given: 5 percentage points
#: (run-to-run noise of the same workload on the same GPU is ~1-2 points)
DEFAULT_MAX_DROP = 0.05
#: severity that fails the build when new, when only a baseline is given
DEFAULT_FAIL_ON = "high"
#: lower is worse
SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2, "note": 3}


@dataclass
class RuleResult:
    """One rule's verdict (one JUnit test case)."""

    name: str
    passed: bool
    message: str
    reasons: list[str] = field(default_factory=list)


@dataclass
class CheckResult:
    """Pass/fail plus one reason line per failure."""

    rules: list[RuleResult]
    current: dict[str, Any]
    baseline: Baseline | None = None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rules)

    @property
    def reasons(self) -> list[str]:
        return [line for r in self.rules if not r.passed for line in (r.reasons or [r.message])]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reasons": self.reasons,
            "rules": [{"name": r.name, "passed": r.passed, "message": r.message} for r in self.rules],
            "baseline": None if self.baseline is None else self.baseline.source,
        }


@dataclass
class CompareResult:
    """What changed from run A to run B."""

    a: str
    b: str
    metrics: list[dict[str, Any]]  # {"metric", "a", "b", "delta"}
    appeared: list[dict[str, Any]]
    disappeared: list[dict[str, Any]]
    changed: list[dict[str, Any]]  # same id, other severity: {"id", "a", "b", "title"}

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "metrics": self.metrics, "appeared": self.appeared,
                "disappeared": self.disappeared, "severity_changed": self.changed}


def _min_utilization(util: float, minimum: float) -> RuleResult:
    ok = util >= minimum
    msg = (f"{METRIC} {util:.4f} ({pct(util)}) is below the minimum {minimum:.4f} ({pct(minimum)})" if not ok else
           f"{METRIC} {util:.4f} ({pct(util)}) >= minimum {minimum:.4f} ({pct(minimum)})")
    return RuleResult("min-utilization", ok, msg)


def _max_drop(util: float, baseline: Baseline, max_drop: float) -> RuleResult:
    base = baseline.utilization
    if base is None:
        raise BadInputError(f"baseline {baseline.source} has no {METRIC}")
    drop = base - util
    ok = drop <= max_drop + 1e-12
    if ok:
        msg = (f"{METRIC} {util:.4f} ({pct(util)}) vs baseline {base:.4f} ({pct(base)}): "
               f"change {-drop:+.4f} within the allowed drop {max_drop:.4f}")
    else:
        msg = (f"{METRIC} dropped from {base:.4f} ({pct(base)}) in the baseline to {util:.4f} "
               f"({pct(util)}): drop {drop:.4f} > allowed {max_drop:.4f}")
    return RuleResult("max-drop", ok, msg)


def _fail_on(current: Mapping[str, Any], baseline: Baseline | None, fail_on: str) -> RuleResult:
    """Fail on a finding of severity ``fail_on`` or worse that the baseline did not have
    at that severity: a new finding, or one that rose to it (a ``note`` in the baseline
    that is ``high`` now is as much a regression as a new ``high``)."""
    limit = SEVERITY_RANK[fail_on]
    before: dict[str, str] = {}
    for f in baseline.findings if baseline is not None else []:
        sev, fid = str(f.get("severity", "note")), str(f.get("id"))
        if fid not in before or SEVERITY_RANK.get(sev, 9) < SEVERITY_RANK.get(before[fid], 9):
            before[fid] = sev  # the worst severity the baseline had for this id
    reasons = []
    for f in findings_of(current):
        rank = SEVERITY_RANK.get(f["severity"], 9)
        if rank > limit:
            continue
        was = before.get(f["id"])
        if was is None:
            against = "the baseline" if baseline is not None else "no baseline"
            reasons.append(f"new {f['severity']} finding {f['id']!r} (not in {against}): {f['title']}")
        elif SEVERITY_RANK.get(was, 9) > limit:
            reasons.append(f"finding {f['id']!r} rose from {was} in the baseline to {f['severity']}: {f['title']}")
    msg = (f"{len(reasons)} new or risen finding(s) of severity {fail_on} or worse" if reasons
           else f"no new or risen finding of severity {fail_on} or worse")
    return RuleResult(f"fail-on-{fail_on}", not reasons, msg, reasons)


def check(current: "AdviseResult | Mapping[str, Any]", baseline: Baseline | None = None, *,
          min_utilization: float | None = None, max_drop: float | None = None,
          fail_on: str | None = None) -> CheckResult:
    """Apply the rules to ``current``; see the package docstring.

    Raises :class:`BadInputError` when there is nothing to check, when ``max_drop`` is
    asked without a baseline, or when a needed number is missing.
    """
    cur = as_dict(current)
    if baseline is not None and max_drop is None and fail_on is None:
        max_drop, fail_on = DEFAULT_MAX_DROP, DEFAULT_FAIL_ON
    if min_utilization is None and max_drop is None and fail_on is None:
        raise BadInputError("nothing to check: give --baseline/--baseline-db, --min-utilization, --max-drop or --fail-on")
    if max_drop is not None and baseline is None:
        raise BadInputError("--max-drop needs a baseline (--baseline FILE or --baseline-db BRANCH)")
    if fail_on is not None and fail_on not in SEVERITY_RANK:
        raise BadInputError(f"--fail-on: unknown severity {fail_on!r}; one of {', '.join(SEVERITY_RANK)}")
    util = num((cur.get("summary") or {}).get(METRIC))
    if util is None and (min_utilization is not None or max_drop is not None):
        raise BadInputError(f"the current run's summary has no {METRIC}")
    rules: list[RuleResult] = []
    if min_utilization is not None:
        assert util is not None
        rules.append(_min_utilization(util, min_utilization))
    if max_drop is not None:
        assert baseline is not None and util is not None
        rules.append(_max_drop(util, baseline, max_drop))
    if fail_on is not None:
        rules.append(_fail_on(cur, baseline, fail_on))
    return CheckResult(rules=rules, current=cur, baseline=baseline)


def compare(a: "AdviseResult | Mapping[str, Any]", b: "AdviseResult | Mapping[str, Any]", *,
            a_name: str = "A", b_name: str = "B") -> CompareResult:
    """Summary metric deltas (B - A, numeric keys of either run, nested keys joined by
    ``_``) and the findings that appeared in B, disappeared from A, or changed severity."""
    da, db_ = as_dict(a), as_dict(b)
    fa, fb = flatten_summary(da.get("summary") or {}), flatten_summary(db_.get("summary") or {})
    keys = list(dict.fromkeys([*fa, *fb]))
    metrics = []
    for k in keys:
        va, vb = num(fa.get(k)), num(fb.get(k))
        if va is None and vb is None:
            continue
        metrics.append({"metric": k, "a": va, "b": vb,
                        "delta": None if va is None or vb is None else vb - va})
    ia = {f["id"]: f for f in findings_of(da)}
    ib = {f["id"]: f for f in findings_of(db_)}
    appeared = [ib[i] for i in ib if i not in ia]
    disappeared = [ia[i] for i in ia if i not in ib]
    changed = [{"id": i, "a": ia[i]["severity"], "b": ib[i]["severity"], "title": ib[i]["title"]}
               for i in ia if i in ib and ia[i]["severity"] != ib[i]["severity"]]
    return CompareResult(a=a_name, b=b_name, metrics=metrics, appeared=appeared,
                         disappeared=disappeared, changed=changed)
