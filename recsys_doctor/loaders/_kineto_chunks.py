"""The events array of a memory-mapped Kineto JSON cut into chunks of about ``STREAM_CHUNK``
bytes at event boundaries, each decoded and fed to a sink in file order; decoded pages are
released from memory as it goes (the streamed way in of :mod:`._kineto_decode`)."""

from __future__ import annotations

import contextlib
import mmap
import re
from typing import Any

import msgspec

from .._util.progress import ProgressHandle
from ._kineto_events import _DOC_DECODER, Sink, _no_events_in_array, _top, decode_events


#: bytes of JSON decoded at a time by the streamed path: the structs of one chunk (~3x its
#: size) are read by the column passes several times, so they should stay near the CPU's
#: cache (8 MB decodes the 445 MB tiled trace ~4% faster than 16 MB on a 8 MB L3)
STREAM_CHUNK = 8 << 20


def decode_streamed(mm: mmap.mmap, sink: Sink,
                    progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool] | None:
    """Find the events array in ``mm`` and feed it to ``sink`` chunk by chunk; ``(top,
    is_array)`` or None (unusual layout, invalid JSON)."""
    span = _events_span(mm)
    if span is None:
        return None
    arr_start, arr_end, top, is_array = span
    view = memoryview(mm)
    try:
        if not _feed(mm, view, arr_start, arr_end, sink, check_first=is_array,
                     progress=progress, total=(arr_start, arr_end)):
            return None
    finally:
        view.release()
    return top, is_array


def _feed(mm: mmap.mmap, view: memoryview, start: int, end: int, sink: Sink, *, check_first: bool,
          progress: ProgressHandle | None, total: tuple[int, int]) -> bool:
    """Feed the events between ``start`` (a ``[`` or the byte before the first event) and
    ``end`` (the ``]`` or the byte after the last event) to ``sink``; False when a chunk
    does not decode. The bar shows the bytes decoded as a share of ``total`` (the whole
    array's span), scaled when this is only its first part."""
    lo, hi = total
    part = (start, end) != total
    for i, (evs, done) in enumerate(_chunks(mm, view, start, end)):
        if evs is None or (check_first and i == 0 and _no_events_in_array(evs)):
            return False
        sink(evs)
        del evs
        if progress is not None:  # the bar moves with the bytes decoded
            completed = min(round((done - start) * (hi - lo) / (end - start)), hi - lo) if part else done - start
            progress.update(completed=completed, total=hi - lo)
    return True


def chunk_bounds(mm: mmap.mmap, arr_start: int, arr_end: int) -> list[tuple[int, int]]:
    """The array body cut into ``[start, stop)`` pieces of about :data:`STREAM_CHUNK`
    bytes (a quarter of that in the last tenth), each from an event's ``{`` to just after an event's ``}``: a cut is a ``},``
    followed by a newline and, after any blanks, the ``{`` of the next event (a nested
    object closed by ``},`` and a newline is followed by a key's ``"`` instead)."""
    out: list[tuple[int, int]] = []
    pos = arr_start + 1
    tail = arr_end - (arr_end - arr_start) // 10  # the last tenth in quarter chunks: the
    while True:                                   # two processes finish closer together
        a = _skip_blank(mm, pos, arr_end)
        if a >= arr_end:
            return out
        size = STREAM_CHUNK if a < tail else max(STREAM_CHUNK // 4, 1)
        cut = mm.find(b"},\n", min(a + size, arr_end), arr_end)
        while cut >= 0 and not _opens_event(mm, cut + 3, arr_end):
            cut = mm.find(b"},\n", cut + 3, arr_end)
        stop = arr_end if cut < 0 else cut + 1
        out.append((a, stop))
        pos = stop + 1


def _skip_blank(mm: mmap.mmap, pos: int, end: int) -> int:
    m = _NOT_SKIP.search(mm, pos, end)  # whitespace and the separating comma, in C
    return end if m is None else m.start()


def _opens_event(mm: mmap.mmap, pos: int, end: int) -> bool:
    head = mm[pos:min(pos + 256, end)].lstrip(b" \t\r\n")
    return head[:1] == b"{"


def _release(mm: mmap.mmap, a: int, stop: int) -> None:
    """Drop the whole pages of ``[a, stop)`` from this process's memory (they were decoded)."""
    page = mmap.ALLOCATIONGRANULARITY
    lo, hi = -(-a // page) * page, (stop // page) * page
    if hi > lo and hasattr(mm, "madvise"):
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _events_span(mm: mmap.mmap) -> tuple[int, int, dict[str, Any], bool] | None:
    """``(index of the array's "[", index of its "]", top-level metadata, is_array)`` of the
    top-level events array (a ``traceEvents`` key nested in another value is not it)."""
    m = _NOT_BLANK.search(mm)
    if m is None:
        return None
    i, n = m.start(), len(mm)
    first = mm[i:i + 1]
    if first == b"[":
        arr_end = mm.rfind(b"]")
        if arr_end <= i or mm[arr_end + 1:].strip():
            return None
        return i, arr_end, {}, True
    if first != b"{":
        return None
    key = i
    for _ in range(16):  # each "traceEvents" key, until the top-level one
        key = mm.find(b'"traceEvents"', key + 1)
        arr_start = mm.find(b"[", key) if key >= 0 else -1
        if arr_start < 0:
            return None
        if mm[key + 13:arr_start].strip() != b":":
            continue
        head = mm[:arr_start]
        # the array ends at the last "]" after which the rest of the document still parses
        # with an empty top-level traceEvents there (not elsewhere: then the key was nested)
        arr_end = n
        for _ in range(64):
            arr_end = mm.rfind(b"]", arr_start, arr_end)
            if arr_end < 0:
                break
            try:
                doc = _DOC_DECODER.decode(head + b"[]" + mm[arr_end + 1:])
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if isinstance(doc.traceEvents, list) and not doc.traceEvents:
                return arr_start, arr_end, _top(doc), False
            break
    return None


_NOT_BLANK = re.compile(rb"[^ \t\r\n\xef\xbb\xbf]")
_NOT_SKIP = re.compile(rb"[^ \t\r\n,]")


def _chunks(mm: mmap.mmap, view: memoryview, arr_start: int, arr_end: int):
    """Yield ``(events, bytes done)`` per chunk of the array body, ``(None, _)`` when a chunk
    cannot be decoded. Chunks end at ``},`` followed by a newline: JSON strings cannot hold
    a raw newline, so that brace is outside any string; if it closes a nested object
    instead of an event, the chunk is unbalanced, fails to decode, and the next such cut is
    tried. Decoded pages are released from memory as it goes."""
    pos, released, page = arr_start + 1, 0, mmap.ALLOCATIONGRANULARITY
    while pos < arr_end:
        a = pos
        a = _skip_blank(mm, a, arr_end)
        if a >= arr_end:
            return
        cut = mm.find(b"},\n", min(a + STREAM_CHUNK, arr_end), arr_end)
        evs = None
        for _ in range(64):  # a cut inside an event (a nested object's "},"): try the next one
            stop = arr_end if cut < 0 else cut + 1
            try:
                evs = decode_events(b"".join((b"[", view[a:stop], b"]")))
                break
            except (msgspec.DecodeError, msgspec.ValidationError):
                if cut < 0:
                    break
                cut = mm.find(b"},\n", stop, arr_end)
        pos = stop + 1
        yield evs, pos
        if evs is None:
            return
        done = (pos // page) * page
        if done > released and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED, released, done - released)  # decoded pages leave RSS
            released = done
