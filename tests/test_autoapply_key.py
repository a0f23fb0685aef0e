"""The script hook's call key: what it is made of, and that making it leaves no garbage cycle."""

from __future__ import annotations

import gc

import pytest

from recsys_doctor.applying._autoapply import _key

torch = pytest.importorskip("torch")


def test_key_of_constants_and_containers():
    m = object()
    key, tensors = _key(torch, m, (1, [2.5, "x"], {"b": None, "a": True}), {"k": (3,)})
    # written out by hand from the rules: constants ("C", v), containers by type name,
    # dicts in their own order; args then kwargs
    assert key == (id(m), (("tuple", (("C", 1), ("list", (("C", 2.5), ("C", "x"))),
                                      ("dict", (("b", ("C", None)), ("a", ("C", True)))))),
                           ("dict", (("k", ("tuple", (("C", 3),))),))))
    assert tensors == []


def test_cpu_tensors_and_other_objects_are_not_keyed():
    assert _key(torch, object(), (torch.zeros(2),), {}) is None
    assert _key(torch, object(), (object(),), {}) is None


def test_making_a_key_leaves_no_reference_cycle():
    # a recursive closure (function -> cell -> function) kept each call's tensor list, and
    # with it the script's inputs, alive until the cyclic collector ran
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            _key(torch, object(), (1, [2, [3, {"a": 4}]]), {"k": "v"})
        assert gc.collect() == 0
    finally:
        gc.enable()


class _Dev:
    """A tensor stand-in on "device 0" (the key takes GPU tensors only)."""

    def __init__(self, n):
        self.dtype, self.shape = "f", (n,)

    def get_device(self):
        return 0


def test_a_rebuilt_call_gets_each_tensor_back_where_it_was():
    # what a capture does: the key's tensor list, cloned, put back with argtree.remake. Keywords
    # and dicts given out of sorted order once got each other's tensors (b's static input
    # was a's), and a graph of the wrong call
    from recsys_doctor.applying._autoapply import graphs
    from recsys_doctor.applying._autoapply.argtree import remake

    b, a, c, d = _Dev(3), _Dev(2), _Dev(5), _Dev(4)
    args, kwargs = ({"z": c, "y": d},), {"b": b, "a": a}
    tensors = []
    graphs._key_part(_Dev, args, tensors)
    graphs._key_part(_Dev, kwargs, tensors)
    s_args, s_kwargs = remake((args, kwargs), _Dev, iter([("static", t) for t in tensors]))
    assert s_args[0]["z"] == ("static", c) and s_args[0]["y"] == ("static", d)
    assert s_kwargs["b"] == ("static", b) and s_kwargs["a"] == ("static", a)


def test_rebuild_and_a_batch_skeleton_put_back_what_the_key_lists():
    """A call rebuilt from the tensors in the order the key lists them (static inputs, padded
    rows, a batch's skeleton) gets each back under its own name, whatever order the script
    passed a dict or keywords in (``model(w=..., idx=...)`` once swapped the two)."""
    from recsys_doctor.applying._autoapply.argtree import Slot, remake, skeleton
    from recsys_doctor.applying._autoapply.graphs import _key_part

    if not torch.cuda.is_available():  # the key takes GPU tensors only: stand-ins on "device 0"
        tw, ti = _Dev(2), _Dev(3)
        T = _Dev
    else:  # pragma: no cover - on the GPU machine
        tw, ti = (torch.zeros(n, device="cuda") for n in (2, 3))
        T = torch.Tensor
    call = ((tw,), {"w": tw, "idx": ti})
    listed: list = []
    _key_part(T, call, listed)
    assert listed == [tw, tw, ti]  # the dict in its own order
    marks = [("static", i) for i in range(3)]
    out = remake(call, T, iter(marks))
    assert out[0] == (marks[0],) and list(out[1]) == ["w", "idx"] and out[1]["w"] == marks[1]
    assert out[1]["idx"] == marks[2]
    args, kwargs = remake(skeleton(call, T), Slot, iter(marks))
    assert args == (marks[0],) and list(kwargs) == ["w", "idx"] and kwargs["w"] == marks[1]
    assert kwargs["idx"] == marks[2]
