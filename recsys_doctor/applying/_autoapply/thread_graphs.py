"""A thread's own graph: its staged input copies and the model call captured together, replayed
when the same copies of the same pinned tensors come round again (one launch a query)."""

from __future__ import annotations

from typing import Any

import os

from ._common import ENV_REPLAY_WINDOW, ENV_THREAD_GRAPH_MIN_CALLS, _lock, _log, _state, _tls, _torch, normal_tensors, trains
from .accounting import taken_over
from .argtree import matches, matches_positional, remake, skeleton
from .buckets import call_rows
from .fallback import _debug_traceback, _fall_back, _synchronize_quietly, failure_reason
from .graphs import _clone_out, _graph_of, _graphed_call, _key, _static_out
from .lentout import lend
from .groups import _Group, _run_shared
from .modstate import fresh, stale
from .deferred import _materialize, settle
from .readmark import ReadMark
from .staging import _ThreadCopies, _ThreadGraph


#: model calls a thread's copies wait for a graph of the call's exact shapes to learn from
LEARN_TRIES = 8


#: A thread graph pays for its capture (every other hooked thread held off meanwhile, a few ms)
#: over many calls of its one thread. Where most of the script's threads that ended made fewer
#: top-level model calls than this (a thread per request, a pool per wave of requests), a
#: thread learns its graph only once it has made this many calls itself (set by
#: ``RECSYS_DOCTOR_THREAD_GRAPH_MIN_CALLS``; 0: every thread learns at once, whatever the lives)
MIN_THREAD_CALLS = 32


def _env_calls(name: str, default: int) -> int:
    """A count of calls from the environment variable ``name`` (``default`` where unset or not an
    integer, said once on stderr; a negative one is 0)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return max(0, int(raw))
    except ValueError:
        _log(f"{name}={raw!r} is not an integer: {default} calls")
        return default


def _min_calls() -> int:
    return _env_calls(ENV_THREAD_GRAPH_MIN_CALLS, MIN_THREAD_CALLS)


def _replay_window() -> int:
    return _env_calls(ENV_REPLAY_WINDOW, REPLAY_WINDOW)


#: threads that ended before their lives are judged (:func:`short_lived`)
LIVES_SEEN = 4


def thread_ended() -> None:
    """At the end of a thread placed with a copy state: its top-level model calls (``_tls.calls``,
    counted by :func:`.interception._patch_module`'s ``__call__``, every path) counted towards
    :func:`short_lived`."""
    if getattr(_tls, "copies", None) is None:
        return
    young = getattr(_tls, "calls", 0) < _state.get("min_thread_calls", MIN_THREAD_CALLS)
    with _lock:
        _state["ended_threads"] = _state.get("ended_threads", 0) + 1
        _state["short_lived_threads"] = _state.get("short_lived_threads", 0) + young


def short_lived() -> bool:
    """Whether most of the placed threads that ended so far (at least :data:`LIVES_SEEN`) made
    fewer than :data:`MIN_THREAD_CALLS` model calls."""
    return mostly_short(_state.get("ended_threads", 0), _state.get("short_lived_threads", 0))


def mostly_short(ended: int, short: int) -> bool:
    """:func:`short_lived` of these counts (also the report's, from the stats)."""
    return ended >= LIVES_SEEN and 2 * short > ended


#: why a call's arguments cannot be learned as the thread's copies (:func:`copy_sources`)
NOT_COPIES = "an argument of the model call is not a copy of a pinned CPU tensor made just before it"
#: why a thread has none where its model calls take arguments no graph takes
NOT_KEYED = f"the model calls' arguments are not ones a graph takes ({LEARN_TRIES} calls, none that are)"

#: A thread graph serves one key (the call's exact shapes and arguments). Where a thread's calls
#: vary more than that (optional_features_serve.py: 4 sets of keyword features x 2 temperatures
#: x row buckets), its copies were staged through slots every query for a replay that came in 15
#: of 12,000 calls, 0.64x of the script on the H200 against 0.80-1.01x without thread graphs.
#: After this many calls since its capture (those it served, and those that paid for it without
#: a replay: its copies deferred, or copies staged into the slots), a thread graph that served
#: fewer than a quarter of them is dropped: the thread's calls take the group's graphs, its
#: copies are PyTorch's. A call that paid nothing (another model's, with pinned inputs of its
#: own: the thread graph still saves its model's launches every query) is not counted
#: (``RECSYS_DOCTOR_REPLAY_WINDOW`` sets it; 0: never dropped, the behaviour before, to compare)
REPLAY_WINDOW = 64
RARELY_REPLAYED = ("its thread graph served fewer than 1 in 4 of the thread's model calls since its capture "
                   "(their shapes or arguments vary): its copies are PyTorch's")


def copy_sources(recent: list[tuple[Any, Any, Any, Any, str]],
                 tensors: list[Any]) -> tuple[list[Any], list[Any], list[Any], list[str]] | None:
    """Where every tensor of a model call is one of this query's copies (``recent``, as
    :func:`_copy_in` remembers them): their sources, :class:`Move`, :func:`raw_call` and script
    lines in the call's order; else None."""
    copies = {}
    for out_ref, src_ref, move, raw, line in recent:
        out, s_ = out_ref(), src_ref()
        if out is not None and s_ is not None:
            copies[id(out)] = (out, s_, move, raw, line)
    src, moves, raws, lines = [], [], [], []
    for t in tensors:
        hit = copies.get(id(t))
        if hit is None or hit[0] is not t:
            return None
        src.append(hit[1])
        moves.append(hit[2])
        raws.append(hit[3])
        lines.append(hit[4])
    return src, moves, raws, lines


def count_copies(tg: _ThreadGraph) -> None:
    """The copies of one call ``tg`` served, taken over at the script's lines."""
    for line, k in tg.copy_sites:
        taken_over("h2d", line, k)


def _copies_call(st: _ThreadCopies, orig_call: Any, module: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], site: str = "?") -> Any:
    """A top-level model call, made at ``site``, of a thread whose copies a thread graph may own."""
    torch = _torch()
    drop_stale(torch, st, module)
    tg, n, pending = st.tg, st.n, st.pending
    st.n = 0
    # (pending: no operation has touched this query's views, so none was written to since
    # its copy: the replay's own copies give the model exactly what the script handed it)
    if (tg is not None and st.pending and n == len(tg.src) and fresh(tg, module) and not trains(module)
            and not torch.is_grad_enabled() and getattr(orig_call, "key_tag", None) == tg.tag
            and (matches_positional(tg.form, args, kwargs, tg.handed) if tg.form is not None
                 else matches(tg.template, (args, kwargs), torch.Tensor, iter(tg.handed)))
            and (tg.lent is None or tg.lent.ready())):
        try:
            out = _run_shared(_thread_replay, tg)
            st.replayed = tg  # (its mark says when the slots it read are free: .staging.slots_read)
            st.pending = False
            st.tg_calls += 1
            st.tg_hits += 1
            taken_over("model", site)
            count_copies(tg)
            return out
        except Exception as ex:  # noqa: BLE001 - eager and the group's graphs from now on, with the reason
            st.n = n
            _materialize(torch, st)
            st.tg, st.reason = None, f"thread graph replay failed: {failure_reason(ex)}"
            _fall_back(f"{type(module).__name__} ({site}): {st.reason}", st.reason)
    elif st.pending:
        st.n = n
        _materialize(torch, st)
    if tg is not None and st.tg is tg and (pending or st.slot_n):
        # a miss that cost something: the graph's copies deferred for nothing, or this call's
        # copies staged into the slots (a call with neither, another model's with pinned inputs
        # of its own, is neither a hit nor a miss)
        _judge(torch, st, module, site)
    st.n = 0
    recent, st.recent = st.recent, []
    out = _graphed_call(orig_call, module, args, kwargs, site)
    if st.tg is None and st.reason is None and recent:
        _learn(torch, st, orig_call, module, args, kwargs, recent, site)
    return out


def _judge(torch: Any, st: _ThreadCopies, module: Any, site: str) -> None:
    """A call its thread graph did not serve, at a cost (its copies made already): past
    :data:`REPLAY_WINDOW` such calls and hits since the capture, a graph that served fewer than a
    quarter of them is dropped (:data:`RARELY_REPLAYED`), once its last replay is done."""
    st.tg_calls += 1
    window = _state.get("replay_window", REPLAY_WINDOW)
    if not window or st.tg_calls < window or 4 * st.tg_hits >= st.tg_calls:
        return
    torch.cuda.current_stream().synchronize()  # (its last replay read its buffers: done before they go)
    st.tg, st.reason = None, RARELY_REPLAYED  # (the query's copies are not learned: _copies_call asks reason)
    _fall_back(f"{type(module).__name__} ({site}): {RARELY_REPLAYED} ({st.tg_hits} of {st.tg_calls})",
               RARELY_REPLAYED)


def flush(torch: Any, st: _ThreadCopies) -> None:
    """Before a call that no thread graph will replay: the copies this query deferred (for the
    runtime's route, or for a replay) are made, and the query's copies are forgotten."""
    settle(torch, st)
    if st.pending:
        _materialize(torch, st)
    st.n = 0
    st.recent = []


def drop_stale(torch: Any, st: _ThreadCopies, module: Any) -> None:
    """Before a call of ``module``: drop the thread's graph where its model was freed or
    changed since (:func:`.modstate.stale`): the copies it deferred are made first, its last
    replay is waited for, and the thread learns its copies again."""
    if st.tg is None or not stale(st.tg, module):
        return
    if st.pending:
        _materialize(torch, st)
    st.n = 0
    torch.cuda.current_stream().synchronize()
    st.tg, st.reason, st.learn_tries, st.unkeyed = None, None, 0, 0


def _learn(torch: Any, st: _ThreadCopies, orig_call: Any, module: Any, args: tuple[Any, ...],
           kwargs: dict[str, Any], recent: list[tuple[Any, Any, Any, Any, str]], site: str = "?") -> None:
    """Capture this thread's graph once the group's graph of this call exists and every
    tensor argument of the call is one of this query's copies of a pinned tensor."""
    if trains(module) or torch.is_grad_enabled():
        return
    if _tls.calls < _state.get("min_thread_calls", MIN_THREAD_CALLS) and short_lived():
        return  # (not learned yet: asked again at this thread's next calls)
    kt = _key(torch, module, args, kwargs, getattr(orig_call, "key_tag", None))
    g: _Group = _tls.group
    if kt is None:
        # an argument no graph takes (an object of the script's own, kjt_ranker_serve.py's
        # KeyedJagged): the call runs eagerly; after a few such calls, and none a graph could take
        # (a thread calling two models learns for the other), the thread stops staging its copies
        # into slots for a graph it cannot have (its slot copies, learning and events cost GIL
        # time every query: that script ran 0.67x under one group, every call eager)
        st.unkeyed += 1
        if st.unkeyed > LEARN_TRIES and not st.learn_tries:
            st.reason = NOT_KEYED
        return
    e = g.entries.get(kt[0])
    if e is not None and e.reason is not None:
        st.reason = "the call runs eagerly"
    if e is None or e.graph is None:
        # not graphed (yet): nothing to learn; a call that never gets a graph of its exact
        # shapes (the bound reached) leaves the thread's copies to PyTorch. A call padded to its
        # row bucket (a last partial batch) is not a try: the thread's full batches may be graphed
        if not _padded(g, module, kt[1]):
            st.learn_tries += 1
        if st.learn_tries > LEARN_TRIES:
            st.reason = f"no graph of the call's own shapes after {LEARN_TRIES} calls"
        return
    found = copy_sources(recent, kt[1])
    if found is None:
        st.reason = NOT_COPIES
        return
    src, moves, raws, lines = found
    try:
        st.tg = _capture_thread(torch, g, orig_call, module, args, kwargs, kt[1], src, moves, lines)
        st.tg.raw = raws
        st.tg_calls = st.tg_hits = 0
        _state["thread_captured"] += 1
    except Exception as ex:  # noqa: BLE001 - the group's path stays, with the reason
        _debug_traceback()
        st.reason = f"no thread graph: {failure_reason(ex)}"
        _fall_back(f"{type(module).__name__} ({site}): {st.reason}", st.reason)
        _synchronize_quietly(torch)


def _padded(g: _Group, module: Any, tensors: list[Any]) -> bool:
    """Whether a call of ``module`` with ``tensors`` goes to the group's graphs padded to its row bucket."""
    s = g.sites.get(id(module))
    return s is not None and s.pads(call_rows(tensors))


def _h2d(dst: Any, src: Any, stream: Any) -> None:
    """One host-to-device cudaMemcpyAsync of ``src`` (pinned) into ``dst`` on ``stream``:
    in a capture, a memcpy node reading the pinned tensor at every replay."""
    from cuda.bindings import runtime as cudart

    err, = cudart.cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size(),
                                  cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream.cuda_stream)
    if int(err) != 0:
        raise RuntimeError(f"cudaMemcpyAsync: {err}")


def _capture_thread(torch: Any, g: _Group, orig_call: Any, module: Any, args: Any, kwargs: Any,
                    tensors: list[Any], src: list[Any], moves: list[Any] | None = None,
                    lines: list[str] | None = None) -> _ThreadGraph:
    with normal_tensors(torch):
        tin = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    s_args, s_kwargs = remake((args, kwargs), torch.Tensor, iter(tin))
    template = skeleton((args, kwargs), torch.Tensor)
    # a side stream of the runtime's for this thread's one capture, not the group's capture
    # stream: the group's capture (under the group's lock, not this thread's) may be
    # synchronizing that stream when this capture begins on it
    stream = g.streams.side_stream()
    with normal_tensors(torch):
        mark = ReadMark(torch, tin[0].device) if tin else None
    # the mark's counter is zeroed by a kernel on the current stream (the group's, which other
    # threads' replays may keep busy) and counted on the capture stream next: the zeroing must be
    # done first. With the group stream synchronized before the mark was made, the failing thread
    # graphs of session 27 had marks whose counters had lost the capture's eager count and whose
    # bases were garbage: a negative one let the thread write its slots while its replays had yet
    # to read them (wrong outputs; bench/apply/results/session27_h200/2_race_marks). ReadMark.captured
    # refuses any such mark as well
    g.stream.synchronize()
    torch.cuda.current_stream().synchronize()  # (where the script set its own stream)

    def run() -> Any:  # the copies, their mark, then the model
        for d, s_ in zip(tin, src):
            _h2d(d, s_, stream)
        if mark is not None:
            mark.record(torch, stream)
        return orig_call(module, *s_args, **s_kwargs)

    graph, out = _graph_of(torch, stream, run)
    tg = _ThreadGraph(module, graph, list(src), tin, template, _static_out(torch, out), tensors[0].get_device(),
                      moves, lines)
    tg.tag = getattr(orig_call, "key_tag", None)
    tg.lent = lend(torch, tg.static_out)
    if mark is not None:
        mark.captured()
        tg.mark = mark
    return tg


def _thread_replay(tg: _ThreadGraph) -> Any:
    tg.graph.replay()
    tg.replays += 1
    _state["thread_replays"] += 1
    lent = tg.lent
    if lent is not None and lent.usable():
        _state["outputs_lent"] += 1
        return lent.handout()
    return _clone_out(tg.static_out)
