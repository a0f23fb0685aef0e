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
    # dicts by sorted key; args then kwargs
    assert key == (id(m), (("tuple", (("C", 1), ("list", (("C", 2.5), ("C", "x"))),
                                      ("dict", (("a", ("C", True)), ("b", ("C", None)))))),
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


def test_rebuild_takes_a_dicts_tensors_in_the_keys_order():
    """The key lists a dict's tensors in sorted key order; rebuilding a call from them (static
    inputs, padded rows, a batch's skeleton) must put each back under its own name, whatever
    order the script passed them in (``model(w=..., idx=...)`` once swapped the two)."""
    from recsys_doctor.applying._autoapply.batching import _fill, _skeleton
    from recsys_doctor.applying._autoapply.graphs import _rebuild

    tw, ti, rw, ri = (torch.full((2,), float(v)) for v in range(4))
    out = _rebuild(torch, ({"w": tw, "idx": ti}, 5), iter([ri, rw]))  # sorted: idx, then w
    assert list(out[0]) == ["w", "idx"] and out[0]["w"] is rw and out[0]["idx"] is ri and out[1] == 5
    skel = _skeleton(torch.Tensor, ((tw,), {"w": tw, "idx": ti}))
    args, kwargs = _fill(skel, iter([rw, ri, rw]))
    assert args[0] is rw and list(kwargs) == ["w", "idx"] and kwargs["idx"] is ri and kwargs["w"] is rw
