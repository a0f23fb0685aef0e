"""Threads that train the model the others serve (recsys_doctor/applying/_autoapply/trainers.py).

A learner thread placed on a group stream would update the weights in place beside the other
groups' replays with nothing between them; it leaves its group for PyTorch's default stream at
its first backward or optimizer step, and a ``load_state_dict`` from a thread on a group stream is
fenced with every other group stream. Here with a stand-in for ``torch.cuda`` that logs every
stream operation, and with real (CPU) PyTorch for the patches: the backward, ``autograd.grad``
and an optimizer's step each make a placed thread leave, once; the main thread's own group
(placed late, on the default stream already) stays; ``uninstall`` restores PyTorch. The GPU
check of the same: the held-out ``examples/heldout/online_learning_serve.py`` through
``profile --apply`` (tests/test_heldout_gpu.py).
"""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch

from recsys_doctor.applying._autoapply import trainers
from recsys_doctor.applying._autoapply._common import _state, _tls
from recsys_doctor.applying._autoapply.groups import _Group
from recsys_doctor.applying.report import training_note
from recsys_doctor.applying.script_hook import merge_hook_stats

DEFAULT, G0, G1, G2 = 0, 100, 101, 102  # raw stream handles: the default stream and three group streams
DEV = "cuda:0"


class FakeCuda:
    """What ``trainers`` calls of ``torch.cuda``, logging stream operations; ``cur`` is the
    calling thread's current stream."""

    def __init__(self, cur: int) -> None:
        self.cur = cur
        self.log: list[tuple] = []
        fake = self

        class Stream:
            def __init__(self, raw: int) -> None:
                self.cuda_stream = raw
                self.device = DEV

            def wait_stream(self, other) -> None:
                fake.log.append(("wait_stream", self.cuda_stream, other.cuda_stream))

            def wait_event(self, ev) -> None:
                fake.log.append(("wait_event", self.cuda_stream, ev.on))

        class Event:
            def record(self, stream) -> None:
                self.on = stream.cuda_stream
                fake.log.append(("record", stream.cuda_stream))

        def set_stream(s) -> None:
            fake.cur = s.cuda_stream
            fake.log.append(("set_stream", s.cuda_stream))

        self.Stream = Stream
        self.cuda = SimpleNamespace(current_stream=lambda dev=None: Stream(fake.cur),
                                    default_stream=lambda dev=None: Stream(DEFAULT), set_stream=set_stream,
                                    device=lambda dev: contextlib.nullcontext(), Event=Event)


@pytest.fixture
def hook_state(monkeypatch):
    """Three group streams on one device (a group holds them: ``_Group.streams``), the hook's
    training counts, and no thread placed."""
    fake = FakeCuda(G1)
    streams = SimpleNamespace(device=DEV, streams=[fake.Stream(r) for r in (G0, G1, G2)])
    for k, v in {"training_threads": [], "training_threads_count": 0}.items():
        monkeypatch.setitem(_state, k, v)
    yield fake, streams
    for k in ("group", "copies"):
        if hasattr(_tls, k):
            delattr(_tls, k)


def _place(fake: FakeCuda, streams, k: int, late: int | None = None) -> _Group:
    g = _Group(k, streams.streams[k], streams)
    g.late = late
    _tls.group = g
    _tls.copies = None
    return g


def test_a_thread_that_trains_leaves_its_group_for_the_default_stream(hook_state):
    fake, streams = hook_state
    _place(fake, streams, 1)
    trainers.leave_for_training(fake)
    assert fake.log == [("set_stream", DEFAULT)] and fake.cur == DEFAULT
    assert _tls.group is None  # (its later model calls are PyTorch's)
    assert _state["training_threads"] == [threading.current_thread().name] and _state["training_threads_count"] == 1
    trainers.leave_for_training(fake)  # once: no group any more, nothing done or counted
    assert fake.log == [("set_stream", DEFAULT)] and _state["training_threads_count"] == 1


def test_a_thread_on_a_stream_of_its_own_keeps_it(hook_state):
    fake, streams = hook_state
    _place(fake, streams, 1)
    fake.cur = 555  # (the script's own stream, set around its step)
    trainers.leave_for_training(fake)
    assert fake.log == [] and fake.cur == 555 and _tls.group is None


def test_the_main_threads_own_group_stays(hook_state):
    fake, streams = hook_state
    g = _place(fake, streams, 1, late=1)
    trainers.leave_for_training(fake)
    assert fake.log == [] and _tls.group is g and _state["training_threads_count"] == 0


def test_a_write_from_a_group_stream_is_fenced_with_every_other_group_stream(hook_state):
    fake, streams = hook_state
    _place(fake, streams, 1)
    assert trainers.fenced(fake, lambda: fake.log.append(("write", fake.cur)) or "done") == "done"
    assert fake.log == [("wait_stream", G1, G0), ("wait_stream", G1, G2), ("write", G1), ("record", G1),
                        ("wait_event", G0, G1), ("wait_event", G2, G1)]


def test_a_write_elsewhere_is_left_alone(hook_state):
    fake, streams = hook_state
    fake.cur = DEFAULT
    assert trainers.fenced(fake, lambda: 7) == 7 and fake.log == []  # (not placed)
    _place(fake, streams, 1)
    assert trainers.fenced(fake, lambda: 8) == 8 and fake.log == []  # (placed, but on the default stream now)


@pytest.fixture
def installed(monkeypatch):
    """The patches on real (CPU) PyTorch, and what they would have done recorded instead."""
    calls: list[str] = []
    monkeypatch.setattr(trainers, "leave_for_training", lambda t: calls.append("leave"))
    monkeypatch.setattr(trainers, "fenced", lambda t, write: (calls.append("fenced"), write())[1])
    trainers.uninstall(torch)  # (an earlier test's activation of the hook may have left its patches)
    origs = (torch.autograd.backward, torch.autograd.grad, torch.nn.Module.load_state_dict)
    trainers.install(torch)
    yield calls
    trainers.uninstall(torch)
    assert (torch.autograd.backward, torch.autograd.grad, torch.nn.Module.load_state_dict) == origs
    assert "orig_trainer_fns" not in _state


def test_backward_grad_and_an_optimizer_step_are_training(installed):
    m = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    before = m.weight.detach().clone()
    m(torch.ones(2, 3)).sum().backward()
    assert installed == ["leave"]
    torch.autograd.grad(m(torch.ones(2, 3)).sum(), m.weight)
    assert installed == ["leave", "leave"]
    opt.step()
    assert installed == ["leave"] * 3
    assert not torch.equal(before, m.weight)  # (the step itself ran)
    m2 = torch.nn.Linear(3, 1)
    m2.load_state_dict(m.state_dict())
    assert installed[-1] == "fenced" and torch.equal(m2.weight, m.weight)


def test_install_is_once(installed):
    first = torch.autograd.backward
    trainers.install(torch)
    assert torch.autograd.backward is first


def test_the_report_names_the_training_threads_and_child_processes_add_up():
    assert training_note({"training_threads": []}) is None and training_note(None) is None
    note = training_note({"training_threads": ["learner"], "training_thread_count": 1})
    assert note.startswith("1 thread (learner) trained a model") and "default stream" in note
    merged = merge_hook_stats({"training_threads": ["a"], "training_thread_count": 1},
                              [{"training_threads": ["b"], "training_thread_count": 2}])
    assert merged["training_threads"] == ["a", "b"] and merged["training_thread_count"] == 3
    assert training_note(merged).startswith("3 threads (a, b, ...) trained")
