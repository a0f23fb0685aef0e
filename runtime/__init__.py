"""The embedded stream-group runtime: what fixes what ``advise`` finds.

* :class:`StreamManager` / :class:`StreamGroup` - N groups of (compute, H2D, D2H) streams
  or one merged stream each, per-group memory pools and pinned staging, least-loaded
  dispatch; on cuda-python (``cuda.core`` / ``cuda.bindings``). ``streams_only=True``: the
  groups' streams alone, and ``side_stream()`` one more (the plain-script hook's groups).
* :func:`serve` - a PyTorch model as a thread-safe callable whose every query is one CUDA
  graph launch on a group's stream (H2D + forward + D2H captured together).
* :func:`stream_scope`, :func:`parallel_branches`, :class:`BranchStreams` - training
  branches (MMoE experts, towers) on side streams, inside a CUDA-graph-captured step too.
* :func:`check` - the one function that checks every CUDA call.

Importing this package needs neither torch nor a GPU; the PyTorch names are loaded on
first use. See ``docs/runtime.md``.
"""

from __future__ import annotations

from typing import Any

from ._cuda import call, check, describe
from ._policy import (
    FairSlotPool,
    PackedLayout,
    RuntimeConfig,
    flatten,
    input_signature,
    pack_layout,
    pick_least_loaded,
    unflatten,
)
from ._streams import StreamGroup, StreamManager

__all__ = [
    "RuntimeConfig",
    "StreamManager",
    "StreamGroup",
    "serve",
    "ServedModel",
    "BranchStreams",
    "stream_scope",
    "parallel_branches",
    "default_branch_streams",
    "check",
    "call",
    "describe",
    "pick_least_loaded",
    "FairSlotPool",
    "input_signature",
    "pack_layout",
    "PackedLayout",
    "flatten",
    "unflatten",
]

_SERVING_NAMES = {"serve", "ServedModel", "Request"}
_TRAINING_NAMES = {"BranchStreams", "stream_scope", "parallel_branches", "default_branch_streams"}


def __getattr__(name: str) -> Any:
    # the PyTorch adapter (and torch itself) load only when one of its names is used
    if name in _SERVING_NAMES:
        from . import serving

        return getattr(serving, name)
    if name in _TRAINING_NAMES:
        from . import training

        return getattr(training, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
