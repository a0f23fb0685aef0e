"""The zero-copy request of a served model: the client fills a slot's pinned staging in
place (:meth:`Request.load`, ``inputs``, ``buffer``) and runs it (:meth:`Request.run`)."""

from __future__ import annotations

import ctypes
from typing import Any

from ..errors import BadInputError, RuntimeCudaError
from ._serve_entry import STAGED as _STAGED
from ._serve_entry import Entry as _Entry
from ._streams import StreamGroup

__all__ = ["Request"]

#: ``memmove`` that keeps the GIL (PYFUNCTYPE): copies of tens of kB take microseconds; no result
#: (a ``c_void_p`` result is a Python object made at every call). The address is read from
#: ctypes' public ``memmove`` (which releases the GIL), as the script hook's
#: ``pageable_fast._memmove_gil`` reads it: the hook is loaded by path at interpreter start and
#: imports nothing of the package, so the two stay two lines rather than one shared module.
_memmove = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value or 0)


class Request:
    """One query on a slot that the client fills in place (see :meth:`ServedModel.request`).

    ``inputs``: the query's host tensors (pinned views, structured like
    ``example_inputs``); ``buffer``: the same bytes as one flat uint8 tensor; ``layout``:
    where each input tensor sits in it (:class:`~recsys_doctor.runtime.PackedLayout`).
    :meth:`run` may be called more than once; :meth:`close` (or leaving the ``with``
    block) gives the slot back, after which the views must not be used.
    """

    __slots__ = ("_served", "_i", "_g", "_slot", "_entry", "inputs", "buffer", "layout", "_open")

    #: host-to-pinned copies of :meth:`load` (ctypes ``memmove``, GIL kept)

    def __init__(self, served: Any, i: int, g: StreamGroup, slot: Any, entry: _Entry) -> None:
        self._served = served
        self._i = i
        self._g = g
        self._slot = slot
        self._entry = entry
        self.inputs = entry.inputs
        self.buffer = entry.in_bytes
        self.layout = entry.layout
        self._open = True

    def load(self, src: Any) -> None:
        """Copy one packed query (``layout.nbytes`` bytes or fewer, laid out as ``layout``)
        into the slot's pinned input: a host tensor (contiguous), or any object with the
        buffer protocol (``bytes``, ``bytearray``, a NumPy array, ``memoryview``). One
        ``memmove`` that keeps the GIL: a few microseconds for a typical query, no
        thread pool (``Tensor.copy_`` of a large byte tensor wakes PyTorch's intra-op
        threads, which costs more than the copy with many client threads)."""
        if not self._open:
            raise RuntimeCudaError("this request is closed")
        torch = self._served.torch
        if isinstance(src, torch.Tensor):
            if src.is_cuda or not src.is_contiguous():
                raise BadInputError("load() takes a contiguous host tensor")
            ptr, n = src.data_ptr(), src.numel() * src.element_size()
        else:
            mv = memoryview(src)
            if not mv.c_contiguous:
                raise BadInputError("load() takes a contiguous buffer")
            n = mv.nbytes
            if isinstance(src, bytes):  # points into src itself, which the caller holds
                ptr = ctypes.cast(ctypes.c_char_p(src), ctypes.c_void_p).value
            elif mv.readonly:
                raise BadInputError("load() takes bytes, a writable buffer or a host tensor")
            else:
                ptr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        if n > self._entry.n_in:
            raise BadInputError(f"load(): {n} bytes do not fit the slot's {self._entry.n_in}-byte input")
        _memmove(self._entry.pin_in.ptr, ptr, n)

    def run(self) -> Any:
        """Copy the staged inputs to the GPU, run the model, bring the outputs back and
        wait for this query only. Returns pinned host views of the outputs (valid until
        the request is closed), or, for a model whose output shapes changed, host copies."""
        if not self._open:
            raise RuntimeCudaError("this request is closed")
        raw = self._served._execute(self._g, self._slot, self._entry)
        return self._entry.outputs if raw is _STAGED else raw

    def close(self) -> None:
        if self._open:
            self._open = False
            self._g._last_done = self._slot.done_i
            self._served._pool.release(self._i, self._slot)

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
