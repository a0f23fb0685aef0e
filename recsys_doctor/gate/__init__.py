"""The CI gate: ``check`` a run against rules and a baseline, ``compare`` two runs.
Imports history, diagnose, findings, errors, _util (beside history, below reports).

Library logic only (the click commands live in ``recsys_doctor/cli/gate.py``), one job a
module: ``baseline.py`` reads the runs and baselines, ``rules.py`` checks and compares,
``ci_output.py`` writes JUnit XML and GitHub annotations.

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
  baseline did not have, or whose severity rose to SEV or worse from a milder one in the
  baseline (with no baseline every such finding is new).

When a baseline is given and neither ``max_drop`` nor ``fail_on`` is, the defaults
:data:`DEFAULT_MAX_DROP` and :data:`DEFAULT_FAIL_ON` apply: a baseline alone must still
be able to fail the build.
"""

from __future__ import annotations

from .baseline import (Baseline, baseline_from_history, baseline_from_result, baseline_to_dict, load_baseline,
                       load_result_json, load_run, parse_fraction, result_from_dict, write_baseline)
from .ci_output import github_annotations, junit_xml, write_junit
from .rules import (DEFAULT_FAIL_ON, DEFAULT_MAX_DROP, SEVERITY_RANK, CheckResult, CompareResult, RuleResult, check,
                    compare)

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
