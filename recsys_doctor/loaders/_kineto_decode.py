"""Kineto JSON bytes -> batches of typed event structs, handed to a sink as they are decoded.

Three ways in, the same events out:

* **streamed** (large files): the file is memory-mapped (a large ``.gz`` is first
  decompressed to a temporary file) and ``traceEvents`` is decoded a chunk (~8 MB) at a
  time; pages already decoded are released, so memory follows the columns the sink keeps,
  not the file. Where a second CPU is free, a forked process decodes the second half of
  the array into its own sink, whose columns are then appended to this one's (the same
  columns as one process makes, in the same order);
* **whole** (small files): one typed decode of the document;
* **plain** (anything the typed decoder refuses: invalid JSON, an ``args`` that is not an
  object, ...): the standard library's parse, which words the error exactly, its dicts
  turned into the same structs.

msgspec decodes the JSON straight into the slotted structs below: only the fields the
loader reads are kept (the rest, e.g. ``Input Dims`` or flow events' extra keys, is
skipped in C), no dict per event, and the structs are left out of the cyclic GC. An
absent field reads None, as ``dict.get`` would answer (the loader treats null and absent
alike).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import mmap
import os
import pickle
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from .._fork import fork, read_all, reap, second_cpu
from ..errors import BadInputError, TraceFormatError
from ..progress import ProgressHandle

GZIP_MAGIC = b"\x1f\x8b"


class Args(msgspec.Struct, gc=False, frozen=True):
    device: Any = None
    stream: Any = None
    correlation: Any = None
    grid: Any = None
    block: Any = None
    bytes: Any = None
    kind: Any = None
    cuda_sync_kind: Any = None
    name: Any = None


EMPTY_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Args | None = EMPTY_ARGS  # explicit null stays None


TOP_KEYS = ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "trace_id", "cupti_version",
            "cuda_runtime_version", "cuda_driver_version", "distributedInfo", "deviceProperties")


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[Event] | msgspec.UnsetType = msgspec.UNSET
    schemaVersion: Any = msgspec.UNSET
    displayTimeUnit: Any = msgspec.UNSET
    baseTimeNanoseconds: Any = msgspec.UNSET
    trace_id: Any = msgspec.UNSET
    cupti_version: Any = msgspec.UNSET
    cuda_runtime_version: Any = msgspec.UNSET
    cuda_driver_version: Any = msgspec.UNSET
    distributedInfo: Any = msgspec.UNSET
    deviceProperties: Any = msgspec.UNSET


_DOC_DECODER = msgspec.json.Decoder(_Doc)
_ARRAY_DECODER = msgspec.json.Decoder(list[Event])
_TYPED_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)

#: a sink takes one batch of decoded events (the caller's column builder)
Sink = Callable[[Sequence[Event]], None]
#: events handed to a sink at a time on the whole-file paths (bounds the sink's temporaries)
BATCH = 200_000
#: bytes of JSON decoded at a time by the streamed path: the structs of one chunk (~3x its
#: size) are read by the column passes several times, so they should stay near the CPU's
#: cache (8 MB decodes the 445 MB tiled trace ~4% faster than 16 MB on a 8 MB L3)
STREAM_CHUNK = 8 << 20
#: files smaller than this are decoded in one piece (no gain from streaming them)
STREAM_MIN = 64 << 20
#: a gzip file larger than this is decompressed to a temporary file, then streamed
GZ_TO_DISK = 8 << 20
#: a streamed events array at least this large is split between two processes (where a
#: second CPU is ours: :func:`~recsys_doctor._fork.second_cpu`)
SPLIT_MIN = 32 << 20


def _top(doc: _Doc) -> dict[str, Any]:
    return {k: getattr(doc, k) for k in TOP_KEYS if getattr(doc, k) is not msgspec.UNSET}


def _no_events_in_array(events: Sequence[Any]) -> bool:
    """torch 1.8 wrote a bare array of events: one whose first 1000 items hold no ``ph``
    is not a trace."""
    return bool(events) and not any(getattr(e, "ph", None) is not None for e in events[:1000])


# --- whole file ----------------------------------------------------------------------------

def decode_whole(path: str, sink: Sink) -> tuple[dict[str, Any], bool]:
    """Decode the whole file (typed, else plain) into ``sink``; ``(top-level metadata, is_array)``."""
    raw = read_bytes(path)
    typed = _decode_typed(raw)
    if typed is not None:
        top, events, is_array = typed
    else:  # the plain parse, with its exact error messages
        doc = parse_plain(path, raw)
        top, dicts = split_document(path, doc)
        is_array = isinstance(doc, list)
        del doc
        events = events_of_dicts(path, dicts)
    del raw
    for i in range(0, len(events), BATCH):
        sink(events[i:i + BATCH])
    return top, is_array


def _decode_typed(raw: bytes) -> tuple[dict[str, Any], list[Event], bool] | None:
    """``(top, events, is_array)``, or None when the document is not the usual shape
    (invalid JSON, no ``traceEvents``, an event that is not an object, ...)."""
    head = raw[:4096].lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
    try:
        if head == b"[":
            events = _ARRAY_DECODER.decode(raw)
            return None if _no_events_in_array(events) else ({}, events, True)
        doc = _DOC_DECODER.decode(raw)
    except _TYPED_ERRORS:
        return None
    if doc.traceEvents is msgspec.UNSET:
        return None
    return _top(doc), doc.traceEvents, False


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise BadInputError(f"{path}: cannot read ({e.strerror or e})") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceFormatError(f"{path}: corrupt gzip file ({e})") from None
    if not raw or raw.isspace():
        raise TraceFormatError(f"{path}: empty file, not a trace")
    return raw


def parse_plain(path: str, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise TraceFormatError(
            f"{path}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
            "the file is truncated or not a PyTorch profiler trace"
        ) from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise TraceFormatError(f"{path}: not a JSON trace ({type(e).__name__})") from None


def split_document(path: str, doc: Any) -> tuple[dict[str, Any], list[Any]]:
    """Top-level metadata and the event list; refuse JSON that is not a trace."""
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            keys = ", ".join(sorted(map(str, doc))[:5]) or "none"
            raise TraceFormatError(
                f"{path}: JSON object without 'traceEvents' (keys: {keys}); not a PyTorch profiler trace"
            )
        events = doc["traceEvents"]
        if not isinstance(events, list):
            raise TraceFormatError(f"{path}: 'traceEvents' is a {type(events).__name__}, expected a list of events")
        return doc, events
    if isinstance(doc, list):
        if doc and not any(isinstance(e, dict) and "ph" in e for e in doc[:1000]):
            raise TraceFormatError(f"{path}: JSON array holds no trace events (objects with 'ph'); not a trace")
        return {}, doc
    raise TraceFormatError(f"{path}: JSON {type(doc).__name__} at top level; not a PyTorch profiler trace")


def events_of_dicts(path: str, dicts: list[Any]) -> list[Event]:
    """The plain parse's events as structs (an ``args`` that is not an object reads as
    empty); an item that is not an event object, or a complete event whose ``cat`` cannot
    be a category, is refused with its index."""
    out = []
    for i, e in enumerate(dicts):
        if not isinstance(e, dict):
            raise TraceFormatError(f"{path}: trace event #{i} is a {type(e).__name__}, not an event object")
        cat = e.get("cat")
        if not _hashable(cat):
            if e.get("ph") == "X":
                raise TraceFormatError(f"{path}: trace event #{i} has an unusable 'cat' ({type(cat).__name__})")
            cat = None  # only complete events are sorted by category
        a = e.get("args")
        args = Args(**{k: a.get(k) for k in Args.__struct_fields__}) if type(a) is dict else EMPTY_ARGS
        ph = e.get("ph")
        out.append(Event(ph=ph if isinstance(ph, str) else None, cat=cat, name=e.get("name"), pid=e.get("pid"),
                         tid=e.get("tid"), ts=e.get("ts"), dur=e.get("dur"), args=args))
    return out


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


# --- streamed ------------------------------------------------------------------------------

def load_streamed(path: str, sink_factory: Callable[[], Sink],
                  progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool, Sink] | None:
    """Large traces: decode ``traceEvents`` a chunk at a time into a fresh sink; ``(top,
    is_array, sink)``, or None when the file is small or not laid out as expected (the
    caller then decodes it whole: same result, more memory; that path also words errors)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
    except OSError:
        return None
    if (size < GZ_TO_DISK) if gz else (size < STREAM_MIN):
        return None
    tmp = None
    try:
        if gz:
            tmp = _gunzip_to_temp(path)
            if tmp is None:
                return None
        with open(tmp or path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            sink = sink_factory()
            found = decode_split(mm, sink, sink_factory, progress)
            if found is None:  # not split (or the split did not hold): one process, a fresh sink
                sink = sink_factory()
                found = decode_streamed(mm, sink, progress)
            return None if found is None else (*found, sink)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _gunzip_to_temp(path: str) -> str | None:
    fd, tmp = tempfile.mkstemp(prefix="recsys-doctor-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as g:
            shutil.copyfileobj(g, out, 1 << 20)
    except (OSError, EOFError, zlib.error):
        os.unlink(tmp)
        return None
    return tmp


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


# --- split between two processes -------------------------------------------------------------

def decode_split(mm: mmap.mmap, sink: Any, sink_factory: Callable[[], Any],
                 progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool] | None:
    """:func:`decode_streamed` by two processes: a forked child decodes the events after
    the middle of the array into a fresh sink and sends its columns back (pickled, through
    a pipe) while this process decodes the first half; the child's columns are then
    merged into ``sink`` (``sink.merge(child.export())``), which makes the columns one
    process would have made. None when the array is not split (small, one CPU, no
    ``merge`` on the sink) or when either half does not decode (the middle cut fell inside
    an event, invalid JSON, the child died): the caller then decodes in one process."""
    if not hasattr(sink, "merge"):
        return None
    span = _events_span(mm)
    if span is None or span[1] - span[0] < SPLIT_MIN or not second_cpu():
        return None
    arr_start, arr_end, top, is_array = span
    # the "}" that ends an event near the middle; if it ends a nested object instead, the
    # first half's last chunk does not decode and the split is given up
    mid = mm.find(b"},\n", arr_start + (arr_end - arr_start) // 2, arr_end)
    if mid < 0:
        return None
    view = memoryview(mm)
    try:
        r, w = os.pipe()
        try:
            pid = fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if pid == 0:  # the child: never returns
            os.close(r)
            _child(mm, view, mid + 1, arr_end, sink_factory, w)
        os.close(w)
        try:
            try:
                ok = _feed(mm, view, arr_start, mid + 1, sink, check_first=is_array, progress=progress,
                           total=(arr_start, arr_end))
            except (TypeError, ValueError, AttributeError, KeyError):
                ok = False  # one process meets the same value and words the error
            if not ok:
                return None
            payload = read_all(r)
            r = -1
            code = reap(pid, kill=False)
            pid = 0
            if code != 0 or not payload:
                return None
            try:
                rest = pickle.loads(payload)
            except Exception:  # noqa: BLE001 - not what the child meant to send
                return None
            del payload
            if rest is None:
                return None
            sink.merge(rest)
        finally:
            if r >= 0:
                os.close(r)
            if pid:  # given up or interrupted: the child's work is not wanted
                reap(pid, kill=True)
    finally:
        view.release()
    if progress is not None:
        progress.update(completed=arr_end - arr_start, total=arr_end - arr_start)
    return top, is_array


def _child(mm: mmap.mmap, view: memoryview, start: int, end: int, sink_factory: Callable[[], Any],
           w: int) -> None:
    """The forked child of :func:`decode_split`: decode ``[start, end)`` into a fresh sink,
    write its ``export()`` (None when a chunk does not decode) to ``w`` and exit without
    running any of the parent's exit handlers."""
    code = 1
    try:
        sink = sink_factory()
        ok = _feed(mm, view, start, end, sink, check_first=False, progress=None, total=(start, end))
        with os.fdopen(w, "wb") as f:
            pickle.dump(sink.export() if ok else None, f, protocol=pickle.HIGHEST_PROTOCOL)
        code = 0
    except BaseException:  # noqa: BLE001 - reported to the parent by the exit status
        code = 1
    finally:
        os._exit(code)


def _events_span(mm: mmap.mmap) -> tuple[int, int, dict[str, Any], bool] | None:
    """``(index of the array's "[", index of its "]", top-level metadata, is_array)``."""
    n, i = len(mm), 0
    while i < n and mm[i:i + 1] in (b" ", b"\t", b"\r", b"\n", b"\xef", b"\xbb", b"\xbf"):
        i += 1
    first = mm[i:i + 1]
    if first == b"[":
        arr_end = mm.rfind(b"]")
        if arr_end <= i or mm[arr_end + 1:].strip():
            return None
        return i, arr_end, {}, True
    if first != b"{":
        return None
    key = mm.find(b'"traceEvents"')
    arr_start = mm.find(b"[", key) if key >= 0 else -1
    if arr_start < 0 or mm[key + 13:arr_start].strip() != b":":
        return None
    head = mm[:arr_start]
    # the array ends at the last "]" after which the rest of the document still parses
    arr_end = n
    for _ in range(64):
        arr_end = mm.rfind(b"]", arr_start, arr_end)
        if arr_end < 0:
            return None
        try:
            doc = _DOC_DECODER.decode(head + b"[]" + mm[arr_end + 1:])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        return arr_start, arr_end, _top(doc), False
    return None


_SKIP = frozenset(b" \t\r\n,")


def _chunks(mm: mmap.mmap, view: memoryview, arr_start: int, arr_end: int):
    """Yield ``(events, bytes done)`` per chunk of the array body, ``(None, _)`` when a chunk
    cannot be decoded. Chunks end at ``},`` followed by a newline: JSON strings cannot hold
    a raw newline, so that brace is outside any string; if it closes a nested object
    instead of an event, the chunk is unbalanced, fails to decode, and the next such cut is
    tried. Decoded pages are released from memory as it goes."""
    pos, released, page = arr_start + 1, 0, mmap.ALLOCATIONGRANULARITY
    while pos < arr_end:
        a = pos
        while a < arr_end and mm[a] in _SKIP:  # whitespace and the separating comma
            a += 1
        if a >= arr_end:
            return
        cut = mm.find(b"},\n", min(a + STREAM_CHUNK, arr_end), arr_end)
        evs = None
        for _ in range(64):  # a cut inside an event (a nested object's "},"): try the next one
            stop = arr_end if cut < 0 else cut + 1
            try:
                evs = _ARRAY_DECODER.decode(b"".join((b"[", view[a:stop], b"]")))
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
