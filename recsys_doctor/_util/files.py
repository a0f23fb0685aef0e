"""File helpers shared by the loaders, capture, advise and the history."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import signal
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import IO

from ..errors import TraceFormatError

__all__ = ["file_sha256", "file_sha256_started", "used_size", "max_decompressed", "gunzip_into", "gunzip_bytes",
           "private_temp", "DEFAULT_MAX_DECOMPRESSED"]

#: the most bytes a compressed trace (``.json.gz``, ``.sqlite.gz``) may decompress to: far
#: beyond any real trace, short of filling a disk or the memory with a gzip bomb. Raise it
#: with the environment variable ``RECSYS_DOCTOR_MAX_DECOMPRESSED`` (bytes, or with a K,
#: M, G or T suffix: ``RECSYS_DOCTOR_MAX_DECOMPRESSED=200G``)
DEFAULT_MAX_DECOMPRESSED = 32 << 30
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SQLITE_MAGIC = b"SQLite format 3\x00"

#: block size of the background hash: large, so that the thread needs the GIL only a few
#: times per file (reading and hashing a block both run without it)
_BLOCK = 16 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's content, read in blocks, up to :func:`used_size`: what
    identifies a trace in the history and keys the ``.nsys-rep`` export cache.
    ``OSError`` propagates: each caller decides whether an unreadable file is an error."""
    with open(path, "rb", buffering=0) as f:
        return _digest(f, used_size(path))


def _digest(f: io.RawIOBase, size: int) -> str:
    h = hashlib.sha256()
    buf = bytearray(max(1, min(_BLOCK, size)))
    view = memoryview(buf)
    left = size
    while left > 0 and (n := f.readinto(view[:min(len(buf), left)])):
        h.update(view[:n])
        left -= n
    return h.hexdigest()


def used_size(path: str | os.PathLike[str]) -> int:
    """The bytes of the file a reader uses: all of it, but for an SQLite database whose
    header gives its size (valid when the change counter matches), which SQLite reads no
    further than (a file padded to 10 GiB, sparse or not, is hashed in its used part)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        hdr = f.read(100)
    if len(hdr) < 100 or not hdr.startswith(_SQLITE_MAGIC) or hdr[24:28] != hdr[92:96]:
        return size
    psz = int.from_bytes(hdr[16:18], "big")
    pages = int.from_bytes(hdr[28:32], "big") * (65536 if psz == 1 else psz)
    return min(size, pages) if pages else size


def max_decompressed() -> int:
    """:data:`DEFAULT_MAX_DECOMPRESSED`, or ``RECSYS_DOCTOR_MAX_DECOMPRESSED`` where set."""
    v = os.environ.get("RECSYS_DOCTOR_MAX_DECOMPRESSED", "").strip().upper().removesuffix("B")
    if not v:
        return DEFAULT_MAX_DECOMPRESSED
    try:
        return int(float(v[:-1]) * _UNITS[v[-1]]) if v[-1] in _UNITS else int(v)
    except ValueError:
        raise TraceFormatError(f"RECSYS_DOCTOR_MAX_DECOMPRESSED={v!r}: expected bytes, e.g. 64G") from None


def _too_large(shown: object, limit: int) -> TraceFormatError:
    return TraceFormatError(
        f"{shown}: decompresses to more than {limit / (1 << 30):g} GiB; if it really is a trace that "
        "large, raise the limit with RECSYS_DOCTOR_MAX_DECOMPRESSED (e.g. 100G)")


def gunzip_into(src: IO[bytes], out: IO[bytes], shown: object) -> int:
    """Decompress the gzip stream ``src`` into ``out``, at most :func:`max_decompressed`
    bytes (else :class:`TraceFormatError`, naming ``shown``); the bytes written."""
    limit, total = max_decompressed(), 0
    try:
        with gzip.GzipFile(fileobj=src, mode="rb") as g:
            while chunk := g.read(1 << 20):
                total += len(chunk)
                if total > limit:
                    raise _too_large(shown, limit)
                out.write(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(f"{shown}: corrupt gzip file ({e or type(e).__name__})") from None
    return total


def gunzip_bytes(raw: bytes, shown: object) -> bytes:
    """``raw`` (gzip, one member or several) decompressed in memory, within
    :func:`max_decompressed` (zlib's output bound: nothing beyond it is made)."""
    limit, total, parts = max_decompressed(), 0, []
    data = raw
    try:
        while data[:2] == b"\x1f\x8b":
            d = zlib.decompressobj(31)
            out = d.decompress(data, limit - total + 1)
            total += len(out)
            if total > limit:
                raise _too_large(shown, limit)
            if not d.eof:
                raise TraceFormatError(f"{shown}: corrupt gzip file (truncated)")
            parts.append(out)
            data = d.unused_data
    except zlib.error as e:
        raise TraceFormatError(f"{shown}: corrupt gzip file ({e})") from None
    except MemoryError:
        raise TraceFormatError(f"{shown}: decompressing it needs more memory than is free "
                               f"({total / (1 << 30):.1f} GiB decompressed before)") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def private_temp(suffix: str) -> Iterator[tuple[int, str]]:
    """A private temporary file ``(fd, path)``, removed on every way out: an error, Ctrl-C
    (``KeyboardInterrupt``), and SIGTERM/SIGHUP, which exit through Python (SystemExit)
    while the file exists (where this runs in the main thread: signals go there)."""
    fd, name = tempfile.mkstemp(prefix="recsys-doctor-", suffix=suffix)
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
                saved[sig] = signal.signal(sig, _terminate)
    try:
        yield fd, name
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
        for sig, old in saved.items():
            signal.signal(sig, old)


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
            with open(path, "rb", buffering=0) as f:
                out["hex"] = _digest(f, used_size(path))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
            out["error"] = e

    t = threading.Thread(target=run, name="recsys-doctor-sha256", daemon=True)
    t.start()

    def result() -> str:
        t.join()
        if "error" in out:
            raise out["error"]  # type: ignore[misc]
        return out["hex"]  # type: ignore[return-value]

    return result
