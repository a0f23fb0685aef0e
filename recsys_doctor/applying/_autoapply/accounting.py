"""Accounting per call site: for each line of the script that made a call the hook handles (a
model call, a host-to-device copy, a read back), how many calls were taken over and how many were
left to PyTorch, and why; ``stats()["sites"]``. Standard library only (loaded at interpreter start)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ._common import _state

_sites_lock = threading.Lock()
#: file name -> whether frames of that file are ours or PyTorch's (skipped when finding the script's line)
_skip_cache: dict[str, bool] = {}
_shown: dict[str, str] = {}


def _skip_prefixes() -> tuple[str, ...]:
    pre = _state.get("skip_prefixes")
    if pre is None:
        here = os.path.dirname(os.path.abspath(__file__))
        dirs = [here, os.path.dirname(os.path.dirname(here))]  # the hook; recsys_doctor/ (plan.py, runtime)
        tfile = getattr(sys.modules.get("torch"), "__file__", None)
        if tfile:
            dirs.append(os.path.dirname(os.path.abspath(tfile)))
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
    ``depth`` frames up, that is neither PyTorch's nor the hook's (``"?"`` if none is)."""
    try:
        f: Any = sys._getframe(depth)
    except ValueError:
        return "?"
    while f is not None and _skipped(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "?"
    return f"{_display(f.f_code.co_filename)}:{f.f_lineno}"


def _site(kind: str, site: str) -> dict[str, Any]:
    sites: dict[tuple[str, str], dict[str, Any]] = _state.setdefault("sites", {})
    s = sites.get((kind, site))
    if s is None:
        s = sites[(kind, site)] = {"kind": kind, "site": site, "taken_over": 0, "fallback": 0, "reasons": {}}
    return s


def taken_over(kind: str, site: str, n: int = 1) -> None:
    """``n`` calls of ``kind`` (``"model"``, ``"h2d"``, ``"d2h"``) at ``site`` were taken over."""
    with _sites_lock:
        _site(kind, site)["taken_over"] += n


def fell_back(kind: str, site: str, reason: str, n: int = 1) -> None:
    """``n`` calls of ``kind`` at ``site`` were left to PyTorch (run eagerly), because of ``reason``."""
    with _sites_lock:
        s = _site(kind, site)
        s["fallback"] += n
        s["reasons"][reason] = s["reasons"].get(reason, 0) + n


def sites() -> list[dict[str, Any]]:
    """Every call site seen, most calls first: kind, site, taken_over, fallback, reasons."""
    with _sites_lock:
        rows = [dict(s, reasons=dict(s["reasons"])) for s in _state.get("sites", {}).values()]
    rows.sort(key=lambda s: (-(s["taken_over"] + s["fallback"]), s["kind"], s["site"]))
    return rows
