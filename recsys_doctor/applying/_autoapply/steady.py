"""A thread graph's copies in their steady state, in one function: the script's query makes the same
copies as when the thread graph was learned, and each one only hands out the view of the thread's
device buffer that the graph's replay fills (:mod:`.staging`). One query makes dozens of copies (the
plain script 28), so each function call and check saved here is GIL time saved a copy
(``bench/apply/cpu_hook_path.py`` measures it on the CPU: 28 copies a query, 72 -> 63-65 us of the
hook's Python for pinned tensors, 182-190 -> 158-162 us for numpy arrays with the script's own
``torch.from_numpy``, on the 2-CPU dev box). Whatever is not that steady state - a view the script kept, a query
routed to the runtime's batching, a copy not learned - is left to the general path of
:func:`.staging._copy_method`, which checks it all again."""

from __future__ import annotations

import sys
from typing import Any

from ._common import _state, _tls
from .accounting import taken_over_here
from .pageable import called_again
from .pageable_fast import same_copy


def same_source(tg: Any, i: int, src: Any) -> bool:
    """Whether ``src`` is the source of copy ``i`` of thread graph ``tg`` as it was learned: the same
    tensor, on the same memory, of the same shape and dtype, contiguous."""
    return (src is tg.src[i] and src.data_ptr() == tg.src_ptr[i] and src.shape == tg.src_shape[i]
            and src.dtype is tg.tin[i].dtype and src.is_contiguous())


def counted_fast(depth: int) -> None:
    """A pageable copy :func:`.pageable_fast.same_copy` wrote into its slot: counted, and taken over
    at the script's line ``depth`` frames above the caller."""
    _state["pageable_fast"] += 1
    taken_over_here("h2d", depth + 1)  # (+1: this function's frame)


def steady_copy(torch: Any, orig: Any, src: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``src.<orig>(*args, **kwargs)`` by a hooked thread, where it is the next copy its thread
    graph knows: the view the replay will fill (the last one handed out: the script dropped it),
    its copy deferred; else None, nothing done. Known are:

    * the pinned tensor the graph copies from, copied by the same call as when it was learned
      (:func:`.pageable.called_again`) and as it was then (memory, shape, dtype, contiguous);
    * a pageable copy learned into the thread's slot (:func:`.pageable_fast.same_copy`'s checks:
      the same call, dtype and shape, a plain source, the group's stream current): its bytes are
      written into the slot now (after the last replay that read the slots), counted as taken
      over at the script's line."""
    st = getattr(_tls, "copies", None)
    if st is None:
        return None
    tg = st.tg
    if tg is None or st.routed or _tls.depth:
        return None
    i = st.n
    if not 0 <= i < len(tg.src):
        return None
    view = tg.handed[i]
    # references: the list, this name, getrefcount's argument (one more: the script kept it)
    if view is None or sys.getrefcount(view) > 3:
        return None
    if src is tg.src[i]:
        if not (called_again(torch, tg.raw[i], orig, args, kwargs) and same_source(tg, i, src)):
            return None
    else:
        if st.reason is not None or same_copy(torch, st, tg, src, orig, args, kwargs, _state["stream_now"]) is None:
            return None
        counted_fast(3)  # (3: the script's frame, past this function and the hook's Tensor.to)
    st.n = i + 1
    st.pending = True
    return view
