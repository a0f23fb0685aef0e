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

Why one module of ~460 lines: it is loaded by file path at interpreter start, before the
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
from typing import Any

__all__ = ["activate", "deactivate", "read_runtime", "stats", "ENV_PLAN", "WARMUP_CALLS"]

ENV_PLAN = "RECSYS_DOCTOR_PLAN"
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
    __slots__ = ("calls", "graph", "static_in", "static_out", "out_is_tuple", "reason")

    def __init__(self) -> None:
        self.calls = 0
        self.graph: Any = None
        self.static_in: list[Any] = []
        self.static_out: Any = None
        self.out_is_tuple = False
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
    except Exception:
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


def _key_part(T: type, x: Any, tensors: list[Any]) -> Any:
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
    graph = torch.cuda.CUDAGraph()
    # capture on a private stream, never on the group stream: the other threads of the
    # group keep enqueuing their copies on the group stream meanwhile, and work from
    # another thread must not land in (or invalidate) this capture. Replays then run on
    # the group stream (the current stream of the calling thread).
    if g.capture_stream is None:
        g.capture_stream = torch.cuda.Stream()
    gate: _Gate = _state["gate"]
    prev = torch.cuda.current_stream()
    gate.acquire_exclusive()
    try:
        # one eager run by THIS thread on the capture stream first: the warm-up calls may
        # have been made by other threads of the group, and a thread's first cuBLAS call
        # creates its handle (cublasCreate allocates, which a capture forbids:
        # CUBLAS_STATUS_NOT_INITIALIZED, then "operation failed due to a previous error
        # during capture" - what failed with more than 2 threads per group)
        with torch.cuda.stream(g.capture_stream):
            orig_call(module, *s_args, **s_kwargs)
        g.capture_stream.synchronize()
        with torch.cuda.graph(graph, stream=g.capture_stream, capture_error_mode="thread_local"):
            out = orig_call(module, *s_args, **s_kwargs)
    except BaseException:
        # torch.cuda.graph's __exit__ skips restoring the current stream when ending the
        # capture fails: without this the thread would stay on a stream whose capture is
        # broken, and every later copy of the thread would fail. End any capture still
        # open on that stream and never use the stream again.
        _end_broken_capture(g.capture_stream)
        g.capture_stream = None
        raise
    finally:
        torch.cuda.set_stream(prev)
        gate.release_exclusive()
    g.capture_stream.synchronize()
    if isinstance(out, torch.Tensor):
        e.static_out, e.out_is_tuple = out, False
    elif isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        e.static_out, e.out_is_tuple = tuple(out), True
    else:
        raise TypeError(f"the model returns {type(out).__name__}, not a tensor or a tuple of tensors")
    e.graph = graph


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
                except Exception:
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
    if e.out_is_tuple:
        return tuple(o.clone() for o in e.static_out)
    return e.static_out.clone()


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
            return _graphed_call(orig, self, args, kwargs)
        finally:
            _tls.depth = depth

    __call__.__wrapped__ = orig  # type: ignore[attr-defined]
    nn.Module.__call__ = __call__
    _state["patched_module"] = True
    _state["orig_module_call"] = orig


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
                      patched_module=False, captured=0, replays=0, fallbacks=[], gate=_Gate())
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
        _state["active"] = False


def stats() -> dict[str, Any]:
    """Groups created, threads placed, graphs captured, replays, fallback reasons."""
    return {"active": _state.get("active", False), "groups": _state.get("n_groups"),
            "graphs": _state.get("graphs"), "threads": _state.get("started", 0),
            "captured": _state.get("captured", 0), "replays": _state.get("replays", 0),
            "fallbacks": list(_state.get("fallbacks", []))}


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
