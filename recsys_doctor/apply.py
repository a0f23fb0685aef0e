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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ._json import json_default
from .capture import _child_env, check_workload_options, child_argv, default_out_dir, profile
from .capture.nvml import NvmlSampler
from .errors import BadInputError, RecsysDoctorError, WorkloadError
from .plan_io import read_plan, write_plan
from .plan_search import (GROUP_COUNTS, SCRIPT_MAX_THREADS_PER_GROUP, candidates, plan_candidate, runtime_plan,
                          select_to_measure)
from .script_hook import ENV_PLAN, parse_script_result, run_script, script_env
from .train_runner import make_runner
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
    """GPU busy % of the analyzed window: the summary's ``gpu_utilization`` (a share, see
    ``analyzers/summary.py``); without a summary, the union of GPU activity over its span."""
    v = (getattr(advise, "summary", None) or {}).get("gpu_utilization")
    if isinstance(v, (int, float)):
        return round(float(v) * 100, 2)
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
    from .workload import is_workload_module

    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    if top_k < 1:
        raise BadInputError(f"--top-k must be >= 1, got {top_k}")
    target = Path(target)
    out = Path(out_dir) if out_dir is not None else default_out_dir()
    is_wl = is_workload_module(target)
    if not is_wl:
        check_workload_options(target, is_wl, threads, duration_s, steps)
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
