"""Thread groups: a group is a stream with its lock and its graphs; the gate keeps a capture
from running beside any other model execution of the hooked threads."""

from __future__ import annotations

import threading
from typing import Any

from ._common import _state


class _Gate:
    """Model executions of hooked threads hold it shared; a capture holds it alone.

    A capture must not run while another thread executes a model eagerly or replays a
    graph: seen on the H200 with 4 threads per group, concurrent forwards invalidated the
    capture ("operation failed due to a previous error during capture"). Writers are
    preferred (new readers wait while a capture is pending), so a capture is never starved.
    No reader waits for anything else while holding it, so it cannot deadlock with the
    group locks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_shared(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def release_exclusive(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


def _run_shared(fn: Any, *args: Any, **kwargs: Any) -> Any:
    gate: _Gate = _state["gate"]
    gate.acquire_shared()
    try:
        return fn(*args, **kwargs)
    finally:
        gate.release_shared()


class _Group:
    def __init__(self, index: int, stream: Any) -> None:
        self.index = index
        self.stream = stream
        self.lock = threading.Lock()
        self.entries: dict[Any, Any] = {}
        self.capture_stream: Any = None
