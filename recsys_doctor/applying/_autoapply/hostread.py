"""A thread graph's lent outputs read back to the host by the script (``out.cpu()``), with the copy
made inside the graph.

A serving script reads its scores back with ``out.cpu()`` (``.cpu().numpy()``). Made by PyTorch,
that is a host allocation, a device-to-host copy into pageable memory (the driver stages it and
waits) and the dispatcher's work, every query, while the interpreter lock (GIL) is given up and
taken back behind the other client threads. On the H200 a hand-written server around the DLRM
script's graph lost 16% to that read (``cpu_only`` against ``from_numpy``,
``bench/apply/results/session28_h200/3_ablation``): the graph's own copy to pinned memory and a
numpy copy of it cost less.

So once the script has read :data:`LEARN_READS` of a thread graph's lent outputs straight back with
``.cpu()`` (at least every other replay's), the thread's graph is captured again with a copy of
those outputs into pinned host memory of its own after the model (one memcpy node; one capture
more a thread). From then on ``.cpu()`` of that lent output waits for the stream the replay ran on
(the GIL released, as ``.cpu()`` waits) and returns a copy of the pinned memory made by numpy
(holding the GIL: no PyTorch call). The script gets a tensor of its own, as from ``.cpu()``.

Taken over only where it is the same read (else PyTorch's ``.cpu()``, counted at the script's line
with the reason where the copy was in the graph):

* the lent output of this thread's latest replay, read once by the thread that replayed it (a
  second ``.cpu()`` of it, one after a later call, another thread's, one with arguments: PyTorch's);
* not written since the replay: its version counter is the one it had when handed out (an in-place
  operation of the script, or of a view of it, moves it);
* the thread's current stream is the one the replay ran on (what ``.cpu()`` would wait for), and
  the read is made outside inference mode, as the capture was: an output captured in inference
  mode has no version counter, so its reads are never taken over.

``RECSYS_DOCTOR_HOST_READS=0`` leaves every ``.cpu()`` to PyTorch."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from ._common import _state
from .accounting import fell_back, script_site, taken_over

#: whether the lent outputs' reads are watched and learned (``RECSYS_DOCTOR_HOST_READS=0``: never)
ON = os.environ.get("RECSYS_DOCTOR_HOST_READS", "1") != "0"
#: lent outputs the script read straight back with ``.cpu()`` before its graph copies them itself
LEARN_READS = 8
#: the most bytes of one call's outputs a thread graph copies to the host
MAX_HOST_BYTES = 4 << 20
#: why a read of an output whose copy the graph makes was PyTorch's
WRITTEN = "the output was written after its replay"
ELSEWHERE = "read on another stream than its replay's, or in inference mode"

#: id of a lent output -> its :class:`Read`
_reads: dict[int, Read] = {}


class Read:
    """One lent output of one thread graph, watched for ``.cpu()``."""

    __slots__ = ("alias", "index", "host", "host_np", "fresh", "ver", "stream", "dev", "reads", "handouts",
                 "owner", "flags", "learn")

    def __init__(self, alias: Any, index: int, host: Any, flags: list[bool], learn: bool) -> None:
        self.alias = weakref.ref(alias)
        self.index = index
        self.host = host  #: the pinned tensor the graph copies this output into, or None (not yet learned)
        self.host_np = _numpy(host)
        self.fresh = False  #: handed out by the latest replay, not read yet
        self.ver = 0
        self.stream = 0
        self.dev = alias.get_device()
        self.reads = 0  #: reads of fresh outputs, while the graph makes no copy
        self.handouts = 0
        self.owner = threading.get_ident()
        self.flags = flags  #: the thread graph's ``want_host``: one shared cell
        self.learn = learn  #: whether its reads are counted (no copy to the host tried yet)


def _numpy(host: Any) -> Any:
    if host is None:
        return None
    try:
        return host.numpy()
    except (TypeError, RuntimeError):  # (a dtype numpy lacks: copied by PyTorch)
        return None


def register(tg: Any, hosts: list[Any] | None) -> None:
    """After a thread graph's capture: its lent outputs watched (``hosts``: each one's pinned copy
    the graph makes, or None). Nothing where it lends nothing or lends inference tensors."""
    lent = tg.lent
    if not _state.get("host_reads_on") or lent is None or lent.inference:
        return
    flags = tg.want_host
    reads = []
    for i, a in enumerate(lent.aliases):
        e = Read(a, i, hosts[i] if hosts else None, flags, hosts is None)
        _reads[id(a)] = e
        reads.append(e)
    tg.reads = tuple(reads)


def forget(tg: Any) -> None:
    """A thread graph dropped: its outputs are no longer watched."""
    for e in getattr(tg, "reads", None) or ():
        a = e.alias()
        if a is not None and _reads.get(id(a)) is e:
            del _reads[id(a)]
    tg.reads = None


def stop_learning(tg: Any) -> None:
    """The script reads a thread graph's outputs back, but none can be copied to the host by the
    graph (:func:`host_spec` is None): their reads are not counted again."""
    tg.want_host[0] = False
    for e in tg.reads or ():
        e.learn = False


def handed(tg: Any, lent: bool) -> None:
    """At each replay of a watched thread graph: its outputs are fresh where they were lent (else
    the script got clones, and the lent ones hold other values than the host copy now)."""
    if not lent:
        for e in tg.reads:
            e.fresh = False
        return
    aliases = tg.lent.aliases
    now = _state["stream_now"]
    for e in tg.reads:
        e.fresh = True
        e.handouts += 1
        if e.host is not None:
            e.ver = aliases[e.index]._version
            e.stream = now(e.dev)


def host_spec(tg: Any) -> list[Any] | None:
    """The outputs a thread graph captured again should copy to the host: ``(shape, dtype)`` of each
    the script read back (None for the others), within :data:`MAX_HOST_BYTES`; None if none."""
    if not tg.reads:
        return None
    spec: list[Any] = [None] * len(tg.reads)
    total = 0
    for e in tg.reads:
        a = e.alias()
        if a is None or not e.reads or not a.is_contiguous():
            continue
        total += a.numel() * a.element_size()
        if total > MAX_HOST_BYTES:
            return None
        spec[e.index] = (tuple(a.shape), a.dtype)
    return spec if any(s is not None for s in spec) else None


def host_buffers(torch: Any, spec: list[Any] | None) -> list[Any] | None:
    """Pinned host tensors for :func:`host_spec`'s outputs (None elsewhere)."""
    if not spec:
        return None
    return [None if s is None else torch.empty(s[0], dtype=s[1], pin_memory=True) for s in spec]


def takes(torch: Any, host: Any, out: Any) -> bool:
    """Whether the graph can copy ``out`` (one captured output) into ``host`` byte for byte."""
    return (host is not None and type(out) is torch.Tensor and out.is_cuda and out.is_contiguous()
            and out.dtype == host.dtype and out.shape == host.shape)


def install(torch: Any, origs: dict[str, Any]) -> None:
    """Patch ``Tensor.cpu`` (its original kept in ``origs``, restored with the hook's others) where
    thread graphs lend their outputs."""
    if not ON:
        return
    from recsys_doctor.runtime._fastpath import driver_fastpath

    origs["cpu"] = torch.Tensor.cpu
    torch.Tensor.cpu = patched_cpu(torch, origs["cpu"], driver_fastpath().sync)
    _state["host_reads_on"] = True


def patched_cpu(torch: Any, orig: Any, sync: Any) -> Any:
    """``Tensor.cpu`` taking over the reads above (``sync(stream)``: wait for a raw stream, the
    GIL released)."""
    get = _reads.get

    def cpu(self: Any, *args: Any, **kwargs: Any) -> Any:
        e = get(id(self))
        if e is not None and e.fresh and not args and not kwargs and e.alias() is self:
            out = _read(torch, e, self, sync)
            if out is not None:
                return out
        return orig(self, *args, **kwargs)

    cpu.__doc__ = orig.__doc__
    return cpu


def _read(torch: Any, e: Read, t: Any, sync: Any) -> Any:
    """The host copy of a fresh lent output, or None (PyTorch's ``.cpu()``)."""
    e.fresh = False
    if threading.get_ident() != e.owner:
        return None
    if e.host is None:  # (the graph makes no copy: learning, or none it can make)
        if e.learn:
            e.reads += 1
            if e.reads >= LEARN_READS and 2 * e.reads >= e.handouts:
                e.flags[0] = True
        return None
    if t._version != e.ver:
        fell_back("d2h", script_site(3), WRITTEN)
        return None
    if _state["stream_now"](e.dev) != e.stream or torch.is_inference_mode_enabled():
        fell_back("d2h", script_site(3), ELSEWHERE)
        return None
    sync(e.stream)
    taken_over("d2h", script_site(3))
    _state["host_reads"] = _state.get("host_reads", 0) + 1
    if e.host_np is not None:
        return torch.from_numpy(e.host_np.copy())
    return e.host.clone()
