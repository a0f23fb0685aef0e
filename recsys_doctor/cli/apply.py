"""``recsys-doctor apply PLAN -- COMMAND``: run a program with a plan applied, unmodified."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import click

from ..errors import BadInputError

__all__ = ["apply_cmd"]


class _ApplyCommand(click.Command):
    """``apply``'s own options (all flags) go anywhere before the command:
    ``apply plan.json --compare -- python x.py`` as well as ``apply --compare plan.json --
    python x.py``. COMMAND is everything after ``--`` or, without one, from the first word
    after PLAN that is not one of apply's flags; its own options (``--json``...) stay its own."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        flags = {o for p in self.get_params(ctx) for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        if "--" not in args:
            words = [i for i, a in enumerate(args) if a not in flags]
            if len(words) > 1:  # PLAN, then the command
                args = [*args[:words[1]], "--", *args[words[1]:]]
        head = args[:args.index("--")] if "--" in args else args
        for a in head:
            if a.startswith("-") and a not in flags:
                raise click.NoSuchOption(a, ctx=ctx)
        ctx.allow_interspersed_args = True
        return super().parse_args(ctx, args)


@click.command("apply", cls=_ApplyCommand, context_settings={"ignore_unknown_options": True})
@click.argument("plan", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--compare", is_flag=True,
              help="Run COMMAND twice, as it is and with the plan, and print both of its measurements "
                   "(its last JSON output line with qps or step_ms; where it prints none, its model calls a "
                   "second as the hook counts them).")
@click.option("--json", "as_json", is_flag=True, help="With --compare: print the before/after as JSON.")
def apply_cmd(plan: Path, command: tuple[str, ...], compare: bool, as_json: bool) -> None:
    """Run COMMAND (usually `python script.py ARGS`) with PLAN applied at interpreter start.

    \b
        recsys-doctor apply plan.json -- python serve.py --threads 8
        recsys-doctor apply plan.json --compare -- python serve.py

    Options go before the --; what follows it is COMMAND, passed on as it is.

    PLAN is the plan.json of `profile --apply` (or an `advise --json` output). No code
    change: a generated sitecustomize starts the stream-group runtime in every Python
    started by COMMAND: each client thread gets a group's stream, and top-level model
    calls are replayed as CUDA graphs where the plan says so (eager fallback, reason on
    stderr). With graphs on, a thread that copies the same pinned tensors with
    .to("cuda", non_blocking=True) into each model call gets a graph of its own that makes
    those copies too (RECSYS_DOCTOR_THREAD_GRAPHS=0: off). Exit status: COMMAND's.
    """
    from ..applying.apply import before_after_rows, read_plan, run_script
    from ..applying.script_hook import hook_env, hook_folder, run_as_is, script_env

    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise BadInputError("give the command to run after --, e.g. recsys-doctor apply plan.json -- python serve.py")
    if as_json and not compare:
        raise BadInputError("--json goes with --compare (without it the command's own output is printed as it is)")
    read_plan(plan)
    why = _inactive_reason()
    if why:
        click.echo(f"recsys-doctor: warning: the plan is not active here ({why}); "
                   "the command runs unchanged", err=True)
    if not compare:
        with hook_env(plan) as env:  # the generated hook folder is removed afterwards
            try:
                rc = subprocess.call(list(command), env=env)
            except FileNotFoundError:
                raise BadInputError(f"cannot run {command[0]!r}: no such program") from None
            raise SystemExit(rc)
    with hook_folder() as d:  # (removed afterwards)
        # a command that prints no measurement is measured by the hook's count of its model calls, both runs
        before, _, metered = run_as_is(command, d / "as_is")
        after, _ = run_script(command, env=script_env(plan, hook_dir=d, stats_path=d / "stats.json", meter=metered))
    rows = before_after_rows(before, after)
    if as_json:
        click.echo(json.dumps({"before": before, "after": after, "table": rows}, indent=1))
        return
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        click.echo(f"{r['metric']:<22} {r['before']!s:>12} -> {r['after']!s:>12}  ({ratio})")


def _inactive_reason() -> str | None:
    """Why the plan cannot take effect in this Python (no PyTorch, no CUDA device), or
    None. The runtime needs both; without them the hook leaves the program as it is."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is available to PyTorch"
    except Exception as e:  # noqa: BLE001 - a broken torch install is the same: nothing to apply to
        return f"PyTorch cannot start CUDA: {e}"
    return None
