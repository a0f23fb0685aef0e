"""The command line: a thin skin over the library, at the top of the chain.
Imports any stage (the only package that imports click).

Each command parses its options, calls one library function and renders the result.
Library errors (:class:`~recsys_doctor.errors.RecsysDoctorError`) are translated here,
once: one line on stderr, exit code from the error class (2 = bad input), no traceback.
An option value click's own types refuse (``click.IntRange``, a number that is not one)
is one line and exit 2 as well.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

import click

from .._util import __version__
from ..errors import RecsysDoctorError

__all__ = ["main", "run"]


class _Group(click.Group):
    """Turns library errors and refused option values into one clear line and the
    documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.BadParameter as e:
            click.echo(f"recsys-doctor: error: {e.format_message()}", err=True)
            ctx.exit(2)
        except RecsysDoctorError as e:
            click.echo(f"recsys-doctor: error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("recsys-doctor: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="recsys-doctor")
def main() -> None:
    """Find out why your recommender model leaves the GPU idle, and fix it.

    \b
    Exit codes: 0 ok; 1 check found a regression, or the program profile ran failed;
    2 bad input (missing or unreadable trace, bad option), with one line on stderr saying
    what is wrong. apply exits with the status of the command it ran.
    """


def _register() -> None:
    from .advise import advise_cmd
    from .gate import check_cmd, compare_cmd, history_cmd
    from .apply import apply_cmd
    from .profile import profile_cmd
    from .whatif import whatif_cmd

    main.add_command(advise_cmd, "advise")
    main.add_command(check_cmd, "check")
    main.add_command(compare_cmd, "compare")
    main.add_command(history_cmd, "history")
    main.add_command(profile_cmd, "profile")
    main.add_command(apply_cmd, "apply")
    main.add_command(whatif_cmd, "whatif")


_register()


def run() -> None:
    """The ``recsys-doctor`` program (and ``python -m recsys_doctor``): :func:`main`, then
    the exit without the interpreter's last garbage collections over every object still
    alive (a diagnosed trace leaves millions; 0.1-0.2 s of a large trace's run). Objects
    are still freed and files closed as the interpreter tears down."""
    try:
        main(prog_name="recsys-doctor")
    finally:
        gc.freeze()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
