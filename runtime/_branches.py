"""Branch-parallel capture: the independent operations of one forward pass on several
CUDA streams, so that the CUDA graph captured from it runs its branches side by side.

A graph captured from one stream is a chain: its nodes run one after another even where
the model has independent branches (the 26 embedding lookups of a wide&deep model, the
experts of an MMoE). The GPU then spends most of a small query's time dispatching one
tiny kernel after the other. Captured under :class:`BranchCapture`, each ATen operation
of the forward runs on a stream chosen from what it reads and writes:

* an operation that depends on the last operation of a stream (it reads what that
  operation wrote, or writes what it read) goes on on that stream: a chain stays on one
  stream;
* any other operation starts a branch on the next stream, round robin: one that reads
  nothing made inside the forward (only the model's weights and its inputs), or one whose
  inputs were made earlier and have other users since (an offsets tensor built once and
  read by 26 embedding lookups);
* either way it first waits for the events of what it depends on elsewhere: the writer of
  every tensor it reads (read after write) and, where it writes a tensor in place, every
  earlier reader and writer of that tensor's storage;
* views (operations whose result aliases an input) launch nothing and run where they are.

A tensor used on a stream other than the one that allocated it is marked with
``record_stream``, so the caching allocator does not hand its memory to another
operation before that use is over (under capture such blocks are not reused at all).
On exit the capture stream waits for every stream used, as stream capture requires.

Work launched outside PyTorch's dispatcher (a Triton kernel or a custom extension called
directly from ``forward``) is not seen by the mode: it lands on the capture stream with no
wait for the branches it reads. Under capture the mode finds it: before each operation it
dispatches and on exit it asks the driver what the capture stream's next node would depend
on (``cuStreamGetCaptureInfo``), which only the mode's own operations on that stream may
change; when something else did, it raises once the streams are joined, and the caller
captures that forward again on one stream.
The result is the same computation, operation for operation; only the order in which the
GPU may run independent operations changes. Needs torch with CUDA at capture time.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from ._modes import per_dynamo_state

__all__ = ["BranchCapture", "CudaStreams", "Schedule", "DEFAULT_BRANCH_STREAMS", "branch_streams", "branched",
           "capture_branched", "check_branch_streams"]

#: streams a forward's branches are spread over when capturing (the capture stream and
#: three more): measured on the H100 (``bench/runtime/results/branches_h100/``), one replay
#: of a 256-row wide&deep query took 118 us instead of 215, and 4 streams did as well as 8
DEFAULT_BRANCH_STREAMS = 4


def check_branch_streams(n: Any) -> int:
    """``n`` as a stream count (1: capture on one stream, as PyTorch does), or raise."""
    from ..errors import BadInputError

    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 32:
        raise BadInputError(f"branch_streams must be an integer from 1 to 32, got {n!r}")
    return n


def branch_streams(torch: Any, n: int, device: Any) -> list[Any]:
    """The ``n - 1`` extra streams a capture site keeps for :func:`branched`."""
    return [torch.cuda.Stream(device=device) for _ in range(n - 1)]


def branched(streams: list[Any]) -> Any:
    """A context that spreads the forward's branches over the current stream and
    ``streams`` (:class:`BranchCapture`), or does nothing where ``streams`` is empty."""
    return BranchCapture(streams) if streams else contextlib.nullcontext()


def capture_branched(torch: Any, side: list[Any], capture: Callable[[list[Any]], Any],
                     failed: Callable[[BaseException], bool]) -> Any:
    """``capture(side)``: a capture with the forward's branches on ``side``. Where that
    fails (other than out of memory) and ``failed(error)`` (which keeps the reason) says
    to go on, ``capture([])``: the same capture on one stream. The capture sites of the
    runtime (a query signature, a batch bucket) share this."""
    if side:
        try:
            return capture(side)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - captured again on one stream, the reason kept by failed()
            if not failed(e):
                raise
    return capture([])


def _mode_base() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class CudaStreams:
    """What :class:`BranchCapture` does with streams and events, on CUDA (the tests use a
    recording stand-in with the same methods)."""

    def __init__(self, torch: Any, streams: list[Any]) -> None:
        self.torch = torch
        self.extra = list(streams)

    def current(self) -> Any:
        return self.torch.cuda.current_stream()

    def event(self, stream: Any) -> Any:
        ev = self.torch.cuda.Event()
        ev.record(stream)
        return ev

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def use(self, stream: Any) -> Any:
        return self.torch.cuda.stream(stream)

    def record_stream(self, t: Any, stream: Any) -> None:
        t.record_stream(stream)

    def on_device(self, t: Any) -> bool:
        return bool(t.is_cuda)

    def capture_deps(self, stream: Any) -> Any:
        """The graph nodes a capturing ``stream``'s next node would depend on (None when
        it is not capturing)."""
        from cuda.bindings import driver as cu

        r = cu.cuStreamGetCaptureInfo(cu.CUstream(stream.cuda_stream))
        if int(r[0]) != 0 or r[1] != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            return None
        deps = next(x for x in r[2:] if isinstance(x, (list, tuple)))
        return frozenset(int(n) for n in deps)


def BranchCapture(streams: list[Any], backend: Any = None) -> Any:
    """``with BranchCapture(streams): out = model(*args)`` inside ``torch.cuda.graph`` (or
    eagerly): ``streams`` are extra CUDA streams; the current stream is the first branch.
    The mode's ``branches`` counts the operations that started a branch, ``joins`` the
    cross-stream waits made. ``backend``: the stream and event calls (default
    :class:`CudaStreams`)."""
    import torch

    return _mode_class()(backend or CudaStreams(torch, streams))


class Schedule:
    """Which stream each operation runs on and what it waits for (see the module
    docstring), over storage keys, stream indices and opaque events: no CUDA, no torch."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.branches = 0
        self.last: dict[int, Any] = {}  # stream -> its last operation's event
        self.writer: dict[int, tuple[int, Any]] = {}  # storage -> (stream, event)
        self.readers: dict[int, dict[int, Any]] = {}  # storage -> stream -> event
        self.home: dict[int, int] = {}  # storage -> the stream that allocated it
        self.rr = 0

    def place(self, reads: list[int], writes: list[int]) -> tuple[int, list[tuple[int, Any]]]:
        """The stream an operation runs on and the events it depends on: the stream whose
        last operation it depends on (a chain goes on where it is), else the next stream
        round robin (a new branch, which waits for what it depends on)."""
        deps = [self.writer[k] for k in reads + writes if k in self.writer]
        for k in writes:
            deps.extend(self.readers.get(k, {}).items())
        for si, ev in deps:
            if self.last.get(si) is ev:
                return si, deps
        self.branches += 1
        si = self.rr % self.streams
        self.rr += 1
        return si, deps

    def done(self, si: int, ev: Any, reads: list[int], writes: list[int], outs: list[int]) -> None:
        """Operation ``ev`` ran on ``si``: it read ``reads``, wrote ``writes``, returned ``outs``."""
        self.last[si] = ev
        for k in reads:
            self.readers.setdefault(k, {})[si] = ev
        for k in writes:
            self.writer[k] = (si, ev)
            self.readers.pop(k, None)
        for k in outs:
            if self.writer.get(k, (0, None))[1] is not ev:  # new storage (not an input written in place)
                self.home[k] = si
                self.readers.pop(k, None)
            self.writer[k] = (si, ev)


FOREIGN = ("work was launched outside PyTorch's dispatcher during the forward (a Triton kernel or a custom "
           "extension called directly): it cannot be ordered after the branches it reads, so this forward is "
           "captured on one stream")


class _OriginWatch:
    """Under capture: whether anything but the mode's own operations added a node to the
    capture stream (what its next node would depend on changed behind the mode's back)."""

    def __init__(self, backend: Any, origin: Any) -> None:
        self.b, self.origin = backend, origin
        self.expect = backend.capture_deps(origin)  # None: not capturing
        self.foreign = False

    def check(self) -> None:
        if self.expect is not None and not self.foreign and self.b.capture_deps(self.origin) != self.expect:
            self.foreign = True

    def moved(self) -> None:
        """The mode ran an operation on the capture stream (after its waits)."""
        if self.expect is not None:
            self.expect = self.b.capture_deps(self.origin)


def _make_mode_class() -> Any:
    """The branch-capture mode's class (one per Dynamo state: :data:`_mode_class`)."""
    import torch

    class _Mode(_mode_base()):  # type: ignore[misc]
        def __init__(self, backend: Any) -> None:
            super().__init__()
            self.b = backend
            self.joins = 0

        @property
        def branches(self) -> int:
            return self.sched.branches

        def __enter__(self) -> Any:
            b = self.b
            self.origin = b.current()
            self.pool = [self.origin, *b.extra]
            self.sched = Schedule(len(self.pool))
            self.start = b.event(self.origin)
            self.joined = {0}
            self.watch = _OriginWatch(b, self.origin)
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            out = super().__exit__(*exc)
            self.watch.check()
            for si, ev in self.sched.last.items():
                if si:
                    self.b.wait(self.origin, ev)
            if self.watch.foreign and exc[0] is None:
                raise RuntimeError(FOREIGN)
            return out

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            schema = func._schema
            if schema.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
                return func(*args, **kwargs)  # a view: no kernel, no new storage
            b, sched = self.b, self.sched
            self.watch.check()
            reads, writes = _tensor_args(torch, schema, args, kwargs, b.on_device)
            rk, wk = [_key(t) for t in reads], [_key(t) for t in writes]
            si, deps = sched.place(rk, wk)
            s = self.pool[si]
            if si not in self.joined:
                b.wait(s, self.start)
                self.joined.add(si)
            waited: set[int] = set()
            for dsi, ev in deps:
                if dsi != si and id(ev) not in waited:
                    b.wait(s, ev)
                    waited.add(id(ev))
                    self.joins += 1
            for t, k in zip(reads + writes, rk + wk):
                h = sched.home.get(k)
                if h is not None and h != si:
                    b.record_stream(t, s)
            with b.use(s):
                out = func(*args, **kwargs)
            outs = [_key(t) for t in _tensors(torch, out) if b.on_device(t)]
            sched.done(si, b.event(s), rk, wk, outs)
            if si == 0:
                self.watch.moved()
            return out

    return _Mode


_mode_class = per_dynamo_state(_make_mode_class)


def _key(t: Any) -> int:
    return t.untyped_storage().data_ptr()


def _tensors(torch: Any, v: Any) -> list[Any]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return []


def _tensor_args(torch: Any, schema: Any, args: Any, kwargs: Any, on_device: Any) -> tuple[list[Any], list[Any]]:
    """The device tensors an operation reads and those it writes (per its schema)."""
    reads: list[Any] = []
    writes: list[Any] = []
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(args):
            v = args[i]
        else:
            v = kwargs.get(a.name)
        w = a.alias_info is not None and a.alias_info.is_write
        for t in _tensors(torch, v):
            if on_device(t):
                (writes if w else reads).append(t)
    return reads, writes
