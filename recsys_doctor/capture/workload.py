"""The Workload protocol: a model the tool can drive itself, and measure exactly.

``recsys-doctor profile model.py`` accepts two kinds of ``model.py``:

* a plain script, profiled as it is (the tool only watches it);
* a *workload module*: a file with a top-level ``def workload(...)`` returning a
  :class:`Workload`. Then the tool drives the load itself (client threads, warm-up,
  measurement window), marks every phase with NVTX ranges, and measures queries/s and
  p50/p99 latency (serving) or step time (training) per call, not estimated from a trace.

The driver (:func:`measure`) is deliberately small and has two hooks for the stream-group
runtime: ``run`` replaces the per-query callable (e.g. a :func:`recsys_doctor.runtime.serve`
``ServedModel``, which takes host tensors and returns host tensors, the same contract as
the default serving query here), and ``client_context`` wraps each client thread (e.g. to
enter a stream group). Nothing here imports torch at module import time.

This module loads workload modules and is the protocol's public face; the records are in
:mod:`recsys_doctor.capture._workload_types`, the driver and its NVTX phases in
:mod:`recsys_doctor.capture._drive`.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._drive import NVTX_DOMAIN, annotate_with, measure, percentile, phase
from ._workload_types import KINDS, Measurement, Workload
from ..errors import BadInputError, RecsysDoctorError, WorkloadError, first_line

__all__ = [
    "Workload",
    "Measurement",
    "WorkloadError",
    "KINDS",
    "NVTX_DOMAIN",
    "load_workload",
    "is_workload_module",
    "measure",
    "percentile",
    "phase",
    "annotate_with",
]


# --------------------------------------------------------------------------------------
# loading


def is_workload_module(path: str | Path) -> bool:
    """True when ``path`` defines a top-level ``workload`` function or name - decided by
    parsing, not importing, so a plain script is never executed just to find out."""
    p = _check_file(path)
    try:
        tree = ast.parse(p.read_bytes(), filename=str(p))
    except SyntaxError as e:
        raise BadInputError(f"{p}: not valid Python (line {e.lineno}: {e.msg})") from None
    except ValueError as e:  # null bytes
        raise BadInputError(f"{p}: not a Python source file ({e})") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "workload":
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "workload" for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == "workload" for a in node.names):
            return True
    return False


def load_workload(path: str | Path, args: Sequence[str] = ()) -> Workload:
    """Import the module file ``path`` and call its ``workload()``.

    The module's folder goes first on ``sys.path`` (as when Python runs a script), so a
    workload can import its neighbours. ``workload`` is called with ``list(args)`` when it
    takes a parameter (the ``-- ARGS`` of the command line), else without; passing ARGS to
    one that takes none is an error rather than silently ignored.
    """
    p = _check_file(path).resolve()
    name = f"_recsys_doctor_workload_{abs(hash(str(p))):x}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise BadInputError(f"{p}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = str(p.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise BadInputError(f"{p}: not valid Python (line {e.lineno}: {e.msg})") from None
    except (KeyboardInterrupt, RecsysDoctorError):
        sys.modules.pop(name, None)
        raise
    except BaseException as e:  # noqa: BLE001 - anything the user's module raises, incl. SystemExit
        sys.modules.pop(name, None)
        raise WorkloadError(f"{p}: importing it raised {first_line(e)}") from e
    fn = getattr(module, "workload", None)
    if fn is None:
        raise BadInputError(f"{p}: has no workload() function (a plain script is profiled as it is; "
                            "see docs/profile.md for the Workload protocol)")
    if not callable(fn):
        raise BadInputError(f"{p}: workload is not a function")
    try:
        takes_args = _takes_one_positional(fn)
    except (TypeError, ValueError):
        takes_args = False
    if args and not takes_args:
        raise BadInputError(f"{p}: workload() takes no arguments, but arguments were given after --: {' '.join(args)}")
    try:
        wl = fn(list(args)) if takes_args else fn()
    except (KeyboardInterrupt, RecsysDoctorError):
        raise
    except BaseException as e:  # noqa: BLE001 - anything the user's workload() raises: a WorkloadError
        raise WorkloadError(f"{p}: workload() raised {first_line(e)}") from e
    if not isinstance(wl, Workload):
        raise BadInputError(f"{p}: workload() returned {type(wl).__name__}, expected a recsys_doctor.capture.workload.Workload")
    if not wl.name:
        wl.name = p.stem
    return wl


def _takes_one_positional(fn: Callable[..., Any]) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    return any(q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD, q.VAR_POSITIONAL) for q in params)


def _check_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such file")
    if p.is_dir():
        raise BadInputError(f"{p}: is a directory, expected a Python file (a script or a workload module)")
    return p
