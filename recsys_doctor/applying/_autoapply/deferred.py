"""The tensor type a thread graph hands out for a copy it defers (:mod:`.staging`): reading its
metadata needs no data; any other use makes the query's deferred copies first."""

from __future__ import annotations

from typing import Any


def make_lazy_type(torch: Any, settle: Any, materialize: Any) -> type:
    """``DeferredCopy``: a view of a thread graph's input buffer whose copy the model call's graph
    makes (:mod:`.staging`). ``settle(torch, st)`` / ``materialize(torch, st)``: :func:`.staging.settle`
    and :func:`.staging._materialize`, which make a query's deferred copies."""
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
                    materialize(torch, st)
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)

    return DeferredCopy
