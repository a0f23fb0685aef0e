"""What a batch worker shares between devices: the batching set-up of a served model
(:class:`BatchSetup`: spec, staging plan, output split), bucket sizes, and the CPU worker
(:class:`CpuWorker`: a real batched runner for CPU models, also what the CPU tests drive),
and how a batch's tensors are staged (:func:`stage_batch`).
The CUDA worker is :mod:`._batched_cuda`. Needs torch, no CUDA."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import BadInputError
from ._batchspec import BatchPlan, check_spec, infer_spec
from ._policy import flatten, out_unflatten, unflatten

__all__ = ["BatchSetup", "buckets_for", "CpuWorker", "stage_batch", "DEFAULT_BUCKETS"]

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


def stage_batch(torch: Any, views: Sequence[Any], m: int, reqs: Sequence[Any]) -> list[Any]:
    """Copy the tensors of ``reqs`` (``m`` each) into ``views`` (:meth:`BatchPlan.slot_views`
    of a staging buffer), query after query, with one ``torch._foreach_copy_`` (dtypes are
    converted to the example's; a tensor of another shape raises). When that fails, query
    by query: a request whose tensors do not fit gets its own error in ``err`` and is left
    out. Returns the requests staged, in staging order."""
    try:
        torch._foreach_copy_(views[:len(reqs) * m], [x for r in reqs for x in r.leaves])
        return list(reqs)
    except Exception:  # noqa: BLE001 - found and reported per request below
        pass
    ok: list[Any] = []
    for r in reqs:
        j = len(ok)
        try:
            if len(r.leaves) != m:
                raise BadInputError(f"a batched query has {len(r.leaves)} tensors where the example has {m}")
            torch._foreach_copy_(views[j * m:(j + 1) * m], list(r.leaves))
            ok.append(r)
        except Exception as e:  # noqa: BLE001 - this request's own error, its caller gets it
            r.err = e
    return ok


class CpuWorker:
    """Runs batches of a CPU model: the batch's tensors staged into a fresh buffer
    (:func:`stage_batch`), :meth:`BatchPlan.regroup` concatenates them (offsets shifted),
    the model runs once, the outputs are split per request. A real runner (CPU serving,
    the batcher's tests); it runs the batch at ``start`` (nothing to overlap on the CPU)."""

    def __init__(self, setup: BatchSetup, max_batch: int) -> None:
        import torch

        self.torch = torch
        self.setup = setup
        self.m = len(setup.plan.leaves)
        self.shifts = torch.arange(max_batch) * setup.plan.shift
        self._outs: list[Any] | None = None

    def start(self, reqs: Sequence[Any]) -> list[Any]:
        torch, s = self.torch, self.setup
        # a fresh buffer per batch: an output may be a view of its inputs
        buf = torch.empty(len(reqs) * s.plan.block, dtype=torch.uint8)
        ran = stage_batch(torch, s.plan.slot_views(buf, len(reqs)), self.m, reqs)
        if ran:
            self._outs = self(buf, len(ran))
        return ran

    def finish(self, reqs: Sequence[Any]) -> list[Any]:
        outs, self._outs = self._outs, None
        return outs if outs is not None else []

    def __call__(self, buf: Any, n: int) -> list[Any]:
        from torch.utils._pytree import tree_flatten

        s = self.setup
        with self.torch.no_grad():
            outs, _ = tree_flatten(s.model(*s.rebuild(s.plan.regroup(buf, n, self.shifts))))
        return s.split(outs, n)
