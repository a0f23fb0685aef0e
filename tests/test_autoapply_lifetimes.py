"""The script hook's thread graphs where the script's threads live short lives (a thread per
request, a pool per wave of requests): once most placed threads that ended made fewer model
calls than :data:`~recsys_doctor.applying._autoapply.thread_graphs.MIN_THREAD_CALLS`, a thread
learns no graph until it has made that many calls itself; a thread that ended is counted once,
and only where it was placed with a copy state. The GPU side (the capture count and outputs of
a thread-per-request script) is in ``tests/test_autoapply_gpu.py``."""

from __future__ import annotations

import threading

import pytest

from recsys_doctor.applying import _autoapply as hook
from recsys_doctor.applying._autoapply import thread_graphs as tgm
from recsys_doctor.applying._autoapply._common import _tls

torch = pytest.importorskip("torch")


@pytest.fixture
def lives(monkeypatch):
    monkeypatch.setitem(hook._state, "ended_threads", 0)
    monkeypatch.setitem(hook._state, "short_lived_threads", 0)


def _end_thread(calls: int | None) -> None:
    """A thread that made ``calls`` model calls (None: never placed with a copy state) ends."""

    def body() -> None:
        if calls is not None:
            _tls.copies = hook._ThreadCopies(stream=None)
            _tls.calls = calls
        tgm.thread_ended()

    t = threading.Thread(target=body)
    t.start()
    t.join()


def test_lives_are_judged_after_enough_threads_ended(lives):
    for _ in range(tgm.LIVES_SEEN - 1):
        _end_thread(1)
    assert not tgm.short_lived()  # 3 ended: too few to judge
    _end_thread(1)
    assert tgm.short_lived()
    assert (hook._state["ended_threads"], hook._state["short_lived_threads"]) == (4, 4)


def test_long_lives_keep_thread_graphs(lives):
    for calls in (tgm.MIN_THREAD_CALLS, 500, 1, tgm.MIN_THREAD_CALLS - 1):
        _end_thread(calls)
    assert not tgm.short_lived()  # 2 of 4 short: not most
    _end_thread(2)
    assert tgm.short_lived()  # 3 of 5


def test_threads_never_placed_with_copies_are_not_counted(lives):
    for _ in range(6):
        _end_thread(None)
    assert hook._state["ended_threads"] == 0 and not tgm.short_lived()


def test_a_young_thread_learns_nothing_where_lives_are_short(hook_group, lives):
    """``_learn`` of a call the group has no graph of counts a learning try; where threads are
    short-lived, a thread of fewer calls than the minimum is not even tried (nothing counted, no
    reason set: it is asked again at its later calls), and one past the minimum is."""
    lin = torch.nn.Linear(4, 2).eval()
    st = hook._ThreadCopies(stream=None)
    recent = [(lambda: None, lambda: None, None, None, "s.py:3")]

    def learn(calls: int) -> int:
        _tls.calls = calls
        before = st.learn_tries
        with torch.no_grad():
            tgm._learn(torch, st, type(lin).__call__, lin, (), {}, recent, "s.py:4")  # (no tensor: a key on the CPU)
        assert st.reason is None and st.tg is None
        return st.learn_tries - before

    try:
        assert learn(1) == 1  # nothing judged yet: tried
        for _ in range(tgm.LIVES_SEEN):
            _end_thread(1)
        assert learn(1) == 0  # young, among short lives: not tried
        assert learn(tgm.MIN_THREAD_CALLS) == 1  # this thread has lived long enough
    finally:
        del _tls.calls


def test_the_report_says_when_threads_lived_short_lives():
    from recsys_doctor.applying.report import short_lives_note

    assert short_lives_note(None) is None
    assert short_lives_note({"ended_threads": 3, "short_lived_threads": 3}) is None  # too few to judge
    assert short_lives_note({"ended_threads": 10, "short_lived_threads": 5}) is None  # not most
    assert short_lives_note({"ended_threads": 376, "short_lived_threads": 372, "batching": True}) is None
    note = short_lives_note({"ended_threads": 376, "short_lived_threads": 372})
    assert note.startswith("372 of the 376 hooked threads that ended made few model calls each")
    assert "RECSYS_DOCTOR_THREAD_GRAPH_MIN_CALLS" in note and "one pool" in note


def test_a_thread_whose_calls_no_graph_takes_stops_learning_and_staging(hook_group):
    """A model call with an argument no graph takes (an object of the script's own, as
    kjt_ranker_serve.py's KeyedJagged) is counted; past ``LEARN_TRIES`` of them, and no call a
    graph could take, the thread gives up its graph with the reason, and its host copies no longer
    go into slots (``_slot_thread`` is None: PyTorch's copies, as unhooked) - before, it learned
    every query. A thread that also calls a model a graph takes keeps learning for that one."""
    from recsys_doctor.applying._autoapply.staging import _slot_thread

    class Jagged:  # (not a tensor, a dataclass or a container: no key)
        pass

    lin = torch.nn.Linear(4, 2).eval()
    st = _tls.copies = hook._ThreadCopies(stream=None)
    _tls.calls, _tls.depth = tgm.MIN_THREAD_CALLS, 0
    recent = [(lambda: None, lambda: None, None, None, "s.py:3")]
    try:
        def learn(*args):
            with torch.no_grad():
                tgm._learn(torch, st, type(lin).__call__, lin, args, {}, recent, "s.py:4")

        for i in range(tgm.LEARN_TRIES):
            learn(Jagged())
            assert st.reason is None and st.unkeyed == i + 1 and _slot_thread() is st
        learn(Jagged())
        assert st.reason == tgm.NOT_KEYED and st.tg is None and _slot_thread() is None
        # a thread that also calls a model a graph could take (two models a query) keeps learning
        _tls.copies = st = hook._ThreadCopies(stream=None)
        learn()  # (no tensor: a key on the CPU; no graph of it yet: a try)
        for _ in range(2 * tgm.LEARN_TRIES):
            learn(Jagged())
        assert st.reason is None and st.learn_tries == 1 and _slot_thread() is st
    finally:
        del _tls.calls, _tls.copies, _tls.depth


class _Synced:
    """The current stream's stand-in: counts its synchronizations."""

    def __init__(self) -> None:
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1


def test_a_thread_graph_that_rarely_replays_is_dropped(hook_group, monkeypatch):
    """A thread graph serves one key; a thread whose calls vary more (optional features, row
    buckets) staged its copies into slots every query for a replay that hardly ever came. Once
    ``REPLAY_WINDOW`` calls have passed since its capture, a graph that served fewer than a quarter
    of them is dropped with the reason, after one synchronize (its last replay read its buffers),
    and the thread's copies are PyTorch's (``_slot_thread`` None). The boundary by hand: 16 hits
    in 64 calls is a quarter (kept), 16 in 65 is not (dropped). A call that paid nothing for the
    graph (no copy deferred for it, none staged) is not counted."""
    from recsys_doctor.applying._autoapply.staging import _slot_thread, _ThreadGraph

    stream = _Synced()
    monkeypatch.setitem(hook._state, "replay_window", tgm.REPLAY_WINDOW)  # (as activate() sets it, unset in the env)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: stream)
    monkeypatch.setattr(tgm, "_graphed_call", lambda orig, m, a, k, site="?": orig(m, *a, **k))
    lin = torch.nn.Linear(4, 2).eval()
    st = _tls.copies = hook._ThreadCopies(stream=None)
    st.tg = tg = _ThreadGraph(lin, None, [torch.zeros(1)], [], None, None, 0)  # one copy a call: none made
    st.tg_hits, st.tg_calls = 16, 16
    _tls.calls, _tls.depth = tgm.MIN_THREAD_CALLS, 0
    x = torch.randn(3, 4)
    try:
        with torch.no_grad():
            for _ in range(3 * tgm.REPLAY_WINDOW):  # calls that paid nothing for it (no copy staged
                tgm._copies_call(st, type(lin).__call__, lin, (x,), {}, "s.py:9")  # or deferred): not counted
            assert st.tg is tg and st.tg_calls == 16 and stream.syncs == 0
            st.slot_n = 1  # (from now on each call's copy was staged into a slot: a miss that cost)
            for i in range(tgm.REPLAY_WINDOW - 16):  # misses: 17th ... 64th call
                out = tgm._copies_call(st, type(lin).__call__, lin, (x,), {}, "s.py:9")
                assert st.tg is tg and st.reason is None and _slot_thread() is st, i
            assert st.tg_calls == 64 and stream.syncs == 0
            torch.testing.assert_close(out, lin(x))  # (the call itself ran: its result)
            tgm._copies_call(st, type(lin).__call__, lin, (x,), {}, "s.py:9")  # 65th: 16 of 65
        assert st.tg is None and st.reason == tgm.RARELY_REPLAYED and _slot_thread() is None
        assert stream.syncs == 1 and hook._state["fallbacks"] == [tgm.RARELY_REPLAYED]
        with torch.no_grad():  # dropped for good: no judging, no learning, no second sync
            tgm._copies_call(st, type(lin).__call__, lin, (x,), {}, "s.py:9")
        assert st.tg is None and stream.syncs == 1 and hook._state["fallbacks"] == [tgm.RARELY_REPLAYED]
    finally:
        del _tls.calls, _tls.copies, _tls.depth


def test_the_replay_window_is_set_from_the_environment_and_0_never_drops(hook_group, monkeypatch):
    """``RECSYS_DOCTOR_REPLAY_WINDOW``: the calls before a thread graph is judged (a bad value: the
    default, said on stderr; a negative one: 0); 0 keeps every thread graph, as before the drop
    (a same-tree comparison on the GPU)."""
    from recsys_doctor.applying._autoapply.staging import _ThreadGraph

    for raw, want in ((None, tgm.REPLAY_WINDOW), ("128", 128), ("-3", 0), ("0", 0), ("many", tgm.REPLAY_WINDOW)):
        if raw is None:
            monkeypatch.delenv("RECSYS_DOCTOR_REPLAY_WINDOW", raising=False)
        else:
            monkeypatch.setenv("RECSYS_DOCTOR_REPLAY_WINDOW", raw)
        assert tgm._replay_window() == want, raw
    monkeypatch.setitem(hook._state, "replay_window", 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Synced())
    monkeypatch.setattr(tgm, "_graphed_call", lambda orig, m, a, k, site="?": orig(m, *a, **k))
    lin = torch.nn.Linear(4, 2).eval()
    st = _tls.copies = hook._ThreadCopies(stream=None)
    st.tg = tg = _ThreadGraph(lin, None, [torch.zeros(1)], [], None, None, 0)
    _tls.calls, _tls.depth = tgm.MIN_THREAD_CALLS, 0
    st.slot_n = 1  # (each call's copy staged: misses that cost)
    try:
        with torch.no_grad():
            for _ in range(3 * tgm.REPLAY_WINDOW):  # never served, never dropped
                tgm._copies_call(st, type(lin).__call__, lin, (torch.randn(3, 4),), {}, "s.py:9")
        assert st.tg is tg and st.reason is None and st.tg_calls == 3 * tgm.REPLAY_WINDOW
    finally:
        del _tls.calls, _tls.copies, _tls.depth
