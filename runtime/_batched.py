"""What a batch worker shares between devices: the batching set-up of a served model
(:class:`BatchSetup`: spec, staging plan, output split), bucket sizes, and the CPU worker
(:class:`CpuWorker`: a real batched runner for CPU models, also what the CPU tests drive).
The CUDA worker is :mod:`._batched_cuda`. Needs torch, no CUDA."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import BadInputError
from ._batchspec import BatchPlan, check_spec, infer_spec
from ._policy import flatten, out_unflatten, unflatten

__all__ = ["BatchSetup", "buckets_for", "CpuWorker", "Arena", "DEFAULT_BUCKETS"]

#: batch sizes a CUDA graph is captured for (a batch of n runs in the smallest >= n)
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)


def buckets_for(max_batch: int, sizes: Sequence[int] | None = None) -> tuple[int, ...]:
    """The bucket sizes up to ``max_batch`` (always including ``max_batch`` itself)."""
    if max_batch < 1:
        raise BadInputError(f"max_batch must be at least 1, got {max_batch}")
    base = sorted({int(s) for s in (sizes or DEFAULT_BUCKETS) if 1 <= int(s) <= max_batch})
    if any(s < 1 for s in (sizes or ())):
        raise BadInputError(f"bucket sizes must be positive, got {list(sizes or ())}")
    return tuple(sorted(set(base) | {max_batch}))


def bucket_table(buckets: Sequence[int]) -> list[int]:
    """``table[n]``: the bucket that runs a batch of ``n`` (index 0 unused)."""
    out = [0]
    for n in range(1, max(buckets) + 1):
        out.append(min(b for b in buckets if b >= n))
    return out


class BatchSetup:
    """How one served model batches: from its example call (``args``), the inferred or
    declared ``batch_spec``, checked against the eager ``model`` on ``device``. Raises
    :class:`~._batchspec.SpecRefused` with the reason when batching does not hold.

    ``tensors``: the example's tensor leaves; ``plan``: :class:`BatchPlan`; ``rebuild``:
    tensor leaves -> the model's arguments; ``out_spec``/``out_rows``: the output's tree
    spec and the rows per query of each output leaf."""

    def __init__(self, model: Any, args: tuple[Any, ...], device: Any, batch_spec: Sequence[str] | None = None) -> None:
        import torch

        leaves, spec = flatten(args, lambda x: isinstance(x, torch.Tensor))
        pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        self.tensors = [leaves[i].contiguous() for i in pos]
        consts = list(leaves)

        def rebuild(ts: Sequence[Any]) -> Any:
            full = consts[:]
            for i, t in zip(pos, ts):
                full[i] = t
            return unflatten(full, spec)

        self.rebuild: Callable[[Sequence[Any]], Any] = rebuild
        kinds = tuple(batch_spec) if batch_spec is not None else infer_spec(self.tensors)
        self.plan = BatchPlan(self.tensors, kinds)
        self.out_spec, self.out_rows = check_spec(model, rebuild, self.tensors, self.plan, device)
        self.model = model

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        return out_unflatten(leaves, self.out_spec)

    def split(self, outs: Sequence[Any], n: int) -> list[Any]:
        """Per-request outputs of a batch of ``n``: each output leaf split by its rows."""
        parts = [o.split(r)[:n] for o, r in zip(outs, self.out_rows)]
        if len(parts) == 1 and self.out_spec.is_leaf():
            return list(parts[0])
        return [out_unflatten([p[j] for p in parts], self.out_spec) for j in range(n)]


class Arena:
    """Where queued requests wait: ``slots`` query blocks of one (pinned, for CUDA)
    staging buffer. A caller copies its query into a free slot itself, with one
    ``torch._foreach_copy_`` that runs without the GIL (so many callers copy in
    parallel, and a batch costs its worker no host copy at all); the worker copies the
    batch's slots to the device. The free list is the batcher's (its queue bound)."""

    def __init__(self, plan: Any, slots: int, pin: bool) -> None:
        import torch

        self.torch = torch
        self.block = plan.block
        self.buf = torch.empty(slots * plan.block, dtype=torch.uint8, pin_memory=pin).zero_()
        if pin and not self.buf.is_pinned():
            raise RuntimeError("the batching arena did not get pinned host memory")
        self.ptr = self.buf.data_ptr()
        m = len(plan.leaves)
        flat = plan.slot_views(self.buf, slots)
        self.views = [flat[j * m:(j + 1) * m] for j in range(slots)]
        self.slots = slots

    def stage(self, slot: int, leaves: Sequence[Any]) -> None:
        self.torch._foreach_copy_(self.views[slot], leaves)

    def rows(self) -> Any:
        """The buffer as ``[slots, block]`` bytes."""
        return self.buf.view(self.slots, self.block)


class CpuWorker:
    """Runs batches of a CPU model: the batch's arena slots gathered into a new buffer (one
    ``index_select``), :meth:`BatchPlan.regroup` concatenates them, the model runs once,
    the outputs are split per request. A real runner (CPU serving, the batcher's tests)."""

    def __init__(self, setup: BatchSetup, max_batch: int, arena: Arena) -> None:
        import torch

        self.torch = torch
        self.setup = setup
        self.arena = arena
        self.shifts = torch.arange(max_batch) * setup.plan.shift

    def __call__(self, reqs: Sequence[Any]) -> list[Any]:
        from torch.utils._pytree import tree_flatten

        torch = self.torch
        n = len(reqs)
        # a fresh buffer per batch: an output may be a view of its inputs
        buf = torch.index_select(self.arena.rows(), 0, torch.tensor([r.slot for r in reqs])).view(-1)
        s = self.setup
        with torch.no_grad():
            outs, _ = tree_flatten(s.model(*s.rebuild(s.plan.regroup(buf, n, self.shifts))))
        return s.split(outs, n)
