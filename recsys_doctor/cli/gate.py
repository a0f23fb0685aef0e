"""``check``, ``compare`` and ``history``: the CI gate and the run history on the command line.

Thin: parse options, call :mod:`recsys_doctor.gate` / :mod:`recsys_doctor.history.db`, print.
Library errors propagate to the group in ``cli/__init__.py`` (one line, exit 2).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import click

from .._util.process import import_numpy_quietly
from ..errors import BadInputError, RecsysDoctorError
from ..options import Options
from .._util.json import json_default

__all__ = ["check_cmd", "compare_cmd", "history_cmd"]

_SEVERITIES = click.Choice(["high", "medium", "low"], case_sensitive=False)


def _window(nvtx: str | None, start: str | None, end: str | None) -> dict[str, Any]:
    from .advise import parse_time

    return {"nvtx": nvtx, "start_ns": parse_time(start, "--start"), "end_ns": parse_time(end, "--end")}


class _Fraction(click.ParamType):
    """``0.4`` or ``40%`` -> 0.4, checked by click while it parses the options (exit 2
    with click's usage message); the rule is :func:`recsys_doctor.gate.parse_fraction`."""

    name = "fraction"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from ..gate import parse_fraction

        what = param.opts[0] if param else "value"
        try:
            out = parse_fraction(value, what)
        except BadInputError as e:
            self.fail(str(e).removeprefix(f"{what}: "), param, ctx)
        assert out is not None
        return out


_db_option = click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), envvar="RECSYS_DOCTOR_DB",
                          help="Run history database (default: the user data dir; env RECSYS_DOCTOR_DB).")


@click.command("check")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--baseline", "baseline_file", type=click.Path(path_type=Path), metavar="FILE",
              help="Baseline: an `advise --json` output or a `check --write-baseline` file.")
@click.option("--baseline-db", "baseline_branch", metavar="BRANCH",
              help="Baseline: the latest run of this workload recorded in the history for BRANCH.")
@click.option("--min-utilization", type=_Fraction(), metavar="X", help="Fail when GPU utilization is below X (0.4 or 40%).")
@click.option("--max-drop", type=_Fraction(), metavar="D",
              help="Fail when utilization dropped by more than D (absolute: 0.05 or 5%) vs the baseline.")
@click.option("--fail-on", type=_SEVERITIES,
              help="Fail when a finding of this severity or worse appears that the baseline did not have, "
                   "or rises to it from a milder severity in the baseline.")
@click.option("--write-baseline", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write this run as a baseline file (for a later --baseline).")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the verdict as JUnit XML (one test case per rule).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--nvtx", metavar="NAME", help="Restrict the trace to the span of these NVTX ranges.")
@click.option("--start", metavar="TIME", help="Start of the analysis window (e.g. 1.5s).")
@click.option("--end", metavar="TIME", help="End of the analysis window.")
@click.option("--workload", "workload_name", metavar="NAME",
              help="Name the workload for --baseline-db instead of deriving its key from the trace's path, "
                   "GPUs, window and options.")
@_db_option
@click.option("--no-history", is_flag=True, help="Do not record this run in the history.")
@click.pass_context
def check_cmd(ctx: click.Context, trace: Path, baseline_file: Path | None, baseline_branch: str | None,
              min_utilization: float | None, max_drop: float | None, fail_on: str | None,
              write_baseline: Path | None, junit: Path | None, as_json: bool, nvtx: str | None,
              start: str | None, end: str | None, workload_name: str | None, db: Path | None,
              no_history: bool) -> None:
    """Gate a run in CI: exit 0 when TRACE passes, 1 on a regression (one reason per
    line), 2 on bad input.

    TRACE is a trace file or a saved `advise --json` output. With only a baseline, the
    defaults are --max-drop 0.05 --fail-on high. Only passed checks (and --write-baseline
    runs) become --baseline-db baselines, looked up by the workload key: the trace's
    path (relative to its git top level), GPUs, --start/--end/--nvtx and changed options.
    """
    import_numpy_quietly()
    from .. import gate
    from ..history import db as history

    if baseline_file and baseline_branch:
        raise BadInputError("give either --baseline FILE or --baseline-db BRANCH, not both")
    # load the baseline first: a bad baseline should fail before a long trace load
    base = gate.load_baseline(baseline_file) if baseline_file else None
    options = Options()
    result = gate.load_run(trace, options, progress=sys.stderr.isatty(), **_window(nvtx, start, end))
    key = (f"name:{workload_name}" if workload_name else history.workload_key(result, options))
    if baseline_branch:
        base = gate.baseline_from_history(baseline_branch, db, key=key)
    if write_baseline:
        gate.write_baseline(result, write_baseline)
        click.echo(f"baseline written to {write_baseline}", err=True)
        if base is None and min_utilization is None and max_drop is None and fail_on is None:
            if not no_history:
                _record(result, db, passed=True, reasons=[f"written as a baseline to {write_baseline}"],
                        options=options, key=key)
            return
    verdict = gate.check(result, base, min_utilization=min_utilization, max_drop=max_drop,
                         fail_on=fail_on.lower() if fail_on else None)
    if junit:
        gate.write_junit(verdict, junit)
        click.echo(f"wrote {junit}", err=True)
    if not no_history:
        _record(result, db, passed=verdict.passed, reasons=verdict.reasons,
                options=options, key=key)
    for line in gate.github_annotations(verdict):
        click.echo(line)
    if as_json:
        click.echo(json.dumps(verdict.to_dict(), indent=1, default=json_default))
    elif verdict.passed:
        for r in verdict.rules:
            click.echo(f"ok: {r.message}")
        click.echo("check passed")
    else:
        for reason in verdict.reasons:
            click.echo(reason)
    if not verdict.passed:
        ctx.exit(1)


def _record(result: Any, db: Path | None, **kw: Any) -> None:
    """History is a side effect: a failure to record warns in one line, never changes
    the verdict or hides it."""
    from ..history import db as history

    try:
        history.record_run(result, db, command="check", **kw)
    except (RecsysDoctorError, OSError, sqlite3.Error) as e:
        click.echo(f"recsys-doctor: warning: run not recorded in the history: {e}", err=True)


@click.command("compare")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write a self-contained before/after HTML page.")
@click.option("--png", "png_out", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the before/after plot as PNG.")
def compare_cmd(a: Path, b: Path, as_json: bool, html_out: Path | None, png_out: Path | None) -> None:
    """Compare run A (before) with run B (after): metric deltas and the findings that
    appeared or disappeared. A and B are traces or saved `advise --json` outputs."""
    import_numpy_quietly()
    from .. import gate

    ra = gate.load_run(a, Options(), progress=sys.stderr.isatty())
    rb = gate.load_run(b, Options(), progress=sys.stderr.isatty())
    c = gate.compare(ra, rb, a_name=str(a), b_name=str(b))
    if html_out:
        from ..reports.html import write_compare_html

        write_compare_html(ra, rb, html_out, a_label=a.name, b_label=b.name)
        click.echo(f"wrote {html_out}", err=True)
    if png_out:
        from ..reports.plots import plot_before_after

        try:
            png_out.write_bytes(plot_before_after(ra, rb, a.name, b.name))
        except OSError as e:
            raise BadInputError(f"cannot write {png_out}: {e}") from None
        click.echo(f"wrote {png_out}", err=True)
    if as_json:
        click.echo(json.dumps(c.to_dict(), indent=1, default=json_default))
        return
    from ..reports.tables import compare_view, print_wide

    print_wide(compare_view(c))


@click.command("history")
@click.option("--limit", "-n", type=click.IntRange(min=1), default=20, show_default=True, help="How many runs.")
@click.option("--branch", help="Only runs recorded on this git branch.")
@click.option("--workload", help="Only runs of this workload (trace file name without extension).")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as a JSON array.")
@_db_option
def history_cmd(limit: int, branch: str | None, workload: str | None, as_json: bool, db: Path | None) -> None:
    """List recorded advise/check runs, newest first."""
    from ..history import db as history

    runs = history.list_runs(db, limit=limit, branch=branch, workload=workload)
    if as_json:
        click.echo(json.dumps(runs, indent=1, default=json_default))
        return
    if not runs:
        click.echo(_no_runs_line(db, branch, workload))
        return
    from ..reports.tables import history_table, print_wide

    print_wide(history_table(runs))


def _no_runs_line(db: Path | None, branch: str | None, workload: str | None) -> str:
    """Why ``history`` lists nothing: no runs at all, or none that match the filters
    (then which branches / workloads the database does hold)."""
    from ..history import db as history

    path = history.resolve_db_path(db)
    total = sum(n for _, n in history.run_counts(db, "git_branch"))
    if not total:
        return f"no runs recorded in {path}"
    asked = " and ".join(x for x in (f"on branch {branch!r}" if branch else "",
                                     f"of workload {workload!r}" if workload else "") if x)
    out = f"no runs {asked} in {path}, which holds {total} run{'s' if total != 1 else ''}"
    for col, what in (("git_branch", "branches"), ("workload", "workloads")):
        if (col == "git_branch" and branch) or (col == "workload" and workload):
            counts = history.run_counts(db, col)
            out += f"; {what}: " + ", ".join(f"{v if v is not None else '(none)'} ({n})" for v, n in counts[:20])
    return out
