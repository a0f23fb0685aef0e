"""Run a function once a module has been imported: ``when_imported("torch", fn)``. Standard
library only (the hook is loaded at interpreter start, before the script imports anything).

The hook patches ``nn.Module.__call__`` as soon as PyTorch is imported, not only when the
first thread is placed in a group, so that a thread it never placed at start (the main
thread of a single-threaded loop or of an asyncio server calling the model inline, or a
pool's thread started before CUDA was initialized) can still be placed at its first model
call (:mod:`.interception`)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Any, Callable

__all__ = ["when_imported", "cancel"]


class _Watch(importlib.abc.MetaPathFinder):
    """A finder that finds nothing itself: for ``name`` it asks the rest of ``sys.meta_path``
    for the real spec and wraps that loader's ``exec_module``, so ``fn(module)`` runs once the
    module's own code has run (and the watch leaves ``sys.meta_path``)."""

    def __init__(self, name: str, fn: Callable[[Any], None]) -> None:
        self.name = name
        self.fn = fn
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.on = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        orig = loader.exec_module
        watch = self

        def exec_module(module: Any) -> None:
            orig(module)
            cancel(watch)
            try:
                watch.fn(module)
            except Exception as ex:  # noqa: BLE001 - never break the script's import
                print(f"recsys-doctor apply: after importing {fullname}: {type(ex).__name__}: {ex}",
                      file=sys.stderr, flush=True)

        loader.exec_module = exec_module
        return spec


def when_imported(name: str, fn: Callable[[Any], None]) -> Any:
    """Call ``fn(module)`` once ``name`` is imported: now where it already is, else right after
    its import finishes. Returns the watch (for :func:`cancel`) or None where it ran now."""
    mod = sys.modules.get(name)
    if mod is not None:
        fn(mod)
        return None
    w = _Watch(name, fn)
    sys.meta_path.insert(0, w)
    return w


def cancel(watch: Any) -> None:
    """Stop a watch that has not fired (no error where it is gone)."""
    try:
        sys.meta_path.remove(watch)
    except ValueError:
        pass
