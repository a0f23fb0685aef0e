"""The gate's inputs: what an earlier, good run looked like (a :class:`Baseline`) and the
run to check, read from ``advise --json`` files, ``--write-baseline`` files, traces or the
history."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInputError
from .._util.json import json_default

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["Baseline", "BASELINE_KIND", "parse_fraction", "load_result_json", "result_from_dict", "load_run",
           "load_baseline", "baseline_from_result", "baseline_from_history", "baseline_to_dict", "write_baseline"]

BASELINE_KIND = "recsys-doctor-baseline"
METRIC = "gpu_utilization"


@dataclass
class Baseline:
    """The part of an earlier run that the gate compares against."""

    summary: dict[str, Any]
    findings: list[dict[str, Any]]  # each at least {"id", "severity"}
    source: str
    trace: dict[str, Any] = field(default_factory=dict)

    @property
    def utilization(self) -> float | None:
        return num(self.summary.get(METRIC))

    @property
    def finding_ids(self) -> set[str]:
        return {str(f.get("id")) for f in self.findings}


def num(v: Any) -> float | None:
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


def findings_of(data: Mapping[str, Any]) -> list[dict[str, Any]]:
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
    if num(data["summary"].get(METRIC)) is None:
        raise BadInputError(f"{p}: summary has no numeric {METRIC}")
    return data


def result_from_dict(data: Mapping[str, Any]) -> "AdviseResult":
    """An :class:`AdviseResult` (without ``trace``) from the JSON contract, so a saved
    ``advise --json`` file can be checked, compared or rendered like a fresh run."""
    from ..diagnose.advise import AdviseResult
    from ..findings import Finding

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
    :func:`recsys_doctor.diagnose.advise.advise`."""
    p = Path(path)
    data = _looks_like_result_json(p)
    if data is not None:
        if nvtx is not None or start_ns is not None or end_ns is not None:
            raise BadInputError(f"{p} is a saved result: --nvtx/--start/--end only apply to traces")
        return result_from_dict(data)
    from ..diagnose.advise import advise

    return advise(p, options, nvtx=nvtx, start_ns=start_ns, end_ns=end_ns, progress=progress)


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    data = load_result_json(path)
    return Baseline(summary=dict(data["summary"]), findings=findings_of(data), source=str(path),
                    trace=dict(data.get("trace") or {}))


def as_dict(result: "AdviseResult | Mapping[str, Any]") -> dict[str, Any]:
    if isinstance(result, Mapping):
        return dict(result)
    return result.to_dict()


def baseline_from_result(result: "AdviseResult | Mapping[str, Any]", source: str = "current run") -> Baseline:
    d = as_dict(result)
    return Baseline(summary=dict(d.get("summary") or {}), findings=findings_of(d), source=source,
                    trace=dict(d.get("trace") or {}))


def baseline_from_history(branch: str, db_path: str | os.PathLike[str] | None = None, *,
                          workload: str | None = None, key: str | None = None) -> Baseline:
    """The newest passed check recorded for ``branch`` (optionally only for the workload
    ``key`` of :func:`recsys_doctor.history.db.workload_key`, or a workload name)."""
    from ..history.db import latest_run

    run = latest_run(branch, db_path, workload=workload, key=key)
    summary = run.get("summary") or {}
    if num(summary.get(METRIC)) is None:
        raise BadInputError(f"history run {run['id']} on {branch!r} has no {METRIC}")
    return Baseline(summary=summary, findings=list(run.get("findings") or []),
                    source=f"history run {run['id']} ({branch}, {run.get('git_commit') or 'no commit'}, {run['when_utc']})",
                    trace={"path": run.get("trace_path"), "sha256": run.get("trace_sha256")})


def baseline_to_dict(result: "AdviseResult | Mapping[str, Any]") -> dict[str, Any]:
    """The ``--write-baseline`` file content: the JSON contract without the analyses."""
    from ..diagnose.advise import SCHEMA_VERSION

    d = as_dict(result)
    trace = dict(d.get("trace") or {})
    trace.pop("counts", None)
    return {"kind": BASELINE_KIND, "schema": d.get("schema", SCHEMA_VERSION), "trace": trace,
            "summary": d.get("summary") or {}, "findings": findings_of(d)}


def write_baseline(result: "AdviseResult | Mapping[str, Any]", path: str | os.PathLike[str]) -> None:
    try:
        Path(path).write_text(json.dumps(baseline_to_dict(result), indent=1, default=json_default) + "\n",
                              encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot write baseline {path}: {e}") from None
