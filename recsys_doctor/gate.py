"""The CI gate: ``check`` a run against rules and a baseline, ``compare`` two runs.

Library logic only (the click commands live in ``recsys_doctor/cli/gate.py``).

A *baseline* is what an earlier, good run looked like: its summary metrics and the ids
(and severities) of its findings. It comes from

* an ``advise --json`` output file (the full JSON contract),
* a ``check --write-baseline FILE`` file (the same keys, trimmed: no analyses), or
* the newest run recorded in the history for a branch (``--baseline-db main``).

Rules (each failed rule gives one line of reason):

* ``min_utilization X``: fail when ``gpu_utilization`` < X (a fraction, 0..1);
* ``max_drop D``: fail when ``baseline - current`` utilization > D (absolute, so 0.05 is
  five percentage points);
* ``fail_on SEV``: fail when a finding of severity SEV or worse appears whose id the
  baseline did not have (with no baseline every such finding is new).

When a baseline is given and neither ``max_drop`` nor ``fail_on`` is, the defaults
:data:`DEFAULT_MAX_DROP` and :data:`DEFAULT_FAIL_ON` apply: a baseline alone must still
be able to fail the build.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._format import pct
from .errors import BadInputError
from ._json import json_default

if TYPE_CHECKING:  # pragma: no cover
    from .advise import AdviseResult

__all__ = [
    "Baseline",
    "RuleResult",
    "CheckResult",
    "CompareResult",
    "DEFAULT_MAX_DROP",
    "DEFAULT_FAIL_ON",
    "SEVERITY_RANK",
    "load_baseline",
    "baseline_from_result",
    "baseline_from_history",
    "baseline_to_dict",
    "write_baseline",
    "load_result_json",
    "result_from_dict",
    "load_run",
    "parse_fraction",
    "check",
    "compare",
    "junit_xml",
    "write_junit",
    "github_annotations",
]

#: allowed absolute utilization drop when only a baseline is given: 5 percentage points
#: (run-to-run noise of the same workload on the same GPU is ~1-2 points)
DEFAULT_MAX_DROP = 0.05
#: severity that fails the build when new, when only a baseline is given
DEFAULT_FAIL_ON = "high"
#: lower is worse
SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2, "note": 3}
BASELINE_KIND = "recsys-doctor-baseline"
_METRIC = "gpu_utilization"


@dataclass
class Baseline:
    """The part of an earlier run that the gate compares against."""

    summary: dict[str, Any]
    findings: list[dict[str, Any]]  # each at least {"id", "severity"}
    source: str
    trace: dict[str, Any] = field(default_factory=dict)

    @property
    def utilization(self) -> float | None:
        return _num(self.summary.get(_METRIC))

    @property
    def finding_ids(self) -> set[str]:
        return {str(f.get("id")) for f in self.findings}


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


# --- inputs ---------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f  # NaN -> None


def parse_fraction(text: str | float | None, what: str) -> float | None:
    """``0.4`` or ``40%`` -> 0.4. A bare number above 1 is refused (ambiguous)."""
    if text is None:
        return None
    s = str(text).strip()
    try:
        if s.endswith("%"):
            v = float(s[:-1]) / 100.0
        else:
            v = float(s)
            if v > 1.0:
                raise BadInputError(f"{what}: {s} is above 1; give a fraction (0.4) or a percentage (40%)")
    except ValueError:
        raise BadInputError(f"{what}: cannot read {s!r} as a fraction (0.4) or a percentage (40%)") from None
    if not 0.0 <= v <= 1.0:
        raise BadInputError(f"{what}: {s} is outside 0..1 (0%..100%)")
    return v


def _findings_of(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for f in data.get("findings") or []:
        if isinstance(f, Mapping) and f.get("id") is not None:
            out.append({"id": str(f["id"]), "severity": str(f.get("severity", "low")),
                        "title": str(f.get("title", ""))})
    return out


def load_result_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an ``advise --json`` or ``--write-baseline`` file; :class:`BadInputError`
    unless it has a ``summary`` with ``gpu_utilization`` (a list from a multi-trace
    ``advise --json`` must hold exactly one run)."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"baseline file {p} does not exist" if not p.exists() else f"{p} is not a file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(f"{p} is not a recsys-doctor JSON file: {e}") from None
    if isinstance(data, list):
        if len(data) != 1:
            raise BadInputError(f"{p} holds {len(data)} runs; a baseline must hold one (advise --json ONE trace)")
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("summary"), dict):
        raise BadInputError(f"{p} has no 'summary': write it with `advise --json` or `check --write-baseline`")
    if _num(data["summary"].get(_METRIC)) is None:
        raise BadInputError(f"{p}: summary has no numeric {_METRIC}")
    return data


def result_from_dict(data: Mapping[str, Any]) -> "AdviseResult":
    """An :class:`AdviseResult` (without ``trace``) from the JSON contract, so a saved
    ``advise --json`` file can be checked, compared or rendered like a fresh run."""
    from .advise import AdviseResult
    from .findings import Finding

    fs = []
    for f in data.get("findings") or []:
        if isinstance(f, Mapping) and f.get("id") is not None:
            fs.append(Finding(id=str(f["id"]), severity=str(f.get("severity", "low")), title=str(f.get("title", "")),
                              evidence=dict(f.get("evidence") or {}), recommendation=str(f.get("recommendation", "")),
                              where=list(f.get("where") or [])))
    return AdviseResult(trace_info=dict(data.get("trace") or {}), summary=dict(data.get("summary") or {}),
                        findings=fs, plan=dict(data.get("plan") or {}), analyses=dict(data.get("analyses") or {}))


def _looks_like_result_json(p: Path) -> dict[str, Any] | None:
    if not p.name.lower().endswith(".json") or not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict) and isinstance(data.get("summary"), dict) and "findings" in data:
        return data
    return None


def load_run(path: str | os.PathLike[str], options: Any = None, *, nvtx: str | None = None,
             start_ns: int | None = None, end_ns: int | None = None, progress: bool = False) -> "AdviseResult":
    """A run to check or compare: a saved ``advise --json`` / baseline file is read as is
    (window options do not apply to it), anything else is a trace and goes through
    :func:`recsys_doctor.advise.advise`."""
    p = Path(path)
    data = _looks_like_result_json(p)
    if data is not None:
        if nvtx is not None or start_ns is not None or end_ns is not None:
            raise BadInputError(f"{p} is a saved result: --nvtx/--start/--end only apply to traces")
        return result_from_dict(data)
    from .advise import advise

    return advise(p, options, nvtx=nvtx, start_ns=start_ns, end_ns=end_ns, progress=progress)


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    data = load_result_json(path)
    return Baseline(summary=dict(data["summary"]), findings=_findings_of(data), source=str(path),
                    trace=dict(data.get("trace") or {}))


def _as_dict(result: "AdviseResult | Mapping[str, Any]") -> dict[str, Any]:
    if isinstance(result, Mapping):
        return dict(result)
    return result.to_dict()


def baseline_from_result(result: "AdviseResult | Mapping[str, Any]", source: str = "current run") -> Baseline:
    d = _as_dict(result)
    return Baseline(summary=dict(d.get("summary") or {}), findings=_findings_of(d), source=source,
                    trace=dict(d.get("trace") or {}))


def baseline_from_history(branch: str, db_path: str | os.PathLike[str] | None = None, *,
                          workload: str | None = None, key: str | None = None) -> Baseline:
    """The newest passed check recorded for ``branch`` (optionally only for the workload
    ``key`` of :func:`recsys_doctor.history.workload_key`, or a workload name)."""
    from .history import latest_run

    run = latest_run(branch, db_path, workload=workload, key=key)
    summary = run.get("summary") or {}
    if _num(summary.get(_METRIC)) is None:
        raise BadInputError(f"history run {run['id']} on {branch!r} has no {_METRIC}")
    return Baseline(summary=summary, findings=list(run.get("findings") or []),
                    source=f"history run {run['id']} ({branch}, {run.get('git_commit') or 'no commit'}, {run['when_utc']})",
                    trace={"path": run.get("trace_path"), "sha256": run.get("trace_sha256")})


def baseline_to_dict(result: "AdviseResult | Mapping[str, Any]") -> dict[str, Any]:
    """The ``--write-baseline`` file content: the JSON contract without the analyses."""
    from .advise import SCHEMA_VERSION

    d = _as_dict(result)
    trace = dict(d.get("trace") or {})
    trace.pop("counts", None)
    return {"kind": BASELINE_KIND, "schema": d.get("schema", SCHEMA_VERSION), "trace": trace,
            "summary": d.get("summary") or {}, "findings": _findings_of(d)}


def write_baseline(result: "AdviseResult | Mapping[str, Any]", path: str | os.PathLike[str]) -> None:
    try:
        Path(path).write_text(json.dumps(baseline_to_dict(result), indent=1, default=json_default) + "\n",
                              encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot write baseline {path}: {e}") from None


# --- the gate --------------------------------------------------------------------------

def check(current: "AdviseResult | Mapping[str, Any]", baseline: Baseline | None = None, *,
          min_utilization: float | None = None, max_drop: float | None = None,
          fail_on: str | None = None) -> CheckResult:
    """Apply the rules to ``current``; see the module docstring.

    Raises :class:`BadInputError` when there is nothing to check, when ``max_drop`` is
    asked without a baseline, or when a needed number is missing.
    """
    cur = _as_dict(current)
    summary = cur.get("summary") or {}
    if baseline is not None and max_drop is None and fail_on is None:
        max_drop, fail_on = DEFAULT_MAX_DROP, DEFAULT_FAIL_ON
    if min_utilization is None and max_drop is None and fail_on is None:
        raise BadInputError("nothing to check: give --baseline/--baseline-db, --min-utilization, --max-drop or --fail-on")
    if max_drop is not None and baseline is None:
        raise BadInputError("--max-drop needs a baseline (--baseline FILE or --baseline-db BRANCH)")
    if fail_on is not None and fail_on not in SEVERITY_RANK:
        raise BadInputError(f"--fail-on: unknown severity {fail_on!r}; one of {', '.join(SEVERITY_RANK)}")
    util = _num(summary.get(_METRIC))
    if util is None and (min_utilization is not None or max_drop is not None):
        raise BadInputError(f"the current run's summary has no {_METRIC}")
    rules: list[RuleResult] = []

    if min_utilization is not None:
        assert util is not None
        ok = util >= min_utilization
        msg = (f"{_METRIC} {util:.4f} ({pct(util)}) is below the minimum {min_utilization:.4f} "
               f"({pct(min_utilization)})" if not ok else
               f"{_METRIC} {util:.4f} ({pct(util)}) >= minimum {min_utilization:.4f} ({pct(min_utilization)})")
        rules.append(RuleResult("min-utilization", ok, msg))

    if max_drop is not None:
        assert baseline is not None and util is not None
        base = baseline.utilization
        if base is None:
            raise BadInputError(f"baseline {baseline.source} has no {_METRIC}")
        drop = base - util
        ok = drop <= max_drop + 1e-12
        if ok:
            msg = (f"{_METRIC} {util:.4f} ({pct(util)}) vs baseline {base:.4f} ({pct(base)}): "
                   f"change {-drop:+.4f} within the allowed drop {max_drop:.4f}")
        else:
            msg = (f"{_METRIC} dropped from {base:.4f} ({pct(base)}) in the baseline to {util:.4f} "
                   f"({pct(util)}): drop {drop:.4f} > allowed {max_drop:.4f}")
        rules.append(RuleResult("max-drop", ok, msg))

    if fail_on is not None:
        limit = SEVERITY_RANK[fail_on]
        known = baseline.finding_ids if baseline is not None else set()
        new = [f for f in _findings_of(cur)
               if SEVERITY_RANK.get(f["severity"], 9) <= limit and f["id"] not in known]
        against = "the baseline" if baseline is not None else "no baseline"
        reasons = [f"new {f['severity']} finding {f['id']!r} (not in {against}): {f['title']}" for f in new]
        msg = (f"{len(new)} new finding(s) of severity {fail_on} or worse" if new
               else f"no new finding of severity {fail_on} or worse")
        rules.append(RuleResult(f"fail-on-{fail_on}", not new, msg, reasons))
    return CheckResult(rules=rules, current=cur, baseline=baseline)


def compare(a: "AdviseResult | Mapping[str, Any]", b: "AdviseResult | Mapping[str, Any]", *,
            a_name: str = "A", b_name: str = "B") -> CompareResult:
    """Summary metric deltas (B - A, numeric keys of either run, nested keys joined by
    ``_``) and the findings that appeared in B, disappeared from A, or changed severity."""
    from .history import flatten_summary

    da, db_ = _as_dict(a), _as_dict(b)
    fa, fb = flatten_summary(da.get("summary") or {}), flatten_summary(db_.get("summary") or {})
    keys = list(dict.fromkeys([*fa, *fb]))
    metrics = []
    for k in keys:
        va, vb = _num(fa.get(k)), _num(fb.get(k))
        if va is None and vb is None:
            continue
        metrics.append({"metric": k, "a": va, "b": vb,
                        "delta": None if va is None or vb is None else vb - va})
    ia = {f["id"]: f for f in _findings_of(da)}
    ib = {f["id"]: f for f in _findings_of(db_)}
    appeared = [ib[i] for i in ib if i not in ia]
    disappeared = [ia[i] for i in ia if i not in ib]
    changed = [{"id": i, "a": ia[i]["severity"], "b": ib[i]["severity"], "title": ib[i]["title"]}
               for i in ia if i in ib and ia[i]["severity"] != ib[i]["severity"]]
    return CompareResult(a=a_name, b=b_name, metrics=metrics, appeared=appeared,
                         disappeared=disappeared, changed=changed)


# --- outputs ---------------------------------------------------------------------------

def junit_xml(result: CheckResult, *, suite: str = "recsys-doctor check", name: str | None = None) -> str:
    """JUnit XML: one test case per rule, a ``<failure>`` per failed rule (message = the
    first reason, body = all of them). ElementTree escapes every string."""
    ts = ET.Element("testsuite", name=suite, tests=str(len(result.rules)),
                    failures=str(sum(not r.passed for r in result.rules)), errors="0", skipped="0")
    trace = (result.current.get("trace") or {}).get("path")
    classname = name or (f"recsys-doctor.{Path(str(trace)).name}" if trace else "recsys-doctor")
    for r in result.rules:
        tc = ET.SubElement(ts, "testcase", classname=classname, name=r.name)
        if not r.passed:
            reasons = r.reasons or [r.message]
            fail = ET.SubElement(tc, "failure", message=reasons[0], type="regression")
            fail.text = "\n".join(reasons)
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = r.message
    suites = ET.Element("testsuites")
    suites.append(ts)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_junit(result: CheckResult, path: str | os.PathLike[str]) -> None:
    try:
        Path(path).write_text(junit_xml(result), encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot write JUnit XML {path}: {e}") from None


def _gh_escape(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_annotations(result: CheckResult, env: Mapping[str, str] | None = None) -> list[str]:
    """``::error title=...::reason`` lines, one per reason, when ``GITHUB_ACTIONS=true``
    (else none): GitHub shows them on the run's summary page."""
    env = os.environ if env is None else env
    if str(env.get("GITHUB_ACTIONS", "")).lower() != "true":
        return []
    return [f"::error title=recsys-doctor check::{_gh_escape(r)}" for r in result.reasons]
