"""CUDA graphs per call site: a top-level model call of a hooked thread, keyed by its module and
its arguments' dtypes/shapes/devices (rows padded to a bucket where that is verified safe:
:mod:`.buckets`), runs eagerly ``WARMUP_CALLS`` times, is captured once, then replays. Every call
is counted at the script's line that made it (:mod:`.accounting`): taken over when a graph
replays it, left to PyTorch with the reason otherwise."""

from __future__ import annotations

from typing import Any

from ._common import WARMUP_CALLS, _state, _tls, _torch, normal_tensors, trains
from .argtree import dataclass_fields, flatten, remake
from .argwrites import WRITES_ARGS, watched_call
from .accounting import fell_back, taken_over
from .buckets import (BOUND_REACHED, BUDGET_SPENT, GRAPH_MEMORY_BUDGET, INDEX_OUTPUT, MAX_PAD_KEYS, MIXES_ROWS, VERIFYING,
                      PLAIN_LEAVES, WARMING_UP, index_outputs,
                      _Site, bucket_rows, call_rows, cut_rows, outputs, pad_rows, pad_views, rows_differ, same_rows)
from .fallback import _debug_traceback, _end_broken_capture, _fall_back, _synchronize_quietly, failure_reason, needs_host
from .groups import _capture_stream, _Gate, _Group, _run_shared
from .modstate import eager_reason, never_graph

#: why a call with gradients on, or of a module in training mode, is never graphed
GRAD_ON = "gradients on or the module in training mode"
#: why a call with a tensor argument on the CPU is not graphed (its reason at the call site)
_ON_CPU = "a CPU tensor argument"
CPU_ARG = f"not graphed: {_ON_CPU}"
#: the start of the reason of a call with an argument no graph takes (an object of the script's
#: own holding tensors, as TorchRec's KeyedJaggedTensor; :func:`_key_part` names its type)
_OF_TYPE = "an argument of type "
UNKEYED = f"not graphed: {_OF_TYPE}"
#: why every call of a module runs eagerly after a capture of it needed the host
NEEDS_HOST = "its forward needs the host inside a CUDA graph capture: every call eager from now on"


class _Entry:
    __slots__ = ("calls", "graph", "static_in", "static_out", "reason", "pad_views")

    def __init__(self) -> None:
        #: a padded key's :func:`.buckets.pad_views` per real row count
        self.pad_views: dict[int, tuple[list[Any], list[bool]]] = {}
        self.calls = 0
        self.graph: Any = None
        self.static_in: list[Any] = []
        self.static_out: Any = None  # a tensor, a tuple of tensors or a _TreeOut (see _static_out)
        self.reason: str | None = None


def _key(torch: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
         tag: Any = None) -> tuple[Any, list[Any]] | None:
    """(hashable key, flat tensor list) or None when an argument is not graph-friendly."""
    kt = _key_or_reason(torch, module, args, kwargs, tag)
    return None if isinstance(kt, str) else kt


def _key_or_reason(torch: Any, module: Any, args: Any, kwargs: Any, tag: Any = None) -> tuple[Any, list[Any]] | str:
    """:func:`_key`, or why an argument is not graph-friendly. ``tag``: what the call's
    ``orig_call`` says of it (``key_tag``: :mod:`.host_args`), part of the key where set."""
    tensors: list[Any] = []
    try:
        parts = (_key_part(torch.Tensor, args, tensors), _key_part(torch.Tensor, kwargs, tensors))
    except TypeError as ex:
        return f"not graphed: {ex}"
    return ((id(module), tag) if tag is not None else id(module), parts), tensors


def _key_part(T: type[Any], x: Any, tensors: list[Any]) -> Any:
    # a module-level function, not a nested one: a recursive closure is a reference cycle
    # (function -> cell -> function) that kept every call's tensor list, and so the
    # script's input tensors, alive until the cyclic garbage collector ran
    if isinstance(x, T):
        dev = x.get_device()  # -1 on the CPU; cheaper than x.device.index
        if dev < 0:
            raise TypeError(_ON_CPU)
        tensors.append(x)
        # no strides: the static inputs keep the first call's layout and
        # _foreach_copy_ copies any layout into them
        return (x.dtype, x.shape, dev)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple([_key_part(T, v, tensors) for v in x]))
    if isinstance(x, dict):
        # in the dict's own order, as :mod:`.argtree` walks it: a sorted walk gave a call
        # ``m(b=x, a=y)`` static inputs in the other order
        return ("dict", tuple([(k, _key_part(T, x[k], tensors)) for k in x]))
    if x is None or isinstance(x, (int, float, bool, str)):
        return ("C", x)
    names = dataclass_fields(type(x))
    if names is not None:  # (in the class's field order, as :mod:`.argtree` walks it)
        return (type(x), tuple([_key_part(T, getattr(x, n), tensors) for n in names]))
    raise TypeError(f"{_OF_TYPE}{type(x).__name__}")


def _capture(torch: Any, g: _Group, e: _Entry, orig_call: Any, module: Any, args: Any, kwargs: Any,
             tensors: list[Any]) -> None:
    with normal_tensors(torch):
        e.static_in = [t.clone() for t in tensors]
    s_args, s_kwargs = remake((args, kwargs), torch.Tensor, iter(e.static_in))
    g.stream.synchronize()
    torch.cuda.current_stream().synchronize()  # (the clones above, where the script set its own stream)
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
    # no automatic garbage collection until the capture ends, in any thread (the runtime's
    # gc_paused; torch.cuda.graph no longer collects as it starts, and a collection here costs
    # ~0.1 s a capture). A finalizer run inside the capture is the likely cause of failed
    # thread-graph captures on the H100 (a hooked run after another in one process: 10 of 24
    # runs on two machines; not seen in 12 runs on a third machine, with or without this;
    # bench/gpu/results/final_h100_2026-11-26c)
    from recsys_doctor.runtime._serve_entry import gc_paused

    try:
        with gc_paused():
            out = _capture_into(torch, graph, stream, run)
    finally:
        torch.cuda.set_stream(prev)
        gate.release_exclusive()
    stream.synchronize()
    return graph, out


def _capture_into(torch: Any, graph: Any, stream: Any, run: Any) -> Any:
    """Capture ``run()`` into ``graph`` on ``stream``; returns its output."""
    try:
        # one eager run by THIS thread on the capture stream first: the warm-up calls may
        # have been made by other threads of the group, and a thread's first cuBLAS call
        # creates its handle (cublasCreate allocates, which a capture forbids:
        # CUBLAS_STATUS_NOT_INITIALIZED, then "operation failed due to a previous error
        # during capture" - what failed with more than 2 threads per group)
        with torch.cuda.stream(stream):
            run()
        stream.synchronize()
        # what the graph holds (counted against GRAPH_MEMORY_BUDGET): the growth of the memory
        # PyTorch reserves over the capture, from an emptied cache (torch.cuda.graph empties it
        # too, so the growth is not hidden): the graph's private pool, and what other threads
        # allocated meanwhile (an estimate that errs high)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            out = run()
        grew = max(0, torch.cuda.memory_reserved() - before)
        _state["graph_bytes"] = _state.get("graph_bytes", 0) + grew
        graph.rd_bytes = grew  # (given back to the budget when the graph is retired: .modstate)
        return out
    except BaseException:
        # torch.cuda.graph's __exit__ skips restoring the current stream when ending the
        # capture fails: without this the thread would stay on a stream whose capture is
        # broken, and every later copy of the thread would fail. End any capture still
        # open on that stream (the caller never uses the stream again).
        _end_broken_capture(stream)
        raise


class _TreeOut:
    """A captured output other than a tensor or a plain tuple of tensors (a dict, a list, a
    namedtuple, nested): its tensors and its pytree spec, so that each replay hands out
    exactly the structure the model returns."""

    __slots__ = ("leaves", "spec")

    def __init__(self, leaves: tuple[Any, ...], spec: Any) -> None:
        self.leaves = leaves
        self.spec = spec


def _static_out(torch: Any, out: Any) -> Any:
    """A captured model's output as replays hand it out: a tensor, a plain tuple of
    tensors, or a :class:`_TreeOut` (:func:`.buckets.outputs` says which outputs hold)."""
    outs = outputs(torch, out)
    if outs is None:
        raise TypeError(f"the model returns {type(out).__name__} holding something other than tensors")
    if isinstance(out, torch.Tensor) or type(out) is tuple and len(outs) == len(out):
        return out
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(out)  # plain leaves too (None, a version string): handed out as captured
    return _TreeOut(tuple(leaves), spec)


def _clone_out(static_out: Any, rows: tuple[int, int] | None = None) -> Any:
    """What a replay returns: a clone of the static output (the next replay overwrites it);
    with ``rows`` ``(n, b)``, of its first ``n`` rows where it has ``b`` (padded) rows."""
    if isinstance(static_out, tuple):
        return tuple(_clone_out(o, rows) for o in static_out)
    if isinstance(static_out, _TreeOut):
        from torch.utils._pytree import tree_unflatten

        return tree_unflatten([o if isinstance(o, PLAIN_LEAVES) else _clone_out(o, rows) for o in static_out.leaves],
                              static_out.spec)
    return (cut_rows(static_out, *rows) if rows else static_out).clone()


def _eager(orig_call: Any, module: Any, args: Any, kwargs: Any, site: str, reason: str) -> Any:
    """The call as the script made it, on the group's stream, counted as left to PyTorch."""
    fell_back("model", site, reason)
    return _run_shared(orig_call, module, *args, **kwargs)


def _site_of(g: _Group, module: Any) -> _Site:
    s: _Site | None = g.sites.get(id(module))
    if s is None:
        s = g.sites[id(module)] = _Site()
    return s


def _graphed_call(orig_call: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  site: str = "?", kt: tuple[Any, list[Any]] | str | None = None) -> Any:
    """A top-level model call of a hooked thread, made at ``site`` (the script's line); ``kt``:
    its :func:`_key_or_reason` where the caller has made it already (:mod:`.batching`)."""
    torch = _torch()
    g: _Group = _tls.group
    if trains(module) or torch.is_grad_enabled():
        return _eager(orig_call, module, args, kwargs, site, GRAD_ON)
    tag = getattr(orig_call, "key_tag", None)
    if kt is None:
        kt = _key_or_reason(torch, module, args, kwargs, tag)
    if isinstance(kt, str):
        return _eager(orig_call, module, args, kwargs, site, kt)
    key, tensors = kt
    s = _site_of(g, module)
    n = call_rows(tensors)
    s.seen(n)
    if not s.pads(n):
        return _keyed_call(torch, g, s, orig_call, module, args, kwargs, site, key, tensors, args, kwargs, None)
    b = bucket_rows(n)
    pk = s.pad_keys.get((key, b))
    if pk is not None and s.padded_ok(pk) and getattr(g.entries.get(pk), "graph", None) is not None:
        # the steady state: the real rows copied into the padded graph's inputs, no padded tensors made
        return _keyed_call(torch, g, s, orig_call, module, args, kwargs, site, pk, tensors, None, None, (n, b))
    ptensors = pad_rows(torch, tensors, n, b)
    pargs, pkwargs = remake((args, kwargs), torch.Tensor, iter(ptensors))
    pkt = _key_or_reason(torch, module, pargs, pkwargs, tag)
    if isinstance(pkt, str):  # (never: the same structure, on the same devices) exact shapes then
        return _keyed_call(torch, g, s, orig_call, module, args, kwargs, site, key, tensors, args, kwargs, None)
    if len(s.pad_keys) < MAX_PAD_KEYS:
        s.pad_keys[(key, b)] = pkt[0]
    if not s.padded_ok(pkt[0]):
        return _verify_padding(torch, s, orig_call, module, args, kwargs, site, pargs, pkwargs, pkt[0], tensors,
                               n, b)
    return _keyed_call(torch, g, s, orig_call, module, args, kwargs, site, pkt[0], ptensors, pargs, pkwargs,
                       (n, b))


def _verify_padding(torch: Any, s: _Site, orig_call: Any, module: Any, args: Any, kwargs: Any, site: str,
                    pargs: Any, pkwargs: Any, pkey: Any, tensors: list[Any], n: int, b: int) -> Any:
    """One of the first padded calls of a bucket: the call as it is (its result is the one
    returned) and padded, both eager; padding stays on for the site only if the real rows are
    the same (:func:`.buckets.same_rows`), on a call whose padded tensors have rows that differ."""
    out = _eager(orig_call, module, args, kwargs, site, VERIFYING)
    if index_outputs(torch, out, n):  # (top-k or argmax indices over the rows: never padded)
        if s.no_pad is None:
            s.no_pad = INDEX_OUTPUT
            _fall_back(f"{type(module).__name__} ({site}): {INDEX_OUTPUT}", INDEX_OUTPUT)
        return out
    if not rows_differ(torch, tensors, n):
        return out  # no evidence either way: the next padded call of the bucket verifies
    try:
        ok = same_rows(torch, out, _run_shared(orig_call, module, *pargs, **pkwargs), n, b)
        why = MIXES_ROWS
    except Exception as ex:  # noqa: BLE001 - a model that fails on padded rows: exact shapes only
        ok, why = False, f"padded rows fail: {failure_reason(ex)}"
    if ok:
        s.verified[pkey] = s.verified.get(pkey, 0) + 1
    elif s.no_pad is None:
        s.no_pad = why
        _fall_back(f"{type(module).__name__} ({site}): {why}", why)
    return out


def _keyed_call(torch: Any, g: _Group, s: _Site, orig_call: Any, module: Any, args: Any, kwargs: Any, site: str,
                key: Any, tensors: list[Any], gargs: Any, gkwargs: Any, rows: tuple[int, int] | None) -> Any:
    """The call through the group's graph of ``key``: ``tensors``, ``gargs`` and ``gkwargs`` are
    the arguments at the key's shapes (``args``/``kwargs`` padded from ``n`` to ``b`` rows
    where ``rows`` is ``(n, b)``; ``gargs`` None: ``tensors`` are the call's own, of ``n``
    rows, padded as they are copied into the graph's inputs, and the key has a graph). Where
    it has no graph (warming up, the bound or the memory budget reached, a failed capture or
    replay), the call as the script made it, eagerly."""
    e = g.entries.get(key)
    if e is None:
        with g.lock:
            refused = s.refused(key)
            e = g.entries.setdefault(key, _Entry()) if refused is None else None
        if e is None:
            return _eager(orig_call, module, args, kwargs, site, refused or BOUND_REACHED)
    if e.reason is not None:
        return _eager(orig_call, module, args, kwargs, site, e.reason)
    with g.lock:
        if e.reason is not None:  # another thread's capture of this key failed meanwhile
            return _eager(orig_call, module, args, kwargs, site, e.reason)
        if e.graph is None and gargs is None:  # (never: asked only of a key with a graph)
            return _eager(orig_call, module, args, kwargs, site, WARMING_UP)
        if e.graph is None:
            e.calls += 1
            if e.calls == 1:  # the key's first call: does the model write into its arguments?
                return _first_warmup(torch, g, e, orig_call, module, args, kwargs, site)
            if e.calls <= WARMUP_CALLS:
                return _eager(orig_call, module, args, kwargs, site, WARMING_UP)
            if _state.get("graph_bytes", 0) >= GRAPH_MEMORY_BUDGET:
                _eager_from_now(g, e, module, site, BUDGET_SPENT)
                return _eager(orig_call, module, args, kwargs, site, BUDGET_SPENT)
            never = eager_reason(module)  # (another group's capture found it needs the host meanwhile)
            if never is not None:
                e.reason = never
                return _eager(orig_call, module, args, kwargs, site, never)
            try:
                _capture(torch, g, e, orig_call, module, gargs, gkwargs, tensors)
                _state["captured"] += 1
            except Exception as ex:  # noqa: BLE001 - any capture failure means eager, with the reason
                _debug_traceback()
                _synchronize_quietly(torch)
                detail = failure_reason(ex)
                why = _eager_from_now(g, e, module, site, f"capture failed: {detail}")
                if needs_host(ex):
                    never_graph(module, f"{NEEDS_HOST}: {detail}")
                return _eager(orig_call, module, args, kwargs, site, why)
        try:
            cur = g.before_replay(torch)
            out = _run_shared(_replay, e, tensors, rows, gargs is None)
            g.after_replay(cur)
            taken_over("model", site)
            return out
        except Exception as ex:  # noqa: BLE001 - replay trouble: eager from now on, with the reason
            why = _eager_from_now(g, e, module, site, f"replay failed: {failure_reason(ex)}")
    return _eager(orig_call, module, args, kwargs, site, why)


def _first_warmup(torch: Any, g: _Group, e: _Entry, orig_call: Any, module: Any, args: Any, kwargs: Any,
                  site: str) -> Any:
    """A key's first call, eager as every warm-up call, watched for writes into the call's own
    tensor arguments (:mod:`.argwrites`): where the model makes one, the key runs eagerly from
    now on (a graph would write its static inputs instead of the script's tensors)."""
    tensors: list[Any] = []
    flatten((args, kwargs), torch.Tensor, tensors)
    fell_back("model", site, WARMING_UP)
    out, op = _run_shared(watched_call, torch, lambda: orig_call(module, *args, **kwargs), module, tensors)
    if op is not None:
        _eager_from_now(g, e, module, site, f"{WRITES_ARGS} ({op})")
    return out


def _eager_from_now(g: _Group, e: _Entry, module: Any, site: str, reason: str) -> str:
    """Key ``e`` of group ``g`` has no graph from now on, for ``reason`` (said once, as a
    fallback of the hook); returns ``reason``."""
    e.reason = reason
    e.graph = None
    _fall_back(f"{type(module).__name__} ({site}) on group {g.index}: running eagerly ({reason})", reason)
    return reason


def _replay(e: _Entry, tensors: list[Any], rows: tuple[int, int] | None = None, pad: bool = False) -> Any:
    """Copy the call's tensors into ``e``'s inputs (with ``pad``: ``tensors`` of ``n`` rows
    into a graph of ``b``, ``rows`` ``(n, b)``, each padded one's last row copied into the rest),
    replay, return the outputs (cut back to ``n`` rows where ``rows``)."""
    torch = _torch()
    if pad and rows is not None:
        n = rows[0]
        views = e.pad_views.get(n)
        if views is None:
            views = e.pad_views[n] = pad_views(e.static_in, tensors, n)
        srcs: list[Any] = []
        for t, padded in zip(tensors, views[1]):
            srcs += [t, t[n - 1:n]] if padded else [t]
        torch._foreach_copy_(views[0], srcs)
    else:
        torch._foreach_copy_(e.static_in, tensors)
    e.graph.replay()
    _state["replays"] += 1
    return _clone_out(e.static_out, rows)
