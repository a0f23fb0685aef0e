"""The dynamic batcher's queue and threads: requests from any number of callers coalesce
into batches, one worker thread per stream group runs them. No CUDA, no torch here: a
worker is any callable ``run(requests) -> one result per request`` (the CUDA one is
:mod:`._batched_cuda`; the CPU one, for tests and CPU models, is :class:`CpuWorker`).

The per-request host path is kept small because the host, not the GPU, bounds many
clients (issue 24): a caller copies its query into a free staging slot itself (one call
that runs without the GIL, so callers copy in parallel), appends it to one deque under one
lock and sleeps on a lock of its own (the cheapest wake-up Python has); a worker takes
whatever is queued when it becomes free ("natural batching": a lone caller never waits
for company; with ``max_delay_s`` a worker that finds fewer than ``max_batch`` waits that
long for more), runs the batch and wakes each caller of it. A synchronous caller that
finds a worker asleep and nobody queued runs its own request on that worker's group (no
thread hand-off at all). ``submit`` gives a
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

    __slots__ = ("leaves", "lock", "future", "loop", "out", "err", "slot")

    def __init__(self, leaves: Sequence[Any], future: Any = None, loop: Any = None) -> None:
        self.leaves = leaves
        self.future = future
        self.loop = loop
        self.out: Any = None
        self.err: BaseException | None = None
        self.lock: Any = None
        self.slot = -1
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
    """Requests in, batches out to ``workers`` (one thread each). See the module docstring.

    ``stage(slot, leaves)`` copies a request into staging slot ``slot`` (of ``max_queue``
    slots: the queue's bound); a worker reads each request's ``slot``."""

    def __init__(self, workers: Sequence[Callable[[list[Pending]], list[Any]]], *, max_batch: int,
                 stage: Callable[[int, Sequence[Any]], None], max_queue: int = 256, timeout_s: float = 30.0,
                 max_delay_s: float = 0.0, name: str = "batcher") -> None:
        if max_batch < 1 or max_queue < 1 or timeout_s <= 0 or max_delay_s < 0:
            raise RuntimeCudaError(f"bad batcher settings: max_batch={max_batch} max_queue={max_queue} "
                                   f"timeout_s={timeout_s} max_delay_s={max_delay_s}")
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.max_delay_s = max_delay_s
        self._stage = stage
        self._workers = list(workers)
        #: free staging slots, oldest first: callers arriving together take consecutive
        #: slots, so a batch is usually one host-to-device copy
        self._free: deque[int] = deque(range(max_queue))
        self._q: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._cv = [threading.Condition(self._lock) for _ in workers]
        self._room = threading.Condition(self._lock)
        #: workers asleep with nothing to do, and workers lent to a caller (see :meth:`call`)
        self._waiting: list[int] = []
        self._borrowed = [False] * len(workers)
        self._delaying: list[int] = []
        self._room_waiters = 0
        self.closed = False
        self.stats = BatchStats(len(workers))
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"{name}-{i}", daemon=True)
                         for i in range(len(workers))]
        for t in self._threads:
            t.start()

    @property
    def queued(self) -> int:
        return len(self._q)

    # -- callers ---------------------------------------------------------------------
    def _staged(self, r: Pending) -> None:
        """Take a free slot (waiting up to ``timeout_s`` for one) and copy ``r`` into it."""
        with self._lock:
            if self.closed:
                raise RuntimeCudaError("this served model is closed")
            if not self._free:
                self._wait_for_room()
            r.slot = self._free.popleft()
        try:
            self._stage(r.slot, r.leaves)
        except BaseException:
            with self._lock:
                self._free.append(r.slot)
            raise

    def put(self, r: Pending) -> None:
        """Stage ``r`` and queue it."""
        self._staged(r)
        with self._lock:
            if self.closed:
                self._free.append(r.slot)
                raise RuntimeCudaError("this served model is closed")
            self._q.append(r)
            self._wake_one()

    def _wake_one(self) -> None:
        """Wake one sleeping worker that is not lent out, and a worker waiting out
        ``max_delay_s`` once a full batch is queued (under the lock)."""
        if self._delaying and len(self._q) >= self.max_batch:
            for d in self._delaying:
                self._cv[d].notify()
        for w in self._waiting:
            if not self._borrowed[w]:
                self._waiting.remove(w)
                self._cv[w].notify()
                return

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        self._room_waiters += 1
        try:
            while not self._free and not self.closed:
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
        """Run one request and wait for its result. When a worker is asleep and nobody is
        queued, the caller runs its request on that worker's group itself (no hand-off to
        a thread and back: a lone client costs what a hand-written loop does); otherwise
        it queues and sleeps on a lock of its own."""
        r = Pending(leaves)
        self._staged(r)
        with self._lock:
            if self.closed:
                self._free.append(r.slot)
                raise RuntimeCudaError("this served model is closed")
            w = -1
            if not self._q and not self.max_delay_s:
                for i in self._waiting:
                    if not self._borrowed[i]:
                        w = i
                        self._borrowed[i] = True
                        break
            if w < 0:
                self._q.append(r)
                self._wake_one()
        if w >= 0:
            return self._run_borrowed(w, r)
        if not r.lock.acquire(timeout=self.timeout_s):
            r.err = RequestTimeoutError(f"no result within timeout_s={self.timeout_s:g} s "
                                        f"({len(self._q)} requests queued): raise timeout_s or add groups")
        if r.err is not None:
            raise r.err
        return r.out

    def _run_borrowed(self, w: int, r: Pending) -> Any:
        try:
            out = self._workers[w]([r])[0]
        finally:
            self.stats.add(w, 1)
            with self._lock:
                self._free.append(r.slot)
                self._borrowed[w] = False
                if self._room_waiters or self.closed:
                    self._room.notify_all()  # close() waits there for lent groups too
                if self._q:
                    self._wake_one()
        return out

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
    def _take(self, w: int) -> list[Pending] | None:
        """Worker ``w``'s next batch (None: closed). Sleeps while nothing is queued or
        while its group is lent to a caller."""
        cv = self._cv[w]
        with self._lock:
            while not self._q or self._borrowed[w]:
                if self.closed:
                    return None
                if w not in self._waiting:
                    self._waiting.append(w)
                cv.wait()
            if w in self._waiting:
                self._waiting.remove(w)
            if self.max_delay_s and len(self._q) < self.max_batch and not self.closed:
                deadline = time.monotonic() + self.max_delay_s
                self._delaying.append(w)
                while len(self._q) < self.max_batch and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    cv.wait(left)
                self._delaying.remove(w)
            n = min(len(self._q), self.max_batch)
            pop = self._q.popleft
            batch = [pop() for _ in range(n)]
            if self._q:
                self._wake_one()
            return batch

    def _loop(self, w: int) -> None:
        run = self._workers[w]
        while True:
            batch = self._take(w)
            if batch is None:
                return
            # a Future cancelled before it ran is dropped (its caller left)
            live = [r for r in batch if r.future is None or r.loop is not None
                    or r.future.set_running_or_notify_cancel()]
            outs, err = None, None
            if live:
                try:
                    outs = run(live)
                except BaseException as e:  # noqa: BLE001 - reaches every request of the batch
                    err = e
                self.stats.add(w, len(live))
            with self._lock:
                self._free.extend(r.slot for r in batch)
                if self._room_waiters:
                    self._room.notify(len(batch))
            _complete(live, outs, err)

    def close(self, join_s: float = 60.0) -> None:
        """Fail the queued requests, let running batches finish (the workers' and those
        callers run on lent groups), join the workers."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            left = list(self._q)
            self._q.clear()
            for cv in self._cv:
                cv.notify_all()
            self._room.notify_all()
        _complete(left, None, RuntimeCudaError("this served model was closed before the request ran"))
        deadline = time.monotonic() + join_s
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:  # callers running their own request on a lent group finish first
            while any(self._borrowed) and time.monotonic() < deadline:
                self._room.wait(deadline - time.monotonic())


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
        elif r.future.done():  # cancelled while queued (close() fails the queue)
            continue
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
