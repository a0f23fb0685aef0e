"""The hook's steady path made cheaper (session 25), checked without a GPU:

* a thread graph's :class:`ReadMark`: before a query writes the thread's slots again, the count the
  last replay copied to host memory says whether its copies have read them (no event query); a count
  not there yet is waited for, sleeping, and past :data:`MARK_WAIT_S` the device is synchronized; a
  mark whose count after the capture is not the eager run's one refuses the thread graph;
* :func:`slots_read` takes the mark after a replay of the thread graph and an event otherwise;
* :func:`matches_positional` says what :func:`matches` says for every skeleton that has a
  :func:`positional` form;
* :func:`taken_over_here` counts at the lines :func:`taken_over` of :func:`script_site` counts at.
"""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import accounting, readmark as pf, staging  # noqa: E402
from recsys_doctor.applying._autoapply._common import _state  # noqa: E402
from recsys_doctor.applying._autoapply.argtree import (SLOT, flatten, matches, matches_positional, positional,  # noqa: E402
                                                      skeleton)


class Event:
    def __init__(self, done=True):
        self.done, self.waited, self.recorded = done, False, []

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True

    def record(self, stream=None):
        self.recorded.append(stream)


def _st(mark=None, event=None, stream=None):
    return SimpleNamespace(slot_mark=mark, slot_event=event, stream=stream, slot_n=0, replayed=None)


def test_a_reached_mark_frees_the_slots_without_a_cuda_call():
    seen = np.array([7], dtype=np.int64)
    ev = Event(done=False)  # (an event that would have to be waited for: not asked)
    before = _state.get("mark_waits", 0)
    pf.slots_free(torch, _st(mark=(seen, 7), event=ev))
    pf.slots_free(torch, _st(mark=(np.array([9], dtype=np.int64), 7), event=ev))  # (past it: a later replay's)
    assert not ev.waited and _state.get("mark_waits", 0) == before


def test_a_mark_not_reached_is_waited_for_until_the_count_arrives(monkeypatch):
    seen = np.array([4], dtype=np.int64)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    before = _state.get("mark_waits", 0)
    t = threading.Timer(0.02, lambda: seen.__setitem__(0, 5))  # (the replay's copy of its count lands)
    t.start()
    t0 = time.perf_counter()
    pf.slots_free(torch, _st(mark=(seen, 5)))
    waited = time.perf_counter() - t0
    t.join()
    assert seen[0] == 5 and waited >= 0.015 and not synced
    assert _state["mark_waits"] == before + 1


def test_a_mark_that_never_arrives_synchronizes_the_device(monkeypatch):
    seen = np.array([4], dtype=np.int64)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(pf, "MARK_WAIT_S", 0.01)
    pf.slots_free(torch, _st(mark=(seen, 6), stream=SimpleNamespace(device="cuda:1")))
    assert synced == ["cuda:1"]


@pytest.mark.parametrize("done", [True, False])
def test_without_a_mark_the_event_is_asked_and_waited_for_if_not_done(done):
    ev = Event(done=done)
    pf.slots_free(torch, _st(event=ev))
    assert ev.waited is (not done)


@pytest.mark.parametrize("left", [0, -(2**62) + 1, 2**40, 5])
def test_a_mark_that_did_not_count_its_eager_run_from_zero_refuses_the_thread_graph(left):
    """After the capture the mark must show the capture's one eager run. Where its counter was
    not zeroed before that run (session 27: the zeroing queued behind another thread's replays on
    the group stream, the eager run counting on from what the memory held), its base is garbage,
    and a negative one let the thread rewrite its slots before its replays read them: wrong
    outputs. Any count but 1 refuses the thread graph (raised: the thread keeps the group's path)."""
    mark = pf.ReadMark.__new__(pf.ReadMark)
    mark.seen = np.array([left], dtype=np.int64)
    with pytest.raises(RuntimeError, match="read mark counted"):
        mark.captured()
    mark.seen = np.array([1], dtype=np.int64)
    mark.captured()
    assert mark.base == 1
    mark.seen = np.array([3], dtype=np.int64)
    mark.captured(counted=3)
    assert mark.base == 3


def _tg(n_src, replays, base=1):
    seen = np.array([base + replays], dtype=np.int64)
    return SimpleNamespace(mark=SimpleNamespace(seen=seen, base=base), replays=replays, src=[None] * n_src)


def test_slots_read_takes_the_replays_mark_and_records_no_event():
    st = staging._ThreadCopies(None)
    st.slot_n, st.slot_event = 2, Event()
    st.replayed = tg = _tg(3, replays=9)
    staging.slots_read(torch, st)
    assert st.slot_mark is not None and st.slot_mark[0] is tg.mark.seen and st.slot_mark[1] == 1 + 9
    assert st.slot_event.recorded == [] and st.replayed is None and st.slot_n == 0


@pytest.mark.parametrize("case", ["no replay", "more slots than the graph copies", "a graph without a mark"])
def test_slots_read_records_the_event_where_the_call_was_no_thread_graph_replay(case):
    st = staging._ThreadCopies(None)
    st.slot_n, st.slot_event, st.slot_mark = 2, Event(), ("an earlier mark", 3)
    if case == "more slots than the graph copies":
        st.replayed = _tg(1, replays=4)
    elif case == "a graph without a mark":
        st.replayed = SimpleNamespace(mark=None, replays=4, src=[None] * 3)
    staging.slots_read(torch, st)
    assert st.slot_mark is None and st.slot_event.recorded == [None] and st.replayed is None


def test_the_event_is_recorded_on_the_groups_stream_object_where_that_is_current(monkeypatch):
    group_stream = SimpleNamespace(device_index=0, cuda_stream=1234)
    st = staging._ThreadCopies(group_stream)
    st.slot_event = Event()
    for current, want in [(1234, group_stream), (99, None)]:  # (99: the script set a stream of its own)
        monkeypatch.setattr(staging, "current_raw_stream", lambda torch_, index, c=current: c if index == 0 else None)
        st.slot_n = 1
        staging.slots_read(torch, st)
        assert st.slot_event.recorded[-1] is want


def test_nothing_is_marked_or_recorded_when_no_slot_was_written():
    st = staging._ThreadCopies(None)
    st.slot_event, st.replayed = Event(), _tg(3, replays=1)
    staging.slots_read(torch, st)
    assert st.slot_event.recorded == [] and st.slot_mark is None and st.replayed is None


# -- the usual call's arguments, checked flat -------------------------------------------------------

def _calls(rng: random.Random, tensors: list):
    """Random calls: positional tensors, lists and tuples of them, constants, nested lists, a
    keyword now and then."""
    def arg(depth=0):
        r = rng.random()
        if r < 0.5:
            return rng.choice(tensors)
        if r < 0.75 and depth == 0:
            return [rng.choice(tensors) for _ in range(rng.randint(0, 3))]
        if r < 0.82 and depth == 0:
            return tuple(arg(1) for _ in range(rng.randint(1, 2)))
        if r < 0.88 and depth == 0:
            return [arg(1), [rng.choice(tensors)]]
        return rng.choice([3, "sum", None, 2.5])
    args = tuple(arg() for _ in range(rng.randint(0, 4)))
    kwargs = {"scale": rng.choice(tensors)} if rng.random() < 0.15 else {}
    return args, kwargs


def test_the_flat_check_says_what_the_walk_says_for_every_positional_skeleton():
    rng = random.Random(25)
    pool = [torch.zeros(k + 1) for k in range(6)]
    flat = 0
    for _ in range(3000):
        learned = _calls(rng, pool)
        skel = skeleton(learned, torch.Tensor)
        form = positional(skel)
        handed: list = []
        flatten(learned, torch.Tensor, handed)  # (the call's tensors in the walk's order, as the hook hands them)
        # the same call, one like it, or another: the flat form must agree with the walk on each
        for call in (learned, _calls(rng, pool), (tuple(reversed(learned[0])), learned[1])):
            want = matches(skel, call, torch.Tensor, iter(handed))
            if form is not None:
                flat += 1
                assert matches_positional(form, call[0], call[1], handed) == want, (skel, call)
    assert flat > 1000  # (most random calls have a flat form)


def test_positional_forms():
    assert positional(((SLOT, [SLOT, SLOT], SLOT), {})) == (None, 2, None)
    assert positional(((), {})) == ()
    assert positional(((SLOT, [SLOT]), {"k": SLOT})) is None  # a keyword
    assert positional(((SLOT, 3), {})) is None  # a constant
    assert positional(((SLOT, (SLOT,)), {})) is None  # a tuple argument
    assert positional(((SLOT, [SLOT, 1]), {})) is None  # a list holding a constant


# -- counting a steady copy at the script's line -----------------------------------------------------

def _hooks_copy():  # stands for the hook's Tensor.cuda: it counts the line that called it
    accounting.taken_over_here("h2d", 2)


def test_taken_over_here_counts_at_the_script_lines_as_taken_over_does():
    accounting.reset()
    here = sys._getframe().f_code.co_filename
    first = sys._getframe().f_lineno + 2
    for _ in range(3):
        _hooks_copy()
    second = sys._getframe().f_lineno + 1
    _hooks_copy(); _hooks_copy()  # noqa: E702 - two calls from one line
    got = {(r["kind"], r["site"]): r["taken_over"] for r in accounting.sites()}
    show = accounting._display(here)
    assert got == {("h2d", f"{show}:{first}"): 3, ("h2d", f"{show}:{second}"): 2}
    accounting.reset()  # a new activation counts from nothing
    _hooks_copy()
    assert [(r["site"], r["taken_over"]) for r in accounting.sites()] == [(f"{show}:{sys._getframe().f_lineno - 1}", 1)]


def test_taken_over_here_from_threads_adds_up():
    accounting.reset()

    def work():
        for _ in range(500):
            _hooks_copy()

    line = work.__code__.co_firstlineno + 2
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rows = accounting.sites()
    assert [(r["kind"], r["taken_over"]) for r in rows] == [("h2d", 2000)]
    assert rows[0]["site"].endswith(f":{line}")


def test_many_generations_never_mix_counts():
    for gen in itertools.islice(itertools.count(), 3):
        accounting.reset()
        for _ in range(gen + 1):
            _hooks_copy()
        assert [r["taken_over"] for r in accounting.sites()] == [gen + 1]
