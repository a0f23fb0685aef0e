"""Dispatch modes without a ``torch._dynamo`` import on their first operator.

PyTorch wraps a ``TorchDispatchMode`` subclass's ``__torch_dispatch__`` in
``torch._disable_dynamo`` when the class is made, and that wrapper imports ``torch._dynamo`` on
its first call. Where nothing of it was compiled before (a fresh environment, a read-only
``site-packages``), the import costs whole seconds of one thread's time, holding the import lock
the other threads then wait on: on the H200, 3,000 requests of a top-k ranker took 9 s hooked
against 2.3 s unhooked, for the import alone (``bench/apply/results/dynamo_import_h200/``). While
Dynamo is not loaded no compiled code can trace into the method, so the plain function serves;
once it is loaded (the script compiled something), the wrapper stays."""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["dynamo_loaded", "unwrapped_dispatch", "per_dynamo_state"]


def dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def unwrapped_dispatch(cls: Any) -> Any:
    """``cls`` with its own ``__torch_dispatch__`` unwrapped from ``torch._disable_dynamo``
    where Dynamo is not loaded (as it is, where it is); a class made while it was not loaded must
    not serve once it is: :func:`per_dynamo_state` keeps one class per state."""
    if dynamo_loaded():
        return cls
    raw = getattr(cls.__dict__.get("__torch_dispatch__"), "__wrapped__", None)
    if callable(raw):
        cls.__torch_dispatch__ = raw
    return cls


def per_dynamo_state(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make`` (which returns a new ``TorchDispatchMode`` subclass) as a function that returns
    one class per :func:`dynamo_loaded` value, made on first use through :func:`unwrapped_dispatch`
    (the classes so far in its ``classes``, by that value)."""
    classes: dict[bool, Any] = {}

    def mode_class() -> Any:
        key = dynamo_loaded()
        cls = classes.get(key)
        if cls is None:
            cls = classes[key] = unwrapped_dispatch(make())
        return cls

    mode_class.classes = classes  # type: ignore[attr-defined]
    return mode_class
