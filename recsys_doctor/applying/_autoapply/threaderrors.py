"""Exceptions that end a thread of the script while the hook is active, in ``stats()``.

A worker thread that raises under a plan loses the requests it held, and the script may fail
much later with an error that says nothing of it (a server that reads its results by request
id exits with ``KeyError: 2`` when the worker that took request 2 died).
``threading.excepthook`` is wrapped while the hook is active: each such exception is counted,
the first :data:`MAX_KEPT` are kept with the thread's name, the exception's first line and the
script's line it was raised from (``stats()["thread_errors"]``), one line goes to stderr, and
the original hook runs as before (Python's default prints the traceback). ``profile --apply``
does not keep a plan under which a thread raised where none did as it is
(:func:`recsys_doctor.applying.script_hook.fail_on_thread_errors`). Standard library only."""

from __future__ import annotations

import os
import threading
from typing import Any

from ._common import _first_line, _log, _state
from .fallback import _raised_at

__all__ = ["MAX_KEPT", "install", "uninstall", "record"]

#: thread exceptions kept with their details (all are counted)
MAX_KEPT = 8
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _in_hook(ex: BaseException) -> bool:
    """Whether a frame of ``ex``'s traceback is the hook's own code."""
    tb = ex.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_HERE):
            return True
        tb = tb.tb_next
    return False


def record(name: str, ex: BaseException) -> None:
    """Count ``ex``, which ended thread ``name``; keep it among the first :data:`MAX_KEPT`; say it."""
    kept: list[dict[str, Any]] = _state.setdefault("thread_errors", [])
    _state["thread_error_count"] = _state.get("thread_error_count", 0) + 1
    at = _raised_at(ex)
    if len(kept) < MAX_KEPT:
        kept.append({"thread": name, "error": _first_line(ex), "at": at, "in_hook": _in_hook(ex)})
    _log(f"thread {name} raised {_first_line(ex)}" + (f" (at {at})" if at else ""))


def install() -> None:
    """Wrap ``threading.excepthook`` (once; :func:`uninstall` restores it)."""
    orig = threading.excepthook
    if getattr(orig, "rd_thread_errors", False):
        return

    def excepthook(args: Any) -> None:
        try:
            if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
                record(args.thread.name if args.thread is not None else "?", args.exc_value)
        except Exception:  # noqa: BLE001 - the record is best effort: the script's own hook runs regardless
            pass
        orig(args)

    excepthook.rd_thread_errors = True  # type: ignore[attr-defined]
    excepthook.__wrapped__ = orig  # type: ignore[attr-defined]
    threading.excepthook = excepthook


def uninstall() -> None:
    """Put back the ``threading.excepthook`` :func:`install` wrapped, where it is still ours."""
    cur = threading.excepthook
    if getattr(cur, "rd_thread_errors", False):
        threading.excepthook = cur.__wrapped__  # type: ignore[attr-defined]
