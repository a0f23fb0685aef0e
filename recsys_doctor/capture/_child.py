"""The child process that drives a Workload for the nsys backend (and for the baseline
measurement without any profiler): loads the module, runs :func:`measure`, writes the
:class:`~recsys_doctor.workload.Measurement` as JSON.

    python -m recsys_doctor.capture._child WORKLOAD.py --result m.json [--threads N]
        [--duration S | --steps N] [--profiled nsys] [--apply RUNTIME_JSON] [-- ARGS]

``--apply``: runtime settings (a JSON object, see :func:`recsys_doctor.train_runner.make_runner`)
applied to the workload; what the runtime reports (fallbacks, notes) goes to
``RESULT.apply.json``.

Errors print one line on stderr and exit 2 (bad input) or 1 (the workload failed); the
parent turns the exit status and that line into the matching error.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import BadInputError, RecsysDoctorError, first_line
from ..workload import load_workload, measure


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="python -m recsys_doctor.capture._child")
    ap.add_argument("workload")
    ap.add_argument("--result", required=True)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--duration", type=float)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--profiled")
    ap.add_argument("--apply")
    a = ap.parse_args(argv)
    info = None
    try:
        wl = load_workload(a.workload, extra)
        run = None
        close = None
        if a.apply:
            from ..train_runner import make_runner

            try:
                runtime = json.loads(a.apply)
            except json.JSONDecodeError as e:
                raise BadInputError(f"--apply: not JSON ({e.msg})") from None
            run, close, info, wl = make_runner(wl, runtime)
        try:
            m = measure(wl, threads=a.threads, duration_s=a.duration, steps=a.steps, profiled=a.profiled, run=run)
        finally:
            if close is not None:
                close()
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


if __name__ == "__main__":  # pragma: no cover - run as a subprocess
    sys.exit(main())
