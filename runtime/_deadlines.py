"""Timeouts of a batcher's asyncio requests (``Batcher.infer``, :mod:`._batcher`): one timer an
event loop instead of an ``asyncio.wait_for`` a request (:class:`Deadlines`)."""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

__all__ = ["Deadlines"]


class Deadlines:
    """The asyncio requests of one batcher on one event loop still waiting, oldest first, and
    ONE timer there that fails those past ``timeout_s`` with the batcher's
    :class:`~._batcher.RequestTimeoutError`.
    An ``asyncio.wait_for`` per request (a timeout context and a timer handle each, a task on
    Python 3.11) cost the loop 15-23 us of CPU a request at 32-128 coroutines, this 9-14 us
    (no timeout at all: 8-9): with batches that sleep 200 us instead of a GPU, 64 coroutines
    ran 58.0k / 45.9k requests a second with it, 71.4k / 92.5k with this (Python 3.12 / 3.11,
    the dev machine's 2 cores; ``bench/serving/async_deadlines_cpu.py``). On an H200 serving wide&deep,
    1.06-1.22x the queries a second of ``wait_for`` at 8-128 coroutines (``bench/apply/results/session32_h200/``).
    Futures already done (answered, or cancelled by their caller) are dropped from the front
    as requests come, and at each firing; the timer is re-armed at the oldest waiting one's
    deadline. Used from the loop's own thread only. The loop and the futures are held weakly
    (a future that a request still waits on is held by its caller): an event loop that is
    gone leaves nothing behind in the batcher."""

    __slots__ = ("loop_ref", "batcher", "waiting", "armed")

    def __init__(self, loop: Any, batcher: Any) -> None:
        self.loop_ref, self.batcher = weakref.ref(loop), batcher
        self.waiting: deque[tuple[float, Any]] = deque()  # (deadline, weakref to the future)
        self.armed = False  # a timer is set (its handle, which holds the loop, is not kept)

    def add(self, loop: Any, fut: Any) -> None:
        """Watch ``fut`` (a request's, on ``loop``: the running loop, whose deadlines these are)."""
        w = self.waiting
        while w and _settled(w[0][1]):
            w.popleft()
        w.append((loop.time() + self.batcher.timeout_s, weakref.ref(fut)))
        if not self.armed:
            loop.call_at(w[0][0], self._fire)
            self.armed = True

    def _fire(self) -> None:
        self.armed = False
        loop = self.loop_ref()
        if loop is None:
            return
        w, now = self.waiting, loop.time()
        while w:
            deadline, ref = w[0]
            fut = ref()
            if fut is not None and not fut.done():
                if deadline > now:
                    loop.call_at(deadline, self._fire)
                    self.armed = True
                    return
                fut.set_exception(self.batcher._timed_out())
            w.popleft()


def _settled(ref: Any) -> bool:
    """A watched future that is gone or done."""
    fut = ref()
    return fut is None or fut.done()
