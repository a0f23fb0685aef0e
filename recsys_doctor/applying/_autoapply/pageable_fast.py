"""A thread graph's pageable copies, known again without the hook's checks.

The usual serving query moves numpy data with ``torch.from_numpy(a).cuda()`` (or ``.to("cuda")``):
a blocking copy from pageable memory. The hook takes it over through the thread's pinned slot
for that copy (:func:`.staging._take_copy`), and once the thread has a graph, the slot is that
graph's source for it. Before, every such copy went through the whole check again: the call's
arguments parsed, the memory format, the stream, the source converted to numpy, then a numpy
copy into the slot, which releases the interpreter lock (GIL) for arrays over 500 items; with
4 client threads getting it back costs ~56 us a time (``bench/apply/results/hostprof_h100/``).

Here the thread remembers, per copy position of its graph, the call that made the copy (its
method and plain arguments, :func:`.pageable.raw_call`) and the source's dtype and shape.
The same call again on a plain contiguous CPU tensor of that dtype and shape, on the group's
stream, outside a capture, is the same copy: its bytes go straight into the slot with one
``memmove``, holding the GIL for copies up to :data:`HOLD_GIL_BYTES` (a few microseconds,
shorter than a hand-off), and the slot goes to the thread graph as the slow path would have
handed it. Anything else takes the slow path, which makes the same decisions as before.
"""

from __future__ import annotations

import ctypes
import sys
from itertools import chain
from typing import Any, NamedTuple

from .pageable import Move, called_again, current_raw_stream, raw_call
from .readmark import slots_free

#: a pageable copy up to this size is written into its slot holding the GIL (~4-10 us of
#: memcpy); a larger one releases it while it copies
HOLD_GIL_BYTES = 128 << 10

#: ``memmove`` called holding the GIL (ctypes' own ``memmove`` releases it); no result (a ``c_void_p``
#: result made a Python object of the address at every call: ~0.4 us of a ~1.4 us call)
_memmove_gil = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value or 0)


_plain: dict[Any, Any] = {}  #: :func:`_plain_for` per torch module (one in practice)


class Learned(NamedTuple):
    """A pageable copy of a thread graph's position, as the script made it."""

    raw: Any  #: :func:`.pageable.raw_call` of the script's ``.to()``/``.cuda()``
    dtype: Any  #: the source's dtype (the copy converts nothing)
    shape: Any  #: the source's shape
    nbytes: int
    slot: Any  #: the slot's pinned tensor: the thread graph's source for this copy
    slot_ptr: int
    slot_i: int  #: its index among the query's slot copies
    device: Any  #: the CUDA ``torch.device`` copied to
    stream: int  #: the group's CUDA stream (a copy on another stream takes the slow path)


def plain_source(torch: Any, src: Any) -> bool:
    """Whether ``src`` is a tensor whose bytes are its values in order: a strided, contiguous
    CPU tensor of a real dtype, without grad or a negative bit. Asked without ``is_neg()`` or
    ``is_complex()``: those release the GIL (a hand-off among the client threads), these do not."""
    return _plain_for(torch)(src) and not src.dtype.is_complex


def _plain_for(torch: Any) -> Any:
    """:func:`plain_source` but for the dtype, its names bound once per torch module (it runs for
    every pageable copy of a steady query, where the dtype is a learned copy's, a real one)."""
    plain = _plain.get(torch)
    if plain is None:
        strided, keys, neg = torch.strided, torch._C._dispatch_keys, torch._C.DispatchKey.Negative

        def plain(src: Any) -> bool:
            return (src.is_cpu and src.layout is strided and not src.requires_grad and src.is_contiguous()
                    and not keys(src).has(neg))

        _plain[torch] = plain
    return plain


def learn(torch: Any, st: Any, tg: Any, src: Any, out: Any, m: Move, call: tuple[Any, tuple[Any, ...], dict[str, Any]],
          stream: int) -> None:
    """After the slow path took the script's copy of ``src`` (``call``: the method, its args and
    kwargs) into the thread's graph ``tg``, ``out`` the view handed back: where that went through
    the slot of position ``st.n - 1``, remember it, where the same call can be known again (a
    blocking copy, in the source's own dtype, with plain arguments, of a plain source shaped as
    the slot)."""
    i = st.n - 1
    if (not 0 <= i < len(tg.src) or tg.learned[i] is not None or out is not tg.handed[i] or tg.moves[i] is not None
            or m.non_blocking or (m.dtype is not None and m.dtype != src.dtype) or m.device.index != tg.device
            or st.slot_n < 1 or not plain_source(torch, src)):
        return
    slot = tg.src[i]
    raw = raw_call(torch, *call, m)
    if raw is None or slot.dtype != src.dtype or slot.shape != src.shape:
        return
    tg.learned[i] = Learned(raw, src.dtype, src.shape, src.numel() * src.element_size(), slot, slot.data_ptr(),
                            st.slot_n - 1, m.device, stream)


def same_copy(torch: Any, st: Any, tg: Any, src: Any, orig: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              stream_now: Any) -> Learned | None:
    """The :class:`Learned` copy of ``tg``'s next position where ``src.<orig>(*args,
    **kwargs)`` is that copy again (the same call, dtype and shape, a plain source, and
    ``stream_now(device_index)`` - the current raw CUDA stream there, or None: no group's - the
    group's), its bytes now written into the slot; else None (nothing done). The caller has made
    sure the thread is not capturing a graph of its own (the patched ``Tensor.to``/``.cuda`` asks
    :func:`capture_probe` first). The slots are written once the last model call that read them
    has (:func:`.readmark.slots_free`)."""
    i = st.n
    if not 0 <= i < len(tg.learned):
        return None
    k = tg.learned[i]
    if (k is None or st.slot_n != k.slot_i or src.dtype is not k.dtype or src.shape != k.shape
            or stream_now(tg.device) != k.stream or not called_again(torch, k.raw, orig, args, kwargs)
            or not _plain_for(torch)(src)):
        return None
    if k.slot_i == 0 and (st.slot_mark is not None or st.slot_event is not None):
        slots_free(torch, st)  # (the last model call's graph may still read the slots)
    (_memmove_gil if k.nbytes <= HOLD_GIL_BYTES else ctypes.memmove)(k.slot_ptr, src.data_ptr(), k.nbytes)
    st.slot_n = k.slot_i + 1
    return k


def capture_probe(torch: Any) -> Any:
    """A function saying whether the calling thread's current stream captures a CUDA graph (the
    script's own capture: a copy made there belongs in the script's graph, exactly as PyTorch
    makes it, and a copy PyTorch cannot make in a capture must fail as it does); ``lambda: False``
    where this PyTorch has no CUDA."""
    f = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    try:
        ok = f is not None and torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a PyTorch without a working CUDA
        ok = False
    return f if ok else (lambda: False)


def cuda_stream_now(torch: Any) -> Any:
    """``stream_now`` for :func:`same_copy` on this process's CUDA: the current raw stream of a
    device. Its callers (the patched ``Tensor.to``/``.cuda``) have asked :func:`capture_probe`
    already and take a capturing thread's copy as PyTorch's, so it is not asked again here."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: current_raw_stream(torch, index)


def list_array(torch: Any, data: Any, dtype: Any) -> Any:
    """The values ``torch.tensor(data, dtype=dtype)`` makes, as a numpy array made by numpy,
    where that is the same tensor: ``data`` a list or tuple (or one of equal-length lists or
    tuples) of Python ints, floats or bools, one kind of them, ``dtype`` None or what PyTorch
    infers for that kind (int64; bool; the default dtype for floats, float32 or float64). None
    otherwise (PyTorch makes it, and says what is wrong). numpy converts such lists 4-5x faster
    than PyTorch (16 lists of 20 ids: 8.5 against 42 us), time the thread holds the GIL for."""
    np = sys.modules.get("numpy")
    if np is None or type(data) not in (list, tuple) or not data:
        return None
    nested = type(data[0]) in (list, tuple)
    if nested:
        if not set(map(type, data)) <= {list, tuple}:
            return None
        kinds = set(map(type, chain.from_iterable(data)))
    else:
        kinds = set(map(type, data))
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    if kind is int:
        want, np_dtype = torch.int64, np.int64
    elif kind is bool:
        want, np_dtype = torch.bool, np.bool_
    elif kind is float:
        want = torch.get_default_dtype()
        np_dtype = {torch.float32: np.float32, torch.float64: np.float64}.get(want)
        if np_dtype is None:
            return None
    else:
        return None
    if dtype is not None and dtype != want:
        return None
    try:
        a = np.array(data)
    except (ValueError, OverflowError, TypeError):  # ragged, out of range: PyTorch's own error or result
        return None
    if a.ndim != (2 if nested else 1) or a.dtype != (np.float64 if kind is float else np_dtype):
        return None  # (an int past int64 gives numpy another dtype)
    if a.dtype != np_dtype:
        with np.errstate(over="ignore"):  # (past float32's range: inf, as PyTorch gives, without numpy's warning)
            a = a.astype(np_dtype)
    return a
