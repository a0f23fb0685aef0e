"""Kineto JSON bytes -> batches of typed event structs, handed to a sink as they are decoded.

Three ways in, the same events out:

* **streamed** (large files): the file is memory-mapped (a large ``.gz`` is first
  decompressed to a temporary file) and ``traceEvents`` is decoded a chunk (~8 MB) at a
  time; pages already decoded are released, so memory follows the columns the sink keeps,
  not the file. Where a second CPU is free, this process and a forked one share the
  chunks (:class:`SplitDecode`), each taking the next one not yet taken, and the chunks'
  columns are appended in file order (the same columns as one process makes, in the same
  order). ``advise`` on the command line starts the forked one before it imports the rest
  of the program (:func:`prefetch`);
* **whole** (small files): one typed decode of the document;
* **plain** (anything the typed decoder refuses: invalid JSON, an ``args`` that is not an
  object, ...): the standard library's parse, which words the error exactly, its dicts
  turned into the same structs.

msgspec decodes the JSON straight into the slotted structs below: only the fields the
loader reads are kept (the rest, e.g. ``Input Dims`` or flow events' extra keys, is
skipped in C), no dict per event, and the structs are left out of the cyclic GC. An
absent field reads None, as ``dict.get`` would answer (the loader treats null and absent
alike).

Modules, lowest first: :mod:`._kineto_events` (the structs and decoders),
:mod:`._kineto_chunks` (the array cut and fed chunk by chunk), :mod:`._kineto_stream` (the
streamed way in, in one process or two, and :func:`prefetch`); here, the whole and plain ways.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from .._util.files import gunzip_bytes
from ..errors import BadInputError, TraceFormatError
from ._kineto_events import (BATCH, GZIP_MAGIC, TOP_KEYS, _TYPED_ERRORS, Args, Event, Sink, _decode_doc,
                             _no_events_in_array, _top, decode_events)
# the ways in and the event types, where the loader (and ``advise``'s prefetch) find them
from ._kineto_events import EMPTY_ARGS, Complete, Metadata, exact_floats, needs_exact  # noqa: F401
from ._kineto_stream import load_streamed, prefetch  # noqa: F401


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
            events = decode_events(raw)
            return None if _no_events_in_array(events) else ({}, events, True)
        doc = _decode_doc(raw)
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
    if raw[:2] == GZIP_MAGIC:  # (within the decompressed-size limit)
        raw = gunzip_bytes(raw, path)
    if not raw or raw.isspace():
        raise TraceFormatError(f"{path}: empty file, not a trace")
    return raw


class FloatText(str):
    """A JSON float literal's text (the plain parse's ``parse_float``)."""

    __slots__ = ()


def _floats_back(v: Any) -> Any:
    """Top-level metadata with its float literals as floats again."""
    if isinstance(v, FloatText):
        return float(v)
    if isinstance(v, dict):
        return {k: _floats_back(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_floats_back(x) for x in v]
    return v


def parse_plain(path: str, raw: bytes) -> Any:
    try:  # float literals as their text (a str subclass), as the typed decoders give them
        return json.loads(raw, parse_float=FloatText)
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
        return {k: _floats_back(doc[k]) for k in TOP_KEYS if k in doc}, events
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
