"""Combining concurrent calls: the queue logic of the hook's batching (:mod:`.batching`), with no
CUDA in it. Standard library only (loaded by file path at interpreter start).

A :class:`Combiner` takes the calls of one key in one group. A call queues; the thread that finds
no batch running becomes the runner: it takes the group (``hold``, the group's lock), then the
oldest queued calls (at most ``max_batch``) and runs them as one batch with ``run(payloads)``;
it keeps running batches until its own call is done, then hands the role to the next queued
call. Calls that queue while a batch runs (or while the runner waits for the group) are the
next batch: no call is held back for company, a lone call runs at once as a batch of one.

Every call ends with its result or an exception, never waiting without a bound:

* ``run`` raising (or returning the wrong number of results) fails every call of that batch
  with that exception; the next batch runs as usual;
* a call whose result has not come within ``timeout_s`` raises :class:`BatchWaitTimeout` (a
  queued one leaves the queue first, so no batch runs it later);
* the runner hands its role on in a ``finally``: a runner interrupted between batches leaves
  the queued calls to the next caller, woken by ``notify_all``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Sequence

#: how long a call waits for its batch's result before :class:`BatchWaitTimeout` (seconds): far
#: beyond any capture or batch; only a group whose model hangs reaches it
BATCH_WAIT_S = 120.0


class BatchWaitTimeout(TimeoutError):
    """A batched model call got no result within :data:`BATCH_WAIT_S` (its group was stuck)."""


class _Call:
    __slots__ = ("payload", "queued", "done", "value", "error")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.queued = True
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class Combiner:
    """Concurrent calls combined into batches (see the module docstring). ``run(payloads)``
    returns one result per payload, in order; ``hold`` is held around each batch (the group's
    lock: the group's other work and captures stay apart from it); ``on_batch(n)`` is told
    every batch's size (the caller's histogram)."""

    def __init__(self, run: Callable[[list[Any]], Sequence[Any]], max_batch: int,
                 hold: ContextManager[Any] | None = None, timeout_s: float = BATCH_WAIT_S) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._run = run
        self.max_batch = max_batch
        self._hold = hold
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._queue: deque[_Call] = deque()
        self._running = False

    def call(self, payload: Any) -> Any:
        """``payload`` run in a batch; its result, or the batch's exception."""
        c = _Call(payload)
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            self._queue.append(c)
            while not c.done and (self._running or not c.queued):
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._give_up(c)
                self._cond.wait(left)
            if c.done:
                return c.result()
            self._running = True  # this thread runs the batches now (c is still queued)
        try:
            while not c.done:
                if not self._one_batch():  # (never: c is queued until a batch of this thread takes it)
                    raise RuntimeError("a batched call left the queue with no batch run")
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()
        return c.result()

    def _give_up(self, c: _Call) -> Any:
        """(under the condition) ``c`` waited past its bound: out of the queue, and the error."""
        if c.queued:
            self._queue.remove(c)
            c.queued = False
            where = "queued"
        else:
            where = "in a batch that has not finished"
        raise BatchWaitTimeout(f"recsys-doctor apply: a batched model call waited {self.timeout_s:g} s, {where}; "
                               "its stream group is stuck (set the plan's batching to false to run calls one by one)")

    def _one_batch(self) -> bool:
        """Take the group, then the oldest queued calls, and run them as one batch (False: none
        was queued)."""
        with self._hold if self._hold is not None else nullcontext():
            with self._cond:
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                for c in batch:
                    c.queued = False
            if not batch:
                return False
            try:
                out = list(self._run([c.payload for c in batch]))
                if len(out) != len(batch):
                    raise RuntimeError(f"a batch of {len(batch)} calls gave {len(out)} results")
                for c, v in zip(batch, out):
                    c.value = v
            except BaseException as ex:  # noqa: BLE001 - every caller of the batch gets it
                for c in batch:
                    c.error = ex
            finally:
                with self._cond:
                    for c in batch:
                        c.done = True
                    self._cond.notify_all()
        return True
