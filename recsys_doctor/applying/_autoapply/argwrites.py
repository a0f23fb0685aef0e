"""Models that write into their own arguments: found on a key's first warm-up call.

A ``forward`` may change its inputs in place - ``ids %= self.vocab`` to hash ids into the
table, ``x.clamp_(-3, 3)``, ``mask.masked_fill_(...)``, an ``out=`` argument. Eager, the
script's tensors get the write. Replayed from a group's graph they do not: the graph reads
copies of them (its static inputs) and writes those, so a script that reads its input tensors
after the call would see them unwritten. The first eager warm-up call of each key therefore
runs under a ``TorchDispatchMode`` that looks at every operator whose schema says it writes an
argument (``alias_info.is_write``: the in-place and ``out=`` forms) and notes the first one
whose written tensor shares storage with one of the call's tensor arguments (a view of an
argument too). Such a key runs eagerly from then on, with the operator in the reason
(:func:`.graphs._keyed_call`). The watched call is the script's own call (its output is the
one returned, its writes are the script's): no extra call is made, so nothing runs twice.

The batching path (:mod:`.batching`) watches the runs of its spec's check, on clones of the
call's tensors: a model that writes into them is not batched. Not watched: a
``torch.compile``\\ d module (its kernels bypass the dispatcher, and a mode there would only cost
a recompile). A watch that cannot be set up leaves the call as it is.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["WRITES_ARGS", "watched_call"]

#: why a key whose model writes into its arguments runs eagerly
WRITES_ARGS = "the model writes into its arguments in place: eager, so the script's tensors get the write"


def _storage(torch: Any, t: Any) -> int | None:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # noqa: BLE001 - a tensor without one storage (sparse, nested, a wrapper subclass)
        return None


def _make_watch_class() -> Any:
    """The dispatch mode that notes the first operator writing into a watched storage (one class
    per Dynamo state, :func:`_per_state`: its first operator does not import ``torch._dynamo``,
    :mod:`recsys_doctor.runtime._modes`)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    Tensor = torch.Tensor

    def hits(ptrs: set[int], v: Any) -> bool:
        if isinstance(v, Tensor):
            return _storage(torch, v) in ptrs
        if isinstance(v, (list, tuple)):
            return any(isinstance(x, Tensor) and _storage(torch, x) in ptrs for x in v)
        return False

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.hit is None:
            # (an operator without a schema, such as a higher-order one, is not looked at)
            schema = getattr(func, "_schema", None)
            if schema is not None and getattr(schema, "is_mutable", False):
                for i, a in enumerate(schema.arguments):
                    if a.alias_info is not None and a.alias_info.is_write:
                        v = args[i] if i < len(args) else kwargs.get(a.name)
                        if hits(self.ptrs, v):
                            self.hit = str(func)
                            break
        return func(*args, **kwargs)

    class Watch(TorchDispatchMode):  # type: ignore[misc]
        hit: str | None = None
        ptrs: set[int] = set()

        __torch_dispatch__ = dispatch

    return Watch


@functools.cache
def _per_state() -> Any:
    """:func:`_make_watch_class` through :func:`recsys_doctor.runtime._modes.per_dynamo_state`
    (its ``classes``: those made so far, by whether ``torch._dynamo`` was loaded). The runtime is
    imported here, not with this module: the hook is loaded at interpreter start, before the package."""
    from recsys_doctor.runtime._modes import per_dynamo_state

    return per_dynamo_state(_make_watch_class)


def _watch_class() -> Any:
    return _per_state()()


def watched_call(torch: Any, run: Any, module: Any, tensors: list[Any]) -> tuple[Any, str | None]:
    """``run()`` (the call as the script made it), and the first operator it ran that wrote into
    one of ``tensors`` (the call's tensor arguments), or None."""
    if type(module).__name__ == "OptimizedModule" or not tensors:
        return run(), None
    ptrs = {p for p in (_storage(torch, t) for t in tensors) if p}
    if not ptrs:
        return run(), None
    try:
        w = _watch_class()()
    except ImportError:  # pragma: no cover - every PyTorch the hook supports has it
        return run(), None
    w.ptrs = ptrs
    with w:
        out = run()
    return out, w.hit
