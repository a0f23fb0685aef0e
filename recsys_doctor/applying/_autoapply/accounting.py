"""Accounting per call site: for each line of the script that made a call the hook handles (a
model call, a host-to-device copy, a read back), how many calls were taken over and how many were
left to PyTorch, and why; ``stats()["sites"]``. Standard library only (loaded at interpreter start)."""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import Any, Iterable

from ._common import _state, _tls

_sites_lock = threading.Lock()
#: file name -> whether frames of that file are ours or PyTorch's (skipped when finding the script's line)
_skip_cache: dict[str, bool] = {}
_shown: dict[str, str] = {}
#: (code, line) of a script's calling frame -> its ``file:line``
_line_cache: dict[tuple[Any, int], str] = {}
#: (code, instruction offset) of a script's calling frame -> its ``file:line``: the same sites as
#: ``_line_cache``, found without the frame's line number (``f_lineno`` walks the code's line table
#: at every read, ~0.4 us deep in a long function; ``f_lasti`` is one field)
_at_cache: dict[tuple[Any, int], str] = {}


def _skip_prefixes() -> tuple[str, ...]:
    """The folders whose frames are not the script's: the hook's, recsys_doctor/, PyTorch's, and
    the runtime's once it is imported (an editable install keeps it beside recsys_doctor/, not in
    it; its frames only run once it is, so the prefixes are made again then)."""
    pre = _state.get("skip_prefixes")
    rt = sys.modules.get("recsys_doctor.runtime")
    if pre is None or (rt is not None and not _state.get("skip_runtime")):
        here = os.path.dirname(os.path.abspath(__file__))
        dirs = [here, os.path.dirname(os.path.dirname(here))]  # the hook; recsys_doctor/ (plan.py)
        for mod in (sys.modules.get("torch"), rt):
            f = getattr(mod, "__file__", None)
            if f:
                dirs.append(os.path.dirname(os.path.abspath(f)))
        _state["skip_runtime"] = rt is not None
        pre = _state["skip_prefixes"] = tuple(d + os.sep for d in dirs)
    return pre  # type: ignore[no-any-return]


def _skipped(filename: str) -> bool:
    s = _skip_cache.get(filename)
    if s is None:
        s = _skip_cache[filename] = os.path.abspath(filename).startswith(_skip_prefixes())
    return s


def _display(filename: str) -> str:
    d = _shown.get(filename)
    if d is None:
        path = os.path.abspath(filename)
        try:
            rel = os.path.relpath(path)
        except ValueError:  # another drive (Windows)
            rel = path
        d = _shown[filename] = rel if not rel.startswith("..") else path
    return d


def script_site(depth: int = 2) -> str:
    """``file:line`` of the script's frame that made the current call: the first frame, from
    ``depth`` frames up, that is neither PyTorch's nor the hook's (``"?"`` if none is). Cached
    per script call site (code and instruction, ``_at_cache``; the line number read the first time
    only): where the frame ``depth`` up is the script's own (a copy's caller) no walk is made; where
    it is the hook's (a model call, entered through the hook's ``Module.__call__``) the walk up to
    the script's frame is, but not the line number's lookup nor the formatting."""
    try:
        f: Any = sys._getframe(depth)
    except ValueError:
        return "?"
    site = _at_cache.get((f.f_code, f.f_lasti))
    if site is not None:
        return site
    while f is not None and _skipped(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "?"
    at = (f.f_code, f.f_lasti)  # (a script frame's: never a skipped frame's code)
    site = _at_cache.get(at)
    if site is None:
        key = (f.f_code, f.f_lineno)
        site = _line_cache.get(key)
        if site is None:
            site = _line_cache[key] = f"{_display(f.f_code.co_filename)}:{f.f_lineno}"
        _at_cache[at] = site
    return site


def _table() -> dict[tuple[str, str], list[Any]]:
    """This thread's counters (no lock on the hot path; :func:`sites` adds every thread's up).
    A new activation (``_state["sites_gen"]``) starts new ones."""
    gen = _state.get("sites_gen", 0)
    t: dict[tuple[str, str], list[Any]] | None = getattr(_tls, "site_table", None)
    if t is None or getattr(_tls, "site_gen", None) != gen:
        t = _tls.site_table = {}
        _tls.site_gen = gen
        with _sites_lock:
            _state.setdefault("site_tables", []).append(t)
    return t


def counted_here(kind: str) -> bool:
    """Whether this thread counted a call of ``kind`` (taken over or not) in this activation."""
    t: dict[tuple[str, str], list[Any]] = getattr(_tls, "site_table", None) or {}
    return getattr(_tls, "site_gen", None) == _state.get("sites_gen", 0) and any(k == kind for k, _ in t)


def taken_over(kind: str, site: str, n: int = 1) -> None:
    """``n`` calls of ``kind`` (``"model"``, ``"h2d"``, ``"d2h"``) at ``site`` were taken over."""
    t = _table()
    c = t.get((kind, site))
    if c is None:
        c = t[(kind, site)] = [0, 0, {}]
    c[0] += n


def taken_over_here(kind: str, depth: int) -> None:
    """One call of ``kind`` taken over at the script's line from ``depth`` frames up (counted as
    :func:`script_site` counts them): :func:`taken_over` of :func:`script_site`, in one step where the calling line is the
    script's own and was counted by this thread in this activation before (its counter kept
    per thread, keyed by the calling frame's code and line: a steady query's copies count
    without a walk, a table lookup or a new key)."""
    try:
        f: Any = sys._getframe(depth)
    except ValueError:
        taken_over(kind, "?")
        return
    gen = _state.get("sites_gen", 0)
    mine: Any = getattr(_tls, "site_counters", None)
    if mine is None or mine[0] != gen:
        mine = _tls.site_counters = (gen, {})
    key = (f.f_code, f.f_lasti, kind)  # (the call's instruction: one line, read without the line table)
    c = mine[1].get(key)
    if c is not None:
        c[0] += 1
        return
    site = script_site(depth + 1)
    taken_over(kind, site)
    if _line_cache.get((f.f_code, f.f_lineno)) == site:  # (the line is the script's own: its counter is this line's)
        mine[1][key] = _table()[(kind, site)]


def fell_back(kind: str, site: str, reason: str, n: int = 1) -> None:
    """``n`` calls of ``kind`` at ``site`` were left to PyTorch (run eagerly), because of ``reason``."""
    t = _table()
    c = t.get((kind, site))
    if c is None:
        c = t[(kind, site)] = [0, 0, {}]
    c[1] += n
    c[2][reason] = c[2].get(reason, 0) + n


def batched(sites: list[str]) -> None:
    """One batch ran the calls made at ``sites`` (one entry a call): each site's calls count as
    batched, and the batch once in each of its sites' histograms (calls by batch size)."""
    t = _table()
    n = len(sites)
    for site in set(sites):
        c = t.get(("model", site))
        if c is None:
            c = t[("model", site)] = [0, 0, {}]
        if len(c) == 3:
            c.extend((0, {}))
        c[3] += sites.count(site)
        c[4][n] = c[4].get(n, 0) + 1
    with _sites_lock:
        sizes = _state.setdefault("batch_sizes", {})
        sizes[n] = sizes.get(n, 0) + 1


#: the generations :func:`reset` hands out, never one twice (a thread's table of an older one
#: is never taken for the new one's, even where the state dict was put back to an older copy)
_GENERATIONS = itertools.count(1)


def reset() -> None:
    """Forget every count (a new activation)."""
    with _sites_lock:
        _state["sites_gen"] = next(_GENERATIONS)
        _state["site_tables"] = []
        _state["batch_sizes"] = {}


def sites() -> list[dict[str, Any]]:
    """Every call site seen, by all threads together, most calls first: kind, site,
    taken_over, fallback, reasons; for model calls also ``batched`` (calls run in a batch, by
    the plan's batching: :mod:`.batching`) and ``batch_sizes`` (batch size -> batches that ran
    calls of the site)."""
    with _sites_lock:
        tables = list(_state.get("site_tables", []))
    return merge_sites({"kind": kind, "site": site, "taken_over": c[0], "fallback": c[1], "reasons": c[2],
                        **({"batched": c[3], "batch_sizes": c[4]} if len(c) > 3 else {})}
                       for t in tables for (kind, site), c in list(t.items()))


def merge_sites(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of :func:`sites` (one per thread's table, or per process: the stats files that
    :func:`~recsys_doctor.applying.script_hook.read_hook_stats` merges) added up per (kind,
    site), in new dicts, most calls first."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for s in rows:
        kind, site = s["kind"], s["site"]
        m = merged.get((kind, site))
        if m is None:
            m = merged[(kind, site)] = {"kind": kind, "site": site, "taken_over": 0, "fallback": 0, "reasons": {}}
            if kind == "model":
                m.update(batched=0, batch_sizes={})
        m["taken_over"] += s["taken_over"]
        m["fallback"] += s["fallback"]
        for r, k in list(s["reasons"].items()):
            m["reasons"][r] = m["reasons"].get(r, 0) + k
        if "batched" in s:
            m["batched"] = m.get("batched", 0) + s["batched"]
            bs = m.setdefault("batch_sizes", {})
            for size, k in list(s["batch_sizes"].items()):
                bs[size] = bs.get(size, 0) + k
    rows_out = list(merged.values())
    rows_out.sort(key=lambda s: (-(s["taken_over"] + s["fallback"]), s["kind"], s["site"]))
    return rows_out
