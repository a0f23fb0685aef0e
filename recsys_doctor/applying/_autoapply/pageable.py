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
* the device tensor is allocated on the current stream and filled there by one asynchronous
  copy from that pinned buffer: every later use of it on that stream is ordered after the
  copy, and a use on another stream is made to wait for it (an event) - as a synchronous copy
  would have allowed;
* each thread has two pinned buffers used in turn; before one is written again, the copies
  made from it last time have completed (events on every stream that copied from it).

Left to PyTorch (and counted per line of the script, :mod:`.accounting`): copies during a CUDA
graph capture, tensors that need gradients, complex or quantized dtypes, sparse or otherwise
unusual layouts, forms of the call this module does not parse, and copies larger than
``MAX_COPY`` bytes.
"""

from __future__ import annotations

import os
from typing import Any

from ._common import _first_line, _state, _tls
from .accounting import fell_back, script_site, taken_over

#: bytes of each of a thread's two pinned buffers (``RECSYS_DOCTOR_STAGING_BYTES`` sets it)
ARENA_BYTES = 8 << 20
ENV_STAGING_BYTES = "RECSYS_DOCTOR_STAGING_BYTES"
#: the largest copy taken over; larger ones go to PyTorch (their cost is the bytes, not the call)
MAX_COPY = 2 << 20
#: start of each copy in the pinned buffer (the CUDA allocator's alignment)
ALIGN = 512


class _Stager:
    """The pinned buffers of one hooked thread and where the next copy goes."""

    __slots__ = ("arenas", "views", "events", "streams", "cur", "off", "device", "size")

    def __init__(self, torch: Any, device: Any, host_alloc: Any = None) -> None:
        alloc = host_alloc or (lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True))
        self.size = int(os.environ.get(ENV_STAGING_BYTES) or ARENA_BYTES)
        self.arenas = [alloc(self.size), alloc(self.size)]
        self.views = [memoryview(a.numpy()) for a in self.arenas]
        self.events: list[list[Any]] = [[], []]  # per arena: events after its copies (one per stream)
        self.streams: list[dict[int, Any]] = [{}, {}]  # per arena: the streams its copies went to
        self.cur = 0
        self.off = 0
        self.device = device

    def _switch(self, torch: Any) -> None:
        """Close the current buffer (an event on each stream it was copied on) and move to the
        other one once its last copies have completed."""
        i = self.cur
        if self.device.type == "cuda":
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

    def copy(self, torch: Any, t: Any) -> Any:
        """A device tensor equal to the contiguous CPU tensor ``t``, filled asynchronously."""
        n = t.numel() * t.element_size()
        start = -(-self.off // ALIGN) * ALIGN
        if start + n > self.size:
            self._switch(torch)
            start = 0
        src = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        self.views[self.cur][start:start + n] = src
        self.off = start + n
        out = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        if n:
            staged = self.arenas[self.cur][start:start + n].view(t.dtype).view(t.shape)
            out.copy_(staged, non_blocking=True)
        if self.device.type == "cuda":
            s = torch.cuda.current_stream(self.device)
            self.streams[self.cur].setdefault(s.cuda_stream, s)
        return out


def _stager(torch: Any, device: Any) -> _Stager | None:
    st = getattr(_tls, "pageable", None)
    if st is None or st.device != device:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        st = _tls.pageable = _Stager(torch, device)
    return st


def _host_tensor(torch: Any, t: Any, dtype: Any) -> tuple[Any, str | None]:
    """(contiguous CPU tensor with ``dtype``, None) or (None, why it is left to PyTorch)."""
    if t.requires_grad:
        return None, "a tensor that requires grad"
    if t.layout != torch.strided or t.is_complex() or t.is_quantized:
        return None, f"a {t.layout} / {t.dtype} tensor"
    if dtype is not None and dtype != t.dtype:
        if dtype.is_complex:
            return None, f"a conversion to {dtype}"
        t = t.to(dtype)  # on the CPU, as PyTorch converts for a copy between host and device
    if not t.is_contiguous():
        t = t.contiguous()
    n = t.numel() * t.element_size()
    if n > MAX_COPY:
        return None, f"a copy of {n} bytes (over {MAX_COPY})"
    return t, None


def stage(torch: Any, t: Any, device: Any, dtype: Any = None, site: str | None = None) -> Any:
    """The device copy of host tensor ``t`` through the thread's pinned buffers, or None where
    it is left to PyTorch (counted with the reason at the script's line)."""
    site = site or script_site(2)
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            fell_back("h2d", site, "a copy during a CUDA graph capture")
            return None
        g = getattr(_tls, "group", None)
        if g is not None and torch.cuda.current_stream(device).cuda_stream != g.stream.cuda_stream:
            # the script runs this on a stream of its own: it may use the result on yet another
            fell_back("h2d", site, "a copy on a stream the script set")
            return None
    h, why = _host_tensor(torch, t, dtype)
    if h is None:
        fell_back("h2d", site, f"not taken over: {why}")
        return None
    try:
        st = _stager(torch, device)
        assert st is not None
        if h.numel() * h.element_size() > st.size:
            fell_back("h2d", site, f"not taken over: a copy larger than the staging buffer ({st.size} bytes)")
            return None
        out = st.copy(torch, h)
    except (RuntimeError, TypeError, ValueError, BufferError) as ex:
        fell_back("h2d", site, f"staging failed: {_first_line(ex)}")
        return None
    taken_over("h2d", site)
    return out


def _cuda_device(torch: Any, dev: Any) -> Any:
    """The CUDA ``torch.device`` that ``dev`` names (str, torch.device, int index), else None."""
    if isinstance(dev, bool):
        return None
    if isinstance(dev, int):
        return torch.device("cuda", dev) if dev >= 0 else None
    if isinstance(dev, str):
        try:
            dev = torch.device(dev)
        except RuntimeError:
            return None
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    return None


_KEEP_FORMATS = ("preserve_format", "contiguous_format")


def _plain_format(torch: Any, mf: Any) -> bool:
    return mf is None or any(mf is getattr(torch, n) for n in _KEEP_FORMATS)


def to_args(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, bool] | None:
    """``(cuda device, dtype or None, non_blocking)`` of a ``Tensor.to`` call that copies to the GPU, in the
    forms ``to(device[, dtype][, non_blocking][, copy])``, ``to(tensor)`` and their keyword
    spellings; None for any other call (left to PyTorch)."""
    if set(kwargs) - {"device", "dtype", "non_blocking", "copy", "memory_format"}:
        return None
    if not _plain_format(torch, kwargs.get("memory_format")):
        return None
    rest = list(args)
    dev = kwargs.get("device")
    dtype = kwargs.get("dtype")
    if rest and isinstance(rest[0], torch.Tensor):
        if dev is not None or dtype is not None or len(rest) > 3:
            return None
        other = rest.pop(0)
        dev, dtype = other.device, other.dtype
    elif rest and not isinstance(rest[0], (torch.dtype, bool)):
        if dev is not None:
            return None
        dev = rest.pop(0)
        if rest and isinstance(rest[0], torch.dtype):
            if dtype is not None:
                return None
            dtype = rest.pop(0)
    if len(rest) > 2 or not all(isinstance(v, bool) for v in rest):  # non_blocking, copy
        return None
    if rest and "non_blocking" in kwargs:
        return None
    nb = rest[0] if rest else kwargs.get("non_blocking", False)
    d = _cuda_device(torch, dev) if dev is not None else None
    return None if d is None or not isinstance(nb, bool) else (d, dtype, nb)


def cuda_args(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, bool] | None:
    """``(cuda device, None, non_blocking)`` of a ``Tensor.cuda(device=None, non_blocking=False)`` call."""
    if set(kwargs) - {"device", "non_blocking", "memory_format"} or len(args) > 2:
        return None
    if not _plain_format(torch, kwargs.get("memory_format")):
        return None
    if (args and "device" in kwargs) or (len(args) == 2 and "non_blocking" in kwargs):
        return None
    dev = args[0] if args else kwargs.get("device")
    nb = args[1] if len(args) == 2 else kwargs.get("non_blocking", False)
    d = _cuda_device(torch, "cuda" if dev is None else dev)
    return None if d is None or not isinstance(nb, bool) else (d, None, nb)


def as_tensor_args(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(cuda device, dtype or None)`` of ``torch.as_tensor(data, dtype=None, device=None)``."""
    if len(args) > 3 or set(kwargs) - {"data", "dtype", "device"}:
        return None
    names = ("data", "dtype", "device")
    bound = dict(zip(names, args))
    if set(bound) & set(kwargs):
        return None
    bound.update(kwargs)
    dev = bound.get("device")
    d = _cuda_device(torch, dev) if dev is not None else None
    return None if d is None or "data" not in bound else (d, bound.get("dtype"))


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


def _factory(torch: Any, orig: Any, parse: Any, name: str) -> Any:
    """``torch.as_tensor`` / ``torch.tensor`` for hooked threads: host data (numpy, lists, a CPU
    tensor) asked for on the GPU is made on the CPU by PyTorch's own function (same dtype rules)
    and staged by :func:`stage`; anything else goes straight to ``orig``."""
    T = torch.Tensor

    def factory(*args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "group", None) is None:
            return orig(*args, **kwargs)
        p = parse(torch, args, kwargs)
        data = args[0] if args else kwargs.get("data")
        if p is None or (isinstance(data, T) and (type(data) is not T or data.device.type != "cpu")):
            return orig(*args, **kwargs)
        dev, dtype = p
        site = script_site(2)
        try:
            host = data if isinstance(data, T) else orig(data, dtype=dtype)
        except (TypeError, ValueError, RuntimeError):
            return orig(*args, **kwargs)  # PyTorch says what is wrong with the data
        out = stage(torch, host, dev, dtype, site=site)
        return orig(*args, **kwargs) if out is None else out

    factory.__name__ = name
    factory.__wrapped__ = orig  # type: ignore[attr-defined]
    return factory


def patch_factories(torch: Any) -> None:
    """Patch ``torch.as_tensor`` and ``torch.tensor`` (the originals kept for ``deactivate``)."""
    _state["orig_torch_functions"] = {"as_tensor": torch.as_tensor, "tensor": torch.tensor}
    torch.as_tensor = _factory(torch, torch.as_tensor, as_tensor_args, "as_tensor")
    torch.tensor = _factory(torch, torch.tensor, tensor_args, "tensor")
