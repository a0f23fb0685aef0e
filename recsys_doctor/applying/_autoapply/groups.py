"""Thread groups: a group is a stream of the runtime's with its lock and its graphs; the gate
keeps a capture from running beside any other model execution of the hooked threads."""

from __future__ import annotations

import threading
from typing import Any

from ._common import _log, _state
from .pageable import current_raw_stream


class _Gate:
    """Model executions of hooked threads hold it shared; a capture holds it alone.

    A capture must not run while another thread executes a model eagerly or replays a
    graph: seen on the H200 with 4 threads per group, concurrent forwards invalidated the
    capture ("operation failed due to a previous error during capture"). Writers are
    preferred (new readers wait while a capture is pending), so a capture is never starved.
    No reader waits for anything else while holding it, so it cannot deadlock with the
    group locks."""

    def __init__(self) -> None:
        # (the readers' path takes the plain lock only, a C call; the condition on the same lock
        # is waited on only while a capture is pending or running)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_shared(self) -> None:
        with self._lock:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_shared(self) -> None:
        with self._lock:
            self._readers -= 1
            if self._readers == 0 and self._writers_waiting:  # (only a writer waits for no readers)
                self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        with self._lock:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def release_exclusive(self) -> None:
        with self._lock:
            self._writer = False
            self._cond.notify_all()


def _run_shared(fn: Any, *args: Any, **kwargs: Any) -> Any:
    gate: _Gate = _state["gate"]
    gate.acquire_shared()
    try:
        return fn(*args, **kwargs)
    finally:
        gate.release_shared()


class _Group:
    def __init__(self, index: int, stream: Any, streams: Any = None) -> None:
        self.index = index
        self.stream = stream
        #: the CUDA device of its stream (None: a group without one, the CPU tests')
        self.dev: int | None = getattr(stream, "device_index", None)
        #: the :class:`_Streams` the group's stream is one of (its side streams: the captures')
        self.streams = streams
        self.lock = threading.Lock()
        self.entries: dict[Any, Any] = {}
        #: id(module) -> its shapes here (:class:`.buckets._Site`: graphs bounded, padding verified)
        self.sites: dict[int, Any] = {}
        #: key -> its batches here (:class:`.batching._Batches`), where the plan batches
        self.batches: dict[Any, Any] = {}
        self.capture_stream: Any = None
        #: whether a replay of this group's graphs has run on another stream than the group's
        #: (a script that sets its own stream): from then on replays are ordered by ``last_event``
        self.mixed = False
        self.last_raw: int | None = None  # the raw stream of the last replay, once mixed
        self.last_event: Any = None
        #: the activation of the hook that placed its one thread at the thread's first model
        #: call (:func:`.interception._late_group`); None for the plan's groups
        self.late: int | None = None

    def before_replay(self, torch: Any) -> int | None:
        """Under the group's lock, before one of its graphs replays on the current stream.

        A graph's static inputs and outputs are the group's, shared by its threads. They
        hand them on in stream order while every thread replays on the group's stream, the
        stream each thread is given. A script may set its own stream, though, for example
        one per worker with its copies, the call and a ``stream.synchronize()`` under it
        (``examples/heldout/pinned_stream_serve.py``). Replays on two streams would then
        overwrite each other's inputs while the other still runs: wrong outputs on the
        H100. From the first replay off the group's stream on, each replay waits for the
        last one, wherever it ran. It first waits for all the group's stream had queued.
        Returns the raw current stream, for :meth:`after_replay`, or None where nothing is
        needed (every replay so far on the group's stream)."""
        if self.stream is None:  # (a group without a stream: the CPU tests')
            return None
        dev = self.stream.device_index
        cur = current_raw_stream(torch, dev)
        if not self.mixed:
            if cur == self.stream.cuda_stream:
                return None
            self.mixed = True
            self.last_event = torch.cuda.Event()
            torch.cuda.current_stream(dev).wait_stream(self.stream)
        elif cur != self.last_raw:
            torch.cuda.current_stream(dev).wait_event(self.last_event)
        return cur

    def after_replay(self, cur: int | None) -> None:
        """Under the group's lock, after a replay (and the copy of its outputs) that
        :meth:`before_replay` ordered: the next replay, on any stream, waits for it."""
        if cur is not None:
            self.last_event.record()
            self.last_raw = cur


class _Streams:
    """The hook's streams, every one the runtime's: one
    :class:`recsys_doctor.runtime.StreamManager` with the plan's group count, merged (a
    group's copies and kernels on its one stream) and ``streams_only`` (the script's copies
    and memory stay PyTorch's: no slots, pools or events), bridged to PyTorch with
    ``torch.cuda.ExternalStream`` as :func:`recsys_doctor.runtime.serve` does; the capture
    streams are the manager's side streams. Made on the first hooked thread, once torch has
    initialized CUDA, on that thread's current device.

    ``recsys_doctor.runtime`` is imported here, not at interpreter start: the hook is loaded
    by file path before any import of the package, and the runtime's import is light (the
    package's ``__init__`` is lazy; ``cuda.core``, no pandas, no torch). It is an ordinary
    import of the installed package rather than a load by path (as ``settings`` loads
    ``plan.py``): the runtime is a package of modules importing one another and
    ``recsys_doctor.errors``, which only the package's own import machinery lays out right
    (``runtime/`` is installed as ``recsys_doctor.runtime`` through ``package-dir``)."""

    def __init__(self, torch: Any, n_groups: int, dev: int | None = None) -> None:
        from recsys_doctor.runtime import StreamManager

        dev = torch.cuda.current_device() if dev is None else dev
        self.torch = torch
        self.device = torch.device("cuda", dev)
        # blocking: the script's work on the default stream (a thread that set no stream: the
        # main thread loading new weights in place between request waves, or reading what a
        # worker computed) stays ordered with the groups' work, as when every thread ran on the
        # default stream; non-blocking group streams let a replay read weights a
        # ``load_state_dict`` on the default stream had not finished copying (wrong scores on the
        # H200, examples/heldout/model_refresh_serve.py, bench/apply/results/refresh_h200/)
        self.manager = StreamManager(n_groups, device=dev, merge=True, streams_only=True, probe_idle=False,
                                     blocking=True)
        try:
            self.streams = [torch.cuda.ExternalStream(g.stream_handles[0], device=self.device)
                            for g in self.manager.groups]
        except BaseException:
            self.manager.close()
            raise

    def side_stream(self) -> Any:
        """A new stream of the manager's (owned by it), for PyTorch."""
        return self.torch.cuda.ExternalStream(self.manager.side_stream(), device=self.device)


#: every activation's streams, kept to the process's end: a stream PyTorch has used must outlive
#: its allocator's blocks and graphs (a later activation's new streams do not replace them)
_KEPT: list[_Streams] = []


def _streams(torch: Any, dev: int | None = None) -> _Streams | None:
    """The runtime's streams of this activation on CUDA device ``dev`` (default: the current
    one), made on first use (under ``_lock``): the plan's groups on each device a hooked model
    runs on (a process serving a replica per GPU, ``examples/heldout/multi_gpu_serve.py``).
    ``_state["streams"]`` holds the first device's, ``_state["streams_by_dev"]`` the others'.
    None, with the reason logged once and counted, where the runtime cannot give them (the
    script then runs as it is)."""
    first = _state.get("streams")
    others = _state.setdefault("streams_by_dev", {})
    if first is not None:
        first_dev = getattr(getattr(first, "device", None), "index", None)
        if dev is None or first_dev is None or dev == first_dev:
            return first  # type: ignore[no-any-return]
        if dev in others:
            return others[dev]  # type: ignore[no-any-return]
    if _state.get("streams_failed") is not None:
        return None
    try:
        st = _Streams(torch, _state["n_groups"], dev)
        _KEPT.append(st)  # never collected (its streams closed): see _KEPT
    except Exception as ex:  # noqa: BLE001 - ImportError, RuntimeCudaError...: never break the script
        reason = f"no stream groups from the runtime: {type(ex).__name__}: {ex}"
        _state["streams_failed"] = reason
        _log(f"not applied: {reason}")
        _state["fallbacks"].append(reason)
        return None
    if first is None:
        _state["streams"] = st
    else:
        others[dev] = st
    return st


def all_groups() -> list[_Group]:
    """Every group of this activation: the plan's and those of threads placed late."""
    return list(_state.get("groups", {}).values()) + list(_state.get("late_groups", []))


def _capture_stream(g: _Group) -> Any:
    """The stream the group's captures run on (under the group's lock, one at a time): a side
    stream of the runtime's, made on first use; a capture that broke on it sets
    ``g.capture_stream`` to None, and the next gets a new one."""
    if g.capture_stream is None:
        g.capture_stream = g.streams.side_stream()
    return g.capture_stream
