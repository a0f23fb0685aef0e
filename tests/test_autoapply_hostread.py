"""A thread graph's lent outputs read back with ``.cpu()`` from the graph's own copy to the host
(:mod:`._autoapply.hostread`), checked without a GPU: CPU tensors stand in for the static outputs and
the pinned host copies, a replay stand-in writes query ``n``'s values (``100 * n + j``) into both, as
the captured model and its memcpy node would. Whatever the script does to an output before reading it
back, it must read what PyTorch's ``.cpu()`` would give: the values of its own query, written ones
included."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import hostread, lentout  # noqa: E402
from recsys_doctor.applying._autoapply._common import _state  # noqa: E402
from recsys_doctor.applying._autoapply.accounting import reset, sites  # noqa: E402
from recsys_doctor.applying._autoapply.thread_graphs import _thread_replay  # noqa: E402

STREAM = 7  # the stand-in's raw stream of the thread


class _Graph:
    """Each replay writes the next query's values into the static outputs and, where given, into
    their host copies (the graph's memcpy node)."""

    def __init__(self, outs, hosts=None):
        self.outs, self.hosts, self.n = outs, hosts, 0

    def replay(self):
        self.n += 1
        for j, o in enumerate(self.outs):
            o.fill_(100 * self.n + j)
            if self.hosts and self.hosts[j] is not None:
                self.hosts[j].fill_(100 * self.n + j)


@pytest.fixture()
def hooked(monkeypatch):
    """The hook's state as after :func:`hostread.install`, a stream stand-in and a sync that records
    the streams it waited for; the original ``.cpu()`` counted."""
    now = {"stream": STREAM}
    monkeypatch.setitem(_state, "host_reads_on", True)
    monkeypatch.setitem(_state, "stream_now", lambda dev: now["stream"])
    monkeypatch.setitem(_state, "thread_replays", 0)
    monkeypatch.setitem(_state, "outputs_lent", 0)
    monkeypatch.setitem(_state, "host_reads", 0)
    reset()
    synced, origs = [], []

    def orig(t, *a, **k):
        origs.append(t)
        return torch.Tensor.cpu(t, *a, **k).clone()  # (a CPU tensor's own .cpu() is itself: a copy, as from the GPU)

    cpu = hostread.patched_cpu(torch, orig, synced.append)
    return SimpleNamespace(cpu=cpu, synced=synced, origs=origs, now=now)


def _tg(outs, hosts=None, learned=True):
    """A thread graph of ``outs`` (a tuple where several), registered with ``hosts`` (None: learning)."""
    static = outs[0] if len(outs) == 1 else tuple(outs)
    tg = SimpleNamespace(graph=_Graph(outs, hosts), replays=0, static_out=static, lent=lentout.lend(torch, static),
                         reads=None, want_host=[False])
    hostread.register(tg, hosts if learned else None)
    return tg


def _want(n, j=0):
    return float(100 * n + j)


def _d2h_rows():
    return [r for r in sites() if r["kind"] == "d2h"]


def test_learning_flags_the_graph_after_enough_reads(hooked):
    tg = _tg([torch.zeros(4, 2), torch.zeros(3)], learned=False)
    for n in range(1, hostread.LEARN_READS + 1):
        assert not tg.want_host[0]
        out, other = _thread_replay(tg)
        got = hooked.cpu(out)  # (only the first output is read)
        assert got.eq(_want(n)).all() and not other.eq(-1).any()
        del out, other
    assert tg.want_host[0] and len(hooked.origs) == hostread.LEARN_READS and not hooked.synced
    assert hostread.host_spec(tg) == [((4, 2), torch.float32), None]
    hostread.stop_learning(tg)  # (no copy the graph can make: never flagged again)
    assert not tg.want_host[0]


def test_a_rarely_read_output_is_not_learned(hooked):
    tg = _tg([torch.zeros(4)], learned=False)
    for n in range(1, 4 * hostread.LEARN_READS):
        out = _thread_replay(tg)
        if n % 3 == 0:  # (one read in three replays: fewer than every other)
            hooked.cpu(out)
        del out
    assert not tg.want_host[0]


def test_a_taken_over_read_is_the_host_copy_after_one_wait(hooked):
    host = torch.zeros(4, 2)
    tg = _tg([torch.zeros(4, 2)], [host])
    kept = []
    for n in range(1, 6):
        out = _thread_replay(tg)
        got = hooked.cpu(out)
        assert got.eq(_want(n)).all() and got.data_ptr() != host.data_ptr()  # (the script's own memory)
        kept.append(got)
        del out
    assert [k[0, 0].item() for k in kept] == [_want(n) for n in range(1, 6)]  # (later replays changed none)
    assert hooked.synced == [STREAM] * 5 and not hooked.origs and _state["host_reads"] == 5
    rows = _d2h_rows()
    assert len(rows) == 1 and rows[0]["taken_over"] == 5 and rows[0]["site"].startswith("tests")


def test_a_second_read_of_one_output_is_pytorchs(hooked):
    tg = _tg([torch.zeros(3)], [torch.zeros(3)])
    out = _thread_replay(tg)
    first = hooked.cpu(out)
    first.fill_(-5)  # (the script writes its first copy: the second read must not see it)
    second = hooked.cpu(out)
    assert second.eq(_want(1)).all() and hooked.origs == [out] and hooked.synced == [STREAM]


@pytest.mark.parametrize("write", ["in_place", "view", "out_arg"])
def test_an_output_written_after_its_replay_reads_the_written_values(hooked, write):
    tg = _tg([torch.zeros(4, 2)], [torch.zeros(4, 2)])
    out = _thread_replay(tg)
    if write == "in_place":
        out.mul_(2)
    elif write == "view":
        out[1].zero_()
    else:
        torch.add(out, 1, out=out)
    want = torch.full((4, 2), _want(1))
    want = want * 2 if write == "in_place" else want + 1 if write == "out_arg" else want.index_fill(0, torch.tensor([1]), 0)
    got = hooked.cpu(out)
    assert torch.equal(got, want) and not hooked.synced and hooked.origs == [out]
    rows = _d2h_rows()
    assert rows[0]["fallback"] == 1 and hostread.WRITTEN in rows[0]["reasons"]


def test_another_stream_or_inference_mode_or_another_thread_is_pytorchs(hooked):
    tg = _tg([torch.zeros(2)], [torch.zeros(2)])
    out = _thread_replay(tg)
    hooked.now["stream"] = STREAM + 1  # (the script made another stream current since)
    assert hooked.cpu(out).eq(_want(1)).all()
    hooked.now["stream"] = STREAM
    out = _thread_replay(tg)
    with torch.inference_mode():
        assert hooked.cpu(out).eq(_want(2)).all()
    out = _thread_replay(tg)
    got = []
    t = threading.Thread(target=lambda: got.append(hooked.cpu(out)))
    t.start()
    t.join()
    assert got[0].eq(_want(3)).all()
    assert not hooked.synced and len(hooked.origs) == 3
    rows = _d2h_rows()  # (two lines, a fallback each, ELSEWHERE; another thread's read is not counted)
    assert sorted(r["fallback"] for r in rows) == [1, 1] and all(hostread.ELSEWHERE in r["reasons"] for r in rows)


def test_an_output_kept_past_the_next_replay_keeps_its_values(hooked):
    """The script kept the lent output: the next replay gives it its own memory and hands out clones
    from then on; a read of the kept one is PyTorch's (its values, not the host copy's newer ones)."""
    tg = _tg([torch.zeros(3)], [torch.zeros(3)])
    kept = _thread_replay(tg)
    assert tg.lent.ready()  # (the next call, as _copies_call asks: the kept alias moved to memory of its own)
    clone = _thread_replay(tg)
    assert tg.lent.off and clone is not kept and clone.eq(_want(2)).all()
    assert hooked.cpu(kept).eq(_want(1)).all() and not hooked.synced and hooked.origs == [kept]


def test_inference_outputs_are_not_watched(hooked):
    with torch.inference_mode():
        static = torch.zeros(3)
    tg = _tg([static], [torch.zeros(3)])
    assert tg.reads is None


def test_forget_stops_watching(hooked):
    tg = _tg([torch.zeros(3)], [torch.zeros(3)])
    out = _thread_replay(tg)
    hostread.forget(tg)
    assert tg.reads is None and hooked.cpu(out).eq(_want(1)).all() and hooked.origs == [out]


def test_install_patches_cpu_and_the_hook_restores_it(monkeypatch):
    monkeypatch.setattr(hostread, "ON", True)
    orig = torch.Tensor.cpu
    origs: dict = {}
    try:
        hostread.install(torch, origs)
        assert torch.Tensor.cpu is not orig and origs["cpu"] is orig and _state["host_reads_on"]
        t = torch.arange(3.0)
        assert torch.equal(t.cpu(), t)  # (anything not watched: PyTorch's)
    finally:
        torch.Tensor.cpu = origs.get("cpu", orig)
        _state["host_reads_on"] = False
