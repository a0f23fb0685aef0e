"""PyTorch adapter of the stream-group runtime.

Serving: :func:`serve` wraps a model into a thread-safe callable. Each query is packed
into its group's pinned staging buffer (one CPU copy per run of equal tensors), then the
group replays ONE CUDA graph that holds the whole query: the host-to-device copy of the
staging buffer, the model's forward on views of the device staging buffer, the copy of
the outputs into a device output buffer and the device-to-host copy into pinned memory.
The host then waits on one event of that query only. That is one ``cuGraphLaunch`` per
query instead of ~30 copies and ~90 kernel launches through the Python launch path, and
the N groups' graphs overlap on the GPU.

Training: :func:`stream_scope` runs a branch (forward and, through autograd, backward) on
a side stream with event dependencies on both sides; :func:`parallel_branches` runs a list
of modules as parallel branches. Both work inside a CUDA-graph-captured training step.

Streams are created by cuda-python (``cuda.core``) and handed to PyTorch with
``torch.cuda.ExternalStream``. torch is imported lazily: the package imports without it.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from ..errors import BadInputError, RuntimeCudaError
from ._cuda import check, ensure_context, translating
from ._policy import RuntimeConfig, flatten, pack_layout, unflatten
from ._streams import HostBuffer, StreamGroup, StreamManager

__all__ = ["serve", "ServedModel", "BranchStreams", "stream_scope", "parallel_branches",
           "default_branch_streams"]

#: CUDA graph captures are serialized process-wide: two captures at once in thread-local
#: mode are legal, but a capture's device-wide synchronize and allocator bookkeeping are
#: cheaper to reason about one at a time, and captures are rare (once per group and shape).
_CAPTURE_LOCK = threading.Lock()


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise BadInputError("the PyTorch adapter needs torch (pip install 'recsys-doctor[torch]')") from e
    return torch


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".strip()


class _Entry:
    """Everything one slot needs to run one input signature: staging buffers, views of
    them, and either a captured graph or the eager path (with the reason)."""

    def __init__(self) -> None:
        self.pinned_in: HostBuffer | None = None
        self.pinned_out: HostBuffer | None = None
        self.dev_in: Any = None
        self.dev_out: Any = None
        self.n_in = 0
        self.n_out = 0
        self.runs: list[tuple[int, int, Any]] = []  # (first leaf, count, host view)
        self.dev_args: Any = None
        self.dev_out_views: list[Any] = []
        self.host_out_views: list[Any] = []
        self.out_shapes: list[tuple[Any, tuple[int, ...]]] = []
        self.out_spec: Any = None
        self.graph: Any = None
        self.exec_h: Any = None
        self.reason: str | None = None

    def close(self, group: StreamGroup) -> None:
        self.graph = None
        self.exec_h = None
        self.dev_args = None
        self.dev_out_views = []
        self.host_out_views = []
        self.runs = []
        for b in (self.dev_in, self.dev_out):
            if b is not None:
                b.close(group.compute)
        for h in (self.pinned_in, self.pinned_out):
            if h is not None:
                h.close()
        self.dev_in = self.dev_out = self.pinned_in = self.pinned_out = None


class ServedModel:
    """A model served by stream groups. Call it from any number of threads with host
    tensors (the same structure as ``example_inputs``); it returns host tensors.

    Attributes: ``config`` (:class:`RuntimeConfig`), ``manager`` (:class:`StreamManager`),
    ``fallbacks`` (input signature -> why it runs eagerly instead of as a CUDA graph).
    Close with :meth:`close` or use as a context manager; the model's weights are shared by
    all groups (one copy) and stay owned by the caller.
    """

    def __init__(self, model: Any, example_inputs: Any, config: RuntimeConfig, device: int,
                 max_signatures: int = 16) -> None:
        torch = _torch()
        self.torch = torch
        self.model = model
        self.config = config
        self.device = torch.device("cuda", device)
        self.max_signatures = max_signatures
        torch.cuda.init()
        self.manager = StreamManager(config.groups, device=device, merge=config.merge_streams,
                                     slots=config.slots_per_group,
                                     per_group_pool=config.per_stream_allocator,
                                     pool_limit_bytes=config.pool_limit_bytes)
        self._ext: dict[int, Any] = {}
        self._graph_pools: dict[int, Any] = {}
        for g in self.manager.groups:
            self._ext[g.index] = torch.cuda.ExternalStream(g.stream_handles[0], device=self.device)
            if config.per_stream_allocator:
                # one private graph pool per group: all of a group's graphs replay on its
                # compute stream, one after another, so they may share it safely
                self._graph_pools[g.index] = torch.cuda.graph_pool_handle()
        self.fallbacks: dict[str, str] = {}
        self._eager_sigs: dict[Any, str] = {}
        self._failed_graphs: list[Any] = []
        self._lock = threading.Lock()
        self.closed = False
        # prepare (and capture) every slot of every group for the example signature now,
        # so that client threads never pay a capture for the expected shape
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        leaves, spec = flatten(args, self._is_tensor)
        sig = self._signature(leaves, spec)
        try:
            for g in self.manager.groups:
                for slot in g.slots:
                    slot.entries[sig] = self._prepare(g, slot, sig, leaves, spec)
        except BaseException:
            self.close()
            raise

    # -- keys ----------------------------------------------------------------------------
    def _is_tensor(self, x: Any) -> bool:
        return isinstance(x, self.torch.Tensor)

    def _signature(self, leaves: Sequence[Any], spec: Any) -> Any:
        T = self.torch.Tensor
        return (spec, tuple((x.dtype, x.shape) if isinstance(x, T) else ("const", type(x).__name__, repr(x))
                            for x in leaves))

    # -- the hot path --------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        if self.closed:
            raise RuntimeCudaError("this served model is closed")
        leaves, spec = flatten(args, self._is_tensor)
        sig = self._signature(leaves, spec)
        # a free slot of the least-loaded group, or the oldest waiter's turn (FIFO)
        with self.manager.acquire_slot() as (g, slot):
            entry = slot.entries.get(sig)
            if entry is None:
                entry = self._prepare(g, slot, sig, leaves, spec)
                self._remember(g, slot, sig, entry)
            else:
                slot.entries.move_to_end(sig)
            return self._run(g, slot, entry, leaves)

    def _remember(self, g: StreamGroup, slot: Any, sig: Any, entry: _Entry) -> None:
        slot.entries[sig] = entry
        while len(slot.entries) > self.max_signatures:
            _, old = slot.entries.popitem(last=False)
            g.synchronize()
            old.close(g)

    def _pack(self, entry: _Entry, leaves: Sequence[Any]) -> None:
        stack = self.torch.stack
        for first, count, hv in entry.runs:
            if count == 1:
                hv.copy_(leaves[first])
            else:
                stack(leaves[first:first + count], out=hv)

    def _run(self, g: StreamGroup, slot: Any, entry: _Entry, leaves: Sequence[Any]) -> Any:
        d = _driver()
        ensure_context(self.manager.context)
        self._pack(entry, leaves)
        if entry.exec_h is not None and g.merge:
            check(d.cuGraphLaunch(entry.exec_h, g.compute_h), "cuGraphLaunch")
            g.record(slot.h_done, g.compute_h)
        else:
            self._h2d(g, slot, entry)
            if entry.exec_h is not None:
                check(d.cuGraphLaunch(entry.exec_h, g.compute_h), "cuGraphLaunch")
            else:
                raw = self._eager_forward(g, entry)
                if raw is not None:  # outputs do not fit the staged layout
                    return self._eager_unstaged(g, raw)
            self._d2h(g, slot, entry)
        check(d.cuEventSynchronize(slot.h_done), "cuEventSynchronize")
        return unflatten([v.clone() for v in entry.host_out_views], entry.out_spec)

    def _h2d(self, g: StreamGroup, slot: Any, entry: _Entry) -> None:
        d = _driver()
        check(d.cuMemcpyHtoDAsync(entry.dev_in.ptr, entry.pinned_in.ptr, entry.n_in, g.h2d_h), "cuMemcpyHtoDAsync")
        if not g.merge:
            g.record(slot.h_h2d, g.h2d_h)
            g.wait(g.compute_h, slot.h_h2d)

    def _d2h(self, g: StreamGroup, slot: Any, entry: _Entry) -> None:
        d = _driver()
        if not g.merge:
            g.record(slot.h_compute, g.compute_h)
            g.wait(g.d2h_h, slot.h_compute)
        check(d.cuMemcpyDtoHAsync(entry.pinned_out.ptr, entry.dev_out.ptr, entry.n_out, g.d2h_h), "cuMemcpyDtoHAsync")
        g.record(slot.h_done, g.d2h_h)

    def _eager_forward(self, g: StreamGroup, entry: _Entry) -> Any:
        """Run the model eagerly on the group's compute stream and stage its outputs.
        Returns None when staged, else the raw outputs (their shapes do not fit the layout
        staged for this input signature: data-dependent output shapes)."""
        torch = self.torch
        with torch.cuda.stream(self._ext[g.index]), torch.no_grad():
            raw = self.model(*entry.dev_args)
            outs, _ = flatten(raw, self._is_tensor)
            if [(o.dtype, tuple(o.shape)) for o in outs] != entry.out_shapes:
                return raw
            for dv, o in zip(entry.dev_out_views, outs):
                dv.copy_(o)
        return None

    def _eager_unstaged(self, g: StreamGroup, raw: Any) -> Any:
        torch = self.torch
        leaves, spec = flatten(raw, self._is_tensor)
        with torch.cuda.stream(self._ext[g.index]):
            host = [x.to("cpu") if isinstance(x, torch.Tensor) else x for x in leaves]  # synchronous
        return unflatten(host, spec)

    # -- preparing a slot for a signature --------------------------------------------------
    def _layout_of(self, tensors: Sequence[Any]) -> Any:
        return pack_layout([(str(t.dtype), tuple(t.shape), t.element_size()) for t in tensors])

    def _views(self, base: Any, layout: Any, tensors_meta: Sequence[tuple[Any, tuple[int, ...]]]) -> list[Any]:
        out = []
        for (dtype, shape), off, nb in zip(tensors_meta, layout.offsets, layout.nbytes_each):
            out.append(base[off:off + nb].view(dtype).view(shape))
        return out

    def _prepare(self, g: StreamGroup, slot: Any, sig: Any, leaves: Sequence[Any], spec: Any) -> _Entry:
        torch = self.torch
        ensure_context(self.manager.context)
        e = _Entry()
        try:
            tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
            if any(t.is_cuda for t in tensors):
                raise BadInputError("serve() takes host (CPU) tensors; the runtime does the copies")
            meta = [(t.dtype, tuple(t.shape)) for t in tensors]
            lay = self._layout_of(tensors)
            e.n_in = lay.nbytes
            e.pinned_in = HostBuffer(lay.nbytes)
            e.dev_in = g.allocate(lay.nbytes)
            hbase = torch.frombuffer(e.pinned_in.ctypes_view, dtype=torch.uint8)
            dbase = torch.as_tensor(e.dev_in, device=self.device)
            hviews = self._views(hbase, lay, meta)
            dviews = self._views(dbase, lay, meta)
            # the packing plan: one stacked view per run of equal tensors
            idx_of_leaf = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
            for first, count in lay.runs:
                if count == 1:
                    e.runs.append((idx_of_leaf[first], 1, hviews[first]))
                else:
                    dt, shp = meta[first]
                    off = lay.offsets[first]
                    nb = lay.nbytes_each[first] * count
                    e.runs.append((idx_of_leaf[first], count, hbase[off:off + nb].view(dt).view((count,) + shp)))
            it = iter(dviews)
            e.dev_args = unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
            # warm-up on the group's stream; it also tells the output layout
            self._pack(e, leaves)
            check(_driver().cuMemcpyHtoDAsync(e.dev_in.ptr, e.pinned_in.ptr, e.n_in, g.compute_h), "cuMemcpyHtoDAsync")
            ext = self._ext[g.index]
            with torch.cuda.stream(ext), torch.no_grad():
                outs, e.out_spec = flatten(self.model(*e.dev_args), self._is_tensor)
            if not outs or not all(isinstance(o, torch.Tensor) and o.is_cuda for o in outs):
                raise BadInputError("serve(): the model must return CUDA tensors (a tensor or a tuple/list/dict of them)")
            e.out_shapes = [(o.dtype, tuple(o.shape)) for o in outs]
            olay = self._layout_of(outs)
            e.n_out = olay.nbytes
            e.pinned_out = HostBuffer(olay.nbytes)
            e.dev_out = g.allocate(olay.nbytes)
            e.host_out_views = self._views(torch.frombuffer(e.pinned_out.ctypes_view, dtype=torch.uint8), olay, e.out_shapes)
            e.dev_out_views = self._views(torch.as_tensor(e.dev_out, device=self.device), olay, e.out_shapes)
            del outs
            ext.synchronize()
            if self.config.cuda_graphs and sig not in self._eager_sigs:
                self._capture(g, e, sig)
            elif not self.config.cuda_graphs:
                e.reason = "CUDA graphs disabled"
            else:
                e.reason = self._eager_sigs[sig]
            return e
        except BaseException:
            try:
                g.synchronize()
            finally:
                e.close(g)
            raise

    def _capture(self, g: StreamGroup, e: _Entry, sig: Any) -> None:
        torch = self.torch
        d = _driver()
        ext = self._ext[g.index]
        first: list[BaseException] = []
        with _CAPTURE_LOCK:
            try:
                with torch.no_grad():
                    # a second eager run on this stream: lazy inits (cuBLAS handles and
                    # workspaces for this stream) must not happen inside the capture. It
                    # runs with PyTorch's sync debug mode set to "error", so a model that
                    # synchronizes with the host (.item(), nonzero, ...) is found here and
                    # never enters a capture that would fail half-way
                    prev = torch.cuda.get_sync_debug_mode()
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        with torch.cuda.stream(ext):
                            self.model(*e.dev_args)
                    except RuntimeError as ex:
                        first.append(ex)
                        raise
                    finally:
                        torch.cuda.set_sync_debug_mode(prev)
                    ext.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self._graph_pools.get(g.index), stream=ext,
                                          capture_error_mode="thread_local"):
                        try:
                            if g.merge:
                                check(d.cuMemcpyHtoDAsync(e.dev_in.ptr, e.pinned_in.ptr, e.n_in, g.compute_h),
                                      "cuMemcpyHtoDAsync (captured)")
                            outs, _ = flatten(self.model(*e.dev_args), self._is_tensor)
                            if [(o.dtype, tuple(o.shape)) for o in outs] != e.out_shapes:
                                raise BadInputError("output shapes differ between runs with equal input shapes")
                            for dv, o in zip(e.dev_out_views, outs):
                                dv.copy_(o)
                            if g.merge:
                                check(d.cuMemcpyDtoHAsync(e.pinned_out.ptr, e.dev_out.ptr, e.n_out, g.compute_h),
                                      "cuMemcpyDtoHAsync (captured)")
                        except BaseException as ex:
                            first.append(ex)
                            raise
                e.graph = graph
                e.exec_h = d.CUgraphExec(int(graph.raw_cuda_graph_exec()))
            except Exception as ex:
                reason = _first_line(first[0] if first else ex)
                try:
                    torch.cuda.synchronize(self.device)
                except Exception:
                    pass
                if "graph" in locals():
                    # keep a failed capture's graph object alive: PyTorch's RNG state may
                    # still refer to it
                    self._failed_graphs.append(locals()["graph"])
                e.graph = None
                e.exec_h = None
                e.reason = f"CUDA graph capture failed, running eagerly: {reason}"
                with self._lock:
                    self._eager_sigs[sig] = e.reason
                    self.fallbacks[_sig_str(sig)] = e.reason

    # -- bookkeeping -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-group served counts, graph/eager entries, pool usage, fallbacks."""
        groups = []
        for g in self.manager.groups:
            entries = [e for s in g.slots for e in s.entries.values()]
            groups.append({"group": g.index, "served": g.served, "in_flight": g.in_flight,
                           "graphs": sum(1 for e in entries if e.exec_h is not None),
                           "eager": sum(1 for e in entries if e.exec_h is None)})
        return {"config": asdict(self.config), "groups": groups, "pools": self.manager.pool_stats(),
                "fallbacks": dict(self.fallbacks)}

    def close(self) -> None:
        """Wait for in-flight work, destroy graphs, free staging buffers, pools, streams."""
        if self.closed:
            return
        self.closed = True
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

    def __enter__(self) -> "ServedModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _sig_str(sig: Any) -> str:
    _, leaves = sig
    parts = []
    for x in leaves:
        if x and x[0] == "const":
            parts.append(str(x[2]))
        else:
            parts.append(f"{str(x[0]).replace('torch.', '')}{list(x[1])}")
    return "(" + ", ".join(parts) + ")"


def serve(model: Any, example_inputs: Any, groups: int | None = None, merge: bool | None = None,
          graphs: bool | None = None, *, plan: dict[str, Any] | None = None, device: int | None = None,
          slots_per_group: int | None = None, per_stream_allocator: bool | None = None,
          pool_limit_bytes: int | None = None, max_signatures: int = 16) -> ServedModel:
    """Serve ``model`` through stream groups; returns a thread-safe :class:`ServedModel`.

    ``example_inputs`` is the tuple of positional arguments of one query (host tensors,
    lists/tuples/dicts of them, constants); every group is prepared and, with ``graphs``,
    captured for its signature up front. Other signatures are captured on first use.
    Settings come from the arguments, else from ``plan`` (``advise``'s plan dict), else the
    :class:`RuntimeConfig` defaults. The model should be in eval mode: a replayed graph does
    not advance PyTorch's RNG.
    """
    torch = _torch()
    cfg = RuntimeConfig.from_plan(plan or {}, groups=groups, merge_streams=merge, cuda_graphs=graphs,
                                  slots_per_group=slots_per_group, per_stream_allocator=per_stream_allocator,
                                  pool_limit_bytes=pool_limit_bytes)
    if device is None:
        p = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        device = p.device.index if p is not None and p.is_cuda else torch.cuda.current_device()
    return ServedModel(model, example_inputs, cfg, int(device), max_signatures=max_signatures)


# ================================================================================ training

class BranchStreams:
    """Side streams for parallel training branches, created by cuda-python and bridged to
    PyTorch with ``torch.cuda.ExternalStream``. Owns them; ``close()`` or ``with``."""

    def __init__(self, n: int = 8, device: int | None = None, priority: int | None = None) -> None:
        torch = _torch()
        import cuda.core as cc

        if n < 1:
            raise BadInputError(f"need at least one branch stream, got {n}")
        self.torch = torch
        dev_id = torch.cuda.current_device() if device is None else device
        self.device = torch.device("cuda", dev_id)
        torch.cuda.init()
        with translating("cuStreamCreate (branch streams)"):
            cdev = cc.Device(dev_id)
            cdev.set_current()
            opts = cc.StreamOptions(nonblocking=True, priority=priority)
            self._streams = [cdev.create_stream(options=opts) for _ in range(n)]
        self.streams = [torch.cuda.ExternalStream(int(s.handle), device=self.device) for s in self._streams]
        self.closed = False

    def __len__(self) -> int:
        return len(self.streams)

    def stream(self, i: int) -> Any:
        return self.streams[i % len(self.streams)]

    @contextmanager
    def scope(self, i: int, include_grad: bool = True, inputs: Sequence[Any] = ()) -> Iterator["_Scope"]:
        """Run the block on branch stream ``i``: the stream first waits (event) for the
        current stream's work, the current stream waits for the branch at the end.
        Autograd runs each op's backward on the stream its forward ran on, so with
        ``include_grad`` the branch's backward runs on stream ``i`` too (the engine adds
        the cross-stream waits). With ``include_grad=False`` the branch runs under
        ``no_grad`` (a forward-only branch). ``inputs`` made on the current stream are
        marked as used by the branch so that the allocator does not hand their memory out
        while the branch still reads it; tensors returned to the caller should be passed
        to ``scope.returns(...)`` for the same reason the other way round."""
        torch = self.torch
        cur = torch.cuda.current_stream(self.device)
        side = self.stream(i)
        side.wait_stream(cur)
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(side)
        sc = _Scope(side, cur)
        with torch.cuda.stream(side):
            if include_grad:
                yield sc
            else:
                with torch.no_grad():
                    yield sc
        cur.wait_stream(side)
        for t in sc.out:
            t.record_stream(cur)

    def branches(self, modules: Sequence[Callable[..., Any]], *inputs: Any, include_grad: bool = True) -> list[Any]:
        """Run ``modules[k](*inputs)`` on branch stream ``k`` (mod the stream count), all
        in parallel; returns their outputs in order, safe to use on the current stream."""
        torch = self.torch
        cur = torch.cuda.current_stream(self.device)
        ev = torch.cuda.Event()
        ev.record(cur)
        tens = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda]
        outs: list[Any] = []
        used = []
        for k, m in enumerate(modules):
            side = self.stream(k)
            if all(side is not u for u in used):
                used.append(side)
                side.wait_event(ev)
                for t in tens:
                    t.record_stream(side)
            with torch.cuda.stream(side):
                if include_grad:
                    outs.append(m(*inputs))
                else:
                    with torch.no_grad():
                        outs.append(m(*inputs))
        for side in used:
            cur.wait_stream(side)
        for o in outs:
            for t in flatten(o, lambda x: isinstance(x, torch.Tensor))[0]:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(cur)
        return outs

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.torch.cuda.synchronize(self.device)
        self.streams = []
        for s in self._streams:
            with translating("cuStreamDestroy"):
                s.close()
        self._streams = []

    def __enter__(self) -> "BranchStreams":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Scope:
    def __init__(self, stream: Any, caller: Any) -> None:
        self.stream = stream
        self.caller = caller
        self.out: list[Any] = []

    def returns(self, *tensors: Any) -> Any:
        """Mark tensors made in the branch that the caller will use after the scope."""
        self.out.extend(t for t in tensors if getattr(t, "is_cuda", False))
        return tensors[0] if len(tensors) == 1 else tensors


_default: dict[int, BranchStreams] = {}
_default_lock = threading.Lock()


def default_branch_streams(n: int = 8, device: int | None = None) -> BranchStreams:
    """The process-wide branch streams of a device (at least ``n``), created on first use
    and closed at interpreter exit."""
    torch = _torch()
    dev = torch.cuda.current_device() if device is None else device
    with _default_lock:
        bs = _default.get(dev)
        if bs is None or len(bs) < n:
            if bs is not None:
                bs.close()
            bs = _default[dev] = BranchStreams(n, dev)
        return bs


def stream_scope(i: int, include_grad: bool = True, inputs: Sequence[Any] = ()) -> Any:
    """``with stream_scope(i):`` runs the block on the process-wide branch stream ``i``
    (see :meth:`BranchStreams.scope`)."""
    return default_branch_streams(i + 1).scope(i, include_grad=include_grad, inputs=inputs)


def parallel_branches(modules: Sequence[Callable[..., Any]], *inputs: Any,
                      streams: BranchStreams | None | bool = None, include_grad: bool = True) -> list[Any]:
    """Run each module on ``inputs`` as a parallel branch (see :meth:`BranchStreams.branches`).
    ``streams=False`` runs them one after another on the current stream (the single-stream
    reference); ``None`` uses the process-wide branch streams."""
    if streams is False:
        return [m(*inputs) for m in modules]
    bs = default_branch_streams(max(1, len(modules))) if streams is None or streams is True else streams
    return bs.branches(modules, *inputs, include_grad=include_grad)


import atexit  # noqa: E402


@atexit.register
def _close_defaults() -> None:  # pragma: no cover - interpreter exit
    for bs in list(_default.values()):
        try:
            bs.close()
        except Exception:
            pass
    _default.clear()
