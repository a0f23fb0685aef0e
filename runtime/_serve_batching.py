"""Dynamic batching for :class:`~.serving.ServedModel`: the settings, and the set-up that
either gives the served model a :class:`~._batcher.Batcher` over one
:class:`~._batched_cuda.CudaWorker` per stream group, or says why batching was refused
(then every query is served unbatched, as without batching)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import BadInputError, first_line
from ._batched import Arena, BatchSetup, buckets_for
from ._batcher import Batcher
from ._batchspec import SpecRefused

__all__ = ["BatchingOptions", "start_batching"]


@dataclass(frozen=True)
class BatchingOptions:
    """``max_batch``: the largest batch; ``buckets``: batch sizes a graph is captured for
    (default 1, 2, 4, ... up to ``max_batch``); ``max_delay_ms``: how long a free group
    waits for more requests when fewer than ``max_batch`` are queued (0: none, a lone
    client never waits); ``max_queue``: requests queued at most (callers past it wait for
    room up to ``timeout_s``, then get ``QueueFullError``; each is a slot of pinned staging
    of one query's input bytes, at least ``max_batch``); ``timeout_s``: how long a
    caller waits for room or for its result; ``batch_spec``: each input tensor's kind
    (``rows``, ``indices``, ``offsets``) when it cannot be inferred;
    ``switch_interval_ms``: the interpreter's thread switch interval while the model is
    served (``sys.setswitchinterval``, process-wide, restored by ``close()``; None: left
    alone). A thread that waits for the GIL forces the holder to drop it only after this
    interval (5 ms by default), which many client threads turn into queueing."""

    max_batch: int = 32
    buckets: tuple[int, ...] | None = None
    max_delay_ms: float = 0.0
    max_queue: int = 256
    timeout_s: float = 30.0
    batch_spec: tuple[str, ...] | None = None
    switch_interval_ms: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise BadInputError(f"max_batch must be a positive integer, got {self.max_batch!r}")
        if self.max_delay_ms < 0 or self.timeout_s <= 0 or self.max_queue < self.max_batch:
            raise BadInputError(f"bad batching settings: max_delay_ms={self.max_delay_ms} "
                                f"timeout_s={self.timeout_s} max_queue={self.max_queue}")


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
    arena = Arena(setup.plan, opts.max_queue, pin=True)
    try:
        for g in sm.manager.groups:
            workers.append(CudaWorker(sm, g, setup, buckets, arena))
    except BaseException:
        for w in workers:
            w.close()
        raise
    # a bucket dropped for memory on any group caps every group's batches
    max_batch = min(max(w.buckets) for w in workers)
    b = Batcher(workers, max_batch=max_batch, stage=arena.stage, max_queue=opts.max_queue, timeout_s=opts.timeout_s,
                max_delay_s=opts.max_delay_ms / 1e3, name="recsys-doctor-batch")
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
