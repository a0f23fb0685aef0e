"""A progress bar for long loads and analyses that stays out of the way.

On an interactive terminal a rich progress bar (with elapsed time) is shown on stderr;
when stderr is not a TTY (piped, redirected, under pytest) or the environment variable
``CI`` is set, nothing is printed at all, so logs and ``--json`` output stay clean.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = ["progress", "ProgressHandle", "progress_enabled", "pause_live_displays"]

#: the rich progress bars on screen now: :func:`pause_live_displays` stops their refresh
#: threads around a fork
_LIVE: list[Any] = []


class ProgressHandle(Protocol):
    def advance(self, n: float = 1) -> None: ...
    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None: ...


class _Quiet:
    """The do-nothing handle used when no bar is shown."""

    def advance(self, n: float = 1) -> None:
        pass

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        pass


class _RichHandle:
    def __init__(self, prog: "object", task: int) -> None:
        self._p = prog
        self._t = task

    def advance(self, n: float = 1) -> None:
        self._p.advance(self._t, n)  # type: ignore[attr-defined]

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        kw: dict[str, object] = {}
        if completed is not None:
            kw["completed"] = completed
        if total is not None:
            kw["total"] = total
        if description is not None:
            kw["description"] = description
        self._p.update(self._t, **kw)  # type: ignore[attr-defined]


def progress_enabled(stream: object | None = None) -> bool:
    """True when a bar should be drawn: stderr is a terminal and ``CI`` is not set."""
    if os.environ.get("CI"):
        return False
    s: Any = stream if stream is not None else sys.stderr  # any file-like: isatty() checked here
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress(description: str, total: float | None = None, *, enabled: bool | None = None) -> Iterator[ProgressHandle]:
    """Show a transient progress bar while the ``with`` block runs.

    ``total=None`` draws an indeterminate (pulsing) bar; call ``handle.advance(n)`` or
    ``handle.update(completed=..., total=...)`` to move it. ``enabled`` overrides the
    TTY/CI detection (``None`` = detect). The bar disappears when the block exits.
    """
    if enabled is None:
        enabled = progress_enabled()
    if not enabled:
        yield _Quiet()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    cols = [SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
            TextColumn("[progress.percentage]{task.percentage:>3.0f}%") if total else TextColumn(""),
            TimeElapsedColumn()]
    with Progress(*cols, console=Console(stderr=True), transient=True) as p:
        task = p.add_task(description, total=total)
        _LIVE.append(p)
        try:
            yield _RichHandle(p, task)
        finally:
            _LIVE.remove(p)


def pause_live_displays() -> Callable[[], None]:
    """Stop every bar's refresh thread (and wait for it to end); return what starts them
    again. :func:`recsys_doctor._util.fork.fork` calls this first: a thread that holds the
    console's or a stream's lock at the fork leaves that lock held for ever in the child,
    which would hang there on its first write to stderr."""
    paused = [p for p in _LIVE if p.live.is_started]
    for p in paused:
        thread = getattr(p.live, "_refresh_thread", None)  # (rich's Live drops it in stop())
        p.stop()
        if thread is not None:
            thread.join()

    def resume() -> None:
        for p in paused:
            if p in _LIVE:
                p.start()

    return resume
