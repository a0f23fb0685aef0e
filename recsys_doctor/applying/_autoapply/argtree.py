"""The one walk over a model call's arguments: tuples (named ones too), lists, dicts and dataclass
instances (a script's ``Batch(dense=..., ids=...)``), nested, with tensors as leaves and anything
else a constant.

Every part of the hook that takes a call's tensors out or puts others back walks them here, in
one order: a sequence's items in order, a dict's values in the dict's own order (the order
:func:`.graphs._key_part` lists a call's tensors in). A container is made again as it was: a
list as a list, a tuple as a tuple, a named tuple as its own type (from its fields), a dict of
any kind as a ``dict`` with the same keys in the same order, a dataclass instance as a shallow copy
of itself with each field (in the class's field order) made again; constants are kept as they are.

* :func:`remake`: ``x`` with each leaf replaced by the next item of an iterator (a capture's
  static inputs, padded rows, host proxies, a batch's slices);
* :func:`skeleton`: ``x`` with each tensor replaced by :data:`SLOT` (keeps no tensor alive),
  made again with :func:`remake` over :class:`Slot` (a batch's calls, a thread graph's call);
* :func:`matches`: whether a call has a skeleton's structure and constants and, in its
  places, the very tensors given;
* :func:`flatten`: a call's tensors, and whether :func:`remake` gives back its own types;
* :func:`positional` / :func:`matches_positional`: :func:`matches` for the usual call's skeleton
  (positional tensors and plain lists of them, no keyword), as a flat check.

The hot path runs per model call in many threads: a container's leaf items are taken in the
container's own comprehension (no call per leaf), which makes :func:`remake` faster than the
walkers it replaced (their timings: the commit that made this module).
"""

from __future__ import annotations

import copy
import dataclasses
from itertools import repeat
from typing import Any, Iterator

__all__ = ["SLOT", "Slot", "dataclass_fields", "flatten", "matches", "remake", "skeleton"]


class Slot:
    """The type of :data:`SLOT`, a tensor's place in a :func:`skeleton`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SLOT"


SLOT = Slot()


_fields_of: dict[type, tuple[str, ...] | None] = {}


def dataclass_fields(t: type) -> tuple[str, ...] | None:
    """The field names of dataclass ``t`` in the class's order, or None where ``t`` is no
    dataclass (cached by type: the walk asks for every constant of every call)."""
    names = _fields_of.get(t, _fields_of)
    if names is _fields_of:
        names = _fields_of[t] = tuple(f.name for f in dataclasses.fields(t)) if dataclasses.is_dataclass(t) else None
    return names  # type: ignore[return-value]


def remake(x: Any, leaf: type[Any], it: Iterator[Any]) -> Any:
    """``x`` with every instance of ``leaf`` in it replaced, in walking order, by the next item
    of ``it``; containers made again as they were (the module's docstring)."""
    if isinstance(x, (list, tuple)):
        vals = [next(it) if isinstance(v, leaf) else remake(v, leaf, it) for v in x]
        return type(x)(*vals) if hasattr(x, "_fields") else type(x)(vals)
    if isinstance(x, dict):
        return {k: next(it) if isinstance(v, leaf) else remake(v, leaf, it) for k, v in x.items()}
    if isinstance(x, leaf):
        return next(it)
    names = dataclass_fields(type(x))
    if names is None:
        return x
    new = copy.copy(x)  # (not the class's __init__: fields with init=False, __post_init__ work)
    for n in names:
        v = getattr(x, n)
        object.__setattr__(new, n, next(it) if isinstance(v, leaf) else remake(v, leaf, it))  # (frozen ones too)
    return new


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
    elif type(x) is not type(skel):
        return False
    else:
        names = dataclass_fields(type(skel))
        if names is None:
            return bool(x == skel)
        pairs = ((getattr(skel, n), getattr(x, n)) for n in names)
    for s, v in pairs:
        if s is SLOT:
            if not isinstance(v, leaf) or v is not next(it, None):
                return False
        elif not matches(s, v, leaf, it):
            return False
    return True


def positional(skel: Any) -> tuple[int | None, ...] | None:
    """For the skeleton ``(args, kwargs)`` of a call made with positional tensors and plain lists
    of tensors only, no keyword: per argument, None for a tensor, the length for a list of them.
    None for any other skeleton (:func:`matches` checks those)."""
    if type(skel) is not tuple or len(skel) != 2 or type(skel[0]) is not tuple or skel[1] != {}:
        return None
    out: list[int | None] = []
    for a in skel[0]:
        if a is SLOT:
            out.append(None)
        elif type(a) is list and all(v is SLOT for v in a):
            out.append(len(a))
        else:
            return None
    return tuple(out)


def matches_positional(form: tuple[int | None, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
                       tensors: list[Any]) -> bool:
    """:func:`matches` of a skeleton whose :func:`positional` form is ``form``, against the call
    ``(args, kwargs)`` and the tensors ``tensors`` (each place must hold that very object: a
    tensor, so the type check is implied)."""
    if kwargs or len(args) != len(form):
        return False
    j = 0
    for a, n in zip(args, form):
        if n is None:
            if a is not tensors[j]:
                return False
            j += 1
        else:
            if type(a) is not list or len(a) != n:
                return False
            for v in a:
                if v is not tensors[j]:
                    return False
                j += 1
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
    elif isinstance(x, leaf):
        out.append(x)
        return True
    else:
        names = dataclass_fields(type(x))
        if names is None:
            return True
        ok, items = True, [getattr(x, n) for n in names]
    for v in items:
        if isinstance(v, leaf):
            out.append(v)
        elif not flatten(v, leaf, out):
            ok = False
    return ok
