"""Capture: run a model on the GPU under a profiler (a workload driven and measured, or a
plain script), then diagnose the trace. Imports diagnose and what lies under it.

This is the library behind ``recsys-doctor profile model.py [-- ARGS]``:

1. ``model.py`` is a plain script (profiled as it is) or a workload module with a
   ``workload()`` function (:mod:`recsys_doctor.capture.workload`; the tool drives and measures it).
2. The backend: ``nsys`` (Nsight Systems, :mod:`.nsys`) when it is found, else ``torch``
   (CUPTI through torch.profiler, :mod:`.torch_profiler`). ``auto`` picks in that order.
3. NVML is sampled every ~50 ms during the capture (:mod:`.nvml`); samples and a plot
   are kept beside the trace.
4. The trace is diagnosed by :func:`recsys_doctor.diagnose.advise.advise_trace` - restricted to the
   tool's ``measure`` NVTX range for a workload, so both backends see the same window.

Everything lands in one folder (``--out``, default ``./recsys-doctor-runs/<timestamp>``):
the trace (``trace.sqlite`` + ``trace.nsys-rep``, or ``trace.json``), ``program.log``,
``nvml.json``, ``nvml.png``, ``measurement.json`` and ``profile.json`` (the advise JSON plus
a ``capture`` object).

Modules: :mod:`.profiling` (:func:`profile`, one function a step), :mod:`.backend` (backend
choice, GPU check, output folder), :mod:`.nsys` and :mod:`.torch_profiler` (the two
backends), :mod:`.workload` (the workload protocol, :mod:`._drive` and
:mod:`._workload_types` under it), :mod:`._child` (the child process that drives a workload) and :mod:`.child_process` (its
command line, run from the parent), :mod:`.nvml` (sampling), :mod:`.treatment` (how a later stage changes the run).

Plan search, ``--apply`` and re-measurement live in :mod:`recsys_doctor.applying.apply`, above this
package: for the "after" trace they call :func:`profile` with a :class:`Treatment` (a
workload driven with runtime settings, or a plain script run with the interpreter-start
hook). Nothing here imports the apply stage.
"""

from typing import Any

# imported when first used: a workload module imports :mod:`.workload` (light) and must not
# pull in the profiling and diagnosis below it (pandas)
_LAZY = {"json_default": "recsys_doctor._util.json", "child_argv": ".child_process",
         **dict.fromkeys(("BACKENDS", "choose_backend", "default_out_dir", "require_gpu"), ".backend"),
         **dict.fromkeys(("MEASURE_RANGE", "ProfileResult", "check_workload_options", "profile"), ".profiling"),
         "Treatment": ".treatment"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ProfileResult",
    "profile",
    "choose_backend",
    "default_out_dir",
    "require_gpu",
    "child_argv",
    "check_workload_options",
    "Treatment",
    "BACKENDS",
    "MEASURE_RANGE",
    "json_default",
]
