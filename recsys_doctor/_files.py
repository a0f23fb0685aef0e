"""File helpers shared by the loaders, capture, advise and the history."""

from __future__ import annotations

import hashlib
import os

__all__ = ["file_sha256"]


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's content, read in blocks (:func:`hashlib.file_digest`):
    what identifies a trace in the history and keys the ``.nsys-rep`` export cache.
    ``OSError`` propagates: each caller decides whether an unreadable file is an error."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
