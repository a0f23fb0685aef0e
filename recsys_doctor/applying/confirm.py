"""A close win, measured again: ``profile --apply`` on a plain script keeps the best plan
measured only where it beats the script as it is; where it beats it by less than
:data:`CONFIRM_BELOW`, one run of each says little (on the H100 one search of the held-out
async re-ranker ran its g1 plan at 551 q/s and the same plan with batching on, whose calls all
ran unbatched, at 1,019; the suite's unhooked baselines moved 1.6x between machines). So the
script as it is and the plan run once more, one after the other, and the plan is kept only if
it wins that round too; the second round goes to ``confirm.log`` and the notes."""

from __future__ import annotations

from typing import Any

from ..errors import RecsysDoctorError
from ..planning.io import write_plan
from .report import CandidateResult
from .script_hook import fail_on_thread_errors, read_hook_stats, run_as_is, run_script, script_env

__all__ = ["CONFIRM_BELOW", "metric", "ratio", "needs_confirming", "confirm", "both_rounds"]

#: a win below this ratio (q/s after / before; step time before / after) is measured again
CONFIRM_BELOW = 1.5


def metric(train: bool) -> tuple[str, str]:
    """``(key, unit)`` of a plain script's printed measurement: its step time for a training
    loop, else its queries/s."""
    return ("step_ms", "ms a step") if train else ("qps", "q/s")


def ratio(before: dict[str, Any] | None, after: dict[str, Any] | None, train: bool) -> float | None:
    """How many times faster ``after`` ran than ``before`` (their q/s, or for a training loop
    their step times), or None where either has no number."""
    key = metric(train)[0]
    b, a = (before or {}).get(key), (after or {}).get(key)
    if not b or not a:
        return None
    return b / a if train else a / b


def needs_confirming(base: dict[str, Any], measured: dict[str, Any] | None, train: bool) -> bool:
    """Whether a kept plan's win over the script as it is is close enough to be measured again."""
    r = ratio(base, measured, train)
    return r is not None and r < CONFIRM_BELOW


def confirm(run: Any, argv: list[str], advised: dict[str, Any], base: dict[str, Any], best: Any, train: bool,
            timeout_s: float, notes: list[str]) -> tuple[str | None, tuple[dict[str, Any], dict[str, Any]]]:
    """Run the script as it is, then under ``best``'s plan, once more (``run``: the search's
    ``_Setup``); append what the round measured to ``notes``. Returns why the plan is declined
    (it lost the round, or its run failed), or None where it won again (or where the script as
    it is failed its second run: the plan's first run stands, and the note says so); and the
    measurements to report as before and after: where the plan won both rounds, each the mean of
    its two rounds (:func:`both_rounds`), else the first round's."""
    label = best.prediction.candidate.label
    key, unit = metric(train)
    first = ratio(base, best.measured, train)
    run.say(f"measuring a close win once more ({first:.2f}x): the script as it is, then {label}")
    log = run.out / "confirm.log"
    try:
        if getattr(run, "metered", False):  # (the script prints no measurement: the hook's, as in the search)
            base2, out2, _ = run_as_is(argv, run.out / "confirm", log=log, timeout_s=timeout_s, metered=True)
        else:
            base2, out2 = run_script(argv, log=log, timeout_s=timeout_s)
    except RecsysDoctorError as e:  # nothing to hold the plan's second run against: its first stands
        notes.append(f"a close win ({first:.2f}x) not measured again: the script as it is failed its second run: {e}")
        return None, (base, best.measured)
    plan = write_plan(run.out / "confirm.plan.json", advised, best.prediction.candidate)
    sp = run.out / "confirm.hook_stats.json"
    second_run = CandidateResult(best.prediction)
    try:
        second_run.measured, _ = run_script(argv, env=script_env(plan, hook_dir=run.out / "hook", stats_path=sp,
                                                                 meter=getattr(run, "metered", False)),
                                            log=log, timeout_s=timeout_s)
    except RecsysDoctorError as e:
        second_run.error = str(e)
    fail_on_thread_errors(second_run, read_hook_stats(sp), out2)  # (a thread that raised: that run failed)
    if second_run.error:
        return (f"declined: {label} won its first run by {first:.2f}x and failed the second: {second_run.error}",
                (base, best.measured))
    m2 = second_run.measured or {}
    second = ratio(base2, m2, train)
    said = (f"{base2.get(key)} -> {m2.get(key)} {unit}" if second is not None
            else "no number printed")
    notes.append(f"a close win ({first:.2f}x) measured once more, the script as it is and {label}: {said}"
                 + (f" ({second:.2f}x)" if second is not None else ""))
    if second is None or second < 1.0:
        return (f"declined: the best plan measured, {label}, won its first run by {first:.2f}x and lost the "
                f"second ({said}): within the machine's spread; the script is left unchanged (plan.json keeps "
                "that plan for reference)"), (base, best.measured)
    shown = both_rounds(base, base2), both_rounds(best.measured, m2)
    notes.append(f"before and after are the means of both rounds: {shown[0].get(key):g} -> {shown[1].get(key):g} {unit}"
                 f" ({ratio(*shown, train):.2f}x)")
    return None, shown


def both_rounds(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A run's measurement over its two rounds: the first's, with each of queries/s, latencies and
    step time the mean of the two rounds where both have it (what else the first printed stays)."""
    out = dict(first)
    for k in ("qps", "p50_ms", "p99_ms", "step_ms", "mean_ms"):
        a, b = first.get(k), second.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[k] = round((a + b) / 2, 4)
    return out


def declined(base: dict[str, Any], best: CandidateResult, train: bool) -> str | None:
    """Why the best measured plan is declined (it is slower than the script as it is: fewer
    queries/s, or a longer step: :func:`ratio` below 1), or None where it wins or ties."""
    m = best.measured or {}
    r = ratio(base, m, train)
    if r is None or r >= 1:
        return None
    key, unit = metric(train)
    return (f"declined: the best plan measured, {best.prediction.candidate.label}, ran at {m[key]:g} "
            f"{unit} against {base[key]:g} for the script as it is; the script is left unchanged (plan.json keeps "
            "that plan for reference)")
