"""Preparing one slot of a served model for one input signature: the slot's pinned and
device staging buffers with per-tensor views of them, a warm-up forward that tells the
output layout, and the CUDA graph capture (H2D copy, forward, output copy and D2H copy in
one graph on merged groups). The hot path that runs an entry is in :mod:`.serving`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Any, Iterator, Sequence

from ..errors import BadInputError
from ..errors import first_line as _first_line
from ._branches import branched, capture_branched
from ._cuda import check, ensure_context
from ._policy import pack_layout, unflatten
from ._policy import out_flatten, out_unflatten
from ._streams import HostBuffer, StreamGroup, _driver

#: CUDA graph captures are serialized process-wide: two captures at once in thread-local
#: mode are legal, but a capture's device-wide synchronize and allocator bookkeeping are
#: cheaper to reason about one at a time, and captures are rare (once per group and shape).
_CAPTURE_LOCK = threading.Lock()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off in every thread, as it was again after: around a CUDA
    graph capture. A collection that an allocation starts inside a capture can free an object
    whose finalizer calls CUDA (an earlier graph's ``cudaGraphExecDestroy``, a pool), which a
    capture forbids: the finalizer swallows the error and the capture fails later with
    "operation failed due to a previous error during capture". The script hook's captures
    use it too (``_autoapply/graphs.py``)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """A capture's span: under :data:`_CAPTURE_LOCK`, with the garbage collector paused
    (:func:`gc_paused`)."""
    with _CAPTURE_LOCK, gc_paused():
        yield


class Entry:
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

    @property
    def pin_in(self) -> HostBuffer:
        """The pinned input buffer (staged before any copy reads it)."""
        if self.pinned_in is None:
            raise RuntimeError("the entry's inputs are not staged")
        return self.pinned_in

    @property
    def pin_out(self) -> HostBuffer:
        """The pinned output buffer (staged with the inputs)."""
        if self.pinned_out is None:
            raise RuntimeError("the entry's outputs are not staged")
        return self.pinned_out


#: returned by ``ServedModel._execute`` when the outputs are in the slot's staged views
STAGED = object()


def graph_copies_inside() -> bool:
    """``RECSYS_DOCTOR_GRAPH_COPIES``: the H2D/D2H copies inside each query's graph
    (``inside``, the default) or enqueued around it (``outside``)."""
    v = os.environ.get("RECSYS_DOCTOR_GRAPH_COPIES", "inside")
    if v not in ("inside", "outside"):
        raise BadInputError(f"RECSYS_DOCTOR_GRAPH_COPIES must be inside or outside, got {v!r}")
    return v == "inside"


def has_mem_pool(torch: Any) -> bool:
    return hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")


def sig_str(sig: Any) -> str:
    """An input signature as people write it: ``(float32[256, 13], 42)``."""
    _, leaves = sig
    parts = []
    for x in leaves:
        if x and x[0] == "const":
            parts.append(str(x[2]))
        else:
            parts.append(f"{str(x[0]).replace('torch.', '')}{list(x[1])}")
    return "(" + ", ".join(parts) + ")"


# ------------------------------------------------------------------------------ staging

def _layout_of(tensors: Sequence[Any]) -> Any:
    return pack_layout([(str(t.dtype), tuple(t.shape), t.element_size()) for t in tensors])


def _views(base: Any, layout: Any, tensors_meta: Sequence[tuple[Any, tuple[int, ...]]]) -> list[Any]:
    return [base[off:off + nb].view(dtype).view(shape)
            for (dtype, shape), off, nb in zip(tensors_meta, layout.offsets, layout.nbytes_each)]


def _stage_inputs(sm: Any, g: StreamGroup, e: Entry, leaves: Sequence[Any], spec: Any) -> None:
    """The pinned and device input buffers of ``e`` and the views of both."""
    torch = sm.torch
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if any(t.is_cuda for t in tensors):
        raise BadInputError("serve() takes host (CPU) tensors; the runtime does the copies")
    meta = [(t.dtype, tuple(t.shape)) for t in tensors]
    lay = _layout_of(tensors)
    e.n_in = lay.nbytes
    e.pinned_in = HostBuffer(lay.nbytes)
    e.dev_in = g.allocate(lay.nbytes)
    hbase = torch.frombuffer(e.pinned_in.ctypes_view, dtype=torch.uint8)
    hviews = _views(hbase, lay, meta)
    dviews = _views(torch.as_tensor(e.dev_in, device=sm.device), lay, meta)
    e.host_in_views = hviews
    e.tensor_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    e.all_tensors = len(e.tensor_pos) == len(leaves)
    e.layout = lay
    e.in_bytes = hbase
    ith = iter(hviews)
    e.inputs = unflatten([next(ith) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
    it = iter(dviews)
    e.dev_args = unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def _stage_outputs(sm: Any, g: StreamGroup, e: Entry, outs: Sequence[Any]) -> None:
    """The pinned and device output buffers of ``e``, laid out for ``outs``."""
    torch = sm.torch
    if not outs or not all(isinstance(o, torch.Tensor) and o.is_cuda for o in outs):
        raise BadInputError("serve(): the model must return CUDA tensors (a tensor or a tuple/list/dict of them)")
    e.out_shapes = [(o.dtype, tuple(o.shape)) for o in outs]
    olay = _layout_of(outs)
    e.n_out = olay.nbytes
    e.pinned_out = HostBuffer(olay.nbytes)
    e.dev_out = g.allocate(olay.nbytes)
    e.host_out_views = _views(torch.frombuffer(e.pinned_out.ctypes_view, dtype=torch.uint8), olay, e.out_shapes)
    e.dev_out_views = _views(torch.as_tensor(e.dev_out, device=sm.device), olay, e.out_shapes)
    e.outputs = out_unflatten(list(e.host_out_views), e.out_spec)


def prepare(sm: Any, g: StreamGroup, slot: Any, sig: Any, leaves: Sequence[Any], spec: Any) -> Entry:
    """A ready entry of ``g``'s ``slot`` for ``sig``: staged, warmed up and, with graphs
    on, captured (or running eagerly with the reason)."""
    torch = sm.torch
    ensure_context(sm.manager.context)
    e = Entry()
    try:
        _stage_inputs(sm, g, e, leaves, spec)
        # warm-up on the group's stream; it also tells the output layout
        sm._pack(e, leaves)
        check(_driver().cuMemcpyHtoDAsync(e.dev_in.ptr, e.pin_in.ptr, e.n_in, g.compute_h), "cuMemcpyHtoDAsync")
        ext = sm._ext[g.index]
        with torch.cuda.stream(ext), torch.no_grad(), sm._activations(g, slot):
            outs, e.out_spec = out_flatten(sm.model(*e.dev_args))
        _stage_outputs(sm, g, e, outs)
        del outs
        ext.synchronize()
        if sm.config.cuda_graphs and sig not in sm._eager_sigs:
            capture(sm, g, slot, e, sig)
        elif not sm.config.cuda_graphs:
            e.reason = "CUDA graphs disabled"
        else:
            e.reason = sm._eager_sigs[sig]
        return e
    except BaseException:  # noqa: BLE001 - the entry is closed, the error re-raised
        try:
            g.synchronize()
        finally:
            e.close(g)
        raise


# ------------------------------------------------------------------------------ capture

def _second_eager_run(sm: Any, g: StreamGroup, slot: Any, e: Entry, first: list[BaseException],
                      side: list[Any]) -> None:
    """A second eager run on the group's stream (and the branch streams ``side``): lazy
    inits (cuBLAS handles and workspaces for these streams) must not happen inside the capture. It runs
    under :func:`host_syncs`, so a model that synchronizes with the host (.item(), nonzero, a
    copy to the CPU, ...) is found here and never enters a capture that would fail half-way;
    one that does so otherwise (``torch.cuda.synchronize()`` in forward) fails its capture,
    which :func:`capture` handles the same way."""
    torch = sm.torch
    ext = sm._ext[g.index]
    try:
        with torch.cuda.stream(ext), sm._activations(g, slot), branched(side), host_syncs(torch):
            sm.model(*e.dev_args)
    except RuntimeError as ex:
        first.append(ex)
        raise
    ext.synchronize()


#: operators that wait for the GPU whatever their arguments (``.item()``, ``bool()``,
#: ``.tolist()``; outputs whose size depends on the data)
_ALWAYS_SYNC = ("_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
                "unique_consecutive", "unique_dim_consecutive", "equal", "is_nonzero")


def host_syncs(torch: Any) -> Any:
    """A context in which an operator that synchronizes a CUDA stream with the host raises
    ``RuntimeError("called a synchronizing CUDA operation: ...")`` before it runs: the
    operators of :data:`_ALWAYS_SYNC` on a GPU tensor, ``index`` with a boolean mask,
    ``repeat_interleave`` without ``output_size``, and copies between the host and the GPU
    (``.cpu()``, ``.to()``, ``copy_``) except non-blocking ones from or to pinned memory, which
    a graph holds. A dispatch mode, so it sees this thread's operators only: PyTorch's sync debug
    mode, used before, is one flag for the whole process, and while it was set another thread's
    synchronization (a client's ``.cpu()``) raised (``bench/apply/results/served_route_h100/``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    T = torch.Tensor

    def on_gpu(args: Any) -> bool:
        return any(isinstance(a, T) and a.is_cuda for a in args)

    def copy_syncs(dst_type: str, src: Any, non_blocking: bool, host: Any) -> bool:
        if {dst_type, src.device.type} != {"cuda", "cpu"}:
            return False
        return not non_blocking or (host is not None and not host.is_pinned())

    def syncs(name: str, args: Any, kwargs: dict[str, Any]) -> bool:
        if name == "_to_copy" and args and isinstance(args[0], T):
            dev = kwargs.get("device")
            src = args[0]
            # (a non-blocking copy to the host lands in pinned memory PyTorch allocates)
            return dev is not None and copy_syncs(torch.device(dev).type, src, bool(kwargs.get("non_blocking")),
                                                  src if src.device.type == "cpu" else None)
        if name == "copy_" and len(args) > 1 and isinstance(args[0], T) and isinstance(args[1], T):
            dst, src = args[0], args[1]
            nb = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            return copy_syncs(dst.device.type, src, nb, src if src.device.type == "cpu" else dst)
        if not on_gpu((*args, *kwargs.values())):
            return False
        if name == "index" and len(args) > 1:
            return any(isinstance(i, T) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
        if name == "repeat_interleave":
            return kwargs.get("output_size") is None and (len(args) == 1 or isinstance(args[1], T))
        return name in _ALWAYS_SYNC

    class _HostSyncs(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if syncs(name, args, kwargs):
                raise RuntimeError(f"called a synchronizing CUDA operation: aten.{name}")
            return func(*args, **kwargs)

    from ._modes import unwrapped_dispatch

    return unwrapped_dispatch(_HostSyncs)()  # (no torch._dynamo import on its first operator: ._modes)


def _captured_query(sm: Any, g: StreamGroup, e: Entry, side: list[Any]) -> None:
    """What a query's graph holds: (H2D copy,) forward (its branches on ``side`` too,
    :mod:`._branches`), output copies (, D2H copy)."""
    d = _driver()
    copies = g.merge and sm.copies_in_graph
    if copies:
        check(d.cuMemcpyHtoDAsync(e.dev_in.ptr, e.pin_in.ptr, e.n_in, g.compute_h), "cuMemcpyHtoDAsync (captured)")
    with branched(side):
        outs, _ = out_flatten(sm.model(*e.dev_args))
    if [(o.dtype, tuple(o.shape)) for o in outs] != e.out_shapes:
        raise BadInputError("output shapes differ between runs with equal input shapes")
    for dv, o in zip(e.dev_out_views, outs):
        dv.copy_(o)
    if copies:
        check(d.cuMemcpyDtoHAsync(e.pin_out.ptr, e.dev_out.ptr, e.n_out, g.compute_h), "cuMemcpyDtoHAsync (captured)")


def capture(sm: Any, g: StreamGroup, slot: Any, e: Entry, sig: Any) -> None:
    """Capture ``e``'s query into a CUDA graph in the slot's activation pool, its forward's
    branches on its group's branch streams (:mod:`._branches`); where that fails,
    on the group's stream alone (the reason kept in ``sm.branch_fallbacks``); where that
    fails too, ``e`` runs eagerly and the reason is kept in ``sm.fallbacks``."""
    first: list[BaseException] = []

    def failed(ex: BaseException) -> bool:
        if _sync_in_model(first):  # no capture can hold it, on any number of streams
            return False
        sm.torch.cuda.synchronize(sm.device)
        sm.branch_fallbacks[sig_str(sig)] = _first_line(first[0] if first else ex)
        first.clear()
        return True

    with capturing():
        try:
            graph = capture_branched(sm.torch, sm._sides[g.index], lambda side: _capture_on(sm, g, slot, e, first, side),
                                     failed)
            e.graph = graph
            e.exec_i = int(graph.raw_cuda_graph_exec())
            e.exec_h = _driver().CUgraphExec(e.exec_i)
        except Exception as ex:  # noqa: BLE001 - any capture failure: the eager path, with the reason
            _fall_back(sm, e, sig, _first_line(first[0] if first else ex))


def _capture_on(sm: Any, g: StreamGroup, slot: Any, e: Entry, first: list[BaseException], side: list[Any]) -> Any:
    """``e``'s query captured on the group's stream, its forward's branches on ``side``."""
    with sm.torch.no_grad():
        _second_eager_run(sm, g, slot, e, first, side)

        def query() -> None:
            try:
                _captured_query(sm, g, e, side)
            except BaseException as ex:  # noqa: BLE001 - kept as the reason, re-raised
                first.append(ex)
                raise

        return graph_of(sm, sm._graph_pools.get((g.index, slot.index)), sm._ext[g.index], query)


def graph_of(sm: Any, pool: Any, stream: Any, body: Any) -> Any:
    """A new CUDA graph of ``body()`` captured on ``stream`` into ``pool``. Where the capture
    fails, the graph object stays alive with served model ``sm`` (PyTorch's RNG state may
    still refer to it) and the error is raised. Both capture sites (a query signature, a
    batch bucket) capture through it."""
    torch = sm.torch
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            body()
    except BaseException:
        sm._failed_graphs.append(graph)
        raise
    return graph


def _sync_in_model(first: list[BaseException]) -> bool:
    """Whether the eager run found the model synchronizing with the host: no capture can
    hold it, on any number of streams."""
    return bool(first) and "synchroniz" in str(first[0]).lower()


def _fall_back(sm: Any, e: Entry, sig: Any, reason: str) -> None:
    try:
        sm.torch.cuda.synchronize(sm.device)
    except RuntimeError:  # a sticky CUDA error (torch.AcceleratorError is one): the fallback goes on
        pass
    e.graph = None
    e.exec_h = None
    e.exec_i = 0
    e.reason = f"CUDA graph capture failed, running eagerly: {reason}"
    with sm._lock:
        sm._eager_sigs[sig] = e.reason
        sm.fallbacks[sig_str(sig)] = e.reason
