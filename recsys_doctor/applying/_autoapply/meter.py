"""The hook's own measurement, for a script that prints none: its top-level model calls counted
and timed (``RECSYS_DOCTOR_METER=1``).

``profile --apply`` compares plans by what the script prints (its last JSON line's ``qps`` or
``step_ms``). A script written without that in mind prints nothing of the kind; then every run the
tool makes of it - as it is, under a meter-only plan that changes nothing else
(``{"meter_only": true}``: :func:`activate_meter`), and under each candidate plan - has its
top-level ``nn.Module`` calls (a call made inside another model call is not counted) timed at
their return, and the stats carry :func:`measurement`: calls a second over the run, the first
:data:`SKIP` of the calls (warm-up, captures) left out, the same way for every run. It is a rate
of model calls, not of the script's requests (a request of two model calls counts two), and it
has no latency. A training loop is measured by its optimizer steps instead, where it makes at
least :data:`MIN_CALLS` of them (PyTorch's global step hook, :func:`watch_steps`): its step time,
``step_ms``, as a loop that prints its own is compared. Worker processes of the script that called models write their counts at exit
(:func:`.report._at_exit`), and the program's rate is their sum; a worker a pool terminates runs
no exit handler, and its calls are lost. Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: "1": top-level model calls are counted and timed (:func:`wrap`)
ENV_METER = "RECSYS_DOCTOR_METER"
#: the share of the first calls left out of the rate (warm-up, graph captures)
SKIP = 0.1
#: fewest calls that make a rate
MIN_CALLS = 20
#: calls timed per thread at most (past them, the rest are counted only)
MAX_TIMES = 1_000_000

_m = threading.local()
_lock = threading.Lock()
_threads: list[list[float]] = []  # each thread's call end times
_untimed = [0]
_gen = [0]  # bumped by reset(): a thread's list of an earlier generation is replaced


def wrap(call: Any, on: bool) -> Any:
    """``call`` (a ``Module.__call__``) metered where ``on``, else as it is."""
    if not on:
        return call

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_m, "busy", False):  # (a call inside a model call: not counted)
            return call(self, *args, **kwargs)
        _m.busy = True
        try:
            return call(self, *args, **kwargs)
        finally:
            _m.busy = False
            _ended(time.perf_counter())

    __call__.__wrapped__ = call  # type: ignore[attr-defined]
    return __call__


def install(torch: Any, call: Any, on: bool | None = None) -> Any:
    """``call`` (a ``Module.__call__``: the hook's, or PyTorch's under the meter-only plan)
    metered, and optimizer steps timed, where ``on`` (None: where ``RECSYS_DOCTOR_METER=1``);
    else ``call`` as it is."""
    if on is None:
        on = os.environ.get(ENV_METER) == "1"
    if on:
        watch_steps(torch)
    return wrap(call, on)


def _ended(t: float) -> None:
    times = getattr(_m, "times", None)
    if times is None or _m.gen != _gen[0]:
        times = _m.times = []
        with _lock:
            _m.gen = _gen[0]
            _threads.append(times)
    if len(times) < MAX_TIMES:
        times.append(t)
    else:
        _untimed[0] += 1


_steps: list[float] = []  # optimizer steps' end times (every thread's)
_step_hook: list[Any] = []  # the handle of the global step hook, once registered


def watch_steps(torch: Any) -> None:
    """Time every optimizer step (``torch.optim``'s global post-step hook), once."""
    if _step_hook:
        return
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:  # (a PyTorch without it: the model calls are the measurement)
        return
    _step_hook.append(register_optimizer_step_post_hook(_stepped))


def _stepped(*_args: Any) -> None:
    if len(_steps) < MAX_TIMES:
        _steps.append(time.perf_counter())


def reset() -> None:
    """Forget every call and step timed so far (a new activation of the hook)."""
    with _lock:
        _threads.clear()
        _untimed[0] = 0
        _gen[0] += 1
        _steps.clear()


def timed() -> int:
    """Calls and optimizer steps timed so far (every thread's)."""
    return len(_steps) + sum(len(ts) for ts in list(_threads))


def _window(times: list[float]) -> tuple[int, float] | None:
    """``(events counted, seconds)`` over sorted ``times``, the first :data:`SKIP` of them left
    out: the rate's numerator and window; None with fewer than :data:`MIN_CALLS` or no time."""
    if len(times) < MIN_CALLS:
        return None
    k = int(len(times) * SKIP)
    window = times[-1] - times[k]
    return (len(times) - 1 - k, window) if window > 0 else None


def measurement() -> dict[str, Any] | None:
    """``{"qps", "calls", "window_s", "source": "hook"}`` over the calls timed so far (every
    thread's), the first :data:`SKIP` of them left out; None with fewer than :data:`MIN_CALLS`.
    Where at least :data:`MIN_CALLS` optimizer steps were timed: ``{"step_ms", "steps",
    "window_s", "source": "hook"}`` over them instead."""
    steps = sorted(_steps)
    w = _window(steps)
    if w is not None:
        return {"step_ms": round(w[1] / w[0] * 1e3, 4), "steps": len(steps), "window_s": round(w[1], 3),
                "source": "hook"}
    with _lock:
        times = sorted(t for ts in _threads for t in list(ts))
    w = _window(times)
    if w is None:
        return None
    return {"qps": round(w[0] / w[1], 1), "calls": len(times) + _untimed[0], "window_s": round(w[1], 3),
            "source": "hook"}
