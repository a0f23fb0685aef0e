"""The child process that drives a Workload for the nsys backend (and for the baseline
measurement without any profiler): loads the module, runs :func:`measure`, writes the
:class:`~recsys_doctor.capture.workload.Measurement` as JSON.

    python -m recsys_doctor.capture._child WORKLOAD.py --result m.json [--threads N]
        [--duration S | --steps N] [--profiled nsys] [-- ARGS]

A later stage that changes the workload (``profile --apply``) runs its own module, whose
``main`` calls :func:`main` here with ``prepare_from`` (see
:class:`~recsys_doctor.capture.treatment.Treatment`); what it reports (fallbacks, notes)
goes to ``RESULT.apply.json``.

Errors print one line on stderr and exit 2 (bad input) or 1 (the workload failed); the
parent (:mod:`.child_process`, which also builds this command line) turns the exit status
and that line into the matching error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from ..errors import RecsysDoctorError, first_line
from .workload import Measurement, load_workload, measure
from .child_process import CHILD_MODULE
from .treatment import Prepared

__all__ = ["main"]


def main(argv: list[str] | None = None, *, prog: str = f"python -m {CHILD_MODULE}",
         prepare_from: Callable[[str], Callable[[Any], Prepared]] | None = None) -> int:
    """Run the child. ``prepare_from``: a later stage's hook; the child then takes
    ``--apply TEXT`` and drives the workload ``prepare_from(TEXT)`` makes of it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    a = _parser(prog, with_apply=prepare_from is not None).parse_args(argv)
    try:
        wl = load_workload(a.workload, extra)
        prepare = prepare_from(a.apply) if prepare_from is not None else None
        m, info = _measure(wl, a, prepare)
    except RecsysDoctorError as e:
        print(f"recsys-doctor: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - e.g. a CUDA error inside the runtime
        print(f"recsys-doctor: error: {first_line(e)}", file=sys.stderr, flush=True)
        return 1
    if info is not None:
        with open(a.result + ".apply.json", "w") as f:
            json.dump(info, f, default=str)
    with open(a.result, "w") as f:
        json.dump(m.to_dict(), f)
    return 0


def _parser(prog: str, with_apply: bool) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("workload")
    ap.add_argument("--result", required=True)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--duration", type=float)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--profiled")
    if with_apply:
        ap.add_argument("--apply", required=True)
    return ap


def _measure(wl: Any, a: argparse.Namespace,
             prepare: Callable[[Any], Prepared] | None) -> tuple[Measurement, dict[str, Any] | None]:
    run = close = info = None
    if prepare is not None:
        run, close, info, wl = prepare(wl)
    try:
        m = measure(wl, threads=a.threads, duration_s=a.duration, steps=a.steps, profiled=a.profiled, run=run)
    finally:
        if close is not None:
            close()
    return m, info


if __name__ == "__main__":  # pragma: no cover - run as a subprocess
    sys.exit(main())
