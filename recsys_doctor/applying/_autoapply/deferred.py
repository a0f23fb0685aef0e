"""The tensor type a thread graph hands out for a copy it defers (:mod:`.staging`): reading its
metadata needs no data; any other use makes the query's deferred copies first - and how those
copies are made: :func:`_materialize` (the query's, as PyTorch would have), :func:`settle` (after a
call the runtime's batching served), :func:`_own_memory` (a view the script kept)."""

from __future__ import annotations

import sys
from typing import Any

from ._common import _state


def settle(torch: Any, st: Any) -> None:
    """After a routed call: each of its input views the script still holds gets its copy now,
    from its pinned tensor (see :mod:`.staging`); the others stay unwritten."""
    if not st.routed:
        return
    st.routed = False
    tg = st.tg
    if tg is None:
        return
    orig_copy = torch.Tensor.copy_
    with torch._C.DisableTorchFunctionSubclass():
        for i in range(len(tg.handed)):
            # references: the list and getrefcount's argument; any more is the script's
            if tg.handed[i] is not None and sys.getrefcount(tg.handed[i]) > 2:
                orig_copy(tg.tin[i], tg.src[i], non_blocking=True)


def _own_memory(torch: Any, view: Any) -> None:
    """Give a view the script kept a copy of the buffer it shows (enqueued on this
    thread's stream, before the graph writes the buffer again)."""
    with torch._C.DisableTorchFunctionSubclass():
        view.set_(view.clone())


def _materialize(torch: Any, st: Any) -> None:
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


def make_lazy_type(torch: Any) -> type:
    """``DeferredCopy``: a view of a thread graph's input buffer whose copy the model call's graph
    makes (:mod:`.staging`); another use makes the query's deferred copies (:func:`settle`,
    :func:`_materialize`)."""
    T = torch.Tensor
    # what reads only a tensor's metadata: no need for its data
    meta = {T.shape.__get__, T.dtype.__get__, T.device.__get__, T.is_cuda.__get__, T.ndim.__get__,
            T.requires_grad.__get__, T.layout.__get__, T.get_device, T.dim, T.size, T.numel, T.stride,
            T.is_contiguous, T.data_ptr, T.element_size, T.__len__}

    def owners(x: Any, out: list[Any]) -> None:
        if isinstance(x, T):
            st = getattr(x, "_rd_copies", None)
            if st is not None and (st.pending or st.routed) and st not in out:
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
                    if st.routed:  # (a view of a call the runtime served: its copy now, where still held)
                        settle(torch, st)
                    _materialize(torch, st)
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)

    return DeferredCopy
