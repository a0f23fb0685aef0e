"""The gate's verdict where CI shows it: JUnit XML and GitHub Actions annotations."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from ..errors import BadInputError
from .rules import CheckResult

__all__ = ["junit_xml", "write_junit", "github_annotations"]


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
