"""What one history row holds, built from an :class:`AdviseResult` (no database here:
:mod:`recsys_doctor.history.db` stores it). The columns are listed in that module's docstring."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import fields as dc_fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._util.files import file_sha256

if TYPE_CHECKING:  # pragma: no cover
    from ..diagnose.advise import AdviseResult

__all__ = ["METRIC_COLUMNS", "flatten_summary", "git_info", "workload_name", "workload_key", "build_row"]

#: summary metrics stored as their own columns (nested keys joined with ``_``)
METRIC_COLUMNS: dict[str, str] = {
    "gpu_utilization": "REAL",
    "kernels": "INTEGER",
    "short_kernel_fraction": "REAL",
    "launch_threads_per_stream_max": "INTEGER",
    "memcpy_h2d": "INTEGER",
    "memcpy_d2h": "INTEGER",
    "memcpy_direction_switches": "INTEGER",
    "sync_calls": "INTEGER",
}

#: options that do not change any number of a run (display only)
_DISPLAY_OPTIONS = {"top_n", "examples_per_finding", "timeline_bins"}


def flatten_summary(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"memcpy": {"h2d": 3}}`` -> ``{"memcpy_h2d": 3}`` (scalars only)."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_summary(v, key + "_"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
        elif hasattr(v, "item"):  # numpy scalar
            out[key] = v.item()
    return out


def _git(cwd: str | os.PathLike[str] | None, *args: str) -> str | None:
    """``git ARGS`` in ``cwd``: its output, or None when git or the repository is absent."""
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    out = p.stdout.strip()
    return out if p.returncode == 0 and out else None


def git_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """``{"git_commit": sha, "git_branch": name}`` of ``cwd`` (default: the current
    directory) via ``git rev-parse``; empty when git or the repository is absent.

    A detached HEAD (as in most CI checkouts) takes the branch from
    ``$GITHUB_HEAD_REF`` / ``$GITHUB_REF_NAME`` / ``$CI_COMMIT_REF_NAME`` when set.
    """
    commit = _git(cwd, "rev-parse", "HEAD")
    if commit is None:
        return {}
    info = {"git_commit": commit}
    branch = _git(cwd, "rev-parse", "--abbrev-ref", "HEAD")
    if branch in (None, "HEAD"):
        branch = (os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME")
                  or os.environ.get("CI_COMMIT_REF_NAME") or None)
    if branch:
        info["git_branch"] = branch
    return info


def _tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("recsys-doctor")
    except ImportError:  # PackageNotFoundError is one: not installed, the source tree's version
        from .._util import __version__

        return __version__


def workload_name(path: str | None) -> str | None:
    """The workload a trace belongs to: its file name without extension(s)."""
    if not path:
        return None
    name = Path(path).name
    for suf in (".gz", ".sqlite", ".nsys-rep", ".json", ".pt.trace", ".trace"):
        if name.endswith(suf):
            name = name[: -len(suf)]
    return name or None


def _trace_place(path: str) -> str:
    """The trace's path relative to the git top level of its directory when it is inside
    a repository (stable across CI checkouts), else its absolute path."""
    p = Path(path).resolve()
    top = _git(p.parent, "rev-parse", "--show-toplevel")
    if top:
        try:
            return "git:" + str(p.relative_to(Path(top).resolve()))
        except ValueError:
            pass
    return str(p)


def workload_key(result: "AdviseResult", options: Any = None) -> str | None:
    """What makes two runs the same workload, as a short hash: the trace's place
    (:func:`_trace_place`), the GPU names, the analysis window (``--start``/``--end``/
    ``--nvtx``) and every option that differs from its default and changes numbers.
    Two ``report1.sqlite`` files of different directories, or a ``--nvtx query`` run and a
    whole-trace run of one file, get different keys."""
    info = result.trace_info or {}
    path = info.get("path")
    if not path:
        return None
    from ..options import Options

    opts = {}
    if options is not None:
        base = Options()
        opts = {f.name: getattr(options, f.name) for f in dc_fields(Options)
                if f.name not in _DISPLAY_OPTIONS and getattr(options, f.name) != getattr(base, f.name)}
    parts = {"trace": _trace_place(str(path)), "gpus": _gpu_names(result), "nvtx": info.get("nvtx"),
             "window_ns": info.get("window_ns"), "options": opts}
    return hashlib.sha256(_json(parts).encode()).hexdigest()[:16]


def _gpu_names(result: "AdviseResult") -> list[str]:
    names: list[str] = []
    tr = getattr(result, "trace", None)
    if tr is not None and len(tr.devices):
        names = [str(n) for n in tr.devices["name"].tolist() if n is not None and str(n) not in ("", "nan", "None")]
    if not names:
        devs = result.trace_info.get("devices") or result.summary.get("devices") or []
        for d in devs if isinstance(devs, list) else []:
            n = d.get("name") if isinstance(d, Mapping) else d
            if n:
                names.append(str(n))
    return list(dict.fromkeys(names))


def _json(o: Any) -> str:
    def default(x: Any) -> Any:
        if hasattr(x, "item"):
            return x.item()
        if isinstance(x, (set, tuple)):
            return list(x)
        return str(x)

    return json.dumps(o, default=default, sort_keys=True)


def _trace_sha256(info: Mapping[str, Any]) -> str | None:
    """The hash the loader recorded, else the file's own (None when it cannot be read)."""
    sha = (info.get("meta") or {}).get("sha256") or info.get("sha256")
    if sha or not info.get("path"):
        return sha
    try:
        return file_sha256(str(info["path"]))
    except OSError:
        return None


def _metric_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """:data:`METRIC_COLUMNS` of the summary, as the column's type (None when absent or
    not a number)."""
    flat = flatten_summary(summary)
    out: dict[str, Any] = {}
    for col, typ in METRIC_COLUMNS.items():
        v = flat.get(col)
        try:
            out[col] = None if v is None else int(v) if isinstance(v, bool) or typ == "INTEGER" else float(v)
        except (TypeError, ValueError):
            out[col] = None
    return out


def build_row(result: "AdviseResult", command: str = "advise", *, passed: bool | None = None,
              reasons: list[str] | None = None, cwd: str | os.PathLike[str] | None = None,
              now: datetime | None = None, options: Any = None, key: str | None = None) -> dict[str, Any]:
    """The row :func:`recsys_doctor.history.db.record_run` inserts (exposed for tests and dry runs)."""
    info = result.trace_info or {}
    path = info.get("path")
    findings = [{"id": f.id, "severity": f.severity, "title": f.title} for f in result.findings]
    return {
        "when_utc": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "command": command,
        "workload": workload_name(str(path) if path else None),
        "workload_key": key or workload_key(result, options),
        "trace_path": str(Path(path).resolve()) if path else None,
        "trace_sha256": _trace_sha256(info),
        "tool_version": _tool_version(),
        "gpus": "; ".join(_gpu_names(result)) or None,
        "git_commit": None,
        "git_branch": None,
        **git_info(cwd),
        **_metric_columns(result.summary or {}),
        "summary_json": _json(result.summary or {}),
        "findings_json": _json(findings),
        "finding_ids": ",".join(f["id"] for f in findings),
        "passed": None if passed is None else int(bool(passed)),
        "reasons_json": None if reasons is None else _json(list(reasons)),
    }
