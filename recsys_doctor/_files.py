"""File helpers shared by the loaders, capture, advise and the history."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["file_sha256", "file_sha256_started"]

#: block size of the background hash: large, so that the thread needs the GIL only a few
#: times per file (reading and hashing a block both run without it)
_BLOCK = 16 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's content, read in blocks (:func:`hashlib.file_digest`):
    what identifies a trace in the history and keys the ``.nsys-rep`` export cache.
    ``OSError`` propagates: each caller decides whether an unreadable file is an error."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_sha256_started(path: str | os.PathLike[str], *, idle: bool = False) -> Callable[[], str]:
    """Start :func:`file_sha256` of ``path`` on a background thread; the function returned
    waits for it and gives the hex digest (or raises its ``OSError``).

    Reading a block and hashing it both release the GIL, so the hash runs on another
    core while the caller goes on. ``idle`` (Linux): the thread runs at the lowest
    priority (nice 19), on CPU time nothing else of ours wants: ``advise`` starts it
    before loading the trace, and it fills the moments when only one core is busy."""
    out: dict[str, object] = {}

    def run() -> None:
        if idle and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):  # this thread only (a Linux thread id)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            h = hashlib.sha256()
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                buf = bytearray(max(1, min(_BLOCK, size)))
                view = memoryview(buf)
                while n := f.readinto(buf):
                    h.update(view[:n])
            out["hex"] = h.hexdigest()
        except BaseException as e:  # handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, name="recsys-doctor-sha256", daemon=True)
    t.start()

    def result() -> str:
        t.join()
        if "error" in out:
            raise out["error"]  # type: ignore[misc]
        return out["hex"]  # type: ignore[return-value]

    return result
