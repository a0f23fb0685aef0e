"""Models that change while they serve: a graph captured from a module's call holds its
parameters and buffers by address and its plain attributes by value, so anything that changes
them after the capture retires the module's graphs, which are captured again.

A serving script may install a new model version without a restart
(``examples/heldout/model_refresh_serve.py``): ``load_state_dict(sd, assign=True)`` (the state
dict's tensors become the parameters: new addresses, the old memory freed), ``.to()`` /
``.half()``, a new temperature (``model.temperature = t``, read by ``forward`` as a Python
float), or a new model object, which may come to live at the address (``id``) of a dropped one
that the hook's keys still name. Replaying the old graphs gave wrong scores there, and a crash
with batching (``bench/apply/results/refresh_h200/``). An in-place
``load_state_dict(sd)`` (copies into the same parameters) needs nothing: a replay reads the
new values.

How it is known, at the cost of one dictionary look-up a call:

* ``nn.Module``'s ``__setattr__``, ``__delattr__``, ``_apply`` (``.to()``, ``.cuda()``,
  ``.half()``...), ``register_buffer``/``register_parameter``/``add_module`` and the forward
  hook registrations bump one revision counter, unless the thread is inside a hooked model
  call (a ``forward`` writing its own attributes is not an input change: a replay does not
  run ``forward`` at all), or where ``__setattr__`` sets the object an attribute holds already
  (``model.eval()`` before every request);
* each top-level hooked call looks its module up (:func:`check`): the same object, the same
  revision as when it was last looked at: nothing to do. Otherwise its signature (every
  submodule's type, its parameters' and buffers' addresses, dtypes and shapes, its plain
  attributes - numbers, strings, tuples of them, tensors by address - and its forward hooks)
  is taken again. A different signature, or a new object at a known ``id``, retires
  everything the hook holds for that ``id`` (:func:`_retire`): the groups' graphs, row
  buckets and batches, the batching spec, the runtime route; a thread's own graph is dropped
  by its thread at its next call (:func:`fresh`). The graphs' memory goes back to the budget.
* a module whose graphs keep being retired before they pay off (``THRASH`` times in a row,
  fewer than ``PAYOFF_CALLS`` calls each) runs eagerly from then on, with the reason.

A ``forward`` that reads the host's clock or random numbers, or changes Python state of its
module (``self.calls += 1``, ``self.history.append(...)``), runs eagerly from its first call
(``recsys_doctor/runtime/_hostvalues.py``). The values a ``forward`` reads from outside its module
(a global such as ``FLAGS["blend"]``, an attribute of a settings module of the script's, a closure
variable, a dict or plain object the module holds: ``runtime/_watched.py``) are guarded: the
record keeps what they were, a call that finds one changed takes the signature again (they are
part of it), and the change retires the graphs as any other does. What is not seen: ``p.data = x``
or ``torch.utils.swap_tensors`` on a parameter (as with ``torch.cuda.make_graphed_callables``),
code reached through ``getattr`` or ``exec``, and the inside of what a guard compares by
identity (a library's object, a container of more than 64 items: identity and length).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ._common import _state, _tls, trains
from .argtree import flatten
from .fallback import _fall_back

#: a module changed this many times in a row within ``PAYOFF_CALLS`` calls of its last change runs eagerly
THRASH = 3
PAYOFF_CALLS = 64
#: why a module whose parameters and buffers are on several GPUs runs eagerly
SPANS_DEVICES = "its parameters are on more than one GPU (a CUDA graph captures one device's work)"
#: why such a module runs eagerly
CHANGES_OFTEN = "the module changes every few calls (its graphs would never pay off): eager"

_SCALARS = (int, float, bool, str, type(None))
_MISSING = object()
#: the Module methods that change what a graph of it reads (patched by :func:`patch`)
_CHANGERS = ("__setattr__", "__delattr__", "_apply", "register_buffer", "register_parameter", "add_module",
             "register_forward_hook", "register_forward_pre_hook")

_lock = threading.Lock()
_rev = [0]  # the revision counter (a list: bumped from the patched methods)
_recs: dict[int, _Rec] = {}
_dead: list[int] = []  # ids of recorded modules collected since (their records retired at the next slow look-up)
_internals: frozenset[str] = frozenset()


class _Rec:
    __slots__ = ("ref", "rev", "sig", "version", "calls", "thrash", "eager", "params", "guard", "device")

    def __init__(self, module: Any, rev: int, sig: tuple[Any, ...]) -> None:
        mid = id(module)
        self.ref = weakref.ref(module, lambda _r: _dead.append(mid))
        self.rev = rev
        self.sig = sig
        self.version = 0
        self.calls = 0  # calls since the last change
        self.thrash = 0  # changes in a row that came within PAYOFF_CALLS calls
        self.eager: str | None = None
        self.params: tuple[Any, ...] | None = None  # (its parameters, for frozen_call: taken again on a change)
        self.guard: Any = None  # (the values its forward reads from outside it: runtime/_watched.py)
        self.device: int | None = None  # (the CUDA device of its parameters and buffers: None on the CPU)


def reset() -> None:
    """Forget every module (a new activation of the hook)."""
    with _lock:
        _recs.clear()
        _dead.clear()


def _bump() -> None:
    if not getattr(_tls, "depth", 0):
        _rev[0] += 1


def patch(torch: Any) -> None:
    """Patch the ``nn.Module`` methods that change a module (once; :func:`unpatch` undoes it)."""
    global _internals
    nn = torch.nn
    if _state.get("orig_module_changers"):
        return
    _internals = frozenset(nn.Module().__dict__)
    origs = {name: getattr(nn.Module, name) for name in _CHANGERS}

    def wrap(orig: Any) -> Any:
        def changer(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return orig(self, *args, **kwargs)
            finally:
                _bump()

        changer.__wrapped__ = orig  # type: ignore[attr-defined]
        changer.__name__ = orig.__name__
        return changer

    def wrap_setattr(orig: Any) -> Any:
        def __setattr__(self: Any, name: str, value: Any) -> None:
            if self.__dict__.get(name, _MISSING) is value:
                # the same object again (``model.eval()`` before every request sets ``training``
                # to False on every submodule): nothing changed, no signature taken again
                return orig(self, name, value)  # type: ignore[no-any-return]
            try:
                return orig(self, name, value)  # type: ignore[no-any-return]
            finally:
                _bump()

        __setattr__.__wrapped__ = orig  # type: ignore[attr-defined]
        return __setattr__

    for name, orig in origs.items():
        setattr(nn.Module, name, wrap_setattr(orig) if name == "__setattr__" else wrap(orig))
    _state["orig_module_changers"] = origs


def unpatch(torch: Any) -> None:
    for name, orig in (_state.pop("orig_module_changers", None) or {}).items():
        setattr(torch.nn.Module, name, orig)


def _value(torch: Any, v: Any) -> Any:
    """A plain attribute as the signature holds it, or None where it is not one it follows."""
    if isinstance(v, _SCALARS):
        return (type(v).__name__, repr(v))  # (repr: a NaN equals itself, 1 and 1.0 and True differ)
    if isinstance(v, torch.Tensor):
        try:
            return ("T", v.data_ptr(), v.dtype, tuple(v.shape), v.device) if v.device.type != "meta" else ("T", "meta")
        except (RuntimeError, NotImplementedError):  # (a sparse or other tensor without one data pointer)
            return ("T", id(v), v.dtype, tuple(v.shape), v.device)
    if isinstance(v, (torch.dtype, torch.device)):
        return ("D", str(v))
    if isinstance(v, (tuple, list)) and len(v) <= 64 and all(isinstance(x, _SCALARS) for x in v):
        return (type(v).__name__, repr(v))
    return None


def signature(torch: Any, module: Any) -> tuple[Any, ...]:
    """What a graph of ``module``'s call depends on beyond its arguments (see the module's doc);
    where a module cannot be walked, a constant (its changes are then not seen, and the call
    is never broken by the check)."""
    try:
        return _signature(torch, module)
    except Exception as ex:  # noqa: BLE001 - never break the script's call
        return (("signature not taken", type(ex).__name__),)


def _signature(torch: Any, module: Any) -> tuple[Any, ...]:
    parts: list[Any] = []
    for name, m in module.named_modules(remove_duplicate=False):
        parts.append((name, type(m)))
        d = getattr(m, "__dict__", {})
        for group in ("_parameters", "_buffers"):
            for k, t in (d.get(group) or {}).items():
                parts.append((group, k, None if t is None else _value(torch, t)))
        for group in ("_forward_hooks", "_forward_pre_hooks"):
            hooks = d.get(group)
            if hooks:
                parts.append((group, tuple(id(h) for h in hooks.values())))
        for k, v in d.items():
            if k not in _internals:
                val = _value(torch, v)
                if val is not None:
                    parts.append((k, val))
    return tuple(parts)


def cuda_devices(module: Any) -> tuple[int, ...]:
    """The CUDA devices of ``module``'s parameters and buffers, in the order first seen."""
    seen: dict[int, None] = {}
    try:
        for t in (*module.parameters(), *module.buffers()):
            if t.is_cuda:
                seen.setdefault(t.get_device(), None)
    except Exception:  # noqa: BLE001 - a module we cannot walk: none said
        return ()
    return tuple(seen)


def _place(rec: _Rec, module: Any) -> str | None:
    """Set ``rec.device`` from ``module``'s parameters and buffers; the reason to run it eagerly
    where they are on more than one GPU (a model split over GPUs: a CUDA graph is captured on
    one device's stream, and the other's kernels would run outside it, once), else None."""
    devs = cuda_devices(module)
    rec.device = devs[0] if devs else None
    return f"{SPANS_DEVICES} (cuda:{', cuda:'.join(map(str, devs))}): eager" if len(devs) > 1 else None


def _full_signature(torch: Any, module: Any, rec: _Rec) -> tuple[tuple[Any, ...], list[Any]]:
    """:func:`signature` and the values its guard watches, as they are now; and the guard's
    tests of those values, for the caller to keep once it may (:meth:`Guard.look`, :func:`_keep`)."""
    sig = signature(torch, module)
    if rec.guard is None:
        return sig, []
    parts, tests = rec.guard.look()
    return sig + parts, tests


def _keep(rec: _Rec, tests: list[Any]) -> None:
    """The guard of ``rec`` (where it has one) holds from now on to the values ``tests`` were made of."""
    if rec.guard is not None:
        rec.guard.keep(tests)


def _changed(old: tuple[Any, ...], new: tuple[Any, ...]) -> str:
    """What differs between two signatures, in a few words (the first difference)."""
    for a, b in zip(old, new):
        if a != b:
            what = b[1] if b and b[0] in ("_parameters", "_buffers") else b[0]
            return f"{what!s} changed"
    return "its submodules changed"


def check(torch: Any, module: Any) -> _Rec:
    """``module``'s record, its graphs retired first where it changed since they were made: at
    every top-level hooked call, before anything keyed by ``id(module)`` is used."""
    rec = _recs.get(id(module))
    if rec is not None and rec.rev == _rev[0] and rec.ref() is module and (rec.guard is None or rec.guard.holds()):
        rec.calls += 1
        return rec
    return _look_again(torch, module)


def _look_again(torch: Any, module: Any) -> _Rec:
    with _lock:
        while _dead:
            mid = _dead.pop()
            old = _recs.get(mid)
            if old is not None and old.ref() is None:
                del _recs[mid]
                _retire(torch, mid)
        rev = _rev[0]  # (read before the signature: a change made meanwhile is seen at the next call)
        mid = id(module)
        rec = _recs.get(mid)
        if rec is None or rec.ref() is not module:
            if rec is not None:  # a new object at the address of a collected one, not yet retired
                _retire(torch, mid)
            from recsys_doctor.runtime._hostvalues import inspect_forward, reason_kind

            rec = _recs[mid] = _Rec(module, rev, ())
            # (a forward a replay would not reproduce: eager; the values it reads from outside: guarded)
            rec.eager, rec.guard = inspect_forward(module)
            rec.sig, tests = _full_signature(torch, module, rec)
            _keep(rec, tests)
            spans = _place(rec, module)
            if spans is not None:
                rec.eager = spans
            if rec.eager is not None:
                kind = SPANS_DEVICES if spans is not None else reason_kind(rec.eager)
                _fall_back(f"{type(module).__name__}: {rec.eager}", kind)
            return rec
        if rec.rev == rev and (rec.guard is None or rec.guard.holds()):
            return rec
        sig, tests = _full_signature(torch, module, rec)
        if sig == rec.sig:
            _keep(rec, tests)
            rec.rev = rev
            return rec
        why = _changed(rec.sig, sig)
        rec.sig = sig
        rec.params = None
        spans = _place(rec, module)
        if spans is not None and rec.eager is None:
            rec.eager = spans
            _fall_back(f"{type(module).__name__}: {spans}", SPANS_DEVICES)
        rec.version += 1
        if not getattr(module, "training", False):  # (a training module's calls run eagerly anyway: DDP's no_sync() sets an
            rec.thrash = rec.thrash + 1 if rec.calls < PAYOFF_CALLS else 1  # attribute around each call)
        rec.calls = 0
        n = _retire(torch, mid)
        # only now may another thread's call take the fast path of check(): set before the
        # retire, a thread of another group replayed a graph of the version before (one request
        # scored with the old weights after load_state_dict(assign=True), on the H200; and a
        # guard that took the new values before the retire let a call of another thread replay
        # the old configuration: examples/heldout/config_reload_serve.py, H200)
        _keep(rec, tests)
        rec.rev = rev
        _state["module_changes"] = _state.get("module_changes", 0) + 1
        if rec.thrash >= THRASH and rec.eager is None:
            rec.eager = f"{CHANGES_OFTEN} ({why})"
            _fall_back(f"{type(module).__name__}: {rec.eager}", CHANGES_OFTEN)
        elif n:
            from ._common import _log

            _log(f"{type(module).__name__} changed after its graphs were captured ({why}): "
                 f"{n} retired, captured again")
        return rec


def frozen_call(torch: Any, rec: _Rec, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call made with gradients on records nothing for autograd: ``module`` in eval
    mode, and neither its parameters nor the call's tensors require grad (a model frozen with
    ``requires_grad_(False)``, called from a thread where the script's ``torch.set_grad_enabled
    (False)`` - a per-thread setting - does not reach). The same call under ``torch.no_grad()``
    computes the same values with the same kernels and returns outputs that require no grad
    either: the hook runs it there, so it is graphed as any inference call."""
    if trains(module):
        return False
    params = rec.params
    if params is None:
        params = rec.params = tuple(module.parameters())
    if any(p.requires_grad for p in params):
        return False
    tensors: list[Any] = []
    flatten((args, kwargs), torch.Tensor, tensors)
    return not any(t.requires_grad for t in tensors)


def eager_reason(module: Any) -> str | None:
    """Why every call of ``module`` runs eagerly now (its record's), or None."""
    rec = _recs.get(id(module))
    return rec.eager if rec is not None and rec.ref() is module else None


def never_graph(module: Any, reason: str) -> None:
    """Every later call of ``module`` runs eagerly, for ``reason`` (said once): its forward needs
    the host inside a capture, whatever the call's shapes (:func:`.fallback.needs_host`), so a
    capture of each new shape would only fail again, each costing a call and a graph's place."""
    with _lock:
        rec = _recs.get(id(module))
        if rec is None or rec.ref() is not module or rec.eager is not None:
            return
        rec.eager = reason
    _fall_back(f"{type(module).__name__}: {reason}", reason)


def version(module: Any) -> int:
    """The number of changes of ``module`` seen so far (after :func:`check` of this call)."""
    rec = _recs.get(id(module))
    return rec.version if rec is not None else 0


def _key_id(key: Any) -> Any:
    """The module id a graph key names (``(id, parts)`` or ``((id, tag), parts)``)."""
    k0 = key[0] if isinstance(key, tuple) and key else None
    return k0[0] if isinstance(k0, tuple) and k0 else k0


def _retire(torch: Any, mid: int) -> int:
    """Drop everything the hook holds for the module of id ``mid`` (under ``_lock``); returns how
    many graphs and batch queues went. Each group's work is finished first, under its lock,
    so no graph is freed while a replay of it may run."""
    from .groups import all_groups

    n = 0
    for g in all_groups():
        with g.lock:
            keys = [k for k in g.entries if _key_id(k) == mid]
            bkeys = [k for k in g.batches if _key_id(k) == mid]
            if not keys and not bkeys and mid not in g.sites:
                continue
            if g.stream is not None and (keys or bkeys):
                g.stream.synchronize()
                if g.last_event is not None:
                    g.last_event.synchronize()
            graphs = [e.graph for e in (g.entries.pop(k) for k in keys) if e.graph is not None]
            for k in bkeys:
                b = g.batches.pop(k)
                graphs += [graph for graph, _ in b.graphs.values()]
            n += len(graphs) + len(bkeys)
            for graph in graphs:  # (their memory back to the budget)
                _state["graph_bytes"] = max(0, _state.get("graph_bytes", 0) - getattr(graph, "rd_bytes", 0))
            g.sites.pop(mid, None)
    specs = _state.get("batch_specs")
    if specs:
        for k in [k for k in specs if _key_id(k) == mid]:
            specs.pop(k, None)
    if (_state.get("routes") or {}).pop(mid, None) is not None:
        n += 1  # (its served model is kept to the process's end, as every one: .served)
    (_state.get("host_use") or {}).pop(mid, None)
    return n


def stale(tg: Any, module: Any) -> bool:
    """Whether thread graph ``tg`` must go before a call of ``module``: its model was freed,
    or it is ``module`` and ``module`` changed since the graph was made."""
    m = tg.module_ref()
    return m is None or (m is module and tg.version != version(module))


def fresh(tg: Any, module: Any) -> bool:
    """Whether thread graph ``tg`` (:class:`.staging._ThreadGraph`) was made from ``module``
    as it is now."""
    return tg.module_ref() is module and tg.version == version(module)
