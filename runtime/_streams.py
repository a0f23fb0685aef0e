"""Stream groups and the stream manager, on cuda-python (no torch here).

A :class:`StreamGroup` owns one compute stream plus an H2D and a D2H copy stream (or one
merged stream for all three), a device memory pool (``cuda.core.DeviceMemoryResource``,
i.e. ``cuMemPoolCreate``), and ``slots``: per in-flight query, pinned host staging buffers,
device staging buffers and the events that order the stages. Cross-stream dependencies
are only CUDA events (record / wait); the host waits only on the event that ends a query.

A :class:`StreamManager` owns N groups on one device and hands out the least-loaded one
without blocking (in-flight counts; equal counts are broken by a non-blocking event query).
When every slot of every group is in flight, waiters are served first come first served
(:class:`~recsys_doctor.runtime._policy.FairSlotPool`). With ``streams_only`` a manager is
its groups' streams alone (no slots, pools or events): the plain-script hook's groups, whose
copies and memory stay PyTorch's. :meth:`StreamManager.side_stream` makes one more owned
stream (the hook captures its CUDA graphs there).

Every handle is owned explicitly: ``close()`` (idempotent) or ``with``.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Any, Iterator

from contextlib import contextmanager

from ..errors import BadInputError, RuntimeCudaError
from ._cuda import check, ensure_context, translating
from ._fastpath import driver_fastpath
from ._policy import FairSlotPool, pick_least_loaded

__all__ = ["StreamGroup", "StreamManager", "HostBuffer", "DeviceBuffer", "Slot"]


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


class HostBuffer:
    """Pinned (page-locked) host memory from cuda.core's ``LegacyPinnedMemoryResource``
    (``cuMemAllocHost``), owned: ``close()`` frees it; one never closed is freed by its
    ``cuda.core.Buffer`` (no driver call from a ``__del__`` of ours at interpreter exit)."""

    _mr: Any = None

    def __init__(self, nbytes: int) -> None:
        import cuda.core as cc

        if HostBuffer._mr is None:
            HostBuffer._mr = cc.LegacyPinnedMemoryResource()
        self.nbytes = int(nbytes)
        with translating(f"cuMemAllocHost({self.nbytes} bytes)"):
            self._buf: Any = HostBuffer._mr.allocate(self.nbytes)
        self.ptr = int(self._buf.handle)
        # a writable Python buffer over the memory, for zero-copy CPU views
        self.ctypes_view: Any = (ctypes.c_char * self.nbytes).from_address(self.ptr)

    def close(self) -> None:
        if self._buf is not None:
            self.ctypes_view = None
            buf, self._buf, self.ptr = self._buf, None, 0
            with translating("cuMemFreeHost"):
                buf.close()


class DeviceBuffer:
    """Device memory from a group's pool (stream-ordered); owned, ``close(stream)`` frees."""

    def __init__(self, mr: Any, nbytes: int, stream: Any) -> None:
        with translating(f"cuMemAllocFromPoolAsync({nbytes} bytes)"):
            self._buf = mr.allocate(int(nbytes), stream=stream)
        self.nbytes = int(nbytes)
        self.ptr = int(self._buf.handle)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Lets ``torch.as_tensor(buf, device='cuda')`` view the bytes without a copy."""
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                "strides": None, "version": 2}

    def close(self, stream: Any = None) -> None:
        if self._buf is not None:
            with translating("cuMemFreeAsync"):
                self._buf.close(stream)
            self._buf = None
            self.ptr = 0


class Slot:
    """Staging buffers and events for one query in flight in a group.

    Buffers are keyed by whoever uses the slot (the PyTorch adapter keys them by input
    signature); the slot itself only owns handles and the ordering events.
    """

    def __init__(self, group: "StreamGroup", index: int) -> None:
        self.group = group
        self.index = index
        self.ev_h2d = group._new_event()
        self.ev_compute = group._new_event()
        self.ev_done = group._new_event()
        d = _driver()
        # raw CUevent handles for the hot path
        self.h_h2d = d.CUevent(int(self.ev_h2d.handle))
        self.h_compute = d.CUevent(int(self.ev_compute.handle))
        self.h_done = d.CUevent(int(self.ev_done.handle))
        # the same handles as plain integers, for the ctypes hot path (``_fastpath``)
        self.h2d_i = int(self.ev_h2d.handle)
        self.compute_i = int(self.ev_compute.handle)
        self.done_i = int(self.ev_done.handle)
        #: per input signature, what the adapter prepared (LRU order)
        self.entries: "OrderedDict[Any, Any]" = OrderedDict()

    def close(self) -> None:
        for e in (self.ev_h2d, self.ev_compute, self.ev_done):
            with translating("cuEventDestroy"):
                e.close()


class StreamGroup:
    """One stream group on a device. Create through :class:`StreamManager`."""

    def __init__(self, manager: "StreamManager", index: int, merge: bool, slots: int, mr: Any,
                 blocking: bool = False) -> None:
        import cuda.core as cc

        self.manager = manager
        self.index = index
        self.merge = merge
        dev = manager.device
        with translating("cuStreamCreate"):
            opts = cc.StreamOptions(nonblocking=not blocking)
            self.compute = dev.create_stream(options=opts)
            if merge:
                self.h2d = self.d2h = self.compute
            else:
                self.h2d = dev.create_stream(options=opts)
                self.d2h = dev.create_stream(options=opts)
        d = _driver()
        # raw handles for the hot path (one driver call per stage, no cuda.core wrapper)
        self.compute_h = d.CUstream(int(self.compute.handle))
        self.h2d_h = d.CUstream(int(self.h2d.handle))
        self.d2h_h = d.CUstream(int(self.d2h.handle))
        self.compute_i, self.h2d_i, self.d2h_i = self.stream_handles
        self.mr = mr
        self.in_flight = 0
        self.served = 0
        self._last_done: Any = None
        self.slots = [Slot(self, k) for k in range(slots)]
        self.closed = False

    # -- handles ---------------------------------------------------------------------
    def _new_event(self) -> Any:
        import cuda.core as cc

        with translating("cuEventCreate"):
            return self.manager.device.create_event(options=cc.EventOptions(timing_enabled=False))

    @property
    def stream_handles(self) -> tuple[int, int, int]:
        """``(compute, h2d, d2h)`` as integers (equal when merged), for
        ``torch.cuda.ExternalStream``."""
        return int(self.compute.handle), int(self.h2d.handle), int(self.d2h.handle)

    def allocate(self, nbytes: int) -> DeviceBuffer:
        """Device memory from this group's pool, ordered on the compute stream."""
        if self.mr is None:
            raise RuntimeCudaError("this stream group has no memory pool (streams_only)")
        return DeviceBuffer(self.mr, nbytes, self.compute)

    # -- slots -----------------------------------------------------------------------
    def take_slot(self) -> Slot:
        """A free slot of this group; blocks (in arrival order, behind older waiters) only
        when all of this group's slots are in flight. Prefer
        :meth:`StreamManager.acquire_slot`, which may take any group's slot."""
        return self.manager.slot_pool.acquire(only=self.index)[1]

    def give_slot(self, slot: Slot) -> None:
        self._last_done = slot.done_i
        self.manager.slot_pool.release(self.index, slot)

    def idle(self) -> bool:
        """Non-blocking: has the device finished this group's last query? (one
        ``cuEventQuery`` that keeps the GIL: it never blocks)"""
        ev = self._last_done
        if ev is None:
            return True
        ensure_context(self.manager.context)
        return self.manager.fast.ready(ev)

    # -- ordering helpers (hot path) ------------------------------------------------
    @staticmethod
    def record(event_h: Any, stream_h: Any) -> None:
        """``cuEventRecord`` of a raw event handle on a raw stream handle."""
        check(_driver().cuEventRecord(event_h, stream_h), "cuEventRecord")

    @staticmethod
    def wait(stream_h: Any, event_h: Any) -> None:
        """``cuStreamWaitEvent``: ``stream_h`` waits on the device for ``event_h``."""
        check(_driver().cuStreamWaitEvent(stream_h, event_h, 0), "cuStreamWaitEvent")

    def synchronize(self) -> None:
        """Wait for everything queued on this group's streams (not on the hot path)."""
        for s in {id(x): x for x in (self.h2d, self.compute, self.d2h)}.values():
            with translating("cuStreamSynchronize"):
                s.sync()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.synchronize()
        for s in self.slots:
            s.close()
        for s in {id(x): x for x in (self.h2d, self.compute, self.d2h)}.values():
            with translating("cuStreamDestroy"):
                s.close()

    def __repr__(self) -> str:
        return f"StreamGroup({self.index}, merge={self.merge}, in_flight={self.in_flight})"


class StreamManager:
    """A pool of N stream groups on one device.

    ``with manager.acquire_slot() as (group, slot):`` gives a free slot of the least-loaded
    group that has one (in-flight count, ties broken by a non-blocking event query, then
    round-robin); when all slots are in flight it waits first come first served, and a
    released slot goes straight to the oldest waiter (no polling, no host synchronize).
    ``with manager.acquire() as group:`` only picks the least-loaded group, never blocks,
    and takes no slot. Both count the query in flight until the block ends. Thread-safe.

    Memory: with ``per_group_pool`` each group gets its own ``cuMemPoolCreate`` pool (no
    contention on one allocator, reuse within a group); otherwise one pool is shared.
    ``pool_limit_bytes`` caps the pools together: split evenly over per-group pools (each
    pool's ``maxSize``), or the shared pool's ``maxSize``.

    ``streams_only``: the groups' streams and nothing else (no slots, pools or events;
    ``slots`` and the pool options are ignored): :meth:`acquire` works, :meth:`acquire_slot`
    and :meth:`StreamGroup.allocate` raise :class:`RuntimeCudaError`.

    ``blocking``: the groups' streams synchronize with the legacy default stream (created
    without ``CU_STREAM_NON_BLOCKING``), so that work a program puts on the default stream
    (PyTorch's, in a thread that set no stream) is ordered with the groups' work as it was
    when everything ran on the default stream; side streams stay non-blocking (a capture on
    them is never joined by default-stream work). The script hook's streams are blocking.
    """

    def __init__(self, groups: int = 4, *, device: int = 0, merge: bool = True, slots: int = 2,
                 per_group_pool: bool = True, pool_limit_bytes: int | None = None,
                 probe_idle: bool = True, streams_only: bool = False, blocking: bool = False) -> None:
        if streams_only:
            slots, per_group_pool, pool_limit_bytes = 0, False, None
        elif slots < 1:
            raise BadInputError(f"need at least one slot per group, got slots={slots}")
        if groups < 1:
            raise BadInputError(f"need at least one group, got groups={groups}")
        import cuda.core as cc

        with translating(f"cuDevicePrimaryCtxRetain / cuCtxSetCurrent (device {device})"):
            self.device = cc.Device(device)
            self.device.set_current()
            self.context = _driver().CUcontext(int(self.device.context.handle))
        ensure_context(self.context)
        #: the hot-path driver calls (ctypes on libcuda; see ``_fastpath``)
        self.fast = driver_fastpath()
        self.device_id = device
        self._lock = threading.Lock()
        self._rr = 0
        self._pools: list[Any] = []
        self._side: list[Any] = []
        self.closed = False
        #: no slots, pools or events: the groups' streams alone (see the module's docstring)
        self.streams_only = streams_only
        n_pools = 0 if streams_only else groups if per_group_pool else 1
        max_size = (pool_limit_bytes // n_pools) if pool_limit_bytes else 0
        with translating("cuMemPoolCreate"):
            for _ in range(n_pools):
                opts = cc.DeviceMemoryResourceOptions(max_size=max_size) if max_size else cc.DeviceMemoryResourceOptions()
                self._pools.append(cc.DeviceMemoryResource(self.device, options=opts))
        self.groups = [StreamGroup(self, i, merge, slots, self._pools[i % n_pools] if n_pools else None, blocking)
                       for i in range(groups)]
        # ``probe_idle``: break ties between equally loaded groups by an event query (the
        # served model turns it off: on its hot path, in-flight counts and round-robin are
        # enough, and every probe is a driver call)
        self._slots: FairSlotPool | None = None
        if not streams_only:
            self._slots = FairSlotPool([g.slots for g in self.groups],
                                       idle=[g.idle for g in self.groups] if probe_idle else None)
        self.merge = merge
        self.per_group_pool = per_group_pool
        self.pool_limit_bytes = pool_limit_bytes

    def pick(self) -> StreamGroup:
        """Choose and count one query in flight on the least-loaded group (no blocking)."""
        with self._lock:
            loads = [g.in_flight for g in self.groups]
            i = pick_least_loaded(loads, self._rr, [g.idle for g in self.groups])
            self._rr = (i + 1) % len(self.groups)
            g = self.groups[i]
            g.in_flight += 1
            return g

    def release(self, group: StreamGroup) -> None:
        with self._lock:
            group.in_flight -= 1
            group.served += 1

    @contextmanager
    def acquire(self) -> Iterator[StreamGroup]:
        if self.closed:
            raise RuntimeCudaError("the stream manager is closed")
        g = self.pick()
        try:
            yield g
        finally:
            self.release(g)

    @property
    def slot_pool(self) -> FairSlotPool:
        """The slots of every group (:class:`RuntimeCudaError` for a ``streams_only`` manager)."""
        if self._slots is None:
            raise RuntimeCudaError("this stream manager has no slots (streams_only)")
        return self._slots

    @contextmanager
    def acquire_slot(self) -> Iterator[tuple[StreamGroup, Slot]]:
        """``(group, slot)`` for one query, served in arrival order when all are busy."""
        if self.closed:
            raise RuntimeCudaError("the stream manager is closed")
        pool = self.slot_pool
        i, slot = pool.acquire()
        g = self.groups[i]
        with self._lock:
            g.in_flight += 1
        try:
            yield g, slot
        finally:
            g._last_done = slot.done_i
            with self._lock:
                g.in_flight -= 1
                g.served += 1
            pool.release(i, slot)

    def side_stream(self) -> int:
        """A new non-blocking stream on the manager's device, owned by the manager (destroyed
        by :meth:`close`), as an integer handle for ``torch.cuda.ExternalStream``."""
        import cuda.core as cc

        if self.closed:
            raise RuntimeCudaError("the stream manager is closed")
        with translating("cuStreamCreate (side stream)"):
            s = self.device.create_stream(options=cc.StreamOptions(nonblocking=True))
        with self._lock:
            self._side.append(s)
        return int(s.handle)

    def pool_stats(self) -> list[dict[str, int]]:
        """Reserved / used bytes of each pool (``cuMemPoolGetAttribute``)."""
        d = _driver()
        out = []
        for mr in self._pools:
            pool = d.CUmemoryPool(int(mr.handle))
            res = check(d.cuMemPoolGetAttribute(pool, d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
                        "cuMemPoolGetAttribute")
            used = check(d.cuMemPoolGetAttribute(pool, d.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
                         "cuMemPoolGetAttribute")
            out.append({"reserved": int(res), "used": int(used)})
        return out

    def synchronize(self) -> None:
        for g in self.groups:
            g.synchronize()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._slots is not None:
            self._slots.close()
        for g in self.groups:
            g.close()
        for s in self._side:
            with translating("cuStreamSynchronize / cuStreamDestroy (side stream)"):
                s.sync()
                s.close()
        self._side = []
        for mr in self._pools:
            with translating("cuMemPoolDestroy"):
                mr.close()
        self._pools = []

    def __enter__(self) -> "StreamManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StreamManager(groups={len(self.groups)}, merge={self.merge}, device={self.device_id})"
