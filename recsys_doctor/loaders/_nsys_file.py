"""The file side of the nsys loader: gzip, the SQLite header, one-line error messages."""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from .._util.files import gunzip_into, private_temp
from ..errors import TraceFormatError

__all__ = ["SQLITE_MAGIC", "GZIP_MAGIC", "gunzipped", "check_header", "one_line"]

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


@contextlib.contextmanager
def gunzipped(p: Path) -> Iterator[Path]:
    """Decompress ``p`` to a private temporary file (deleted afterwards, also on Ctrl-C and
    SIGTERM), within the decompressed-size limit (:func:`~recsys_doctor._util.files.max_decompressed`).
    The whole trace is read into DataFrames while the file exists, so nothing needs caching."""
    with private_temp(".sqlite") as (fd, name), os.fdopen(fd, "wb") as out, open(p, "rb") as src:
        gunzip_into(src, out, p)
        out.close()
        yield Path(name)


def check_header(p: Path, shown: Path) -> None:
    """Catch non-SQLite and truncated files before SQLite does, with a clearer message.

    The header stores the database size in pages (offset 28) and is trustworthy when the
    "version-valid-for" number (offset 92) equals the change counter (offset 24); a file
    shorter than that size was cut off (a partial copy or download)."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        hdr = f.read(100)
    if not hdr.startswith(SQLITE_MAGIC):
        raise TraceFormatError(f"{shown}: not an SQLite database (expected an Nsight Systems .sqlite export)")
    if len(hdr) < 100:
        raise TraceFormatError(f"{shown}: truncated SQLite file ({size} bytes, shorter than the 100-byte header)")
    page_size = struct.unpack(">H", hdr[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    (change,) = struct.unpack(">I", hdr[24:28])
    (n_pages,) = struct.unpack(">I", hdr[28:32])
    (valid_for,) = struct.unpack(">I", hdr[92:96])
    if page_size < 512 or page_size & (page_size - 1):
        raise TraceFormatError(f"{shown}: corrupt SQLite file (invalid page size {page_size} in header)")
    if n_pages and change == valid_for and size < n_pages * page_size:
        raise TraceFormatError(
            f"{shown}: truncated SQLite file ({size} bytes, the header says {n_pages * page_size}); "
            "copy or export it again"
        )


def one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__
