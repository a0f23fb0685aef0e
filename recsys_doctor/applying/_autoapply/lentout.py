"""A thread graph's outputs lent to the script instead of cloned.

A replay writes its outputs into the graph's static output tensors, so until now each replay handed
the script a clone of them: one device allocation and one copy kernel an output, each a PyTorch call
that gives the interpreter lock (GIL) up, to be taken back behind the other client threads. Against a
server written by hand around the same graph, how the outputs reach the script cost the DLRM script
0.58-0.99x (``bench/apply/results/session26_h200/``).

Here the script gets aliases of the static outputs instead: plain tensors sharing their memory (not
autograd views), the same objects at every replay. That is safe as long as nothing of the script
still holds one when the next replay overwrites them, which the next replay checks first
(:meth:`Lent.free`): each alias's reference count and its memory's use count (a view or ``.detach()``
of it holds the memory) are back to what the hook alone holds. GPU work the script queued on an
output runs before that replay: both are on the thread's group stream.

Where the script still holds an alias, and nothing else holds its memory (it kept the tensor, as a
list of results does), the alias is given memory of its own first (its values copied, ``set_``), and
the thread graph hands out clones from then on. Where a view or ``.detach()`` of it is still alive,
the memory cannot be taken from under it: the call is not replayed (:meth:`Lent.ready` is false; it
runs on the group's path, a miss of the thread graph) until that view is gone. Outputs that are not
one tensor or a plain tuple of tensors, and a call in another inference mode than the capture's,
get clones as before. ``RECSYS_DOCTOR_LEND_OUTPUTS=0`` turns lending off.

A DLPack export of an alias (``torch.utils.dlpack.to_dlpack``, ``__dlpack__``: CuPy's, JAX's
``from_dlpack``) holds the alias's tensor itself, not a new reference to its memory: its tensor's use
count shows it, and it holds the replays back as a view does. So does a lent tensor whose
``__cuda_array_interface__`` was read (CuPy's ``asarray``, Numba's ``as_cuda_array``: the array keeps
the tensor and its address), once the script still holds it at the next call: its memory is not
moved from under that address (:func:`exported_property` marks it). Not seen: a raw ``data_ptr()``
kept past the next call, where the script kept the tensor too (its values moved, the address not).
A script that does that needs lending off."""

from __future__ import annotations

import os
import sys
from typing import Any

#: whether thread graphs lend their outputs (``RECSYS_DOCTOR_LEND_OUTPUTS=0``: clones)
LEND = os.environ.get("RECSYS_DOCTOR_LEND_OUTPUTS", "1") != "0"
#: the attribute :func:`exported_property` sets on a tensor whose ``__cuda_array_interface__`` was read
EXPORTED = "_rd_address_out"


def exported_property(orig: Any) -> property:
    """``Tensor.__cuda_array_interface__`` (``orig``, the property) marking the tensor first: an
    array made from it keeps the tensor and reads its memory by address (:meth:`Lent.reclaim`)."""

    def get(self: Any) -> Any:
        try:
            setattr(self, EXPORTED, True)
        except (AttributeError, TypeError):  # (a subclass that takes no attributes: never a lent output)
            pass
        return orig.__get__(self, type(self))

    return property(get, doc=orig.__doc__)


def _counters(torch: Any) -> tuple[Any, Any]:
    """The use counts :func:`_held` reads: a storage's (``torch._C._storage_Use_Count``) and a
    tensor's own (``Tensor._use_count``; where this PyTorch lacks it, always 0)."""
    impl = getattr(torch.Tensor, "_use_count", None)
    return torch._C._storage_Use_Count, impl if impl is not None else (lambda a: 0)


def _held(counters: tuple[Any, Any], aliases: tuple[Any, ...]) -> list[tuple[int, int, int]]:
    """Each alias's reference count, its memory's use count and its tensor's own use count (a
    DLPack export holds the tensor, not a new reference to its memory), measured the same way every
    time (the loop's own reference included)."""
    uses, impl = counters
    return [(sys.getrefcount(a), uses(a.untyped_storage()._cdata), impl(a)) for a in aliases]


def _alias(torch: Any, t: Any) -> Any:
    """A tensor sharing ``t``'s memory, shape and strides: a plain tensor, not an autograd view."""
    with torch.inference_mode(t.is_inference()), torch.no_grad():
        a = torch.empty(0, dtype=t.dtype, device=t.device)
        a.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    return a


class Lent:
    """The aliases a thread graph lends for its static outputs (see the module docstring)."""

    __slots__ = ("torch", "counters", "aliases", "single", "rest", "inference", "off")

    def __init__(self, torch: Any, outs: tuple[Any, ...], single: bool) -> None:
        self.torch = torch
        self.aliases = tuple(_alias(torch, t) for t in outs)
        self.single = single
        self.inference = outs[0].is_inference()
        self.counters = _counters(torch)  # (bound once: read before every replay)
        self.rest = _held(self.counters, self.aliases)  # what the hook alone holds
        self.off = False  #: the script kept one: clones from then on

    def ready(self) -> bool:
        """Before a replay: whether it may overwrite the static outputs (the script holds nothing of
        the aliases, or what it held was given memory of its own by :meth:`reclaim`)."""
        if self.off or self.free():
            return True
        if self.reclaim():
            self.off = True
            return True
        return False

    def usable(self) -> bool:
        """Whether this replay's outputs are lent: not turned off, and a call made in the capture's
        inference mode (a clone made now would be an inference tensor exactly when they are)."""
        return not self.off and self.torch.is_inference_mode_enabled() == self.inference

    def handout(self) -> Any:
        return self.aliases[0] if self.single else tuple(self.aliases)

    def free(self) -> bool:
        """Whether the script holds none of the aliases, nor anything of their memory: :func:`_held`'s
        counts, read alias by alias with the same references held (the tuple, one name, the
        argument) and no list made (it runs before every replay)."""
        uses, impl = self.counters
        aliases, rest = self.aliases, self.rest
        for j in range(len(aliases)):
            a = aliases[j]
            r0, u0, i0 = rest[j]
            if sys.getrefcount(a) > r0 or uses(a.untyped_storage()._cdata) > u0 or impl(a) > i0:
                return False
        return True

    def reclaim(self) -> bool:
        """Before a replay where :meth:`free` is false: give each alias the script still holds its own
        memory (its values copied), so that the replay cannot change it. False, nothing done, where a
        view or ``.detach()`` of one is alive, or a DLPack export of one (their memory cannot be moved
        under them)."""
        now = _held(self.counters, self.aliases)
        if any(u > u0 or i > i0 for (_, u, i), (_, u0, i0) in zip(now, self.rest)):
            return False
        if any(r > r0 and getattr(a, EXPORTED, False) for a, (r, _, _), (r0, _, _) in zip(self.aliases, now, self.rest)):
            return False  # (its address went to an array made from __cuda_array_interface__)
        torch = self.torch
        for a, (r, _, _), (r0, _, _) in zip(self.aliases, now, self.rest):
            if r > r0:
                with torch.inference_mode(a.is_inference()), torch.no_grad():
                    c = a.clone()
                    a.set_(c.untyped_storage(), c.storage_offset(), c.shape, c.stride())
        return True


def lend(torch: Any, static_out: Any) -> Lent | None:
    """The :class:`Lent` of a thread graph's static output, where it is one tensor or a plain tuple of
    tensors (and lending is on); else None: the replays hand out clones."""
    if not LEND:
        return None
    T = torch.Tensor
    if type(static_out) is T:
        return Lent(torch, (static_out,), True)
    if type(static_out) is tuple and static_out and all(type(t) is T for t in static_out):
        return Lent(torch, static_out, False)
    return None
