"""Dynamic batching for :class:`~.serving.ServedModel`: the settings, and the set-up that
either gives the served model a :class:`~._batcher.Batcher` over one
:class:`~._batched_cuda.CudaWorker` per stream group, or says why batching was refused
(then every query is served unbatched, as without batching)."""

from __future__ import annotations

import sys
import threading
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import BadInputError, RuntimeCudaError, first_line
from ..plan import DEFAULT_MAX_BATCH
from ._batched import BatchSetup, buckets_for
from ._batcher import Batcher
from ._batchspec import SpecRefused

__all__ = ["BatchingOptions", "start_batching", "BatchedCalls", "DEFAULT_SWITCH_INTERVAL_MS", "DEFAULT_DRIVERS",
           "hold_switch_interval", "release_switch_interval"]


#: the GIL switch interval a batching served model sets while it serves (milliseconds). With
#: many client threads the one driver thread waits to get the GIL back after each call that
#: gives it up (the staging copy, the waits); at Python's 5 ms the clients hold it off. Against
#: 5 ms in the same H200 call, 0.5 ms served 1.14-1.63x the queries a second at 8-128 clients
#: (p99 about halved from 32 up) and 0.97-1.04x at 1-4; 0.2 ms measured alike
#: (bench/apply/results/session30_h200/; docs/runtime.md).
DEFAULT_SWITCH_INTERVAL_MS = 0.5

#: batch driver threads sharing the queue and the groups (at most the group count). While one
#: waits to get the GIL back after its staging copy, the other can start a batch. At the 0.5 ms
#: switch interval, on H200s (session 31, against 1 driver in the same call; 9 rounds of client
#: threads over 4 device calls, 7 of coroutines over 3): means 1.09x / 1.19x the queries a second
#: at 64 / 128 threads, 1.30x / 1.63x for as many coroutines, 0.96-1.04x at 1-32 threads (0.81-1.26x
#: by round; one machine lost at 16-32 threads in both its rounds)
#: (bench/apply/results/session31_h200/; docs/runtime.md).
DEFAULT_DRIVERS = 2


@dataclass(frozen=True)
class BatchingOptions:
    """``max_batch``: the largest batch; ``buckets``: batch sizes a graph is captured for
    (default 1, 2, 4, ... up to ``max_batch``); ``max_delay_ms``: how long a free group
    waits for more requests when fewer than ``max_batch`` are queued (0: none, a lone
    client never waits); ``max_queue``: requests queued or running at most (callers past it
    wait for room up to ``timeout_s``, then get ``QueueFullError``; at least ``max_batch``);
    ``timeout_s``: how long a caller waits for room or for its result; ``batch_spec``: each input tensor's kind
    (``rows``, ``indices``, ``offsets``, ``offsets_total``, ``jagged_values``,
    ``jagged_lengths``, ``jagged_offsets``: :mod:`._batchspec`) when it cannot be inferred;
    ``switch_interval_ms``: the interpreter's thread switch interval while the model is
    served (``sys.setswitchinterval``, process-wide: :func:`hold_switch_interval`; default
    :data:`DEFAULT_SWITCH_INTERVAL_MS`; None: left alone). A thread that waits for the GIL
    forces the holder to drop it only after this interval (Python's default is 5 ms), which
    many client threads turn into queueing behind the driver;
    ``drivers``: driver threads sharing the queue and the groups (1 to the group count;
    default :data:`DEFAULT_DRIVERS`, fewer where there are fewer groups): while one waits to
    get the GIL back from a staging copy, another can start a batch."""

    max_batch: int = DEFAULT_MAX_BATCH
    buckets: tuple[int, ...] | None = None
    max_delay_ms: float = 0.0
    max_queue: int = 256
    timeout_s: float = 30.0
    batch_spec: tuple[str, ...] | None = None
    switch_interval_ms: float | None = DEFAULT_SWITCH_INTERVAL_MS
    drivers: int = DEFAULT_DRIVERS

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise BadInputError(f"max_batch must be a positive integer, got {self.max_batch!r}")
        if not isinstance(self.drivers, int) or self.drivers < 1:
            raise BadInputError(f"drivers must be a positive integer, got {self.drivers!r}")
        if self.max_delay_ms < 0 or self.timeout_s <= 0 or self.max_queue < self.max_batch:
            raise BadInputError(f"bad batching settings: max_delay_ms={self.max_delay_ms} "
                                f"timeout_s={self.timeout_s} max_queue={self.max_queue}")
        si = self.switch_interval_ms
        if si is not None and (isinstance(si, bool) or not isinstance(si, (int, float)) or not si > 0):
            raise BadInputError(f"switch_interval_ms must be above 0 (or None: left alone), got {self.switch_interval_ms!r}")


_switch_lock = threading.RLock()  # (re-entrant: a served model's finalizer may release while this thread holds)
_switch_held: dict[int, float] = {}  # token -> seconds, of every served model holding one
_switch_before: list[float] = []  # the process's interval before the first hold


def hold_switch_interval(ms: float) -> int:
    """Set the process's switch interval to ``ms`` (the shortest of all held) until
    :func:`release_switch_interval`; the interval from before the first hold comes back
    when the last is released, whatever order served models close in."""
    with _switch_lock:
        if not _switch_held:
            _switch_before[:] = [sys.getswitchinterval()]
        token = max(_switch_held, default=0) + 1
        _switch_held[token] = ms / 1e3
        sys.setswitchinterval(min(_switch_held.values()))
        return token


def release_switch_interval(token: int) -> None:
    with _switch_lock:
        if _switch_held.pop(token, None) is None:
            return
        sys.setswitchinterval(min(_switch_held.values()) if _switch_held else _switch_before[0])


def start_batching(sm: Any, args: tuple[Any, ...], opts: BatchingOptions) -> tuple[Batcher | None, list[Any], str | None]:
    """``(batcher, workers, refused)`` for served model ``sm``: a running batcher, or None
    and the reason batching was refused (a warning says it too)."""
    from ._batched_cuda import CudaWorker

    try:
        setup = BatchSetup(sm.model, args, sm.device, opts.batch_spec)
    except SpecRefused as e:
        reason = first_line(e)
        warnings.warn(f"recsys-doctor serve: batching refused, serving unbatched: {reason}", RuntimeWarning, stacklevel=3)
        return None, [], reason
    buckets = buckets_for(opts.max_batch, opts.buckets)
    workers: list[Any] = []
    try:
        for g in sm.manager.groups:
            workers.append(CudaWorker(sm, g, setup, buckets))
    except BaseException:  # the groups set up so far are closed, the error re-raised
        for w in workers:
            w.close()
        raise
    # a bucket dropped for memory on any group caps every group's batches
    max_batch = min(max(w.buckets) for w in workers)
    b = Batcher(workers, max_batch=max_batch, max_queue=opts.max_queue, timeout_s=opts.timeout_s,
                max_delay_s=opts.max_delay_ms / 1e3, name="recsys-doctor-batch",
                drivers=min(opts.drivers, len(workers)))
    return b, workers, None


def batching_stats(batcher: Batcher | None, workers: Sequence[Any], refused: str | None) -> dict[str, Any]:
    """What :meth:`ServedModel.stats` says about batching."""
    if batcher is None:
        return {"enabled": False, "refused": refused}
    w0 = workers[0]
    return {"enabled": True, "kinds": list(w0.setup.plan.kinds), "max_batch": batcher.max_batch,
            "buckets": list(w0.buckets), "max_queue": batcher.max_queue, "timeout_s": batcher.timeout_s,
            "max_delay_ms": batcher.max_delay_s * 1e3, "queued": batcher.queued,
            "batch_sizes": batcher.stats.sizes(),
            "eager_buckets": {str(k): v for w in workers for k, v in w.eager.items()}}


class BatchedCalls:
    """The served model's batched entry points beside ``__call__``: :meth:`submit`,
    :meth:`infer`, and how a query is recognized as the batched signature. Mixed into
    :class:`~.serving.ServedModel` (which provides ``_key``, ``_batcher`` and the rest)."""

    if TYPE_CHECKING:  # what ServedModel provides
        torch: Any
        closed: bool
        _batcher: Batcher | None
        _bworkers: list[Any]
        _bnumel: int
        _bcount: int
        _bsig: Any
        _ball: bool
        _btensors: list[int]

        def _key(self, args: tuple[Any, ...]) -> tuple[list[Any], Any, Any]: ...

        def __call__(self, *args: Any) -> Any: ...

    def _batch_leaves(self, args: tuple[Any, ...]) -> list[Any] | None:
        """The tensor leaves of a query that the batcher takes, else None. The usual query
        (positional tensors and lists of tensors) is checked by its leaf count and total
        number of elements alone, without building a signature: with equal totals, a
        tensor of another shape makes the copy into staging fail (a smaller one that would
        broadcast forces a larger one elsewhere, which cannot), so the caller gets an
        error, never a wrong answer. Dtypes are converted to the example's by that copy.
        Other queries go through :meth:`_key`."""
        if self._bnumel:
            T = self.torch.Tensor
            leaves: list[Any] = []
            for a in args:
                t = type(a)
                if t is T:
                    leaves.append(a)
                elif t is list:
                    leaves.extend(a)
                else:
                    break
            else:
                try:
                    if len(leaves) == self._bcount and sum(map(T.numel, leaves)) == self._bnumel:
                        return leaves
                except TypeError:  # a list holding something else than tensors
                    pass
        leaves, _, sig = self._key(args)
        if sig == self._bsig:
            return leaves if self._ball else [leaves[k] for k in self._btensors]
        return None

    def submit(self, *args: Any) -> Future:
        """One query as a :class:`concurrent.futures.Future` of its outputs. Batched
        queries return at once (keep the input tensors unchanged until the future is
        done); the others run in the calling thread and return a finished future."""
        if self.closed:
            raise RuntimeCudaError("this served model is closed")
        b = self._batcher
        got = self._batch_leaves(args) if b is not None else None
        if b is not None and got is not None:
            return b.submit(got)
        fut: Future = Future()
        try:
            fut.set_result(self(*args))
        except BaseException as e:  # noqa: BLE001 - the future carries it
            fut.set_exception(e)
        return fut

    async def infer(self, *args: Any) -> Any:
        """``await served.infer(*tensors)``: one query from an asyncio coroutine; the event
        loop keeps running while it is served (batched, or unbatched in a worker thread)."""
        if self.closed:
            raise RuntimeCudaError("this served model is closed")
        b = self._batcher
        got = self._batch_leaves(args) if b is not None else None
        if b is not None and got is not None:
            return await b.infer(got)
        import asyncio

        return await asyncio.to_thread(self, *args)

    def bucket_gpu_us(self) -> dict[int, float]:
        """GPU time of one batch per bucket size on group 0, in microseconds (measured
        alone; {} without batching)."""
        return self._bworkers[0].gpu_times_us() if self._bworkers else {}

