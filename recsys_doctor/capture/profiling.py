"""``profile``: capture a program on the GPU, then diagnose the trace (see the package
docstring). One function a step: check the inputs, run the nsys or torch capture
(baseline first for a workload), keep the NVML samples, diagnose the analyzed window,
write ``profile.json``.

It sits above :mod:`recsys_doctor.diagnose.advise` (its result is the advise report plus how the
trace was captured) and below apply: a changed "after" run comes in as a
:class:`~recsys_doctor.capture.treatment.Treatment`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util.files import file_sha256
from .._util.json import json_default
from ..diagnose.advise import AdviseResult, advise_trace, restrict
from ..errors import BadInputError, WorkloadError
from ..options import Options
from .workload import Measurement, is_workload_module
from . import backend as _backend
from .child_process import check_workload_options, child_argv, child_env, measurement_from_json, run_child_measure
from .nvml import NvmlSampler, NvmlSamples, plot_samples
from .treatment import Treatment

__all__ = ["ProfileResult", "profile", "check_workload_options", "MEASURE_RANGE"]

#: the NVTX range of the measurement window; a workload's trace is analyzed inside it
MEASURE_RANGE = "measure"
#: CPU seconds of its child processes past which a script with no CUDA work of its own under the
#: torch backend is taken for one whose GPU work ran in them
CHILDREN_CPU_S = 0.5


@dataclass
class ProfileResult:
    """The diagnosis of one capture (``advise``) plus how it was captured (``capture``:
    backend, command, trace, out_dir, wall_s, nvml summary, measurement, baseline,
    environment)."""

    advise: AdviseResult
    capture: dict[str, Any]
    out_dir: Path
    measurement: Measurement | None = None
    baseline: Measurement | None = None
    nvml: NvmlSamples | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``advise --json`` object with a ``capture`` key added."""
        d = self.advise.to_dict()
        d["capture"] = self.capture
        return d


@dataclass
class _Run:
    """One capture's settings, as checked by :func:`_start`."""

    target: Path
    args: list[str]
    is_wl: bool
    backend: str
    out: Path
    env: dict[str, Any]
    measure_kw: dict[str, Any]
    device_index: int
    nvml: bool
    nvml_interval_s: float
    treatment: Treatment | None
    gil_stacks: bool = False

    def sampler(self) -> NvmlSampler:
        return NvmlSampler(self.device_index, self.nvml_interval_s, enabled=self.nvml)


@dataclass
class _Captured:
    """What one capture produced, before diagnosis."""

    trace: Path
    command: list[str]
    wall_s: float
    samples: NvmlSamples
    measurement: Measurement | None = None
    baseline: Measurement | None = None
    baseline_nvml: NvmlSamples | None = None
    #: CPU seconds of the processes the program started (and reaped) during the capture
    children_cpu_s: float = 0.0


def profile(target: str | os.PathLike[str], args: tuple[str, ...] | list[str] = (), *, backend: str = "auto",
            out_dir: str | os.PathLike[str] | None = None, threads: int | None = None,
            duration_s: float | None = None, steps: int | None = None, baseline: bool = True,
            nvml: bool = True, nvml_interval_s: float = 0.05, nvtx: str | None = None,
            options: Options | None = None, device_index: int = 0,
            treatment: Treatment | None = None, host_sample: bool = False,
            gil_stacks: bool = False) -> ProfileResult:
    """Capture ``target`` on the GPU and diagnose it; see the package docstring.

    ``threads``/``duration_s``/``steps`` override a workload's settings (an error for a
    plain script, which the tool does not drive). ``baseline``: for a workload, first
    measure it without any profiler attached, so the reported queries/s and latencies are
    not inflated by tracing overhead (the profiled run's own numbers are kept too).
    ``nvtx``: analyze only inside that range (default: ``measure`` for a workload, the
    whole trace for a script).
    ``treatment``: how to run the program changed (the "after" run of ``profile --apply``:
    runtime settings for a workload, a plan applied through the interpreter-start hook
    for a script); it must be of the target's kind.
    ``host_sample``: first run the program once more without a GPU profiler, sampled by
    py-spy (:func:`~.host_sample.host_profile`, into ``OUT/host``): which Python code
    holds the host, per client thread (``capture["host_sampling"]``).
    ``gil_stacks``: trace OS-runtime calls with their native call stacks too (nsys only,
    :data:`~.nsys.GIL_STACK_FLAGS`): the ``gil-handoffs`` finding names who gave the GIL up.
    """
    t_start = time.perf_counter()
    run = _start(Path(target), list(args), backend=backend, out_dir=out_dir, device_index=device_index,
                 measure_kw={"threads": threads, "duration_s": duration_s, "steps": steps}, nvml=nvml,
                 nvml_interval_s=nvml_interval_s, treatment=treatment, gil_stacks=gil_stacks)
    host = None
    if host_sample:
        from .host_sample import host_profile

        host = host_profile(run.target, run.args, out_dir=run.out / "host", **run.measure_kw)
    cap = _capture_nsys(run, baseline) if run.backend == "nsys" else _capture_torch(run, baseline)
    files = _save_samples(run, cap)
    window = nvtx if nvtx is not None else (MEASURE_RANGE if run.is_wl else None)
    res, used = _diagnose(cap.trace, options, window, required=nvtx is not None)
    _check_children_traced(run, cap, res)
    record = _capture_record(run, cap, backend_requested=backend, window=used, files=files,
                             wall_s=time.perf_counter() - t_start)
    if host is not None:
        record["host_sampling"] = host["host_sampling"]
    result = ProfileResult(advise=res, capture=record, out_dir=run.out, measurement=cap.measurement,
                           baseline=cap.baseline, nvml=cap.samples)
    (run.out / "profile.json").write_text(json.dumps(result.to_dict(), indent=1, default=json_default))
    return result


def _start(target: Path, args: list[str], *, backend: str, out_dir: str | os.PathLike[str] | None,
           device_index: int, measure_kw: dict[str, Any], nvml: bool, nvml_interval_s: float,
           treatment: Treatment | None, gil_stacks: bool = False) -> _Run:
    """Check everything that can be checked before running anything; make the folder."""
    is_wl = is_workload_module(target)
    check_workload_options(target, is_wl, **measure_kw)
    kind = "workload" if is_wl else "script"
    if treatment is not None and treatment.target_kind != kind:
        raise BadInputError(f"{target}: runtime settings apply to a workload module; use a plan file for a script"
                            if not is_wl else
                            f"{target}: a plan file applies to a plain script; a workload takes runtime settings")
    chosen = _backend.choose_backend(backend)
    if gil_stacks and chosen != "nsys":
        raise BadInputError("--gil-stacks needs Nsight Systems (the OS-runtime call stacks are its): "
                            "install nsys or use --backend nsys")
    env = _backend.require_gpu(device_index)
    out = Path(out_dir) if out_dir is not None else _backend.default_out_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"--out {out}: cannot create ({e.strerror or e})") from None
    env.update(_backend.versions())
    return _Run(target, args, is_wl, chosen, out, env, measure_kw, device_index, nvml, nvml_interval_s, treatment,
                gil_stacks)


def _capture_nsys(run: _Run, baseline: bool) -> _Captured:
    """The program in a child process under ``nsys profile``; a workload's child writes
    ``measurement.json``, and its baseline is another child without nsys."""
    from .nsys import find_nsys, run_nsys
    from .term_exit import capture_env

    nsys = find_nsys()
    run.env["nsys"] = str(nsys)
    run.env["nsys_version"] = _backend.nsys_version(nsys)
    base = base_nvml = None
    if run.is_wl:
        if baseline:
            bres = run.out / "baseline.json"
            with run.sampler() as bs:
                base = run_child_measure(child_argv(run.target, bres, run.args, profiled=None, **run.measure_kw),
                                         bres, run.out / "program.log")
            base_nvml = bs.result
        program = child_argv(run.target, run.out / "measurement.json", run.args, profiled="nsys",
                             treatment=run.treatment, **run.measure_kw)
    else:
        program = [sys.executable, str(run.target), *run.args]
    penv = child_env()
    if run.treatment is not None and run.treatment.script_env is not None:
        penv = run.treatment.script_env(penv, run.out / "hook")
    penv = capture_env(penv, run.out / "term_exit")  # the processes it starts keep their trace when terminated
    sampler = run.sampler()
    t_cap = time.perf_counter()
    with sampler:
        trace, command = run_nsys(program, run.out, env=penv, nsys=nsys, gil_stacks=run.gil_stacks)
    wall = time.perf_counter() - t_cap
    meas = measurement_from_json(run.out / "measurement.json") if run.is_wl else None
    return _Captured(trace, command, wall, sampler.result, meas, base, base_nvml)


def _capture_torch(run: _Run, baseline: bool) -> _Captured:
    """The program in this process under torch.profiler (CUPTI)."""
    from .torch_profiler import profile_script, require_torch_cuda

    require_torch_cuda()
    command = ["<in-process torch.profiler>", str(run.target), *run.args]
    if run.is_wl:
        return _torch_workload(run, baseline, command)
    t = run.treatment
    undo = t.activate() if t is not None and t.activate is not None else None
    sampler = run.sampler()
    t_cap = time.perf_counter()
    children = _children_cpu_s()
    try:
        with sampler:
            trace = profile_script(run.target, run.args, run.out)
    finally:
        if undo is not None:
            undo()
    return _Captured(trace, command, time.perf_counter() - t_cap, sampler.result,
                     children_cpu_s=_children_cpu_s() - children)


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _check_children_traced(run: _Run, cap: _Captured, res: AdviseResult) -> None:
    """The torch backend traces this process only: a script that ran no CUDA work here while
    the processes it started worked (a ``multiprocessing`` pool scoring on the GPU) gets one
    line saying so, not a diagnosis of an empty trace."""
    if run.backend != "torch" or run.is_wl or cap.children_cpu_s < CHILDREN_CPU_S:
        return
    s = res.summary
    if s.get("kernels") or s.get("memcpys") or s.get("graph_executions"):
        return
    raise WorkloadError(f"{run.target} ran no CUDA work in its own process, while the processes it started used "
                        f"{cap.children_cpu_s:.1f} s of CPU: the torch backend traces this process only; profile it "
                        "with Nsight Systems (--backend nsys), which traces the processes a program starts")


def _torch_workload(run: _Run, baseline: bool, command: list[str]) -> _Captured:
    """A workload driven here: the baseline measured without the profiler, then the
    profiled run (changed by the treatment, if any)."""
    from .workload import load_workload, measure
    from .torch_profiler import profile_workload

    wl = load_workload(run.target, run.args)
    base = base_nvml = None
    if baseline:
        with run.sampler() as bs:
            base = measure(wl, **run.measure_kw)
        base_nvml = bs.result
    call = close = None
    if run.treatment is not None and run.treatment.prepare is not None:
        call, close, _info, wl = run.treatment.prepare(wl)
    sampler = run.sampler()
    t_cap = time.perf_counter()
    try:
        with sampler:
            trace, meas = profile_workload(wl, run.out, **run.measure_kw, **({"run": call} if call is not None else {}))
    finally:
        if close is not None:
            close()
    wall = time.perf_counter() - t_cap
    (run.out / "measurement.json").write_text(json.dumps(meas.to_dict()))
    return _Captured(trace, command, wall, sampler.result, meas, base, base_nvml)


def _save_samples(run: _Run, cap: _Captured) -> dict[str, Any]:
    """``baseline.json``, ``nvml.json``, ``nvml.png``, ``nvml_baseline.json``; returns the
    plot's path (None without samples or matplotlib)."""
    if cap.baseline is not None:
        (run.out / "baseline.json").write_text(json.dumps(cap.baseline.to_dict()))
    cap.samples.save(run.out / "nvml.json")
    plot = plot_samples(cap.samples, run.out / "nvml.png", title=f"{run.target.name} under {run.backend}: NVML")
    if cap.baseline_nvml is not None:
        cap.baseline_nvml.save(run.out / "nvml_baseline.json")
    return {"nvml_samples": str(run.out / "nvml.json"), "nvml_plot": str(plot) if plot else None}


def _capture_record(run: _Run, cap: _Captured, *, backend_requested: str, window: str | None,
                    files: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The ``capture`` object of ``profile --json`` (docs/profile.md, "Output")."""
    meas, base, base_nvml = cap.measurement, cap.baseline, cap.baseline_nvml
    return {
        "backend": run.backend,
        "backend_requested": backend_requested,
        "target": str(run.target),
        "target_kind": "workload" if run.is_wl else "script",
        "args": list(run.args),
        "command": [str(c) for c in cap.command],
        "trace": str(cap.trace),
        "out_dir": str(run.out),
        "window": window,
        "capture_wall_s": round(cap.wall_s, 3),
        "wall_s": round(wall_s, 3),
        # NVML over the measurement window for a workload (start-up excluded), else the run
        "nvml": cap.samples.summary(meas.window_epoch if meas else None),
        "nvml_whole_run": cap.samples.summary(),
        **files,
        "measurement": meas.to_dict() if meas else None,
        # torch backend: CPU seconds of the processes the program started, whose GPU work is not traced
        "children_cpu_s": round(cap.children_cpu_s, 3) if run.backend == "torch" else None,
        "baseline": ({"measurement": base.to_dict(),
                      "nvml": base_nvml.summary(base.window_epoch) if base_nvml else None}
                     if base else None),
        "environment": run.env,
    }


def _diagnose(trace_path: Path, options: Options | None, window: str | None,
              required: bool) -> tuple[AdviseResult, str | None]:
    """Load and diagnose; restrict to the NVTX range ``window`` when the trace has it
    (an error only when the user asked for that range)."""
    from ..loaders import load

    trace = load(trace_path)
    trace.meta.setdefault("sha256", file_sha256(trace_path))
    used = None
    if window is not None:
        try:
            trace = restrict(trace, nvtx=window)
            used = window
        except BadInputError:
            if required:
                raise
    res = advise_trace(trace, options)
    if used is not None:
        res.trace_info["nvtx"] = used
    return res, used
