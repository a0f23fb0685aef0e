"""The one walk over a model call's arguments: tuples (named ones too), lists and dicts, nested,
with tensors as leaves and anything else a constant.

Every part of the hook that takes a call's tensors out or puts others back walks them here, in
one order: a sequence's items in order, a dict's values in the dict's own order (the order
:func:`.graphs._key_part` lists a call's tensors in). A container is made again as it was: a
list as a list, a tuple as a tuple, a named tuple as its own type (from its fields), a dict of
any kind as a ``dict`` with the same keys in the same order; constants are kept as they are.

* :func:`remake`: ``x`` with each leaf replaced by the next item of an iterator (a capture's
  static inputs, padded rows, host proxies, a batch's slices);
* :func:`skeleton`: ``x`` with each tensor replaced by :data:`SLOT` (keeps no tensor alive),
  made again with :func:`remake` over :class:`Slot` (a batch's calls, a thread graph's call);
* :func:`matches`: whether a call has a skeleton's structure and constants and, in its
  places, the very tensors given;
* :func:`flatten`: a call's tensors, and whether :func:`remake` gives back its own types.

The hot path runs per model call in many threads: a container's leaf items are taken in the
container's own comprehension (no call per leaf), which makes :func:`remake` faster than the
walkers it replaced (their timings: the commit that made this module).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Iterator

__all__ = ["SLOT", "Slot", "flatten", "matches", "remake", "skeleton"]


class Slot:
    """The type of :data:`SLOT`, a tensor's place in a :func:`skeleton`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SLOT"


SLOT = Slot()


def remake(x: Any, leaf: type[Any], it: Iterator[Any]) -> Any:
    """``x`` with every instance of ``leaf`` in it replaced, in walking order, by the next item
    of ``it``; containers made again as they were (the module's docstring)."""
    if isinstance(x, (list, tuple)):
        vals = [next(it) if isinstance(v, leaf) else remake(v, leaf, it) for v in x]
        return type(x)(*vals) if hasattr(x, "_fields") else type(x)(vals)
    if isinstance(x, dict):
        return {k: next(it) if isinstance(v, leaf) else remake(v, leaf, it) for k, v in x.items()}
    return next(it) if isinstance(x, leaf) else x


def skeleton(x: Any, leaf: type[Any]) -> Any:
    """``x`` with every instance of ``leaf`` replaced by :data:`SLOT`."""
    return remake(x, leaf, repeat(SLOT))


def matches(skel: Any, x: Any, leaf: type[Any], it: Iterator[Any]) -> bool:
    """Whether ``x`` has the structure of ``skel`` (container types, lengths, dict keys in
    order) and its constants (same type, equal), with, in each :data:`SLOT`'s place, an
    instance of ``leaf`` that is the very object ``it`` yields next."""
    if skel is SLOT:
        return isinstance(x, leaf) and x is next(it, None)
    if isinstance(skel, (list, tuple)):
        if type(x) is not type(skel) or len(x) != len(skel):
            return False
        pairs: Any = zip(skel, x)
    elif isinstance(skel, dict):  # (a skeleton's dicts are plain: any dict with the keys in order matches)
        if not isinstance(x, dict) or tuple(x) != tuple(skel):
            return False
        pairs = zip(skel.values(), x.values())
    else:
        return type(x) is type(skel) and bool(x == skel)
    for s, v in pairs:
        if s is SLOT:
            if not isinstance(v, leaf) or v is not next(it, None):
                return False
        elif not matches(s, v, leaf, it):
            return False
    return True


def flatten(x: Any, leaf: type[Any], out: list[Any]) -> bool:
    """Append ``x``'s instances of ``leaf`` to ``out`` in walking order; whether :func:`remake`
    makes every container in ``x`` again with its own type (a list, a tuple, a named tuple or
    a plain dict: not a subclass of one of those, which it would make as its base)."""
    items: Any
    if isinstance(x, (list, tuple)):
        t = type(x)
        ok, items = t is list or t is tuple or (issubclass(t, tuple) and hasattr(x, "_fields")), x
    elif isinstance(x, dict):
        ok, items = type(x) is dict, x.values()
    else:
        if isinstance(x, leaf):
            out.append(x)
        return True
    for v in items:
        if isinstance(v, leaf):
            out.append(v)
        elif not flatten(v, leaf, out):
            ok = False
    return ok
