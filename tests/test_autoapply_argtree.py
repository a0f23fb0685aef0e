"""The hook's one walk over a model call's arguments (:mod:`recsys_doctor.applying._autoapply.argtree`):
what a capture, a padded call, a batch and a thread graph put back is the call's own structure.

The expected structures are written out by hand from the rules (a container made again with its
own type, a named tuple from its fields, a dict in its own order, constants kept)."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest

from recsys_doctor.applying._autoapply.argtree import SLOT, Slot, flatten, matches, remake, skeleton

torch = pytest.importorskip("torch")
T = torch.Tensor

Batch = namedtuple("Batch", "dense sparse")
One = namedtuple("One", "x")


class Typed(NamedTuple):
    ids: object
    scale: float = 1.0


class Dev:
    """A GPU-tensor stand-in (the graph key takes GPU tensors only)."""

    dtype, shape = "f", (1,)

    def get_device(self):
        return 0


def _call():
    """A call of every kind of container, tensors ``t0..t5`` in walking order, constants between."""
    t = [torch.full((i + 1,), float(i)) for i in range(6)]
    args = (Batch(t[0], [t[1], t[2]]), {"b": t[3], "a": (7, None, "x")}, One(t[4]))
    kwargs = {"w": Typed(t[5], 0.5), "k": 3}
    return t, args, kwargs


def _marks(n):
    return [("new", i) for i in range(n)]


def test_remake_puts_each_leaf_back_in_its_place_with_every_container_type_kept():
    t, args, kwargs = _call()
    m = _marks(6)
    a, kw = remake((args, kwargs), T, iter(m))
    want_a = (Batch(m[0], [m[1], m[2]]), {"b": m[3], "a": (7, None, "x")}, One(m[4]))
    want_kw = {"w": Typed(m[5], 0.5), "k": 3}
    assert a == want_a and kw == want_kw
    # == does not see container types (a named tuple equals a plain tuple): check them one by one
    assert type(a) is tuple and type(a[0]) is Batch and type(a[0].sparse) is list
    assert type(a[1]) is dict and list(a[1]) == ["b", "a"] and type(a[1]["a"]) is tuple
    assert type(a[2]) is One and a[2].x == m[4]  # a one-field named tuple (once: a generator in it)
    assert type(kw["w"]) is Typed and kw["w"].scale == 0.5 and list(kw) == ["w", "k"]


def test_remake_with_the_same_tensors_gives_an_equal_structure_of_the_same_objects():
    t, args, kwargs = _call()
    a, kw = remake((args, kwargs), T, iter(t))
    assert a[0].dense is t[0] and a[0].sparse[1] is t[2] and a[2].x is t[4] and kw["w"].ids is t[5]
    assert a[1]["a"] == (7, None, "x") and kw["k"] == 3


def test_a_structseq_is_made_again_from_a_sequence():
    """``torch.return_types`` (what ``torch.topk`` returns, passed on to a model): a tuple subclass
    without ``_fields`` whose constructor takes one sequence."""
    r = torch.topk(torch.arange(5.0), 2)
    m = _marks(2)
    (out,) = remake((r,), T, iter(m))
    assert type(out) is type(r) and out.values == m[0] and out.indices == m[1]


def test_a_skeleton_holds_no_tensor_and_filled_gives_the_call_back():
    t, args, kwargs = _call()
    sk = skeleton((args, kwargs), T)
    assert sk == ((Batch(SLOT, [SLOT, SLOT]), {"b": SLOT, "a": (7, None, "x")}, One(SLOT)),
                  {"w": Typed(SLOT, 0.5), "k": 3})
    assert type(sk[0][0]) is Batch and type(sk[1]["w"]) is Typed
    m = _marks(6)
    assert remake(sk, Slot, iter(m)) == remake((args, kwargs), T, iter(m))
    a, kw = remake(sk, Slot, iter(m))
    assert type(a[0]) is Batch and type(a[0].sparse) is list and type(kw["w"]) is Typed


def test_flatten_lists_the_tensors_in_walking_order():
    t, args, kwargs = _call()
    out: list = []
    assert flatten((args, kwargs), T, out)
    assert [id(x) for x in out] == [id(x) for x in t]


def test_the_walk_lists_tensors_in_the_order_the_graph_key_does():
    from recsys_doctor.applying._autoapply.graphs import _key_part

    d = [Dev() for _ in range(5)]
    call = ((Batch(d[0], [d[1]]), {"z": d[2], "a": d[3]}), {"k": One(d[4]), "c": 1})
    keyed: list = []
    _key_part(Dev, call, keyed)
    walked: list = []
    flatten(call, Dev, walked)
    assert keyed == walked == d


@pytest.mark.parametrize("container, remade_as_is", [
    ([1], True), ((1,), True), ({"a": 1}, True), (Batch(1, 2), True), (Typed(1), True),
    (OrderedDict(a=1), False),  # made again as a plain dict
    (type("L", (list,), {})([1]), False),  # a list subclass: made again as its type from a list, not known to work
    (torch.Size([2, 3]), False),  # a tuple subclass that is not a named tuple
])
def test_flatten_says_whether_remake_gives_every_container_its_own_type(container, remade_as_is):
    assert flatten(((container,), {}), T, []) is remade_as_is


def test_matches_takes_the_very_tensors_in_the_same_structure_only():
    a, b = torch.zeros(1), torch.zeros(2)
    sk = skeleton(((Batch(a, [b]), 5), {"k": "v"}), T)
    assert matches(sk, ((Batch(a, [b]), 5), {"k": "v"}), T, iter([a, b]))
    assert not matches(sk, (((a, [b]), 5), {"k": "v"}), T, iter([a, b]))  # a plain tuple, not the named one
    assert not matches(sk, ((Batch(a, (b,)), 5), {"k": "v"}), T, iter([a, b]))  # a tuple, not the list
    assert not matches(sk, ((Batch(a, [b]), 5), {"k": "v"}), T, iter([b, a]))  # other tensors in the places
    assert not matches(sk, ((Batch(a, [b]), 5.0), {"k": "v"}), T, iter([a, b]))  # 5.0 is not 5
    assert not matches(sk, ((Batch(a, [b]), 5), {"j": "v"}), T, iter([a, b]))  # another keyword
    assert matches(sk, ((Batch(a, [b]), 5), OrderedDict(k="v")), T, iter([a, b]))  # any dict, keys in order


@dataclass
class Features:
    """A script's batch as a dataclass: tensors, a nested list, a constant; a field set in
    __post_init__ (init=False) and one __init__ would refuse to take again."""

    dense: object
    ids: list
    scale: float = 1.0
    rows: int = field(init=False)

    def __post_init__(self):
        self.rows = len(self.ids)


@dataclass(frozen=True, slots=True)
class Frozen:
    x: object
    tag: str = "t"


def test_a_dataclass_is_walked_field_by_field_and_made_again_as_itself():
    t = [torch.full((i + 1,), float(i)) for i in range(4)]
    call = ((Features(t[0], [t[1], t[2]], 0.5),), {"f": Frozen(t[3])})
    out: list = []
    assert flatten(call, T, out) and [id(x) for x in out] == [id(x) for x in t]
    m = _marks(4)
    (a,), kw = remake(call, T, iter(m))
    assert type(a) is Features and (a.dense, a.ids, a.scale, a.rows) == (m[0], [m[1], m[2]], 0.5, 2)
    assert type(a.ids) is list and a is not call[0][0] and call[0][0].dense is t[0]  # the call's own is untouched
    assert type(kw["f"]) is Frozen and (kw["f"].x, kw["f"].tag) == (m[3], "t")
    with pytest.raises(AttributeError):
        kw["f"].x = 1  # still frozen
    # a skeleton holds none of the tensors, and matches the very same ones in the same fields only
    sk = skeleton(call, T)
    assert sk[0][0].dense is SLOT and sk[0][0].ids == [SLOT, SLOT] and sk[1]["f"].x is SLOT
    assert matches(sk, call, T, iter(t))
    assert not matches(sk, call, T, iter([t[1], t[0], t[2], t[3]]))
    assert not matches(sk, ((Features(t[0], [t[1], t[2]], 2.0),), {"f": Frozen(t[3])}), T, iter(t))  # another scale
    assert not matches(sk, ((Features(t[0], [t[1]], 0.5),), {"f": Frozen(t[3])}), T, iter(t))  # one id tensor fewer
    assert not matches(sk, ((Features(t[0], [t[1], t[2]], 0.5),), {"f": Frozen(t[3], "u")}), T, iter(t))


def test_a_dataclass_is_keyed_by_its_type_and_fields_in_the_walks_order():
    from recsys_doctor.applying._autoapply.graphs import _key_part

    d = [Dev() for _ in range(3)]
    call = ((Features(d[0], [d[1]], 0.5),), {"f": Frozen(d[2])})
    keyed: list = []
    key = _key_part(Dev, call, keyed)
    walked: list = []
    flatten(call, Dev, walked)
    assert keyed == walked == d
    dev = ("f", (1,), 0)
    assert key == ("tuple", (("tuple", ((Features, (dev, ("list", (dev,)), ("C", 0.5), ("C", 1))),)),
                             ("dict", (("f", (Frozen, (dev, ("C", "t")))),))))
    with pytest.raises(TypeError, match="an argument of type object"):
        _key_part(Dev, Features(d[0], [object()]), [])  # a field of an unknown type: not graphed, as any
