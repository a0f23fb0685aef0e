"""Apply a stream-group plan and measure it: the library behind ``profile --apply`` and ``apply``.

The loop closes in four steps (see ``docs/profile.md``, "--apply"):

1. the baseline is profiled and diagnosed as usual (:func:`recsys_doctor.capture.profile`),
   and ``advise`` proposes a plan;
2. every candidate plan (:func:`candidates`: group count x merged copy/compute streams x
   per-stream allocator x CUDA graphs) is ranked by the what-if estimate of
   :mod:`recsys_doctor.planning.whatif` from the baseline trace;
3. the best ``top_k`` by estimate (plus the advisor's own plan when it is not among them)
   are *measured*, each in a fresh child process driven by the same closed-loop clients
   as the baseline (:func:`recsys_doctor.capture.workload.measure` with ``run=`` the runtime), and
   the best measured one is kept - predicted and measured numbers side by side;
4. the kept plan is profiled once more (same backend) for the "after" trace, and the
   outputs are written: ``plan.json``, ``apply.json`` (before/after table, every
   candidate), ``compare.html`` (before/after report), a history record.

A **workload** is applied through :func:`make_runner` (serving: ``runtime.serve``;
training: branches on side streams and a whole-step CUDA graph). A **plain script** is
applied with no change to it: :func:`script_env` makes an environment whose generated
``sitecustomize.py`` starts :mod:`recsys_doctor.applying._autoapply` at interpreter start; the
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

from .._util.json import json_default
from .report import (ApplyResult, CandidateResult, batching_refused, copy_only_note, graphs_out_of_reach, keep_within,
                     training_note, measured_tables, short_lives_note, tail_note, no_model_calls_note, run_notes,
                     _meas_numbers, _pred_numbers, _summary_point, before_after_rows)
from ..capture import check_workload_options, child_argv, default_out_dir, profile
from ..capture.child_process import child_env
from ..capture.nvml import NvmlSampler
from ..errors import BadInputError, RecsysDoctorError, WorkloadError
from ..planning.io import read_plan, write_plan
from ..planning.search import GROUP_COUNTS, candidates, plan_candidate, runtime_plan, select_to_measure
from .confirm import confirm, declined, metric, needs_confirming
from .evidence import HOOK_STATS_FILE, sync_evidence
from .script_hook import (ENV_PLAN, METERED, fail_on_thread_errors, parse_script_result, read_hook_stats, run_as_is,
                          run_script, script_env, script_treatment)
from .train_runner import make_runner, runtime_treatment
from ..planning.whatif import Candidate, Prediction, TraceStats, WhatIfCosts, rank, trace_stats
from ..capture.workload import is_workload_module

__all__ = [
    "GROUP_COUNTS",
    "ENV_PLAN",
    "CandidateResult",
    "ApplyResult",
    "candidates",
    "select_to_measure",
    "plan_candidate",
    "make_runner",
    "runtime_treatment",
    "script_treatment",
    "runtime_plan",
    "write_plan",
    "read_plan",
    "script_env",
    "parse_script_result", "run_script",
    "stats_from_profile",
    "apply_workload",
    "apply_script",
    "before_after_rows",
    "write_bucket_costs",
]


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


# ------------------------------------------------------------------------------ orchestration

@dataclass
class _Setup:
    """What every step of one ``profile --apply`` shares."""

    target: Path
    args: list[str]
    out: Path
    backend: str
    nvml: bool
    options: Any
    device_index: int
    say: Callable[[str], None]
    measure_kw: dict[str, Any] = field(default_factory=dict)
    metered: bool = False  # the script prints no measurement: the hook's rate of model calls instead

    def profile(self, sub: str, **kw: Any) -> Any:
        """Profile the target into ``out/sub`` (``before`` or ``after``)."""
        return profile(self.target, self.args, backend=self.backend, out_dir=self.out / sub, nvml=self.nvml,
                       options=self.options, device_index=self.device_index, **self.measure_kw, **kw)


def apply_workload(target: str | os.PathLike[str], args: Sequence[str] = (), *, backend: str = "auto",
                   out_dir: str | os.PathLike[str] | None = None, threads: int | None = None,
                   duration_s: float | None = None, steps: int | None = None, top_k: int = 3,
                   nvml: bool = True, options: Any = None, history: bool = True,
                   db_path: str | os.PathLike[str] | None = None, device_index: int = 0,
                   progress: Callable[[str], None] | None = None,
                   costs: WhatIfCosts = WhatIfCosts(), p99_ms: float | None = None) -> tuple[ApplyResult, Any, Any]:
    """``profile --apply`` for a workload module or a plain script: returns
    ``(ApplyResult, before ProfileResult, after ProfileResult or None)``. See the module
    docstring for the steps; every measured candidate runs in its own child process.
    ``p99_ms``: a latency budget (serving): the kept plan is the one with the most
    queries/s among those measured with p99 within it."""
    t0 = time.perf_counter()
    if top_k < 1:
        raise BadInputError(f"--top-k must be >= 1, got {top_k}")
    if p99_ms is not None and not (p99_ms > 0 and math.isfinite(p99_ms)):
        raise BadInputError(f"--p99-ms must be a positive number of milliseconds, got {p99_ms}")
    target = Path(target)
    out = Path(out_dir) if out_dir is not None else default_out_dir()
    if not is_workload_module(target):
        if costs.bucket_gpu_ns:
            raise BadInputError("--bucket-costs prices dynamic batching, which only a workload module's serving "
                                "plans have: a plain script is not batched")
        check_workload_options(target, False, threads, duration_s, steps)
        return apply_script(target, args, backend=backend, out_dir=out, top_k=top_k, nvml=nvml, options=options,
                            history=history, db_path=db_path, device_index=device_index, progress=progress,
                            costs=costs, p99_ms=p99_ms)
    run = _Setup(target, list(args), out, backend, nvml, options, device_index, progress or (lambda s: None),
                 {"threads": threads, "duration_s": duration_s, "steps": steps})
    run.say("profiling the baseline")
    before = run.profile("before", baseline=True)
    m = before.baseline or before.measurement
    kind = m.kind if m is not None else "serve"
    clients = m.threads if m is not None else (threads or 1)
    stats = stats_from_profile(before, kind)
    advised = before.advise.plan or {}
    prefer = plan_candidate(advised)
    if kind == "train":  # a training step has one allocator (see planning.search.candidates)
        prefer = Candidate(prefer.groups, True, False, prefer.cuda_graphs)
    ranked = rank(stats, candidates("serve" if kind == "serve" else "train"), clients=clients, prefer=prefer,
                  costs=costs)
    results = _measure_workload_candidates(run, ranked, select_to_measure(ranked, top_k, prefer), clients)
    notes: list[str] = []
    best = _keep_best(results, kind, None if kind == "train" else p99_ms, notes)
    chosen = best.prediction.candidate
    plan_path = write_plan(out / "plan.json", advised, chosen, clients=clients,
                           predicted=_pred_numbers(best.prediction), measured=_meas_numbers(best.measured),
                           baseline=_meas_numbers(m.to_dict() if m else None))
    if kind == "train" and p99_ms is not None:
        notes.append("--p99-ms does not apply to a training loop (its steps have no latency budget): ignored")
    if kind == "train" and costs.bucket_gpu_ns:
        notes.append("--bucket-costs does not apply to a training loop (its steps are not batched): ignored")
    # (bucket costs come from the measured candidates: the after-profile measures none)
    after = _profile_after(run, chosen, notes, baseline=False,
                           treatment=runtime_treatment(runtime_plan(chosen, clients), bucket_costs=False))
    before_pt = _summary_point(m.to_dict() if m else None, (before.capture.get("baseline") or {}).get("nvml")
                               or before.capture.get("nvml"), before.advise)
    after_pt = _summary_point(best.measured, best.nvml, after.advise if after is not None else None)
    if kind == "train":
        _compare_losses(before_pt, after_pt, notes)
    res = ApplyResult(kind=kind, target=str(target), chosen=chosen, before=before_pt, after=after_pt,
                      candidates=results, stats=stats.to_dict(), notes=notes,
                      p99_budget_ms=None if kind == "train" else p99_ms,
                      evidence=_evidence(before, after, before_pt, after_pt))
    write_bucket_costs(res, out)
    _finish(res, before, after, out, plan_path, t0, history=history, db_path=db_path)
    return res, before, after


def write_bucket_costs(res: ApplyResult, out: Path) -> Path | None:
    """The bucket GPU times a measured batching candidate reported (its ``info``; the chosen
    plan's when it batches, else the one with the most measured queries/s) into
    ``res.bucket_gpu_us`` and ``out/bucket_gpu_us.json`` (``files["bucket_costs"]``), the
    file ``whatif --bucket-costs`` reads; None when no batching candidate reported any."""
    got = [r for r in res.candidates if r.prediction.candidate.batching and r.measured and r.info.get("bucket_gpu_us")]
    if not got:
        return None
    best = next((r for r in got if r.prediction.candidate == res.chosen), None) or max(
        got, key=lambda r: (r.measured or {}).get("qps") or 0.0)
    res.bucket_gpu_us, res.bucket_costs_of = dict(best.info["bucket_gpu_us"]), best.prediction.candidate.label
    path = out / "bucket_gpu_us.json"
    path.write_text(json.dumps(res.bucket_gpu_us, indent=1) + "\n")
    res.files["bucket_costs"] = str(path)
    return path


def _measure_workload_candidates(run: _Setup, ranked: list[Prediction], todo: list[Prediction],
                                 clients: int) -> list[CandidateResult]:
    """Every ranked candidate's result; those in ``todo`` measured, each in a child process."""
    results = [CandidateResult(p) for p in ranked]
    by_cand = {r.prediction.candidate: r for r in results}
    for i, p in enumerate(todo):
        run.say(f"measuring candidate {i + 1}/{len(todo)}: {p.candidate.label}")
        r = by_cand[p.candidate]
        try:
            r.measured, r.nvml, r.info = _measure_candidate_child(run, runtime_plan(p.candidate, clients), f"{i + 1}")
        except RecsysDoctorError as e:
            r.error = str(e)
    return results


def _measure_candidate_child(run: _Setup, runtime: dict[str, Any],
                             tag: str) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    res = run.out / f"cand_{tag}.json"
    argv = child_argv(run.target, res, run.args, profiled=None, treatment=runtime_treatment(runtime), **run.measure_kw)
    log = run.out / "program.log"
    with open(log, "ab") as fh, NvmlSampler(run.device_index, 0.05, enabled=run.nvml) as smp:
        fh.write(f"\n$ candidate {tag}: {json.dumps(runtime)}\n".encode())
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=child_env())
    if proc.returncode != 0 or not res.is_file():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        raise WorkloadError((lines[-1] if lines else "no output").removeprefix("recsys-doctor: error: "))
    meas = json.loads(res.read_text())
    info_p = Path(str(res) + ".apply.json")
    info = json.loads(info_p.read_text()) if info_p.is_file() else {}
    nv = smp.result.summary(meas.get("window_epoch") or None) if run.nvml else None
    return meas, nv, info


def _keep_best(results: list[CandidateResult], kind: str, p99_ms: float | None = None,
               notes: list[str] | None = None) -> CandidateResult:
    """The best measured candidate: most queries/s (serving, scripts), least step time
    (training, and ``script-train``: a plain training script). A script's candidate counts
    as measured only when it printed its q/s (its step time)."""
    if kind in ("script", "script-train"):
        key = metric(kind == "script-train")[0]
        measured = [r for r in results if r.measured and r.measured.get(key)]
    else:
        measured = [r for r in results if r.measured is not None]
    if not measured:
        raise WorkloadError("no candidate plan could be measured: " + "; ".join(
            f"{r.prediction.candidate.label}: {r.error}" for r in results if r.error))
    skipped = [r for r in results if r.info.get("skipped")]  # (_measure_script_candidates: why, once)
    if skipped and notes is not None:
        notes.append(f"{skipped[0].info['skipped']} ({', '.join(r.prediction.candidate.label for r in skipped)})")
    if kind in ("train", "script-train"):
        return min(measured, key=lambda r: (r.measured or {}).get("step_ms") or math.inf)
    measured, note = keep_within(measured, p99_ms)
    if note and notes is not None:
        notes.append(note)
    return max(measured, key=lambda r: (r.measured or {}).get("qps") or 0.0)


def _profile_after(run: _Setup, chosen: Candidate, notes: list[str], **kw: Any) -> Any:
    """The chosen plan profiled once more (same backend), or None with a note."""
    run.say(f"profiling the chosen plan ({chosen.label})")
    try:
        return run.profile("after", **kw)
    except RecsysDoctorError as e:
        notes.append(f"the after-profile failed: {e}")
        return None


def _evidence(before: Any, after: Any, before_pt: dict[str, Any], after_pt: dict[str, Any]) -> dict[str, Any]:
    """:func:`.evidence.sync_evidence` of the two profiles; its syncs per query (step) also go
    into the before/after points, so the table shows them beside GPU busy."""
    ev = sync_evidence(before, after)
    for side, pt in (("before", before_pt), ("after", after_pt)):
        if ev["syncs_per_unit"][side] is not None:
            pt[f"syncs_per_{ev['unit']}"] = ev["syncs_per_unit"][side]
    return ev


def _compare_losses(before_pt: dict[str, Any], after_pt: dict[str, Any], notes: list[str]) -> None:
    """Training: the largest step-by-step loss difference (a faster step must compute the same)."""
    la, lb = before_pt.get("losses") or [], after_pt.get("losses") or []
    n = min(len(la), len(lb))
    if n:
        diff = max(abs(a - b) for a, b in zip(la[:n], lb[:n]))
        after_pt["loss_max_abs_diff"] = diff
        notes.append(f"losses of {n} measured steps: max |before - after| = {diff:.3g}")


def _finish(res: ApplyResult, before: Any, after: Any, out: Path, plan_path: Path, t0: float, *,
            history: bool, db_path: str | os.PathLike[str] | None) -> None:
    """The HTML before/after report and the history record (both best effort: a missing
    plotting backend or an unwritable history is a note, not a failure of the apply),
    then the wall time and ``apply.json``."""
    res.files["plan"] = str(plan_path)
    if after is not None:
        try:
            from ..reports.html import write_compare_html

            write_compare_html(before.advise, after.advise, out / "compare.html", a_label="before", b_label="after",
                               measured=measured_tables(res))
            res.files["html"] = str(out / "compare.html")
        except Exception as e:  # noqa: BLE001 - a side report: what breaks it becomes a note, the results stay
            res.notes.append(f"no HTML report: {type(e).__name__}: {e}")
    if history:
        try:
            from ..history.db import record_run

            target = after if after is not None else before
            rid = record_run(target.advise, db_path, command="profile --apply")
            res.files["history_row"] = str(rid)
        except Exception as e:  # noqa: BLE001 - a side record: what fails it becomes a note, the results stay
            res.notes.append(f"no history record: {type(e).__name__}: {e}")
    res.wall_s = time.perf_counter() - t0
    (out / "apply.json").write_text(json.dumps(res.to_dict(), indent=1, default=json_default) + "\n")
    res.files["apply"] = str(out / "apply.json")


def apply_script(target: str | os.PathLike[str], args: Sequence[str] = (), *, backend: str = "auto",
                 out_dir: str | os.PathLike[str] | None = None, top_k: int = 3, nvml: bool = True,
                 options: Any = None, history: bool = True, db_path: str | os.PathLike[str] | None = None,
                 device_index: int = 0, progress: Callable[[str], None] | None = None,
                 costs: WhatIfCosts = WhatIfCosts(), python: str | None = None,
                 script_timeout_s: float = 90.0, p99_ms: float | None = None) -> tuple[ApplyResult, Any, Any]:
    """``profile --apply`` for a plain script: profile it, rank script candidates (groups x
    graphs, and the hook's batching where there are more client threads than groups), run the
    script unmodified with the best ``top_k`` plans (and the advisor's, and a batching plan:
    :func:`select_to_measure`), each measured by the script's own printed line; keep the best
    (declined where it is slower than the script as it is, or where a close win is lost when
    both run once more: :mod:`.confirm`); profile it once more."""
    t0 = time.perf_counter()
    run = _Setup(Path(target), list(args), Path(out_dir) if out_dir is not None else default_out_dir(), backend,
                 nvml, options, device_index, progress or (lambda s: None))
    run.out.mkdir(parents=True, exist_ok=True)
    argv = [python or sys.executable, str(run.target), *run.args]
    run.say("profiling the script")
    before = run.profile("before")
    run.say("measuring the script as it is")
    base, base_out, run.metered = run_as_is(argv, run.out, log=run.out / "program.log", timeout_s=script_timeout_s)
    stats = _script_stats(before, base)
    clients = int(base.get("threads") or stats.threads)
    # a plain training loop prints its step time, not q/s: the fastest step is kept (and its
    # gradients are on: the hook batches none of its calls, so no batching plan is tried)
    train = base.get("qps") is None and base.get("step_ms") is not None
    advised = before.advise.plan or {}
    adv = plan_candidate(advised)
    prefer: Candidate | None = Candidate(adv.groups, True, False, adv.cuda_graphs)
    ranked = rank(stats, candidates("script", clients=1 if train else clients), clients=clients, prefer=prefer,
                  costs=costs, script=True)
    _label_script_bounds(ranked)
    if prefer not in [p.candidate for p in ranked]:
        prefer = None
    results = _measure_script_candidates(run, argv, ranked, select_to_measure(ranked, top_k, prefer), advised,
                                         script_timeout_s, base_out)
    notes: list[str] = []
    best = _keep_best(results, "script-train" if train else "script", None if train else p99_ms, notes)
    units = base.get("queries") or base.get("calls") or base.get("steps")
    notes.append(f"units per the trace: {stats.units} ({stats.unit_source}); the script reported {units}"
                 + (f"; {METERED}" if run.metered else ""))
    plan_path = write_plan(run.out / "plan.json", advised, best.prediction.candidate,
                           predicted=_pred_numbers(best.prediction), measured=_meas_numbers(best.measured),
                           baseline=_meas_numbers(base))
    hook_stats = run.out / "after" / HOOK_STATS_FILE
    decline, shown = declined(base, best, train), (base, best.measured)
    if decline is None and needs_confirming(base, best.measured, train):  # a close win: once more
        decline, shown = confirm(run, argv, advised, base, best, train, script_timeout_s, notes)
    before_pt = _summary_point(shown[0], before.capture.get("nvml"), before.advise)
    chosen = None if decline else best.prediction.candidate
    if decline:  # no plan beat the script as it is: it is left unchanged (after = its own run)
        hook_seen = best.info.get("hook")
        notes += [n for n in (decline, no_model_calls_note(hook_seen), *run_notes(hook_seen, train, before.advise)) if n]
        after, after_pt = None, dict(before_pt)
    else:
        after = _profile_after(run, best.prediction.candidate, notes,
                               treatment=script_treatment(plan_path, stats_path=hook_stats))
        after_pt = _summary_point(shown[1], best.nvml, after.advise if after is not None else None)
    ev = _evidence(before, after, before_pt, after_pt)
    ev["hook"] = {"measured": None if decline else best.info.get("hook"),
                  "profiled": read_hook_stats(hook_stats) if after else None}
    if not decline:  # what the kept plan's run says of itself
        m = ev["hook"]["measured"]
        kept = (batching_refused(best.prediction.candidate, m), copy_only_note(m), training_note(m), short_lives_note(m),
                None if train else tail_note(*shown, m, p99_ms), *run_notes(m, train, before.advise))
        notes += [n for n in kept if n]
    res = ApplyResult(kind="script", target=str(run.target), chosen=chosen, before=before_pt, after=after_pt,
                      candidates=results, stats=stats.to_dict(), notes=notes, p99_budget_ms=p99_ms, evidence=ev)
    _finish(res, before, after, run.out, plan_path, t0, history=history, db_path=db_path)
    return res, before, after


#: what a plain script's graphed estimate is: the script's own Python per query or step is not
#: in its trace (only the host time of the calls the graph replaces), so it is a ceiling, not a
#: forecast (the serving scripts measured on the H100 on 2026-11-26, the suite, the held-out
#: ones and plain_serving_script, ran 1.2 to 46 times below it)
SCRIPT_BOUND = ("an upper bound: the script's own Python per query or step is not in the trace (scripts "
                "measured 1.2-46x below such bounds); measured, kept only when faster")


def _label_script_bounds(ranked: Sequence[Prediction]) -> None:
    """Note :data:`SCRIPT_BOUND` on each graphed, unbatched estimate of a plain script (the
    batched ones are not priced at all; eager ones replay the trace's own host time)."""
    for p in ranked:
        if p.candidate.cuda_graphs and not p.candidate.batching:
            p.notes.append(SCRIPT_BOUND)


def _script_stats(before: Any, base: dict[str, Any]) -> TraceStats:
    """What-if stats of the script's trace, with the tail ratio the script itself measured."""
    if before.advise.trace is None:
        raise BadInputError("the script's profile has no trace to estimate from")
    tail = (base["p99_ms"] / base["p50_ms"]) if base.get("p50_ms") and base.get("p99_ms") else 1.0
    return trace_stats(before.advise.trace, units=None, kind="serve", unit_range="query", p99_over_p50=tail)


def _measure_script_candidates(run: _Setup, argv: list[str], ranked: list[Prediction], todo: list[Prediction],
                               advised: dict[str, Any], timeout_s: float, out_as_is: str = "") -> list[CandidateResult]:
    """Every ranked candidate's result; those in ``todo`` measured by running the script
    unmodified with the candidate's plan file applied at interpreter start (not kept where a
    thread of the script raised under it: :func:`.script_hook.fail_on_thread_errors`). Once a
    graphed plan captured nothing for a reason no other plan changes
    (:func:`.report.graphs_out_of_reach`), the other graphed ones are not run (``info["skipped"]``)."""
    results = [CandidateResult(p) for p in ranked]
    by_cand = {r.prediction.candidate: r for r in results}
    out_of_reach: str | None = None  # (graphs_out_of_reach of a graphed plan measured: the others skipped)
    for i, p in enumerate(todo):
        r = by_cand[p.candidate]
        graphed = p.candidate.cuda_graphs and not p.candidate.batching
        if out_of_reach is not None and graphed:
            r.info["skipped"] = out_of_reach
            run.say(f"not running candidate {i + 1}/{len(todo)}: {p.candidate.label} (no graph can be captured)")
            continue
        run.say(f"running the script with candidate {i + 1}/{len(todo)}: {p.candidate.label}")
        pp = write_plan(run.out / f"cand_{i + 1}.plan.json", advised, p.candidate)
        sp = run.out / f"cand_{i + 1}.{HOOK_STATS_FILE}"
        try:
            with NvmlSampler(run.device_index, 0.05, enabled=run.nvml) as smp:
                r.measured, _ = run_script(argv, env=script_env(pp, hook_dir=run.out / "hook", stats_path=sp,
                                                                meter=getattr(run, "metered", False)),
                                           log=run.out / "program.log", timeout_s=timeout_s)
            r.nvml = smp.result.summary() if run.nvml else None
        except RecsysDoctorError as e:
            r.error = str(e)
        r.info["hook"] = read_hook_stats(sp)
        fail_on_thread_errors(r, r.info["hook"], out_as_is)
        if graphed and r.measured and r.measured.get("qps") is not None and out_of_reach is None:
            out_of_reach = graphs_out_of_reach(r.info["hook"], p.candidate.label)
    return results
