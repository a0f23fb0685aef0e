"""The stages flow one way: capture -> diagnose -> plan -> apply -> re-measure.

A module of a stage imports only its own stage and those before it (and the shared
modules under all of them: errors, the trace model and its loaders, options, the plan
type, the workload protocol). What both of two stages need lives below both.

Modules outside the chain (the CLI, reports, history, gate) may import anything; a stage
module that imports one of them counts as importing whatever that module reaches, so a
helper cannot carry a higher stage into a lower one. The import graph is the one
``test_import_graph`` reads from the source (lazy imports included).
"""

from __future__ import annotations

from pathlib import Path

from test_import_graph import import_edges, package_modules

#: the stages in order; ``X`` names one module, ``X.*`` a module and everything under it.
#: ``profile`` captures and then diagnoses (its result is the advise report plus how the
#: trace was captured), so ``capture.profiling`` and the package that exports it sit with
#: diagnose; the capture modules under it import nothing of diagnose. The planner turns
#: findings into the advised plan that ``advise`` reports, so it is part of diagnose too;
#: the plan stage is the what-if search over candidate plans.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shared", ("recsys_doctor", "recsys_doctor.errors", "recsys_doctor._util.json", "recsys_doctor.model",
                "recsys_doctor.options", "recsys_doctor.findings", "recsys_doctor._util.progress", "recsys_doctor.plan",
                "recsys_doctor.capture.workload", "recsys_doctor.capture._workload_types", "recsys_doctor.capture._drive",
                "recsys_doctor.loaders.*")),
    ("capture", ("recsys_doctor.capture.backend", "recsys_doctor.capture.nsys", "recsys_doctor.capture.nvml",
                 "recsys_doctor.capture.torch_profiler", "recsys_doctor.capture._child",
                 "recsys_doctor.capture.child_process", "recsys_doctor.capture.treatment")),
    ("diagnose", ("recsys_doctor.analyzers.*", "recsys_doctor.diagnose.advise", "recsys_doctor.planning.planner",
                  "recsys_doctor.diagnose.ranks", "recsys_doctor.capture", "recsys_doctor.capture.profiling")),
    ("plan", ("recsys_doctor.planning.whatif", "recsys_doctor.planning.search", "recsys_doctor.planning.io")),
    ("apply", ("recsys_doctor.applying.train_runner", "recsys_doctor.applying.script_hook", "recsys_doctor.applying._autoapply",
               "recsys_doctor.runtime.*")),
    ("re-measure", ("recsys_doctor.applying.apply", "recsys_doctor.applying.report")),
)


def stage_of(module: str, stages=STAGES) -> int | None:
    """The index of ``module``'s stage (the most specific pattern wins), or None."""
    best: tuple[int, int] | None = None  # (pattern length, stage)
    for i, (_, patterns) in enumerate(stages):
        for p in patterns:
            base = p.removesuffix(".*")
            if module == base or (p.endswith(".*") and module.startswith(base + ".")):
                if best is None or len(p) > best[0]:
                    best = (len(p), i)
    return None if best is None else best[1]


def violations(edges: dict[str, set[str]], stages=STAGES) -> list[str]:
    """Every import by a stage module of something (directly, or through modules outside
    the chain) of a later stage."""
    reach: dict[str, int] = {}  # the highest stage a module is or reaches through outsiders

    def reached(m: str) -> int:
        if m not in reach:
            own = stage_of(m, stages)
            reach[m] = own if own is not None else max((reached(t) for t in edges.get(m, ())), default=-1)
        return reach[m]

    out = []
    for m in sorted(edges):
        own = stage_of(m, stages)
        if own is None:
            continue
        for t in sorted(edges[m]):
            if reached(t) > own:
                out.append(f"{m} ({stages[own][0]}) imports {t} ({stages[reached(t)][0]})")
    return out


def test_every_stage_pattern_names_modules():
    mods = package_modules()
    for _, patterns in STAGES:
        for p in patterns:
            base = p.removesuffix(".*")
            assert base in mods, f"{p}: no such module (moved? update STAGES)"


def test_no_stage_imports_a_later_one():
    bad = violations(import_edges(package_modules()))
    assert not bad, "\n".join(bad)


def test_checker_sees_an_import_up_the_chain_and_through_an_outsider(tmp_path: Path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, src in {"__init__.py": "", "low.py": "x = 1\n", "high.py": "from . import low\n",
                      "helper.py": "def f():\n    from . import high\n", "cli.py": "from . import high\n"}.items():
        (pkg / name).write_text(src)
    stages = (("low", ("pkg.low",)), ("high", ("pkg.high",)))
    edges = import_edges(package_modules({"pkg": pkg}))
    assert violations(edges, stages) == []  # high -> low, an outsider (cli) -> high: fine
    (pkg / "low.py").write_text("from . import helper\n")  # low -> helper -> high
    edges = import_edges(package_modules({"pkg": pkg}))
    assert violations(edges, stages) == ["pkg.low (low) imports pkg.helper (high)"]
    assert stage_of("pkg.low", stages) == 0 and stage_of("pkg.cli", stages) is None
