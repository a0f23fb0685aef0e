"""A model that takes host tensors and copies them itself, inside ``forward``
(``x.to(self.device)``, ``x.cuda()``, ``x.to(dev, non_blocking=True)``, ``torch.as_tensor(x,
device=dev)``): its calls taken over into the graphs, copies included.

Unhooked, such a call cannot be graphed (an argument is on the CPU) and each copy inside
``forward`` is PyTorch's synchronous copy. What the hook does instead, at a top-level call of a
hooked thread (eval mode, gradients off) whose tensor arguments include plain, contiguous CPU
tensors (pageable or pinned):

* each host argument's bytes are written into the thread's own pinned slot for that argument's
  position (:func:`.staging.slot_fill`: the slots of the top-level copies, one per position,
  reused every query, written again only once the event recorded after the last model call has
  completed), and copied to the group's device without blocking (:func:`.staging.slot_to_device`);
* the call then goes the way of a call with those device copies as its arguments
  (:func:`.thread_graphs._copies_call`): the thread's own graph of the copies and the model, or
  the group's graphs per shape bucket (:mod:`.buckets`: the last partial batch padded where that
  is verified), or eagerly, counted, where its shape has no graph;
* wherever ``forward`` does run (eager calls, warm-ups, captures, verifications of padding), it
  gets, in place of each host argument, a *host proxy*: a CPU tensor (the script's own tensor,
  aliased, where the call is the script's) whose first copy to that device (``.to``, ``.cuda``,
  ``torch.as_tensor`` / ``torch.tensor`` with that device, in its own dtype) returns the device
  tensor the hook made, so that a capture records the copies as the graph's own inputs. Reading
  its shape, dtype or device, and casts or ``.contiguous()`` that give the tensor itself, need
  nothing more.

Any other use of a host proxy in ``forward`` (arithmetic on the CPU, ``.numpy()``, indexing, a
second copy, returning it) runs on the host data, as unhooked: the script's own tensor (in
place too), or, in the hook's own runs, the device tensor's values copied back (in a capture,
an error: the capture fails and the call runs eagerly, as for any uncapturable call). The model
is then left its host arguments from its next call on, said once with the operation and the line
of ``forward`` (``stats()["fallbacks"]``); its copies are PyTorch's again, counted at their lines.
A result never holds a proxy (a returned host argument is the script's own tensor) nor a slot.

Not taken over: numpy arrays passed to a model (what ``forward`` does with them never goes
through PyTorch, so no graph can know that it only copies them), tensors that need grad, are not
contiguous or over ``MAX_COPY`` bytes, dtypes numpy lacks, calls in training mode or with
gradients on, and calls on a stream the script set or during a capture (:func:`.pageable.copy_hazard`).
"""

from __future__ import annotations

from typing import Any

from ._common import _state, _tls, trains
from .accounting import fell_back, script_site, taken_over
from .argtree import flatten, remake
from .fallback import _fall_back, torch_reader
from .pageable import MAX_COPY, _host_array, copy_hazard, inexact
from .staging import _ThreadCopies, slot_fill, slot_room, slot_to_device

#: how the reason for a model that uses a host argument on the host begins
HOST_USE = "the model uses a host argument on the host"
#: what the keys of a call whose host arguments were taken over carry (its graphs are not those of
#: the same model called with device tensors: a ``forward`` may tell a CPU input from a GPU one)
KEY_TAG = "host arguments"
#: why a copy of a host argument inside forward is PyTorch's (counted at forward's line)
LEFT_TO_PYTORCH = "a copy of a host argument that forward used on the host or copied already, left to PyTorch"


def host_arrays(torch: Any, hosts: list[Any]) -> list[Any] | None:
    """Each host argument's bytes (a C-contiguous numpy array, :func:`.pageable._host_array`), or
    None where any one cannot go through a slot: a tensor subclass, one that needs grad, is not
    contiguous (its device copy would have other strides), is not dense (sparse) or holds more
    than ``MAX_COPY`` bytes, a dtype numpy lacks."""
    out = []
    for t in hosts:
        if type(t) is not torch.Tensor or t.layout is not torch.strided or t.requires_grad or not t.is_contiguous():
            return None
        a, _why = _host_array(torch, t, None)
        if a is None or a.nbytes > MAX_COPY:
            return None
        out.append(a)
    return out


def take(torch: Any, st: _ThreadCopies, orig_call: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
         site: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """A top-level model call, made at ``site``, whose host tensor arguments go through the
    thread's slots: ``(call, args, kwargs)`` to make instead, the arguments being the device
    copies and ``call`` running ``forward`` on host proxies of them (:func:`host_call`); None
    where there is none to take or they cannot be taken (the call goes on as the script made it).
    Not looked at while the query's own copies wait for the thread graph (``st.pending``)."""
    if st.pending or trains(module) or torch.is_grad_enabled() or id(module) in _state.setdefault("host_use", {}):
        return None
    tensors: list[Any] = []
    plain = flatten((args, kwargs), torch.Tensor, tensors)  # (else remake would change a container's type)
    at = [i for i, t in enumerate(tensors) if t.get_device() < 0 and t.is_cpu]
    if not at or not plain:
        return None
    hosts = [tensors[i] for i in at]
    arrays = host_arrays(torch, hosts)
    dev = _tls.group.stream.device
    if arrays is None or not slot_room(st, len(at)) or copy_hazard(torch, dev) is not None:
        return None
    copies = []
    for i, a in zip(at, arrays):
        tensors[i] = slot_to_device(torch, st, slot_fill(torch, st, a), dev)
        copies.append(tensors[i])
    taken_over("h2d", site, len(at))
    args, kwargs = remake((args, kwargs), torch.Tensor, iter(tensors))
    return host_call(torch, orig_call, at, hosts, copies, dev), args, kwargs


def host_call(torch: Any, orig_call: Any, at: list[int], hosts: list[Any], copies: list[Any], dev: Any) -> Any:
    """``orig_call`` for arguments in which the tensors at the positions ``at`` are device
    copies of ``hosts``: ``forward`` gets a host proxy of each (over the script's tensor where
    it is that call's own copy, ``copies``; over the values of whatever the hook passes there
    else: a static input, a padded copy), and its result no proxy. Keys of its graphs carry
    ``KEY_TAG``."""
    def call(module: Any, *args: Any, **kwargs: Any) -> Any:
        T = torch.Tensor
        tensors: list[Any] = []
        flatten((args, kwargs), T, tensors)
        cls = _state["host_type"]
        proxies = []
        for j, i in enumerate(at):
            d = tensors[i]
            tensors[i] = _proxy(torch, cls, hosts[j] if d is copies[j] else None, d, dev, module)
            proxies.append(tensors[i])
        args, kwargs = remake((args, kwargs), T, iter(tensors))
        try:
            out = orig_call(module, *args, **kwargs)
            return _released(torch, cls, out)
        finally:
            for p in proxies:  # kept by the script or the model after the call: its host tensor, as it is
                p._rd_used, p._rd_owner = True, None

    call.key_tag = KEY_TAG  # type: ignore[attr-defined]
    return call


def _proxy(torch: Any, cls: type[Any], host: Any, d: Any, dev: Any, owner: Any) -> Any:
    """A host proxy of device tensor ``d``: an alias of ``host`` (the script's tensor, whose
    values ``d`` holds), or where there is none, a CPU tensor filled from ``d`` on first use."""
    p = (host if host is not None else torch.empty(d.shape, dtype=d.dtype)).as_subclass(cls)
    p._rd_dev, p._rd_target, p._rd_owner, p._rd_used = d, dev, owner, False
    p._rd_host, p._rd_fill = host, (d if host is None else None)
    return p


def _released(torch: Any, cls: type[Any], out: Any) -> Any:
    """A model's result with no host proxy in it, at any depth (:mod:`.argtree`'s walk: a
    named tuple made again as its own type): a proxy returned is a use of it (:func:`_use`),
    replaced by its host tensor."""
    found: list[Any] = []
    flatten(out, cls, found)
    if not found:
        return out
    return remake(out, cls, iter([_release(torch, p) for p in found]))


def _release(torch: Any, p: Any) -> Any:
    _use(torch, p, "returned by forward")
    if p._rd_host is not None:
        return p._rd_host
    with torch._C.DisableTorchFunctionSubclass():
        return p.as_subclass(torch.Tensor)


def _capturing(torch: Any) -> bool:
    """Whether the current stream is capturing a CUDA graph (False for a PyTorch without CUDA)."""
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except (RuntimeError, AttributeError, TypeError):  # a PyTorch without CUDA
        return False


def _use(torch: Any, p: Any, what: Any) -> None:
    """A use of host proxy ``p`` other than its one copy to the device: from now on it is its
    host tensor; in the hook's own runs its values are copied back from the device first (in a
    capture: an error, which fails the capture); its model is left its host arguments."""
    p._rd_used = True
    owner = p._rd_owner
    name = what if isinstance(what, str) else getattr(what, "__name__", type(what).__name__)
    if owner is not None and id(owner) not in _state.setdefault("host_use", {}):
        where, hint = torch_reader(2)
        reason = f"{HOST_USE} ({name}{where}, {script_site(2)}" + (
            f"; {hint})" if hint else ")")
        if _state["host_use"].setdefault(id(owner), reason) is reason:  # said once, whichever thread saw it
            _fall_back(f"{type(owner).__name__}: {reason}: its host arguments are its own from now on", reason)
    if p._rd_fill is not None:
        if _capturing(torch):
            raise RuntimeError(f"a host argument used on the host during a capture ({name})")
        with torch._C.DisableTorchFunctionSubclass():
            p.copy_(p._rd_fill)
        p._rd_fill = None


def make_host_type(torch: Any, parse_to: Any, parse_cuda: Any, to: Any, cuda: Any) -> type:
    """The host proxies' tensor subclass. ``parse_to`` / ``parse_cuda``: ``(args, kwargs) ->
    Move or None`` for ``Tensor.to`` / ``Tensor.cuda`` (:func:`.pageable.to_args`); ``to`` / ``cuda``: PyTorch's own methods (the patched ones wrap them)."""
    T = torch.Tensor
    to, cuda = getattr(to, "__wrapped__", to), getattr(cuda, "__wrapped__", cuda)  # (the hook's patches wrap them)
    meta = {T.shape.__get__, T.dtype.__get__, T.device.__get__, T.is_cuda.__get__, T.is_cpu.__get__,
            T.ndim.__get__, T.requires_grad.__get__, T.layout.__get__, T.get_device, T.dim, T.size, T.numel,
            T.nelement, T.stride, T.is_contiguous, T.is_pinned, T.element_size, T.__len__, T.is_floating_point}
    casts = {T.long: torch.int64, T.int: torch.int32, T.float: torch.float32, T.double: torch.float64,
             T.half: torch.float16, T.bool: torch.bool}
    itself = {T.contiguous, T.detach}

    def plain(func: Any, args: Any, kwargs: Any) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def copied(self: Any, p: Any) -> Any:
        """The device tensor, where ``p`` (parsed) asks for this proxy's one copy to its device."""
        d = self._rd_dev
        if self._rd_used or p is None or p[0] != self._rd_target or p[1] not in (None, d.dtype):
            return None
        self._rd_used = True
        return d

    class HostArg(T):  # type: ignore[misc, valid-type]
        """A model's host argument in ``forward``, whose device copy the hook made."""

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in meta:
                return plain(func, args, kwargs)
            self = args[0] if args else None
            base = getattr(func, "__wrapped__", func)
            if type(self) is cls and (base is to or base is cuda):
                p = (parse_to if base is to else parse_cuda)(args[1:], kwargs)
                # (copy=True asks for a tensor of its own: not the one copy the hook made; the layout
                # is asked of the proxy as a plain tensor, not as a use of it)
                out = None if p is None or p.copy or plain(inexact, (torch, self, p), {}) else copied(self, p)
                if out is not None:
                    return out
                if p is not None:  # a copy to the GPU that is not the hook's: PyTorch's, counted
                    fell_back("h2d", script_site(2), LEFT_TO_PYTORCH)
            elif (type(self) is cls and not self._rd_used and len(args) == 1 and not kwargs
                  and (func in itself or casts.get(func) == self._rd_dev.dtype)):
                return self
            found: list[Any] = []
            flatten((args, kwargs), cls, found)
            for q in {id(q): q for q in found}.values():  # each proxy once
                _use(torch, q, func)
            return plain(func, args, kwargs)

        def rd_take(self, orig: Any, name: str, args: Any, kwargs: Any, p: Any) -> Any:
            """``torch.as_tensor`` / ``torch.tensor`` (``name``, PyTorch's ``orig``) of this proxy,
            ``p`` its parsed ``(device, dtype)`` or None: the device tensor where it is this
            proxy's copy to its device; ``torch.as_tensor(x)`` alone, the proxy itself."""
            if p is not None:
                out = copied(self, (p[0], p[1], False))
                if out is not None:
                    return out
                fell_back("h2d", script_site(2), LEFT_TO_PYTORCH)
            elif name == "as_tensor" and len(args) + len(kwargs) == 1:
                return self
            _use(torch, self, name)
            return orig(*args, **kwargs)

    return HostArg
