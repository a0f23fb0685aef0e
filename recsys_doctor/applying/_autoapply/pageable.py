"""Host-to-device copies from pageable memory, taken over: a hooked thread's ``.cuda()``,
``.to(cuda)``, ``torch.as_tensor(x, device=cuda)`` and ``torch.tensor(x, device=cuda)`` of host
data (numpy, lists, CPU tensors) are staged through the thread's pinned buffers and copied
asynchronously on its stream, instead of PyTorch's synchronous copy from pageable memory.

What PyTorch does for such a copy: the data goes through a pinned bounce buffer of the driver
and the calling thread waits for the copy (and so for everything queued before it on its
stream) - a synchronization per copy, with the GIL released and taken back each time. A query
that moves five arrays waits five times. What the hook does instead, with the same result:

* the bytes are copied at once, on the host, into a pinned buffer of the thread (so the
  script may change or free its array as soon as the call returns, as after PyTorch's copy);
  a dtype asked for is converted first on the CPU, as PyTorch does for a host-to-device copy;
* the device tensor is allocated on the thread's group stream and filled there by one
  asynchronous copy from that pinned buffer: every later use of it on that stream is ordered
  after the copy (a copy made on a stream the script set itself is left to PyTorch, since the
  script may then use the result on yet another stream);
* each thread has two pinned buffers used in turn; before one is written again, the copies
  made from it last time have completed (events on every stream that copied from it).

Left to PyTorch (and counted per line of the script, :mod:`.accounting`): copies during a CUDA
graph capture or on a stream the script set, tensors that need gradients, dtypes and layouts
numpy cannot hold (bfloat16, quantized, sparse, ...), numpy object or non-native byte-order
arrays, forms of the call this module does not parse, and copies larger than ``MAX_COPY``
bytes (or the staging buffer).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from ._common import _first_line, _state, _tls, normal_tensors
from .accounting import fell_back, script_site, taken_over

#: why a copy from host memory is PyTorch's while staging is off (the default)
LEFT_SYNCHRONOUS = ("a synchronous copy from host memory, left to PyTorch (staging it measured slower; "
                    "RECSYS_DOCTOR_STAGE_PAGEABLE=1 stages it)")
#: why an asynchronous copy from pinned memory is PyTorch's where no thread graph of the thread takes it
#: (not learned yet, or none: new pinned tensors every query, copies that feed no graphed call)
ASYNC_PINNED = "an asynchronous copy from pinned memory, left to PyTorch (no thread graph of this thread takes it)"
#: why a copy of a non-contiguous host tensor is PyTorch's (its copy keeps the source's strides)
NOT_CONTIGUOUS = "not taken over: a non-contiguous tensor (PyTorch's copy keeps its strides)"
#: bytes of each of a thread's two pinned buffers (``RECSYS_DOCTOR_STAGING_BYTES`` sets it)
ARENA_BYTES = 8 << 20
ENV_STAGING_BYTES = "RECSYS_DOCTOR_STAGING_BYTES"
#: the largest copy taken over; larger ones go to PyTorch (their cost is the bytes, not the call)
MAX_COPY = 2 << 20
#: start of each copy in the pinned buffer (the CUDA allocator's alignment)
ALIGN = 512


def _np() -> Any:
    import numpy  # what torch itself imports; loaded only when a copy is staged

    return numpy


class _Stager:
    """The pinned buffers of one hooked thread and where the next copy goes.

    Every step but the last holds the GIL (numpy, ``memoryview``, ``torch.from_numpy``): with
    many client threads each release of the GIL may hand it to another thread for a while, so
    a staged copy releases it once (the asynchronous copy), as often as PyTorch's own copy."""

    __slots__ = ("arenas", "views", "nps", "events", "streams", "cur", "off", "device", "size", "to")

    def __init__(self, torch: Any, device: Any, host_alloc: Any = None) -> None:
        alloc = host_alloc or (lambda n: _pinned(torch, n))
        self.size = int(os.environ.get(ENV_STAGING_BYTES) or ARENA_BYTES)
        self.arenas = [alloc(self.size), alloc(self.size)]
        self.nps = [a.numpy() for a in self.arenas]
        self.views = [memoryview(a) for a in self.nps]
        self.events: list[list[Any]] = [[], []]  # per arena: events after its copies (one per stream)
        self.streams: list[dict[int, Any]] = [{}, {}]  # per arena: the streams its copies went to
        self.cur = 0
        self.off = 0
        self.device = device
        self.to = _state.get("orig_tensor_methods", {}).get("to", torch.Tensor.to)

    def _switch(self, torch: Any) -> None:
        """Close the current buffer (an event on each stream it was copied on) and move to the
        other one once its last copies have completed."""
        i = self.cur
        evs = []
        for s in self.streams[i].values():
            ev = torch.cuda.Event()
            ev.record(s)
            evs.append(ev)
        self.events[i] = evs
        self.streams[i] = {}
        self.cur = j = 1 - i
        for ev in self.events[j]:
            ev.synchronize()
        self.events[j] = []
        self.off = 0

    def copy(self, torch: Any, a: Any, stream: Any = None) -> Any:
        """A device tensor equal to the C-contiguous numpy array ``a``, filled asynchronously
        on ``stream`` (the current stream; None on the CPU)."""
        np = _np()
        n = a.nbytes
        start = -(-self.off // ALIGN) * ALIGN
        if start + n > self.size:
            self._switch(torch)
            start = 0
        cur = self.cur
        if n:
            self.views[cur][start:start + n] = memoryview(a.reshape(-1).view(np.uint8))
        self.off = start + n
        host = torch.from_numpy(self.nps[cur][start:start + n].view(a.dtype).reshape(a.shape))
        out = self.to(host, self.device, non_blocking=True, copy=True)
        if stream is not None:
            self.streams[cur].setdefault(stream.cuda_stream, stream)
        return out


def _pinned(torch: Any, nbytes: int) -> Any:
    """A pinned host buffer of ``nbytes`` bytes (uint8), a normal tensor (:func:`._common.normal_tensors`)."""
    with normal_tensors(torch):
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


#: views of one slot kept (one per shape and dtype); a shape beyond them gets a new view each time
SLOT_VIEWS = 256
_TORCH_DTYPES: dict[Any, Any] = {}


class _Slot:
    """A hooked thread's pinned buffer for one copy position of its queries (the ``i``-th copy
    before a model call), with room for twice the first copy's bytes, so that row counts that
    vary (a last partial batch) use the same memory. A shape is handed out as the same view of
    the buffer every time (a thread graph knows its sources by identity), up to ``SLOT_VIEWS``."""

    __slots__ = ("buf", "views")

    def __init__(self, torch: Any, nbytes: int) -> None:
        self.buf = _pinned(torch, max(ALIGN, 1 << (2 * nbytes - 1).bit_length()))
        self.views: dict[tuple[Any, Any], tuple[Any, Any]] = {}

    def fits(self, a: Any) -> bool:
        return a.nbytes <= self.buf.numel()

    def fill(self, torch: Any, a: Any) -> Any:
        """The view of the buffer shaped as the numpy array ``a`` (which :meth:`fits`), holding its bytes."""
        key = (a.shape, a.dtype)
        v = self.views.get(key)
        if v is None:
            dt = _TORCH_DTYPES.get(a.dtype)
            if dt is None:
                dt = _TORCH_DTYPES[a.dtype] = torch.from_numpy(_np().empty(0, dtype=a.dtype)).dtype
            t = self.buf[:a.nbytes].view(dt).view(a.shape)
            v = (t, t.numpy())
            if len(self.views) < SLOT_VIEWS:
                self.views[key] = v
        v[1][...] = a
        return v[0]


def _stager(torch: Any, device: Any) -> _Stager:
    st = getattr(_tls, "pageable", None)
    if st is None or st.device != device:
        st = _tls.pageable = _Stager(torch, device)
    return st


def _c_order(a: Any) -> Any:
    """``a`` as a C-contiguous array, copied only where it is not (0-d stays 0-d, unlike
    ``numpy.ascontiguousarray``)."""
    return a if a.flags.c_contiguous else a.copy(order="C")


def _host_array(torch: Any, x: Any, dtype: Any) -> tuple[Any, str | None]:
    """(C-contiguous numpy array of the copy's bytes, None) or (None, why it is left to
    PyTorch). ``x``: a numpy array (``dtype`` None) or a CPU tensor, converted to ``dtype`` on
    the CPU first, as PyTorch converts for a copy between host and device."""
    np = _np()
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject or not x.dtype.isnative:
            return None, f"a numpy array of dtype {x.dtype}"
        return _c_order(x), None
    if x.requires_grad:
        return None, "a tensor that requires grad"
    if dtype is not None and dtype != x.dtype:
        x = x.to(dtype)
    try:
        a = x.numpy()
    except (TypeError, RuntimeError) as ex:  # a dtype or layout numpy has not (bfloat16, sparse, ...)
        return None, f"a {x.dtype} tensor ({_first_line(ex)})"
    return _c_order(a), None


def copy_hazard(torch: Any, device: Any) -> str | None:
    """Why no copy to ``device`` may be taken over now (every way the hook takes one over is
    asynchronous on the current stream, its group's), else None: a CUDA graph capture is running,
    the copy is to another GPU than the group's, or the script set a stream of its own (it may
    use the result on yet another)."""
    if device.type != "cuda":
        return None
    if torch.cuda.is_current_stream_capturing():
        return "a copy during a CUDA graph capture"
    g = getattr(_tls, "group", None)
    if g is not None and device != g.stream.device:
        return "a copy to another device than its thread's group's"
    if g is not None and current_raw_stream(torch, device.index) != g.stream.cuda_stream:
        return "a copy on a stream the script set"
    return None


def current_raw_stream(torch: Any, index: int) -> int:
    """The current CUDA stream's handle on device ``index``, asked without making a
    ``torch.cuda.Stream`` object (a few microseconds a copy, ``gil_release.py``)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def stage(torch: Any, x: Any, device: Any, dtype: Any = None, site: str | None = None) -> Any:
    """The device copy of ``x`` (a CPU tensor, or a numpy array when ``dtype`` is None) through
    the thread's pinned buffers, or None where it is left to PyTorch (counted with the reason
    at the script's line). The caller has checked :func:`copy_hazard`."""
    site = site or script_site(2)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    a, why = _host_array(torch, x, dtype)
    if a is None:
        fell_back("h2d", site, f"not taken over: {why}")
        return None
    try:
        st = _stager(torch, device)
        limit = min(MAX_COPY, st.size)
        if a.nbytes > limit:
            fell_back("h2d", site, f"not taken over: a copy of {a.nbytes} bytes (over {limit})")
            return None
        out = st.copy(torch, a, stream)
    except (RuntimeError, TypeError, ValueError, BufferError) as ex:
        fell_back("h2d", site, f"staging failed: {_first_line(ex)}")
        return None
    taken_over("h2d", site)
    return out


#: device strings already read (the few a script spells): the ``torch.device`` each names, or
#: ``_BAD`` where ``torch.device`` refuses it (per call, reading one costs more than the rest of the parse)
_NAMED: dict[str, Any] = {}
_BAD = object()


def _cuda_device(torch: Any, dev: Any) -> Any:
    """The CUDA ``torch.device`` (with its index) that ``dev`` names as PyTorch reads a device
    argument: a ``torch.device``, a string (``"cuda"``, ``"cuda:1"``; what ``torch.device``
    refuses names none), an int (a CUDA index: the accelerator the hook runs on). None where it
    names no CUDA device (the CPU, a bool, a negative index, ``None``)."""
    if isinstance(dev, str):
        d = _NAMED.get(dev)
        if d is None:
            try:
                d = torch.device(dev)
            except (RuntimeError, ValueError):
                d = _BAD
            if len(_NAMED) < 64:
                _NAMED[dev] = d
        dev = d
    elif isinstance(dev, int):
        return _cuda_at(torch, dev) if dev >= 0 and not isinstance(dev, bool) else None
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return dev if dev.index is not None else _cuda_at(torch, torch.cuda.current_device())
    return None


_AT: dict[int, Any] = {}


def _cuda_at(torch: Any, i: int) -> Any:
    """``torch.device("cuda", i)``, made once per index."""
    d = _AT.get(i)
    if d is None:
        d = _AT[i] = torch.device("cuda", i)
    return d


class Move(NamedTuple):
    """What a ``Tensor.to`` / ``Tensor.cuda`` call that copies to the GPU asks for."""

    device: Any  #: the CUDA ``torch.device``, with its index
    dtype: Any  #: None: the source's own
    non_blocking: bool
    copy: bool  #: (``copy=True`` of ``Tensor.to``: a host-to-device copy is a new tensor either way)
    memory_format: Any  #: None where not given (``torch.preserve_format``)


#: ``Tensor.to``'s overloads (PyTorch's ``python_variable_methods.cpp``), their positional
#: parameters in order; ``memory_format`` is keyword-only in each. The ``(dtype, ...)`` one
#: never moves to a device.
_TO_DEVICE = ("device", "dtype", "non_blocking", "copy")
_TO_TENSOR = ("tensor", "non_blocking", "copy")
_CUDA = ("device", "non_blocking")


def _bind(names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
          kw_only: tuple[str, ...] = ("memory_format",)) -> dict[str, Any] | None:
    """``args`` and ``kwargs`` bound to the parameters ``names`` (plus the keyword-only
    ``kw_only``) as PyTorch's argument parser binds them; None where it would refuse them."""
    if len(args) > len(names):
        return None
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in bound or (k not in names and k not in kw_only):
            return None
        bound[k] = v
    return bound


def _move(torch: Any, dev: Any, bound: dict[str, Any], dtype: Any = None) -> Move | None:
    nb, copy = bound.get("non_blocking", False), bound.get("copy", False)
    if type(nb) is not bool or type(copy) is not bool or (dtype is not None and not isinstance(dtype, torch.dtype)):
        return None  # (PyTorch refuses them: its error, not ours)
    d = _cuda_device(torch, dev)
    return None if d is None else Move(d, dtype, nb, copy, bound.get("memory_format"))


def to_args(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Move | None:
    """The :class:`Move` a ``Tensor.to`` call asks for, bound as PyTorch binds its overloads
    ``to(device=None, dtype=None, non_blocking=False, copy=False, *, memory_format=None)`` and
    ``to(tensor, non_blocking=False, copy=False, *, memory_format=None)`` (the device and dtype
    of ``tensor``); None where it moves to no CUDA device (``to(dtype, ...)``, ``to("cpu")``,
    ``to(None)``) or where PyTorch would refuse its arguments (left to PyTorch, which says why)."""
    first = args[0] if args else kwargs.get("tensor")
    if isinstance(first, torch.Tensor):
        bound = _bind(_TO_TENSOR, args, kwargs)
        return None if bound is None else _move(torch, first.device, bound, first.dtype)
    if isinstance(first, torch.dtype):
        return None
    bound = _bind(_TO_DEVICE, args, kwargs)
    return None if bound is None else _move(torch, bound.get("device"), bound, bound.get("dtype"))


#: argument types whose equality is their value (a call made with these again is the same call)
_PLAIN = (str, int, bool, float, type(None))


def raw_call(torch: Any, orig: Any, args: tuple[Any, ...], kwargs: dict[str, Any], move: Move | None) -> Any:
    """``(method, args, kwargs, current)`` of a copy the script made, where its arguments are
    plain values (strings, numbers, devices, dtypes; no tensor): the same method called with
    equal arguments asks for the same :class:`Move`, on the same current device where the call
    named none by index (``current``: that device's index, checked again; else None). None where
    the call cannot be known so (the copy is parsed every time)."""
    if move is None:
        return None
    vals = (*args, *kwargs.values())
    if not all(isinstance(v, _PLAIN) or isinstance(v, (torch.device, torch.dtype)) for v in vals):
        return None
    named = any(isinstance(v, int) and not isinstance(v, bool) for v in vals) or any(
        isinstance(v, torch.device) and v.index is not None for v in vals) or any(
        isinstance(v, str) and ":" in v for v in vals)
    return (orig, args, dict(kwargs), None if named else move.device.index)


_MISSING = object()


def called_again(torch: Any, raw: Any, orig: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``orig(*args, **kwargs)`` is the copy :func:`raw_call` remembered as ``raw``: the
    same method, the same plain arguments (:func:`same_call`), and where the call named no
    device index, the same current device."""
    return (raw is not None and raw[0] is orig
            and ((not args and not kwargs and not raw[1] and not raw[2]) or same_call(raw, args, kwargs))
            and (raw[3] is None or raw[3] == torch._C._cuda_getDevice()))


def same_call(raw: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``args``/``kwargs`` are those of :func:`raw_call`'s ``raw``, value and type (a
    ``non_blocking=1`` is not the learned ``non_blocking=True``: PyTorch refuses the one)."""
    a, k = raw[1], raw[2]
    if len(a) != len(args) or len(k) != len(kwargs):
        return False
    for x, y in zip(a, args):
        if x is not y and (type(x) is not type(y) or x != y):
            return False
    for name, x in k.items():
        y = kwargs.get(name, _MISSING)
        if x is not y and (type(x) is not type(y) or x != y):
            return False
    return True


def cuda_args(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Move | None:
    """The :class:`Move` of ``Tensor.cuda(device=None, non_blocking=False, *, memory_format=None)``
    (no device: the current one), or None where PyTorch would refuse its arguments."""
    bound = _bind(_CUDA, args, kwargs)
    if bound is None:
        return None
    dev = bound.get("device")
    return _move(torch, "cuda" if dev is None else dev, bound)


def host_data(T: Any, data: Any) -> bool:
    """Whether ``data`` given to ``torch.as_tensor`` / ``torch.tensor`` is host data the hook
    takes (``T``: ``torch.Tensor``): not a tensor (numpy, a list), or a plain CPU tensor (not a
    GPU tensor, nor a subclass such as a parameter or a model's host argument)."""
    return not isinstance(data, T) or (type(data) is T and data.device.type == "cpu")


def inexact(torch: Any, src: Any, m: Move) -> str | None:
    """Why the hook's copy of the CPU tensor ``src`` (C-contiguous: :func:`_host_array`'s bytes)
    would not be the tensor PyTorch makes for ``m``, else None. PyTorch's copy has the strides
    ``empty_like(src, memory_format=...)`` gives (asked here on the meta device, which allocates
    nothing): the source's own for ``preserve_format`` (the default) where ``src`` is dense,
    contiguous ones for ``contiguous_format``, the format's layout for any other."""
    mf = m.memory_format
    if mf is torch.contiguous_format or ((mf is None or mf is torch.preserve_format) and src.is_contiguous()):
        return None
    try:
        if torch.empty_like(src, device="meta", memory_format=mf or torch.preserve_format).is_contiguous():
            return None
    except (RuntimeError, TypeError):  # a format PyTorch refuses for this tensor: its own call says so
        pass
    return NOT_CONTIGUOUS if mf is None or mf is torch.preserve_format else f"not taken over: memory_format={mf}"


def as_tensor_args(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(cuda device, dtype or None)`` of ``torch.as_tensor(data, dtype=None, device=None)``."""
    bound = _bind(("data", "dtype", "device"), args, kwargs, kw_only=())
    if bound is None or "data" not in bound:
        return None
    dev = bound.get("device")
    d = _cuda_device(torch, dev) if dev is not None else None
    return None if d is None else (d, bound.get("dtype"))


def tensor_args(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(cuda device, dtype or None)`` of ``torch.tensor(data, *, dtype=None, device=None)``
    (``requires_grad`` / ``pin_memory`` true, or any other keyword: left to PyTorch)."""
    if len(args) != 1 or set(kwargs) - {"dtype", "device", "requires_grad", "pin_memory"}:
        return None
    if kwargs.get("requires_grad") or kwargs.get("pin_memory"):
        return None
    dev = kwargs.get("device")
    d = _cuda_device(torch, dev) if dev is not None else None
    return None if d is None else (d, kwargs.get("dtype"))

