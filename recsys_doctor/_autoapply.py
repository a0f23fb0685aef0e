"""Apply a stream-group plan to a plain script, with no change to the script.

Activated at interpreter start by a generated ``sitecustomize.py`` (see
:func:`recsys_doctor.script_hook.script_env`) when ``RECSYS_DOCTOR_PLAN`` names a plan JSON file;
this module is loaded by file path, so it imports nothing of ``recsys_doctor`` (whose
package import pulls in pandas) and never imports torch itself. What it does:

* **a stream per client thread**: every ``threading.Thread`` started once torch has
  initialized CUDA runs its whole life inside ``torch.cuda.stream(group_stream)``; thread
  ``i`` (in start order) gets group ``i mod groups``. The script's own copies, kernels and
  ``.cpu()`` waits then go to, and wait for, that group's stream only, instead of one
  stream shared (and synchronized) by every thread.
* **CUDA graphs for top-level model calls** (where the plan enables graphs): a call of an
  ``nn.Module`` made by such a thread at depth 0 (not from inside another module), with
  gradients off, the module in eval mode and every tensor argument on the GPU, is keyed by
  (group, module, argument dtypes/shapes/devices and constants). The first
  ``WARMUP_CALLS`` calls of a key run eagerly on the group stream, then the call is
  captured once (on a private capture stream, so that the group's other threads keep
  using the group stream meanwhile; the capturing thread first runs the call once there,
  so that its own cuBLAS handle exists before the capture, whichever threads made the
  warm-up calls) into a graph with static input buffers; later calls
  copy their inputs
  into the static buffers (one ``_foreach_copy_``), replay, and return a clone of the
  static output. A group's copy-in, replay and clone are enqueued under the group's lock,
  so threads sharing a group never read each other's results. Anything that cannot be
  captured (a host sync in the forward, data-dependent shapes, non-tensor outputs) runs
  eagerly from then on; the reason is printed to stderr once per key.
* **a thread's own graph for its input copies** (graphs on; ``RECSYS_DOCTOR_THREAD_GRAPHS=0``
  turns it off): once a thread's model call is graphed and every tensor argument of it was
  copied just before from a pinned CPU tensor with ``.to("cuda", non_blocking=True)`` (or
  ``.cuda(non_blocking=True)``), the thread captures a graph of those copies and the model.
  From then on the same copies of the same tensors return at once a view whose data the
  graph's replay at the model call brings: 28 driver calls and allocations a query become
  one graph launch. Any other use of such a view first makes the deferred copies, and a
  view the script keeps from an earlier query is given its own memory before the buffer is
  written again (the section "a thread's copies in its own graph" below).

Why one module of ~900 lines: it is loaded by file path at interpreter start, before the
package can be imported (its package import pulls in pandas), so it cannot be split into
sibling modules without a loader for each; it loads ``plan.py`` that way, as the one place
that parses plans.

The plan file is the one ``recsys-doctor profile --apply`` writes (``runtime`` object:
``groups``, ``cuda_graphs``); ``RECSYS_DOCTOR_AUTOAPPLY_LOG=1`` prints a summary at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import weakref
from typing import Any

__all__ = ["activate", "deactivate", "read_runtime", "stats", "ENV_PLAN", "ENV_THREAD_GRAPHS", "WARMUP_CALLS"]

ENV_PLAN = "RECSYS_DOCTOR_PLAN"
#: "0" turns off the per-thread graphs that take over a thread's pinned input copies
ENV_THREAD_GRAPHS = "RECSYS_DOCTOR_THREAD_GRAPHS"
#: eager calls of a key before it is captured (lazy inits: cuBLAS handles, allocator blocks)
WARMUP_CALLS = 2

_state: dict[str, Any] = {"active": False}
_tls = threading.local()
_lock = threading.Lock()


def _log(msg: str) -> None:
    print(f"recsys-doctor apply: {msg}", file=sys.stderr, flush=True)


def _plan_type() -> Any:
    """:class:`recsys_doctor.plan.Plan`, the one plan parser. Inside the package it is
    imported; loaded by file path at interpreter start (the generated ``sitecustomize``),
    ``plan.py`` beside this file is loaded the same way, without importing the package."""
    if __package__:
        from .plan import Plan

        return Plan
    mod = sys.modules.get("_recsys_doctor_plan")
    if mod is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "_recsys_doctor_plan", os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan.py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_recsys_doctor_plan"] = mod  # dataclasses look the module up while it runs
        spec.loader.exec_module(mod)
    return mod.Plan


#: the plan's runtime fields the hook honours; the others are reported by :func:`unhonoured`
HONOURED = ("groups", "cuda_graphs")


def unhonoured(plan: dict[str, Any]) -> list[str]:
    """One line per plan setting a plain script cannot get from this hook: its copies are
    its own (no merged/split copy streams, no staging pools, no slots), so only the group
    count and CUDA graphs apply (the rules: :meth:`recsys_doctor.plan.Plan.unhonoured`)."""
    return _plan_type().from_dict(plan).unhonoured("script")


def read_runtime(plan: dict[str, Any]) -> dict[str, Any]:
    """``groups`` and ``cuda_graphs`` of a plan dict (through ``Plan.from_dict``: the
    ``runtime`` object, or planner schema 1 ``stream_groups.count`` / ``cuda_graphs.enabled``)."""
    p = _plan_type().from_dict(plan)
    return {"groups": p.groups, "cuda_graphs": p.cuda_graphs}


class _Gate:
    """Model executions of hooked threads hold it shared; a capture holds it alone.

    A capture must not run while another thread executes a model eagerly or replays a
    graph: seen on the H200 with 4 threads per group, concurrent forwards invalidated the
    capture ("operation failed due to a previous error during capture"). Writers are
    preferred (new readers wait while a capture is pending), so a capture is never starved.
    No reader waits for anything else while holding it, so it cannot deadlock with the
    group locks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_shared(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def release_exclusive(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


def _run_shared(fn: Any, *args: Any, **kwargs: Any) -> Any:
    gate: _Gate = _state["gate"]
    gate.acquire_shared()
    try:
        return fn(*args, **kwargs)
    finally:
        gate.release_shared()


class _Group:
    def __init__(self, index: int, stream: Any) -> None:
        self.index = index
        self.stream = stream
        self.lock = threading.Lock()
        self.entries: dict[Any, Any] = {}
        self.capture_stream: Any = None


class _Entry:
    __slots__ = ("calls", "graph", "static_in", "static_out", "reason")

    def __init__(self) -> None:
        self.calls = 0
        self.graph: Any = None
        self.static_in: list[Any] = []
        self.static_out: Any = None  # a tensor or a tuple of tensors (see _static_out)
        self.reason: str | None = None


def _torch() -> Any:
    return sys.modules.get("torch")


def _group_for_new_thread() -> _Group | None:
    torch = _torch()
    if torch is None or not _state["active"]:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
    except (RuntimeError, AttributeError):  # a torch without CUDA (or a broken one): nothing to do
        return None
    with _lock:
        i = _state["started"]
        _state["started"] += 1
        groups = _state["groups"]
        k = i % _state["n_groups"]
        g = groups.get(k)
        if g is None:
            g = groups[k] = _Group(k, torch.cuda.Stream())
        if not _state["patched_module"]:
            _patch_module(torch)
    return g


def _wrapped_bootstrap(orig: Any) -> Any:
    def bootstrap_inner(self: threading.Thread) -> None:
        g = _group_for_new_thread()
        if g is None:
            return orig(self)
        torch = _torch()
        _tls.group = g
        _tls.depth = 0
        if _state.get("thread_graphs") and _state.get("graphs"):
            _tls.copies = _ThreadCopies(g.stream)
        with torch.cuda.stream(g.stream):
            return orig(self)

    bootstrap_inner.__wrapped__ = orig  # type: ignore[attr-defined]
    return bootstrap_inner


# --------------------------------------------------------------------------- graphs

def _key(torch: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    """(hashable key, flat tensor list) or None when an argument is not graph-friendly."""
    tensors: list[Any] = []
    try:
        parts = (_key_part(torch.Tensor, args, tensors), _key_part(torch.Tensor, kwargs, tensors))
    except TypeError:
        return None
    return (id(module), parts), tensors


def _key_part(T: type[Any], x: Any, tensors: list[Any]) -> Any:
    # a module-level function, not a nested one: a recursive closure is a reference cycle
    # (function -> cell -> function) that kept every call's tensor list, and so the
    # script's input tensors, alive until the cyclic garbage collector ran
    if isinstance(x, T):
        dev = x.get_device()  # -1 on the CPU; cheaper than x.device.index
        if dev < 0:
            raise TypeError("a CPU tensor argument")
        tensors.append(x)
        # no strides: the static inputs keep the first call's layout and
        # _foreach_copy_ copies any layout into them
        return (x.dtype, x.shape, dev)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple([_key_part(T, v, tensors) for v in x]))
    if isinstance(x, dict):
        return ("dict", tuple([(k, _key_part(T, x[k], tensors)) for k in sorted(x)]))
    if x is None or isinstance(x, (int, float, bool, str)):
        return ("C", x)
    raise TypeError(f"an argument of type {type(x).__name__}")


def _rebuild(torch: Any, x: Any, it: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return next(it)
    if isinstance(x, (list, tuple)):
        return type(x)(_rebuild(torch, v, it) for v in x)
    if isinstance(x, dict):
        return {k: _rebuild(torch, x[k], it) for k in x}
    return x


def _capture(torch: Any, g: _Group, e: _Entry, orig_call: Any, module: Any, args: Any, kwargs: Any,
             tensors: list[Any]) -> None:
    e.static_in = [t.clone() for t in tensors]
    it = iter(e.static_in)
    s_args = _rebuild(torch, args, it)
    s_kwargs = _rebuild(torch, kwargs, it)
    g.stream.synchronize()
    # capture on a private stream, never on the group stream: the other threads of the
    # group keep enqueuing their copies on the group stream meanwhile, and work from
    # another thread must not land in (or invalidate) this capture. Replays then run on
    # the group stream (the current stream of the calling thread).
    if g.capture_stream is None:
        g.capture_stream = torch.cuda.Stream()
    try:
        graph, out = _graph_of(torch, g.capture_stream, lambda: orig_call(module, *s_args, **s_kwargs))
    except BaseException:  # noqa: BLE001 - the stream is dropped, the error re-raised
        g.capture_stream = None  # (its capture broke: never used again)
        raise
    e.static_out = _static_out(torch, out)
    e.graph = graph


def _graph_of(torch: Any, stream: Any, run: Any) -> tuple[Any, Any]:
    """(graph, output) of ``run()`` captured on ``stream``, every other model execution of
    the hooked threads held off meanwhile (the gate)."""
    graph = torch.cuda.CUDAGraph()
    gate: _Gate = _state["gate"]
    prev = torch.cuda.current_stream()
    gate.acquire_exclusive()
    try:
        # one eager run by THIS thread on the capture stream first: the warm-up calls may
        # have been made by other threads of the group, and a thread's first cuBLAS call
        # creates its handle (cublasCreate allocates, which a capture forbids:
        # CUBLAS_STATUS_NOT_INITIALIZED, then "operation failed due to a previous error
        # during capture" - what failed with more than 2 threads per group)
        with torch.cuda.stream(stream):
            run()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            out = run()
    except BaseException:  # noqa: BLE001 - the broken capture is ended, the error re-raised
        # torch.cuda.graph's __exit__ skips restoring the current stream when ending the
        # capture fails: without this the thread would stay on a stream whose capture is
        # broken, and every later copy of the thread would fail. End any capture still
        # open on that stream (the caller never uses the stream again).
        _end_broken_capture(stream)
        raise
    finally:
        torch.cuda.set_stream(prev)
        gate.release_exclusive()
    stream.synchronize()
    return graph, out


def _static_out(torch: Any, out: Any) -> Any:
    """A captured model's output as replays hand it out: a tensor, or a tuple of tensors."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        return tuple(out)
    raise TypeError(f"the model returns {type(out).__name__}, not a tensor or a tuple of tensors")


def _clone_out(static_out: Any) -> Any:
    """What a replay returns: a clone of the static output (the next replay overwrites it)."""
    if isinstance(static_out, tuple):
        return tuple(o.clone() for o in static_out)
    return static_out.clone()


def _end_broken_capture(stream: Any) -> None:
    try:
        from cuda.bindings import runtime as cudart

        err, status = cudart.cudaStreamIsCapturing(stream.cuda_stream)
        if int(err) == 0 and int(status) != int(cudart.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone):
            cudart.cudaStreamEndCapture(stream.cuda_stream)
        cudart.cudaGetLastError()
    except Exception:  # noqa: BLE001 - best effort: the capture failed already, eager follows
        pass


def _first_line(ex: BaseException) -> str:
    # not recsys_doctor.errors.first_line: this file runs at interpreter start without the package
    msg = str(ex).strip().splitlines()
    return f"{type(ex).__name__}: {msg[0] if msg else ''}"


def _graphed_call(orig_call: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    torch = _torch()
    g: _Group = _tls.group
    if module.training or torch.is_grad_enabled():
        return _run_shared(orig_call, module, *args, **kwargs)
    kt = _key(torch, module, args, kwargs)
    if kt is None:
        return _run_shared(orig_call, module, *args, **kwargs)
    key, tensors = kt
    e = g.entries.get(key)
    if e is None:
        e = g.entries[key] = _Entry()
    if e.reason is not None:
        return _run_shared(orig_call, module, *args, **kwargs)
    with g.lock:
        if e.graph is None:
            e.calls += 1
            if e.calls <= WARMUP_CALLS:
                return _run_shared(orig_call, module, *args, **kwargs)
            try:
                _capture(torch, g, e, orig_call, module, args, kwargs, tensors)
                _state["captured"] += 1
            except Exception as ex:  # noqa: BLE001 - any capture failure means eager, with the reason
                if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_DEBUG"):
                    import traceback

                    traceback.print_exc()
                e.reason = _first_line(ex)
                e.graph = None
                try:
                    torch.cuda.synchronize()
                except RuntimeError:  # a sticky CUDA error (torch.AcceleratorError is one): eager says it
                    pass
                _log(f"{type(module).__name__} on group {g.index}: running eagerly ({e.reason})")
                _state["fallbacks"].append(e.reason)
                return _run_shared(orig_call, module, *args, **kwargs)
        try:
            return _run_shared(_replay, e, tensors)
        except Exception as ex:  # noqa: BLE001 - replay trouble: eager from now on, with the reason
            e.reason = f"replay failed: {_first_line(ex)}"
            e.graph = None
            _log(f"{type(module).__name__} on group {g.index}: running eagerly ({e.reason})")
            _state["fallbacks"].append(e.reason)
    return _run_shared(orig_call, module, *args, **kwargs)


def _replay(e: _Entry, tensors: list[Any]) -> Any:
    torch = _torch()
    torch._foreach_copy_(e.static_in, tensors)
    e.graph.replay()
    _state["replays"] += 1
    return _clone_out(e.static_out)


def _patch_module(torch: Any) -> None:
    nn = torch.nn
    orig = nn.Module.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        g = getattr(_tls, "group", None)
        if g is None or not _state["graphs"]:
            return orig(self, *args, **kwargs)
        depth = _tls.depth
        if depth > 0:
            return orig(self, *args, **kwargs)
        _tls.depth = depth + 1
        try:
            st: _ThreadCopies | None = getattr(_tls, "copies", None)
            if st is None:
                return _graphed_call(orig, self, args, kwargs)
            return _copies_call(st, orig, self, args, kwargs)
        finally:
            _tls.depth = depth

    __call__.__wrapped__ = orig  # type: ignore[attr-defined]
    nn.Module.__call__ = __call__
    _state["patched_module"] = True
    _state["orig_module_call"] = orig
    if _state.get("thread_graphs") and _state.get("graphs"):
        _patch_copies(torch)


# --------------------------------------------------------------------------- a thread's copies in its own graph
#
# A plain script's query copies its host inputs to the GPU tensor by tensor
# (``x.to("cuda", non_blocking=True)`` from pinned memory), and then calls the model. Made
# by PyTorch, each copy is a device allocation, a cudaMemcpyAsync and an event for the
# pinned block: with 8 client threads those calls alone cap the script below 10x its
# eager throughput (bench/results/script_floor_h100). So once a thread has made the same
# copies from the same pinned tensors into the same model call, the hook captures a CUDA
# graph of that thread's own (its "thread graph": the copies, as memcpy nodes from those
# pinned tensors into device buffers of the thread, then the model) and takes the copies
# over: a later ``.to()`` of the same tensor, in the same order, returns a view of the
# thread's device buffer at once, no CUDA call made, and the model call replays the graph,
# which copies all the inputs and runs the model in one launch.
#
# What keeps that the script's own results:
# * the view is a tensor subclass whose data is only due at the model call: any other
#   use of it first enqueues the copies this query has deferred (as PyTorch would have
#   made them, on the thread's stream), then runs as usual; reading its shape, dtype or
#   device does not need the data. A query whose views were used so (read, or written in
#   place) calls the model through the group's path, which copies the views as they are;
#   the graph would copy the pinned tensors again;
# * a view the script still holds when the same copy comes round again (it kept an
#   earlier query's input) is given its own memory first, a copy enqueued before the
#   graph overwrites the buffer;
# * only ``non_blocking=True`` copies of pinned, contiguous CPU tensors are taken over:
#   their data may be read by the GPU at any later point in the stream's order already,
#   so reading it at the model call instead is within their contract; the pinned tensors
#   stay referenced by the graph;
# * any other ``.to()`` (a different tensor, order, device or argument) in a query makes
#   the deferred copies now and leaves the rest to PyTorch; a model call with other
#   arguments does the same and takes the group's path (above);
# * the copies, the model and the output's clone of one thread touch only that thread's
#   buffers and its graph's own memory pool, so threads sharing a group stay apart.

#: the most ``.to()`` results a thread remembers between two model calls, to learn sources
MAX_COPIES = 256


class _ThreadCopies:
    """The copy state of one hooked thread."""

    __slots__ = ("stream", "recent", "tg", "n", "pending", "reason", "lock")

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.recent: list[tuple[Any, Any]] = []  # (result, source) of this query's copies, while learning
        self.tg: _ThreadGraph | None = None
        self.n = 0  # views handed out in this query (slots 0..n-1); -1: this query left the graph's order
        self.pending = False  # those views' copies are deferred (not made yet)
        self.reason: str | None = None  # why this thread has no graph of its own
        self.lock = threading.Lock()


class _ThreadGraph:
    __slots__ = ("module", "graph", "src", "src_ptr", "src_shape", "tin", "handed", "template", "static_out",
                 "device")

    def __init__(self, module: Any, graph: Any, src: list[Any], tin: list[Any], template: Any, out: Any,
                 device: int) -> None:
        self.module = module
        self.graph = graph
        self.src = src  # the script's pinned tensors (kept alive: the graph reads them)
        self.src_ptr = [t.data_ptr() for t in src]
        self.src_shape = [t.shape for t in src]
        self.tin = tin  # this thread's device buffers, one per copy
        self.handed: list[Any] = [None] * len(src)  # the view last handed out for each copy
        self.template = template
        self.static_out = out
        self.device = device


def _cuda_index(torch: Any, dev: Any) -> int | None:
    """The CUDA device index ``dev`` names ("cuda", "cuda:1", torch.device, int), else None."""
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    if isinstance(dev, str):
        if dev == "cuda":
            return torch.cuda.current_device()
        if dev.startswith("cuda:") and dev[5:].isdigit():
            return int(dev[5:])
        return None
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.cuda.current_device() if dev.index is None else dev.index
    return None


def _to_target(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The device of ``Tensor.to(device, non_blocking=True)`` (positional or keyword
    device, nothing else), else None: any other form is left to PyTorch."""
    if kwargs.get("non_blocking") is not True or len(kwargs) > 2:
        return None
    if len(args) == 1 and len(kwargs) == 1:
        dev = args[0]
    elif not args and len(kwargs) == 2 and "device" in kwargs:
        dev = kwargs["device"]
    else:
        return None
    return None if isinstance(dev, int) else _cuda_index(torch, dev)


def _cuda_target(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The device of ``Tensor.cuda(device=None, non_blocking=True)``, else None."""
    if len(args) > 2 or set(kwargs) - {"device", "non_blocking"}:
        return None
    dev = args[0] if args else kwargs.get("device")
    nb = args[1] if len(args) > 1 else kwargs.get("non_blocking", False)
    if nb is not True or (len(args) >= 1 and "device" in kwargs) or (len(args) == 2 and "non_blocking" in kwargs):
        return None
    return torch.cuda.current_device() if dev is None else _cuda_index(torch, dev)


def _copy_source(torch: Any, src: Any, out: Any) -> bool:
    """Whether ``out = src.to(cuda, non_blocking=True)`` is a copy a thread graph can
    take over: a plain contiguous pinned CPU tensor, same dtype and shape, no grad."""
    return (type(out) is torch.Tensor and type(src) is torch.Tensor and src.device.type == "cpu"
            and not src.requires_grad and src.dtype == out.dtype and src.shape == out.shape
            and src.is_contiguous() and out.is_contiguous() and src.is_pinned())


def _copy_in(torch: Any, st: _ThreadCopies, src: Any, dev: int, orig: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
    tg = st.tg
    if tg is not None:
        i = st.n
        if (0 <= i < len(tg.src) and src is tg.src[i] and dev == tg.device and src.data_ptr() == tg.src_ptr[i]
                and src.shape == tg.src_shape[i] and src.is_contiguous()):
            view = tg.handed[i]
            # references: the list, this name, getrefcount's argument; one more is the
            # script's (it kept an earlier query's input): that view gets its own memory
            if view is None or sys.getrefcount(view) > 3:
                if view is not None:
                    _own_memory(torch, view)
                view = tg.tin[i].as_subclass(_state["lazy_type"])
                view._rd_copies = st
                tg.handed[i] = view
            st.n = i + 1
            st.pending = True
            return view
        # not the copy the graph expects: the deferred ones are made now, PyTorch does the rest
        _materialize(torch, st)
        st.n = -1
        return orig(src, *args, **kwargs)
    out = orig(src, *args, **kwargs)
    if st.reason is None and len(st.recent) < MAX_COPIES and _copy_source(torch, src, out):
        # weak references: a thread that copies but never calls a model keeps nothing alive
        st.recent.append((weakref.ref(out), weakref.ref(src)))
    return out


def _own_memory(torch: Any, view: Any) -> None:
    """Give a view the script kept a copy of the buffer it shows (enqueued on this
    thread's stream, before the graph writes the buffer again)."""
    with torch._C.DisableTorchFunctionSubclass():
        view.set_(view.clone())


def _materialize(torch: Any, st: _ThreadCopies) -> None:
    """Make the copies this query deferred, on the current stream, as PyTorch would have."""
    with st.lock:
        tg = st.tg
        if not st.pending or tg is None or st.n <= 0:
            st.pending = False
            return
        with torch._C.DisableTorchFunctionSubclass():
            for i in range(st.n):
                tg.tin[i].copy_(tg.src[i], non_blocking=True)
        st.pending = False
        _state["materialized"] += 1


def _make_lazy_type(torch: Any) -> type:
    T = torch.Tensor
    # what reads only a tensor's metadata: no need for its data
    meta = {T.shape.__get__, T.dtype.__get__, T.device.__get__, T.is_cuda.__get__, T.ndim.__get__,
            T.requires_grad.__get__, T.layout.__get__, T.get_device, T.dim, T.size, T.numel, T.stride,
            T.is_contiguous, T.data_ptr, T.element_size, T.__len__}

    def owners(x: Any, out: list[Any]) -> None:
        if isinstance(x, T):
            st = getattr(x, "_rd_copies", None)
            if st is not None and st.pending and st not in out:
                out.append(st)
        elif isinstance(x, (list, tuple)):
            for v in x:
                owners(v, out)
        elif isinstance(x, dict):
            for v in x.values():
                owners(v, out)

    class DeferredCopy(T):  # type: ignore[misc, valid-type]
        """A view of a thread graph's input buffer whose copy is made by the model call's
        graph; any other use makes the query's deferred copies first."""

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func not in meta:
                found: list[Any] = []
                owners(args, found)
                owners(kwargs, found)
                for st in found:
                    _materialize(torch, st)
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)

    return DeferredCopy


def _patch_copies(torch: Any) -> None:
    T = torch.Tensor
    _state["orig_tensor_methods"] = {"to": T.to, "cuda": T.cuda}
    _state["lazy_type"] = _make_lazy_type(torch)
    T.to = _copy_method(torch, T.to, _to_target)
    T.cuda = _copy_method(torch, T.cuda, _cuda_target)


def _copy_method(torch: Any, orig: Any, target: Any) -> Any:
    """``Tensor.to`` / ``Tensor.cuda`` for hooked threads: a copy ``target`` recognizes goes
    through :func:`_copy_in`, everything else straight to PyTorch's ``orig``."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        st = getattr(_tls, "copies", None)
        if st is None or _tls.depth:
            return orig(self, *args, **kwargs)
        dev = target(torch, args, kwargs)
        if dev is None:
            return orig(self, *args, **kwargs)
        return _copy_in(torch, st, self, dev, orig, args, kwargs)

    method.__name__ = getattr(orig, "__name__", "method")
    method.__wrapped__ = orig  # type: ignore[attr-defined]
    return method


class _Seq:
    """A list or tuple in a thread graph's argument template."""

    __slots__ = ("kind", "items")

    def __init__(self, kind: type[Any], items: tuple[Any, ...]) -> None:
        self.kind = kind
        self.items = items


class _Map:
    __slots__ = ("keys", "items")

    def __init__(self, keys: tuple[Any, ...], items: tuple[Any, ...]) -> None:
        self.keys = keys
        self.items = items


_TENSOR = object()


def _template(T: type[Any], x: Any) -> Any:
    """The argument structure of a model call, its tensors left out (constants kept)."""
    if isinstance(x, T):
        return _TENSOR
    if isinstance(x, (list, tuple)):
        return _Seq(type(x), tuple(_template(T, v) for v in x))
    if isinstance(x, dict):
        keys = tuple(x)
        return _Map(keys, tuple(_template(T, x[k]) for k in keys))
    return x


def _matches(T: type[Any], tmpl: Any, x: Any, it: Any) -> bool:
    """Whether ``x`` has the template's structure and constants, its tensors being, in
    order, the ones ``it`` yields (the very objects)."""
    if tmpl is _TENSOR:
        return isinstance(x, T) and x is next(it, None)
    if isinstance(tmpl, _Seq):
        return (type(x) is tmpl.kind and len(x) == len(tmpl.items)
                and all(_matches(T, t, v, it) for t, v in zip(tmpl.items, x)))
    if isinstance(tmpl, _Map):
        return (isinstance(x, dict) and tuple(x) == tmpl.keys
                and all(_matches(T, t, x[k], it) for t, k in zip(tmpl.items, tmpl.keys)))
    return type(x) is type(tmpl) and x == tmpl


def _copies_call(st: _ThreadCopies, orig_call: Any, module: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """A top-level model call of a thread whose copies a thread graph may own."""
    torch = _torch()
    tg, n = st.tg, st.n
    st.n = 0
    # (pending: no operation has touched this query's views, so none was written to since
    # its copy: the replay's own copies give the model exactly what the script handed it)
    if (tg is not None and st.pending and n == len(tg.src) and module is tg.module and not module.training
            and not torch.is_grad_enabled()
            and _matches(torch.Tensor, tg.template, (args, kwargs), iter(tg.handed))):
        try:
            out = _run_shared(_thread_replay, tg)
            st.pending = False
            return out
        except Exception as ex:  # noqa: BLE001 - eager and the group's graphs from now on, with the reason
            st.n = n
            _materialize(torch, st)
            st.tg, st.reason = None, f"thread graph replay failed: {_first_line(ex)}"
            _log(f"{type(module).__name__}: {st.reason}")
            _state["fallbacks"].append(st.reason)
    elif st.pending:
        st.n = n
        _materialize(torch, st)
    st.n = 0
    recent, st.recent = st.recent, []
    out = _graphed_call(orig_call, module, args, kwargs)
    if st.tg is None and st.reason is None and recent:
        _learn(torch, st, orig_call, module, args, kwargs, recent)
    return out


def _learn(torch: Any, st: _ThreadCopies, orig_call: Any, module: Any, args: tuple[Any, ...],
           kwargs: dict[str, Any], recent: list[tuple[Any, Any]]) -> None:
    """Capture this thread's graph once the group's graph of this call exists and every
    tensor argument of the call is one of this query's copies of a pinned tensor."""
    if module.training or torch.is_grad_enabled():
        return
    kt = _key(torch, module, args, kwargs)
    g: _Group = _tls.group
    if kt is None:
        return
    e = g.entries.get(kt[0])
    if e is not None and e.reason is not None:
        st.reason = "the call runs eagerly"
    if e is None or e.graph is None:
        return  # not graphed (yet): nothing to learn
    copies = {}
    for out_ref, src_ref in recent:
        out, s_ = out_ref(), src_ref()
        if out is not None and s_ is not None:
            copies[id(out)] = (out, s_)
    src = []
    for t in kt[1]:
        hit = copies.get(id(t))
        if hit is None or hit[0] is not t:
            st.reason = "an argument of the model call is not a copy of a pinned CPU tensor made just before it"
            return
        src.append(hit[1])
    try:
        st.tg = _capture_thread(torch, g, orig_call, module, args, kwargs, kt[1], src)
        _state["thread_captured"] += 1
    except Exception as ex:  # noqa: BLE001 - the group's path stays, with the reason
        if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_DEBUG"):
            import traceback

            traceback.print_exc()
        st.reason = f"no thread graph: {_first_line(ex)}"
        _log(f"{type(module).__name__}: {st.reason}")
        _state["fallbacks"].append(st.reason)
        try:
            torch.cuda.synchronize()
        except RuntimeError:  # a sticky CUDA error (torch.AcceleratorError is one): eager says it
            pass


def _h2d(dst: Any, src: Any, stream: Any) -> None:
    """One host-to-device cudaMemcpyAsync of ``src`` (pinned) into ``dst`` on ``stream``:
    in a capture, a memcpy node reading the pinned tensor at every replay."""
    from cuda.bindings import runtime as cudart

    err, = cudart.cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size(),
                                  cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream.cuda_stream)
    if int(err) != 0:
        raise RuntimeError(f"cudaMemcpyAsync: {err}")


def _capture_thread(torch: Any, g: _Group, orig_call: Any, module: Any, args: Any, kwargs: Any,
                    tensors: list[Any], src: list[Any]) -> _ThreadGraph:
    tin = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    it = iter(tin)
    s_args = _rebuild(torch, args, it)
    s_kwargs = _rebuild(torch, kwargs, it)
    template = _template(torch.Tensor, (args, kwargs))
    stream = torch.cuda.Stream()
    g.stream.synchronize()

    def run() -> Any:  # the copies, then the model
        for d, s_ in zip(tin, src):
            _h2d(d, s_, stream)
        return orig_call(module, *s_args, **s_kwargs)

    graph, out = _graph_of(torch, stream, run)
    return _ThreadGraph(module, graph, list(src), tin, template, _static_out(torch, out), tensors[0].get_device())


def _thread_replay(tg: _ThreadGraph) -> Any:
    tg.graph.replay()
    _state["thread_replays"] += 1
    return _clone_out(tg.static_out)


# --------------------------------------------------------------------------- control

def activate(plan: dict[str, Any] | str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Start applying ``plan`` (a dict, a path, or ``$RECSYS_DOCTOR_PLAN``) to threads
    started from now on. Returns the runtime settings used. Idempotent."""
    if plan is None:
        plan = os.environ.get(ENV_PLAN)
        if not plan:
            raise ValueError(f"{ENV_PLAN} is not set")
    doc: dict[str, Any]
    if isinstance(plan, dict):
        doc = plan
    else:
        with open(plan, encoding="utf-8") as f:
            doc = json.load(f)
        if not isinstance(doc, dict):
            raise ValueError("the plan file must hold a JSON object")
    rt = read_runtime(doc)
    for line in unhonoured(doc):
        _log(line)
    with _lock:
        if _state["active"]:
            return {"groups": _state["n_groups"], "cuda_graphs": _state["graphs"]}
        _state.update(active=True, n_groups=rt["groups"], graphs=rt["cuda_graphs"], groups={}, started=0,
                      patched_module=False, captured=0, replays=0, fallbacks=[], gate=_Gate(),
                      thread_graphs=os.environ.get(ENV_THREAD_GRAPHS, "1") != "0", thread_captured=0,
                      thread_replays=0, materialized=0)
        if hasattr(threading.Thread, "_bootstrap_inner"):
            _state["orig_bootstrap"] = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
            threading.Thread._bootstrap_inner = _wrapped_bootstrap(_state["orig_bootstrap"])  # type: ignore[attr-defined]
        else:  # pragma: no cover - every CPython we support has it
            raise RuntimeError("threading.Thread has no _bootstrap_inner on this Python")
    return rt


def deactivate() -> None:
    """Undo :func:`activate` for threads started from now on (and restore ``nn.Module``)."""
    with _lock:
        if not _state.get("active"):
            return
        threading.Thread._bootstrap_inner = _state.pop("orig_bootstrap")  # type: ignore[attr-defined]
        if _state.get("patched_module"):
            torch = _torch()
            if torch is not None:
                torch.nn.Module.__call__ = _state["orig_module_call"]
                for name, fn in _state.pop("orig_tensor_methods", {}).items():
                    setattr(torch.Tensor, name, fn)
        _state["active"] = False


def stats() -> dict[str, Any]:
    """Groups created, threads placed, graphs captured, replays, fallback reasons."""
    return {"active": _state.get("active", False), "groups": _state.get("n_groups"),
            "graphs": _state.get("graphs"), "threads": _state.get("started", 0),
            "captured": _state.get("captured", 0), "replays": _state.get("replays", 0),
            "thread_graphs": _state.get("thread_captured", 0), "thread_replays": _state.get("thread_replays", 0),
            "materialized": _state.get("materialized", 0), "fallbacks": list(_state.get("fallbacks", []))}


def _at_exit() -> None:
    if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_LOG"):
        _log(json.dumps(stats()))


def _main() -> None:
    """Entry of the generated ``sitecustomize``: activate from the environment; a bad plan
    is one line on stderr and the script runs unchanged."""
    try:
        rt = activate()
    except Exception as ex:  # noqa: BLE001 - never break the user's program
        _log(f"not applied: {_first_line(ex)}")
        return
    atexit.register(_at_exit)
    if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_LOG"):
        _log(f"active: {rt['groups']} stream groups, CUDA graphs {'on' if rt['cuda_graphs'] else 'off'}")
