"""The arguments after ``--`` of the example workloads: integer options with defaults.

    a = int_options("mmoe_training.py", argv, batch=512, vocab=100_000, seed=0)
"""

from __future__ import annotations

import argparse


def int_options(prog: str, argv: list[str] | None, **defaults: int) -> argparse.Namespace:
    """Parse ``argv`` (None: no arguments) for ``--NAME N`` options, one per keyword, each
    defaulting to its value; unknown options are an error with argparse's usage line."""
    ap = argparse.ArgumentParser(prog=prog)
    for name, default in defaults.items():
        ap.add_argument(f"--{name}", type=int, default=default, metavar="N", help=f"default {default}")
    return ap.parse_args(argv or [])
