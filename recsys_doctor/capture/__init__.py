"""Capture: run a model on the GPU under a profiler, then diagnose the trace.

This is the library behind ``recsys-doctor profile model.py [-- ARGS]``:

1. ``model.py`` is a plain script (profiled as it is) or a workload module with a
   ``workload()`` function (:mod:`recsys_doctor.workload`; the tool drives and measures it).
2. The backend: ``nsys`` (Nsight Systems, :mod:`.nsys`) when it is found, else ``torch``
   (CUPTI through torch.profiler, :mod:`.torch_profiler`). ``auto`` picks in that order.
3. NVML is sampled every ~50 ms during the capture (:mod:`.nvml`); samples and a plot
   are kept beside the trace.
4. The trace is diagnosed by :func:`recsys_doctor.advise.advise_trace` - restricted to the
   tool's ``measure`` NVTX range for a workload, so both backends see the same window.

Everything lands in one folder (``--out``, default ``./recsys-doctor-runs/<timestamp>``):
the trace (``trace.sqlite`` + ``trace.nsys-rep``, or ``trace.json``), ``program.log``,
``nvml.json``, ``nvml.png``, ``measurement.json`` and ``profile.json`` (the advise JSON plus
a ``capture`` object).

Plan search, ``--apply`` and re-measurement live in :mod:`recsys_doctor.apply`; they use
:func:`profile` with ``apply=`` (a workload driven with runtime settings) or
``apply_plan=`` (a plain script run with the interpreter-start hook) for the "after" trace.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .._json import json_default
from ..advise import AdviseResult, advise_trace, restrict
from ..errors import BadInputError, NsysNotFoundError
from ..options import Options
from ..workload import Measurement, is_workload_module
from .nvml import NvmlSampler, NvmlSamples, gpu_environment, plot_samples

__all__ = [
    "ProfileResult",
    "profile",
    "choose_backend",
    "default_out_dir",
    "require_gpu",
    "child_argv",
    "check_workload_options",
    "BACKENDS",
    "MEASURE_RANGE",
    "json_default",
]

BACKENDS = ("auto", "nsys", "torch")
#: the NVTX range of the measurement window; a workload's trace is analyzed inside it
MEASURE_RANGE = "measure"


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


def choose_backend(backend: str = "auto") -> str:
    """``nsys`` or ``torch``. ``auto`` takes nsys when :func:`find_nsys` finds it;
    ``nsys`` without one raises :class:`NsysNotFoundError`."""
    from .nsys import find_nsys

    if backend not in BACKENDS:
        raise BadInputError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return "torch"
    try:
        find_nsys()
    except NsysNotFoundError as e:
        if backend == "nsys":
            why = str(e).split(";")[0].replace(", needed to read a .nsys-rep", "")
            raise NsysNotFoundError(f"--backend nsys: {why}; install Nsight Systems or set RECSYS_DOCTOR_NSYS "
                                    "to the nsys binary, or use --backend torch") from None
        return "torch"
    return "nsys"


def default_out_dir() -> Path:
    """``./recsys-doctor-runs/<YYYYmmdd-HHMMSS>`` (a suffix is added if it exists)."""
    base = Path("recsys-doctor-runs") / time.strftime("%Y%m%d-%H%M%S")
    p, i = base, 1
    while p.exists():
        i += 1
        p = base.with_name(f"{base.name}-{i}")
    return p


def require_gpu(device_index: int = 0) -> dict[str, Any]:
    """The GPU environment (name, driver) or :class:`BadInputError` when NVML sees no GPU."""
    env = gpu_environment(device_index)
    if int(env.get("gpu_count", 0)) > device_index:
        return env
    why = env.get("nvml") or f"{env.get('gpu_count', 0)} GPUs"
    raise BadInputError(f"no NVIDIA GPU found ({why}): profile runs the model on a GPU; "
                        "to diagnose an existing trace use `recsys-doctor advise TRACE`")


def check_workload_options(target: Path, is_wl: bool, threads: int | None, duration_s: float | None,
                           steps: int | None) -> None:
    """``--threads/--duration/--steps`` drive a workload module; for a plain script they
    are an error (it runs as it is, with its own arguments), never silently dropped."""
    if not is_wl and any(v is not None for v in (threads, duration_s, steps)):
        raise BadInputError(f"{target}: --threads/--duration/--steps apply to a workload module "
                            "(one with a workload() function); a plain script is profiled as it is")


def child_argv(target: Path, result: Path, args: tuple[str, ...] | list[str], *, threads: int | None,
               duration_s: float | None, steps: int | None, profiled: str | None,
               apply: dict[str, Any] | None = None) -> list[str]:
    """The command that drives a workload in a child process (see :mod:`._child`);
    ``apply``: runtime settings to apply (:func:`recsys_doctor.train_runner.make_runner`)."""
    argv = [sys.executable, "-m", "recsys_doctor.capture._child", str(target), "--result", str(result)]
    if apply is not None:
        argv += ["--apply", json.dumps(apply)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if duration_s is not None:
        argv += ["--duration", repr(float(duration_s))]
    if steps is not None:
        argv += ["--steps", str(steps)]
    if profiled:
        argv += ["--profiled", profiled]
    return argv + ["--", *args] if args else argv


def _child_env() -> dict[str, str]:
    """The parent's environment with this package importable in the child."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def _run_child_measure(argv: list[str], result: Path, log: Path) -> Measurement:
    import subprocess

    from ..workload import WorkloadError

    with open(log, "ab") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=_child_env())
    if proc.returncode != 0 or not result.is_file():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "no output"
        last = last.removeprefix("recsys-doctor: error: ")
        cls = BadInputError if proc.returncode == 2 else WorkloadError
        raise cls(f"{last} (full output in {log})")
    return _measurement_from_json(result)


def _measurement_from_json(path: Path) -> Measurement:
    return Measurement(**json.loads(path.read_text()))


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for pkg in ("torch", "nvtx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    from .. import __version__

    out["recsys_doctor"] = __version__
    return out


def _nsys_version(nsys: Path) -> str | None:
    import subprocess

    try:
        p = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip().splitlines()[-1] if p.stdout.strip() else None


def profile(target: str | os.PathLike[str], args: tuple[str, ...] | list[str] = (), *, backend: str = "auto",
            out_dir: str | os.PathLike[str] | None = None, threads: int | None = None,
            duration_s: float | None = None, steps: int | None = None, baseline: bool = True,
            nvml: bool = True, nvml_interval_s: float = 0.05, nvtx: str | None = None,
            options: Options | None = None, device_index: int = 0, apply: dict[str, Any] | None = None,
            apply_plan: str | os.PathLike[str] | None = None) -> ProfileResult:
    """Capture ``target`` on the GPU and diagnose it; see the module docstring.

    ``threads``/``duration_s``/``steps`` override a workload's settings (an error for a
    plain script, which the tool does not drive). ``baseline``: for a workload, first
    measure it without any profiler attached, so the reported queries/s and latencies are
    not inflated by tracing overhead (the profiled run's own numbers are kept too).
    ``nvtx``: analyze only inside that range (default: ``measure`` for a workload, the
    whole trace for a script).
    ``apply``: runtime settings applied to a workload while it is profiled (the "after"
    run of ``profile --apply``); ``apply_plan``: a plan file applied to a plain script
    through the interpreter-start hook (:func:`recsys_doctor.script_hook.script_env`).
    """
    t_start = time.perf_counter()
    target = Path(target)
    is_wl = is_workload_module(target)
    check_workload_options(target, is_wl, threads, duration_s, steps)
    if apply is not None and not is_wl:
        raise BadInputError(f"{target}: runtime settings apply to a workload module; use a plan file for a script")
    if apply_plan is not None and is_wl:
        raise BadInputError(f"{target}: a plan file applies to a plain script; a workload takes runtime settings")
    chosen = choose_backend(backend)
    env = require_gpu(device_index)
    out = Path(out_dir) if out_dir is not None else default_out_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"--out {out}: cannot create ({e.strerror or e})") from None
    log = out / "program.log"
    mkw: dict[str, Any] = {"threads": threads, "duration_s": duration_s, "steps": steps}
    meas: Measurement | None = None
    base: Measurement | None = None
    base_nvml: NvmlSamples | None = None
    sampler = NvmlSampler(device_index, nvml_interval_s, enabled=nvml)
    env.update(_versions())

    if chosen == "nsys":
        from .nsys import find_nsys, run_nsys

        nsys = find_nsys()
        env["nsys"] = str(nsys)
        env["nsys_version"] = _nsys_version(nsys)
        if is_wl:
            if baseline:
                bres = out / "baseline.json"
                with NvmlSampler(device_index, nvml_interval_s, enabled=nvml) as bs:
                    base = _run_child_measure(child_argv(target, bres, args, profiled=None, **mkw), bres, log)
                base_nvml = bs.result
            program = child_argv(target, out / "measurement.json", args, profiled="nsys", apply=apply, **mkw)
        else:
            program = [sys.executable, str(target), *args]
        penv = _child_env()
        if apply_plan is not None:
            from ..script_hook import script_env

            penv = script_env(apply_plan, base_env=penv, hook_dir=out / "hook")
        t_cap = time.perf_counter()
        with sampler:
            trace_path, command = run_nsys(program, out, env=penv, nsys=nsys)
        cap_wall = time.perf_counter() - t_cap
        if is_wl:
            meas = _measurement_from_json(out / "measurement.json")
    else:
        from ..workload import load_workload, measure
        from .torch_profiler import profile_script, profile_workload, require_torch_cuda

        require_torch_cuda()
        command = ["<in-process torch.profiler>", str(target), *args]
        if is_wl:
            wl = load_workload(target, args)
            if baseline:
                with NvmlSampler(device_index, nvml_interval_s, enabled=nvml) as bs:
                    base = measure(wl, **mkw)
                base_nvml = bs.result
            run = None
            closer = None
            if apply is not None:
                from ..train_runner import make_runner

                run, closer, _info, wl = make_runner(wl, apply)
            t_cap = time.perf_counter()
            try:
                with sampler:
                    trace_path, meas = profile_workload(wl, out, **mkw, **({"run": run} if run is not None else {}))
            finally:
                if closer is not None:
                    closer()
            cap_wall = time.perf_counter() - t_cap
            (out / "measurement.json").write_text(json.dumps(meas.to_dict()))
        else:
            undo = _activate_in_process(apply_plan) if apply_plan is not None else None
            t_cap = time.perf_counter()
            try:
                with sampler:
                    trace_path = profile_script(target, args, out)
            finally:
                if undo is not None:
                    undo()
            cap_wall = time.perf_counter() - t_cap
    if base is not None:
        (out / "baseline.json").write_text(json.dumps(base.to_dict()))

    samples = sampler.result
    samples.save(out / "nvml.json")
    plot = plot_samples(samples, out / "nvml.png", title=f"{target.name} under {chosen}: NVML")
    if base_nvml is not None:
        base_nvml.save(out / "nvml_baseline.json")

    res, window = _diagnose(trace_path, options, nvtx if nvtx is not None else (MEASURE_RANGE if is_wl else None),
                            required=nvtx is not None)
    capture: dict[str, Any] = {
        "backend": chosen,
        "backend_requested": backend,
        "target": str(target),
        "target_kind": "workload" if is_wl else "script",
        "args": list(args),
        "command": [str(c) for c in command],
        "trace": str(trace_path),
        "out_dir": str(out),
        "window": window,
        "capture_wall_s": round(cap_wall, 3),
        "wall_s": round(time.perf_counter() - t_start, 3),
        # NVML over the measurement window for a workload (start-up excluded), else the run
        "nvml": samples.summary(meas.window_epoch if meas else None),
        "nvml_whole_run": samples.summary(),
        "nvml_samples": str(out / "nvml.json"),
        "nvml_plot": str(plot) if plot else None,
        "measurement": meas.to_dict() if meas else None,
        "baseline": ({"measurement": base.to_dict(),
                      "nvml": base_nvml.summary(base.window_epoch) if base_nvml else None}
                     if base else None),
        "environment": env,
    }
    result = ProfileResult(advise=res, capture=capture, out_dir=out, measurement=meas, baseline=base, nvml=samples)
    (out / "profile.json").write_text(json.dumps(result.to_dict(), indent=1, default=json_default))
    return result


def _activate_in_process(plan_path: str | os.PathLike[str]) -> Any:
    """Start the plain-script hook in this process (the torch backend runs the script
    here); returns the function that stops it."""
    import importlib.util

    from ..plan_io import read_plan

    plan = read_plan(plan_path)
    auto = Path(__file__).resolve().parents[1] / "_autoapply.py"
    mod = sys.modules.get("_recsys_doctor_autoapply")
    if mod is None:
        spec = importlib.util.spec_from_file_location("_recsys_doctor_autoapply", auto)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_recsys_doctor_autoapply"] = mod
        spec.loader.exec_module(mod)
    mod.activate(plan)
    return mod.deactivate


def _diagnose(trace_path: Path, options: Options | None, window: str | None,
              required: bool) -> tuple[AdviseResult, str | None]:
    """Load and diagnose; restrict to the NVTX range ``window`` when the trace has it
    (an error only when the user asked for that range)."""
    import hashlib

    from ..loaders import load

    trace = load(trace_path)
    h = hashlib.sha256()
    with open(trace_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    trace.meta.setdefault("sha256", h.hexdigest())
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
