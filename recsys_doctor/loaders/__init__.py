"""Loaders: turn a trace file into the canonical :class:`~recsys_doctor.model.Trace`.
Imports options, model, errors, _util only.

The format is detected from the file's content, never from its extension alone:

* ``SQLite format 3`` header -> Nsight Systems SQLite export (:mod:`.nsys`);
* gzip magic ``1f 8b`` -> decompressed and detected again (``.sqlite.gz``, ``.json.gz``);
* first non-blank byte ``{`` or ``[`` -> PyTorch profiler / Kineto JSON (:mod:`.kineto`);
* an Nsight Systems report (``.nsys-rep``/``.qdrep``) -> exported to SQLite with ``nsys
  export`` first (:mod:`.nsysrep`).
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadInputError, TraceFormatError
from .._util.progress import ProgressHandle

if TYPE_CHECKING:  # the model (pandas) is imported by the loader that builds it
    from ..model import Trace

__all__ = ["load", "detect_format"]

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


def _check_path(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such file")
    if p.is_dir():
        raise BadInputError(f"{p}: is a directory, expected a trace file (.nsys-rep, .sqlite, .json[.gz])")
    if not os.access(p, os.R_OK):
        raise BadInputError(f"{p}: permission denied")
    if p.stat().st_size == 0:
        raise TraceFormatError(f"{p}: empty file, not a trace")
    return p


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return ``nsys-sqlite``, ``kineto-json``, ``nsys-rep`` or raise :class:`TraceFormatError`.
    Gzip-compressed files report the format of their content."""
    p = _check_path(path)
    with open(p, "rb") as f:
        head = f.read(64)
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(p, "rb") as g:
                head = g.read(64)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceFormatError(f"{p}: corrupt gzip file ({e})") from None
    if head.startswith(SQLITE_MAGIC):
        return "nsys-sqlite"
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if stripped[:1] in (b"{", b"["):
        return "kineto-json"
    if p.suffix in (".nsys-rep", ".qdrep", ".qdstrm") or _looks_like_nsys_rep(head):
        return "nsys-rep"
    raise TraceFormatError(
        f"{p}: not a trace recsys-doctor can read (expected an Nsight Systems report or SQLite "
        "export, or a PyTorch profiler JSON trace)"
    )


def _looks_like_nsys_rep(head: bytes) -> bool:
    # .nsys-rep files are binary containers; there is no public magic number, so we
    # accept them by extension (above) and otherwise refuse rather than guess.
    return False


def load(path: str | os.PathLike[str], *, progress: "bool | ProgressHandle" = False) -> Trace:
    """Load any supported trace file into the canonical model. ``progress``: a progress
    handle to advance while big tables are read (a bool is accepted and ignored)."""
    fmt = detect_format(path)
    handle = None if isinstance(progress, bool) else progress
    if fmt == "nsys-sqlite":
        from .nsys import load_nsys_sqlite

        return load_nsys_sqlite(path, progress=handle)
    if fmt == "kineto-json":
        from .kineto import load_kineto_json

        return load_kineto_json(path, progress=handle)
    from .nsysrep import load_nsys_rep

    return load_nsys_rep(path)
