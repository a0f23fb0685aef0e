"""Capture: run a model on the GPU under a profiler, then diagnose the trace.

This is the library behind ``recsys-doctor profile model.py [-- ARGS]``:

1. ``model.py`` is a plain script (profiled as it is) or a workload module with a
   ``workload()`` function (:mod:`recsys_doctor.workload`; the tool drives and measures it).
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
backends), :mod:`._child` (the child process that drives a workload) and :mod:`.child_process` (its
command line, run from the parent), :mod:`.nvml` (sampling), :mod:`.treatment` (how a later stage changes the run).

Plan search, ``--apply`` and re-measurement live in :mod:`recsys_doctor.apply`, above this
package: for the "after" trace they call :func:`profile` with a :class:`Treatment` (a
workload driven with runtime settings, or a plain script run with the interpreter-start
hook). Nothing here imports the apply stage.
"""

from .._util.json import json_default
from .child_process import child_argv
from .backend import BACKENDS, choose_backend, default_out_dir, require_gpu
from .profiling import MEASURE_RANGE, ProfileResult, check_workload_options, profile
from .treatment import Treatment

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
