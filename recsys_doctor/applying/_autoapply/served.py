"""Batched model calls served by the runtime (the plan's ``batching``): a plain script whose
threads copy pinned host tensors to the GPU and call the model with the copies gets the
runtime's own batched serving (:func:`recsys_doctor.runtime.serve`, ``batching=True``), fed
from the script's host tensors, instead of the hook's per-group batches of device tensors.

Why: with batching, the hook's own path (:mod:`.batching`) leaves the script's copies to
PyTorch (28 ``.to()`` a query for ``examples/plain_serving_script.py``: an allocation, a
cudaMemcpyAsync and an event each), and its batches are device-to-device. On the H100 the
script's own loop calling ``served(*host_tensors)`` ran 7.0k q/s (1 group) and 10.8k q/s (2
groups) with 8 threads, against 2.9k for the hook's best plan and 0.53-0.57k for its batched
plans, the script unhooked at 237 q/s, same machine. Through the hook (the script's 28 copies
and its ``.cpu()`` intercepted) the route ran 2.7-3.9k q/s at g1, below the thread graphs'
4.2-5.0k of the same calls (``bench/apply/results/served_route_h100/``): ``profile --apply``
measures both and keeps the faster.

* **Which calls.** A top-level call, made by a hooked thread with gradients off and the module
  in eval mode, whose tensor arguments are exactly the thread's ``.to("cuda", non_blocking=True)``
  copies of pinned, contiguous CPU tensors made just before it, in the same order as on the
  call the route was learned from (the same bookkeeping as a thread graph's:
  :mod:`.staging`; here the :class:`.staging._ThreadGraph` has no graph). Keyword tensor
  arguments, other arguments, another order: the call goes the hook's batched path, with the
  copies made first.
* **The copies** are deferred views (:mod:`.staging`): the route hands the runtime the pinned
  host tensors themselves (its staging copies them into its pinned buffer, one host-to-device
  copy a batch), so the views' device memory is never written. A view the script still holds
  when this thread next reaches the hook (its output read, its next copy or model call) gets
  its copy then, from its pinned tensor (:func:`settle`): the script cannot have rewritten
  that tensor before, since it has not yet read anything the call made. (Not covered: a script
  that keeps an input copy, synchronizes through something else than the call's output, rewrites
  the pinned tensor and only then reads the kept copy. :func:`settle` runs at the output's
  first use, which a script reads before reusing its inputs.)
* **The outputs** are the runtime's host copies, handed out as tensors on the GPU
  (:class:`HostOutput`, made by :func:`host_output_type`) whose ``.cpu()``, ``.tolist()``,
  ``.item()`` and ``.to("cpu")`` read the host copy with no CUDA call; any other use first
  copies it to the GPU (on the thread's stream) and runs on that.
* **One served model per module**, made on its first routed call with that call's host
  tensors as the example (every group captured up front; other signatures are the runtime's
  to capture), under the hook's exclusive gate, with the plan's groups and ``max_batch``.
  Where the runtime cannot serve it (it raises, or a call through it does) or refuses to batch
  its inputs (then it would serve them one by one, which the thread's own path does better),
  the module is not routed again, with the reason among the fallbacks; its calls go the hook's
  batched path and the threads' copies are PyTorch's again.
"""

from __future__ import annotations

import threading
from typing import Any

from ._common import _first_line, _state, _tls, normal_tensors, trains
from .accounting import taken_over
from .fallback import _fall_back
from .argtree import Slot, flatten, matches, remake, skeleton
from .pageable import _cuda_at
from .deferred import _materialize, settle
from .staging import _ThreadCopies, _ThreadGraph
from .modstate import fresh
from .thread_graphs import NOT_COPIES, copy_sources, count_copies, drop_stale

#: why a model's calls are not served by the runtime (the reason's first part)
NOT_SERVED = "not served by the runtime's batching"


class _Route:
    __slots__ = ("served", "refused", "lock")

    def __init__(self) -> None:
        self.served: Any = None
        self.refused: str | None = None
        self.lock = threading.Lock()


def call(torch: Any, st: _ThreadCopies, orig_call: Any, module: Any, args: tuple[Any, ...],
         kwargs: dict[str, Any], site: str) -> tuple[Any] | None:
    """A hooked thread's top-level model call where the plan batches: ``(output,)`` where the
    runtime served it, else None (the copies this query deferred are made, and the caller goes
    the hook's batched path)."""
    settle(torch, st)
    drop_stale(torch, st, module)
    tg, n = st.tg, st.n
    st.n = 0
    recent, st.recent = st.recent, []
    if (tg is not None and tg.graph is None and st.pending and n == len(tg.src) and fresh(tg, module)
            and not kwargs and not trains(module) and not torch.is_grad_enabled()
            and matches(tg.template, (args, kwargs), torch.Tensor, iter(tg.handed))):
        r = _route_of(module)
        out = _serve(torch, st, tg, r, module) if r.refused is None else None
        if out is not None:
            taken_over("model", site)
            count_copies(tg)
            return out
    if st.pending:
        st.n = n
        _materialize(torch, st)
    st.n = 0
    refused = _route_of(module).refused if tg is not None and fresh(tg, module) else None
    if refused is not None:
        st.tg, st.reason = None, refused  # (its copies are PyTorch's again)
    if (tg is None and st.reason is None and recent and not kwargs and not trains(module)
            and not torch.is_grad_enabled()):
        _learn(torch, st, module, args, recent)
    return None


def _serve(torch: Any, st: _ThreadCopies, tg: _ThreadGraph, r: _Route, module: Any) -> tuple[Any] | None:
    host_args = remake(tg.template, Slot, iter(tg.src))[0]
    g = _tls.group
    _tls.group = None  # the runtime's work in this thread (a lent batch, a capture) is not the script's
    try:
        served = r.served if r.served is not None else _make(torch, r, module, host_args)
        out = served(*host_args) if served is not None else None
    except Exception as ex:  # noqa: BLE001 - the hook's own path from now on, with the reason
        _refuse(r, module, _first_line(ex))
        out = None
    finally:
        _tls.group = g
    if out is None:  # (the call is counted where it goes next)
        return None
    st.pending = False
    st.routed = True
    with _state["batch_lock"]:
        _state["served_calls"] = _state.get("served_calls", 0) + 1
    return (_wrap(torch, out, _cuda_at(torch, tg.device), st),)


def _route_of(module: Any) -> _Route:
    routes: dict[int, tuple[Any, _Route]] = _state.setdefault("routes", {})
    hit = routes.get(id(module))
    if hit is None or hit[0] is not module:
        with _state["batch_lock"]:
            hit = routes.get(id(module))
            if hit is None or hit[0] is not module:
                hit = routes[id(module)] = (module, _Route())
    return hit[1]


def _make(torch: Any, r: _Route, module: Any, host_args: tuple[Any, ...]) -> Any:
    """The module's served model (made once, by the first thread to get here, every other
    hooked thread's model work held off meanwhile); None where it was refused."""
    with r.lock:
        if r.served is None and r.refused is None:
            from recsys_doctor.runtime import serve

            gate = _state["gate"]
            gate.acquire_exclusive()
            try:
                # the switch interval left as the script has it and one driver thread: the hook keeps
                # its served models for the script's life, and a shorter interval and a second driver
                # were measured for the runtime's own clients only
                sm = serve(module, host_args, groups=_state["n_groups"], merge=True, graphs=True,
                           batching=True, max_batch=_state["max_batch"], switch_interval_ms=None, drivers=1)
            finally:
                gate.release_exclusive()
            _state.setdefault("served_models", []).append(sm)
            if sm.batching_refused is not None:  # unbatched, the hook's own path is the better one
                _refuse(r, module, f"the runtime refused batching: {sm.batching_refused}")
                return None
            r.served = sm
        return r.served


def _refuse(r: _Route, module: Any, why: str) -> None:
    """The module is not routed again: the reason on stderr and among the fallbacks."""
    r.refused = f"{NOT_SERVED}: {why}"
    _fall_back(f"{type(module).__name__}: {r.refused}; its calls take the hook's batched path", r.refused)


def _learn(torch: Any, st: _ThreadCopies, module: Any, args: tuple[Any, ...],
           recent: list[tuple[Any, Any, Any, Any, str]]) -> None:
    """The thread's route: every tensor argument of this call is one of this query's copies of
    a pinned tensor (a :class:`_ThreadGraph` without a graph: the copies' sources and order)."""
    tensors: list[Any] = []
    if not flatten((args, {}), torch.Tensor, tensors) or not tensors:
        st.reason = "the call's arguments are not all the thread's copies"
        return
    found = copy_sources(recent, tensors) if all(t.is_cuda for t in tensors) else None
    if found is None:
        st.reason = NOT_COPIES
        return
    src, moves, raws, lines = found
    with normal_tensors(torch):
        tin = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    tg = _ThreadGraph(module, None, src, tin, skeleton((args, {}), torch.Tensor), None, tensors[0].get_device(), moves,
                      lines)
    tg.raw = raws
    st.tg = tg


def _wrap(torch: Any, out: Any, dev: Any, st: _ThreadCopies) -> Any:
    typ = _state.get("host_output_type")
    if typ is None:
        typ = _state["host_output_type"] = host_output_type(torch)
    if type(out) is torch.Tensor:
        return typ(out, dev, st)
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: typ(x, dev, st) if isinstance(x, torch.Tensor) else x, out)


def _host_copy(torch: Any, host: Any) -> Any:
    """A copy of a host tensor the caller owns (numpy's copy where it can: no release of the
    interpreter lock, which a PyTorch call makes and another thread may then hold)."""
    try:
        return torch.from_numpy(host.numpy().copy())
    except (TypeError, RuntimeError):  # (a dtype numpy lacks)
        return host.clone()


def host_output_type(torch: Any) -> type:
    """A GPU tensor backed by a host copy of its values (the runtime's output): reading it back
    to the host (``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.item()``, ``.numpy()`` after
    ``.cpu()``) needs no CUDA call; any other operation copies it to the GPU first (once) and
    runs there, as eager's output would."""
    aten = torch.ops.aten
    host_reads = {aten._to_copy.default, aten._local_scalar_dense.default}

    class HostOutput(torch.Tensor):  # type: ignore[misc, valid-type]
        __torch_function__ = torch._C._disabled_torch_function_impl
        _rd_host: Any
        _rd_dev: Any
        _rd_st: Any

        @staticmethod
        def __new__(cls, host: Any, device: Any, st: Any) -> Any:
            r = torch.Tensor._make_wrapper_subclass(cls, host.shape, dtype=host.dtype, device=device,
                                                    strides=host.stride(), requires_grad=False)
            r._rd_host, r._rd_dev, r._rd_st = host, None, st
            return r

        def _rd_host_values(self) -> Any:
            """The host copy, for a read that needs nothing else. Every use of the output goes
            through here or :meth:`_rd_device`, and both first settle the query's held input views."""
            if self._rd_st is not None:
                settle(torch, self._rd_st)
            return self._rd_host

        def _rd_device(self) -> Any:
            host = self._rd_host_values()
            if self._rd_dev is None:  # (PyTorch's own copy, not the hook's: this is not the script's copy)
                to = _state.get("orig_tensor_methods", {}).get("to", torch.Tensor.to)
                self._rd_dev = to(host, self.device)
            return self._rd_dev

        def cpu(self, memory_format: Any = torch.preserve_format) -> Any:  # (no trip through the dispatcher)
            if self._rd_dev is not None or memory_format is not torch.preserve_format:
                return self._rd_device().cpu(memory_format=memory_format)
            return _host_copy(torch, self._rd_host_values())

        def tolist(self) -> Any:  # (PyTorch's refuses tensor subclasses)
            return (self._rd_host_values() if self._rd_dev is None else self._rd_device()).tolist()

        def __repr__(self, *, tensor_contents: Any = None) -> str:  # (shown as the GPU tensor it stands for)
            return repr(self._rd_device())

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            x = args[0] if args else None
            if func in host_reads and isinstance(x, HostOutput) and x._rd_dev is None and len(args) == 1:
                if func is aten._local_scalar_dense.default:
                    return x._rd_host_values().item()
                dev = kwargs.get("device")
                if (dev is not None and torch.device(dev).type == "cpu" and kwargs.get("dtype") in (None, x.dtype)
                        and kwargs.get("layout") in (None, torch.strided) and not kwargs.get("pin_memory")
                        and kwargs.get("memory_format") in (None, torch.preserve_format)):
                    return _host_copy(torch, x._rd_host_values())
            from torch.utils._pytree import tree_map

            def real(t: Any) -> Any:
                return t._rd_device() if isinstance(t, HostOutput) else t

            return func(*tree_map(real, args), **tree_map(real, kwargs))

    return HostOutput
