"""What every part of the hook shares: the environment's names, the one state dict, the
thread-local group, the log line. Standard library only (loaded by file path at interpreter start)."""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

ENV_PLAN = "RECSYS_DOCTOR_PLAN"
#: "0" turns off the per-thread graphs that take over a thread's pinned input copies
ENV_THREAD_GRAPHS = "RECSYS_DOCTOR_THREAD_GRAPHS"
#: the model calls a thread makes before it learns a thread graph, where the script's threads
#: that ended lived short lives (:data:`.thread_graphs.MIN_THREAD_CALLS`; 0: never waits)
ENV_THREAD_GRAPH_MIN_CALLS = "RECSYS_DOCTOR_THREAD_GRAPH_MIN_CALLS"
#: the calls after a thread graph's capture before one that served fewer than a quarter of them is
#: dropped (:data:`.thread_graphs.REPLAY_WINDOW`; 0: never dropped, for comparison)
ENV_REPLAY_WINDOW = "RECSYS_DOCTOR_REPLAY_WINDOW"
#: "1" stages host-to-device copies from pageable memory (pageable.py); off by default: on the
#: H100 it measured slower than PyTorch's own copies (bench/apply/results/staging_ab_h100/)
ENV_STAGE_PAGEABLE = "RECSYS_DOCTOR_STAGE_PAGEABLE"
#: "first-call" (the default): a thread joins its group at its first top-level model call once
#: CUDA is up, not when it starts (with graphs on; :func:`.interception._place_deferred`);
#: "start": when it starts, if CUDA is up by then (as without graphs)
ENV_PLACE = "RECSYS_DOCTOR_PLACE"
#: "0" keeps a thread that trains in its group (for comparison only: its in-place updates of the
#: weights are then unordered with the other groups' model calls; :mod:`.trainers`)
ENV_TRAINERS = "RECSYS_DOCTOR_TRAINERS"


#: eager calls of a key before it is captured (lazy inits: cuBLAS handles, allocator blocks)
WARMUP_CALLS = 2

_state: dict[str, Any] = {"active": False}
_tls = threading.local()
_lock = threading.Lock()


def _log(msg: str) -> None:
    print(f"recsys-doctor apply: {msg}", file=sys.stderr, flush=True)


def _torch() -> Any:
    return sys.modules.get("torch")


@functools.lru_cache(maxsize=None)
def _exported(cls: Any) -> bool:
    """Whether ``cls`` is the class of a ``torch.export`` program's module (``ExportedProgram.module()``)."""
    return any(c.__name__ == "_StatefulGraphModule" and c.__module__.startswith("torch.export") for c in cls.__mro__)


def trains(module: Any) -> bool:
    """``module.training``, except for a ``torch.export`` program's module: its graph fixed train or
    eval at export (``aten.dropout(x, p, False)`` in the graph) and its ``train()``/``eval()`` raise, so
    its ``training`` flag, True as every new module's, changes nothing it computes."""
    return bool(module.training) and not _exported(module.__class__)


def normal_tensors(torch: Any) -> Any:
    """A context in which the hook's lasting buffers (a graph's static inputs, staging slots) are
    made as normal tensors, even inside the script's ``torch.inference_mode()``: made there they
    would be inference tensors, and the copies into them that come later outside inference mode
    (a script that copies its inputs before ``with torch.inference_mode(): model(x)``) would fail
    ("Inplace update to inference tensor outside InferenceMode", examples/heldout/optional_features_serve.py)."""
    return torch.inference_mode(False)


def _first_line(ex: BaseException) -> str:
    # not recsys_doctor.errors.first_line: this file runs at interpreter start without the package
    msg = str(ex).strip().splitlines()
    return f"{type(ex).__name__}: {msg[0] if msg else ''}"
