"""The dynamic batcher: requests from any number of callers coalesce into batches that
one driver thread (or a few, ``drivers``: ``serve`` runs two) runs over every stream group.
No CUDA, no torch here: a worker (one per group) is an object with ``start(requests) -> the
requests that run`` (stage the inputs, launch, return at once) and ``finish(requests) -> one
output per request`` (wait, split);
a plain callable ``run(requests) -> outputs`` works too. The CUDA worker is
:mod:`._batched_cuda`; the CPU one, for tests and CPU models, :class:`~._batched.CpuWorker`.

Why one driver (issue 24, measured on the H100 with 32 client threads, wide&deep, 256
rows a query): the host, not the GPU, bounds many clients, and what costs on the host is
handing the interpreter lock (GIL) from thread to thread. A thread per group taking its
own batches left the GPU 30-50% busy with mostly one-query batches (4.2-5.4k queries/s);
one driver that starts a batch on any free group and otherwise waits for the oldest
batch in flight made batches of 14-26 queries and served 7.3-8.3k (p99 6-8 ms, from
16-31 ms), and 14.7-16.7k with the staging copy left out (its bound: see
``bench/serving/README.md``). The driver's loop:

* a free group and requests queued: take up to ``max_batch`` of them (with ``max_delay_s``,
  wait that long for a full batch first) and ``start`` them on that group;
* otherwise, with batches in flight: ``finish`` the oldest (the wait releases the GIL),
  wake each of its callers (a held lock each: the cheapest wake-up Python has; futures
  are set; the results of one batch reach an event loop with one ``call_soon_threadsafe``);
* otherwise sleep until a request comes.

``drivers=N`` runs N such driver threads over the same queue and groups (while one waits
to get the GIL back, another can start a batch; ``serve`` runs two by default: on an H200,
1.09x / 1.19x one driver's queries a second at 64 / 128 client threads, 0.96-1.04x at 1-32,
``bench/apply/results/session31_h200/``).

A synchronous caller that finds nothing queued and nothing in flight runs its request on
a free group itself (no thread hand-off: a lone client costs what a hand-written loop
does). ``submit`` gives a :class:`concurrent.futures.Future`; ``infer`` is awaitable.

The queue is bounded (``max_queue`` requests queued or running): a caller that finds it
full waits up to ``timeout_s`` for room, then gets :class:`QueueFullError` naming the
setting to change; a caller whose result does not come within ``timeout_s`` gets
:class:`RequestTimeoutError`. An exception in a batch reaches every request of that batch
(a request whose own tensors do not fit gets its own error alone); the driver goes on
with the next. :meth:`Batcher.close` fails the queued requests, finishes the batches in
flight and the callers running on a lent group: no request is left waiting.
"""

from __future__ import annotations

import _thread
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Sequence

from ..errors import RuntimeCudaError
from ._deadlines import Deadlines

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
        self.batches: list[dict[int, int]] = [{} for _ in range(workers)]  # size -> batches

    def add(self, w: int, n: int) -> None:
        d = self.batches[w]
        d[n] = d.get(n, 0) + 1

    def sizes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for d in self.batches:
            for n, c in d.items():
                out[n] = out.get(n, 0) + c
        return dict(sorted(out.items()))


class _Sync:
    """A plain ``run(requests) -> outputs`` callable as a worker: it runs at ``start``."""

    def __init__(self, run: Callable[[list[Pending]], list[Any]]) -> None:
        self.run = run
        self.outs: Any = None

    def start(self, reqs: list[Pending]) -> list[Pending]:
        self.outs = self.run(reqs)
        return reqs

    def finish(self, reqs: list[Pending]) -> list[Any]:
        outs, self.outs = self.outs, None
        return outs


class Batcher:
    """Requests in, batches out over ``workers`` (one per stream group) from one driver
    thread. See the module docstring."""

    def __init__(self, workers: Sequence[Any], *, max_batch: int, max_queue: int = 256, timeout_s: float = 30.0,
                 max_delay_s: float = 0.0, name: str = "batcher", drivers: int = 1) -> None:
        if (max_batch < 1 or max_queue < 1 or timeout_s <= 0 or max_delay_s < 0 or not workers
                or not 1 <= drivers <= len(workers)):
            raise RuntimeCudaError(f"bad batcher settings: max_batch={max_batch} max_queue={max_queue} "
                                   f"timeout_s={timeout_s} max_delay_s={max_delay_s} workers={len(workers)} "
                                   f"drivers={drivers}")
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.max_delay_s = max_delay_s
        self._workers = [w if hasattr(w, "start") else _Sync(w) for w in workers]
        self._q: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # the driver sleeps here
        self._room = threading.Condition(self._lock)  # callers wait here for room in the queue
        self._free = deque(range(len(workers)))  # groups neither running a batch nor lent to a caller
        self._tickets = max_queue  # requests that may still be queued or running
        self._room_waiters = 0
        self._asleep = 0  # drivers asleep on _cv
        self._inflight = 0  # batches in flight, all drivers
        self._lent = 0
        self.closed = False
        self._deadlines: Deadlines | None = None  # the last event loop's (see infer)
        self._deadlines_by_loop: weakref.WeakKeyDictionary[Any, Deadlines] = weakref.WeakKeyDictionary()
        self.stats = BatchStats(len(workers))
        self._threads = [threading.Thread(target=self._drive, name=f"{name}-driver{'' if d == 0 else d}", daemon=True)
                         for d in range(drivers)]
        for t in self._threads:
            t.start()

    @property
    def queued(self) -> int:
        return len(self._q)

    # -- callers ---------------------------------------------------------------------
    def _ticket(self) -> None:
        """Under the lock: a place in the bounded queue, waiting up to ``timeout_s``."""
        if self.closed:
            raise RuntimeCudaError("this served model is closed")
        if self._tickets <= 0:
            deadline = time.monotonic() + self.timeout_s
            self._room_waiters += 1
            try:
                while self._tickets <= 0 and not self.closed:
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
        self._tickets -= 1

    def put(self, r: Pending) -> None:
        """Queue ``r`` (its caller is woken through its lock or future)."""
        with self._lock:
            self._ticket()
            self._q.append(r)
            if self._asleep:
                self._cv.notify()

    def call(self, leaves: Sequence[Any]) -> Any:
        """Run one request and wait for its result (see the module docstring)."""
        r = Pending(leaves)
        with self._lock:
            self._ticket()
            if not self._q and not self._inflight and not self.max_delay_s and self._free:
                w = self._free.popleft()
                self._lent += 1
            else:
                w = -1
                self._q.append(r)
                if self._asleep:
                    self._cv.notify()
        if w >= 0:
            return self._run_lent(w, r)
        if not r.lock.acquire(timeout=self.timeout_s):
            r.err = self._timed_out()
        if r.err is not None:
            raise r.err
        return r.out

    def _run_lent(self, w: int, r: Pending) -> Any:
        wk = self._workers[w]
        try:
            if not wk.start([r]):
                raise r.err  # type: ignore[misc]  # its tensors did not fit: its own error
            out = wk.finish([r])[0]
        finally:
            self.stats.add(w, 1)
            with self._lock:
                self._tickets += 1
                self._free.appendleft(w)
                self._lent -= 1
                if self._room_waiters or self.closed:
                    self._room.notify_all()  # close() waits there for lent groups too
                if (self._q or self.closed) and self._asleep:
                    self._cv.notify()
        return out

    def _timed_out(self) -> RequestTimeoutError:
        return RequestTimeoutError(f"no result within timeout_s={self.timeout_s:g} s ({len(self._q)} requests queued): "
                                   "raise timeout_s or add groups")

    def submit(self, leaves: Sequence[Any]) -> Future:
        fut: Future = Future()
        self.put(Pending(leaves, future=fut))
        return fut

    async def infer(self, leaves: Sequence[Any]) -> Any:
        """One request from a coroutine; its future fails with :class:`RequestTimeoutError` past
        ``timeout_s`` through its loop's :class:`~._deadlines.Deadlines` (one timer a loop, not an
        ``asyncio.wait_for`` a request: see there)."""
        import asyncio

        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.put(Pending(leaves, future=fut, loop=loop))
        d = self._deadlines
        if d is None or d.loop_ref() is not loop:  # (not the last loop's: looked up, or made on its first request)
            d = self._deadlines_by_loop.get(loop)
            if d is None:
                d = self._deadlines_by_loop[loop] = Deadlines(loop, self)
            self._deadlines = d
        d.add(loop, fut)
        return await fut

    # -- the driver ------------------------------------------------------------------
    def _next(self, inflight: deque) -> tuple[int, list[Pending]] | None:
        """Under the lock: the next batch to start, ``(group, requests)``, or None to
        finish the oldest batch in flight. Sleeps while there is nothing to do; raises
        StopIteration once closed with nothing in flight and no group lent."""
        q = self._q
        while not (q and self._free):
            if inflight:
                return None
            if self.closed and not self._lent:
                raise StopIteration
            self._asleep += 1
            self._cv.wait()
            self._asleep -= 1
        if self.max_delay_s and len(q) < self.max_batch and not self.closed:
            deadline = time.monotonic() + self.max_delay_s
            self._asleep += 1
            while len(q) < self.max_batch and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            self._asleep -= 1
            if not (q and self._free):  # close() emptied the queue, or a caller took the group
                return None if inflight else self._next(inflight)
        w = self._free.popleft()
        pop = q.popleft
        return w, [pop() for _ in range(min(len(q), self.max_batch))]

    def _drive(self) -> None:
        inflight: deque = deque()
        workers = self._workers
        while True:
            with self._lock:
                try:
                    got = self._next(inflight)
                except StopIteration:
                    if self.closed and self._asleep:
                        self._cv.notify_all()  # the other drivers see the close too
                    return
                if got is not None:
                    self._inflight += 1
            if got is not None:
                inflight.append(self._start(*got))
                continue
            w, batch, live, err = inflight.popleft()
            outs = None
            if live and err is None:
                try:
                    outs = workers[w].finish(live)
                except BaseException as e:  # noqa: BLE001 - reaches every request of the batch
                    err = e
            if live:
                self.stats.add(w, len(live))
            with self._lock:
                self._tickets += len(batch)
                self._free.append(w)
                self._inflight -= 1
                if self._room_waiters:
                    self._room.notify(len(batch))
                if self._asleep and self._q:
                    self._cv.notify()  # a free group for a driver asleep with requests queued
            _complete(live, outs, err)

    def _start(self, w: int, batch: list[Pending]) -> tuple[int, list[Pending], list[Pending], BaseException | None]:
        """Start ``batch`` on group ``w``: ``(w, batch, the requests running, error)``. A
        Future cancelled before it ran is dropped (its caller left); a request whose own
        tensors do not fit is answered with its error at once."""
        live = [r for r in batch if r.future is None or r.loop is not None or r.future.set_running_or_notify_cancel()]
        err = None
        if live:
            try:
                ran = self._workers[w].start(live)
            except BaseException as e:  # noqa: BLE001 - reaches every request of the batch
                err = e
            else:
                if len(ran) != len(live):
                    kept = set(map(id, ran))
                    for r in live:
                        if id(r) not in kept:
                            _complete([r], None, r.err)
                    live = ran
        return w, batch, live, err

    def close(self, join_s: float = 60.0) -> None:
        """Fail the queued requests, finish the batches in flight and those of callers
        running on a lent group, join the driver."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            left = list(self._q)
            self._q.clear()
            self._tickets += len(left)
            self._cv.notify_all()
            self._room.notify_all()
        _complete(left, None, RuntimeCudaError("this served model was closed before the request ran"))
        deadline = time.monotonic() + join_s
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            while self._lent and time.monotonic() < deadline:
                self._room.wait(deadline - time.monotonic())


def _complete(batch: Sequence[Pending], outs: Sequence[Any] | None, err: BaseException | None) -> None:
    """Hand each request its result (or ``err``) and wake its caller."""
    loops: dict[Any, list[tuple[Any, Any, Any]]] = {}
    for j, r in enumerate(batch):
        out = outs[j] if err is None and outs is not None else None
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
