"""The thread graph's pageable copies known again (:mod:`._autoapply.pageable_fast`): which of the
script's copies are remembered, which later calls are the same copy (their bytes written into the
slot the thread graph reads), and which take the slow path with nothing written. CPU tensors
stand in for the pinned slots; ``stream_now`` stands in for CUDA's current stream."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import pageable_fast as pf  # noqa: E402
from recsys_doctor.applying._autoapply.pageable import Move  # noqa: E402

C0 = torch.device("cuda", 0)
STREAM = 1234  # the group's stream, as stream_now gives it
TO = torch.Tensor.to


def on_group(index):
    return STREAM


class Event:
    def __init__(self, done):
        self.done, self.waited = done, False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True


def _thread(shapes, dtype=torch.float32):
    """A thread state ``st`` and its graph ``tg`` whose copies are slot copies of ``shapes``
    (the slots zeroed), positioned at the start of a query."""
    slots = [torch.zeros(s, dtype=dtype) for s in shapes]
    tg = SimpleNamespace(src=slots, moves=[None] * len(slots), handed=[object() for _ in slots],
                         learned=[None] * len(slots), device=0)
    st = SimpleNamespace(n=0, slot_n=0, slot_event=None, slot_mark=None)
    return st, tg


def _learn_at(st, tg, i, src, args=("cuda:0",), kwargs=None, move=None):
    """The slow path's state right after it handed copy ``i`` out through slot ``i``."""
    kwargs = kwargs or {}
    m = move or Move(C0, None, False, False, None)
    st.n, st.slot_n = i + 1, i + 1
    pf.learn(torch, st, tg, src, tg.handed[i], m, (TO, args, kwargs), STREAM)


def _query_start(st):
    st.n, st.slot_n = 0, 0


def test_a_learned_copy_is_written_into_its_slot_and_handed_to_the_graph():
    st, tg = _thread([(4, 3), (6,)])
    a, b = torch.arange(12.0).view(4, 3), torch.arange(6.0)
    _learn_at(st, tg, 0, a)
    _learn_at(st, tg, 1, b)
    assert [k.slot_i for k in tg.learned] == [0, 1] and tg.learned[0].nbytes == 12 * 4
    _query_start(st)
    a2, b2 = a * 10 + 1, b - 7
    k = pf.same_copy(torch, st, tg, a2, TO, ("cuda:0",), {}, on_group)
    assert k is tg.learned[0] and k.slot is tg.src[0] and st.slot_n == 1
    assert torch.equal(tg.src[0], a2)  # the slot holds the new query's values
    st.n = 1  # (_copy_in hands the view out)
    k = pf.same_copy(torch, st, tg, b2, TO, ("cuda:0",), {}, on_group)
    assert k is tg.learned[1] and torch.equal(tg.src[1], b2) and st.slot_n == 2


def test_a_copy_over_the_gil_held_size_is_written_too():
    n = pf.HOLD_GIL_BYTES // 8 + 5  # int64: just over
    st, tg = _thread([(n,)], torch.int64)
    _learn_at(st, tg, 0, torch.zeros(n, dtype=torch.int64))
    _query_start(st)
    src = torch.arange(n, dtype=torch.int64)
    assert pf.same_copy(torch, st, tg, src, TO, ("cuda:0",), {}, on_group) is not None
    assert torch.equal(tg.src[0], src)


def _learned_one(shape=(4, 3)):
    st, tg = _thread([shape])
    _learn_at(st, tg, 0, torch.ones(shape))
    assert tg.learned[0] is not None
    _query_start(st)
    return st, tg


@pytest.mark.parametrize("case", ["other args", "other method", "other dtype", "other shape", "transposed",
                                  "requires grad", "negative bit", "other stream", "capturing", "slot order",
                                  "no position", "left the order"])
def test_anything_else_takes_the_slow_path_and_writes_nothing(case):
    st, tg = _learned_one()
    src, orig, args, kwargs, now = torch.full((4, 3), 5.0), TO, ("cuda:0",), {}, on_group
    if case == "other args":
        kwargs = {"non_blocking": True}
    elif case == "other method":
        orig = torch.Tensor.cuda
    elif case == "other dtype":
        src = torch.full((4, 3), 5.0, dtype=torch.float64)
    elif case == "other shape":
        src = torch.full((3, 4), 5.0)
    elif case == "transposed":
        src = torch.full((3, 4), 5.0).t()
    elif case == "requires grad":
        src = torch.full((4, 3), 5.0, requires_grad=True)
    elif case == "negative bit":  # float32 whose values are its bytes negated (as a conjugate's .imag)
        src = torch._neg_view(torch.full((4, 3), 5.0))
        assert src.dtype == torch.float32 and src.is_neg() and src.is_contiguous() and float(src[0, 0]) == -5.0
    elif case == "other stream":
        now = lambda index: STREAM + 1  # noqa: E731 - the script set a stream of its own
    elif case == "capturing":
        now = lambda index: None  # noqa: E731
    elif case == "slot order":
        st.slot_n = 1  # another slot copy came first in this query
    elif case == "no position":
        st.n = 1
    elif case == "left the order":
        st.n = -1
    assert pf.same_copy(torch, st, tg, src, orig, args, kwargs, now) is None
    assert torch.equal(tg.src[0], torch.zeros(4, 3)) and st.slot_n == (1 if case == "slot order" else 0)


@pytest.mark.parametrize("case", ["non-blocking", "converts dtype", "not a slot copy", "not handed", "shape of slot",
                                  "not contiguous", "complex", "to another device", "tensor argument"])
def test_what_is_not_remembered(case):
    st, tg = _thread([(4, 3)])
    src, m, args = torch.ones(4, 3), Move(C0, None, False, False, None), ("cuda:0",)
    out = tg.handed[0]
    if case == "non-blocking":  # pinned or not decides the path: asked every time
        m = Move(C0, None, True, False, None)
    elif case == "converts dtype":
        m = Move(C0, torch.float16, False, False, None)
    elif case == "not a slot copy":
        tg.moves[0] = m  # a pinned tensor's own copy: pageable.raw_call's fast path has it
    elif case == "not handed":
        out = object()
    elif case == "shape of slot":
        src = torch.ones(12)
    elif case == "not contiguous":
        src = torch.ones(3, 4).t()
    elif case == "complex":
        st, tg = _thread([(4, 3)], torch.complex64)
        src, out = torch.ones(4, 3, dtype=torch.complex64), tg.handed[0]
    elif case == "to another device":
        m = Move(torch.device("cuda", 1), None, False, False, None)
        args = ("cuda:1",)
    elif case == "tensor argument":
        args = (torch.zeros(1),)
    st.n, st.slot_n = 1, 1
    pf.learn(torch, st, tg, src, out, m, (TO, args, {}), STREAM)
    assert tg.learned[0] is None


def test_the_first_slot_waits_for_the_last_replay_to_have_read_the_slots():
    st, tg = _learned_one()
    st.slot_event = Event(done=False)
    assert pf.same_copy(torch, st, tg, torch.ones(4, 3), TO, ("cuda:0",), {}, on_group) is not None
    assert st.slot_event.waited
    st2, tg2 = _learned_one()
    st2.slot_event = Event(done=True)
    pf.same_copy(torch, st2, tg2, torch.ones(4, 3), TO, ("cuda:0",), {}, on_group)
    assert not st2.slot_event.waited


def test_a_call_naming_no_device_index_checks_the_current_device_again(monkeypatch):
    st, tg = _thread([(2,)])
    m = Move(C0, None, False, False, None)
    st.n, st.slot_n = 1, 1
    pf.learn(torch, st, tg, torch.ones(2), tg.handed[0], m, (torch.Tensor.cuda, (), {}), STREAM)
    assert tg.learned[0].raw[3] == 0
    current = [0]
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: current[0], raising=False)
    _query_start(st)
    assert pf.same_copy(torch, st, tg, torch.full((2,), 3.0), torch.Tensor.cuda, (), {}, on_group) is not None
    _query_start(st)
    current[0] = 1  # torch.cuda.set_device(1) since: .cuda() means another GPU now
    assert pf.same_copy(torch, st, tg, torch.full((2,), 4.0), torch.Tensor.cuda, (), {}, on_group) is None
    assert torch.equal(tg.src[0], torch.full((2,), 3.0))


# list_array: the reference is PyTorch itself (torch.tensor of the same data), never our output
_SAME = [
    ("ids", [3, 1, 4, 1, 5], None),
    ("ids as a tuple", (9, 2, 6), None),
    ("rows of ids", [[1, 2, 3], [4, 5, 6]], None),
    ("rows as tuples", ((1, 2), (3, 4)), None),
    ("negative and int64 limits", [-(2**63), 2**63 - 1, 0], None),
    ("ids with their dtype", [[7, 8], [9, 10]], "int64"),
    ("flags", [True, False, True], None),
    ("floats", [0.1, 2.5, -3.75, 1e-40, float("inf"), float("nan")], None),
    ("floats past float32", [1e39, -1e39, 3.4e38], None),
    ("rows of floats", [[0.1, 0.2], [0.3, 0.4]], "float32"),
]
_TORCH_MAKES = [
    ("ints and floats", [1, 2.5]),
    ("ints and bools", [1, True]),
    ("an int past int64", [2**63, 1]),
    ("ragged rows", [[1, 2], [3]]),
    ("three levels", [[[1]], [[2]]]),
    ("numpy scalars", None),
    ("a tensor inside", None),
    ("empty", []),
    ("empty rows", [[], []]),
    ("strings", ["a", "b"]),
    ("a list subclass", None),
]


@pytest.mark.parametrize("name,data,dtype", _SAME, ids=[c[0] for c in _SAME])
def test_list_array_is_the_tensor_pytorch_makes(name, data, dtype):
    dt = getattr(torch, dtype) if dtype else None
    a = pf.list_array(torch, data, dt)
    assert a is not None and a.flags.c_contiguous
    got, want = torch.from_numpy(a), torch.tensor(data, dtype=dt)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want) or (got.dtype.is_floating_point and torch.allclose(got, want, equal_nan=True, rtol=0, atol=0))


@pytest.mark.parametrize("name,data", _TORCH_MAKES, ids=[c[0] for c in _TORCH_MAKES])
def test_list_array_leaves_everything_else_to_pytorch(name, data):
    import numpy as np

    if name == "numpy scalars":
        data = [np.int32(1), np.int32(2)]
    elif name == "a tensor inside":
        data = [torch.tensor(1), torch.tensor(2)]
    elif name == "a list subclass":
        data = type("Ids", (list,), {})([1, 2])
    assert pf.list_array(torch, data, None) is None


def test_list_array_follows_the_default_dtype_and_an_asked_dtype():
    floats = [[0.1, 0.7], [1.3, 2.9]]
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        a = pf.list_array(torch, floats, None)
        assert a is not None and torch.equal(torch.from_numpy(a), torch.tensor(floats)) and a.dtype.itemsize == 8
    finally:
        torch.set_default_dtype(old)
    # a dtype other than the inferred one converts: PyTorch's own conversion rules apply
    assert pf.list_array(torch, [1, 2], torch.float32) is None
    assert pf.list_array(torch, [1.5, 2.5], torch.int64) is None
    assert pf.list_array(torch, [1, 0], torch.bool) is None
