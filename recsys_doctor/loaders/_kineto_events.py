"""The typed events a Kineto JSON decodes into, and their decoders (the bottom of the Kineto
decoding: :mod:`._kineto_decode` tells the three ways in). msgspec decodes straight into the
slotted structs below: only the fields the loader reads are kept, no dict per event, and the
structs are left out of the cyclic GC. An absent field reads None, as ``dict.get`` would answer."""

from __future__ import annotations

import contextlib
import re
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Union

import msgspec


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


def _top(doc: _Doc) -> dict[str, Any]:
    return {k: msgspec.json.decode(raw) for k in TOP_KEYS if len(raw := getattr(doc, k))}


def _no_events_in_array(events: Sequence[Any]) -> bool:
    """torch 1.8 wrote a bare array of events: one whose first 1000 items hold no ``ph``
    is not a trace (events decoded by phase all have one)."""
    return bool(events) and not any(type(e) is not Event or e.ph is not None for e in events[:1000])
