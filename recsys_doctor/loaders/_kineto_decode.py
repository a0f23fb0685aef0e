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
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import mmap
import os
import re
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Union

import msgspec

from .._files import gunzip_bytes, gunzip_into, private_temp
from .._fork import fork_with_queue, load_results, read_all, reap, second_cpu, serve_queue
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


class _Fields(msgspec.Struct, gc=False):
    """The fields the loader reads of an event (absent: None), its phase aside."""
    cat: str | None = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Args | None = EMPTY_ARGS  # explicit null stays None


class Event(_Fields, gc=False):
    """Any event, its phase a field (the way a batch with a phase outside the Trace Event
    Format, or none, is decoded)."""
    ph: str | None = None


class Complete(_Fields, gc=False, tag_field="ph", tag="X"):
    """A complete event (``"ph": "X"``) of a batch decoded by phase (:func:`decode_events`):
    its type says its phase."""


class Metadata(_Fields, gc=False, tag_field="ph", tag="M"):
    """A metadata event (``"ph": "M"``: thread and process names), likewise."""


#: the other phases of the Trace Event Format (flows, instants, counters, async events,
#: samples, objects, marks...): nothing of them is loaded, so none of their fields is kept
#: (the decoder skips them in C, making no objects for them)
OTHER_PHASES = "BEIiCbnestfSTpFPONDVvRc()"
_SKIPPED = tuple(msgspec.defstruct(f"_Skipped{ord(ph)}", [], tag_field="ph", tag=ph, gc=False, module=__name__)
                 for ph in OTHER_PHASES)
for _cls in _SKIPPED:
    globals()[_cls.__name__] = _cls
if TYPE_CHECKING:  # built at run time from OTHER_PHASES: the checker sees their common base
    PhaseEvent = Union[Complete, Metadata, msgspec.Struct]
else:
    PhaseEvent = Union[(Complete, Metadata, *_SKIPPED)]


TOP_KEYS = ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "trace_id", "cupti_version",
            "cuda_runtime_version", "cuda_driver_version", "distributedInfo", "deviceProperties")


class _Doc(msgspec.Struct, gc=False):
    """The document: its events, and the top-level keys the loader reads kept as raw JSON
    (decoded by :func:`_top` without the float hook: their floats stay floats)."""
    traceEvents: list[Event] | msgspec.UnsetType = msgspec.UNSET
    schemaVersion: msgspec.Raw = msgspec.Raw()
    displayTimeUnit: msgspec.Raw = msgspec.Raw()
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw()
    trace_id: msgspec.Raw = msgspec.Raw()
    cupti_version: msgspec.Raw = msgspec.Raw()
    cuda_runtime_version: msgspec.Raw = msgspec.Raw()
    cuda_driver_version: msgspec.Raw = msgspec.Raw()
    distributedInfo: msgspec.Raw = msgspec.Raw()
    deviceProperties: msgspec.Raw = msgspec.Raw()


class _PhaseDoc(_Doc, gc=False):
    # msgspec decodes by this class's own annotation; nothing writes the field through _Doc
    traceEvents: list[PhaseEvent] | msgspec.UnsetType = msgspec.UNSET  # type: ignore[assignment]


_DOC_DECODER = msgspec.json.Decoder(_Doc)  # (the top-level keys only: traceEvents is [] there)
#: the decoders of the events: float literals as floats (fast), or as their own text
#: (``float_hook=str``) once :func:`exact_floats` is on: the ns of a float ts of 2**40 µs or
#: more (epoch or days of uptime, where float64 loses ns) then come from its digits
_DECODERS = {exact: (msgspec.json.Decoder(list[PhaseEvent], float_hook=hook),
                     msgspec.json.Decoder(list[Event], float_hook=hook),
                     msgspec.json.Decoder(_PhaseDoc, float_hook=hook), msgspec.json.Decoder(_Doc, float_hook=hook))
             for exact, hook in ((False, None), (True, str))}
_EXACT = [False]


@contextlib.contextmanager
def exact_floats(on: bool) -> Any:
    """Decode float literals as their text while in this block (see :data:`_DECODERS`)."""
    was = _EXACT[0]
    _EXACT[0] = on
    try:
        yield
    finally:
        _EXACT[0] = was


def needs_exact(path: str) -> bool:
    """Whether the start of the trace holds a float ts of 13 digits or more before the
    point (>= 1e12 µs): decode it with :func:`exact_floats` from the start."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
        if head[:2] == GZIP_MAGIC:
            head = zlib.decompressobj(31).decompress(head, 1 << 20)
    except (OSError, zlib.error):
        return False
    return _BIG_FLOAT_TS.search(head) is not None


_BIG_FLOAT_TS = re.compile(rb'"ts":\s*-?\d{13,}\.\d')


def decode_events(buf: Any) -> list[Any]:
    """A JSON array of events -> structs: by phase (:class:`Complete`, :class:`Metadata`,
    a field-less struct for any other phase) where every event has a phase of the Trace
    Event Format, else as :class:`Event` (a phase missing, unknown or not a string). The
    sink reads both alike. Raises what decoding into :class:`Event` raises."""
    by_phase, plain = _DECODERS[_EXACT[0]][:2]
    try:
        return by_phase.decode(buf)
    except msgspec.ValidationError:
        return plain.decode(buf)


def _decode_doc(buf: Any) -> _Doc:
    by_phase, plain = _DECODERS[_EXACT[0]][2:]
    try:
        return by_phase.decode(buf)
    except msgspec.ValidationError:
        return plain.decode(buf)
_TYPED_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)

#: a sink takes one batch of decoded events (the caller's column builder)
Sink = Callable[[Sequence[Event]], None]


class ColumnSink(Protocol):
    """The column builder the streamed and split paths fill (the loader's
    ``EventColumns``): a :data:`Sink` whose columns can be exported from the child and
    merged in the parent, sharing one string table per process."""

    strings: Any

    def __call__(self, evs: Sequence[Event], /) -> None: ...

    def export(self) -> dict[str, Any]: ...

    def merge(self, other: dict[str, Any], remaps: dict[int, Any] | None = None, /) -> None: ...


S = TypeVar("S", bound=ColumnSink)
S_co = TypeVar("S_co", bound=ColumnSink, covariant=True)


class SinkFactory(Protocol[S_co]):
    """Makes a fresh :class:`ColumnSink`, sharing the string table ``strings`` when given."""

    def __call__(self, strings: Any = None, /) -> S_co: ...
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
    return {k: msgspec.json.decode(raw) for k in TOP_KEYS if len(raw := getattr(doc, k))}


def _no_events_in_array(events: Sequence[Any]) -> bool:
    """torch 1.8 wrote a bare array of events: one whose first 1000 items hold no ``ph``
    is not a trace (events decoded by phase all have one)."""
    return bool(events) and not any(type(e) is not Event or e.ph is not None for e in events[:1000])


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


# --- streamed ------------------------------------------------------------------------------

def load_streamed(path: str, sink_factory: SinkFactory[S],
                  progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool, S] | None:
    """Large traces: decode ``traceEvents`` a chunk at a time into a fresh sink; ``(top,
    is_array, sink)``, or None when the file is small or not laid out as expected (the
    caller then decodes it whole: same result, more memory; that path also words errors)."""
    expands = False
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
            if gz and size >= 18:  # the gzip trailer's size (mod 2**32): a small file may expand far
                f.seek(-4, os.SEEK_END)
                expands = int.from_bytes(f.read(4), "little") >= STREAM_MIN
    except OSError:
        return None
    if (size < GZ_TO_DISK and not expands) if gz else (size < STREAM_MIN):
        return None
    with contextlib.ExitStack() as stack:
        tmp = None
        if gz:
            fd, tmp = stack.enter_context(private_temp(".json"))  # removed on every way out
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                gunzip_into(src, out, path)
        job = _take_prefetched(path) if tmp is None else None
        if job is None:
            job = SplitDecode.start(tmp or path, sink_factory)
        if job is not None:
            split = job.finish(progress)
            if split is not None:
                return split
        with open(tmp or path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            sink = sink_factory()
            found = decode_streamed(mm, sink, progress)
            return None if found is None else (*found, sink)


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


# --- shared between two processes ----------------------------------------------------------

class SplitDecode(Generic[S]):
    """A large events array decoded by this process and a forked child together.

    The array is cut into chunks of about :data:`STREAM_CHUNK` bytes, each ending at an
    event's closing ``},`` (followed by a newline, then the next event's ``{``). Both
    processes take the next chunk not yet taken (a 4-byte index read from a shared pipe,
    which the kernel hands to one reader only) and decode it into a sink of its own (the
    sinks of one process share a string table), so the two stay busy until the array is
    done, however late this process joins in: the command line starts the child
    (:func:`prefetch`) before it imports the rest of the program. The child sends its
    chunks' columns back pickled; :meth:`finish` appends every chunk's columns in file
    order to one sink: the columns one process makes, but for how the strings are
    numbered (which no table depends on).

    A chunk the child did not deliver (it died, was killed) is decoded here. A chunk that
    does not decode (a cut inside an event after all, invalid JSON, a value the sink
    refuses) makes :meth:`finish` answer None: the caller decodes the file in one process,
    which also words the error."""

    def __init__(self, path: str, mm: mmap.mmap, f: Any, span: tuple[int, int, dict[str, Any], bool],
                 bounds: list[tuple[int, int]], sink_factory: SinkFactory[S]) -> None:
        self.path, self.mm, self._file = path, mm, f
        self.arr_start, self.arr_end, self.top, self.is_array = span
        self.bounds, self.sink_factory = bounds, sink_factory
        self._strings: Any = None  # the string table this process's chunks share
        self.exact = needs_exact(path)  # float literals as text (both processes alike)
        self._stat = _identity(os.fstat(f.fileno()))
        self.pid = 0
        self._queue = self._results = -1

    @classmethod
    def start(cls, path: str, sink_factory: SinkFactory[S]) -> "SplitDecode[S] | None":
        """Open ``path`` (plain JSON), cut its events array and fork the child; None when
        there is nothing to share (small array, one CPU, unusual layout, fork refused)."""
        if not second_cpu():
            return None
        try:
            f = open(path, "rb")
        except OSError:
            return None
        try:
            if f.read(2) == GZIP_MAGIC:
                raise ValueError
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            f.close()
            return None
        job = None
        try:
            span = _events_span(mm)
            if span is not None and span[1] - span[0] >= SPLIT_MIN:
                bounds = chunk_bounds(mm, span[0], span[1])
                if 2 <= len(bounds) <= _MAX_CHUNKS:
                    job = cls(path, mm, f, span, bounds, sink_factory)
                    if not job._fork():
                        job = None
        finally:
            if job is None:
                mm.close()
                f.close()
        return job

    def _fork(self) -> bool:
        def child(qr: int, rw: int) -> None:
            self._queue = qr
            self._child(rw)

        queue = b"".join(i.to_bytes(4, "little") for i in range(len(self.bounds)))  # < 64 KiB
        started = fork_with_queue(queue, child)
        if started is None:
            return False
        self.pid, self._queue, self._results = started
        return True

    def _take(self) -> int | None:
        b = os.read(self._queue, 4)
        return int.from_bytes(b, "little") if len(b) == 4 else None

    def _decode(self, view: memoryview, i: int) -> Any:
        """Chunk ``i`` decoded into a fresh sink, its columns exported; None when the chunk
        does not decode (or is a bare array's first chunk that holds no trace events)."""
        a, stop = self.bounds[i]
        try:
            with exact_floats(self.exact or _EXACT[0]):
                evs = decode_events(b"".join((b"[", view[a:stop], b"]")))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if i == 0 and self.is_array and _no_events_in_array(evs):
            return None
        sink = self.sink_factory(self._strings)
        self._strings = sink.strings
        sink(evs)
        del evs
        _release(self.mm, a, stop)
        return sink.export()

    def _child(self, w: int) -> None:
        """The forked child: decode chunks until none is left (or one does not decode),
        write ``{index: columns or None}`` to ``w`` and exit without running any of the
        parent's exit handlers."""
        gc.disable()  # the structs are not tracked; what else is made lives until exit
        view = memoryview(self.mm)

        def run(i: int) -> Any:
            try:
                return self._decode(view, i)
            except Exception:  # noqa: BLE001 - the parent sees the chunk fail and gives way
                return None

        serve_queue(self._take, run, w)

    def finish(self, progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool, S] | None:
        """Take chunks here until none is left, then gather the child's; ``(top,
        is_array, sink)`` with every chunk's columns in file order, or None (a chunk
        does not decode: the caller decodes in one process). The job is closed."""
        lo, hi = self.arr_start, self.arr_end
        mine: dict[int, Any] = {}
        view = memoryview(self.mm)
        try:
            ok = True
            while (i := self._take()) is not None:
                try:
                    mine[i] = self._decode(view, i)
                except (TypeError, ValueError, AttributeError, KeyError):
                    mine[i] = None  # one process meets the same value and words the error
                if mine[i] is None:
                    ok = False
                    break
                if progress is not None:  # every chunk before this one was taken before it
                    progress.update(completed=min(self.bounds[i][1], hi) - lo, total=hi - lo)
            if not ok:
                return None
            theirs = self._gather()
            sink = self.sink_factory(self._strings)
            remaps: dict[int, Any] = {}
            for i in range(len(self.bounds)):
                part = mine.pop(i) if i in mine else theirs.pop(i, _MISSING)
                if part is _MISSING:  # the child did not deliver it
                    try:
                        part = self._decode(view, i)
                    except (TypeError, ValueError, AttributeError, KeyError):
                        part = None
                if part is None:
                    return None
                sink.merge(part, remaps)
            if progress is not None:
                progress.update(completed=hi - lo, total=hi - lo)
            return self.top, self.is_array, sink
        finally:
            view.release()
            self.close()

    def _gather(self) -> dict[int, Any]:
        """The child's chunks (none when it died or sent something unreadable)."""
        payload = read_all(self._results, self.pid)
        self._results = -1
        code = reap(self.pid, kill=False) if payload is not None else None  # (a hung one is reaped)
        self.pid = 0
        return load_results(payload) if code == 0 and payload is not None else {}

    def close(self) -> None:
        """Stop the child (if still running) and let the file go; safe to call twice."""
        for fd in (self._queue, self._results):
            if fd >= 0:
                os.close(fd)
        self._queue = self._results = -1
        if self.pid:
            reap(self.pid, kill=True)
            self.pid = 0
        with contextlib.suppress(BufferError):  # a view still held: the GC closes it later
            self.mm.close()
        self._file.close()

    def matches(self, path: str) -> bool:
        """Whether this job reads the file ``path`` names now (the same file, unchanged)."""
        try:
            return _identity(os.stat(path)) == self._stat
        except (OSError, ValueError):
            return False


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_MISSING = object()
#: chunk indices in the queue pipe, 4 bytes each, must fit its 64 KiB before anyone reads
_MAX_CHUNKS = 16_000
_PREFETCHED: list[SplitDecode[Any]] = []


def prefetch(path: str | os.PathLike[str], sink_factory: SinkFactory[Any]) -> bool:
    """Set the shared decoding of a large plain Kineto file going now (the command line
    calls this before it imports pandas and the analyzers, so the child decodes while this
    process imports); :func:`load_streamed` of the same, unchanged file takes it over.
    A job never taken over is stopped at exit. True when a job was started.
    ``sink_factory`` is the loader's (``EventColumns``)."""
    try:
        p = os.fspath(path)
        if not os.path.isfile(p) or os.path.getsize(p) < STREAM_MIN:
            return False
    except (OSError, TypeError, ValueError):
        return False
    job = SplitDecode.start(p, sink_factory)
    if job is None:
        return False
    if not _PREFETCHED:
        atexit.register(_drop_prefetched)
    _PREFETCHED.append(job)
    return True


def _take_prefetched(path: str) -> SplitDecode[Any] | None:
    for job in list(_PREFETCHED):
        if job.matches(path):
            _PREFETCHED.remove(job)
            return job
    return None


def _drop_prefetched() -> None:
    while _PREFETCHED:
        _PREFETCHED.pop().close()


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
