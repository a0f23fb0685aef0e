"""A thread graph's read mark: when the last replay's copies have read the thread's pinned slots.

A query writes the bytes of its host copies into the thread's slots (:mod:`.staging`,
:mod:`.pageable_fast`), which the thread graph's memcpy nodes read at the next replay. So before a
query's first slot write, the last model call that read the slots must have. After a replay of the
thread graph, its :class:`ReadMark` says so from host memory, without a CUDA call; after any other
call, the event :func:`.staging.slots_read` recorded."""

from __future__ import annotations

import time
from typing import Any

from ._common import _state


class ReadMark:
    """A thread graph's sign that a replay has read its sources: captured right after its input
    copies, a one-element kernel counting replays on the device and a copy of that count into
    pinned host memory. Before a query writes the thread's slots again, the count read from host
    memory says whether the last replay's copies are done - no CUDA call. An event's
    ``query()`` is one (cudaEventQuery), made holding the GIL, and it waits there behind the other
    threads' graph launches for the driver's lock: ~15 us a query on the H200 with 4 threads
    (py-spy ``--gil``, ``bench/apply/results/session23_h200/3_gil/``)."""

    __slots__ = ("dev", "host", "seen", "base")

    def __init__(self, torch: Any, device: Any) -> None:
        self.dev = torch.zeros(1, dtype=torch.int64, device=device)
        self.host = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self.seen = self.host.numpy()  # (read without a torch call)
        self.base = 0  # the count before the first replay (the capture's eager run counted once)

    def record(self, torch: Any, stream: Any) -> None:
        """Enqueue the count and its copy to host memory on ``stream`` (in a capture: two nodes)."""
        from cuda.bindings import runtime as cudart

        self.dev.add_(1)
        err, = cudart.cudaMemcpyAsync(self.host.data_ptr(), self.dev.data_ptr(), 8,
                                      cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream.cuda_stream)
        if int(err) != 0:
            raise RuntimeError(f"cudaMemcpyAsync: {err}")

    def captured(self, counted: int = 1) -> None:
        """After the capture (its stream synchronized), where the counter was zeroed before it and
        counted ``counted`` times since (the capture's eager run): the count the replays start from.
        Any other count means the counter was not zeroed first, or written by something else: no
        replay could be known done by it, so the thread graph is refused (raised)."""
        self.base = int(self.seen[0])
        if self.base != counted:
            raise RuntimeError(f"the read mark counted {self.base} for {counted} run(s): its counter was not zeroed first")


#: how long a query waits on a thread graph's :class:`ReadMark` (sleeping, the GIL given up)
#: before it synchronizes the device instead
MARK_WAIT_S = 0.05


def slots_free(torch: Any, st: Any) -> None:
    """Before the query's first write into the slots: the last model call that read them has."""
    m = st.slot_mark
    if m is not None:
        if m[0][0] < m[1]:
            _wait_mark(torch, st, m)
        return
    ev = st.slot_event
    if ev is not None and not ev.query():
        ev.synchronize()


def _wait_mark(torch: Any, st: Any, m: tuple[Any, int]) -> None:
    """The replay's copies are queued or running (a script that does not wait for its results
    before its next query): sleep until its mark shows them done, at most :data:`MARK_WAIT_S`;
    then the device is synchronized (raising the replay's error, if it failed). Counted in
    ``stats()["mark_waits"]``."""
    _state["mark_waits"] = _state.get("mark_waits", 0) + 1
    end = time.perf_counter() + MARK_WAIT_S
    while m[0][0] < m[1]:
        if time.perf_counter() > end:
            torch.cuda.synchronize(st.stream.device if st.stream is not None else None)
            return
        time.sleep(0)
