"""Values a ``forward`` reads from outside its module's own tensors and plain attributes: a
global (``CONFIG["boost"]``, ``BLEND``), an attribute of the script's own module
(``settings.TEMPERATURE``), a closure variable, or a container or plain object the module holds
(``self.weights["ctr"]``, ``self.cfg.scale``). A CUDA graph bakes the value it read at its
capture into its kernels (a Python number becomes a kernel argument; a tensor is read at the
address it had), so a script that changes such a value while it serves (an admin thread
reloading a feature flag, a new blend weight every hour) would get the old value from every
replay, silently. ``torch.compile`` guards on such values; the script hook does the same
(``recsys_doctor/applying/_autoapply/modstate.py``): :class:`Guard` keeps what each value was
when the module's graphs were made, and a call that finds one changed retires them (they are
captured again, and a value that changes every few calls makes the module eager).

How a value is compared (:func:`snap`): numbers, strings, ``None``, dtypes and devices by
value; tensors by address, dtype, shape and device (a change in place is read by the replay);
numpy scalars by value and arrays of up to 4 KB by their bytes (larger: identity, shape, dtype);
lists, tuples, dicts and sets of up to :data:`MAX_ITEMS` items, and plain objects (a
``SimpleNamespace``, a dataclass, an object of the script's class) by their contents, a few
levels deep; anything else (a module, a larger container) by identity (and a container's
length). What a call pays is a test made once per value (:func:`same_as`): the same object of an
immutable kind is unchanged at once; a dict, list or tuple of plain values, or a plain object's
fields, is compared with a copy in one C-level equality (after its items' types); one holding
tensors or models is compared by its keys and the same objects. Anything else is snapshotted
again. A value whose test fails to compare counts as changed.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import sys
import types
from typing import Any, Callable, cast

__all__ = ["Guard", "snap", "same_as", "data_value", "plain_object", "watched_module", "global_getter", "attr_getter",
           "cell_getter", "MAX_ITEMS"]

#: containers compared item by item up to this many items (larger ones: identity and length)
MAX_ITEMS = 64
#: numpy arrays compared by their bytes up to this size (larger ones: identity, shape and dtype)
MAX_ARRAY_BYTES = 4096
#: how deep containers and plain objects are compared
MAX_DEPTH = 3
_MISSING = object()
_SCALARS = (int, float, bool, str, bytes, complex, type(None))
_SCALAR_SET = frozenset(_SCALARS)
_CONTAINER_SET = frozenset({list, tuple, dict, set, frozenset})
#: what a global that is code, not data, is: never watched
_CODE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
         types.BuiltinMethodType, staticmethod, classmethod, property)
#: libraries whose module attributes are not the script's settings (besides the standard library)
_LIBRARIES = frozenset({"torch", "numpy", "pandas", "scipy", "einops", "torchrec", "fbgemm_gpu", "triton",
                        "sklearn", "recsys_doctor", "_recsys_doctor_autoapply", "typing_extensions"})


def _library_name(name: str) -> bool:
    top = name.split(".")[0]
    if top == "__main__":  # (the script's own)
        return False
    return top in _LIBRARIES or top in getattr(sys, "stdlib_module_names", ()) or top.startswith("_")


def watched_module(v: Any) -> bool:
    """Whether ``v`` is a module whose attributes a ``forward`` may read as settings (one of the
    script's own, not a library's)."""
    return isinstance(v, types.ModuleType) and not _library_name(v.__name__)


def data_value(v: Any) -> bool:
    """Whether ``v`` is data a graph would bake in, not code (a module, a function, a class, a
    callable object); a model (``nn.Module``) counts as data, compared by identity."""
    if isinstance(v, _CODE):
        return False
    return _module_obj(v) or not callable(v)


def _tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "data_ptr") and hasattr(v, "dtype")


def _module_obj(v: Any) -> bool:
    nn = sys.modules.get("torch.nn")
    return nn is not None and isinstance(v, nn.Module)


def snap(v: Any, depth: int = 0) -> Any:
    """A comparable picture of ``v`` (see the module's doc)."""
    t = type(v)
    if t in _SCALAR_SET:
        return (t, repr(v)) if t is float else (t, v)  # (repr: a NaN equals itself; 1, 1.0 and True differ)
    if t in _CONTAINER_SET:
        return _container(v, t, depth)
    if _tensor(v):
        try:
            return ("T", v.data_ptr(), v.dtype, tuple(v.shape), str(v.device))
        except (RuntimeError, NotImplementedError):
            return ("id", id(v))
    if t.__module__ == "torch" or isinstance(v, enum.Enum):  # (a dtype, a device, a layout; an enum member)
        return (t, str(v))
    if t.__module__ == "numpy":
        return _numpy(v, t)
    if depth >= MAX_DEPTH or _module_obj(v):
        return ("id", id(v))
    if isinstance(v, (list, tuple, dict, set, frozenset)):
        return _container(v, t, depth)
    fields = _plain_fields(v)
    if fields is not None:
        return (t, _container(fields, dict, depth + 1))
    return ("id", id(v))


def _numpy(v: Any, t: type) -> Any:
    """A numpy scalar by value; an array of up to :data:`MAX_ARRAY_BYTES` by its bytes (a table of
    weights ``forward`` reads, changed in place), a larger one by identity, shape and dtype."""
    shape = getattr(v, "shape", None)
    if shape == () or shape is None:
        return (t, repr(v))
    try:
        if v.nbytes <= MAX_ARRAY_BYTES:
            return ("np", shape, v.dtype.str, v.tobytes())
        return ("np", id(v), shape, v.dtype.str)
    except (AttributeError, TypeError, ValueError):
        return ("id", id(v))


def _container(v: Any, t: type, depth: int) -> Any:
    n = len(v)
    if n > MAX_ITEMS or depth >= MAX_DEPTH:
        return ("id", id(v), n)
    if isinstance(v, dict):
        if _SCALAR_SET.issuperset(map(type, v.values())) and _SCALAR_SET.issuperset(map(type, v)):
            return (t, tuple(v.items()), tuple(map(type, v.values())))  # (all plain: compared in C)
        return (t, tuple((snap(k, depth + 1), snap(x, depth + 1)) for k, x in v.items()))
    if isinstance(v, (set, frozenset)):
        return (t, frozenset(snap(x, depth + 1) for x in v))
    if _SCALAR_SET.issuperset(map(type, v)):
        return (t, tuple(v), tuple(map(type, v)))
    return (t, tuple(snap(x, depth + 1) for x in v))


def plain_object(v: Any) -> bool:
    """Whether ``v`` is a plain object compared by its fields (:func:`_plain_fields`)."""
    return _plain_fields(v) is not None


def _plain_fields(v: Any) -> dict[str, Any] | None:
    """A plain object's fields (a ``SimpleNamespace``, a dataclass, an object of a class of the
    script's), else None."""
    if isinstance(v, types.SimpleNamespace):
        return vars(v)
    d = getattr(v, "__dict__", None)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return d if isinstance(d, dict) else {f.name: getattr(v, f.name, None) for f in dataclasses.fields(v)}
    if isinstance(d, dict) and not _library_name(type(v).__module__) and not callable(v):
        return d
    return None


def _by_identity(v: Any) -> bool:
    """Whether the same object ``v`` is known unchanged without a new snapshot."""
    return type(v) in _SCALAR_SET or _tensor(v) or _module_obj(v) or type(v).__module__ == "torch" \
        or isinstance(v, enum.Enum) or (type(v).__module__ == "numpy" and getattr(v, "shape", None) == ())


def _plain_items(v: Any) -> bool:
    """Whether the values (a dict's) or items of ``v`` are all numbers, strings or None."""
    return _SCALAR_SET.issuperset(map(type, v.values() if isinstance(v, dict) else v))


def same_as(v: Any) -> Callable[[Any], bool]:
    """A test of whether a later value is still what ``v`` is now (as :func:`snap` compares),
    made once for the kind of ``v`` so that the test a call pays is short: the same object of
    an immutable kind at once; a dict, list or tuple of plain items (or a plain object's
    fields of plain values) by C-level equality with a copy and the items' types."""
    t = type(v)
    if _by_identity(v):
        s = snap(v)
        return lambda x: x is v or snap(x) == s
    fields = None if t in _CONTAINER_SET else _plain_fields(v)
    small = t in (dict, list, tuple) and len(v) <= MAX_ITEMS
    if small and _plain_items(v):
        copy = t(v)
    elif small and all(map(_by_identity, v.values() if t is dict else v)):
        return _same_items(v, t)
    elif fields is not None and type(fields) is dict and len(fields) <= MAX_ITEMS and _plain_items(fields):
        copy = dict(fields)
    else:
        s = snap(v)
        return lambda x: snap(x) == s
    # (the items' types first: an equality is then between plain values only, never a tensor's)
    if fields is None:
        kinds = tuple(map(type, copy.values() if t is dict else copy))
        values = dict.values if t is dict else (lambda c: c)
        return lambda x: type(x) is t and tuple(map(type, values(x))) == kinds and x == copy
    kinds = tuple(map(type, copy.values()))
    return lambda x: type(x) is t and tuple(map(type, x.__dict__.values())) == kinds and x.__dict__ == copy


def _same_items(v: Any, t: type) -> Callable[[Any], bool]:
    """The test for a dict, list or tuple whose items are tensors, models, numbers, dtypes:
    the same keys in the same order and the same objects (an item replaced is a change; a
    tensor changed in place is not: a replay reads it). One C-level pass a call: a cache of
    20 tensors in a dict costs what a dict of plain values does, not 20 snapshots."""
    if t is dict:
        keys, vals = tuple(v), tuple(v.values())
        return lambda x: (type(x) is dict and len(x) == len(keys) and tuple(x) == keys
                          and all(map(operator.is_, x.values(), vals)))
    items = tuple(v)

    def same(x: Any) -> bool:
        if type(x) is not t:
            return False
        xs = cast(Any, x)  # (narrowed to object by the type test)
        return len(xs) == len(items) and all(map(operator.is_, xs, items))
    return same


class Guard:
    """The values a module's ``forward`` reads from outside it (``watches``: ``(label, get)``,
    ``get()`` the value now, :data:`_MISSING` once gone), as they were when the guard was made or
    :meth:`keep` was last given their tests."""

    __slots__ = ("watches", "tests")

    def __init__(self, watches: list[tuple[str, Callable[[], Any]]]) -> None:
        self.watches = watches
        self.tests: list[tuple[Callable[[], Any], Callable[[Any], bool]]] = self.look()[1]

    def look(self) -> tuple[tuple[tuple[str, Any], ...], list[Any]]:
        """The values as they are now, ``(label, snapshot)`` pairs, and the tests of them that
        :meth:`keep` makes the guard's (not yet: a caller retiring graphs first keeps them after,
        so that no other thread passes :meth:`holds` on the new values before the retire)."""
        objs = [get() for _, get in self.watches]
        tests = [(get, same_as(v)) for (_, get), v in zip(self.watches, objs)]
        return tuple((label, snap(v)) for (label, _), v in zip(self.watches, objs)), tests

    def keep(self, tests: list[Any]) -> None:
        self.tests = tests

    def holds(self) -> bool:
        """Whether every value is what the tests kept were made of (a test that fails to compare: a change)."""
        try:
            for get, same in self.tests:
                if not same(get()):
                    return False
        except Exception:  # noqa: BLE001 - a value that cannot be compared is taken as changed
            return False
        return True


def global_getter(glb: dict[str, Any], name: str) -> Callable[[], Any]:
    return lambda: glb.get(name, _MISSING)


def attr_getter(obj: Any, name: str) -> Callable[[], Any]:
    return lambda: getattr(obj, name, _MISSING)


def cell_getter(cell: Any) -> Callable[[], Any]:
    def get() -> Any:
        try:
            return cell.cell_contents
        except ValueError:  # (an empty cell)
            return _MISSING
    return get
