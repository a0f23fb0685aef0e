"""Pure logic of the runtime: no CUDA, no torch. Tested on the CPU box.

* :func:`pick_least_loaded` - which stream group takes the next query.
* :class:`FairSlotPool` - the in-flight slots of all groups, handed out first come first
  served when clients outnumber slots.
* :func:`flatten` / :func:`unflatten` / :func:`input_signature` - how inputs are keyed to
  a captured CUDA graph.
* :func:`pack_layout` - where each input tensor lives inside one pinned staging buffer, so
  that a query costs one host-to-device copy instead of one per tensor.
* :class:`RuntimeConfig` - the runtime's knobs, also parsed from a ``plan`` dict as
  ``recsys-doctor advise`` proposes it.
"""

from __future__ import annotations

import enum
import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

from ..errors import BadInputError, RuntimeCudaError
from ..plan import Plan, RuntimeSettings

__all__ = [
    "pick_least_loaded",
    "FairSlotPool",
    "flatten",
    "unflatten",
    "out_flatten",
    "out_unflatten",
    "input_signature",
    "pack_layout",
    "PackedLayout",
    "RuntimeConfig",
    "ALIGN",
]

#: Byte alignment of each packed run inside a staging buffer. 256 B is what cudaMalloc
#: guarantees, so vectorized kernels see the same alignment as with separate tensors.
ALIGN = 256


def pick_least_loaded(in_flight: Sequence[int], start: int = 0,
                      idle: Sequence[Callable[[], bool] | None] | None = None) -> int:
    """Index of the group that should take the next query, decided without blocking.

    The least in-flight count wins. Among equally loaded groups, one whose device work is
    already finished (``idle[i]()`` is true: an event query, which never blocks) beats one
    still draining; remaining ties rotate from ``start`` so that equal groups share the
    load instead of group 0 taking everything.
    """
    n = len(in_flight)
    if n == 0:
        raise BadInputError("no stream groups to choose from")
    low = min(in_flight)
    order = [(start + k) % n for k in range(n)]
    tied = [i for i in order if in_flight[i] == low]
    if len(tied) > 1 and idle is not None:
        for i in tied:
            probe = idle[i]
            if probe is not None and probe():
                return i
    return tied[0]


class _Ticket:
    """One blocked :meth:`FairSlotPool.acquire`: its own event, the groups it may take, and
    the ``(group, slot)`` a release hands to it."""

    __slots__ = ("event", "only", "grant")

    def __init__(self, only: int | None) -> None:
        self.event = threading.Event()
        self.only = only
        self.grant: tuple[int, Any] | None = None


class FairSlotPool:
    """The slots of N groups (a slot = one query in flight), handed out in arrival order.

    Why: when client threads outnumber ``groups x slots``, a per-group blocking queue lets
    a thread that committed to a busy group wait while another group frees up, and lets
    late arrivals overtake (lock acquisition is not FIFO): p99 grew 30x over p50 on the
    H100. Here a thread that finds a free slot takes one at once, in the least-loaded group
    that has one (:func:`pick_least_loaded`: fewest slots in use, ties by the ``idle`` probes,
    then round-robin); otherwise it queues a ticket and sleeps on its own
    ``threading.Event`` (no polling). :meth:`release` hands the slot directly to the OLDEST
    ticket that may take that group, so nobody can overtake a waiter: a waiter with ``w``
    tickets ahead of it is served within ``w + 1`` releases of slots it may take.

    ``slots[g]`` lists group ``g``'s slot objects (any values; the pool does not look at
    them). ``acquire(only=g)`` waits for a slot of group ``g`` alone. Thread-safe; the lock
    is held only for list and counter updates (and the ``idle`` probes, which must not
    block). Invariant: a ticket waits only while no slot it may take is free.
    """

    def __init__(self, slots: Sequence[Sequence[Any]],
                 idle: Sequence[Callable[[], bool] | None] | None = None) -> None:
        if not slots or any(len(s) == 0 for s in slots):
            raise BadInputError("a slot pool needs at least one group and one slot per group")
        self._free: list[list[Any]] = [list(s) for s in slots]
        self.capacity: tuple[int, ...] = tuple(len(s) for s in slots)
        #: slots in use per group (= queries in flight there)
        self.in_use: list[int] = [0] * len(slots)
        #: queries finished per group (releases)
        self.served: list[int] = [0] * len(slots)
        self._idle = idle
        self._waiters: deque[_Ticket] = deque()
        self._lock = threading.Lock()
        self._rr = 0
        self.closed = False

    @property
    def waiting(self) -> int:
        """How many acquirers are queued right now."""
        return len(self._waiters)

    def _take_free(self, only: int | None) -> tuple[int, Any] | None:
        if only is not None:
            if not self._free[only]:
                return None
            i = only
        else:
            big = sum(self.capacity) + 1
            loads = [n if f else big for n, f in zip(self.in_use, self._free)]
            if min(loads) == big:
                return None
            i = pick_least_loaded(loads, self._rr, self._idle)
            self._rr = (i + 1) % len(loads)
        self.in_use[i] += 1
        return i, self._free[i].pop()

    def acquire(self, only: int | None = None) -> tuple[int, Any]:
        """``(group index, slot)``; blocks (on an event, FIFO) only when no slot it may take
        is free or older tickets wait for one."""
        if only is not None and not 0 <= only < len(self._free):
            raise BadInputError(f"no group {only} in a pool of {len(self._free)}")
        with self._lock:
            if self.closed:
                raise RuntimeCudaError("the stream manager is closed")
            got = self._take_free(only)
            if got is not None:
                return got
            t = _Ticket(only)
            self._waiters.append(t)
        t.event.wait()
        if t.grant is None:
            raise RuntimeCudaError("the stream manager was closed while waiting for a slot")
        return t.grant

    def release(self, group: int, slot: Any) -> None:
        """Give a slot back: straight to the oldest ticket that may take ``group``, else to
        the free list."""
        with self._lock:
            self.served[group] += 1
            for t in self._waiters:
                if t.only is None or t.only == group:
                    self._waiters.remove(t)
                    t.grant = (group, slot)
                    t.event.set()
                    return
            self.in_use[group] -= 1
            self._free[group].append(slot)

    def close(self) -> None:
        """Wake every waiter (their ``acquire`` raises :class:`RuntimeCudaError`); later
        acquires raise too."""
        with self._lock:
            self.closed = True
            waiters, self._waiters = list(self._waiters), deque()
        for t in waiters:
            t.event.set()


# ----------------------------------------------------------------------------- pytrees

_LEAF = "leaf"


def flatten(tree: Any, is_leaf: Callable[[Any], bool]) -> tuple[list[Any], Any]:
    """Leaves of a nested tuple/list/dict structure plus a hashable spec to rebuild it.

    Dict keys are taken in sorted order so that two dicts with the same keys give the same
    spec whatever their insertion order.
    """
    leaves: list[Any] = []

    def rec(x: Any) -> Any:
        if is_leaf(x):
            leaves.append(x)
            return _LEAF
        if isinstance(x, tuple):
            return ("tuple", tuple(rec(v) for v in x))
        if isinstance(x, list):
            return ("list", tuple(rec(v) for v in x))
        if isinstance(x, Mapping):
            keys = sorted(x)
            return ("dict", tuple(keys), tuple(rec(x[k]) for k in keys))
        leaves.append(x)
        return ("const",)

    spec = rec(tree)
    return leaves, spec


#: the values an input may hold besides tensors and their containers: a served graph keys them
#: by value (:meth:`ServedModel._signature`), which says what a call does only for such values
_PLAIN = (type(None), bool, int, float, complex, str, bytes, enum.Enum)


def flatten_inputs(tree: Any, is_leaf: Callable[[Any], bool]) -> tuple[list[Any], Any]:
    """:func:`flatten` of a served call's inputs, refusing a value that is neither a leaf (a
    tensor) nor a plain value (:data:`_PLAIN`, a dtype, a device, a numpy scalar): an object holding
    tensors (a dataclass batch, a class of the script's) or a numpy array would be keyed by its repr
    and captured with the tensors it held then."""
    leaves, spec = flatten(tree, is_leaf)
    for x in leaves:
        if not (is_leaf(x) or isinstance(x, _PLAIN) or type(x).__module__ == "torch"
                or (type(x).__module__ == "numpy" and getattr(x, "ndim", None) == 0)):  # (a numpy scalar)
            raise BadInputError(f"an input of type {type(x).__name__}: serve() takes tensors, in tuples, lists, "
                                "named tuples and dicts, and plain values (int, float, bool, str, None); pass "
                                "its tensors instead")
    return leaves, spec


def unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    """Inverse of :func:`flatten` for tensor leaves (constants come back as given leaves)."""
    it = iter(leaves)

    def rec(s: Any) -> Any:
        if s == _LEAF or s == ("const",):
            return next(it)
        kind = s[0]
        if kind == "tuple":
            return tuple(rec(c) for c in s[1])
        if kind == "list":
            return [rec(c) for c in s[1]]
        if kind == "dict":
            return {k: rec(c) for k, c in zip(s[1], s[2])}
        raise BadInputError(f"bad tree spec {s!r}")

    out = rec(spec)
    rest = list(it)
    if rest:
        raise BadInputError(f"{len(rest)} leaves left over when rebuilding the structure")
    return out


def out_flatten(tree: Any) -> tuple[list[Any], Any]:
    """A model output's leaves and spec by PyTorch's maintained pytree
    (``torch.utils._pytree``): namedtuples, dict key order and any key types come back
    exactly as the model returned them (:func:`flatten` sorts dict keys, for input keys)."""
    from torch.utils._pytree import tree_flatten

    return tree_flatten(tree)


def out_unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    """Inverse of :func:`out_flatten`."""
    from torch.utils._pytree import tree_unflatten

    return tree_unflatten(list(leaves), spec)


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def input_signature(inputs: Any) -> Hashable:
    """Key of a captured CUDA graph: the structure plus each array's dtype and shape.

    A CUDA graph bakes in shapes, dtypes and non-tensor arguments, so queries that differ in
    any of these need their own graph; values of the arrays do not matter. Non-array leaves
    (ints, floats, strings, None) are part of the key by value.
    """
    leaves, spec = flatten(inputs, _is_array)
    key: list[tuple[Any, ...]] = []
    for x in leaves:
        if _is_array(x):
            key.append((str(x.dtype), tuple(int(d) for d in x.shape)))
        else:
            try:
                hash(x)
                key.append(("const", type(x).__name__, x))
            except TypeError:
                key.append(("const", type(x).__name__, repr(x)))
    return (spec, tuple(key))


# ----------------------------------------------------------------------------- packing

@dataclass(frozen=True)
class PackedLayout:
    """Where each tensor sits in one staging buffer.

    ``offsets[i]`` is the byte offset of leaf ``i``; ``runs`` lists ``(first, count)`` of
    consecutive leaves with equal dtype and shape that are stored back to back (a run is
    one contiguous block: a client packing by hand can fill it with one
    ``torch.stack(..., out=view)``). ``nbytes`` is the buffer size.
    """

    offsets: tuple[int, ...]
    nbytes_each: tuple[int, ...]
    runs: tuple[tuple[int, int], ...]
    nbytes: int


def pack_layout(specs: Sequence[tuple[Hashable, tuple[int, ...], int]], align: int = ALIGN) -> PackedLayout:
    """Lay out tensors given as ``(dtype_key, shape, itemsize)`` in one buffer.

    Runs of consecutive equal ``(dtype_key, shape)`` are contiguous (so a stacked view of
    the run is a plain contiguous tensor); each run starts at a multiple of ``align``.
    An empty tensor takes no bytes but keeps its own offset.
    """
    if align <= 0 or align & (align - 1):
        raise BadInputError(f"alignment must be a power of two, got {align}")
    offsets: list[int] = []
    sizes: list[int] = []
    runs: list[tuple[int, int]] = []
    pos = 0
    i = 0
    n = len(specs)
    while i < n:
        key, shape, item = specs[i]
        j = i + 1
        while j < n and specs[j][0] == key and tuple(specs[j][1]) == tuple(shape):
            j += 1
        each = int(math.prod(shape)) * int(item)
        pos = (pos + align - 1) // align * align
        for k in range(i, j):
            offsets.append(pos + (k - i) * each)
            sizes.append(each)
        runs.append((i, j - i))
        pos += each * (j - i)
        i = j
    total = (pos + align - 1) // align * align
    return PackedLayout(tuple(offsets), tuple(sizes), tuple(runs), max(total, align))


# ----------------------------------------------------------------------------- config

@dataclass(frozen=True)
class RuntimeConfig(RuntimeSettings):
    """The runtime's knobs: the fields, their defaults and checks are the plan type's
    (:class:`recsys_doctor.plan.RuntimeSettings`, one definition); this adds reading one
    from a plan."""

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any], **overrides: Any) -> "RuntimeConfig":
        """Build a config from a plan dict: ``advise --json``'s ``plan`` (planner schema 1:
        ``stream_groups.count``, ``merge_copy_compute.enabled``,
        ``per_stream_allocators.enabled``, ``cuda_graphs.enabled``) or a flat dict of the
        field names (``groups``, ``merge_streams``...), optionally under ``runtime``, read by
        :meth:`recsys_doctor.plan.Plan.from_dict` (unknown keys ignored, a recognized key
        with a wrong type raises :class:`BadInputError`).
        ``overrides`` (not None) win over the plan."""
        kw = Plan.from_dict(plan).runtime_fields()
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)
