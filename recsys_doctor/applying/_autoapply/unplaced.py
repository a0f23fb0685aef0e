"""The copies a thread makes before it is placed in its group (placed at its first top-level
model call, :func:`.interception._place_deferred`): PyTorch's, on PyTorch's default stream,
counted as left to it with why (``stats()["sites"]``) where a placed thread's copy would be
counted too (pageable memory, numpy arrays, lists, non-blocking copies of pinned memory).
A thread that calls no model stays unplaced; its copies are counted so all its life."""

from __future__ import annotations

from typing import Any

from ._common import _state, _tls
from .accounting import fell_back, script_site
from .pageable import host_data

#: why a copy made before its thread's first model call is PyTorch's
BEFORE_PLACED = "made before its thread's first model call, where the hook places the thread: PyTorch's copy"


def _deferred() -> bool:
    return getattr(_tls, "defer", None) == _state.get("activation")


def unplaced_copy(torch: Any, src: Any, parse: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  capturing: Any = bool) -> None:
    """``src.to/cuda(*args, **kwargs)`` by a thread not placed yet: counted where it copies host
    memory to the GPU (``parse``: :func:`.pageable.to_args` / :func:`.pageable.cuda_args`) and a
    placed thread's copy would be counted too (a non-blocking copy of pinned memory among them:
    placed, a thread graph may take it over, or it is counted as PyTorch's,
    :data:`.pageable.ASYNC_PINNED`); not one while the thread's stream captures (``capturing``:
    :func:`.pageable_fast.capture_probe`), as a placed thread's is not."""
    if not _deferred() or type(src) is not torch.Tensor or src.device.type != "cpu" or capturing():
        return
    if parse(torch, args, kwargs) is not None:
        fell_back("h2d", script_site(3), BEFORE_PLACED)


def unplaced_factory(torch: Any, parse: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     capturing: Any = bool) -> None:
    """``torch.as_tensor`` / ``torch.tensor`` by a thread not placed yet: counted where it makes
    a GPU tensor of host data (``parse``: :func:`.pageable.as_tensor_args` / :func:`.pageable.tensor_args`)
    as a placed thread's would be: not of a tensor subclass, nor while the thread's stream captures."""
    if not _deferred() or parse(torch, args, kwargs) is None:
        return
    data = args[0] if args else kwargs.get("data")
    if host_data(torch.Tensor, data) and not capturing():
        fell_back("h2d", script_site(3), BEFORE_PLACED)
