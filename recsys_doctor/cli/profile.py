"""``recsys-doctor profile``: run a model on the GPU under a profiler and diagnose it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .._util.format import fixed
from ..errors import BadInputError
from ..options import Options, parse_set_pairs

__all__ = ["profile_cmd", "render_capture", "render_apply", "render_host"]


@click.command("profile")
@click.argument("model", type=click.Path(path_type=Path, dir_okay=True, exists=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--backend", type=click.Choice(["auto", "nsys", "torch"]), default="auto", show_default=True,
              help="nsys: Nsight Systems; torch: CUPTI through torch.profiler; auto: nsys when found.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Folder for the trace, NVML samples and plot, logs (default ./recsys-doctor-runs/<timestamp>).")
@click.option("--json", "as_json", is_flag=True, help="Print the advise JSON plus a 'capture' object.")
@click.option("--threads", type=click.IntRange(min=1), metavar="N",
              help="Workload: client threads (overrides its concurrency).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Workload: length of the measurement window.")
@click.option("--steps", type=click.IntRange(min=1), metavar="N",
              help="Workload: exactly N calls per client instead of --duration.")
@click.option("--baseline/--no-baseline", default=True, show_default=True,
              help="Workload: also measure it once without any profiler attached (not with --apply, which always does).")
@click.option("--no-nvml", is_flag=True, help="Do not sample GPU utilization with NVML.")
@click.option("--nvtx", metavar="NAME",
              help="Analyze only the span of the NVTX ranges named NAME (default for a workload: 'measure'; "
                   "not with --apply).")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
              help="Override any analyzer threshold (see docs/options.md).")
@click.option("--host-sample", is_flag=True,
              help="Also run the program once sampled by py-spy (no GPU profiler): per client thread, the share "
                   "of time it holds the GIL and its top Python frames. Works without a GPU (then only this "
                   "runs). Needs py-spy (pip install 'recsys-doctor[host]') and ptrace permission.")
@click.option("--gil-stacks", is_flag=True,
              help="Also trace OS-runtime calls with their native call stacks (nsys -t osrt, waits of 10 us or "
                   "more, DWARF-unwound): the gil-handoffs finding then names which calls make the client threads "
                   "wait for the GIL. The program runs slower under it; nsys only.")
@click.option("--apply", "do_apply", is_flag=True,
              help="Then search plans (what-if estimate from the trace), measure the best --top-k with the "
                   "stream-group runtime, keep the best measured (a plain script's only where it beats the "
                   "script as it is; a win under 1.5x must win a second run too, and is reported by the mean of both; a plain script is compared by "
                   "its last JSON line's qps or step_ms, or, where it prints none, by its model calls a second "
                   "as the hook counts them); write plan.json, apply.json, compare.html.")
@click.option("--top-k", type=click.IntRange(min=1), default=3, show_default=True, metavar="K",
              help="--apply: how many candidate plans to measure (the advisor's own plan is always measured).")
@click.option("--p99-ms", "p99_ms", type=click.FloatRange(min=0, min_open=True), metavar="MS",
              help="--apply (serving): a latency budget: keep the plan with the most queries/s among those "
                   "measured with p99 <= MS (plans with dynamic batching are among the candidates).")
@click.option("--bucket-costs", "bucket_costs", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="--apply (serving): rank the batching plans by measured GPU time per bucket (the "
                   "bucket_gpu_us.json an earlier --apply wrote; see `recsys-doctor whatif --help`).")
@click.option("--history/--no-history", default=True, show_default=True,
              help="--apply: record the after-run in the history database (an error without --apply).")
@click.option("--db", "db_path", type=click.Path(path_type=Path, dir_okay=False),
              help="--apply: history database (default: the user data folder).")
def profile_cmd(model: Path, args: tuple[str, ...], backend: str, out_dir: Path | None, as_json: bool,
                threads: int | None, duration: float | None, steps: int | None, baseline: bool,
                no_nvml: bool, nvtx: str | None, sets: tuple[str, ...], host_sample: bool, gil_stacks: bool,
                do_apply: bool,
                top_k: int, p99_ms: float | None, bucket_costs: Path | None, history: bool,
                db_path: Path | None) -> None:
    """Run MODEL (a Python file) on the GPU under a profiler and diagnose the trace.

    MODEL is a plain script (run as `python MODEL ARGS`, profiled as it is) or a
    workload module with a `workload()` function returning a recsys_doctor Workload: the
    tool then drives it (warm-up, client threads, measurement window, NVTX ranges) and
    measures queries/s and p50/p99 latency, or step time. Pass the program's own
    arguments after `--`:

    \b
        recsys-doctor profile examples/wdl_workload.py --threads 8
        recsys-doctor profile examples/wdl_workload.py --threads 64 --apply --p99-ms 8
        recsys-doctor profile train.py -- --epochs 1

    Prints the same report as `advise`, plus the backend used, NVML utilization and the
    measured numbers.
    """
    from ..capture import profile

    options = Options().with_overrides(parse_set_pairs(sets))
    given = _given(click.get_current_context())
    if host_sample and do_apply:
        raise BadInputError("--host-sample does not go with --apply; run profile --host-sample on its own")
    if gil_stacks and do_apply:
        raise BadInputError("--gil-stacks does not go with --apply (its call stacks slow every measured run); "
                            "run profile --gil-stacks on its own")
    if host_sample and not gil_stacks and not _has_gpu():
        _host_only(model, args, out_dir=out_dir, threads=threads, duration=duration, steps=steps, as_json=as_json)
        return
    if do_apply:
        # the plan search measures the workload's own window with and without a profiler:
        # options that would change that are refused rather than parsed and dropped
        for opt in ("nvtx", "baseline"):
            if opt in given:
                flag = "--nvtx" if opt == "nvtx" else "--baseline/--no-baseline"
                raise BadInputError(f"{flag} does not go with --apply (it analyzes the workload's 'measure' "
                                    "window and always measures the baseline without a profiler)")
        from .whatif import costs_with_buckets

        _run_apply(model, args, backend=backend, out_dir=out_dir, threads=threads, duration=duration, steps=steps,
                   nvml=not no_nvml, options=options, top_k=top_k, history=history, db_path=db_path,
                   as_json=as_json, p99_ms=p99_ms, costs=costs_with_buckets(bucket_costs))
        return
    if given & {"top_k", "db_path", "history", "p99_ms", "bucket_costs"}:
        raise BadInputError("--top-k, --p99-ms, --bucket-costs, --history/--no-history and --db go with --apply")
    res = profile(model, args, backend=backend, out_dir=out_dir, threads=threads, duration_s=duration,
                  steps=steps, baseline=baseline, nvml=not no_nvml, nvtx=nvtx, options=options,
                  host_sample=host_sample, gil_stacks=gil_stacks)
    _report(res.to_dict(), as_json, res)


def _has_gpu() -> bool:
    from ..capture.backend import has_gpu

    return has_gpu()


def _host_only(model: Path, args: tuple[str, ...], *, out_dir: Path | None, threads: int | None,
               duration: float | None, steps: int | None, as_json: bool) -> None:
    """``--host-sample`` on a machine without a GPU: only the py-spy run."""
    from rich.console import Console

    from ..capture.backend import default_out_dir
    from ..capture.host_sample import host_profile

    out = out_dir if out_dir is not None else default_out_dir()
    doc = host_profile(model, args, out_dir=out, threads=threads, duration_s=duration, steps=steps)
    if as_json:
        click.echo(json.dumps({"capture": None, "no_gpu": True, **doc}, indent=1))
        return
    click.echo("recsys-doctor: no GPU here: only the host sampling ran (no GPU capture)", err=True)
    render_host(doc["host_sampling"], Console())


def _report(doc: dict[str, Any], as_json: bool, profiled: Any, applied: dict[str, Any] | None = None) -> None:
    """``--json``: ``doc``; else the advise report of ``profiled``, how it was captured and,
    with ``--apply``, the plan search and the before/after table (``applied``)."""
    import sys

    from rich.console import Console

    from ..capture import json_default
    from ..reports.terminal import render_terminal

    if as_json:
        click.echo(json.dumps(doc, indent=1, default=json_default))
        return
    console = Console()
    render_terminal(profiled.advise, console)
    render_capture(profiled.capture, console)
    if applied is not None:
        render_apply(applied, console)
    sys.stdout.flush()


def _given(ctx: click.Context) -> set[str]:
    """The options the user wrote on the command line (not defaults)."""
    return {name for name in ctx.params
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}


def _run_apply(model: Path, args: tuple[str, ...], *, backend: str, out_dir: Path | None, threads: int | None,
               duration: float | None, steps: int | None, nvml: bool, options: Options, top_k: int,
               history: bool, db_path: Path | None, as_json: bool, p99_ms: float | None, costs: Any) -> None:
    from ..applying.apply import apply_workload

    def say(msg: str) -> None:
        if not as_json:
            click.echo(f"recsys-doctor: {msg}", err=True)

    res, before, after = apply_workload(model, args, backend=backend, out_dir=out_dir, threads=threads,
                                        duration_s=duration, steps=steps, top_k=top_k, nvml=nvml, options=options,
                                        history=history, db_path=db_path, progress=say, p99_ms=p99_ms,
                                        costs=costs)
    d = res.to_dict()
    _report(d, as_json, before, d)


def render_apply(d: dict[str, Any], console: Any) -> None:
    """The --apply part of the report: candidates (predicted vs measured), before/after,
    the evidence (syncs per query, GPU busy, what the script hook took over per line)."""
    from rich.table import Table

    from ..reports.apply_evidence import render_evidence
    from ._tables import Footnotes

    train = d["kind"] == "train"
    key, unit = ("step_ms", "step ms") if train else ("qps", "queries/s")
    budget = d.get("p99_budget_ms")
    title = "Plan search: predicted vs measured" + (f" (p99 budget {budget:g} ms)" if budget else "")
    console.print(title, soft_wrap=True, markup=False, highlight=False)
    t = Table(pad_edge=False)
    short = "step ms" if train else "q/s"
    cols = ["plan", f"pred.\n{short}", f"meas.\n{short}", "pred.\np99 ms", "meas.\np99 ms", "bound", "notes"]
    if budget:
        cols.insert(5, "p99 <=\nbudget")
    for c in cols:  # only the plan wraps: the numbers stay whole on 80 columns, the notes go below
        t.add_column(c, no_wrap=c != "plan", min_width=14 if c == "plan" else None,
                     justify="right" if "\n" in c and "budget" not in c else "left")
    notes = Footnotes()
    for c in d["candidates"]:
        if c["measured"] is None and c["error"] is None:
            continue
        p, m = c["predicted"], c["measured"] or {}
        row = [c["label"], fixed(p.get(key), "", 1), fixed(m.get(key), "", 1), fixed(p.get("p99_ms"), "", 3),
               fixed(m.get("p99_ms"), "", 3), str(p.get("bound")), notes.cite([c["error"]] if c["error"] else
                                                                              p.get("notes") or [])]
        if budget:
            mp = m.get("p99_ms")
            row.insert(5, "-" if mp is None else ("yes" if mp <= budget else "no"))
        t.add_row(*row)
    console.print(t)
    console.print(f"pred.: the what-if estimate; meas.: measured ({unit})", markup=False, highlight=False)
    notes.print(console)
    b = Table(title=f"Before / after (chosen: {(d.get('chosen') or {}).get('label', '-')})", title_justify="left")
    for c in ("metric", "before", "after", "after / before"):
        b.add_column(c)
    for r in d["table"]:
        b.add_row(r["metric"], fixed(r["before"], "", 3), fixed(r["after"], "", 3), fixed(r["ratio"], "x", 3))
    console.print(b)
    render_evidence(d.get("evidence"), console)
    for n in d.get("notes") or []:
        console.print(f"note: {n}")
    files = d.get("files") or {}
    console.print(f"plan: {files.get('plan')}  report: {files.get('html', '-')}  "
                  f"result: {files.get('apply', '-')}  ({d.get('wall_s', 0):.1f} s)")
    if files.get("bucket_costs"):
        console.print(f"bucket costs: {files['bucket_costs']} (GPU us a batch per bucket, measured with "
                      f"{d.get('bucket_costs_of')}): price batching from them with recsys-doctor whatif TRACE "
                      f"--bucket-costs {files['bucket_costs']}", soft_wrap=True)


def render_host(h: dict[str, Any], console: Any) -> None:
    """Which Python code holds the host: per thread its GIL and running shares, its share
    importing modules and its top frames outside imports (py-spy snapshots), or the one line
    saying why there are none."""
    from rich.table import Table

    if not h.get("threads"):
        console.print(f"host sampling: {h.get('reason') or 'no snapshots'}")
        return
    t = Table(title=f"Host: which Python code holds it ({h['snapshots']} py-spy snapshots, every "
                    f"{h['interval_s']:g} s)", title_justify="left")
    for c in ("thread", "holds GIL", "running", "top frames (share of snapshots)"):
        t.add_column(c)
    for th in h["threads"]:
        imp = th.get("import_share") or 0.0
        frames = "\n".join(([f"(importing modules: start-up) {imp * 100:.0f}%"] if imp >= 0.005 else [])
                           + [f"{f['frame']} {f['share'] * 100:.0f}%" for f in th["top_frames"]]) or "-"
        t.add_row(f"{th['name']} ({th['tid']})", f"{th['gil_share'] * 100:.0f}%", f"{th['active_share'] * 100:.0f}%",
                  frames)
    console.print(t)
    if h.get("reason"):
        console.print(f"host sampling: {h['reason']}")


def render_capture(cap: dict[str, Any], console: Any) -> None:
    """The capture part of the report: backend, files, NVML, measured numbers."""
    from rich.table import Table

    from ..capture.profiling import CHILDREN_CPU_S

    t = Table(title="Capture", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("backend", f"{cap['backend']} ({'Nsight Systems' if cap['backend'] == 'nsys' else 'CUPTI via torch.profiler'})"
              + ("" if cap.get("backend_requested") in (None, cap["backend"]) else f", asked for {cap['backend_requested']}"))
    t.add_row("command", " ".join(cap.get("command", [])))
    t.add_row("trace", str(cap.get("trace")))
    if cap.get("window"):
        t.add_row("analyzed", f"NVTX range {cap['window']!r}")
    t.add_row("wall", f"{fixed(cap.get('wall_s'), ' s')} total, capture {fixed(cap.get('capture_wall_s'), ' s')}")
    nv = cap.get("nvml") or {}
    if nv.get("n"):
        t.add_row("NVML util (" + ("measure window" if nv.get("window_epoch") else "whole capture") + ")",
                  f"mean {fixed(nv.get('util_mean'), '%', 1)}, p50 {fixed(nv.get('util_p50'), '%', 0)}, "
                  f"max {fixed(nv.get('util_max'), '%', 0)}; SM clock {fixed(nv.get('sm_clock_mean_mhz'), ' MHz', 0)}; "
                  f"memory peak {fixed(nv.get('mem_used_max_mib'), ' MiB', 0)} ({nv['n']} samples)")
        if cap.get("nvml_plot"):
            t.add_row("NVML plot", str(cap["nvml_plot"]))
    else:
        t.add_row("NVML", f"no samples: {nv.get('reason', 'unknown')}")
    for label, m, nvb in (("measured (no profiler)", (cap.get("baseline") or {}).get("measurement"),
                           (cap.get("baseline") or {}).get("nvml")),
                          (f"measured under {cap['backend']}", cap.get("measurement"), None)):
        if not m:
            continue
        if m["kind"] == "serve":
            text = (f"{fixed(m['qps'], ' queries/s', 1)}, p50 {fixed(m['p50_ms'], ' ms', 3)}, "
                    f"p99 {fixed(m['p99_ms'], ' ms', 3)} ({m['calls']} queries, {m['threads']} threads, "
                    f"{fixed(m['wall_s'], ' s')})")
        else:
            text = (f"step {fixed(m['step_ms'], ' ms', 3)}, p50 {fixed(m['p50_ms'], ' ms', 3)}, "
                    f"p99 {fixed(m['p99_ms'], ' ms', 3)} ({m['calls']} steps)")
            if m.get("losses"):
                text += f"; loss {m['losses'][0]:.4f} -> {m['losses'][-1]:.4f}"
        if nvb and nvb.get("n"):
            text += f"; NVML util mean {fixed(nvb.get('util_mean'), '%', 1)}, p50 {fixed(nvb.get('util_p50'), '%', 0)}"
        t.add_row(label, text)
    if (cap.get("children_cpu_s") or 0) >= CHILDREN_CPU_S:
        t.add_row("not traced", f"the processes the program started ({fixed(cap['children_cpu_s'], ' s')} of CPU): "
                                "the torch backend traces this process only; nsys traces them")
    t.add_row("files", str(cap.get("out_dir")))
    console.print(t)
    if cap.get("host_sampling") is not None:
        render_host(cap["host_sampling"], console)
