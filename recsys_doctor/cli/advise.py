"""``recsys-doctor advise``: diagnose one or more traces."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import click

from .._util.process import import_numpy_quietly
from ..errors import BadInputError, RecsysDoctorError
from ..options import Options, parse_set_pairs
from .._util.json import json_default

__all__ = ["advise_cmd", "parse_time", "demo_trace_path"]

_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def parse_time(text: str | None, what: str) -> int | None:
    """``'1.5s'``, ``'200ms'``, ``'35us'``, ``'1000ns'`` or a plain number of seconds -> ns."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ns|us|ms|s)?\s*", text)
    if not m:
        raise BadInputError(f"{what}: cannot read {text!r} as a time (e.g. 1.5s, 200ms, 35us, 1000ns)")
    return int(round(float(m.group(1)) * _UNITS[m.group(2) or "s"]))


def demo_trace_path() -> Path:
    """The sample trace shipped inside the package (see ``recsys_doctor/data/README.md``)."""
    return Path(str(resources.files("recsys_doctor") / "data" / "demo_wdl_serial_q4.sqlite.gz"))


@click.command("advise")
@click.argument("traces", nargs=-1, type=click.Path(path_type=Path, dir_okay=True, exists=False))
@click.option("--demo", is_flag=True, help="Diagnose the sample trace shipped with recsys-doctor.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per trace (a JSON array when several traces are given).")
@click.option("--nvtx", metavar="NAME",
              help="Restrict the analysis to the span of the NVTX ranges / annotations named NAME.")
@click.option("--start", metavar="TIME", help="Start of the analysis window on the trace's clock (e.g. 1.5s, 200ms).")
@click.option("--end", metavar="TIME", help="End of the analysis window (e.g. 2s).")
@click.option("--short-kernel-us", type=float, metavar="US",
              help=f"Kernels shorter than this are 'short' (default {Options.short_kernel_us}).")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
              help="Override any analyzer threshold (see docs/options.md), e.g. --set short_gap_us=3.")
@click.option("--html", "html_out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Also write a self-contained HTML report (plots embedded) to FILE; with a DIR or GLOB, "
                   "one report with a section per rank.")
@click.option("--md", "md_out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Also write a Markdown report to FILE, its plots as PNGs in FILE_STEM_files/.")
@click.option("--db", type=click.Path(path_type=Path, dir_okay=False), envvar="RECSYS_DOCTOR_DB",
              metavar="FILE", help="Run-history database (default: in the user data dir; env RECSYS_DOCTOR_DB).")
@click.option("--no-history", is_flag=True, help="Do not record this run in the run history.")
@click.option("--dask", "dask_address", metavar="ADDRESS",
              help="With a DIR or GLOB of rank traces: analyze them on a Dask cluster, one rank per task "
                   "(a scheduler address such as tcp://host:8786, or 'local' for a LocalCluster here). "
                   "See docs/ranks.md.")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="With a DIR or GLOB: parallel workers (local processes, or LocalCluster workers with "
                   "--dask local); default one per CPU.")
def advise_cmd(traces: tuple[Path, ...], demo: bool, as_json: bool, nvtx: str | None, start: str | None,
               end: str | None, short_kernel_us: float | None, sets: tuple[str, ...], html_out: Path | None,
               md_out: Path | None, db: Path | None, no_history: bool, dask_address: str | None,
               workers: int | None) -> None:
    """Diagnose TRACE files: Nsight Systems reports (.nsys-rep), their SQLite exports
    (.sqlite, .sqlite.gz) and PyTorch profiler JSON (.json, .json.gz).

    Finds short kernels, launch-bound gaps, CPU threads contending for one stream,
    H2D/D2H ping-pong, synchronizing calls, small grids, CUDA-graph candidates and
    communication not hidden under compute, says
    where in the model (NVTX range, thread, stream) each happens, and proposes a
    multi-stream plan.

    One DIR or GLOB (quoted, e.g. 'traces/rank*.json') of a multi-GPU job's per-rank
    traces gives a combined report instead: per-rank utilization and findings side by
    side, worst ranks first, stragglers (the ranks the others wait for at the collectives),
    and per rank the NCCL communication hidden under compute, the exposed part and its wait.
    The ranks are analyzed in parallel by local processes, or on Dask with --dask.
    Each rank is recorded in the run history (one row per rank).
    """
    import_numpy_quietly()
    if len(traces) == 1 and not demo and not dask_address and traces[0].is_file():
        # a large PyTorch profiler trace: a forked process starts decoding it now, while
        # this one imports the analyzers (the loader takes that work over)
        from ..loaders._kineto_columns import EventColumns
        from ..loaders._kineto_decode import prefetch

        prefetch(traces[0], EventColumns)
    from ..diagnose.ranks import is_multi_target

    if len(traces) == 1 and not demo and is_multi_target(traces[0]):
        if nvtx or start or end:
            raise BadInputError("--nvtx, --start and --end apply to single traces, not to a DIR or GLOB")
        options = Options().with_overrides(parse_set_pairs(sets), short_kernel_us=short_kernel_us)
        _advise_ranks(traces[0], options, as_json=as_json, md_out=md_out, html_out=html_out, db=db,
                      history_on=not no_history, dask_address=dask_address, workers=workers)
        return
    if dask_address or workers:
        raise BadInputError("--dask and --workers need one DIR or GLOB of rank traces")
    from ..diagnose.advise import advise

    paths = list(traces)
    if demo:
        paths.insert(0, demo_trace_path())
    if not paths:
        raise BadInputError("no trace given: recsys-doctor advise TRACE... (or --demo for the sample trace)")
    options = Options().with_overrides(parse_set_pairs(sets), short_kernel_us=short_kernel_us)
    start_ns, end_ns = parse_time(start, "--start"), parse_time(end, "--end")
    results = [advise(p, options, nvtx=nvtx, start_ns=start_ns, end_ns=end_ns,
                      progress=sys.stderr.isatty()) for p in paths]
    _record_and_write(results, options, db=db, history_on=not no_history, html_out=html_out, md_out=md_out)
    if as_json:
        payload = results[0].to_dict() if len(results) == 1 else [r.to_dict() for r in results]
        click.echo(json.dumps(payload, indent=1, default=json_default))
        return
    from ..reports.terminal import render_terminal

    for r in results:
        render_terminal(r)


def _record_and_write(results: list[Any], options: Options, *, db: Path | None, history_on: bool,
                      html_out: Path | None, md_out: Path | None) -> None:
    """Per trace: the HTML report (with the workload's history trend, this run included)
    and the Markdown report, then, once every report is written, the history records: a
    run whose report cannot be written (exit 2) is not recorded. Each is imported only
    when asked for (an ``advise --json --no-history`` run pays for none of them)."""
    if not (history_on or html_out or md_out):
        return
    from ..history import db as history

    html_paths = _per_trace_paths(html_out, results)
    md_paths = _per_trace_paths(md_out, results)
    rows = []
    for i, r in enumerate(results):
        key = _quiet(lambda: history.workload_key(r, options), None) if history_on or html_out else None
        row = (_quiet(lambda: history.build_row(r, "advise", options=options, key=key), None,
                      "run not recorded in the history") if history_on else None)
        rows.append(row)
        if html_out:
            from ..reports.html import write_html

            trend = _quiet(lambda: history.list_runs(db, limit=50, key=key), [],
                           "history trend left out of the report") if key else []
            write_html(r, html_paths[i], history_rows=[*trend, row] if row else trend, options=options)
            click.echo(f"wrote {html_paths[i]}", err=True)
        if md_out:
            from ..reports.markdown import write_markdown

            written = write_markdown(r, md_paths[i], options=options)
            for w in written or [md_paths[i]]:
                click.echo(f"wrote {w}", err=True)
    _record_rows([row for row in rows if row], db)


def _record_rows(rows: list[dict[str, Any]], db: Path | None) -> None:
    from ..history import db as history

    for row in rows:
        if _quiet(lambda: history.record_row(row, db), None, "run not recorded in the history") is None:
            return  # one warning is enough: the next rows would fail the same way


def _advise_ranks(target: Path, options: Options, *, as_json: bool, md_out: Path | None, html_out: Path | None,
                  db: Path | None, history_on: bool, dask_address: str | None, workers: int | None) -> None:
    """The combined many-rank view; ``--html``: one report with a section per rank;
    the history: one row per rank, as ``advise TRACE`` of that rank would record."""
    from functools import partial

    from ..history.row import git_info
    from ._rank_extras import rank_extras
    from ..diagnose.ranks import advise_ranks, expand_traces
    from ..reports.ranks import render_ranks_terminal, write_ranks_markdown

    paths = expand_traces(target)
    finish = (partial(rank_extras, html=html_out is not None, history=history_on, options=options)
              if html_out or history_on else None)
    res = advise_ranks(paths, options, dask=dask_address, workers=workers, progress=sys.stderr.isatty(),
                       finish=finish)
    if md_out:
        write_ranks_markdown(res, md_out)
        click.echo(f"wrote {md_out}", err=True)
    if html_out:
        from ..reports.html import write_ranks_html

        write_ranks_html(res, {r.path: r.extras.get("html", "") for r in res.ranks}, html_out)
        click.echo(f"wrote {html_out}", err=True)
    if history_on:
        errors = [r.extras["row_error"] for r in res.ranks if "row_error" in r.extras]
        if errors:
            click.echo(f"recsys-doctor: warning: run not recorded in the history: {errors[0]}", err=True)
        here = git_info()  # the commit and branch of this run, wherever the worker ran
        rows = [{**r.extras["row"], "git_commit": None, "git_branch": None, **here}
                for r in sorted(res.ranks, key=lambda r: (r.rank, r.path)) if "row" in r.extras]
        _record_rows(rows, db)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=1, default=json_default))
        return
    render_ranks_terminal(res)


def _quiet(fn: Any, default: Any, what: str | None = None) -> Any:
    """History is a side effect: when it fails (unwritable home, read-only or corrupt
    database) say so in one line on stderr and carry on with the diagnosis."""
    try:
        return fn()
    except (RecsysDoctorError, OSError, sqlite3.Error) as e:
        if what:
            click.echo(f"recsys-doctor: warning: {what}: {e}", err=True)
        return default


def _per_trace_paths(out: Path | None, results: list[Any]) -> list[Path]:
    """With several traces, one report each: ``report.html`` -> ``report-<trace>.html``;
    traces that share a base name (two ``report1.sqlite`` of different folders) get
    ``-2``, ``-3``... so no report overwrites another."""
    if out is None:
        return []
    if len(results) == 1:
        return [out]
    paths: list[Path] = []
    seen: dict[str, int] = {}
    for r in results:
        name = Path(str(r.trace_info["path"])).name.split(".")[0]
        seen[name] = seen.get(name, 0) + 1
        suffix = name if seen[name] == 1 else f"{name}-{seen[name]}"
        paths.append(out.with_name(f"{out.stem}-{suffix}{out.suffix}"))
    return paths
