"""Models whose ``forward`` reads the host's clock or random numbers, or changes Python state of
its module: a CUDA graph would replay the values of its capture, and would not run that Python.

A graph holds what its capture computed from Python: ``time.time()`` in a freshness decay,
``random.random() < eps`` choosing an exploration branch, ``np.random`` noise, a
``random.Random`` / numpy generator the module keeps, are run once, at the capture, and every
replay gives that value again. Python a replay skips: ``self.calls += 1`` (and a branch taken
every 100th call on it), ``self.history.append(scores)``. The outputs or the module's state
would be wrong, silently, as ``torch.cuda.make_graphed_callables`` warns. So its ``forward`` is
read first (:func:`host_value_reason`): the code of every submodule's ``forward`` that is not
PyTorch's own, the methods of its class it calls on ``self`` and the functions of the script it
calls, a few levels deep, looking for
* a global that is one of the modules ``time``, ``random``, ``datetime``, ``secrets``, ``uuid``,
  ``numpy.random`` (or ``numpy`` followed by ``.random``), or a function of them
  (``from time import time``), or ``datetime`` / ``date`` followed by ``.now`` / ``.today`` /
  ``.utcnow``;
* a global or an attribute of the module that is a random generator (``random.Random``, numpy's
  ``Generator`` or ``RandomState``);
* a Python number, string, list or tuple attribute of the module changed in place
  (``self.x += ...``; a tensor buffer changed so is a kernel the graph replays, not flagged), or a
  list, dict, set or deque the module keeps changed by one of its methods (:data:`MUTATORS`).
The script hook runs such a module eagerly from its first call, with the reason and the line
(counted at its call sites as left to PyTorch: ``recsys_doctor/applying/_autoapply/modstate.py``);
:func:`~.serving.serve` serves it without CUDA graphs and without batching, with a warning
(:func:`host_values_off`: a batch would also draw one value, or count one call, for all its
requests). PyTorch's own random operations (``torch.rand``, dropout) are not host values: CUDA
graphs advance their generator at every replay. An attribute set, not changed in place (a mask
built once: ``self._mask = ...``), is not flagged.

A ``forward`` that changes a global in place (``global CALLS; CALLS += 1``, ``SEEN.append(...)``)
is flagged the same way. The values it only reads from outside its module (a global config dict,
a settings module's attribute, a closure variable, a dict or plain object the module holds) are
not reasons to run eagerly: :func:`inspect_forward` returns a :class:`~._watched.Guard` over them,
which the script hook checks at every call (a change retires the graphs). What is not seen: code
reached through ``getattr`` or ``exec``.
"""

from __future__ import annotations

import dataclasses
import dis
from collections import deque
import sys
import types
import warnings
from typing import Any, Iterator

from ._watched import Guard, attr_getter, cell_getter, data_value, global_getter, plain_object, watched_module

__all__ = ["host_value_reason", "inspect_forward", "host_values_off", "reason_kind", "HOST_VALUES", "PY_STATE"]

#: the modules whose values a graph would freeze
HOST_MODULES = frozenset({"time", "random", "datetime", "secrets", "uuid", "numpy.random"})
#: what, called on ``datetime.datetime`` or ``datetime.date``, reads the clock
CLOCK_ATTRS = frozenset({"now", "today", "utcnow"})
#: how deep calls are followed from a ``forward`` (a method of ``self``, a function of the script)
MAX_DEPTH = 3
#: the start of the reason (the whole: ``<Module>.forward reads <what> (<file>:<line>): ...``)
HOST_VALUES = "reads the host's clock or random numbers"
#: the other reason: the forward changes Python state of its module, which a replay does not run
PY_STATE = "changes Python state of its module"
#: the methods that change a list, dict, set or deque in place
MUTATORS = frozenset({"append", "extend", "insert", "pop", "popleft", "appendleft", "add", "update", "setdefault",
                      "clear", "remove", "discard"})
_CONTAINERS = (list, dict, set, deque)
#: the Python values a ``forward`` may count or collect in (``self.calls += 1``)
_PY_VALUES = (int, float, complex, str, list, tuple)


def _generators() -> tuple[type, ...]:
    import random

    out: list[type] = [random.Random]
    np = sys.modules.get("numpy")
    if np is not None:
        out += [np.random.Generator, np.random.RandomState]
    return tuple(out)


def _host_module(v: Any) -> bool:
    return isinstance(v, types.ModuleType) and (v.__name__ in HOST_MODULES or v.__name__.startswith("numpy.random."))


def _host_callable(v: Any, gens: tuple[type, ...]) -> bool:
    """``from time import time``, ``from random import random`` (a bound method of random's own
    generator), a bound method of any generator."""
    if isinstance(getattr(v, "__self__", None), gens):
        return True
    mod = getattr(v, "__module__", None)
    return callable(v) and not isinstance(v, type) and mod in HOST_MODULES


def _clock_class(v: Any) -> bool:
    return isinstance(v, type) and v.__module__ == "datetime" and v.__name__ in ("datetime", "date")


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _code_objects(c)


def _line(ins: dis.Instruction, code: types.CodeType) -> int:
    pos = getattr(ins, "positions", None)
    return (pos.lineno if pos is not None and pos.lineno else None) or code.co_firstlineno


def _scan(func: Any, owner: Any, gens: tuple[type, ...], depth: int, seen: set[tuple[int, int]],
          watch: Watches) -> tuple[str, str] | None:
    """What ``func`` (a function; ``owner``: the module whose method it is, else None) or the
    code it calls does that a replay would not: ``(HOST_VALUES or PY_STATE, "what (file:line)")``,
    else None. The values it reads from outside its module (:mod:`._watched`) go into ``watch``."""
    code = getattr(func, "__code__", None)
    if code is None or (id(code), id(owner)) in seen:
        return None
    seen.add((id(code), id(owner)))  # (per owner: each instance holds its own values)
    glb = getattr(func, "__globals__", {})
    builtins = glb.get("__builtins__", {})
    follow: list[tuple[Any, Any]] = []
    for co in _code_objects(code):
        ins_list = list(dis.get_instructions(co))
        self_name = co.co_varnames[0] if owner is not None and co.co_argcount else None
        for i, ins in enumerate(ins_list):
            nxt = ins_list[i + 1].argval if i + 1 < len(ins_list) else None
            where = f"{co.co_filename}:{_line(ins, co)}"
            if ins.opname == "LOAD_GLOBAL":
                name = ins.argval
                v = glb.get(name, builtins.get(name) if isinstance(builtins, dict) else getattr(builtins, name, None))
                what = _host_global(name, v, nxt, gens)
                if what:
                    return HOST_VALUES, f"{what} ({where})"
                changer = _mutator_call(v, ins_list, i)
                if changer:
                    return PY_STATE, f"{name}.{changer}(...) ({where})"
                if isinstance(v, types.FunctionType) and not _library(v):
                    follow.append((v, None))
                elif name in glb:
                    _watch_global(watch, glb, name, v, nxt)
            elif ins.opname == "STORE_GLOBAL" and _global_in_place(ins_list, i, ins.argval):
                return PY_STATE, f"global {ins.argval} {_op(ins_list, i)} ({where})"
            elif ins.opname == "LOAD_DEREF" and co is code:
                _watch_cell(watch, func, co, ins.argval)
            elif self_name is not None:
                hit = _self_use(ins_list, i, self_name, owner, gens, watch)
                if isinstance(hit, tuple):
                    return hit[0], f"{hit[1]} ({where})"
                if hit is not None:
                    follow.append((hit, owner))
    if depth >= MAX_DEPTH:
        return None
    for f, o in follow:
        found2 = _scan(f, o, gens, depth + 1, seen, watch)
        if found2:
            return found2
    return None


def _mutator_call(v: Any, ins_list: list[dis.Instruction], i: int) -> str | None:
    """The method changing ``v`` in place (``append``...) called right after the load at ``i``,
    where ``v`` is a list, dict, set or deque; else None."""
    nxt = ins_list[i + 1] if i + 1 < len(ins_list) else None
    if isinstance(v, _CONTAINERS) and nxt is not None and nxt.opname in ("LOAD_ATTR", "LOAD_METHOD") \
            and nxt.argval in MUTATORS:
        return str(nxt.argval)
    return None


#: what :func:`_scan` collects to watch: (holder's id, name) -> (label, getter)
Watches = dict[tuple[int, str], tuple[str, Any]]


def _watch_global(watch: Watches, glb: dict[str, Any], name: str, v: Any, nxt: Any) -> None:
    """Watch global ``name`` (its value ``v``; ``nxt``: the attribute read from it next) where it
    is data, or that attribute where it is a module of the script's own (``settings.SCALE``)."""
    if watched_module(v):
        if isinstance(nxt, str) and data_value(getattr(v, nxt, None)):
            watch.setdefault((id(v), nxt), (f"{v.__name__}.{nxt}", attr_getter(v, nxt)))
    elif data_value(v):
        watch.setdefault((id(glb), name), (f"global {name}", global_getter(glb, name)))


def _watch_cell(watch: Watches, func: Any, co: types.CodeType, name: str) -> None:
    """Watch the closure variable ``name`` of ``func`` where it holds data."""
    cells = getattr(func, "__closure__", None) or ()
    if name == "__class__" or name not in co.co_freevars:
        return
    k = co.co_freevars.index(name)
    if k < len(cells):
        get = cell_getter(cells[k])
        if data_value(get()):
            watch.setdefault((id(cells[k]), name), (f"closure {name}", get))


def _host_global(name: str, v: Any, nxt: Any, gens: tuple[type, ...]) -> str | None:
    """What global ``name`` (its value ``v``, the attribute read from it next ``nxt``) reads of
    the host's clock or random numbers, else None."""
    if _host_module(v):
        return f"{name}.{nxt}" if isinstance(nxt, str) else name
    if getattr(v, "__name__", None) == "numpy" and nxt == "random":
        return f"{name}.random"
    if _host_callable(v, gens) or isinstance(v, gens):
        return name
    if _clock_class(v) and nxt in CLOCK_ATTRS:
        return f"{name}.{nxt}"
    return None


def _self_use(ins_list: list[dis.Instruction], i: int, self_name: str, owner: Any,
              gens: tuple[type, ...], watch: Watches) -> tuple[str, str] | Any:
    """At instruction ``i``, a use of ``self``: ``(kind, what)`` where it reads a generator the
    module keeps (``self.rng``), adds to an attribute in place (``self.calls += 1``) or changes a
    list, dict, set or deque the module keeps (``self.history.append(...)``); a method of the
    module's class to follow; else None."""
    ins = ins_list[i]
    name = ins.argval
    if ins.opname == "STORE_ATTR" and isinstance(owner.__dict__.get(name), _PY_VALUES) \
            and _in_place(ins_list, i, name, self_name):  # (a tensor buffer changed in place is graph-safe)
        return PY_STATE, f"self.{name} {_op(ins_list, i)}"
    if ins.opname not in ("LOAD_ATTR", "LOAD_METHOD") or i == 0 or not _loads(ins_list[i - 1], self_name):
        return None
    v = owner.__dict__.get(name)
    if isinstance(v, gens):
        return HOST_VALUES, f"self.{name}"
    changer = _mutator_call(v, ins_list, i)
    if changer:
        return PY_STATE, f"self.{name}.{changer}(...)"
    if isinstance(v, _CONTAINERS) or (v is not None and plain_object(v)):
        # (a container or a plain object the module holds, which the script may change in place;
        # its plain numbers and strings are seen by nn.Module.__setattr__: modstate; each
        # instance's own, as two experts' self.cfg)
        watch.setdefault((id(owner), name), (f"{type(owner).__name__}.{name}", attr_getter(owner, name)))
    meth = getattr(type(owner), name, None)
    return meth if isinstance(meth, types.FunctionType) and not _library(meth) else None


def _in_place(ins_list: list[dis.Instruction], i: int, name: str, self_name: str) -> bool:
    """Whether the ``STORE_ATTR name`` at ``i`` ends ``self.name <op>= value``: an in-place
    operator, a load of the same attribute and of ``self`` among the few instructions before it."""
    back = ins_list[max(0, i - 8):i]
    return (any(b.opname in ("BINARY_OP", "INPLACE_ADD") and str(b.argrepr).endswith("=") for b in back)
            and any(b.opname == "LOAD_ATTR" and b.argval == name for b in back)
            and any(_loads(b, self_name) for b in back))


def _global_in_place(ins_list: list[dis.Instruction], i: int, name: str) -> bool:
    """Whether the ``STORE_GLOBAL name`` at ``i`` ends ``global name; name <op>= value``."""
    back = ins_list[max(0, i - 8):i]
    return (any(b.opname in ("BINARY_OP", "INPLACE_ADD") and str(b.argrepr).endswith("=") for b in back)
            and any(b.opname == "LOAD_GLOBAL" and b.argval == name for b in back))


def _op(ins_list: list[dis.Instruction], i: int) -> str:
    op = next((b.argrepr for b in reversed(ins_list[max(0, i - 8):i]) if b.opname == "BINARY_OP"), "+=")
    return f"{op} ..."


def _loads(ins: dis.Instruction, name: str) -> bool:
    """Whether ``ins`` leaves local ``name`` on top of the stack (3.13's pair loads too)."""
    if ins.opname in ("LOAD_FAST", "LOAD_FAST_CHECK"):
        return bool(ins.argval == name)
    return ins.opname == "LOAD_FAST_LOAD_FAST" and isinstance(ins.argval, tuple) and ins.argval[-1] == name


def _library(f: Any) -> bool:
    """PyTorch's own code (and numpy's, and this package's: ``parallel_branches``): not read."""
    mod = getattr(f, "__module__", None) or ""
    return mod.split(".")[0] in ("torch", "numpy", "recsys_doctor")


def host_value_reason(module: Any) -> str | None:
    """Why ``module`` must run eagerly because a ``forward`` of it (or of a submodule, or code
    they call) reads the host's clock or random numbers, with the line; else None."""
    return inspect_forward(module, guard=False)[0]


def inspect_forward(module: Any, guard: bool = True) -> tuple[str | None, Guard | None]:
    """``(reason, guard)``: :func:`host_value_reason`'s reason, and a :class:`~._watched.Guard`
    over the values the forwards read from outside the module (None: nothing to watch, a reason
    was found, or ``guard`` is False: ``serve()``'s check, which guards nothing)."""
    gens = _generators()
    seen: set[tuple[int, int]] = set()
    watch: Watches = {}
    try:
        subs = list(module.modules())
    except Exception:  # noqa: BLE001 - not a module tree we can walk: nothing said
        return None, None
    for sub in subs:
        fwd = getattr(type(sub), "forward", None)
        if not isinstance(fwd, types.FunctionType) or _library(fwd):
            continue
        try:
            found = _scan(fwd, sub, gens, 0, seen, watch)
        except Exception:  # noqa: BLE001 - code we cannot read (a C extension's): nothing said
            found = None
        if found:
            kind, what = found
            then = ("a CUDA graph would replay the values of its capture" if kind == HOST_VALUES
                    else "a CUDA graph's replay would not run it")
            return f"{type(sub).__name__}.forward {kind}, {what}: {then}: eager", None
    return None, (Guard(list(watch.values())) if watch and guard else None)


def reason_kind(why: str) -> str:
    """The kind of a :func:`host_value_reason` (``HOST_VALUES`` or ``PY_STATE``): the fallback's key."""
    return HOST_VALUES if HOST_VALUES in why else PY_STATE


def host_values_off(model: Any, cfg: Any) -> Any:
    """``cfg`` (a :class:`~._policy.RuntimeConfig`) with CUDA graphs and batching off, and a
    warning saying why, where ``model`` reads host values; else ``cfg`` as it is."""
    if not (cfg.cuda_graphs or cfg.batching):
        return cfg
    why = host_value_reason(model)
    if why is None:
        return cfg
    warnings.warn(f"recsys-doctor serve: served without CUDA graphs or batching: {why}", RuntimeWarning, stacklevel=3)
    return dataclasses.replace(cfg, cuda_graphs=False, batching=False)
