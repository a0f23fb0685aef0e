"""Training branches on side streams: :func:`stream_scope` runs a branch (forward and,
through autograd, backward) on a side stream with event dependencies on both sides;
:func:`parallel_branches` runs a list of modules as parallel branches. Both work inside a
CUDA-graph-captured training step.

Streams are created by cuda-python (``cuda.core``) and handed to PyTorch with
``torch.cuda.ExternalStream``. torch is imported lazily: the package imports without it.
"""

from __future__ import annotations

import atexit
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from ..errors import BadInputError
from ._cuda import torch_module as _torch
from ._cuda import translating
from ._policy import flatten

__all__ = ["BranchStreams", "stream_scope", "parallel_branches", "default_branch_streams"]


class BranchStreams:
    """Side streams for parallel training branches, created by cuda-python and bridged to
    PyTorch with ``torch.cuda.ExternalStream``. Owns them; ``close()`` or ``with``."""

    def __init__(self, n: int = 8, device: int | None = None, priority: int | None = None) -> None:
        torch = _torch()
        import cuda.core as cc

        if n < 1:
            raise BadInputError(f"need at least one branch stream, got {n}")
        self.torch = torch
        dev_id = torch.cuda.current_device() if device is None else device
        self.device = torch.device("cuda", dev_id)
        torch.cuda.init()
        with translating("cuStreamCreate (branch streams)"):
            cdev = cc.Device(dev_id)
            cdev.set_current()
            opts = cc.StreamOptions(nonblocking=True, priority=priority)
            self._streams = [cdev.create_stream(options=opts) for _ in range(n)]
        self.streams = [torch.cuda.ExternalStream(int(s.handle), device=self.device) for s in self._streams]
        self.closed = False

    def __len__(self) -> int:
        return len(self.streams)

    def stream(self, i: int) -> Any:
        return self.streams[i % len(self.streams)]

    @contextmanager
    def scope(self, i: int, include_grad: bool = True, inputs: Sequence[Any] = ()) -> Iterator["_Scope"]:
        """Run the block on branch stream ``i``: the stream first waits (event) for the
        current stream's work, the current stream waits for the branch at the end.
        Autograd runs each op's backward on the stream its forward ran on, so with
        ``include_grad`` the branch's backward runs on stream ``i`` too (the engine adds
        the cross-stream waits). With ``include_grad=False`` the branch runs under
        ``no_grad`` (a forward-only branch). ``inputs`` made on the current stream are
        marked as used by the branch so that the allocator does not hand their memory out
        while the branch still reads it; tensors returned to the caller should be passed
        to ``scope.returns(...)`` for the same reason the other way round."""
        torch = self.torch
        cur = torch.cuda.current_stream(self.device)
        side = self.stream(i)
        side.wait_stream(cur)
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(side)
        sc = _Scope(side, cur)
        with torch.cuda.stream(side):
            if include_grad:
                yield sc
            else:
                with torch.no_grad():
                    yield sc
        cur.wait_stream(side)
        for t in sc.out:
            t.record_stream(cur)

    def branches(self, modules: Sequence[Callable[..., Any]], *inputs: Any, include_grad: bool = True) -> list[Any]:
        """Run ``modules[k](*inputs)`` on branch stream ``k`` (mod the stream count), all
        in parallel; returns their outputs in order, safe to use on the current stream."""
        torch = self.torch
        cur = torch.cuda.current_stream(self.device)
        ev = torch.cuda.Event()
        ev.record(cur)
        tens = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda]
        outs: list[Any] = []
        used: list[Any] = []
        for k, m in enumerate(modules):
            side = self.stream(k)
            if all(side is not u for u in used):
                used.append(side)
                side.wait_event(ev)
                for t in tens:
                    t.record_stream(side)
            with torch.cuda.stream(side):
                if include_grad:
                    outs.append(m(*inputs))
                else:
                    with torch.no_grad():
                        outs.append(m(*inputs))
        for side in used:
            cur.wait_stream(side)
        for o in outs:
            for t in flatten(o, lambda x: isinstance(x, torch.Tensor))[0]:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(cur)
        return outs

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.torch.cuda.synchronize(self.device)
        self.streams = []
        for s in self._streams:
            with translating("cuStreamDestroy"):
                s.close()
        self._streams = []

    def __enter__(self) -> "BranchStreams":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Scope:
    def __init__(self, stream: Any, caller: Any) -> None:
        self.stream = stream
        self.caller = caller
        self.out: list[Any] = []

    def returns(self, *tensors: Any) -> Any:
        """Mark tensors made in the branch that the caller will use after the scope."""
        self.out.extend(t for t in tensors if getattr(t, "is_cuda", False))
        return tensors[0] if len(tensors) == 1 else tensors


_default: dict[int, BranchStreams] = {}
_default_lock = threading.Lock()


def default_branch_streams(n: int = 8, device: int | None = None) -> BranchStreams:
    """The process-wide branch streams of a device (at least ``n``), created on first use
    and closed at interpreter exit."""
    torch = _torch()
    dev = torch.cuda.current_device() if device is None else device
    with _default_lock:
        bs = _default.get(dev)
        if bs is None or len(bs) < n:
            if bs is not None:
                bs.close()
            bs = _default[dev] = BranchStreams(n, dev)
        return bs


def stream_scope(i: int, include_grad: bool = True, inputs: Sequence[Any] = ()) -> Any:
    """``with stream_scope(i):`` runs the block on the process-wide branch stream ``i``
    (see :meth:`BranchStreams.scope`)."""
    return default_branch_streams(i + 1).scope(i, include_grad=include_grad, inputs=inputs)


def parallel_branches(modules: Sequence[Callable[..., Any]], *inputs: Any,
                      streams: BranchStreams | None | bool = None, include_grad: bool = True) -> list[Any]:
    """Run each module on ``inputs`` as a parallel branch (see :meth:`BranchStreams.branches`).
    ``streams=False`` runs them one after another on the current stream (the single-stream
    reference); ``None`` uses the process-wide branch streams."""
    if streams is False:
        return [m(*inputs) for m in modules]
    bs = default_branch_streams(max(1, len(modules))) if streams is None or streams is True else streams
    return bs.branches(modules, *inputs, include_grad=include_grad)


@atexit.register
def _close_defaults() -> None:  # pragma: no cover - interpreter exit
    for bs in list(_default.values()):
        try:
            bs.close()
        except Exception:  # noqa: BLE001 - interpreter exit: best effort
            pass
    _default.clear()
