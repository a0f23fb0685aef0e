"""The script hook's one parser of a ``Tensor.to`` / ``Tensor.cuda`` call (:func:`.pageable.to_args`,
:func:`.pageable.cuda_args`), used by the thread graphs, the slots, staging and the host proxies.

Every expected value is written by hand from PyTorch's documented overloads
(https://pytorch.org/docs/stable/generated/torch.Tensor.to.html, ``Tensor.cuda``):
``to(dtype, non_blocking=False, copy=False, *, memory_format)``, ``to(device=None, dtype=None,
non_blocking=False, copy=False, *, memory_format)``, ``to(tensor, non_blocking=False, copy=False,
*, memory_format)``, ``cuda(device=None, non_blocking=False, *, memory_format)``. Where a row says
PyTorch refuses the arguments, PyTorch itself is asked too (its argument parser raises TypeError
before any device is touched, so this runs without a GPU): a call it refuses must reach it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from recsys_doctor.applying._autoapply import pageable, staging
from recsys_doctor.applying._autoapply.pageable import Move

torch = pytest.importorskip("torch")

FAKE = SimpleNamespace(device=torch.device, Tensor=torch.Tensor, dtype=torch.dtype,
                       cuda=SimpleNamespace(current_device=lambda: 3))  # "cuda" is cuda:3 here
C0, C1, C3 = (torch.device("cuda", i) for i in (0, 1, 3))
F16, CL, CF = torch.float16, torch.channels_last, torch.contiguous_format
REFUSES = "PyTorch refuses"  # (TypeError from its argument parser)


def _pytorch_refuses(method, args, kwargs):
    try:
        method(torch.zeros(1, 1, 1, 1), *args, **kwargs)
    except TypeError:
        return True
    except (RuntimeError, AssertionError):  # parsed; no such device here (a CPU-only build, cuda:3)
        return False
    return False


@pytest.mark.parametrize("args,kwargs,want", [
    (("cuda",), {}, Move(C3, None, False, False, None)),
    ((torch.device("cuda"),), {}, Move(C3, None, False, False, None)),
    ((0,), {}, Move(C0, None, False, False, None)),  # an int is a CUDA index
    ((), {"device": 0}, Move(C0, None, False, False, None)),
    (("cuda:1",), {}, Move(C1, None, False, False, None)),  # (another GPU than the group's: the callers decide)
    (("cuda", F16), {}, Move(C3, F16, False, False, None)),
    (("cuda", F16, True), {}, Move(C3, F16, True, False, None)),  # non_blocking third, after the dtype
    (("cuda", None, True, True), {}, Move(C3, None, True, True, None)),
    (("cuda",), {"non_blocking": True, "copy": True}, Move(C3, None, True, True, None)),
    ((), {"device": "cuda", "dtype": F16, "non_blocking": True}, Move(C3, F16, True, False, None)),
    (("cuda",), {"memory_format": CF}, Move(C3, None, False, False, CF)),
    (("cuda",), {"memory_format": CL}, Move(C3, None, False, False, CL)),  # (parsed; not made by the hook)
    ((F16,), {}, None),  # a dtype only: a cast on the host, no move
    ((F16, True, True), {}, None),
    ((), {"dtype": F16}, None),
    (("cpu",), {}, None),
    ((None,), {}, None),
    ((), {}, None),
    ((True,), {}, None),  # a bool is no device (PyTorch reads it as a dtype)
    ((-1,), {}, None),
    (("cuda", True), {}, REFUSES),  # the second positional is the dtype
    (("cuda", F16, True), {"non_blocking": True}, REFUSES),  # non_blocking twice
    (("cuda",), {"device": "cuda"}, REFUSES),
    (("cuda", F16), {"dtype": F16}, REFUSES),
    (("cuda",), {"non_blocking": 1}, REFUSES),  # not a bool
    (("cuda",), {"copy": None}, REFUSES),
    (("cuda", F16, True, False, CF), {}, REFUSES),  # memory_format is keyword-only
    (("cuda",), {"pin": True}, REFUSES),
    (("cuda:01",), {}, None),  # torch.device refuses the string (a RuntimeError of its own)
])
def test_tensor_to_calls(args, kwargs, want):
    _check(pageable.to_args, torch.Tensor.to, args, kwargs, want)


def _check(parse, method, args, kwargs, want):
    """``parse`` reads the call as ``want`` says; where ``want`` is REFUSES, it gives None and
    PyTorch's own ``method`` refuses the same arguments."""
    got = parse(FAKE, args, kwargs)
    if want == REFUSES:
        assert got is None and _pytorch_refuses(method, args, kwargs)
    else:
        assert got == want


def test_to_another_tensor_takes_its_device_and_dtype():
    other = SimpleNamespace(device=C1, dtype=F16)  # a tensor on cuda:1 (none here: the parser's Tensor is its type)
    fake = SimpleNamespace(**{**vars(FAKE), "Tensor": SimpleNamespace})
    assert pageable.to_args(fake, (other,), {}) == Move(C1, F16, False, False, None)
    assert pageable.to_args(fake, (other, True, True), {}) == Move(C1, F16, True, True, None)
    assert pageable.to_args(fake, (), {"tensor": other, "non_blocking": True}) == Move(C1, F16, True, False, None)
    assert pageable.to_args(fake, (other,), {"memory_format": CF}) == Move(C1, F16, False, False, CF)
    assert pageable.to_args(fake, (other,), {"dtype": F16}) is None  # no dtype in that overload
    assert pageable.to_args(fake, (other, F16), {}) is None
    assert pageable.to_args(fake, (SimpleNamespace(device=torch.device("cpu"), dtype=F16),), {}) is None
    # PyTorch's own parser agrees on the keyword and on the refusals
    t = torch.zeros(1)
    assert not _pytorch_refuses(torch.Tensor.to, (), {"tensor": t})
    assert _pytorch_refuses(torch.Tensor.to, (t,), {"dtype": F16})
    assert _pytorch_refuses(torch.Tensor.to, (t, F16), {})


@pytest.mark.parametrize("args,kwargs,want", [
    ((), {}, Move(C3, None, False, False, None)),
    ((0,), {}, Move(C0, None, False, False, None)),
    ((1, True), {}, Move(C1, None, True, False, None)),
    ((None, True), {}, Move(C3, None, True, False, None)),
    ((), {"device": "cuda:1", "non_blocking": True}, Move(C1, None, True, False, None)),
    ((), {"memory_format": CL}, Move(C3, None, False, False, CL)),
    (("cpu",), {}, None),  # (PyTorch: "Invalid device, must be cuda device")
    ((-1,), {}, None),
    ((0,), {"device": 1}, REFUSES),
    ((0, True), {"non_blocking": True}, REFUSES),
    ((0, 1), {}, REFUSES),
    ((True,), {}, REFUSES),
    ((F16,), {}, REFUSES),
    ((None, True, CF), {}, REFUSES),  # memory_format is keyword-only
    ((), {"copy": True}, REFUSES),
])
def test_tensor_cuda_calls(args, kwargs, want):
    _check(pageable.cuda_args, torch.Tensor.cuda, args, kwargs, want)


@pytest.mark.parametrize("src,mf,exact", [
    (torch.zeros(2, 3), None, True),
    (torch.zeros(2, 3), torch.preserve_format, True),
    (torch.zeros(2, 3), CF, True),
    (torch.zeros(2, 3).t(), None, False),  # PyTorch's copy keeps the transposed strides
    (torch.zeros(2, 3).t(), CF, True),
    (torch.zeros(6)[::2], None, True),  # not dense: PyTorch's copy is contiguous
    (torch.zeros(3).expand(2, 3), None, True),  # overlapping: the same
    (torch.zeros(2, 3).t(), torch.preserve_format, False),
    (torch.zeros(1, 3, 2, 2), CL, False),
    (torch.zeros(2, 3, 4, 5), CL, False),
    (torch.zeros(3), CL, False),  # PyTorch refuses channels_last for 1-d: its call, its error
    (torch.zeros(3), "not a format", False),
])
def test_a_copy_the_hook_makes_is_pytorchs_exactly_or_left_to_it(src, mf, exact):
    """The hook's copy is C-contiguous; PyTorch's has the strides ``Tensor.to(copy=True)`` gives
    on the CPU (the same rule as for a copy to the GPU: ``empty_like`` with the memory format).
    ``exact`` is written by hand; PyTorch's strides are checked to agree."""
    m = Move(C3, None, False, False, mf)
    assert (pageable.inexact(torch, src, m) is None) is exact
    try:
        pytorchs = src.to("cpu", copy=True, memory_format=mf or torch.preserve_format)
    except (RuntimeError, TypeError):
        assert not exact
        return
    if src.numel() > 1:
        assert (pytorchs.stride() == src.contiguous().stride()) is exact


def test_a_thread_graph_takes_pinned_non_blocking_copies_to_its_groups_device_in_the_sources_dtype(monkeypatch):
    monkeypatch.setattr(staging._tls, "group", SimpleNamespace(stream=SimpleNamespace(device=C3)), raising=False)
    src = SimpleNamespace(dtype=torch.float32)  # (its pinned memory asked once by the caller: none on a CPU-only build)
    ok = Move(C3, None, True, False, None)
    assert staging._graph_copy(src, ok, True)
    assert staging._graph_copy(src, ok._replace(dtype=torch.float32), True)  # its own dtype: the same copy
    assert staging._graph_copy(src, ok._replace(copy=True), True)  # a copy to the GPU is a new tensor either way
    assert not staging._graph_copy(src, ok._replace(dtype=F16), True)  # a conversion
    assert not staging._graph_copy(src, ok._replace(non_blocking=False), True)  # the script may reuse the source
    assert not staging._graph_copy(src, ok._replace(device=C1), True)  # another GPU than the group's
    assert not staging._graph_copy(src, ok, False)  # pageable memory


def test_a_copy_to_another_gpu_than_the_groups_is_left_to_pytorch(monkeypatch):
    monkeypatch.setattr(pageable._tls, "group", SimpleNamespace(stream=SimpleNamespace(device=C0)), raising=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert pageable.copy_hazard(torch, C1) == "a copy to another device than its thread's group's"


def test_a_copy_on_a_stream_the_script_set_is_left_to_pytorch(monkeypatch):
    """The current stream is read as its raw handle on the copy's device and compared with the
    group's stream."""
    group = SimpleNamespace(stream=SimpleNamespace(device=C3, cuda_stream=0x5000))
    monkeypatch.setattr(pageable._tls, "group", group, raising=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    asked = []
    current = [0x5000]
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: asked.append(i) or current[0], raising=False)
    assert pageable.copy_hazard(torch, C3) is None
    current[0] = 0x6000  # with torch.cuda.stream(own): in the script
    assert pageable.copy_hazard(torch, C3) == "a copy on a stream the script set"
    assert asked == [3, 3]


def test_the_hooked_to_takes_over_what_it_makes_exactly_and_leaves_pytorch_the_rest(monkeypatch):
    """``Tensor.to`` as a hooked thread has it (:func:`.staging._copy_method`, PyTorch's own ``to``
    behind it): a copy it makes as PyTorch would goes to the hook's copy (``_take_copy``, recorded
    here: the GPU side is in the GPU tests); a non-contiguous source is PyTorch's, counted with the
    reason; a call PyTorch refuses reaches PyTorch, which raises its own TypeError."""
    from recsys_doctor.applying._autoapply import accounting

    accounting.reset()
    monkeypatch.setattr(staging._tls, "group", SimpleNamespace(stream=SimpleNamespace(device=C0)), raising=False)
    monkeypatch.setattr(staging._tls, "copies", None, raising=False)
    taken = []
    monkeypatch.setattr(staging, "_take_copy", lambda torch_, x, dev, dtype, site: taken.append((x, dev, dtype)) or x)
    to = staging._copy_method(torch, torch.Tensor.to, pageable.to_args)
    t = torch.zeros(2, 3)
    assert to(t, "cuda:0", F16) is t and taken == [(t, C0, F16)]
    assert to(t.t(), "cuda:0", memory_format=CF) is not None and len(taken) == 2  # contiguous asked: the hook's copy is
    with pytest.raises((AssertionError, RuntimeError)):  # PyTorch's copy, which a CPU-only build cannot make
        to(t.t(), "cuda:0")
    assert len(taken) == 2
    rows = accounting.sites()
    assert [(r["kind"], r["fallback"], r["reasons"]) for r in rows] == [("h2d", 1, {pageable.NOT_CONTIGUOUS: 1})]
    with pytest.raises(TypeError):  # the second positional is the dtype: PyTorch's own error
        to(t, "cuda:0", True)
    assert len(taken) == 2


def _thread_graph_of(monkeypatch):
    """A hooked thread (group on cuda:0) whose thread graph expects one pinned copy next: its
    source tensor, the learned :class:`Move`, the thread graph and the thread's copy state."""
    from recsys_doctor.applying import _autoapply as hook

    src = torch.arange(4.0)
    learned = Move(C0, None, True, False, None)
    tg = hook._ThreadGraph(module="m", graph=None, src=[src], tin=[torch.zeros(4)], template=None,
                           out=torch.zeros(1), device=0, moves=[learned])
    st = hook._ThreadCopies(stream=None)
    st.tg = tg
    monkeypatch.setitem(staging._state, "lazy_type", staging.make_lazy_type(torch))
    monkeypatch.setattr(staging._tls, "group", SimpleNamespace(stream=SimpleNamespace(device=C0)), raising=False)
    monkeypatch.setattr(staging._tls, "copies", st, raising=False)
    monkeypatch.setattr(staging._tls, "depth", 0, raising=False)
    return src, learned, tg, st


def test_the_thread_graphs_next_copy_asked_for_as_learned_takes_the_short_path(monkeypatch):
    """A hooked ``.to()`` of the tensor the thread graph expects next, asked for with the
    :class:`Move` it was learned with, goes straight to ``_copy_in``: the checks the learned
    copy passed (pinned, non-blocking, the group's device) are not asked again. Another move
    of the same tensor, or a slot's copy (learned with no move), takes the long path."""
    src, learned, tg, st = _thread_graph_of(monkeypatch)
    asked = []
    monkeypatch.setattr(staging, "_graph_copy", lambda s, m, pinned: asked.append(m) or False)
    monkeypatch.setattr(staging, "_take_copy", lambda *a: None)  # (the long path's pageable copy: PyTorch's)
    to = staging._copy_method(torch, lambda t, *a, **k: "pytorch", pageable.to_args)
    view = to(src, "cuda:0", non_blocking=True)
    assert type(view) is staging._state["lazy_type"] and st.n == 1 and asked == []
    first = id(view)
    del view  # (a view the script keeps would be given memory of its own)
    st.n, st.pending = 0, False
    assert id(to(src, device="cuda:0", non_blocking=True)) == first and asked == []  # the same Move, spelled otherwise
    st.n = 0
    assert to(src, "cuda:0") == "pytorch" and asked == [learned._replace(non_blocking=False)]  # blocking: not it
    st.n, tg.moves = 0, [None]  # learned from a slot (the hook's own copy): never the script's .to()
    assert to(src, "cuda:0", non_blocking=True) == "pytorch" and len(asked) == 2
    st.n, tg.moves = 0, [learned]
    tg.src_ptr = [src.data_ptr() + 4]  # the same tensor on other memory: _copy_in refuses it
    assert to(src, "cuda:0", non_blocking=True) == "pytorch" and st.n == -1


def test_while_the_script_captures_a_graph_of_its_own_every_copy_is_pytorchs(monkeypatch):
    """A hooked thread whose current stream captures a graph of the script's own (a worker that
    captures its model, ``examples/heldout/own_graphs_serve.py``): the copy its thread graph
    expects next is not deferred into a view (the script's graph must hold the copy itself),
    and ``torch.as_tensor`` of host data is PyTorch's (which refuses a synchronous copy in a
    capture, as without the hook): both reach PyTorch's own function, nothing else is asked."""
    src, learned, tg, st = _thread_graph_of(monkeypatch)
    monkeypatch.setattr(staging, "_take_copy", lambda *a: pytest.fail("the hook's copy in a capture"))
    capturing = [True]
    to = staging._copy_method(torch, lambda t, *a, **k: "pytorch", pageable.to_args, capturing=lambda: capturing[0])
    assert to(src, "cuda:0", non_blocking=True) == "pytorch" and st.n == 0 and not st.pending
    monkeypatch.setattr(staging, "_slot_thread", lambda: pytest.fail("the thread's slots in a capture"))
    as_tensor = staging._factory(torch, lambda *a, **k: "pytorch's as_tensor", lambda t, a, k: (C0, None),
                                 "as_tensor", capturing=lambda: capturing[0])
    assert as_tensor([1, 2, 3], device="cuda") == "pytorch's as_tensor"

    class HostArg(torch.Tensor):  # a model's host argument (.host_args): its own take, in the hook's captures too
        @staticmethod
        def rd_take(data, orig, name, args, kwargs, p):
            return ("taken", name, p)

    assert as_tensor(torch.zeros(2).as_subclass(HostArg), device="cuda") == ("taken", "as_tensor", (C0, None))
    capturing[0] = False  # the capture over: the thread graph's copy is deferred again
    view = to(src, "cuda:0", non_blocking=True)
    assert type(view) is staging._state["lazy_type"] and st.n == 1
