"""Which code region issued a CPU call: the innermost enclosing range on the same thread.

Every finding's ``where`` needs "which NVTX range / ``record_function`` annotation was
open on the launching thread when this call started". Done per event with Python loops
this is O(events x ranges); here it is vectorized:

1. ranges of each thread are sorted by (start, -end); the nesting depth of a range is the
   number of ranges that opened before it on the thread minus those already closed;
2. each range's parent is the nearest earlier range on the thread one level up;
3. an event's candidate is the latest range on its thread that started at or before it
   (``searchsorted``); while the candidate does not contain the event, step to the
   candidate's parent (at most max-depth numpy steps over the unresolved events).

Ranges that do not nest properly (NVTX start/end ranges may overlap arbitrarily) never
produce a wrong attribution (containment is always checked); at worst an event whose
innermost range cannot be reached by parent steps is attributed to nothing.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..model import Trace
from ._util import group_codes, norm_name, per_value

__all__ = ["enclosing_range", "attribute", "any_region", "where_shares", "ANNOTATION_SOURCES"]

#: sources counted as "code regions" (everything except individual aten ops)
ANNOTATION_SOURCES = ("nvtx", "nvtx_pushpop", "nvtx_startend", "user_annotation")


def _select_ranges(trace: Trace, sources: Iterable[str] | None, exclude: Iterable[str] = ()) -> pd.DataFrame:
    r = trace.ranges
    if len(r) == 0:
        return r
    src = r["source"].astype(object)
    if sources is None:
        m = ~src.isin(list(exclude)) if exclude else pd.Series(True, index=r.index)
    else:
        m = src.isin(list(sources))
    return r[m]


def enclosing_range(ranges: pd.DataFrame, pid: Any, tid: Any, t: Any) -> np.ndarray:
    """For each event ``(pid[i], tid[i], t[i])``, the positional index into ``ranges`` of
    the innermost range on the same thread with ``start <= t < end``, or -1."""
    pid = np.asarray(pid, dtype=np.int64)
    tid = np.asarray(tid, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    out = np.full(t.shape, -1, dtype=np.int64)
    if len(ranges) == 0 or t.size == 0:
        return out
    rp = ranges["pid"].to_numpy(np.int64)
    rs = ranges["start"].to_numpy(np.int64)
    re_ = ranges["end"].to_numpy(np.int64)
    # one integer code per thread, shared by ranges and events
    codes = group_codes(np.concatenate([rp, pid]), np.concatenate([ranges["tid"].to_numpy(np.int64), tid]))[0]
    rc, ec = codes[: rp.size], codes[rp.size:]
    order = np.lexsort((-re_, rs, rc))  # by thread, start, longest first
    sc, ss, se = rc[order], rs[order], re_[order]
    bounds = np.flatnonzero(np.diff(sc)) + 1  # group boundaries per thread in the sorted order
    gstart = np.concatenate(([0], bounds))
    gend = np.concatenate((bounds, [order.size]))
    depth, parent = _nesting(ss, se, gstart, gend)
    cand = _latest_started(sc, ss, gstart, gend, ec, t)
    # climb to the first ancestor that contains t
    todo = np.flatnonzero(cand >= 0)
    for _ in range(int(depth.max()) + 2 if order.size else 0):
        if todo.size == 0:
            break
        c = cand[todo]
        inside = (ss[c] <= t[todo]) & (t[todo] < se[c])
        done = todo[inside]
        out[done] = order[cand[done]]
        rest = todo[~inside]
        cand[rest] = parent[cand[rest]]
        todo = rest[cand[rest] >= 0]
    return out


def _nesting(ss: np.ndarray, se: np.ndarray, gstart: np.ndarray, gend: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth of each range (ranges sorted by thread, start, longest first) and its parent:
    the nearest earlier range of its thread one level up (-1 for none)."""
    n = ss.size
    depth = np.empty(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    for a, b in zip(gstart, gend):
        closed = np.searchsorted(np.sort(se[a:b]), ss[a:b], side="right")
        d = np.arange(b - a) - closed
        depth[a:b] = d
        for lvl in range(1, int(d.max()) + 1 if d.size else 0):
            kids = np.flatnonzero(d == lvl)
            ups = np.flatnonzero(d == lvl - 1)
            if kids.size == 0 or ups.size == 0:
                continue
            j = np.searchsorted(ups, kids, side="left") - 1
            ok = j >= 0
            parent[a + kids[ok]] = a + ups[j[ok]]
    return depth, parent


def _latest_started(sc: np.ndarray, ss: np.ndarray, gstart: np.ndarray, gend: np.ndarray, ec: np.ndarray,
                    t: np.ndarray) -> np.ndarray:
    """For each event, the latest range on its thread that started at or before it (-1)."""
    thread_of = {int(sc[a]): (a, b) for a, b in zip(gstart, gend)}
    cand = np.full(t.size, -1, dtype=np.int64)
    for code in np.unique(ec):
        ab = thread_of.get(int(code))
        if ab is None:
            continue
        a, b = ab
        ev = np.flatnonzero(ec == code)
        j = np.searchsorted(ss[a:b], t[ev], side="right") - 1
        ok = j >= 0
        cand[ev[ok]] = a + j[ok]
    return cand


def attribute(trace: Trace, pid: Any, tid: Any, t: Any, *, sources: Iterable[str] | None = None,
              cpu_ops: bool = False) -> np.ndarray:
    """Name of the innermost code region (object array; ``None`` where there is none).

    ``sources=None`` means every range source except aten ``cpu_op`` rows (NVTX and
    ``user_annotation`` / ``record_function``); ``cpu_ops=True`` attributes to the
    innermost aten op instead. Per-iteration names are grouped (``ProfilerStep#*``).
    """
    if cpu_ops:
        rng = _select_ranges(trace, ("cpu_op",))
    else:
        rng = _select_ranges(trace, sources, exclude=("cpu_op",))
    n = np.asarray(t).size
    res = np.empty(n, dtype=object)
    res[:] = None
    if len(rng) == 0 or n == 0:
        return res
    idx = enclosing_range(rng, pid, tid, t)
    ok = idx >= 0
    res[ok] = per_value(rng["name"], norm_name, idx[ok])
    return res


def any_region(reg: np.ndarray) -> bool:
    """Whether :func:`attribute` named a region for any event."""
    return bool(len(reg)) and bool(pd.notna(reg).any())


def where_shares(labels: Any, weights: Any = None, *, key: str, top: int = 5,
                 extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``where`` entries: the ``top`` labels by total weight with their share of the whole.
    Missing labels (``None``) are dropped from the list but count in the total. ``labels``
    may also be (code of each row, label of each code), as ``thread_label_codes`` gives."""
    if isinstance(labels, tuple):  # (code of each row, label of each code)
        codes, uniq = labels
        n = len(codes)
    else:
        lab = np.asarray(labels, dtype=object)
        n = len(lab)
    raw = None if weights is None else np.asarray(weights)
    w = pd.Series(np.ones(n) if raw is None else raw.astype(float))
    total = float(w.sum())
    if total <= 0 or n == 0:
        return []
    # group on integer codes (a label per distinct value, not per row), then order the
    # groups by label as a groupby on the labels would, before ranking them
    if not isinstance(labels, tuple):
        codes, uniq = pd.factorize(lab)
    codes = np.asarray(codes)
    ok = codes >= 0
    wv = w.to_numpy()
    if raw is None or (raw.dtype.kind in "iub" and float(np.abs(wv).sum()) < 2.0**53):
        # counts, or integer weights whose every partial sum is exact in a float64: a
        # bincount gives the groupby's sums exactly, in one pass
        c = codes[ok]
        count = np.bincount(c, minlength=len(uniq))
        sums = count.astype(float) if raw is None else np.bincount(c, weights=wv[ok], minlength=len(uniq))
        present = np.flatnonzero(count)
        g = pd.Series(sums[present], index=pd.Index(uniq, dtype=object)[present])
    else:
        g = w[ok].groupby(codes[ok]).sum()
        g.index = pd.Index(uniq, dtype=object)[g.index.to_numpy()]
    g = g.sort_index().sort_values(ascending=False)
    out = []
    for name, v in g.head(top).items():
        d = {key: name, "share": round(float(v) / total, 4)}
        if extra:
            d.update(extra)
        out.append(d)
    return out
