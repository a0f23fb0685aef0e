"""The script hook's thread graphs, the parts that run without a GPU: which ``.to()`` /
``.cuda()`` calls it may take over, the deferred-copy view (made on first use, not on a
look at its shape), a view the script keeps getting its own memory, a copy out of order
leaving the rest to PyTorch, and matching a model call to the captured arguments.

CPU tensors stand in for the thread's device buffers: the bookkeeping is the same; the
GPU side (capture, replay, outputs equal to eager) is in ``tests/test_apply_gpu.py``."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from recsys_doctor.applying import _autoapply as hook
from recsys_doctor.applying._autoapply import pageable
from recsys_doctor.applying._autoapply.argtree import matches, skeleton

torch = pytest.importorskip("torch")

@pytest.fixture
def thread(monkeypatch):
    """A hooked thread's copy state with a thread graph over two pinned-looking sources;
    ``tin`` (CPU here) plays the thread's device buffers."""
    monkeypatch.setitem(hook._state, "lazy_type", hook._make_lazy_type(torch))
    monkeypatch.setitem(hook._state, "materialized", 0)
    src = [torch.arange(4.0), torch.arange(10, 16)]
    tin = [torch.full((4,), -1.0), torch.full((6,), -1, dtype=torch.int64)]
    tg = hook._ThreadGraph(module="m", graph=None, src=src, tin=tin,
                           template=skeleton(((tin[0], [tin[1]]), {}), torch.Tensor), out=torch.zeros(1),
                           device=0)
    st = hook._ThreadCopies(stream=None)
    st.tg = tg
    calls = []

    def orig(t, *a, **k):
        calls.append(t)
        return t.clone()

    return SimpleNamespace(st=st, tg=tg, src=src, tin=tin, orig=orig, calls=calls)


def _to(th, t):
    return hook._copy_in(torch, th.st, t, 0, th.orig, ("cuda",), {"non_blocking": True})


def test_expected_copies_are_deferred_until_the_data_is_used(thread):
    a = _to(thread, thread.src[0])
    b = _to(thread, thread.src[1])
    assert thread.calls == [] and thread.st.n == 2 and thread.st.pending
    # metadata needs no data: nothing copied yet
    assert a.shape == (4,) and a.dtype == torch.float32 and b.dim() == 1 and len(b) == 6
    assert thread.tin[0].tolist() == [-1.0] * 4 and hook._state["materialized"] == 0
    # the first real use makes every deferred copy of the query, then runs as usual
    c = a * 2
    assert type(c) is torch.Tensor and c.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert thread.tin[1].tolist() == [10, 11, 12, 13, 14, 15] and not thread.st.pending
    assert hook._state["materialized"] == 1
    assert (b + 0).tolist() == list(range(10, 16)) and hook._state["materialized"] == 1


def test_a_view_the_script_keeps_gets_its_own_memory(thread):
    kept = _to(thread, thread.src[0])
    _to(thread, thread.src[1])
    hook._materialize(torch, thread.st)  # (as the graph's replay would fill the buffers)
    thread.st.n, thread.st.pending = 0, False  # the model call ends the query
    # next query: the buffers will be overwritten, but the script still holds `kept`
    thread.src[0].add_(100)
    again = _to(thread, thread.src[0])
    assert again is not kept
    with torch._C.DisableTorchFunctionSubclass():
        assert kept.data_ptr() != thread.tin[0].data_ptr()
        thread.tin[0].fill_(-5)  # what the next replay does to the buffer
        assert kept.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_view_the_script_dropped_is_handed_out_again(thread):
    first = id(_to(thread, thread.src[0]))
    thread.st.n, thread.st.pending = 0, False
    assert id(_to(thread, thread.src[0])) == first  # no new object per query


def test_a_copy_out_of_order_makes_the_deferred_ones_and_goes_to_pytorch(thread):
    a = _to(thread, thread.src[0])
    other = torch.ones(3)
    out = _to(thread, other)  # not the graph's second copy
    assert thread.calls == [other] and type(out) is torch.Tensor
    assert thread.tin[0].tolist() == [0.0, 1.0, 2.0, 3.0] and thread.st.n == -1
    # the rest of the query too, even the graph's own second source
    assert type(_to(thread, thread.src[1])) is torch.Tensor and thread.calls[-1] is thread.src[1]
    with torch._C.DisableTorchFunctionSubclass():
        assert a.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_copy_after_all_of_the_graphs_keeps_them_deferred_and_goes_to_pytorch(thread):
    """Once every copy of the thread graph is handed out, another copy (an input of a later model
    call) is PyTorch's and leaves the graph's copies deferred: the model call can still replay."""
    a = _to(thread, thread.src[0])
    b = _to(thread, thread.src[1])
    other = torch.ones(3)
    out = _to(thread, other)
    assert thread.calls == [other] and type(out) is torch.Tensor and out.tolist() == [1.0] * 3
    assert thread.st.n == 2 and thread.st.pending and hook._state["materialized"] == 0
    assert thread.tin[0].tolist() == [-1.0] * 4  # (not copied yet: the replay brings it)
    again = _to(thread, torch.zeros(2))  # (any number of them)
    assert type(again) is torch.Tensor and thread.st.n == 2 and thread.st.pending
    # used before the model call: the deferred copies are made as ever
    assert (a + 0).tolist() == [0.0, 1.0, 2.0, 3.0] and (b + 0).tolist() == list(range(10, 16))


def test_a_changed_source_is_not_taken_over(thread):
    thread.src[0].resize_(2)
    out = _to(thread, thread.src[0])
    assert type(out) is torch.Tensor and thread.calls == [thread.src[0]]


def test_a_model_call_matches_its_captured_arguments_only():
    T = torch.Tensor
    a, b, c = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    tmpl = skeleton(((a, [b, c], 7, "x"), {"k": None}), T)
    assert matches(tmpl, ((a, [b, c], 7, "x"), {"k": None}), T, iter([a, b, c]))
    assert not matches(tmpl, ((a, [c, b], 7, "x"), {"k": None}), T, iter([a, b, c]))  # order
    assert not matches(tmpl, ((a, (b, c), 7, "x"), {"k": None}), T, iter([a, b, c]))  # list vs tuple
    assert not matches(tmpl, ((a, [b, c], 8, "x"), {"k": None}), T, iter([a, b, c]))  # a constant
    assert not matches(tmpl, ((a, [b, c], 7, "x"), {}), T, iter([a, b, c]))  # a keyword
    assert not matches(tmpl, ((a, [b, c.clone()], 7, "x"), {"k": None}), T, iter([a, b, c]))  # another tensor
    assert not matches(tmpl, ((a, [b, c], 7.0, "x"), {"k": None}), T, iter([a, b, c]))  # 7.0 is not 7


def test_refcount_of_a_dropped_view_is_what_copy_in_expects():
    # _copy_in treats a view as dropped by the script at exactly 3 references (the list,
    # its local name, getrefcount's argument): check CPython counts so here
    views = [torch.zeros(1)]
    view = views[0]
    assert sys.getrefcount(view) == 3
    keep = view  # noqa: F841 - the script's reference
    assert sys.getrefcount(view) == 4


def test_a_thread_graphs_copies_are_counted_at_the_scripts_lines(monkeypatch):
    """While a thread learns its copies, each remembers the script's line that made it; the
    copies a thread graph (or the runtime's route) then serves per call are counted as taken
    over at those lines (those it made itself while learning, as PyTorch's) - the script's own ``.to()`` of pinned tensors, as many per line as it
    makes there (a loop), not a slot's copy (``move`` None), which the hook counts where it
    fills the slot."""
    import sys as _sys

    from recsys_doctor.applying._autoapply import accounting, staging, thread_graphs

    monkeypatch.setattr(staging, "_copy_source", lambda *a: True)  # (no pinned memory on the CPU)
    monkeypatch.setattr(staging, "raw_call", lambda *a: "raw")
    accounting.reset()  # (a fresh count)
    st = hook._ThreadCopies(stream=None)
    orig = lambda t, *a, **k: t.clone()  # noqa: E731
    src = [torch.arange(4.0), torch.arange(3.0), torch.arange(2.0)]
    outs, lines = [], []

    def to(s, move=None):  # (as the hook's Tensor.to calls it: one frame between the script and _copy_in)
        return hook._copy_in(torch, st, s, 0, orig, ("cuda",), {"non_blocking": True}, move)

    for s in src[:2]:  # two copies from one line
        outs.append(to(s, "a Move"))
        lines.append(_sys._getframe().f_lineno - 1)
    outs.append(to(src[2])); lines.append(_sys._getframe().f_lineno)  # noqa: E702
    here = __file__.rsplit("/", 1)[-1]
    assert [r[4].rsplit("/", 1)[-1] for r in st.recent] == [f"{here}:{n}" for n in lines]
    found = thread_graphs.copy_sources(st.recent, outs)
    assert found is not None
    _src, moves, _raws, got_lines = found
    tg = hook._ThreadGraph(module="m", graph=None, src=src, tin=outs, template=None, out=None, device=0, moves=moves,
                           lines=got_lines)
    assert [(s.rsplit("/", 1)[-1], k) for s, k in tg.copy_sites] == [(f"{here}:{lines[0]}", 2)]
    for _ in range(3):  # three calls served
        thread_graphs.count_copies(tg)
    rows = [r for r in accounting.sites() if r["kind"] == "h2d"]
    # (the two copies made while the thread learned were PyTorch's, counted so)
    assert [(r["site"].rsplit("/", 1)[-1], r["taken_over"], r["fallback"], r["reasons"]) for r in rows] == [
        (f"{here}:{lines[0]}", 6, 2, {pageable.ASYNC_PINNED: 2})]


def test_a_scripts_copy_into_its_own_gpu_tensor_is_counted_at_its_line(monkeypatch):
    """``gpu_buf.copy_(host)`` by a placed thread: PyTorch's, counted at the script's line; not
    a copy between host tensors, one inside a model's forward, one made by PyTorch's, the
    runtime's or the hook's own code, nor one of a thread the hook does not handle; a thread not placed yet
    counts it as made before its first model call. (A stand-in for the GPU tensor: no GPU here.)"""
    from types import SimpleNamespace

    from recsys_doctor.applying._autoapply import accounting, copyinto
    from recsys_doctor.applying._autoapply._common import _state, _tls
    from recsys_doctor.applying._autoapply.unplaced import BEFORE_PLACED

    made = []
    copy_ = copyinto.counted(torch, lambda self, src, *a, **k: made.append((self, src, a, k)) or self)
    gpu, host = SimpleNamespace(is_cuda=True), torch.ones(3)
    accounting.reset()
    monkeypatch.setitem(_state, "activation", 99)
    monkeypatch.setattr(_tls, "defer", None, raising=False)
    monkeypatch.setattr(_tls, "group", object(), raising=False)
    monkeypatch.setattr(_tls, "depth", 0, raising=False)
    line = sys._getframe().f_lineno + 1
    copy_(gpu, host, non_blocking=True)
    copy_(host, host)  # host to host
    monkeypatch.setattr(_tls, "depth", 1)
    copy_(gpu, host)  # inside a model's forward
    monkeypatch.setattr(_tls, "depth", 0)
    from torch.utils import _pytree  # a PyTorch module's frame as the direct caller
    exec(compile("copy_(gpu, host)", _pytree.__file__, "exec"), {"copy_": copy_, "gpu": gpu, "host": host})
    from recsys_doctor import runtime  # the runtime's frame (beside recsys_doctor/ in an editable install)
    exec(compile("copy_(gpu, host)", runtime.__file__, "exec"), {"copy_": copy_, "gpu": gpu, "host": host})
    monkeypatch.setattr(_tls, "group", None)  # a thread the hook does not handle (not deferred)
    copy_(gpu, host)
    monkeypatch.setattr(_tls, "defer", 99)
    line2 = sys._getframe().f_lineno + 1
    copy_(gpu, host)  # a deferred thread, not placed yet
    assert len(made) == 7 and made[0][3] == {"non_blocking": True}
    rows = {r["site"].rsplit(":", 1)[-1]: r for r in accounting.sites() if r["kind"] == "h2d"}
    assert {k: (r["fallback"], r["reasons"]) for k, r in rows.items()} == {
        str(line): (1, {copyinto.COPY_INTO: 1}), str(line2): (1, {BEFORE_PLACED: 1})}
    accounting.reset()
