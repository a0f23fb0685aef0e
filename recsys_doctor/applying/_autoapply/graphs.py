"""CUDA graphs per call site: a top-level model call of a hooked thread, keyed by its module and
its arguments' dtypes/shapes/devices, runs eagerly ``WARMUP_CALLS`` times, is captured once, then replays."""

from __future__ import annotations

from typing import Any

from ._common import WARMUP_CALLS, _first_line, _state, _tls, _torch
from .fallback import _debug_traceback, _end_broken_capture, _fall_back, _synchronize_quietly
from .groups import _capture_stream, _Gate, _Group, _run_shared


class _Entry:
    __slots__ = ("calls", "graph", "static_in", "static_out", "reason")

    def __init__(self) -> None:
        self.calls = 0
        self.graph: Any = None
        self.static_in: list[Any] = []
        self.static_out: Any = None  # a tensor or a tuple of tensors (see _static_out)
        self.reason: str | None = None


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
    try:
        graph, out = _graph_of(torch, _capture_stream(g), lambda: orig_call(module, *s_args, **s_kwargs))
    except BaseException:
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
    except BaseException:
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
                _debug_traceback()
                e.reason = _first_line(ex)
                e.graph = None
                _synchronize_quietly(torch)
                _fall_back(f"{type(module).__name__} on group {g.index}: running eagerly ({e.reason})", e.reason)
                return _run_shared(orig_call, module, *args, **kwargs)
        try:
            return _run_shared(_replay, e, tensors)
        except Exception as ex:  # noqa: BLE001 - replay trouble: eager from now on, with the reason
            e.reason = f"replay failed: {_first_line(ex)}"
            e.graph = None
            _fall_back(f"{type(module).__name__} on group {g.index}: running eagerly ({e.reason})", e.reason)
    return _run_shared(orig_call, module, *args, **kwargs)


def _replay(e: _Entry, tensors: list[Any]) -> Any:
    torch = _torch()
    torch._foreach_copy_(e.static_in, tensors)
    e.graph.replay()
    _state["replays"] += 1
    return _clone_out(e.static_out)
