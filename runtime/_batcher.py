"""The dynamic batcher's queue and threads: requests from any number of callers coalesce
into batches, one worker thread per stream group runs them. No CUDA, no torch here: a
worker is any callable ``run(requests) -> one result per request`` (the CUDA one is
:mod:`._batched_cuda`; the CPU one, for tests and CPU models, is :class:`CpuWorker`).

The per-request host path is kept small because the host, not the GPU, bounds many
clients (issue 24): a caller appends its request to one deque under one lock and sleeps on
a lock of its own (the cheapest wake-up Python has); a worker takes whatever is queued
when it becomes free ("natural batching": a lone caller never waits for company; with
``max_delay_s`` a worker that finds fewer than ``max_batch`` waits that long for more),
runs the batch and wakes each caller of it. ``submit`` gives a
:class:`concurrent.futures.Future`; ``infer`` is awaitable, and the results of one batch
reach an event loop with one ``call_soon_threadsafe``.

The queue is bounded (``max_queue``): a caller that finds it full waits up to
``timeout_s`` for room, then gets :class:`QueueFullError` naming the setting to change; a
caller whose result does not come within ``timeout_s`` gets :class:`RequestTimeoutError`.
An exception in a batch reaches every request of that batch; the worker goes on with the
next. :meth:`Batcher.close` fails the queued requests, lets the running batches finish and
joins the workers: no request is left waiting.
"""

from __future__ import annotations

import _thread
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Sequence

from ..errors import RuntimeCudaError

__all__ = ["Batcher", "Pending", "QueueFullError", "RequestTimeoutError", "BatchStats"]


class QueueFullError(RuntimeCudaError):
    """The batching queue stayed full for the whole timeout."""


class RequestTimeoutError(RuntimeCudaError):
    """A request's result did not come within the timeout."""


class Pending:
    """One request: its tensor leaves, and how its caller is woken (a held lock, a
    ``Future``, or an asyncio future with its loop)."""

    __slots__ = ("leaves", "lock", "future", "loop", "out", "err")

    def __init__(self, leaves: Sequence[Any], future: Any = None, loop: Any = None) -> None:
        self.leaves = leaves
        self.future = future
        self.loop = loop
        self.out: Any = None
        self.err: BaseException | None = None
        self.lock: Any = None
        if future is None:
            self.lock = _thread.allocate_lock()
            self.lock.acquire()


class BatchStats:
    """Batches and requests per batch size, per worker (thread-safe enough: one writer each)."""

    def __init__(self, workers: int) -> None:
        self.batches = [dict() for _ in range(workers)]  # size -> batches

    def add(self, w: int, n: int) -> None:
        d = self.batches[w]
        d[n] = d.get(n, 0) + 1

    def sizes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for d in self.batches:
            for n, c in d.items():
                out[n] = out.get(n, 0) + c
        return dict(sorted(out.items()))


class Batcher:
    """Requests in, batches out to ``workers`` (one thread each). See the module docstring."""

    def __init__(self, workers: Sequence[Callable[[list[Pending]], list[Any]]], *, max_batch: int,
                 max_queue: int = 1024, timeout_s: float = 30.0, max_delay_s: float = 0.0,
                 name: str = "batcher") -> None:
        if max_batch < 1 or max_queue < 1 or timeout_s <= 0 or max_delay_s < 0:
            raise RuntimeCudaError(f"bad batcher settings: max_batch={max_batch} max_queue={max_queue} "
                                   f"timeout_s={timeout_s} max_delay_s={max_delay_s}")
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.max_delay_s = max_delay_s
        self._q: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        self._idle = 0
        self._room_waiters = 0
        self.closed = False
        self.stats = BatchStats(len(workers))
        self._threads = [threading.Thread(target=self._loop, args=(i, w), name=f"{name}-{i}", daemon=True)
                         for i, w in enumerate(workers)]
        for t in self._threads:
            t.start()

    # -- callers ---------------------------------------------------------------------
    def put(self, r: Pending) -> None:
        """Queue ``r``; waits up to ``timeout_s`` for room when ``max_queue`` are queued."""
        with self._lock:
            if self.closed:
                raise RuntimeCudaError("this served model is closed")
            if len(self._q) >= self.max_queue:
                self._wait_for_room()
            self._q.append(r)
            if self._idle:
                self._work.notify()

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        self._room_waiters += 1
        try:
            while len(self._q) >= self.max_queue and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise QueueFullError(
                        f"the batching queue stayed full ({self.max_queue} requests waiting) for "
                        f"{self.timeout_s:g} s: raise serve(max_queue=...) or timeout_s=..., or add groups")
                self._room.wait(left)
            if self.closed:
                raise RuntimeCudaError("this served model was closed while waiting for room in its queue")
        finally:
            self._room_waiters -= 1

    def call(self, leaves: Sequence[Any]) -> Any:
        """Run one request and wait for its result (the caller's thread sleeps on a lock)."""
        r = Pending(leaves)
        self.put(r)
        if not r.lock.acquire(timeout=self.timeout_s):
            r.err = RequestTimeoutError(f"no result within timeout_s={self.timeout_s:g} s "
                                        f"({len(self._q)} requests queued): raise timeout_s or add groups")
        if r.err is not None:
            raise r.err
        return r.out

    def submit(self, leaves: Sequence[Any]) -> Future:
        fut: Future = Future()
        self.put(Pending(leaves, future=fut))
        return fut

    async def infer(self, leaves: Sequence[Any]) -> Any:
        import asyncio

        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.put(Pending(leaves, future=fut, loop=loop))
        return await asyncio.wait_for(fut, self.timeout_s)

    # -- workers ---------------------------------------------------------------------
    def _take(self) -> list[Pending] | None:
        """The next batch (None: closed and drained). Waits while nothing is queued."""
        with self._lock:
            while not self._q:
                if self.closed:
                    return None
                self._idle += 1
                self._work.wait()
                self._idle -= 1
            if self.max_delay_s and len(self._q) < self.max_batch and not self.closed:
                deadline = time.monotonic() + self.max_delay_s
                while len(self._q) < self.max_batch and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._idle += 1
                    self._work.wait(left)
                    self._idle -= 1
                if not self._q:
                    return []
            n = min(len(self._q), self.max_batch)
            pop = self._q.popleft
            batch = [pop() for _ in range(n)]
            if self._room_waiters:
                self._room.notify(n)
            return batch

    def _loop(self, w: int, run: Callable[[list[Pending]], list[Any]]) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            # a Future cancelled before it ran is dropped (its caller left)
            batch = [r for r in batch if r.future is None or r.loop is not None
                     or r.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                outs = run(batch)
                err = None
            except BaseException as e:  # noqa: BLE001 - reaches every request of the batch
                outs, err = None, e
            self.stats.add(w, len(batch))
            _complete(batch, outs, err)

    def close(self, join_s: float = 60.0) -> None:
        """Fail the queued requests, let running batches finish, join the workers."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            left = list(self._q)
            self._q.clear()
            self._work.notify_all()
            self._room.notify_all()
        _complete(left, None, RuntimeCudaError("this served model was closed before the request ran"))
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(join_s)


def _complete(batch: Sequence[Pending], outs: Sequence[Any] | None, err: BaseException | None) -> None:
    """Hand each request its result (or ``err``) and wake its caller."""
    loops: dict[Any, list[tuple[Any, Any, Any]]] = {}
    for j, r in enumerate(batch):
        out = outs[j] if err is None else None
        if r.lock is not None:
            r.out, r.err = out, err
            r.lock.release()
        elif r.loop is not None:
            loops.setdefault(r.loop, []).append((r.future, out, err))
        elif err is None:
            r.future.set_result(out)
        else:
            r.future.set_exception(err)
    for loop, items in loops.items():
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the loop is closed: its callers are gone
            pass


def _deliver(items: list[tuple[Any, Any, Any]]) -> None:
    for fut, out, err in items:
        if fut.done():  # cancelled or timed out
            continue
        if err is None:
            fut.set_result(out)
        else:
            fut.set_exception(err)
