"""Threads that write the weights other threads serve: ordered with every group's work.

Unhooked, every thread of a script runs on PyTorch's default stream, so a thread that trains
the model the others serve (an online learner: ``loss.backward()``, ``opt.step()`` in place,
``examples/heldout/online_learning_serve.py``) has its updates ordered with every request's
kernels by that one stream: a request enqueued after the learner's last step reads the new
weights, one enqueued before reads the old ones. Placed on a group stream of its own, the
learner's in-place updates ran beside the other groups' replays with nothing between them: a
request could read half-updated weights while the learner's queued steps still ran.

* **A thread that trains leaves its group** at its first ``backward`` (``Tensor.backward``,
  ``torch.autograd.backward`` or ``torch.autograd.grad``) or optimizer step: from then on it runs
  on PyTorch's default stream, as unhooked, and its model calls are PyTorch's. The group streams
  are blocking (:class:`.groups._Streams`), so the default stream's work and theirs are ordered
  both ways, as one stream orders them; what the thread queued on its group stream before comes
  first. The thread's deferred copies are made first. Counted (``stats()["training_threads"]``).
* **``load_state_dict`` from a thread on a group stream** (a worker that reloads its model in
  place) is fenced: its copies wait for the work every other group stream queued before it, and
  every group stream's later work waits for them.

``RECSYS_DOCTOR_TRAINERS=0`` leaves them as they were before (for a comparison run only).

A thread placed at its first model call with its own group (the main thread's training loop:
:func:`.interception._late_group`) keeps the stream it was on: the default stream already.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ._common import ENV_TRAINERS, _lock, _log, _state, _tls
from .thread_graphs import flush

#: threads that left their group to train, kept by name (all are counted)
MAX_NAMED = 8


def _placed_on_group_stream(torch: Any) -> Any:
    """The thread's plan group where it runs on that group's stream now, else None."""
    g = getattr(_tls, "group", None)
    if g is None or g.late is not None or g.stream is None:
        return None
    return g if torch.cuda.current_stream(g.stream.device).cuda_stream == g.stream.cuda_stream else None


def leave_for_training(torch: Any) -> None:
    """The calling thread trains: it leaves its group for PyTorch's default stream (once)."""
    g = getattr(_tls, "group", None)
    if g is None or g.late is not None:
        return
    st = getattr(_tls, "copies", None)
    if st is not None:
        flush(torch, st)
        _tls.copies = None
    if _placed_on_group_stream(torch) is not None:
        dev = g.stream.device
        with torch.cuda.device(dev):
            torch.cuda.set_stream(torch.cuda.default_stream(dev))
    _tls.group = None  # (its later model calls are PyTorch's: interception's __call__)
    name = threading.current_thread().name
    with _lock:
        n = _state["training_threads_count"] = _state.get("training_threads_count", 0) + 1
        names = _state.setdefault("training_threads", [])
        if len(names) < MAX_NAMED:
            names.append(name)
    if n == 1:
        _log(f"thread {name!r} trains (a backward or an optimizer step): it left its stream group for PyTorch's "
             "default stream, so its writes to the weights stay ordered with the other threads' model calls")


def fenced(torch: Any, write: Any) -> Any:
    """``write()`` from a thread on a group stream, ordered with every other group stream's work
    before it and after it (see the module's docstring); plainly elsewhere."""
    g = _placed_on_group_stream(torch)
    if g is None:
        return write()
    cur = torch.cuda.current_stream(g.stream.device)
    others = [s for s in g.streams.streams if s.cuda_stream != cur.cuda_stream]  # (its device's plan groups)
    for s in others:
        cur.wait_stream(s)
    try:
        return write()
    finally:
        done = torch.cuda.Event()
        done.record(cur)
        for s in others:
            s.wait_event(done)


def install(torch: Any) -> None:
    """Patch ``torch.autograd.backward``/``grad`` and ``nn.Module.load_state_dict``, and hook
    every optimizer's step (once; :func:`uninstall` undoes it). Not where ``$RECSYS_DOCTOR_TRAINERS``
    is "0" (a comparison run: training threads then stay in their groups)."""
    if _state.get("orig_trainer_fns") or os.environ.get(ENV_TRAINERS) == "0":
        return
    autograd, nn = torch.autograd, torch.nn
    origs = {"backward": autograd.backward, "grad": autograd.grad, "load_state_dict": nn.Module.load_state_dict}

    def wrap(orig: Any) -> Any:
        def trains(*args: Any, **kwargs: Any) -> Any:
            leave_for_training(torch)
            return orig(*args, **kwargs)

        trains.__wrapped__ = orig  # type: ignore[attr-defined]
        trains.__name__ = orig.__name__
        trains.__doc__ = orig.__doc__
        return trains

    def load_state_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fenced(torch, lambda: origs["load_state_dict"](self, *args, **kwargs))

    load_state_dict.__wrapped__ = origs["load_state_dict"]  # type: ignore[attr-defined]
    autograd.backward = wrap(origs["backward"])
    autograd.grad = wrap(origs["grad"])
    nn.Module.load_state_dict = load_state_dict
    handle = None
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: leave_for_training(torch))
    except ImportError:  # pragma: no cover - every PyTorch we support has it
        pass
    _state["orig_trainer_fns"] = origs
    _state["trainer_step_hook"] = handle


def uninstall(torch: Any) -> None:
    origs = _state.pop("orig_trainer_fns", None)
    if not origs:
        return
    torch.autograd.backward = origs["backward"]
    torch.autograd.grad = origs["grad"]
    torch.nn.Module.load_state_dict = origs["load_state_dict"]
    handle = _state.pop("trainer_step_hook", None)
    if handle is not None:
        handle.remove()
