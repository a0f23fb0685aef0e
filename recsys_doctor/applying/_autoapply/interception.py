"""Interception: what the hook patches - ``threading.Thread``'s start (a thread joins a group's
stream, one of the runtime's) and ``nn.Module.__call__`` (a top-level call goes to the graphs)."""

from __future__ import annotations

import threading
from typing import Any

from ._common import _lock, _state, _tls, _torch
from .accounting import counted_here, script_site
from .amp import amp_call, autocast_dtype
from .batching import _batched_call
from . import copyinto, lentout, meter, modstate, trainers
from .graphs import _eager, _graphed_call
from .groups import _Group, _run_shared, _streams
from .host_args import make_host_type, take
from .pageable_fast import capture_probe
from .pageable import cuda_args, to_args
from .report import snapshots_in_child
from .served import call as served_call
from .staging import _patch_copies, _ThreadCopies, slots_read
from .thread_graphs import _copies_call, flush, thread_ended


#: why a model call stays PyTorch's where its model is on another GPU than its thread's group
#: (one thread calling replicas on two GPUs: its group, and so its graphs, are on one of them)
OTHER_DEVICE = "the model is on another GPU than its thread's group (a thread calling models on several GPUs)"


def _cuda_torch() -> Any:
    """PyTorch where the hook is active and CUDA is up (a thread starting now would be placed),
    else None."""
    torch = _torch()
    if torch is None or not _state["active"]:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except (RuntimeError, AttributeError):  # a torch without CUDA (or a broken one): nothing to do
        return None


def _group_for_new_thread(dev: int | None = None) -> _Group | None:
    """The next plan group, in start order, on CUDA device ``dev`` (default: the current one;
    each device's threads take its groups in turn: :func:`.groups._streams`)."""
    torch = _cuda_torch()
    if torch is None:
        return None
    with _lock:
        streams = _streams(torch, dev)
        if streams is None:
            return None
        if streams is _state.get("streams"):  # (the first device's: counted and keyed as always)
            i = _state["started"]
            key: Any = i % _state["n_groups"]
        else:
            d = streams.device.index
            by_dev = _state.setdefault("started_by_dev", {})
            i = by_dev[d] = by_dev.get(d, 0)
            by_dev[d] += 1
            key = (d, i % _state["n_groups"])
        _state["started"] += 1
        groups = _state["groups"]
        k = i % _state["n_groups"]
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(k, streams.streams[k], streams)  # type: ignore[union-attr]
        if not _state["patched_module"]:
            _patch_module(torch)
        if not _state.get("patched_copies"):
            _patch_thread_copies(torch)
    snapshots_in_child()
    return g


def on_torch_imported(torch: Any) -> None:
    """Patch ``nn.Module.__call__`` as soon as PyTorch is imported (:mod:`.importwatch`), where
    the plan graphs: a thread never placed in a group at its start can then be placed at its
    first model call (:func:`_late_group`)."""
    with _lock:
        if _state.get("active") and _state.get("graphs") and not _state["patched_module"]:
            _patch_module(torch)


def _module_device(module: Any) -> int | None:
    """The CUDA device of ``module``'s first parameter or buffer (None: none, or on the CPU)."""
    devs = modstate.cuda_devices(module)
    return devs[0] if devs else None


def _late_group(torch: Any, module: Any = None) -> _Group | None:
    """A group for a thread that was not placed when it started, made at its first top-level
    model call: the main thread of a single-threaded loop or of an asyncio server that calls the
    model inline, or, placed at their start (``RECSYS_DOCTOR_PLACE=start``, or no graphs), a
    thread started before CUDA was initialized. Its group is its own (no
    other thread shares its graphs), on the stream the thread is on on its model's GPU (its current stream is left
    as it is: the tensors it made before were made there), with its own captures and replays
    as every group's; no batching (one thread) and no thread graph of its copies. None where
    the thread stays as it is (the hook's own threads, no CUDA yet, no stream groups)."""
    if not _state["active"] or not _state["graphs"] or getattr(_tls, "outer", False):
        return None
    try:
        if not torch.cuda.is_initialized():
            return None  # (asked again at the next call: CUDA may start later)
    except (RuntimeError, AttributeError):
        _tls.unplaced = _state["activation"]
        return None
    if _runtime_thread(threading.current_thread()):
        _tls.unplaced = _state["activation"]
        return None
    dev = _module_device(module)
    if dev is None:
        dev = torch.cuda.current_device()
    with _lock:
        streams = _streams(torch, dev)
        if streams is None:
            _tls.unplaced = _state["activation"]
            return None
        n = _state["late_threads"] = _state.get("late_threads", 0) + 1
        g = _Group(_state["n_groups"] + n - 1, torch.cuda.current_stream(dev), streams)
        _state.setdefault("late_groups", []).append(g)
    snapshots_in_child()
    g.late = _state["activation"]
    _join(g, copies=False)
    return g


def _join(g: _Group, copies: bool) -> None:
    """This thread is placed in group ``g`` from now on, with a copy state where ``copies``
    (:class:`.staging._ThreadCopies`: the thread graphs of its copies)."""
    _tls.group = g
    _tls.depth = 0
    _tls.copies = _ThreadCopies(g.stream) if copies else None


def _runtime_thread(t: threading.Thread) -> bool:
    """Whether ``t`` is a thread of the runtime's (a batch driver of a model served for the hook,
    :mod:`.served`): it runs the runtime's work, not the script's, and joins no group."""
    if getattr(t, "rd_hook_thread", False):  # (the hook's own: .report's snapshots)
        return True
    target = getattr(t, "_target", None)
    return type(getattr(target, "__self__", None)).__module__.startswith("recsys_doctor.runtime")


def _place_deferred(torch: Any, module: Any = None) -> _Group | None:
    """Place a thread whose placement waited for its first top-level model call: the next
    plan group (the start order of :func:`_group_for_new_thread`, counted at first calls), its
    copy state, and the group's stream as the thread's current stream from now on - unless the
    script set a stream of its own around the call (then its replays run there, ordered as
    :meth:`.groups._Group.before_replay` says, and the thread stays where it was between calls).

    Why wait: a thread that never calls a model (a feature thread putting GPU tensors on a
    queue for the model threads, a post-processing thread) then stays on PyTorch's default
    stream, and the group streams are blocking, so what it hands over is ordered with the model
    threads' work as it was unhooked; placed at its start on a group stream of its own, its
    kernels and the model threads' reads of their results were on two streams with nothing
    between them (``examples/heldout/feature_pipeline_serve.py``). A call before CUDA is up
    (a thread started before it, calling a model on the CPU) places nothing: asked again at
    the next call; nor does a call nested in such a call (CUDA may come up inside it)."""
    if getattr(_tls, "outer", False) or _cuda_torch() is None:
        return None
    del _tls.defer
    g = _group_for_new_thread(_module_device(module))  # (a group on the model's GPU)
    if g is None:
        _tls.unplaced = _state["activation"]
        return None
    _join(g, copies=bool(_state.get("thread_graphs")))
    dev = g.stream.device_index
    if torch.cuda.current_stream(dev).cuda_stream == torch.cuda.default_stream(dev).cuda_stream:
        # (on the group's device: PyTorch's set_stream makes the stream's device the thread's
        # current one, and a worker that chose its GPU with set_device would then put its next
        # .cuda() copies on another GPU than its model's: multi_gpu_serve.py)
        with torch.cuda.device(dev):
            torch.cuda.set_stream(g.stream)
    return g


#: threads counted by :func:`_note_copy_only` kept by name (all are counted)
MAX_COPY_ONLY = 8


def _note_copy_only(t: threading.Thread) -> None:
    """At the end of a thread placed at its start: where it copied host data to the GPU (an
    ``h2d`` call site in its counts) but never called a model, count it (``stats()
    ["copy_only_threads"]``): a producer of GPU tensors for other threads, on a group stream of
    its own (:func:`_place_deferred` says why that matters)."""
    if getattr(_tls, "called", False) or not counted_here("h2d"):
        return
    with _lock:
        _state["copy_only_count"] = _state.get("copy_only_count", 0) + 1
        names = _state.setdefault("copy_only_threads", [])
        if len(names) < MAX_COPY_ONLY:
            names.append(t.name)


def _wrapped_bootstrap(orig: Any) -> Any:
    def bootstrap_inner(self: threading.Thread) -> None:
        if _runtime_thread(self):
            return orig(self)
        if _state.get("place_at_first_call"):
            # placed at its first model call, in a plan group even where CUDA starts after the
            # thread (a pool started early); its copies before it counted, once CUDA is up
            _tls.defer = _state["activation"]
            torch = _cuda_torch()
            if torch is not None:
                with _lock:
                    if not _state.get("patched_copies"):
                        _patch_thread_copies(torch)
            try:
                return orig(self)
            finally:
                thread_ended()
        g = _group_for_new_thread()
        if g is None:
            return orig(self)
        torch = _torch()
        # (with batching, no thread graph is learned: the copies feed the runtime's batching, .served)
        _join(g, copies=bool(_state.get("thread_graphs") and _state.get("graphs")))
        try:
            with torch.cuda.stream(g.stream):
                return orig(self)
        finally:
            _note_copy_only(self)
            thread_ended()

    bootstrap_inner.__wrapped__ = orig  # type: ignore[attr-defined]
    return bootstrap_inner


def _hooked(torch: Any, g: _Group, rec: Any, orig: Any, self: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
            depth: int) -> Any:
    """A hooked thread's top-level model call past placement and the module's record: eager where
    the record says so, else through autocast's, the batching's, the copies' or the graphs' path."""
    _tls.depth = depth + 1
    try:
        site = script_site(3)  # the script's line that called the model
        st: _ThreadCopies | None = getattr(_tls, "copies", None)
        if rec.eager is not None:
            return _eager_call(torch, st, orig, self, args, kwargs, site, rec.eager)
        if rec.device is not None and g.dev is not None and rec.device != g.dev:
            return _eager_call(torch, st, orig, self, args, kwargs, site, OTHER_DEVICE)
        amp = autocast_dtype(torch)
        if amp is not None:  # precision-keyed graphs, captured with the autocast cache off
            try:
                return amp_call(torch, st, orig, self, args, kwargs, site, amp)
            finally:
                if st is not None:
                    slots_read(torch, st)
        if g.late is not None:  # a thread placed at its first model call: its own group's graphs
            return _graphed_call(orig, self, args, kwargs, site)
        if _state.get("batching"):
            if st is None:
                return _batched_call(orig, self, args, kwargs, site)
            try:
                served = served_call(torch, st, orig, self, args, kwargs, site)
                return served[0] if served is not None else _batched_call(orig, self, args, kwargs, site)
            finally:
                slots_read(torch, st)
        if st is None:
            return _graphed_call(orig, self, args, kwargs, site)
        try:
            # a model that copies its host arguments inside forward: through the slots first
            took = take(torch, st, orig, self, args, kwargs, site)
            call, args, kwargs = (orig, args, kwargs) if took is None else took
            return _copies_call(st, call, self, args, kwargs, site)
        finally:
            slots_read(torch, st)
    finally:
        _tls.depth = depth


def _several_gpus(torch: Any) -> bool:
    """Whether the process sees more than one GPU (asked once: with one, a thread's current
    device is its model's, and no call needs asking which it is)."""
    several = _state.get("several_gpus")
    if several is None:
        several = _state["several_gpus"] = torch.cuda.device_count() > 1
    return bool(several)


def _top_call(torch: Any, g: _Group, rec: Any, orig: Any, self: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              depth: int) -> Any:
    """A placed thread's top-level model call, its module's record taken: :func:`_hooked`, under
    ``no_grad`` where the call records nothing for autograd (:func:`.modstate.frozen_call`)."""
    if torch.is_grad_enabled() and rec.eager is None and modstate.frozen_call(torch, rec, self, args, kwargs):
        with torch.no_grad():  # (nothing of it can require grad: the same call, graphed as inference)
            return _hooked(torch, g, rec, orig, self, args, kwargs, depth)
    return _hooked(torch, g, rec, orig, self, args, kwargs, depth)


def _patch_module(torch: Any) -> None:
    nn = torch.nn
    orig = nn.Module.__call__
    # (torch.jit.trace runs the model with tracer-backed sizes: a call it records is PyTorch's,
    # and places nothing; examples/heldout/exported_ranker_serve.py --export trace)
    tracing = getattr(torch._C, "_is_tracing", None) or (lambda: False)
    probe: list[Any] = []  # (PyTorch's capture probe, bound at the first placed call: .pageable_fast.capture_probe)

    def capturing() -> bool:
        if not probe:
            probe.append(capture_probe(torch))
        return bool(probe[0]())

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "depth", 0):  # a call nested in a hooked top-level call: PyTorch's, at once
            return orig(self, *args, **kwargs)
        if tracing():
            return orig(self, *args, **kwargs)
        g = getattr(_tls, "group", None)
        if g is not None and g.late is not None and g.late != _state.get("activation"):
            del _tls.group  # (placed late under an earlier activation of the hook: placed anew)
            g = None
        if g is None:
            # (a group set to None, not absent: a placed thread doing the runtime's work, .served)
            if hasattr(_tls, "group") or getattr(_tls, "unplaced", None) == _state.get("activation"):
                return orig(self, *args, **kwargs)
            if getattr(_tls, "defer", None) == _state.get("activation"):
                g = _place_deferred(torch, self)
            else:
                g = _late_group(torch, self)
            if g is None:
                return _unplaced_call(orig, self, args, kwargs)
        _tls.called = True  # (a thread that calls a model: :func:`_note_copy_only`)
        if not _state["graphs"]:
            return orig(self, *args, **kwargs)
        depth = _tls.depth
        # (a nested call; a call in a graph the script captures itself: the hook's own captures
        # call the original __call__)
        if depth > 0 or capturing():
            return orig(self, *args, **kwargs)
        _thread_handles(torch)
        _tls.calls = getattr(_tls, "calls", 0) + 1  # (a thread's top-level calls: .thread_graphs.short_lived)
        rec = modstate.check(torch, self)  # (its graphs retired first where it changed since)
        if rec.device is not None and rec.device == g.dev and _several_gpus(torch) and torch.cuda.current_device() != g.dev:
            # (a model on another GPU than the thread's current one, named by its index: the
            # hook's calls of "the current stream" must be the group's device's)
            with torch.cuda.device(g.dev):
                return _top_call(torch, g, rec, orig, self, args, kwargs, depth)
        return _top_call(torch, g, rec, orig, self, args, kwargs, depth)

    __call__.__wrapped__ = orig  # type: ignore[attr-defined]
    nn.Module.__call__ = meter.install(torch, __call__)  # (metered where the script prints no measurement)
    modstate.patch(torch)
    trainers.install(torch)
    _state["patched_module"] = True
    _state["orig_module_call"] = orig


def _unplaced_call(orig: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A model call of a thread not placed (yet): PyTorch's, and no call nested in it places
    the thread (:func:`_place_deferred`, :func:`_late_group`), even where CUDA comes up inside it."""
    if getattr(_tls, "outer", False):
        return orig(module, *args, **kwargs)
    _tls.outer = True
    try:
        return orig(module, *args, **kwargs)
    finally:
        _tls.outer = False


def _thread_handles(torch: Any) -> None:
    """Before a thread's first model call that the hook may serve from a graph: the thread's
    own cuBLAS handle, made now, outside any capture. PyTorch keeps one per thread and makes it
    at the thread's first eager matmul; where the hook replays a graph for that call (a
    script's warm-up before capturing a graph of its own, as ``torch.cuda.graphs`` asks), the
    thread's first eager matmul is inside the script's capture, where ``cublasCreate`` fails
    (``CUBLAS_STATUS_NOT_INITIALIZED``, ``examples/heldout/own_graphs_serve.py --capture worker``).
    cuBLASLt's handle is this one on CUDA builds. PyTorch also gives the handle its workspace
    for the thread's current stream, as the thread's first eager matmul would have unhooked.
    Once a thread (and activation)."""
    if getattr(_tls, "handles", None) != _state.get("activation"):
        _tls.handles = _state.get("activation")
        if torch.cuda.is_available():
            try:  # (beside no capture of the hook's: its gate, shared, as eager calls take it)
                _run_shared(torch.cuda.current_blas_handle)
            except RuntimeError:  # (PyTorch says what failed at the model call itself)
                pass


def _eager_call(torch: Any, st: _ThreadCopies | None, orig: Any, module: Any, args: Any, kwargs: Any, site: str,
                why: str) -> Any:
    """The call as the script made it, counted as left to PyTorch: the copies the thread
    deferred for a graph are made first."""
    if st is not None:
        flush(torch, st)
    return _eager(orig, module, args, kwargs, site, why)


def _patch_thread_copies(torch: Any) -> None:
    """The copy methods, patched when the first thread is placed at its start or marked for
    placement at its first model call (its copies until then counted, :mod:`.unplaced`); the
    threads placed late take no copies."""
    _state["patched_copies"] = True
    _patch_copies(torch)  # pageable copies always; pinned ones into thread graphs where those are on
    _state["orig_tensor_methods"]["copy_"] = torch.Tensor.copy_  # (restored with the others)
    torch.Tensor.copy_ = copyinto.counted(torch, torch.Tensor.copy_)  # counted at the script's lines only
    origs = _state["orig_tensor_methods"]
    cai = torch.Tensor.__dict__.get("__cuda_array_interface__")
    if lentout.LEND and _state.get("thread_graphs") and isinstance(cai, property):  # (a lent output read by address)
        origs["__cuda_array_interface__"] = cai
        torch.Tensor.__cuda_array_interface__ = lentout.exported_property(cai)
    _state["host_type"] = make_host_type(torch, lambda a, k: to_args(torch, a, k), lambda a, k: cuda_args(torch, a, k),
                                         origs["to"], origs["cuda"])
