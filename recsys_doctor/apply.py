"""Apply a stream-group plan and measure it: the library behind ``profile --apply`` and ``apply``.

The loop closes in four steps (see ``docs/profile.md``, "--apply"):

1. the baseline is profiled and diagnosed as usual (:func:`recsys_doctor.capture.profile`),
   and ``advise`` proposes a plan;
2. every candidate plan (:func:`candidates`: group count x merged copy/compute streams x
   per-stream allocator x CUDA graphs) is ranked by the what-if estimate of
   :mod:`recsys_doctor.whatif` from the baseline trace;
3. the best ``top_k`` by estimate (plus the advisor's own plan when it is not among them)
   are *measured*, each in a fresh child process driven by the same closed-loop clients
   as the baseline (:func:`recsys_doctor.workload.measure` with ``run=`` the runtime), and
   the best measured one is kept - predicted and measured numbers side by side;
4. the kept plan is profiled once more (same backend) for the "after" trace, and the
   outputs are written: ``plan.json``, ``apply.json`` (before/after table, every
   candidate), ``compare.html`` (before/after report), a history record.

A **workload** is applied through :func:`make_runner` (serving: ``runtime.serve``;
training: branches on side streams and a whole-step CUDA graph). A **plain script** is
applied with no change to it: :func:`script_env` makes an environment whose generated
``sitecustomize.py`` starts :mod:`recsys_doctor._autoapply` at interpreter start; the
script's own last output line (a JSON object with ``qps``, or ``step_ms``) is its
measurement.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace, asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ._json import json_default
from .errors import BadInputError, RecsysDoctorError, WorkloadError
from .whatif import Candidate, Prediction, TraceStats, WhatIfCosts, rank, trace_stats

__all__ = [
    "GROUP_COUNTS",
    "SCRIPT_MAX_THREADS_PER_GROUP",
    "ENV_PLAN",
    "CandidateResult",
    "ApplyResult",
    "candidates",
    "select_to_measure",
    "plan_candidate",
    "make_runner",
    "runtime_plan",
    "write_plan",
    "read_plan",
    "script_env",
    "parse_script_result",
    "run_script",
    "stats_from_profile",
    "apply_workload",
    "apply_script",
    "before_after_rows",
]

#: group counts tried by the plan search
GROUP_COUNTS = (1, 2, 4, 8)
ENV_PLAN = "RECSYS_DOCTOR_PLAN"


# ------------------------------------------------------------------------------ candidates

#: plain scripts: at most this many client threads share one group when graphs are on.
#: Measured on the H200: with 4 or 8 threads per group (8 threads on 2 or 1 groups) the
#: hook's captures fail ("operation failed due to a previous error during capture") even
#: with every other model execution held off during a capture, so those groups run eagerly
#: (bench/results/apply_script_g2_after_gate_h200.log; before the hook handled the failure,
#: the clients died: apply_script_g2_diag.log); 1-2 threads per group capture fine.
SCRIPT_MAX_THREADS_PER_GROUP = 2


def candidates(kind: str = "serve", group_counts: Sequence[int] = GROUP_COUNTS,
               clients: int | None = None) -> list[Candidate]:
    """Every plan the search considers. Serving: groups x merge x allocator x graphs (32).
    Training: branch streams x graphs (copies are not per-step, pools are the step's own).
    A plain script: groups x graphs (its copies are its own, on the group's stream); with
    ``clients`` given, graphed plans with more than :data:`SCRIPT_MAX_THREADS_PER_GROUP`
    threads per group are left out (see there)."""
    if kind == "serve":
        return [Candidate(g, m, a, gr) for g in group_counts for m in (True, False) for a in (True, False)
                for gr in (True, False)]
    if kind == "script":
        return [Candidate(g, True, True, gr) for g in group_counts for gr in (True, False)
                if not (gr and clients and math.ceil(clients / g) > SCRIPT_MAX_THREADS_PER_GROUP)]
    if kind == "train":
        return [Candidate(g, True, True, gr) for g in group_counts for gr in (True, False)]
    raise BadInputError(f"unknown candidate kind {kind!r}")


def plan_candidate(plan: dict[str, Any]) -> Candidate:
    """The advisor's plan as a :class:`Candidate` (through ``RuntimeConfig.from_plan``)."""
    from .runtime import RuntimeConfig

    cfg = RuntimeConfig.from_plan(plan)
    return Candidate(cfg.groups, cfg.merge_streams, cfg.per_stream_allocator, cfg.cuda_graphs)


def runtime_plan(cand: Candidate, clients: int) -> dict[str, Any]:
    """The runtime settings for ``cand`` with ``clients`` client threads: enough slots per
    group that every client can have a query in flight (``groups x slots >= clients``;
    fewer makes waiting for a slot unfair, see ``docs/runtime.md``)."""
    d = cand.to_runtime()
    d["slots_per_group"] = max(2, math.ceil(clients / cand.groups))
    return d


def select_to_measure(ranked: Sequence[Prediction], top_k: int, prefer: Candidate | None = None,
                      allocator_twin: bool = True) -> list[Prediction]:
    """The first ``top_k`` of ``ranked`` that differ in something the estimate prices
    (groups, merged streams, graphs: the allocator variants of one plan estimate the
    same, so only the first of them is taken), then, with ``allocator_twin``, the best
    one's twin with the other allocator setting (own pools per group vs one shared pool
    are measured, not guessed), plus ``prefer`` (the advisor's plan) when it is not among
    them."""
    out: list[Prediction] = []
    seen: set[tuple[int, bool, bool]] = set()
    for p in ranked:
        c = p.candidate
        k = (c.groups, c.merge_streams, c.cuda_graphs)
        if k in seen:
            continue
        if len(out) < top_k:
            out.append(p)
            seen.add(k)
    if allocator_twin and out and out[0].candidate.groups > 1:
        top = out[0].candidate
        twin = replace(top, per_stream_allocator=not top.per_stream_allocator)
        out.extend(p for p in ranked if p.candidate == twin and all(q.candidate != twin for q in out))
    if prefer is not None and all(p.candidate != prefer for p in out):
        out.extend(p for p in ranked if p.candidate == prefer)
    return out


# ------------------------------------------------------------------------------ plan.json

def write_plan(path: str | os.PathLike[str], advised: dict[str, Any], chosen: Candidate, *,
               clients: int | None = None, predicted: dict[str, Any] | None = None,
               measured: dict[str, Any] | None = None, baseline: dict[str, Any] | None = None) -> Path:
    """``plan.json``: the advisor's plan (schema 1, as ``advise --json`` prints it) plus a
    ``runtime`` object with the chosen settings (which ``RuntimeConfig.from_plan`` and the
    script hook read first) and an ``apply`` object with what was predicted and measured."""
    p = Path(path)
    doc = dict(advised)
    doc["runtime"] = runtime_plan(chosen, clients) if clients else chosen.to_runtime()
    doc["apply"] = {"label": chosen.label, "predicted": predicted, "measured": measured, "baseline": baseline}
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    except OSError as e:
        raise BadInputError(f"cannot write the plan to {p} ({e.strerror or e})") from None
    return p


def read_plan(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a plan JSON (``plan.json`` or an ``advise --json`` output, whose
    ``plan`` object is taken). Raises :class:`BadInputError` with one line on any problem."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p}: no such plan file")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(f"{p}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise BadInputError(f"{p}: not JSON (line {e.lineno}: {e.msg})") from None
    if isinstance(doc, dict) and isinstance(doc.get("plan"), dict) and "findings" in doc:
        doc = doc["plan"]
    if not isinstance(doc, dict):
        raise BadInputError(f"{p}: a plan must be a JSON object")
    if not any(k in doc for k in ("runtime", "stream_groups", "cuda_graphs", "groups")):
        raise BadInputError(f"{p}: not a recsys-doctor plan (no runtime, stream_groups or cuda_graphs)")
    plan_candidate(doc)  # validates types
    return doc


# ------------------------------------------------------------------------------ workloads

def make_runner(wl: Any, runtime: dict[str, Any]) -> tuple[Callable[..., Any], Callable[[], None], dict[str, Any], Any]:
    """``(run, close, info, workload)`` applying ``runtime`` (a flat runtime dict) to a
    :class:`~recsys_doctor.workload.Workload`: pass ``run`` and the returned workload
    (warm-up adjusted) to :func:`~recsys_doctor.workload.measure`, call ``close()`` after.

    Serving: ``run`` is a :func:`recsys_doctor.runtime.serve` ``ServedModel`` built from
    ``wl.inputs(0)`` (host tensors in, host tensors out, like the default query).

    Training: the workload exposes what the runtime needs (``examples/mmoe_training.py``):
    ``wl.model.streams`` (passed to ``parallel_branches``; set to a ``BranchStreams`` of
    ``groups`` streams when ``groups > 1``) and ``wl.run.optimizer`` (made ``capturable``
    for a whole-step CUDA graph). The graphed ``run`` does the first warm-up steps eagerly
    on a side stream, captures one step, and replays it; it returns a clone of the step's
    loss. The warm-up count is reduced by the steps ``run`` itself takes before the first
    replay, so the same number of optimizer steps precedes the measurement and the
    measured losses are comparable step for step with the baseline's.
    """
    from .runtime import RuntimeConfig

    cfg = RuntimeConfig.from_plan(runtime)
    info: dict[str, Any] = {"runtime": asdict(cfg), "notes": []}
    if wl.kind == "serve":
        from .runtime import serve

        ex = wl.inputs(0)
        ex = ex if isinstance(ex, tuple) else (ex,)
        served = serve(wl.model, ex, plan=runtime, slots_per_group=cfg.slots_per_group)
        info["fallbacks"] = dict(served.fallbacks)

        def close() -> None:
            info["stats"] = served.stats()
            served.close()

        return served, close, info, wl
    return _train_runner(wl, cfg, info)


def _train_runner(wl: Any, cfg: Any, info: dict[str, Any]) -> tuple[Any, Any, dict[str, Any], Any]:
    import torch

    step = wl.run
    model = wl.model
    closers: list[Callable[[], None]] = []
    if cfg.groups > 1:
        if hasattr(model, "streams"):
            from .runtime import BranchStreams

            bs = BranchStreams(cfg.groups)
            prev = model.streams
            model.streams = bs

            def undo() -> None:
                model.streams = prev
                bs.close()

            closers.append(undo)
            info["branch_streams"] = cfg.groups
        else:
            info["notes"].append("the workload's model has no 'streams' attribute: branch streams not applied")
    if not cfg.cuda_graphs:
        return step, lambda: [c() for c in closers], info, wl
    opt = getattr(step, "optimizer", None)
    if opt is None:
        info["notes"].append("the step exposes no 'optimizer' attribute: no whole-step CUDA graph (eager)")
        return step, lambda: [c() for c in closers], info, wl
    for pg in opt.param_groups:
        if "capturable" in pg:
            pg["capturable"] = True
    # the first call runs eager_first eager steps + 1 replay and counts as one warm-up
    # call, so warm-up calls = 1 + (warmup - eager_first - 1) keep the same step count
    eager_first = max(1, min(3, int(wl.warmup) - 1))
    rest = max(1, int(wl.warmup) - eager_first)
    if eager_first + rest != int(wl.warmup):
        info["notes"].append(f"warm-up {wl.warmup} < {eager_first + 1}: the applied run takes "
                             f"{eager_first + rest - int(wl.warmup)} more steps before measuring")
    st: dict[str, Any] = {}

    def run(*args: Any) -> Any:
        g = st.get("graph")
        if g is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(eager_first):
                    step(*args)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g):
                    out = step(*args)
            except Exception as e:  # noqa: BLE001 - the reason is kept; the step runs eagerly
                info["fallback"] = f"whole-step capture failed, running eagerly: {type(e).__name__}: {e}"
                torch.cuda.synchronize()
                st["graph"] = False
                return step(*args)
            st.update(graph=g, out=out, args=args,
                      ptrs=[a.data_ptr() for a in args if isinstance(a, torch.Tensor)])
            g.replay()
        elif g is False:
            return step(*args)
        else:
            ptrs = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
            if ptrs != st["ptrs"]:  # new input tensors: copy them into the captured ones
                for d, s in zip((a for a in st["args"] if isinstance(a, torch.Tensor)),
                                (a for a in args if isinstance(a, torch.Tensor))):
                    d.copy_(s)
            g.replay()
        out = st["out"]
        return out.clone() if isinstance(out, torch.Tensor) else out

    info["whole_step_graph"] = True
    info["eager_steps_before_capture"] = eager_first
    return run, lambda: [c() for c in closers], info, wl.with_overrides(warmup=rest)


# ------------------------------------------------------------------------------ scripts

_SITECUSTOMIZE = '''\
# generated by recsys-doctor apply: starts the stream-group runtime for a plain script
import os as _os
if _os.environ.get("RECSYS_DOCTOR_PLAN"):
    import importlib.util as _u
    _spec = _u.spec_from_file_location("_recsys_doctor_autoapply", {path!r})
    _m = _u.module_from_spec(_spec)
    import sys as _sys
    _sys.modules["_recsys_doctor_autoapply"] = _m
    _spec.loader.exec_module(_m)
    _m._main()
# chain to the sitecustomize this one shadows, if any
def _chain():
    import importlib.machinery as _mach, sys as _sys
    here = {here!r}
    spec = _mach.PathFinder.find_spec("sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != here])
    if spec is not None and spec.loader is not None:
        import importlib.util as _u
        mod = _u.module_from_spec(spec)
        spec.loader.exec_module(mod)
_chain()
'''


def script_env(plan_path: str | os.PathLike[str], base_env: dict[str, str] | None = None,
               hook_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """An environment in which any ``python`` applies the plan at interpreter start:
    ``RECSYS_DOCTOR_PLAN`` is the plan's absolute path and ``PYTHONPATH`` starts with a
    folder holding a generated ``sitecustomize.py`` that loads
    :mod:`recsys_doctor._autoapply` by file path (and then chains to any other
    ``sitecustomize``). Nothing is installed; the folder is ``hook_dir`` or a new temp one."""
    plan = Path(plan_path).resolve()
    read_plan(plan)
    d = Path(hook_dir) if hook_dir is not None else Path(tempfile.mkdtemp(prefix="recsys-doctor-hook-"))
    d.mkdir(parents=True, exist_ok=True)
    auto = Path(__file__).resolve().with_name("_autoapply.py")
    (d / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(path=str(auto), here=str(d.resolve())))
    env = dict(os.environ if base_env is None else base_env)
    env[ENV_PLAN] = str(plan)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([str(d.resolve()), root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def parse_script_result(output: str) -> dict[str, Any]:
    """The measurement a script printed: the last non-empty line of its output that is a
    JSON object with ``qps`` or ``step_ms``. :class:`WorkloadError` when there is none."""
    for line in reversed(output.splitlines()):
        s = line.strip()
        if not s.startswith("{"):
            continue
        try:
            d = json.loads(s)
        except json.JSONDecodeError:
            continue
        if isinstance(d, dict) and ("qps" in d or "step_ms" in d):
            return d
    raise WorkloadError("the script printed no measurement: its last JSON line needs 'qps' (or 'step_ms'); "
                        "see examples/plain_serving_script.py")


def run_script(argv: Sequence[str], env: dict[str, str] | None = None, log: Path | None = None,
               timeout_s: float = 600.0) -> tuple[dict[str, Any], str]:
    """Run a program, return its printed measurement and its output."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout_s)
    except FileNotFoundError:
        raise BadInputError(f"cannot run {argv[0]!r}: no such program") from None
    except subprocess.TimeoutExpired as e:
        if log is not None:
            with open(log, "a", encoding="utf-8", errors="replace") as fh:
                fh.write(f"$ {' '.join(argv)}  (killed after {timeout_s:.0f} s)\n{_text(e.stdout)}\n{_text(e.stderr)}\n")
        raise WorkloadError(f"{' '.join(argv)} ran longer than {timeout_s:.0f} s (killed)") from None
    out = p.stdout + ("\n" + p.stderr if p.stderr else "")
    if log is not None:
        with open(log, "a", encoding="utf-8", errors="replace") as fh:
            fh.write(f"$ {' '.join(argv)}\n{out}\n")
    if p.returncode != 0:
        last = [ln for ln in out.splitlines() if ln.strip()]
        raise WorkloadError(f"{' '.join(argv)} exited with status {p.returncode}: "
                            f"{last[-1].strip() if last else 'no output'}")
    return parse_script_result(p.stdout), out


def _text(b: Any) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else str(b)


# ------------------------------------------------------------------------------ results

@dataclass
class CandidateResult:
    """One candidate: its estimate, and its measurement when it was measured."""

    prediction: Prediction
    measured: dict[str, Any] | None = None
    nvml: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.prediction.candidate.label, "runtime": self.prediction.candidate.to_runtime(),
                "predicted": _pred_numbers(self.prediction), "measured": _meas_numbers(self.measured),
                "nvml": self.nvml, "info": self.info, "error": self.error}


@dataclass
class ApplyResult:
    """What ``profile --apply`` did: the before/after table, every candidate, the files."""

    kind: str
    target: str
    chosen: Candidate | None
    before: dict[str, Any]
    after: dict[str, Any] | None
    candidates: list[CandidateResult]
    stats: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target,
                "chosen": None if self.chosen is None else {"label": self.chosen.label, **self.chosen.to_runtime()},
                "before": self.before, "after": self.after,
                "table": before_after_rows(self.before, self.after),
                "candidates": [c.to_dict() for c in self.candidates], "what_if_stats": self.stats,
                "files": self.files, "wall_s": round(self.wall_s, 3), "notes": self.notes}


def _pred_numbers(p: Prediction) -> dict[str, Any]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in
            {"qps": p.qps, "p50_ms": p.p50_ms, "p99_ms": p.p99_ms, "step_ms": p.step_ms, "bound": p.bound,
             "host_us": p.host_ns / 1e3, "gpu_us": p.gpu_ns / 1e3, "overlap": p.overlap}.items()} | {"notes": p.notes}


def _meas_numbers(m: dict[str, Any] | None) -> dict[str, Any] | None:
    if not m:
        return None
    return {k: m.get(k) for k in ("qps", "p50_ms", "p99_ms", "step_ms", "calls", "wall_s") if k in m}


def before_after_rows(before: dict[str, Any], after: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The before/after table: one row per metric with both values and after/before."""
    rows = []
    for key, label in (("qps", "queries/s"), ("step_ms", "step ms"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
                       ("trace_util", "GPU busy (trace) %"), ("nvml_util", "GPU util (NVML) %")):
        a = before.get(key)
        b = (after or {}).get(key)
        if a is None and b is None:
            continue
        ratio = (b / a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None
        rows.append({"metric": label, "key": key, "before": a, "after": b, "ratio": ratio})
    return rows


def stats_from_profile(res: Any, kind: str) -> TraceStats:
    """What-if stats of a :class:`~recsys_doctor.capture.ProfileResult` (its analyzed
    window), with units = the profiled run's call count and the baseline's tail ratio."""
    trace = res.advise.trace
    if trace is None:
        raise BadInputError("the profile result carries no trace to estimate from")
    m = res.measurement
    base = res.baseline or m
    tail = 1.0
    if base is not None and base.p50_ms and base.p99_ms:
        tail = base.p99_ms / base.p50_ms
    units = m.calls if m is not None and m.calls else None
    return trace_stats(trace, units=units, kind="train" if kind == "train" else "serve",
                       unit_range="step" if kind == "train" else "query", p99_over_p50=tail)


def _summary_point(meas: dict[str, Any] | None, nvml: dict[str, Any] | None, advise: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if meas:
        for k in ("qps", "p50_ms", "p99_ms", "step_ms", "mean_ms", "calls", "losses"):
            if meas.get(k) is not None:
                d[k] = meas[k]
    if nvml and nvml.get("n"):
        d["nvml_util"] = nvml.get("util_mean")
    if advise is not None:
        u = _trace_util(advise)
        if u is not None:
            d["trace_util"] = u
    return d


def _trace_util(advise: Any) -> float | None:
    s = getattr(advise, "summary", None) or {}
    for k in ("gpu_utilization", "utilization", "gpu_busy_share"):
        v = s.get(k)
        if isinstance(v, dict):
            v = v.get("busy_share", v.get("value"))
        if isinstance(v, (int, float)):
            return round(float(v) * (100 if v <= 1 else 1), 2)
    trace = getattr(advise, "trace", None)
    if trace is not None and len(trace.gpu_activity()):
        from .whatif import union_ns

        act = trace.gpu_activity()
        span = int(act["end"].max() - act["start"].min())
        if span > 0:
            return round(100.0 * union_ns(act["start"].to_numpy(), act["end"].to_numpy()) / span, 2)
    return None


# ------------------------------------------------------------------------------ orchestration

def _measure_candidate_child(target: Path, args: Sequence[str], runtime: dict[str, Any], out: Path, tag: str, *,
                             threads: int | None, duration_s: float | None, steps: int | None,
                             nvml: bool, device_index: int) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    from .capture import _child_env, child_argv
    from .capture.nvml import NvmlSampler

    res = out / f"cand_{tag}.json"
    argv = child_argv(target, res, list(args), threads=threads, duration_s=duration_s, steps=steps, profiled=None,
                      apply=runtime)
    log = out / "program.log"
    with open(log, "ab") as fh, NvmlSampler(device_index, 0.05, enabled=nvml) as smp:
        fh.write(f"\n$ candidate {tag}: {json.dumps(runtime)}\n".encode())
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=_child_env())
    if proc.returncode != 0 or not res.is_file():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        raise WorkloadError((lines[-1] if lines else "no output").removeprefix("recsys-doctor: error: "))
    meas = json.loads(res.read_text())
    info_p = Path(str(res) + ".apply.json")
    info = json.loads(info_p.read_text()) if info_p.is_file() else {}
    nv = smp.result.summary(meas.get("window_epoch") or None) if nvml else None
    return meas, nv, info


def apply_workload(target: str | os.PathLike[str], args: Sequence[str] = (), *, backend: str = "auto",
                   out_dir: str | os.PathLike[str] | None = None, threads: int | None = None,
                   duration_s: float | None = None, steps: int | None = None, top_k: int = 3,
                   nvml: bool = True, options: Any = None, history: bool = True,
                   db_path: str | os.PathLike[str] | None = None, device_index: int = 0,
                   progress: Callable[[str], None] | None = None,
                   costs: WhatIfCosts = WhatIfCosts()) -> tuple[ApplyResult, Any, Any]:
    """``profile --apply`` for a workload module or a plain script: returns
    ``(ApplyResult, before ProfileResult, after ProfileResult or None)``. See the module
    docstring for the steps; every measured candidate runs in its own child process."""
    from .capture import default_out_dir, profile
    from .workload import is_workload_module

    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    if top_k < 1:
        raise BadInputError(f"--top-k must be >= 1, got {top_k}")
    target = Path(target)
    out = Path(out_dir) if out_dir is not None else default_out_dir()
    is_wl = is_workload_module(target)
    if not is_wl:
        return apply_script(target, args, backend=backend, out_dir=out, top_k=top_k, nvml=nvml, options=options,
                            history=history, db_path=db_path, device_index=device_index, progress=progress,
                            costs=costs)
    say("profiling the baseline")
    before = profile(target, list(args), backend=backend, out_dir=out / "before", threads=threads, duration_s=duration_s,
                     steps=steps, baseline=True, nvml=nvml, options=options, device_index=device_index)
    m = before.baseline or before.measurement
    kind = m.kind if m is not None else "serve"
    clients = m.threads if m is not None else (threads or 1)
    stats = stats_from_profile(before, kind)
    advised = before.advise.plan or {}
    prefer = plan_candidate(advised)
    ranked = rank(stats, candidates("serve" if kind == "serve" else "train"), clients=clients, prefer=prefer,
                  costs=costs)
    chosen_preds = select_to_measure(ranked, top_k, prefer)
    results = [CandidateResult(p) for p in ranked]
    by_cand = {r.prediction.candidate: r for r in results}
    for i, p in enumerate(chosen_preds):
        say(f"measuring candidate {i + 1}/{len(chosen_preds)}: {p.candidate.label}")
        r = by_cand[p.candidate]
        try:
            r.measured, r.nvml, r.info = _measure_candidate_child(
                target, args, runtime_plan(p.candidate, clients), out, f"{i + 1}", threads=threads,
                duration_s=duration_s, steps=steps, nvml=nvml, device_index=device_index)
        except RecsysDoctorError as e:
            r.error = str(e)
    measured = [r for r in results if r.measured is not None]
    if not measured:
        raise WorkloadError("no candidate plan could be measured: " + "; ".join(
            f"{r.prediction.candidate.label}: {r.error}" for r in results if r.error))
    if kind == "serve":
        best = max(measured, key=lambda r: (r.measured or {}).get("qps") or 0.0)
    else:
        best = min(measured, key=lambda r: (r.measured or {}).get("step_ms") or math.inf)
    chosen = best.prediction.candidate
    plan_path = write_plan(out / "plan.json", advised, chosen, clients=clients,
                           predicted=_pred_numbers(best.prediction), measured=_meas_numbers(best.measured),
                           baseline=_meas_numbers(m.to_dict() if m else None))
    say(f"profiling the chosen plan ({chosen.label})")
    after = None
    notes: list[str] = []
    try:
        after = profile(target, list(args), backend=backend, out_dir=out / "after", threads=threads,
                        duration_s=duration_s, steps=steps, baseline=False, nvml=nvml, options=options,
                        device_index=device_index, apply=runtime_plan(chosen, clients))
    except RecsysDoctorError as e:
        notes.append(f"the after-profile failed: {e}")
    before_pt = _summary_point(m.to_dict() if m else None, (before.capture.get("baseline") or {}).get("nvml")
                               or before.capture.get("nvml"), before.advise)
    after_pt = _summary_point(best.measured, best.nvml, after.advise if after is not None else None)
    if kind == "train":
        la, lb = before_pt.get("losses") or [], after_pt.get("losses") or []
        n = min(len(la), len(lb))
        if n:
            diff = max(abs(a - b) for a, b in zip(la[:n], lb[:n]))
            after_pt["loss_max_abs_diff"] = diff
            notes.append(f"losses of {n} measured steps: max |before - after| = {diff:.3g}")
    res = ApplyResult(kind=kind, target=str(target), chosen=chosen, before=before_pt, after=after_pt,
                      candidates=results, stats=stats.to_dict(), notes=notes)
    _finish(res, before, after, out, plan_path, t0, history=history, db_path=db_path)
    return res, before, after


def _finish(res: ApplyResult, before: Any, after: Any, out: Path, plan_path: Path, t0: float, *,
            history: bool, db_path: str | os.PathLike[str] | None) -> None:
    """The HTML before/after report and the history record (both best effort: a missing
    plotting backend or an unwritable history is a note, not a failure of the apply),
    then the wall time and ``apply.json``."""
    res.files["plan"] = str(plan_path)
    if after is not None:
        try:
            from .reports.html import write_compare_html

            write_compare_html(before.advise, after.advise, out / "compare.html", a_label="before", b_label="after")
            _add_table_to_html(out / "compare.html", res)
            res.files["html"] = str(out / "compare.html")
        except Exception as e:  # noqa: BLE001
            res.notes.append(f"no HTML report: {type(e).__name__}: {e}")
    if history:
        try:
            from .history import record_run

            target = after if after is not None else before
            rid = record_run(target.advise, db_path, command="profile --apply")
            res.files["history_row"] = str(rid)
        except Exception as e:  # noqa: BLE001
            res.notes.append(f"no history record: {type(e).__name__}: {e}")
    res.wall_s = time.perf_counter() - t0
    (out / "apply.json").write_text(json.dumps(res.to_dict(), indent=1, default=json_default) + "\n")
    res.files["apply"] = str(out / "apply.json")


def _add_table_to_html(path: Path, res: ApplyResult) -> None:
    import html

    def f(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:,.3f}" if isinstance(v, float) else html.escape(str(v))

    rows = "".join(f"<tr><td>{html.escape(r['metric'])}</td><td class='num'>{f(r['before'])}</td>"
                   f"<td class='num'>{f(r['after'])}</td><td class='num'>{f(r['ratio'])}</td></tr>"
                   for r in before_after_rows(res.before, res.after))
    crow = ""
    for c in res.candidates:
        if c.measured is None and c.error is None:
            continue
        p, m = _pred_numbers(c.prediction), _meas_numbers(c.measured) or {}
        key = "qps" if res.kind != "train" else "step_ms"
        crow += (f"<tr><td>{html.escape(c.prediction.candidate.label)}</td><td class='num'>{f(p.get(key))}</td>"
                 f"<td class='num'>{f(m.get(key))}</td><td class='num'>{f(m.get('p99_ms'))}</td>"
                 f"<td>{html.escape(c.error or '')}</td></tr>")
    chosen = html.escape(res.chosen.label) if res.chosen else "-"
    block = (f"<h2>Measured before / after (chosen: {chosen})</h2><table><tr><th>metric</th><th>before</th>"
             f"<th>after</th><th>after/before</th></tr>{rows}</table>"
             f"<h2>Candidates: predicted vs measured</h2><table><tr><th>plan</th><th>predicted</th>"
             f"<th>measured</th><th>measured p99 ms</th><th>error</th></tr>{crow}</table>")
    text = path.read_text()
    path.write_text(text.replace("<figure>", block + "<figure>", 1))


def apply_script(target: str | os.PathLike[str], args: Sequence[str] = (), *, backend: str = "auto",
                 out_dir: str | os.PathLike[str] | None = None, top_k: int = 3, nvml: bool = True,
                 options: Any = None, history: bool = True, db_path: str | os.PathLike[str] | None = None,
                 device_index: int = 0, progress: Callable[[str], None] | None = None,
                 costs: WhatIfCosts = WhatIfCosts(), python: str | None = None,
                 script_timeout_s: float = 90.0) -> tuple[ApplyResult, Any, Any]:
    """``profile --apply`` for a plain script: profile it, rank script candidates (groups x
    graphs), run the script unmodified with the best ``top_k`` plans (and the advisor's),
    each measured by the script's own printed line; keep the best; profile it once more."""
    from .capture import default_out_dir, profile

    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    target = Path(target)
    out = Path(out_dir) if out_dir is not None else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    py = python or sys.executable
    say("profiling the script")
    before = profile(target, list(args), backend=backend, out_dir=out / "before", nvml=nvml, options=options,
                     device_index=device_index)
    log = out / "program.log"
    say("measuring the script as it is")
    base, _ = run_script([py, str(target), *args], log=log, timeout_s=script_timeout_s)
    units = base.get("queries") or base.get("calls") or base.get("steps")
    tail = (base["p99_ms"] / base["p50_ms"]) if base.get("p50_ms") and base.get("p99_ms") else 1.0
    stats = trace_stats(before.advise.trace, units=None, kind="serve", unit_range="query", p99_over_p50=tail) \
        if before.advise.trace is not None else None
    if stats is None:
        raise BadInputError("the script's profile has no trace to estimate from")
    clients = int(base.get("threads") or stats.threads)
    advised = before.advise.plan or {}
    adv = plan_candidate(advised)
    prefer: Candidate | None = Candidate(adv.groups, True, True, adv.cuda_graphs)
    ranked = rank(stats, candidates("script", clients=clients), clients=clients, prefer=prefer, costs=costs)
    if prefer not in [p.candidate for p in ranked]:
        prefer = None
    todo = select_to_measure(ranked, top_k, prefer)
    results = [CandidateResult(p) for p in ranked]
    by_cand = {r.prediction.candidate: r for r in results}
    hook = out / "hook"
    for i, p in enumerate(todo):
        say(f"running the script with candidate {i + 1}/{len(todo)}: {p.candidate.label}")
        r = by_cand[p.candidate]
        pp = write_plan(out / f"cand_{i + 1}.plan.json", advised, p.candidate)
        try:
            from .capture.nvml import NvmlSampler

            with NvmlSampler(device_index, 0.05, enabled=nvml) as smp:
                r.measured, _ = run_script([py, str(target), *args], env=script_env(pp, hook_dir=hook), log=log,
                                           timeout_s=script_timeout_s)
            r.nvml = smp.result.summary() if nvml else None
        except RecsysDoctorError as e:
            r.error = str(e)
    measured = [r for r in results if r.measured and r.measured.get("qps")]
    if not measured:
        raise WorkloadError("no candidate plan could be measured: " + "; ".join(
            f"{r.prediction.candidate.label}: {r.error}" for r in results if r.error))
    best = max(measured, key=lambda r: (r.measured or {}).get("qps") or 0.0)
    chosen = best.prediction.candidate
    plan_path = write_plan(out / "plan.json", advised, chosen, predicted=_pred_numbers(best.prediction),
                           measured=_meas_numbers(best.measured), baseline=_meas_numbers(base))
    after = None
    notes: list[str] = [f"units per the trace: {stats.units} ({stats.unit_source}); the script reported {units}"]
    say(f"profiling the script with the chosen plan ({chosen.label})")
    try:
        after = profile(target, list(args), backend=backend, out_dir=out / "after", nvml=nvml, options=options,
                        device_index=device_index, apply_plan=plan_path)
    except RecsysDoctorError as e:
        notes.append(f"the after-profile failed: {e}")
    before_pt = _summary_point(base, before.capture.get("nvml"), before.advise)
    after_pt = _summary_point(best.measured, best.nvml, after.advise if after is not None else None)
    res = ApplyResult(kind="script", target=str(target), chosen=chosen, before=before_pt, after=after_pt,
                      candidates=results, stats=stats.to_dict(), notes=notes)
    _finish(res, before, after, out, plan_path, t0, history=history, db_path=db_path)
    return res, before, after
