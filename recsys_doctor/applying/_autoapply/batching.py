"""Batching for plain scripts (the plan's ``batching``, with CUDA graphs): top-level model calls
of one key (module, argument dtypes/shapes/devices and constants) that arrive while their group
is busy are run as ONE batch: one copy of every call's inputs into a device staging buffer, one
replay of a CUDA graph captured for the batch size, the outputs split by rows and cloned per call.

* **Which calls.** A call that the group's graph path would take (:func:`.graphs._graphed_call`:
  gradients off, the module in eval mode, every tensor argument on the GPU) whose key's batching
  spec holds, made on its group's stream. Every other call takes that path as it is.
* **The spec**, once per key, with the runtime's own code (:mod:`recsys_doctor.runtime._batchspec`):
  :func:`infer_spec` on the first call's tensors (rows stacked, EmbeddingBag indices
  concatenated with their offsets shifted), then :func:`check_spec`, which runs the model eagerly
  on two different queries, one at a time and batched, and compares. A refusal (a model that
  mixes rows, an output with no rows to split, inputs whose kinds are ambiguous) is logged once
  with the reason and the key's calls take the group's graph path, unbatched, from then on.
  The kinds are inferred from one call, as ``serve(batching=True)`` infers them from its example:
  an integer input that looks like EmbeddingBag offsets there is shifted in every batch.
* **The batch** (:class:`_Batches`, per group and key): the calls' tensors go into the
  request-major blocks of a device buffer (:meth:`BatchPlan.slot_views`, one
  ``torch._foreach_copy_``, device to device). No stream waits are needed: a hooked thread runs
  its whole life on its group's stream (:mod:`.interception`), a call is batched only when that
  is its current stream, so the callers' inputs were made, and their outputs are used, in that
  stream's order, the same stream the batch runs on. Then the graph of bucket ``k`` (1, 2, 4,
  ... up to ``max_batch``; the smallest ``>= n``; blocks past ``n`` hold earlier, valid queries)
  replays: :meth:`BatchPlan.regroup` on the GPU, the forward. A bucket is captured the first
  time it is needed, on the group's capture stream, within the site's bound on graphs and the
  graphs' memory budget (:mod:`.buckets`); without a graph (bound, budget, a failed capture
  or replay) the batch runs eagerly, as one batch, with the reason counted.
* **The queue** is :class:`.combine.Combiner`: bounded waits, an exception in a batch reaching
  every call of it.

A thread's own graph of its copies and model (:mod:`.thread_graphs`) is not learned where
batching is on: its replay would run one query on the thread's own graph, beside the group's
batches; the copies stay PyTorch's (:mod:`.interception`).
"""

from __future__ import annotations

import threading
from typing import Any

from ._common import _state, _tls, _torch, normal_tensors, trains
from .accounting import batched, fell_back, taken_over
from .argtree import Slot, flatten, remake, skeleton
from .argwrites import WRITES_ARGS, watched_call
from .buckets import BUDGET_SPENT, GRAPH_MEMORY_BUDGET, family
from .combine import Combiner
from .fallback import _debug_traceback, _fall_back, _synchronize_quietly, failure_reason
from .graphs import _graph_of, _graphed_call, _key_or_reason, _site_of
from .groups import _capture_stream, _Group, _run_shared

#: why a batch ran eagerly (with the bound's and the budget's reasons, :mod:`.buckets`)
CAPTURE_FAILED = "batched: capture failed, the bucket runs eagerly"


class _NoRows(RuntimeError):
    """A batch's output does not have the rows to split (the spec held for 2 calls, not for k)."""


class _Spec:
    """How the calls of one key batch (all groups): the runtime's :class:`BatchPlan`, the call's
    argument skeleton, the outputs' tree spec and rows per call; or why it does not."""

    __slots__ = ("lock", "done", "refused", "plan", "skeleton", "out_spec", "out_rows")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.refused: str | None = None
        self.plan: Any = None
        self.skeleton: Any = None
        self.out_spec: Any = None
        self.out_rows: tuple[int, ...] = ()


def _spec_of(torch: Any, key: Any, orig_call: Any, module: Any, args: Any, kwargs: Any, tensors: list[Any],
             site: str) -> _Spec:
    """The key's spec, decided on its first call (the others of the key wait for it)."""
    specs: dict[Any, _Spec] = _state["batch_specs"]
    sp = specs.get(key)
    if sp is None:
        with _state["batch_lock"]:
            sp = specs.setdefault(key, _Spec())
    if not sp.done:
        with sp.lock:
            if not sp.done:
                _decide(torch, sp, orig_call, module, args, kwargs, tensors, site)
                sp.done = True
    return sp


def _decide(torch: Any, sp: _Spec, orig_call: Any, module: Any, args: Any, kwargs: Any, tensors: list[Any],
            site: str) -> None:
    """Infer the key's spec and check it against eager (both the runtime's), or say why not: a
    refusal, or any failure (the model failing on the call itself then fails again, as eager
    does, on the unbatched path the key takes)."""
    from recsys_doctor.runtime._batchspec import BatchPlan, SpecRefused, check_spec, infer_spec

    sp.skeleton = skeleton((args, kwargs), torch.Tensor)
    try:
        if len({t.device for t in tensors}) != 1:
            raise SpecRefused("its tensors are on more than one device")
        plan = BatchPlan(tensors, infer_spec(tensors))
        # (on clones, watched: a model that writes into its arguments - a KV cache, ids hashed in
        # place - is not batched, as its graphs are not replayed (.argwrites), and the check's
        # runs leave the script's tensors as they were: the call itself is still to be made)
        sp.out_spec, sp.out_rows = _run_shared(check_spec, _watched_model(torch, orig_call, module),
                                               _rebuilder(sp.skeleton), [t.clone() for t in tensors], plan,
                                               tensors[0].device)
        sp.plan = plan
    except Exception as ex:  # noqa: BLE001 - SpecRefused, or anything else: the key is not batched
        sp.refused = f"not batched: {ex}" if isinstance(ex, SpecRefused) else f"not batched: {failure_reason(ex)}"
        with _state["batch_lock"]:  # one line per site and reason: the other shapes refused alike are counted
            said = _state["batch_refusals_said"]
            first = (site, sp.refused) not in said
            said.add((site, sp.refused))
        if not first:
            _state["fallbacks"].append(sp.refused)
            return
        shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)
        _fall_back(f"{type(module).__name__} ({site}) with tensors {shapes}: {sp.refused}; its calls of these "
                   "shapes run unbatched (other shapes refused for this reason: counted among the fallbacks, "
                   "not printed)", sp.refused)


def _model(orig_call: Any, module: Any) -> Any:
    return lambda a, kw: orig_call(module, *a, **kw)


def _watched_model(torch: Any, orig_call: Any, module: Any) -> Any:
    """:func:`_model`, each run watched for writes into its own tensor arguments: one refuses
    the spec (:class:`SpecRefused`) with the operator."""
    from recsys_doctor.runtime._batchspec import SpecRefused

    def run(a: Any, kw: Any) -> Any:
        ts: list[Any] = []
        flatten((a, kw), torch.Tensor, ts)
        out, hit = watched_call(torch, lambda: orig_call(module, *a, **kw), module, ts)
        if hit is not None:
            raise SpecRefused(f"{WRITES_ARGS} ({hit})")
        return out

    return run


def _rebuilder(skel: Any) -> Any:
    """Tensor leaves -> the model's two arguments ``(args, kwargs)`` (for :func:`_model`)."""
    return lambda ts: remake(skel, Slot, iter(ts))


def _batched_call(orig_call: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  site: str = "?") -> Any:
    """A top-level model call of a hooked thread where the plan batches: through its key's
    batches where its spec holds, else the group's graph path."""
    torch = _torch()
    g: _Group = _tls.group
    if trains(module) or torch.is_grad_enabled():
        return _graphed_call(orig_call, module, args, kwargs, site)
    kt = _key_or_reason(torch, module, args, kwargs)  # (no key_tag here: host arguments are not taken with batching)
    if isinstance(kt, str) or not kt[1] or torch.cuda.current_stream().cuda_stream != g.stream.cuda_stream:
        return _graphed_call(orig_call, module, args, kwargs, site, kt)
    key, tensors = kt
    sp = _spec_of(torch, key, orig_call, module, args, kwargs, tensors, site)
    if sp.refused is not None:  # (every call of a refused key: its key is not made twice)
        return _graphed_call(orig_call, module, args, kwargs, site, kt)
    b = g.batches.get(key)
    if b is None:
        with g.lock:
            b = g.batches.get(key)
            if b is None:
                b = g.batches[key] = _Batches(g, sp, _model(orig_call, module), module, key, _state["max_batch"])
    return b.combiner.call((tensors, site))


class _Batches:
    """One key's batches in one group: the device staging buffer, a graph per bucket, the queue."""

    def __init__(self, g: _Group, sp: _Spec, model: Any, module: Any, key: Any, max_batch: int) -> None:
        from recsys_doctor.runtime._batched import bucket_table, buckets_for

        self.g, self.sp, self.model, self.key, self.name = g, sp, model, key, type(module).__name__
        self.site = _site_of(g, module)
        self.max_batch = max_batch
        self.table = bucket_table(buckets_for(max_batch, [1 << i for i in range(max_batch.bit_length())]))
        self.m = len(sp.plan.leaves)
        self.dev_in: Any = None  # made on the first batch, on the group's stream
        self.views: list[Any] = []
        self.shifts: Any = None
        self.graphs: dict[int, tuple[Any, list[Any]]] = {}
        self.eager: dict[int, str] = {}
        self.combiner = Combiner(self.run, max_batch, hold=g.lock)

    def run(self, calls: list[tuple[list[Any], str]]) -> list[Any]:
        """One batch (under the group's lock, on the group's stream): copy in, replay (or run
        eagerly), outputs split and cloned per call; counted per call site."""
        torch = _torch()
        n = len(calls)
        k = self.table[n]
        flat = [t for tensors, _ in calls for t in tensors]
        if self.dev_in is None:
            self._stage(torch, calls[0][0])
        if k not in self.graphs and k not in self.eager:
            self._capture(torch, k)
        outs, why = _run_shared(self._launch, torch, flat, n, k)
        for _, site in calls:
            if why is None:
                taken_over("model", site)
            else:
                fell_back("model", site, why)
        if why is None or why != self.sp.refused:  # (refused on this batch: its calls ran one by one)
            batched([site for _, site in calls])
        return outs

    def _stage(self, torch: Any, tensors: list[Any]) -> None:
        """The staging buffer, every block a valid query from the start (padded blocks run real inputs)."""
        p = self.sp.plan
        dev = tensors[0].device
        with normal_tensors(torch):
            self.dev_in = torch.empty(self.max_batch * p.block, dtype=torch.uint8, device=dev)
        self.views = p.slot_views(self.dev_in, self.max_batch)
        torch._foreach_copy_(self.views, list(tensors) * self.max_batch)
        self.shifts = torch.arange(self.max_batch, device=dev) * p.shift

    def _forward(self, torch: Any, k: int) -> list[Any]:
        """The first ``k`` blocks regrouped and run as one batch: the output's leaves."""
        from torch.utils._pytree import tree_flatten

        with torch.no_grad():
            out = self.model(*remake(self.sp.skeleton, Slot, iter(self.sp.plan.regroup(self.dev_in, k, self.shifts))))
        leaves, _ = tree_flatten(out)
        for o, r in zip(leaves, self.sp.out_rows):
            if not isinstance(o, torch.Tensor) or o.dim() == 0 or int(o.shape[0]) != k * r:
                raise _NoRows(f"an output of the batch of {k} does not have {k} x {r} rows")
        return leaves

    def _capture(self, torch: Any, k: int) -> None:
        """Bucket ``k``'s graph, within the site's bound and the memory budget; else the reason
        its batches run eagerly (said once)."""
        why = self.site.refused((self.key, "batch", k), (family(self.key), "batch"))  # (its sizes: one family)
        if why is not None:
            self.eager[k] = why
            return
        if _state.get("graph_bytes", 0) >= GRAPH_MEMORY_BUDGET:
            self.eager[k] = BUDGET_SPENT
            return
        g = self.g
        g.stream.synchronize()  # the staging buffer's copies, made on the group stream, are done
        try:
            graph, leaves = _graph_of(torch, _capture_stream(g), lambda: self._forward(torch, k))
            self.graphs[k] = (graph, leaves)
            _state["captured"] += 1
        except Exception as ex:  # noqa: BLE001 - the bucket runs eagerly, with the reason
            _debug_traceback()
            g.capture_stream = None  # (its capture broke: never used again)
            _synchronize_quietly(torch)
            self.eager[k] = CAPTURE_FAILED
            _fall_back(f"{self.name} on group {g.index}: batch of {k}: {CAPTURE_FAILED} "
                       f"({failure_reason(ex)})", CAPTURE_FAILED)

    def _launch(self, torch: Any, flat: list[Any], n: int, k: int) -> tuple[list[Any], str | None]:
        """Copy the ``n`` calls in, run bucket ``k``; the per-call outputs and why it ran eagerly
        (None: replayed)."""
        torch._foreach_copy_(self.views[:n * self.m], flat)
        why = self.eager.get(k)
        leaves = None
        if why is None:
            graph, leaves = self.graphs[k]
            try:
                graph.replay()
                _state["replays"] += 1
            except Exception as ex:  # noqa: BLE001 - eager from now on, with the reason
                why = self.eager[k] = f"batched: replay failed: {failure_reason(ex)}"
                _fall_back(f"{self.name} on group {self.g.index}: batch of {k}: {why}", why)
                leaves = None
        if leaves is None:
            try:
                leaves = self._forward(torch, k)
            except _NoRows as ex:  # each call as the script made it; the key unbatched from now on
                self.sp.refused = f"not batched: {ex}"
                _fall_back(f"{self.name} on group {self.g.index}: {self.sp.refused}", self.sp.refused)
                return self._singly(flat, n), self.sp.refused
        return self._split(leaves, n), why

    def _singly(self, flat: list[Any], n: int) -> list[Any]:
        """The ``n`` calls run one by one, eagerly, each on its own tensors."""
        m, run, skel = self.m, self.model, self.sp.skeleton
        return [run(*remake(skel, Slot, iter(flat[j * m:(j + 1) * m]))) for j in range(n)]

    def _split(self, leaves: list[Any], n: int) -> list[Any]:
        """Call ``j``'s output: rows ``j*r .. (j+1)*r`` of every leaf, cloned, in eager's structure."""
        from torch.utils._pytree import tree_unflatten

        rows = self.sp.out_rows
        return [tree_unflatten([o.narrow(0, j * r, r).clone() for o, r in zip(leaves, rows)], self.sp.out_spec)
                for j in range(n)]
