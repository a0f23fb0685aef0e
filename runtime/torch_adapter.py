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

import contextlib
import ctypes
import threading
from dataclasses import asdict
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from ..errors import BadInputError, RuntimeCudaError
from ..errors import first_line as _first_line
from ._cuda import check, ensure_context, translating
from ._policy import RuntimeConfig, flatten, pack_layout, unflatten
from ._streams import HostBuffer, StreamGroup, StreamManager

__all__ = ["serve", "ServedModel", "Request", "BranchStreams", "stream_scope", "parallel_branches",
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
        #: one pinned view per tensor leaf (what ``_foreach_copy_`` packs into), the
        #: positions of the tensor leaves, and whether every leaf is a tensor
        self.host_in_views: list[Any] = []
        self.tensor_pos: list[int] = []
        self.all_tensors = True
        #: zero-copy access: the inputs' structure over the pinned views, the whole
        #: pinned input as bytes, and its layout
        self.inputs: Any = None
        self.in_bytes: Any = None
        self.layout: Any = None
        self.outputs: Any = None
        self.dev_args: Any = None
        self.dev_out_views: list[Any] = []
        self.host_out_views: list[Any] = []
        self.out_shapes: list[tuple[Any, tuple[int, ...]]] = []
        self.out_spec: Any = None
        self.graph: Any = None
        self.exec_h: Any = None
        self.exec_i = 0  # the graph exec as an int (0: none), for the ctypes hot path
        self.reason: str | None = None

    def close(self, group: StreamGroup) -> None:
        self.graph = None
        self.exec_h = None
        self.exec_i = 0
        self.inputs = self.outputs = self.in_bytes = None
        self.host_in_views = []
        self.dev_args = None
        self.dev_out_views = []
        self.host_out_views = []
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
                                     slots=config.slots_per_group, probe_idle=False,
                                     per_group_pool=config.per_stream_allocator,
                                     pool_limit_bytes=config.pool_limit_bytes)
        self._groups = self.manager.groups
        self._pool = self.manager._slots
        self._fp = self.manager.fast
        self._ext: dict[int, Any] = {}
        self._graph_pools: dict[int, Any] = {}
        self._mem_pools: dict[int, Any] = {}
        #: where a group's activations come from: "group" (a private pool per group) or
        #: "shared" (PyTorch's caching allocator, shared by all groups)
        self.activation_pool = "shared"
        for g in self.manager.groups:
            self._ext[g.index] = torch.cuda.ExternalStream(g.stream_handles[0], device=self.device)
            if config.per_stream_allocator:
                # private pools for the group's activations, one per slot: a slot's eager
                # forwards allocate from its pool (``use_mem_pool`` routes the running
                # thread's allocations) and its graphs are captured into it. One per slot,
                # not one per group, because PyTorch lets only one thread at a time route
                # allocations to a pool, and a slot is used by one query at a time.
                for slot in g.slots:
                    key = (g.index, slot.index)
                    if _has_mem_pool(torch):
                        self._mem_pools[key] = torch.cuda.MemPool()
                        self._graph_pools[key] = self._mem_pools[key].id
                    else:  # pragma: no cover - torch < 2.6
                        self._graph_pools[key] = torch.cuda.graph_pool_handle()
                self.activation_pool = "group"
        #: merged groups: the H2D and D2H copies inside each query's graph (one launch) or
        #: enqueued around it (``RECSYS_DOCTOR_GRAPH_COPIES=outside``: three hot-path calls,
        #: as a hand-written server does; for measuring which the GPU runs faster)
        self.copies_in_graph = _graph_copies_inside()
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
        self._example = (leaves, spec, sig)
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
        """One query: host tensors in (the structure of ``example_inputs``), host tensors
        out. Packs the inputs into a free slot's pinned staging (one ``_foreach_copy_``),
        replays the slot's graph, waits for that query only, returns copies of the
        outputs."""
        if self.closed:
            raise RuntimeCudaError("this served model is closed")
        leaves, spec = flatten(args, self._is_tensor)
        sig = self._signature(leaves, spec)
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
            return unflatten([v.clone() for v in entry.host_out_views], entry.out_spec)
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
            leaves, spec = flatten(like, self._is_tensor)
            sig = self._signature(leaves, spec)
        else:
            leaves, spec, sig = self._example
        i, slot = self._pool.acquire()
        g = self._groups[i]
        try:
            entry = self._entry(g, slot, sig, leaves, spec)
        except BaseException:
            self._pool.release(i, slot)
            raise
        return Request(self, i, g, slot, entry)

    def _entry(self, g: StreamGroup, slot: Any, sig: Any, leaves: Sequence[Any], spec: Any) -> _Entry:
        entry = slot.entries.get(sig)
        if entry is None:
            entry = self._prepare(g, slot, sig, leaves, spec)
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
        self._fp.htod(entry.dev_in.ptr, entry.pinned_in.ptr, entry.n_in, g.h2d_i)
        if not g.merge:
            self._fp.record(slot.h2d_i, g.h2d_i)
            g.wait(g.compute_h, slot.h_h2d)

    def _d2h(self, g: StreamGroup, slot: Any, entry: _Entry) -> None:
        if not g.merge:
            g.record(slot.h_compute, g.compute_h)
            g.wait(g.d2h_h, slot.h_compute)
        self._fp.dtoh(entry.pinned_out.ptr, entry.dev_out.ptr, entry.n_out, g.d2h_i)
        self._fp.record(slot.done_i, g.d2h_i)

    def _eager_forward(self, g: StreamGroup, slot: Any, entry: _Entry) -> Any:
        """Run the model eagerly on the group's compute stream and stage its outputs.
        Returns None when staged, else the raw outputs (their shapes do not fit the layout
        staged for this input signature: data-dependent output shapes)."""
        torch = self.torch
        with torch.cuda.stream(self._ext[g.index]), torch.no_grad(), self._activations(g, slot):
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
            e.host_in_views = hviews
            e.tensor_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
            e.all_tensors = len(e.tensor_pos) == len(leaves)
            e.layout = lay
            e.in_bytes = hbase
            ith = iter(hviews)
            e.inputs = unflatten([next(ith) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
            it = iter(dviews)
            e.dev_args = unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
            # warm-up on the group's stream; it also tells the output layout
            self._pack(e, leaves)
            check(_driver().cuMemcpyHtoDAsync(e.dev_in.ptr, e.pinned_in.ptr, e.n_in, g.compute_h), "cuMemcpyHtoDAsync")
            ext = self._ext[g.index]
            with torch.cuda.stream(ext), torch.no_grad(), self._activations(g, slot):
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
            e.outputs = unflatten(list(e.host_out_views), e.out_spec)
            del outs
            ext.synchronize()
            if self.config.cuda_graphs and sig not in self._eager_sigs:
                self._capture(g, slot, e, sig)
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

    def _capture(self, g: StreamGroup, slot: Any, e: _Entry, sig: Any) -> None:
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
                        with torch.cuda.stream(ext), self._activations(g, slot):
                            self.model(*e.dev_args)
                    except RuntimeError as ex:
                        first.append(ex)
                        raise
                    finally:
                        torch.cuda.set_sync_debug_mode(prev)
                    ext.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self._graph_pools.get((g.index, slot.index)), stream=ext,
                                          capture_error_mode="thread_local"):
                        try:
                            if g.merge and self.copies_in_graph:
                                check(d.cuMemcpyHtoDAsync(e.dev_in.ptr, e.pinned_in.ptr, e.n_in, g.compute_h),
                                      "cuMemcpyHtoDAsync (captured)")
                            outs, _ = flatten(self.model(*e.dev_args), self._is_tensor)
                            if [(o.dtype, tuple(o.shape)) for o in outs] != e.out_shapes:
                                raise BadInputError("output shapes differ between runs with equal input shapes")
                            for dv, o in zip(e.dev_out_views, outs):
                                dv.copy_(o)
                            if g.merge and self.copies_in_graph:
                                check(d.cuMemcpyDtoHAsync(e.pinned_out.ptr, e.dev_out.ptr, e.n_out, g.compute_h),
                                      "cuMemcpyDtoHAsync (captured)")
                        except BaseException as ex:
                            first.append(ex)
                            raise
                e.graph = graph
                e.exec_i = int(graph.raw_cuda_graph_exec())
                e.exec_h = d.CUgraphExec(e.exec_i)
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
                e.exec_i = 0
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
            groups.append({"group": g.index, "served": self._pool.served[g.index],
                           "in_flight": self._pool.in_use[g.index],
                           "graphs": sum(1 for e in entries if e.exec_h is not None),
                           "eager": sum(1 for e in entries if e.exec_h is None)})
        return {"config": asdict(self.config), "groups": groups, "pools": self.manager.pool_stats(),
                "activation_pool": self.activation_pool, "activation_pool_bytes": self._activation_bytes(),
                "driver_path": self._fp.source, "copies_in_graph": self.copies_in_graph,
                "fallbacks": dict(self.fallbacks)}

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
        except Exception:
            pass


#: returned by ``_execute`` when the outputs are in the slot's staged views
_STAGED = object()

#: ``memmove`` that keeps the GIL (PYFUNCTYPE): copies of tens of kB take microseconds
_memmove = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes._memmove_addr)  # type: ignore[attr-defined]


def _graph_copies_inside() -> bool:
    import os

    v = os.environ.get("RECSYS_DOCTOR_GRAPH_COPIES", "inside")
    if v not in ("inside", "outside"):
        raise BadInputError(f"RECSYS_DOCTOR_GRAPH_COPIES must be inside or outside, got {v!r}")
    return v == "inside"


def _has_mem_pool(torch: Any) -> bool:
    return hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")


class Request:
    """One query on a slot that the client fills in place (see :meth:`ServedModel.request`).

    ``inputs``: the query's host tensors (pinned views, structured like
    ``example_inputs``); ``buffer``: the same bytes as one flat uint8 tensor; ``layout``:
    where each input tensor sits in it (:class:`~recsys_doctor.runtime.PackedLayout`).
    :meth:`run` may be called more than once; :meth:`close` (or leaving the ``with``
    block) gives the slot back, after which the views must not be used.
    """

    __slots__ = ("_served", "_i", "_g", "_slot", "_entry", "inputs", "buffer", "layout", "_open")

    #: host-to-pinned copies of :meth:`load` (ctypes ``memmove``, GIL kept)

    def __init__(self, served: ServedModel, i: int, g: StreamGroup, slot: Any, entry: _Entry) -> None:
        self._served = served
        self._i = i
        self._g = g
        self._slot = slot
        self._entry = entry
        self.inputs = entry.inputs
        self.buffer = entry.in_bytes[:entry.n_in]
        self.layout = entry.layout
        self._open = True

    def load(self, src: Any) -> None:
        """Copy one packed query (``layout.nbytes`` bytes or fewer, laid out as ``layout``)
        into the slot's pinned input: a host tensor (contiguous), or any object with the
        buffer protocol (``bytes``, ``bytearray``, a NumPy array, ``memoryview``). One
        ``memmove`` that keeps the GIL: a few microseconds for a typical query, no
        thread pool (``Tensor.copy_`` of a large byte tensor wakes PyTorch's intra-op
        threads, which costs more than the copy with many client threads)."""
        if not self._open:
            raise RuntimeCudaError("this request is closed")
        torch = self._served.torch
        if isinstance(src, torch.Tensor):
            if src.is_cuda or not src.is_contiguous():
                raise BadInputError("load() takes a contiguous host tensor")
            ptr, n = src.data_ptr(), src.numel() * src.element_size()
        else:
            mv = memoryview(src)
            if not mv.c_contiguous:
                raise BadInputError("load() takes a contiguous buffer")
            n = mv.nbytes
            if isinstance(src, bytes):  # points into src itself, which the caller holds
                ptr = ctypes.cast(ctypes.c_char_p(src), ctypes.c_void_p).value
            elif mv.readonly:
                raise BadInputError("load() takes bytes, a writable buffer or a host tensor")
            else:
                ptr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        if n > self._entry.n_in:
            raise BadInputError(f"load(): {n} bytes do not fit the slot's {self._entry.n_in}-byte input")
        _memmove(self._entry.pinned_in.ptr, ptr, n)

    def run(self) -> Any:
        """Copy the staged inputs to the GPU, run the model, bring the outputs back and
        wait for this query only. Returns pinned host views of the outputs (valid until
        the request is closed), or, for a model whose output shapes changed, host copies."""
        if not self._open:
            raise RuntimeCudaError("this request is closed")
        raw = self._served._execute(self._g, self._slot, self._entry)
        return self._entry.outputs if raw is _STAGED else raw

    def close(self) -> None:
        if self._open:
            self._open = False
            self._g._last_done = self._slot.done_i
            self._served._pool.release(self._i, self._slot)

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
