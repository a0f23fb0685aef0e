"""A thread's input copies, staged: ``Tensor.to``/``.cuda`` of pinned tensors by a hooked thread
are remembered, and once its thread graph exists handed out as views whose data the graph brings."""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from ._common import _state, _tls
from .modstate import version
from .accounting import fell_back, script_site, taken_over
from .argtree import positional
from .pageable import (ASYNC_PINNED, LEFT_SYNCHRONOUS, MAX_COPY, Move, _host_array, _Slot, as_tensor_args, called_again,
                       copy_hazard, cuda_args, current_raw_stream, host_data, inexact, raw_call, stage, tensor_args,
                       to_args)
from .deferred import _materialize, _own_memory, make_lazy_type, settle
from .pageable_fast import capture_probe, cuda_stream_now, learn, list_array, same_copy
from .readmark import ReadMark, slots_free
from .steady import counted_fast, same_source, steady_copy
from .unplaced import unplaced_copy, unplaced_factory

# A plain script's query copies its host inputs to the GPU tensor by tensor
# (``x.to("cuda", non_blocking=True)`` from pinned memory), and then calls the model. Made
# by PyTorch, each copy is a device allocation, a cudaMemcpyAsync and an event for the
# pinned block: with 8 client threads those calls alone cap the script below 10x its
# eager throughput (bench/apply/results/script_floor_h100). So once a thread has made the same
# copies from the same pinned tensors into the same model call, the hook captures a CUDA
# graph of that thread's own (its "thread graph": the copies, as memcpy nodes from those
# pinned tensors into device buffers of the thread, then the model) and takes the copies
# over: a later ``.to()`` of the same tensor, in the same order, returns a view of the
# thread's device buffer at once, no CUDA call made, and the model call replays the graph,
# which copies all the inputs and runs the model in one launch.
#
# What keeps that the script's own results:
# * the view is a tensor subclass whose data is only due at the model call: any other
#   use of it first enqueues the copies this query has deferred (as PyTorch would have
#   made them, on the thread's stream), then runs as usual; reading its shape, dtype or
#   device does not need the data. A query whose views were used so (read, or written in
#   place) calls the model through the group's path, which copies the views as they are;
#   the graph would copy the pinned tensors again;
# * a view the script still holds when the same copy comes round again (it kept an
#   earlier query's input) is given its own memory first, a copy enqueued before the
#   graph overwrites the buffer;
# * only ``non_blocking=True`` copies of pinned, contiguous CPU tensors are taken over:
#   their data may be read by the GPU at any later point in the stream's order already,
#   so reading it at the model call instead is within their contract; the pinned tensors
#   stay referenced by the graph;
# * any other ``.to()`` (a different tensor, order, device or argument) in a query makes
#   the deferred copies now and leaves the rest to PyTorch, but for one made once every copy
#   of the graph is handed out (an input of a later model call): PyTorch's, the graph's copies
#   still deferred; a model call with other arguments makes them and takes the group's path
#   (above);
# * the copies, the model and the output's clone of one thread touch only that thread's
#   buffers and its graph's own memory pool, so threads sharing a group stay apart.

#: the most ``.to()`` results a thread remembers between two model calls, to learn sources
MAX_COPIES = 256


class _ThreadCopies:
    """The copy state of one hooked thread."""

    __slots__ = ("stream", "recent", "tg", "n", "pending", "reason", "lock", "slots", "slot_n", "slot_event",
                 "slot_mark", "replayed", "slot_churn", "learn_tries", "unkeyed", "routed", "tg_calls", "tg_hits")

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        # (result, source, Move, raw_call, the script's line) of this query's copies, while learning
        self.recent: list[tuple[Any, Any, Any, Any, str]] = []
        self.tg: _ThreadGraph | None = None
        self.n = 0  # views handed out in this query (slots 0..n-1); -1: this query left the graph's order
        self.pending = False  # those views' copies are deferred (not made yet)
        self.reason: str | None = None  # why this thread has no graph of its own
        self.lock = threading.Lock()
        self.slots: list[_Slot] = []  # the pinned buffers host copies are staged through, one per position
        self.slot_n = 0  # slots filled in this query
        self.slot_event: Any = None  # recorded after the last model call that read the slots
        #: where that call was a replay of the thread graph: ``(host counter, value)``, the value its
        #: :class:`ReadMark` shows once the replay's copies have read the slots (no event then)
        self.slot_mark: tuple[Any, int] | None = None
        self.replayed: _ThreadGraph | None = None  # the thread graph the current model call replayed
        self.slot_churn = 0  # slots given new (larger) memory
        self.learn_tries = 0  # model calls since the copies were first seen, with no thread graph yet
        self.unkeyed = 0  # model calls after copies whose arguments no graph takes (.thread_graphs._learn)
        self.routed = False  # the last model call went to the runtime's batching: its views unwritten (.served)
        self.tg_calls = 0  # top-level model calls since the thread graph was captured (.thread_graphs._judge)
        self.tg_hits = 0  # those of them its replay served


class _ThreadGraph:
    __slots__ = ("module_ref", "version", "graph", "src", "src_ptr", "src_shape", "moves", "tin", "handed", "template",
                 "static_out", "device", "tag", "raw", "learned", "copy_sites", "mark", "replays", "form", "lent")

    def __init__(self, module: Any, graph: Any, src: list[Any], tin: list[Any], template: Any, out: Any,
                 device: int, moves: list[Move | None] | None = None, lines: list[str] | None = None) -> None:
        # the module weakly (a model the script replaces is freed: :func:`.modstate.fresh`) and
        # which of its versions the graph holds (:mod:`.modstate`)
        try:
            self.module_ref: Any = weakref.ref(module)
        except TypeError:  # (not an object a weak reference can name: the tests' stand-ins)
            self.module_ref = lambda m=module: m
        self.version = version(module)
        self.graph = graph
        self.src = src  # the script's pinned tensors (kept alive: the graph reads them)
        self.src_ptr = [t.data_ptr() for t in src]
        self.src_shape = [t.shape for t in src]
        # what each copy's ``.to()``/``.cuda()`` asked for when it was learned (None: a slot's
        # copy, made by the hook): the same call again is the same copy (:func:`_copy_method`)
        self.moves: list[Move | None] = list(moves) if moves is not None else [None] * len(src)
        self.tin = tin  # this thread's device buffers, one per copy
        self.handed: list[Any] = [None] * len(src)  # the view last handed out for each copy
        self.template = template
        #: the template's flat form where it has one (:func:`.argtree.positional`: the usual call,
        #: checked without the walk) and names as many tensors as the graph copies
        form = positional(template)
        self.form = form if form is not None and sum(1 if n is None else n for n in form) == len(src) else None
        self.static_out = out
        self.device = device
        self.tag: Any = None  # the key tag of the calls it replays (:mod:`.host_args`)
        #: each copy's call as the script made it (:func:`raw_call`), or None: the same call again
        #: is the same copy, known without parsing it (:func:`_copy_method`'s first check)
        self.raw: list[Any] = [None] * len(src)
        #: each slot copy's pageable call as the script made it (:mod:`.pageable_fast`), or None
        self.learned: list[Any] = [None] * len(src)
        #: (script line, copies) of the script's own ``.to()`` / ``.cuda()`` of pinned tensors among
        #: its copies (a Move; None is a slot's copy, counted where the hook fills the slot), from
        #: ``lines``, each copy's script line: counted as taken over at each call it serves
        #: (:func:`.thread_graphs.count_copies`) as the model call is at its own
        n: dict[str, int] = {}
        for m, line in zip(self.moves, lines or ()):
            if m is not None:
                n[line] = n.get(line, 0) + 1
        self.copy_sites = tuple(n.items())
        self.mark: ReadMark | None = None  #: its replays' mark that their copies are done (captured with them)
        self.replays = 0  #: replays launched since the capture
        self.lent: Any = None  #: its outputs lent instead of cloned (:mod:`.lentout`), or None


def _copy_source(torch: Any, src: Any, out: Any) -> bool:
    """Whether ``out = src.to(cuda, non_blocking=True)`` is a copy a thread graph can
    take over: a plain contiguous pinned CPU tensor, same dtype and shape, no grad."""
    return (type(out) is torch.Tensor and type(src) is torch.Tensor and src.device.type == "cpu"
            and not src.requires_grad and src.dtype == out.dtype and src.shape == out.shape
            and src.is_contiguous() and out.is_contiguous() and src.is_pinned())


def _copy_in(torch: Any, st: _ThreadCopies, src: Any, dev: int, orig: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any], move: Move | None = None) -> Any:
    if st.routed:
        settle(torch, st)
    tg = st.tg
    if tg is not None:
        i = st.n
        if 0 <= i < len(tg.src) and dev == tg.device and same_source(tg, i, src):
            view = tg.handed[i]
            # references: the list, this name, getrefcount's argument; one more is the
            # script's (it kept an earlier query's input): that view gets its own memory
            if view is None or sys.getrefcount(view) > 3:
                if view is not None:
                    _own_memory(torch, view)
                view = tg.tin[i].as_subclass(_state["lazy_type"])
                view._rd_copies = st
                tg.handed[i] = view
            st.n = i + 1
            st.pending = True
            return view
        if i != len(tg.src) or not st.pending:
            # not the copy the graph expects: the deferred ones are made now, PyTorch does the rest
            _materialize(torch, st)
            st.n = -1
        # (else every copy of the graph's is handed out and this one is besides them: an input of a
        # later model call, method_api_serve.py's candidates; PyTorch's, the deferred ones kept)
    out = orig(src, *args, **kwargs)
    if move is not None:  # (the script's own copy, PyTorch's here; a slot's is counted where it is filled)
        fell_back("h2d", script_site(3), ASYNC_PINNED)
    if tg is None and st.reason is None and len(st.recent) < MAX_COPIES and _copy_source(torch, src, out):
        # weak references: a thread that copies but never calls a model keeps nothing alive
        st.recent.append((weakref.ref(out), weakref.ref(src), move, raw_call(torch, orig, args, kwargs, move),
                          script_site(3)))  # (3: the script's frame where _copy_method called: cached)
    return out


def _patch_copies(torch: Any) -> None:
    """Patch ``Tensor.to`` / ``Tensor.cuda`` (and, through :mod:`.pageable`, ``torch.as_tensor``
    / ``torch.tensor``) for hooked threads; other threads get PyTorch's own at once."""
    T = torch.Tensor
    _state["orig_tensor_methods"] = {"to": T.to, "cuda": T.cuda}
    _state["lazy_type"] = make_lazy_type(torch)
    _state["stream_now"] = cuda_stream_now(torch)
    T.to = _copy_method(torch, T.to, to_args)
    T.cuda = _copy_method(torch, T.cuda, cuda_args)
    _state["orig_torch_functions"] = {"as_tensor": torch.as_tensor, "tensor": torch.tensor}
    torch.as_tensor = _factory(torch, torch.as_tensor, as_tensor_args, "as_tensor")
    torch.tensor = _factory(torch, torch.tensor, tensor_args, "tensor")


def _graph_copy(src: Any, m: Move, pinned: bool) -> bool:
    """Whether ``src.to/cuda`` asking for ``m`` is a copy a thread graph may take over
    (:func:`_copy_in`): pinned (``pinned``: asked by the caller, once, as ``is_pinned()`` gives the
    GIL up), non-blocking, to the thread's group's device, in ``src``'s own dtype. A blocking one
    is not: the script may reuse the source right after it."""
    return (pinned and m.non_blocking and (m.dtype is None or m.dtype == src.dtype)
            and m.device == _tls.group.stream.device)


def _next_copy(src: Any) -> tuple[_ThreadCopies, _ThreadGraph] | None:
    """This thread's copy state and thread graph (or route) where ``src`` is the tensor it
    copies next, outside a nested model call; else None. The hot path of a script's query: no
    pinned-memory query, no other check."""
    st = getattr(_tls, "copies", None)
    if st is None or st.tg is None or _tls.depth:
        return None
    tg, i = st.tg, st.n
    return (st, tg) if 0 <= i < len(tg.src) and src is tg.src[i] else None


def _copy_method(torch: Any, orig: Any, parse: Any, capturing: Any = None) -> Any:
    """``Tensor.to`` / ``Tensor.cuda`` for hooked threads: a copy of a host tensor to the GPU
    that ``parse`` (:func:`.pageable.to_args` / :func:`.pageable.cuda_args`) recognizes and the
    hook makes exactly as PyTorch does (:func:`.pageable.inexact`) goes through :func:`_copy_in`
    (the thread graph) where :func:`_graph_copy` says so and the thread has one, else, unless it
    is asynchronous already (pinned, non-blocking: PyTorch's, counted), to :func:`_take_copy`; one it
    would not make exactly is PyTorch's, counted with the reason; anything else is ``orig``'s, as
    is every call while the thread's stream captures a graph of the script's own. A copy the thread graph knows already is taken
    first, unparsed (:func:`.steady.steady_copy`, else the checks again here): its pinned tensor copied
    by the same call (:func:`.pageable.called_again`), or a pageable one written into its slot
    (:func:`.pageable_fast.same_copy`, learned by :func:`.pageable_fast.learn` after the slow path)."""
    T = torch.Tensor
    capturing = capturing or capture_probe(torch)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "group", None) is None:
            unplaced_copy(torch, self, parse, args, kwargs, capturing)
            return orig(self, *args, **kwargs)
        if type(self) is not T or self.is_cuda or capturing():
            return orig(self, *args, **kwargs)
        view = steady_copy(torch, orig, self, args, kwargs)
        if view is not None:  # (the steady state of a thread graph's copy, made or deferred)
            return view
        nxt = _next_copy(self)  # (the same call as learned: the same copy, not parsed again)
        if nxt is not None and called_again(torch, nxt[1].raw[nxt[0].n], orig, args, kwargs):
            cs, tg = nxt
            return _copy_in(torch, cs, self, tg.device, orig, args, kwargs, tg.moves[cs.n])
        if nxt is None:
            st = getattr(_tls, "copies", None)
            if st is not None and st.tg is not None and not _tls.depth and st.reason is None:
                k = same_copy(torch, st, st.tg, self, orig, args, kwargs, _state["stream_now"])
                if k is not None:  # the thread graph's next pageable copy, its bytes in the slot
                    counted_fast(2)
                    return _copy_in(torch, st, k.slot, st.tg.device, _state["orig_tensor_methods"]["to"],
                                    (k.device,), {"non_blocking": True})
        m = parse(torch, args, kwargs)
        if nxt is not None and m is not None and m == nxt[1].moves[nxt[0].n]:
            # the thread graph's next copy, asked for with the same Move as when it was learned (so
            # inexact and _graph_copy say what they said then; _copy_in checks the tensor's memory,
            # shape and dtype are the same)
            return _copy_in(torch, nxt[0], self, m.device.index, orig, args, kwargs, m)
        if m is None or self.device.type != "cpu":  # not a host-to-GPU copy
            return orig(self, *args, **kwargs)
        why = inexact(torch, self, m)
        pinned = m.non_blocking and self.is_pinned()  # (asked once: it gives the GIL up)
        if why is None and _graph_copy(self, m, pinned):
            st = getattr(_tls, "copies", None)
            if st is not None and not _tls.depth:
                return _copy_in(torch, st, self, m.device.index, orig, args, kwargs, m)
        if pinned:  # (asynchronous already: pinned, non-blocking)
            if not _tls.depth:  # (the script's own copy, not one inside a model's forward)
                fell_back("h2d", script_site(2), ASYNC_PINNED)
            return orig(self, *args, **kwargs)
        if why is not None:
            fell_back("h2d", script_site(2), why)
            return orig(self, *args, **kwargs)
        out = _take_copy(torch, self, m.device, m.dtype, script_site(2))
        if out is None:
            return orig(self, *args, **kwargs)
        st = getattr(_tls, "copies", None)
        if st is not None and st.tg is not None:
            learn(torch, st, st.tg, self, out, m, (orig, args, kwargs), _tls.group.stream.cuda_stream)
        return out

    method.__name__ = getattr(orig, "__name__", "method")
    method.__wrapped__ = orig  # type: ignore[attr-defined]
    return method


SLOT_CHURN = 16  # slots given new memory (a copy larger than the slot) before a thread stops staging into slots


def _slot_copy(torch: Any, st: _ThreadCopies, x: Any, dev: Any, dtype: Any) -> Any:
    """A host-to-GPU copy of ``x`` (a CPU tensor or a numpy array) through the thread's own
    pinned slot for the query's ``slot_n``-th such copy, handed to :func:`_copy_in` as a
    non-blocking copy of that slot: the same slots every query, so the thread graph takes the
    copies over (one launch for the copies and the model). ``st`` is :func:`_slot_thread`'s (a
    thread not refused a graph of its own). None where the slots keep growing or the data is
    not plain: the caller leaves the copy to PyTorch."""
    if not slot_room(st, 1):
        return None
    a, _why = _host_array(torch, x, dtype)
    if a is None or a.nbytes > MAX_COPY:
        return None
    return slot_to_device(torch, st, slot_fill(torch, st, a), dev)


def slot_room(st: _ThreadCopies, n: int) -> bool:
    """Whether ``n`` more copies of this query may go through the thread's slots."""
    return st.slot_churn <= SLOT_CHURN and st.slot_n + n <= MAX_COPIES


def slot_fill(torch: Any, st: _ThreadCopies, a: Any) -> Any:
    """The thread's slot for the query's next copy (``slot_n``), holding the bytes of the numpy
    array ``a`` (a view of the slot's pinned buffer shaped as ``a``, the same one every time)."""
    i = st.slot_n
    if i == 0:
        # the last model call read the slots (a replay's memcpy nodes, or copies made
        # before it): they are written again only once that is done
        slots_free(torch, st)
    slots = st.slots
    if i < len(slots) and slots[i].fits(a):
        slot = slots[i]
    else:
        slot = _Slot(torch, a.nbytes)
        if i < len(slots):
            slots[i] = slot
            st.slot_churn += 1
        else:
            slots.append(slot)
    st.slot_n = i + 1
    return slot.fill(torch, a)


def slot_to_device(torch: Any, st: _ThreadCopies, slot: Any, dev: Any) -> Any:
    """A filled slot's copy to ``dev``: non-blocking, through :func:`_copy_in` (a view whose
    data the thread graph's replay brings, where the thread has one)."""
    orig_to = _state["orig_tensor_methods"]["to"]
    return _copy_in(torch, st, slot, dev.index, orig_to, (dev,), {"non_blocking": True})


def slots_read(torch: Any, st: _ThreadCopies) -> None:
    """After a top-level model call: the slots this query filled are read by work queued up to
    now on the thread's stream. Where the call replayed the thread graph (whose copies are then
    what reads them), the graph's :class:`ReadMark` value says when; else an event marks it
    (recorded on the group's stream object where that is the current one: no
    ``torch.cuda.current_stream()`` made). Either is waited for before they are written again."""
    tg, st.replayed = st.replayed, None
    if st.slot_n:
        n, st.slot_n = st.slot_n, 0
        if tg is not None and tg.mark is not None and n <= len(tg.src):
            st.slot_mark = (tg.mark.seen, tg.mark.base + tg.replays)
            return
        st.slot_mark = None
        if st.slot_event is None:
            st.slot_event = torch.cuda.Event()
        s = st.stream
        index = getattr(s, "device_index", None)  # (None: no CUDA stream, the CPU tests' groups)
        if index is not None and current_raw_stream(torch, index) == s.cuda_stream:
            st.slot_event.record(s)
        else:
            st.slot_event.record()


def _slot_thread() -> _ThreadCopies | None:
    """This thread's copy state where its slots may take a host copy (outside a nested model
    call, and the thread not refused a graph of its own), else None."""
    st = getattr(_tls, "copies", None)
    return st if st is not None and not _tls.depth and st.reason is None else None


def _take_copy(torch: Any, x: Any, dev: Any, dtype: Any, site: str) -> Any:
    """A hooked thread's copy of host data ``x`` to ``dev``, taken over where no
    :func:`.pageable.copy_hazard` forbids it: into the thread's slots (:func:`_slot_copy`),
    else, with staging on, through :func:`.pageable.stage`. None where neither takes it: the
    caller makes PyTorch's copy (counted at ``site`` here or by ``stage``). Where neither could
    (no slots for this thread, staging off: the default path) nothing more is looked at."""
    st = _slot_thread()
    staging = bool(_state.get("stage_pageable"))
    if st is None and not staging:
        fell_back("h2d", site, LEFT_SYNCHRONOUS)
        return None
    hazard = copy_hazard(torch, dev)
    if hazard is not None:
        fell_back("h2d", site, hazard)
        return None
    if st is not None:
        out = _slot_copy(torch, st, x, dev, dtype)
        if out is not None:
            taken_over("h2d", site)
            return out
    if not staging:
        fell_back("h2d", site, LEFT_SYNCHRONOUS)
        return None
    return stage(torch, x, dev, dtype, site=site)


def _factory(torch: Any, orig: Any, parse: Any, name: str, capturing: Any = None) -> Any:
    """``torch.as_tensor`` / ``torch.tensor`` for hooked threads: host data (numpy, lists, a CPU
    tensor) asked for on the GPU goes to the thread's slots (:func:`_slot_copy`) or, with
    staging on, to :func:`.pageable.stage`; either way made on the CPU first by PyTorch's own
    function (its dtype rules), but for a numpy array copied as it is. Anything else, and every
    call where neither applies, goes straight to ``orig`` (counted); so does every call while the
    thread's stream captures (:func:`.pageable_fast.capture_probe`), but for a model's host
    argument, whose own ``rd_take`` serves the hook's captures."""
    T = torch.Tensor
    capturing = capturing or capture_probe(torch)

    def factory(*args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "group", None) is None:
            unplaced_factory(torch, parse, args, kwargs, capturing)
            return orig(*args, **kwargs)
        p = parse(torch, args, kwargs)
        data = args[0] if args else kwargs.get("data")
        take = getattr(type(data), "rd_take", None)
        if take is not None:  # a model's host argument inside its forward (.host_args; in captures too)
            return take(data, orig, name, args, kwargs, p)
        if capturing() or p is None or not host_data(T, data):
            return orig(*args, **kwargs)
        dev, dtype = p
        site = script_site(2)
        if _slot_thread() is None and not _state.get("stage_pageable"):  # as in _take_copy, before a host tensor is made
            fell_back("h2d", site, LEFT_SYNCHRONOUS)
            return orig(*args, **kwargs)
        np = sys.modules.get("numpy")
        try:
            if isinstance(data, T) or (dtype is None and np is not None and isinstance(data, np.ndarray)):
                host = data  # a numpy array's bytes and dtype are what PyTorch would copy
            else:  # lists: numpy's conversion where it is the same tensor (faster), else PyTorch's
                host = list_array(torch, data, dtype)
                if host is None:
                    host = orig(data, dtype=dtype)
        except (TypeError, ValueError, RuntimeError):
            return orig(*args, **kwargs)  # PyTorch says what is wrong with the data
        out = _take_copy(torch, host, dev, dtype if isinstance(host, T) else None, site)
        return orig(*args, **kwargs) if out is None else out

    factory.__name__ = name
    factory.__wrapped__ = orig  # type: ignore[attr-defined]
    return factory
