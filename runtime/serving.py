"""Serving with the stream-group runtime: :func:`serve` wraps a PyTorch model into a
thread-safe callable. Each query is packed into its group's pinned staging buffer (one
CPU copy per run of equal tensors), then the group replays ONE CUDA graph that holds the
whole query: the host-to-device copy of the staging buffer, the model's forward on views
of the device staging buffer, the copy of the outputs into a device output buffer and the
device-to-host copy into pinned memory. The host then waits on one event of that query
only. That is one ``cuGraphLaunch`` per query instead of ~30 copies and ~90 kernel
launches through the Python launch path, and the N groups' graphs overlap on the GPU.

:meth:`ServedModel.request` is the zero-copy variant: the client fills the slot's pinned
staging itself. How a slot is prepared and captured: :mod:`._serve_entry`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import asdict
from operator import attrgetter
from typing import Any, Sequence

from ..errors import RuntimeCudaError
from ._branches import DEFAULT_BRANCH_STREAMS, check_branch_streams
from ._branches import branch_streams as branch_streams_for
from ._cuda import ensure_context
from ._cuda import torch_module as _torch
from ._policy import RuntimeConfig, flatten_inputs, out_flatten, out_unflatten
from ._serve_entry import Entry as _Entry
from ._request import Request
from ._serve_entry import STAGED as _STAGED, graph_copies_inside, has_mem_pool, prepare
from ._hostvalues import host_values_off
from ._serve_batching import (DEFAULT_DRIVERS, DEFAULT_SWITCH_INTERVAL_MS, BatchedCalls, BatchingOptions,
                              batching_stats, hold_switch_interval, release_switch_interval, start_batching)
from ._streams import StreamGroup, StreamManager

__all__ = ["serve", "ServedModel", "Request"]

_dtype_of = attrgetter("dtype")
_shape_of = attrgetter("shape")


class ServedModel(BatchedCalls):
    """A model served by stream groups. Call it from any number of threads with host
    tensors (the same structure as ``example_inputs``); it returns host tensors.

    Attributes: ``config`` (:class:`RuntimeConfig`), ``manager`` (:class:`StreamManager`),
    ``fallbacks`` (input signature -> why it runs eagerly instead of as a CUDA graph).
    Close with :meth:`close` or use as a context manager; the model's weights are shared by
    all groups (one copy) and stay owned by the caller.
    """

    #: a call returns once its query is done and the outputs are on the host (the workload
    #: driver, :func:`recsys_doctor.capture.workload.measure`, adds no synchronize after it)
    synchronous = True

    def __init__(self, model: Any, example_inputs: Any, config: RuntimeConfig, device: int,
                 max_signatures: int = 16, batching: BatchingOptions | None = None,
                 branch_streams: int = DEFAULT_BRANCH_STREAMS) -> None:
        torch = _torch()
        self.torch = torch
        self.model = model
        self.config = config
        self.device = torch.device("cuda", device)
        self.max_signatures = max_signatures
        torch.cuda.init()
        self.manager = StreamManager(config.groups, device=device, merge=config.merge_streams,
                                     slots=config.slots_per_group, probe_idle=False,
                                     per_group_pool=config.per_stream_allocator, pool_limit_bytes=config.pool_limit_bytes)
        self._groups = self.manager.groups
        self._pool = self.manager.slot_pool
        self._fp = self.manager.fast
        self._ext: dict[int, Any] = {}
        self._graph_pools: dict[tuple[int, int], Any] = {}
        self._mem_pools: dict[tuple[int, int], Any] = {}
        #: where a group's activations come from: "group" (a private pool per group) or
        #: "shared" (PyTorch's caching allocator, shared by all groups)
        self.activation_pool = "shared"
        for g in self.manager.groups:
            self._ext[g.index] = torch.cuda.ExternalStream(g.stream_handles[0], device=self.device)
            if config.per_stream_allocator:
                # private pools for the group's activations, one per slot (eager forwards
                # allocate from it, graphs are captured into it): not one per group, as
                # PyTorch lets one thread at a time route allocations to a pool.
                for slot in g.slots:
                    key = (g.index, slot.index)
                    if has_mem_pool(torch):
                        self._mem_pools[key] = torch.cuda.MemPool()
                        self._graph_pools[key] = self._mem_pools[key].id
                    else:  # pragma: no cover - torch < 2.6
                        self._graph_pools[key] = torch.cuda.graph_pool_handle()
                self.activation_pool = "group"
        #: merged groups: the H2D and D2H copies inside each query's graph (one launch) or
        #: enqueued around it (``RECSYS_DOCTOR_GRAPH_COPIES=outside``: three hot-path calls,
        #: as a hand-written server does; for measuring which the GPU runs faster)
        self.copies_in_graph = graph_copies_inside()
        self.fallbacks: dict[str, str] = {}
        self._setup_branches(branch_streams)
        #: the fast path of :meth:`_key`: specs by list lengths (-1: a tensor argument)
        self._specs: dict[tuple[int, ...], Any] = {}
        self._just_tensors = {torch.Tensor}
        self._eager_sigs: dict[Any, str] = {}
        self._failed_graphs: list[Any] = []
        self._lock = threading.Lock()
        self.closed = False
        self._batcher: Any = None
        self._bnumel = 0
        self._switch_token: int | None = None
        self._bworkers: list[Any] = []
        #: why batching was refused (None: on, or not asked for)
        self.batching_refused: str | None = None
        # prepare (and capture) every slot of every group for the example signature now,
        # so that client threads never pay a capture for the expected shape
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        try:
            leaves, spec = flatten_inputs(args, self._is_tensor)
            sig = self._signature(leaves, spec)
            self._example = (leaves, spec, sig)
            for g in self.manager.groups:
                for slot in g.slots:
                    slot.entries[sig] = prepare(self, g, slot, sig, leaves, spec)
            if batching is not None:
                self._start_batching(args, batching)
        except BaseException:  # what was set up is closed, the error re-raised
            self.close()
            raise

    def _setup_branches(self, n: int) -> None:
        #: streams each captured forward's branches spread over (:mod:`._branches`; 1: the
        #: group's stream alone), the extra ones per group, and the signatures captured on
        #: one stream because that failed, with the reason. Each group has its own extra
        #: streams: what PyTorch keeps per stream and a graph captures (cuBLAS's workspace is
        #: one buffer per stream) must not be shared by graphs that run at the same time,
        #: as two groups' graphs do (shared ones gave wrong results and an illegal address on
        #: the H100, bench/serving/results/branch_race_h100/)
        self.branch_streams = check_branch_streams(n) if self.config.cuda_graphs else 1
        self._sides = [branch_streams_for(self.torch, self.branch_streams, self.device) for _ in self.manager.groups]
        self.branch_fallbacks: dict[str, str] = {}

    def _start_batching(self, args: tuple[Any, ...], batching: Any) -> None:
        """The batcher over the groups (or why batching was refused), and the batched
        call's check: leaf count and total elements (the staging copy refuses any other
        shape whose total matches: see ``_batch_leaves``)."""
        leaves, _, sig = self._example
        self._batcher, self._bworkers, self.batching_refused = start_batching(self, args, batching)
        if self._batcher is not None and batching.switch_interval_ms:
            self._switch_token = hold_switch_interval(batching.switch_interval_ms)
        self._bsig = sig
        self._btensors = [k for k, x in enumerate(leaves) if isinstance(x, self.torch.Tensor)]
        self._ball = len(self._btensors) == len(leaves)
        self._bcount = len(leaves)
        self._bnumel = sum(x.numel() for x in leaves) if self._ball and self._batcher else 0

    # -- keys ----------------------------------------------------------------------------
    def _is_tensor(self, x: Any) -> bool:
        return isinstance(x, self.torch.Tensor)

    def _key(self, args: tuple[Any, ...]) -> tuple[list[Any], Any, Any]:
        """``(leaves, spec, signature)`` of one call's arguments, as :func:`.flatten_inputs` and
        :meth:`_signature` give them. The usual query - positional tensors and lists of
        tensors - takes a fast path once its structure has been seen: one pass over the
        arguments, the spec looked up by the list lengths, the signature from two ``map``
        calls (a query's Python work is what bounds many client threads)."""
        T = self.torch.Tensor
        leaves: list[Any] = []
        shape: list[int] = []
        key: tuple[int, ...] | None
        for a in args:
            t = type(a)
            if t is T:
                leaves.append(a)
                shape.append(-1)
            elif t is list and a and set(map(type, a)) == self._just_tensors:
                leaves.extend(a)
                shape.append(len(a))
            else:
                key = None  # not the usual query: flatten() every time
                break
        else:
            key = tuple(shape)
            spec = self._specs.get(key)
            if spec is not None:
                return leaves, spec, (spec, tuple(zip(map(_dtype_of, leaves), map(_shape_of, leaves))))
        leaves, spec = flatten_inputs(args, self._is_tensor)
        if key is not None and len(self._specs) < 64:
            self._specs[key] = spec
        return leaves, spec, self._signature(leaves, spec)

    def _signature(self, leaves: Sequence[Any], spec: Any) -> Any:
        T = self.torch.Tensor
        return (spec, tuple((x.dtype, x.shape) if isinstance(x, T) else ("const", type(x).__name__, repr(x))
                            for x in leaves))

    # -- the hot path --------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        """One query: host tensors in (the structure of ``example_inputs``), host tensors
        out. Packs the inputs into a free slot's pinned staging (one ``_foreach_copy_``),
        replays the slot's graph, waits for that query only, returns copies of the
        outputs."""
        if self.closed:
            raise RuntimeCudaError("this served model is closed")
        b = self._batcher
        if b is not None:
            got = self._batch_leaves(args)
            if got is not None:
                return b.call(got)
        leaves, spec, sig = self._key(args)
        pool = self._pool
        # a free slot of the least-loaded group, or the oldest waiter's turn (FIFO)
        i, slot = pool.acquire()
        g = self._groups[i]
        try:
            entry = self._entry(g, slot, sig, leaves, spec)
            self._pack(entry, leaves)
            raw = self._execute(g, slot, entry)
            if raw is not _STAGED:
                return raw
            return out_unflatten([v.clone() for v in entry.host_out_views], entry.out_spec)
        finally:
            g._last_done = slot.done_i
            pool.release(i, slot)

    def request(self, *like: Any) -> "Request":
        """A slot to fill in place (zero copy): ``with served.request() as q:`` then write
        the query into ``q.inputs`` (pinned host tensors shaped like ``example_inputs``) or
        ``q.buffer`` (the same bytes as one flat uint8 tensor, laid out as ``q.layout``),
        and ``out = q.run()``: pinned host views of the outputs, valid until the block
        ends (copy what you keep). ``like``: arguments whose signature to use instead of
        ``example_inputs`` (prepared and captured on first use). Blocks, first come first
        served, while every slot is in flight."""
        if self.closed:
            raise RuntimeCudaError("this served model is closed")
        if like:
            leaves, spec, sig = self._key(like)
        else:
            leaves, spec, sig = self._example
        i, slot = self._pool.acquire()
        g = self._groups[i]
        try:
            entry = self._entry(g, slot, sig, leaves, spec)
        except BaseException:  # the slot goes back, the error re-raised
            self._pool.release(i, slot)
            raise
        return Request(self, i, g, slot, entry)

    def _entry(self, g: StreamGroup, slot: Any, sig: Any, leaves: Sequence[Any], spec: Any) -> _Entry:
        entry = slot.entries.get(sig)
        if entry is None:
            entry = prepare(self, g, slot, sig, leaves, spec)
            self._remember(g, slot, sig, entry)
        elif len(slot.entries) > 1:
            slot.entries.move_to_end(sig)
        return entry

    def _remember(self, g: StreamGroup, slot: Any, sig: Any, entry: _Entry) -> None:
        slot.entries[sig] = entry
        while len(slot.entries) > self.max_signatures:
            _, old = slot.entries.popitem(last=False)
            g.synchronize()
            old.close(g)

    def _pack(self, entry: _Entry, leaves: Sequence[Any]) -> None:
        """Every input tensor into its pinned view: one ``_foreach_copy_`` call."""
        if not entry.host_in_views:
            return
        src = leaves if entry.all_tensors else [leaves[k] for k in entry.tensor_pos]
        self.torch._foreach_copy_(entry.host_in_views, src)

    def _execute(self, g: StreamGroup, slot: Any, entry: _Entry) -> Any:
        """Run one query whose inputs are staged in ``entry``'s pinned buffer and wait
        for it. Returns ``_STAGED`` (the outputs are in ``entry.host_out_views``) or, when
        an eager forward's outputs do not fit the staged layout, the host outputs."""
        fp = self._fp
        ensure_context(self.manager.context)
        if entry.exec_i and g.merge and self.copies_in_graph:
            # H2D, forward and D2H are one graph: one launch, one record, one wait
            fp.launch(entry.exec_i, g.compute_i)
            fp.record(slot.done_i, g.compute_i)
        else:
            self._h2d(g, slot, entry)
            if entry.exec_i:
                fp.launch(entry.exec_i, g.compute_i)
            else:
                raw = self._eager_forward(g, slot, entry)
                if raw is not None:  # outputs do not fit the staged layout
                    return self._eager_unstaged(g, raw)
            self._d2h(g, slot, entry)
        fp.wait(slot.done_i)
        return _STAGED

    def _h2d(self, g: StreamGroup, slot: Any, entry: _Entry) -> None:
        self._fp.htod(entry.dev_in.ptr, entry.pin_in.ptr, entry.n_in, g.h2d_i)
        if not g.merge:
            self._fp.record(slot.h2d_i, g.h2d_i)
            g.wait(g.compute_h, slot.h_h2d)

    def _d2h(self, g: StreamGroup, slot: Any, entry: _Entry) -> None:
        if not g.merge:
            g.record(slot.h_compute, g.compute_h)
            g.wait(g.d2h_h, slot.h_compute)
        self._fp.dtoh(entry.pin_out.ptr, entry.dev_out.ptr, entry.n_out, g.d2h_i)
        self._fp.record(slot.done_i, g.d2h_i)

    def _eager_forward(self, g: StreamGroup, slot: Any, entry: _Entry) -> Any:
        """Run the model eagerly on the group's compute stream and stage its outputs.
        Returns None when staged, else the raw outputs (their shapes do not fit the layout
        staged for this input signature: data-dependent output shapes)."""
        torch = self.torch
        with torch.cuda.stream(self._ext[g.index]), torch.no_grad(), self._activations(g, slot):
            raw = self.model(*entry.dev_args)
            outs, _ = out_flatten(raw)
            if [(o.dtype, tuple(o.shape)) for o in outs] != entry.out_shapes:
                return raw
            for dv, o in zip(entry.dev_out_views, outs):
                dv.copy_(o)
        return None

    def _eager_unstaged(self, g: StreamGroup, raw: Any) -> Any:
        torch = self.torch
        leaves, spec = out_flatten(raw)
        with torch.cuda.stream(self._ext[g.index]):
            host = [x.to("cpu") if isinstance(x, torch.Tensor) else x for x in leaves]  # synchronous
        return out_unflatten(host, spec)

    # -- preparing a slot for a signature --------------------------------------------------
    # -- bookkeeping -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-group served counts, graph/eager entries, pool usage, fallbacks."""
        groups = []
        for g in self.manager.groups:
            entries = [e for s in g.slots for e in s.entries.values()]
            groups.append({"group": g.index, "served": self._pool.served[g.index],
                           "in_flight": self._pool.in_use[g.index],
                           "graphs": sum(1 for e in entries if e.exec_h is not None),
                           "eager": sum(1 for e in entries if e.exec_h is None)})
        return {"config": asdict(self.config), "groups": groups, "pools": self.manager.pool_stats(),
                "activation_pool": self.activation_pool, "activation_pool_bytes": self._activation_bytes(),
                "driver_path": self._fp.source, "copies_in_graph": self.copies_in_graph,
                "fallbacks": dict(self.fallbacks), "branch_streams": self.branch_streams,
                "branch_fallbacks": {**self.branch_fallbacks,
                                     **{f"batch of {k} (group {w.g.index})": why for w in self._bworkers
                                        for k, why in getattr(w, "branch_fallbacks", {}).items()}},
                "batching": batching_stats(self._batcher, self._bworkers, self.batching_refused)}

    def _activation_bytes(self) -> list[int] | None:
        """Bytes reserved in each group's activation pools (None: pools are shared)."""
        if not self._mem_pools:
            return None
        out = [0] * len(self._groups)
        for (gi, _), pool in self._mem_pools.items():
            try:
                out[gi] += int(sum(seg["total_size"] for seg in pool.snapshot()))
            except Exception:  # noqa: BLE001 - older torch: no snapshot of a pool
                return None
        return out

    def _activations(self, g: StreamGroup, slot: Any) -> Any:
        """Route the calling thread's allocations to the pool of ``g``'s ``slot`` (own
        pools only)."""
        pool = self._mem_pools.get((g.index, slot.index))
        if pool is None:
            return contextlib.nullcontext()
        return self.torch.cuda.use_mem_pool(pool, self.device)

    def close(self) -> None:
        """Wait for in-flight work, destroy graphs, free staging buffers, pools, streams."""
        if self.closed:
            return
        self.closed = True
        if self._batcher is not None:
            self._batcher.close()  # fails the queued requests, finishes the running batches
        if self._switch_token is not None:
            release_switch_interval(self._switch_token)
        for w in self._bworkers:
            w.close()
        self._bworkers = []
        try:
            self.manager.synchronize()
        finally:
            for g in self.manager.groups:
                for s in g.slots:
                    for e in list(s.entries.values()):
                        e.close(g)
                    s.entries = OrderedDict()
            for g in self.manager.groups:
                g.synchronize()
            self._ext.clear()
            self.manager.close()
            self._mem_pools.clear()

    def __enter__(self) -> "ServedModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise; close() is the contract
            pass


def serve(model: Any, example_inputs: Any, groups: int | None = None, merge: bool | None = None,
          graphs: bool | None = None, *, plan: dict[str, Any] | None = None, device: int | None = None,
          slots_per_group: int | None = None, per_stream_allocator: bool | None = None,
          pool_limit_bytes: int | None = None, max_signatures: int = 16, batching: bool | None = None,
          max_batch: int | None = None, buckets: Sequence[int] | None = None, max_delay_ms: float | None = None,
          max_queue: int = 256, timeout_s: float = 30.0, batch_spec: Sequence[str] | None = None,
          switch_interval_ms: float | None = DEFAULT_SWITCH_INTERVAL_MS, drivers: int = DEFAULT_DRIVERS,
          branch_streams: int = DEFAULT_BRANCH_STREAMS) -> ServedModel:
    """Serve ``model`` through stream groups; returns a thread-safe :class:`ServedModel`.

    ``example_inputs`` is the tuple of positional arguments of one query (host tensors,
    lists/tuples/dicts of them, constants); every group is prepared and, with ``graphs``,
    captured for its signature up front. Other signatures are captured on first use.
    Settings come from the arguments, else from ``plan`` (``advise``'s plan dict), else the
    :class:`RuntimeConfig` defaults. The model should be in eval mode: a replayed graph does
    not advance PyTorch's RNG.

    ``batching=True`` (or the plan's ``batching``): concurrent queries of the example's signature coalesce into batches
    of up to ``max_batch`` (a CUDA graph per bucket size per group, ``buckets``), waiting
    at most ``max_delay_ms`` for company (0: never); at most ``max_queue`` wait, each caller
    at most ``timeout_s``. How inputs combine is inferred (rows, EmbeddingBag indices and
    offsets, with or without a trailing total) or given by ``batch_spec`` (also
    KeyedJaggedTensor-style ``jagged_values`` and ``jagged_lengths``/``jagged_offsets``), and checked against the eager model; when it does
    not hold, a warning says why and queries are served unbatched (``batching_refused``).
    ``switch_interval_ms`` sets the interpreter's thread switch interval while a batching
    model is served (default 0.5 ms; None leaves it alone; restored once every such model is closed),
    ``drivers`` the batch driver threads (default 2, at most one per group; :class:`~._serve_batching.BatchingOptions`).
    ``branch_streams``: each graph is captured with the forward's independent operations
    spread over this many streams, so its branches (embedding lookups, experts) run side
    by side when it is replayed (:mod:`._branches`; 1: one stream, as PyTorch captures).
    """
    torch = _torch()
    cfg = host_values_off(model, RuntimeConfig.from_plan(
        plan or {}, groups=groups, merge_streams=merge, cuda_graphs=graphs, slots_per_group=slots_per_group,
        per_stream_allocator=per_stream_allocator, pool_limit_bytes=pool_limit_bytes, batching=batching,
        max_batch=max_batch, max_delay_ms=max_delay_ms))
    if device is None:
        p = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        device = p.device.index if p is not None and p.is_cuda else torch.cuda.current_device()
    opts = (BatchingOptions(max_batch=cfg.max_batch, buckets=tuple(buckets) if buckets else None,
                            max_delay_ms=cfg.max_delay_ms,
                            max_queue=max_queue, timeout_s=timeout_s,
                            batch_spec=tuple(batch_spec) if batch_spec is not None else None,
                            switch_interval_ms=switch_interval_ms, drivers=drivers) if cfg.batching else None)
    return ServedModel(model, example_inputs, cfg, int(device), max_signatures=max_signatures, batching=opts,
                       branch_streams=branch_streams)

