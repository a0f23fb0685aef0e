"""What ``profile --apply`` reports: the candidate and apply results, the before/after
table, the summary points compared, and the HTML block added to ``compare.html``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..planning._batching import UNPRICED
from ._autoapply.graphs import CPU_ARG, GRAD_ON, NEEDS_HOST, UNKEYED
from ._autoapply.host_args import HOST_USE
from ._autoapply.thread_graphs import MIN_THREAD_CALLS, mostly_short
from ..planning.whatif import Candidate, Prediction

__all__ = ["CandidateResult", "ApplyResult", "before_after_rows", "measured_tables", "keep_within", "batching_refused",
           "copy_only_note", "training_note", "tail_note", "short_lives_note", "no_model_calls_note", "grad_on_note", "needs_host_note",
           "host_args_note", "unkeyed_note", "graphs_out_of_reach", "call_notes", "host_work_note", "devices_note",
           "run_notes"]


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
    #: ``--p99-ms``: the latency budget the kept plan had to meet (None: none)
    p99_budget_ms: float | None = None
    #: syncs per query (step) and GPU busy before and after (:func:`.evidence.sync_evidence`)
    #: and, for a script, ``hook``: the hook's stats in the kept plan's measured and profiled runs
    evidence: dict[str, Any] = field(default_factory=dict)
    #: a measured batching candidate's GPU us per bucket (``{"1": us, ...}``, the chosen
    #: plan's when it batches, else the fastest batching one's) and that candidate's label;
    #: also written to ``bucket_gpu_us.json`` for ``whatif --bucket-costs``
    bucket_gpu_us: dict[str, float] | None = None
    bucket_costs_of: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target,
                "chosen": None if self.chosen is None else {"label": self.chosen.label, **self.chosen.to_runtime()},
                "before": self.before, "after": self.after,
                "table": before_after_rows(self.before, self.after),
                "candidates": [c.to_dict() for c in self.candidates], "what_if_stats": self.stats,
                "files": self.files, "wall_s": round(self.wall_s, 3), "notes": self.notes,
                "p99_budget_ms": self.p99_budget_ms, "evidence": self.evidence,
                "bucket_gpu_us": self.bucket_gpu_us, "bucket_costs_of": self.bucket_costs_of}


def _pred_numbers(p: Prediction) -> dict[str, Any]:
    """The estimate's numbers (none but the bound and the notes where it is not priced)."""
    priced = p.bound != UNPRICED
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in
            {"qps": p.qps, "p50_ms": p.p50_ms, "p99_ms": p.p99_ms, "step_ms": p.step_ms, "bound": p.bound,
             "host_us": p.host_ns / 1e3 if priced else None, "gpu_us": p.gpu_ns / 1e3 if priced else None,
             "overlap": p.overlap if priced else None}.items()} | {"notes": p.notes}


def _meas_numbers(m: dict[str, Any] | None) -> dict[str, Any] | None:
    if not m:
        return None
    return {k: m.get(k) for k in ("qps", "p50_ms", "p99_ms", "step_ms", "calls", "wall_s") if k in m}


def before_after_rows(before: dict[str, Any], after: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The before/after table: one row per metric with both values and after/before."""
    rows = []
    for key, label in (("qps", "queries/s"), ("step_ms", "step ms"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
                       ("trace_util", "GPU busy (trace) %"), ("nvml_util", "GPU util (NVML) %"),
                       ("syncs_per_query", "syncs per query (trace)"), ("syncs_per_step", "syncs per step (trace)")):
        a = before.get(key)
        b = (after or {}).get(key)
        if a is None and b is None:
            continue
        ratio = (b / a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None
        rows.append({"metric": label, "key": key, "before": a, "after": b, "ratio": ratio})
    return rows


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
        from ..planning.whatif import union_ns

        act = trace.gpu_activity()
        span = int(act["end"].max() - act["start"].min())
        if span > 0:
            return round(100.0 * union_ns(act["start"].to_numpy(), act["end"].to_numpy()) / span, 2)
    return None


def measured_tables(res: ApplyResult) -> dict[str, Any]:
    """What the compare page shows above its plot (``reports.html.render_compare_html``'s
    ``measured``): the measured before/after rows, each measured candidate's predicted
    and measured numbers, and the evidence (syncs, the hook's call sites)."""
    key = "qps" if res.kind != "train" else "step_ms"
    cands = []
    for c in res.candidates:
        if c.measured is None and c.error is None:
            continue
        p, m = _pred_numbers(c.prediction), _meas_numbers(c.measured) or {}
        cands.append({"plan": c.prediction.candidate.label, "predicted": p.get(key), "measured": m.get(key),
                      "p99_ms": m.get("p99_ms"), "error": c.error})
    return {"chosen": res.chosen.label if res.chosen else None,
            "rows": before_after_rows(res.before, res.after), "candidates": cands,
            "p99_budget_ms": res.p99_budget_ms, "kind": res.kind, "evidence": res.evidence}


def keep_within(results: Sequence[CandidateResult], p99_budget_ms: float | None) -> tuple[list[CandidateResult], str | None]:
    """``(candidates to choose from, note)``: with a budget, the measured ones whose p99 is
    within it (as Triton's Model Analyzer does: the most throughput under the latency
    budget); when none is, all of them, with a note saying so."""
    if p99_budget_ms is None:
        return list(results), None
    ok = [r for r in results if r.measured and (r.measured.get("p99_ms") or math.inf) <= p99_budget_ms]
    if ok:
        return ok, f"kept the most queries/s among the {len(ok)} measured plans with p99 <= {p99_budget_ms:g} ms"
    best = min((r.measured.get("p99_ms") or math.inf for r in results if r.measured), default=math.inf)
    return list(results), (f"no measured plan met p99 <= {p99_budget_ms:g} ms (lowest: {best:.2f} ms): "
                           "kept the most queries/s regardless")


def batching_refused(cand: Candidate, hook: dict[str, Any] | None) -> str | None:
    """What to say where the kept plan asks for batching and its measured run batched no call
    (the hook refused the model's inputs: its label says batched, its calls ran unbatched)."""
    if not cand.batching or not hook or hook.get("batched_calls"):
        return None
    why = next((f for f in hook.get("fallbacks") or [] if f.startswith("not batched")), "no call was batched")
    copies = [s for s in hook.get("sites") or [] if s.get("kind") == "h2d"]
    taken = sum(int(s.get("taken_over") or 0) for s in copies)
    said = (f"; {taken} of {taken + sum(int(s.get('fallback') or 0) for s in copies)} input copies taken over"
            if taken else "; its input copies stayed PyTorch's (a batching plan learns no thread graphs)"
            if copies else "")
    return f"the kept plan's batching did not apply ({why}): its calls ran unbatched, each on its group's graphs{said}"


def _threads_named(hook: dict[str, Any] | None, names_key: str, count_key: str) -> str | None:
    """``"N thread(s) (a, b, ...)"`` from the hook's kept names and count of some threads, or None."""
    names = (hook or {}).get(names_key) or []
    if not names:
        return None
    n = max(int((hook or {}).get(count_key) or 0), len(names))
    return f"{n} thread{'s' if n > 1 else ''} ({', '.join(names)}{', ...' if n > len(names) else ''})"


def copy_only_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where the kept plan's run had threads, placed at their start, that copied to
    the GPU but called no model (the hook's ``copy_only_threads``): they may hand GPU tensors to
    the model threads with nothing ordering the two (placed at start: ``RECSYS_DOCTOR_PLACE=start``,
    or a plan without CUDA graphs)."""
    who = _threads_named(hook, "copy_only_threads", "copy_only_count")
    if who is None:
        return None
    return (f"{who} copied data "
            "to the GPU but called no model, on group streams of their own: where such a thread hands GPU tensors "
            "to the model threads nothing orders its work before their use; where the plan has CUDA graphs, threads "
            "are placed at their first model call (the default, unless RECSYS_DOCTOR_PLACE=start), so such threads "
            "stay on PyTorch's default stream, with which the group streams are ordered")


def training_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where threads of the kept plan's run trained a model (a backward or an
    optimizer step: the hook's ``training_threads``, :mod:`._autoapply.trainers`): they left their
    stream groups for PyTorch's default stream, and their later model calls were PyTorch's."""
    who = _threads_named(hook, "training_threads", "training_thread_count")
    if who is None:
        return None
    return (f"{who} trained "
            "a model (a backward or an optimizer step) and left their stream groups for PyTorch's default stream "
            "from then on, so that their in-place updates of the weights stay ordered with the other threads' model "
            "calls as one stream orders them unhooked; their own model calls after that ran as PyTorch runs them")


#: a kept plan whose p99 grew by more than this factor gets :func:`tail_note`
TAIL_GROWTH = 1.25


def tail_note(base: dict[str, Any] | None, kept: dict[str, Any] | None, hook: dict[str, Any] | None,
              budget_ms: float | None) -> str | None:
    """What to say where the kept plan served more queries a second but its p99 grew (by more
    than :data:`TAIL_GROWTH`) and no latency budget was given: both measured numbers, the graphs
    the hook captured while the script ran (each capture holds the other hooked threads' model
    calls off: stalls inside the measured window that a longer run spreads thinner), and
    ``--p99-ms``, which keeps the fastest plan within a budget."""
    b99, k99 = (base or {}).get("p99_ms"), (kept or {}).get("p99_ms")
    if budget_ms is not None or not b99 or not k99 or k99 <= TAIL_GROWTH * b99:
        return None
    captured = int((hook or {}).get("captured") or 0) + int((hook or {}).get("thread_graphs") or 0)
    why = (f"; the hook captured {captured} CUDA graphs while the script ran, each holding the other threads' "
           "model calls off while it was made, inside the measured window (a longer run spreads them thinner)"
           if captured else "")
    bq, kq = (base or {}).get("qps"), (kept or {}).get("qps")
    rate = f" ({bq:g} -> {kq:g} q/s)" if bq and kq else ""
    return (f"the kept plan's p99 grew from {b99:g} to {k99:g} ms ({k99 / b99:.2f}x) while it served more "
            f"queries a second{rate}{why}; --p99-ms MS keeps the fastest plan whose measured p99 is within MS")


def short_lives_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where most of the kept plan's hooked threads that ended lived short lives (the
    hook's ``ended_threads`` / ``short_lived_threads``, :func:`._autoapply.thread_graphs.short_lived`:
    a thread per request, a pool per wave): what that costs, and the remedy in the script."""
    ended = int((hook or {}).get("ended_threads") or 0)
    short = int((hook or {}).get("short_lived_threads") or 0)
    if not mostly_short(ended, short) or (hook or {}).get("batching"):  # (batching: no thread graphs at all)
        return None
    return (f"{short} of the {ended} hooked threads that ended made few model calls each (a thread per request, "
            "or a new pool per wave of requests): a thread's first call runs its copies as PyTorch makes them, and "
            f"no thread learned a graph of its own copies and model before {MIN_THREAD_CALLS} calls of its own "
            "(RECSYS_DOCTOR_THREAD_GRAPH_MIN_CALLS); serving threads kept for the whole run (one pool) "
            "would let the plan take their copies over")


def no_model_calls_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where the hook ran with CUDA graphs (its stats were written) and saw no model
    call at all: the script's model is not called through ``nn.Module.__call__``, so nothing
    could be graphed."""
    if not hook or not hook.get("active") or not hook.get("graphs"):  # (without graphs, model calls are not counted)
        return None
    if any(s.get("kind") == "model" for s in hook.get("sites") or []):
        return None
    copies = _calls(hook.get("sites") or [])
    return ("the hook saw no model call: the script's model is not called through torch.nn.Module.__call__ "
            "(a model that is not a torch.nn.Module: a plain function of tensor operations, a torch.export or "
            "AOTInductor package, ONNX Runtime, TensorRT), so nothing was graphed or placed in a group"
            + (f"; {copies} copies to the GPU were seen" if copies else "")
            + "; wrapping it in a torch.nn.Module called as model(...) lets a plan take it over")


def grad_on_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where most of a serving script's model calls ran with gradients on or the
    module in training mode (the hook's reason ``GRAD_ON`` at its model call sites): the hook
    runs those calls as PyTorch does (a CUDA graph replay keeps no autograd history, which a
    backward pass would need), and the script's own remedy."""
    most = _most_model_calls(hook, lambda why: why == GRAD_ON)
    if most is None:
        return None
    grad, calls, _ = most
    return (f"{grad} of the {calls} model calls ran with gradients on or the module in training mode, so the hook "
            "left them as PyTorch runs them (a CUDA graph replay keeps no autograd history): a serving script "
            "that calls model.eval() and makes its model calls under torch.inference_mode() (or torch.no_grad(), "
            "set in each thread that calls the model: grad mode is per thread), or freezes the model with "
            "model.requires_grad_(False), lets a plan graph them")


def needs_host_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where most model calls of a graphed plan ran eagerly because the model's
    forward needs the host inside a capture (the hook's reason starting ``NEEDS_HOST``): no plan
    graphs it as it is; the reason (the lines, and what keeps it capturable where that is known)."""
    most = _most_model_calls(hook, _needs_host)
    if most is None:
        return None
    host, calls, found = most
    why = max(found, key=lambda k: found[k])[len(NEEDS_HOST):].lstrip(": ")
    return (f"{host} of the {calls} model calls ran eagerly under the graphed plan: the model's forward needs the "
            f"host inside a CUDA graph capture, so no plan can graph it as it is ({why})")


def host_args_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where most model calls of a graphed plan ran eagerly because a tensor argument
    stays on the CPU (the hook's reason :data:`CPU_ARG` at its model call sites): the hook's reason
    where the model uses such an argument on the host (the line, PyTorch's function, the way out)."""
    most = _most_model_calls(hook, _cpu_arg)
    if most is None:
        return None
    n, calls, _ = most
    used = [f for f in (hook or {}).get("fallbacks") or [] if f.startswith(HOST_USE)]
    why = (f"the model uses it on the host {used[0][len(HOST_USE):].strip()}" if used else
           "a model on the CPU, or one that uses such an argument on the host")
    return (f"{n} of the {calls} model calls ran eagerly under the graphed plan: a tensor argument stays on the "
            f"CPU ({why}), so no plan can graph those calls as they are")


def unkeyed_note(hook: dict[str, Any] | None) -> str | None:
    """What to say where most model calls of a graphed plan ran eagerly because an argument is of
    a type no graph takes (the hook's reasons starting :data:`UNKEYED`: an object of the script's
    own holding tensors, as TorchRec's ``KeyedJaggedTensor`` or ``examples/heldout/kjt_ranker_serve.py``'s
    ``KeyedJagged``): the types, and what would let a plan try."""
    most = _most_model_calls(hook, _unkeyed)
    if most is None:
        return None
    n, calls, found = most
    types = sorted({why[len(UNKEYED):] for why in found})
    what = f"an argument of type {types[0]} is" if len(types) == 1 else f"arguments of types {', '.join(types)} are"
    return (f"{n} of the {calls} model calls ran eagerly under the graphed plan: {what} not what a CUDA graph is "
            "keyed by (tensors, lists, tuples, dicts and dataclasses of them, and plain constants are), so no plan "
            "can graph those calls as they are; passing the tensors it holds as arguments, or making its class a "
            "dataclass, lets a plan try (a forward that reads values on the host, such as .tolist() of lengths or "
            "offsets, still cannot be captured)")


def graphs_out_of_reach(hook: dict[str, Any] | None, label: str) -> str | None:
    """Where a serving script's graphed plan ``label`` captured no graph at all (none of the
    groups', no thread's) and most of its model calls ran eagerly for a reason no other graphed
    plan changes (an argument no graph is keyed by, a tensor argument left on the CPU, a forward
    that needs the host in a capture): why the other graphed plans need not be run; else None."""
    if not hook or not hook.get("graphs") or hook.get("batching") or hook.get("captured") or hook.get("thread_graphs"):
        return None
    for match in (_unkeyed, _cpu_arg, _needs_host):  # (the reasons of unkeyed_note, host_args_note, needs_host_note)
        most = _most_model_calls(hook, match)
        if most is not None:
            n, calls, found = most
            return (f"under {label} no graph was captured and {n} of the {calls} model calls ran eagerly "
                    f"({max(found, key=lambda k: found[k])}), a reason no other group count or pool changes, so the "
                    "other graphed plans were not run")
    return None


def host_work_note(advise: Any) -> str | None:
    """What to say where most of the baseline's wait for the host followed host work outside CUDA
    calls (``launch-bound``'s ``host_work_share_of_host_wait`` >= 0.5 in the diagnosis of the
    script as it is): no plan removes that work, and how to see what it is."""
    for f in getattr(advise, "findings", None) or []:
        ev = f.evidence if f.id == "launch-bound" else {}
        share, us = ev.get("host_work_share_of_host_wait"), ev.get("host_work_us")
        if share is not None and share >= 0.5:
            return (f"as it is, {share:.0%} of the time the script's GPU waited for the host followed at least "
                    f"{us:g} us in which the launching thread made no CUDA call (the script's own Python, preprocessing, "
                    "another thread holding the GIL): graphs and stream groups remove launch calls, not that work; "
                    "py-spy --gil on the script shows what it is")
    return None


def devices_note(advise: Any) -> str | None:
    """Where the script as it is ran kernels on more than one GPU (a replica per GPU): what the
    two utilization rows measure there (the trace's over all of them, NVML's on GPU 0 alone)."""
    devs = list((getattr(advise, "summary", None) or {}).get("devices") or [])
    if len(devs) < 2:
        return None
    return (f"the script ran kernels on {len(devs)} GPUs ({', '.join(map(str, devs))}): 'GPU busy (trace)' is their busy "
            "time over their windows, each summed over the GPUs; 'GPU util (NVML)' samples GPU 0 alone")


def call_notes(hook: dict[str, Any] | None, train: bool) -> tuple[str | None, ...]:
    """The notes on how the model calls ran (:func:`grad_on_note` for serving, :func:`needs_host_note`,
    :func:`host_args_note`, :func:`unkeyed_note`)."""
    return (None if train else grad_on_note(hook)), needs_host_note(hook), host_args_note(hook), unkeyed_note(hook)


def run_notes(hook: dict[str, Any] | None, train: bool, advise: Any) -> tuple[str | None, ...]:
    """:func:`call_notes`, and :func:`host_work_note` and :func:`devices_note` of the script as it
    is (``advise``: its diagnosis)."""
    return (*call_notes(hook, train), host_work_note(advise), devices_note(advise))


def _needs_host(why: str) -> bool:
    return why.startswith(NEEDS_HOST)


def _cpu_arg(why: str) -> bool:
    return why == CPU_ARG


def _unkeyed(why: str) -> bool:
    return why.startswith(UNKEYED)


def _most_model_calls(hook: dict[str, Any] | None, match: Any) -> tuple[int, int, dict[str, int]] | None:
    """Where the hook ran with graphs and most of its model calls were left to PyTorch for a
    reason ``match(reason)`` accepts: ``(those calls, all model calls, {reason: calls})``; else None."""
    if not hook or not hook.get("graphs"):
        return None
    rows = [s for s in hook.get("sites") or [] if s.get("kind") == "model"]
    calls = _calls(rows)
    found: dict[str, int] = {}
    for s in rows:
        for why, n in (s.get("reasons") or {}).items():
            if match(why):
                found[why] = found.get(why, 0) + int(n)
    n = sum(found.values())
    return (n, calls, found) if calls and 2 * n > calls else None


def _calls(sites: Sequence[dict[str, Any]]) -> int:
    """Calls counted at these call sites of the hook's stats, taken over or left to PyTorch."""
    return sum(int(s.get("taken_over", 0)) + int(s.get("fallback", 0)) for s in sites)
