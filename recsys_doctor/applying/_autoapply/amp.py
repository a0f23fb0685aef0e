"""Model calls made under ``torch.autocast`` on CUDA: graphed per precision, captured with the
autocast weight cache off.

A script that scores under ``with torch.autocast("cuda", dtype=torch.bfloat16):`` (and maybe
calls the same model in full precision elsewhere, with inputs of the same shapes) must get
what eager PyTorch gives it in each precision. Two things stand in the way of a plain capture:

* **The precision is not in the inputs.** A graph keyed by the inputs' shapes alone would
  replay the bf16 capture for a float32 call. :class:`AmpCall` carries the autocast dtype in
  its ``key_tag``, which the group's graphs (:func:`.graphs._key_or_reason`) and the thread
  graphs (:mod:`.thread_graphs`) put in their keys.
* **The autocast cache.** Under autocast, PyTorch casts a float32 leaf parameter once per
  autocast region and keeps the cast copy in a thread-local cache, freed when the outermost
  region exits. Captured with the cache on, a graph either reads a cast copy made before the
  capture (freed, then reused by other tensors, once the script's region exits) or writes its
  casts into memory the cache frees after the capture; ``torch.cuda.make_graphed_callables``
  refuses autocast with the cache on for this reason. :class:`AmpCall` captures inside a nested
  ``torch.autocast(..., cache_enabled=False)``: the casts are recorded in the graph and
  replayed every time, giving the values eager PyTorch's cached casts hold.

The runtime's batched serving (the plan's ``batching``) captures its model in full precision
in its own threads: an autocast call goes to the group's graphs instead (counted there).
"""

from __future__ import annotations

from typing import Any

from ._common import _state, _torch
from .graphs import _graphed_call
from .host_args import _capturing, take
from .thread_graphs import _copies_call, flush

__all__ = ["autocast_dtype", "AmpCall", "amp_call"]


def autocast_dtype(torch: Any) -> Any:
    """The dtype CUDA ops are autocast to in this thread, or None where autocast is off."""
    try:
        if not torch.is_autocast_enabled("cuda"):
            return None
        return torch.get_autocast_dtype("cuda")
    except TypeError:  # a PyTorch before 2.4: no device argument
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


class AmpCall:
    """``orig_call`` for a call made under CUDA autocast to ``dtype``: the same call, keyed
    apart by ``key_tag``, and run with the autocast cache off while a CUDA graph captures it."""

    __slots__ = ("orig", "dtype", "key_tag")

    def __init__(self, orig: Any, dtype: Any) -> None:
        self.orig = orig
        self.dtype = dtype
        self.key_tag = ("autocast", str(dtype), getattr(orig, "key_tag", None))

    def __call__(self, module: Any, *args: Any, **kwargs: Any) -> Any:
        torch = _torch()
        if _capturing(torch):
            with torch.autocast("cuda", dtype=self.dtype, cache_enabled=False):
                return self.orig(module, *args, **kwargs)
        return self.orig(module, *args, **kwargs)


def amp_call(torch: Any, st: Any, orig: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             site: str, dtype: Any) -> Any:
    """A hooked thread's top-level call under CUDA autocast (``st``: its copy state or None)."""
    if st is None:
        return _graphed_call(AmpCall(orig, dtype), module, args, kwargs, site)
    if not _state.get("batching"):
        took = take(torch, st, orig, module, args, kwargs, site)  # host arguments copied inside forward
        inner, args, kwargs = (orig, args, kwargs) if took is None else took
        return _copies_call(st, AmpCall(inner, dtype), module, args, kwargs, site)
    # batching: the copies this query deferred for the runtime's route are made, as on the
    # hook's own batched path (.served.call), and the group's graphs take the call
    flush(torch, st)
    return _graphed_call(AmpCall(orig, dtype), module, args, kwargs, site)
