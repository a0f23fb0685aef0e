"""PyTorch profiler / Kineto Chrome-trace JSON -> canonical :class:`~recsys_doctor.model.Trace`.

What the loader copes with (all seen in real traces from torch 1.8 to 2.9, see
``shared/traces/kineto/FORMAT.md``):

* plain or gzip-compressed JSON (detected by the ``1f 8b`` magic, not the extension);
  a ``{"traceEvents": [...]}`` object or, in torch 1.8, a bare JSON array of events;
* legacy category names (``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Operator``)
  and modern ones (``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``,
  ``cuda_driver``, ``cpu_op``, ``user_annotation``, ``cuda_sync``);
* string thread ids (``"4093687616"``) and GPU rows named ``"stream 7"``;
* integer-µs epoch timestamps, float-µs epoch timestamps with ns digits, and float µs
  relative to ``baseTimeNanoseconds``.

Time: ``ts``/``dur`` are always microseconds whatever ``displayTimeUnit`` says. They
become integer ns, ``start = round((ts - ts0) * 1000)`` where ``ts0`` is the earliest
``ts`` among the loaded events (so the earliest event starts at 0), and
``end = start + round(dur * 1000)``. Subtracting before scaling keeps the ns digits
of float epoch timestamps that ``round(ts * 1000)`` would lose (float64 resolves only
~0.25 µs at 1.7e15 µs). ``meta["origin_ns_epoch"]`` says where 0 is on the Unix clock
when the trace lets us know.

GPU events carry ``pid`` = device index, so their ``pid`` column is replaced by the
host process that issued the matching runtime/driver call (same ``correlation``);
failing that (launched before the profiling window opened), the only CPU process of
the trace; failing that, -1. (A Kineto file is one process in practice; were two
processes to reuse a correlation id, the first launch seen wins.) Those unmatched GPU events are normal, not errors: their
number is in ``meta["unmatched_gpu_events"]``.

Kineto has no interval for a CUDA-graph execution, so ``graphs`` stays empty; kernels,
copies and memsets whose ``(pid, correlation)`` belongs to a ``cudaGraphLaunch``
carry ``in_graph = True`` instead.

``gpu_user_annotation`` (the GPU-side projection of record_function ranges),
``python_function`` (with_stack), ``overhead`` and the profiler's own ``Trace`` span
are not loaded into ``ranges``, which holds CPU-thread annotations only; their counts
are in ``meta["skipped_categories"]`` and the profiler span, when present, in
``meta["profiler_window_ns"]``.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
from operator import attrgetter
import json
import os
import re
import zlib
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from ..errors import BadInputError, TraceFormatError
from ..model import Trace
from ..progress import ProgressHandle

__all__ = ["load_kineto_json", "copy_kind_from_name"]

GZIP_MAGIC = b"\x1f\x8b"

# Kineto category -> our bucket. Legacy (torch <= 1.9) and modern spellings share a bucket.
_BUCKET_OF_CAT: dict[str, str] = {
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset",
    "cuda_runtime": "runtime", "Runtime": "runtime",
    "cuda_driver": "driver",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op", "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "Trace": "trace",
}
_BUCKETS = ("kernel", "memcpy", "memset", "runtime", "driver", "sync", "cpu_op", "user_annotation", "trace")

_COPY_TOKEN = re.compile(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP|HtoA|AtoH|AtoD|DtoA|AtoA)\b")
_COPY_KIND_OF_TOKEN = {
    "HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "HtoH": "h2h", "PtoP": "p2p",
    "HtoA": "array", "AtoH": "array", "AtoD": "array", "DtoA": "array", "AtoA": "array",
}
_MEM_PAIR = re.compile(r"\(\s*(\w+)\s*->\s*(\w+)\s*\)")
_MEM_KIND_OF_WORD = {
    "pageable": "pageable", "pinned": "pinned", "device": "device", "array": "array",
    "managed": "managed",
    # ROCm writes "(Host -> Device)" without saying pageable or pinned.
    "host": "unknown",
}
_SYNC_TYPE_OF_NAME = {
    "Event Sync": "event",
    "Stream Wait Event": "stream_wait_event",
    "Stream Sync": "stream",
    "Context Sync": "context",
}
_GRAPH_LAUNCH = re.compile(r"^(cuda|cu|hip)GraphLaunch")
# CUPTI writes "no stream" as an unsigned -1 in some builds (Context Sync: 4294967295).
_UNSIGNED_MINUS_ONE = (4294967295.0, 18446744073709551615.0)
# Above this a ts in µs is on the Unix epoch (1e14 µs is 1973); below it, it is relative.
_EPOCH_US_THRESHOLD = 1e14


def load_kineto_json(path: str | os.PathLike[str], *, progress: ProgressHandle | None = None) -> Trace:
    """Load a PyTorch profiler (Kineto) JSON trace, plain or gzip-compressed.
    ``progress`` follows the bytes decoded on large files.

    Raises :class:`~recsys_doctor.errors.TraceFormatError` (one line naming the file and
    the problem) for corrupt gzip, invalid or truncated JSON, and JSON that is not a
    trace. A trace with an empty ``traceEvents`` list loads as a trace with no events.
    """
    p = os.fspath(path)
    # json.loads of a big trace allocates millions of containers; the cyclic GC would
    # rescan them over and over (up to ~40% of the load time) though none is garbage.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        streamed = _load_streamed(p, progress)
        if streamed is not None:
            top, is_array, (buckets, meta_events, skipped, n_events) = streamed
        else:
            raw = _read_bytes(p)
            fast = _decode_fast(raw)
            if fast is not None:
                del raw
                top, events, is_array = fast
            else:  # anything the typed decoder refuses: the plain parse, with its exact error messages
                doc = _parse_json(p, raw)
                del raw
                top, events = _split_document(p, doc)
                is_array = isinstance(doc, list)
                del doc
            buckets, meta_events, skipped, n_events = _bucket_events(p, events)
            del events
        try:
            return _build_trace(p, top, buckets, meta_events, skipped, n_events, is_array=is_array)
        except (TypeError, ValueError, AttributeError, KeyError) as e:
            # values of a type no profiler writes (a list where a number belongs, ...)
            raise TraceFormatError(f"{p}: unexpected value in trace events ({type(e).__name__}: {e})") from None
    finally:
        if gc_was_enabled:
            gc.enable()


def copy_kind_from_name(name: str) -> tuple[str, str, str]:
    """``(kind, src_mem, dst_mem)`` of a Kineto copy name such as
    ``"Memcpy HtoD (Pinned -> Device)"``: the direction is only in the name."""
    m = _COPY_TOKEN.search(name)
    kind = _COPY_KIND_OF_TOKEN[m.group(1)] if m else "other"
    pm = _MEM_PAIR.search(name)
    if pm:
        src = _MEM_KIND_OF_WORD.get(pm.group(1).lower(), "unknown")
        dst = _MEM_KIND_OF_WORD.get(pm.group(2).lower(), "unknown")
    else:
        src = dst = "unknown"
    return kind, src, dst


# --- reading -----------------------------------------------------------------------------

def _read_bytes(path: str) -> bytes:
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


# --- the typed decoder -----------------------------------------------------------------
# msgspec decodes the JSON straight into these slotted structs: only the fields the loader
# reads are kept (the rest, e.g. ``Input Dims`` or flow events' extra keys, is skipped in
# C), no dict per event, and the structs are left out of the cyclic GC. An absent field
# reads None, as ``dict.get`` would answer (the loader treats null and absent alike).

class _Args(msgspec.Struct, gc=False):
    device: Any = None
    stream: Any = None
    correlation: Any = None
    grid: Any = None
    block: Any = None
    bytes: Any = None
    kind: Any = None
    cuda_sync_kind: Any = None
    name: Any = None

    def get(self, key: str, default: Any = None) -> Any:
        v = getattr(self, key, None)
        return default if v is None else v


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None

    def get(self, key: str, default: Any = None) -> Any:
        v = getattr(self, key, None)
        return default if v is None else v


_TOP_KEYS = ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "trace_id", "cupti_version",
             "cuda_runtime_version", "cuda_driver_version", "distributedInfo", "deviceProperties")


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | msgspec.UnsetType = msgspec.UNSET
    schemaVersion: Any = msgspec.UNSET
    displayTimeUnit: Any = msgspec.UNSET
    baseTimeNanoseconds: Any = msgspec.UNSET
    trace_id: Any = msgspec.UNSET
    cupti_version: Any = msgspec.UNSET
    cuda_runtime_version: Any = msgspec.UNSET
    cuda_driver_version: Any = msgspec.UNSET
    distributedInfo: Any = msgspec.UNSET
    deviceProperties: Any = msgspec.UNSET


_EMPTY_ARGS = _Args()
_DOC_DECODER = msgspec.json.Decoder(_Doc)
_ARRAY_DECODER = msgspec.json.Decoder(list[_Event])


def _decode_fast(raw: bytes) -> tuple[dict[str, Any], list[Any], bool] | None:
    """(top-level metadata, events, is_array) through the typed decoder, or None when the
    document is not the usual shape (invalid JSON, no ``traceEvents``, an event that is
    not an object, ``args`` that is not an object...): the caller then takes the plain
    path, which reports exactly what is wrong."""
    head = raw[:4096].lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
    try:
        if head == b"[":
            events = _ARRAY_DECODER.decode(raw)
            if events and not any(e.ph is not None for e in events[:1000]):
                return None
            return {}, events, True
        doc = _DOC_DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return None
    if doc.traceEvents is msgspec.UNSET:
        return None
    top = {k: getattr(doc, k) for k in _TOP_KEYS if getattr(doc, k) is not msgspec.UNSET}
    return top, doc.traceEvents, False


#: bytes of JSON decoded at a time by the streamed path
STREAM_CHUNK = 16 << 20
#: files smaller than this are decoded in one piece (no gain from streaming them)
STREAM_MIN = 64 << 20
#: a gzip file larger than this is decompressed to a temporary file, then streamed
GZ_TO_DISK = 8 << 20


def _load_streamed(path: str, progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool, Any] | None:
    """Large traces: decode ``traceEvents`` a chunk (~16 MB) at a time and keep only the
    events the loader uses, so memory follows the kept events, not the file.

    The file is memory-mapped (a large ``.gz`` is first decompressed to a temporary file)
    and the pages already decoded are released as it goes. Chunks end at ``},`` followed
    by a newline: JSON strings cannot hold a raw newline, so that brace is outside any
    string; if it closes a nested object instead of an event, the chunk is unbalanced,
    fails to decode, and the next such cut is tried. Invalid JSON and any unusual layout
    return None: the caller then decodes the whole file (same result, more memory), which
    also words the error."""
    import mmap
    import shutil
    import tempfile

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
            fd, tmp = tempfile.mkstemp(prefix="recsys-doctor-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as g:
                    shutil.copyfileobj(g, out, 1 << 20)
            except (OSError, EOFError, zlib.error):
                return None
            src = tmp
        else:
            src = path
        with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return _decode_streamed(path, mm, view, progress)
            finally:
                view.release()
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


_SKIP = frozenset(b" \t\r\n,")


def _decode_streamed(path: str, mm: Any, view: memoryview,
                     progress: ProgressHandle | None = None) -> tuple[dict[str, Any], bool, Any] | None:
    import mmap

    n = len(mm)
    i = 0
    while i < n and mm[i:i + 1] in (b" ", b"\t", b"\r", b"\n", b"\xef", b"\xbb", b"\xbf"):
        i += 1
    first = mm[i:i + 1]
    if first == b"[":
        is_array, top = True, {}
        arr_start = i
        arr_end = mm.rfind(b"]")
        if arr_end <= arr_start or mm[arr_end + 1:].strip():
            return None
    elif first == b"{":
        is_array = False
        key = mm.find(b'"traceEvents"')
        arr_start = mm.find(b"[", key) if key >= 0 else -1
        if arr_start < 0 or mm[key + 13:arr_start].strip() != b":":
            return None
        head = mm[:arr_start]
        # the array ends at the last "]" after which the rest of the document still parses
        arr_end, tries, top = n, 0, None
        while tries < 64:
            arr_end = mm.rfind(b"]", arr_start, arr_end)
            if arr_end < 0:
                return None
            try:
                doc = _DOC_DECODER.decode(head + b"[]" + mm[arr_end + 1:])
            except (msgspec.DecodeError, msgspec.ValidationError):
                tries += 1
                continue
            top = {k: getattr(doc, k) for k in _TOP_KEYS if getattr(doc, k) is not msgspec.UNSET}
            break
        if top is None:
            return None
    else:
        return None
    lists: dict[str, list[Any]] = {b: [] for b in _BUCKETS}
    meta_events: list[Any] = []
    skipped: dict[str, int] = {}
    n_events = 0
    pos = arr_start + 1
    released = 0
    page = mmap.ALLOCATIONGRANULARITY
    while pos < arr_end:
        a = pos
        while a < arr_end and mm[a] in _SKIP:  # whitespace and the separating comma
            a += 1
        if a >= arr_end:
            break
        cut = mm.find(b"},\n", min(a + STREAM_CHUNK, arr_end), arr_end)
        evs = None
        for _ in range(64):  # a cut inside an event (a nested object's "},"): try the next one
            stop = arr_end if cut < 0 else cut + 1
            try:
                evs = _ARRAY_DECODER.decode(b"".join((b"[", view[a:stop], b"]")))
                break
            except (msgspec.DecodeError, msgspec.ValidationError):
                if cut < 0:
                    return None
                cut = mm.find(b"},\n", stop, arr_end)
        if evs is None:
            return None
        pos = stop + 1
        if is_array and n_events == 0 and evs and not any(e.ph is not None for e in evs[:1000]):
            return None
        b, m, sk, cnt = _bucket_events(path, evs)
        del evs
        for k, v in b.items():
            lists[k].extend(v)
        meta_events.extend(m)
        for k, v in sk.items():
            skipped[k] = skipped.get(k, 0) + v
        n_events += cnt
        if progress is not None:  # the bar moves with the bytes decoded
            progress.update(completed=pos - arr_start, total=arr_end - arr_start)
        done = (pos // page) * page
        if done > released and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED, released, done - released)  # decoded pages leave RSS
            released = done
    return top, is_array, (lists, meta_events, skipped, n_events)


def _col(items: list[Any], key: str) -> list[Any]:
    """One field of every event (or ``args``) as a list: an attribute read in C for the
    typed structs, ``dict.get`` on the plain path."""
    if items and type(items[0]) in (_Event, _Args):
        return list(map(attrgetter(key), items))
    return [x.get(key) for x in items]


def _parse_json(path: str, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise TraceFormatError(
            f"{path}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
            "the file is truncated or not a PyTorch profiler trace"
        ) from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise TraceFormatError(f"{path}: not a JSON trace ({type(e).__name__})") from None


def _split_document(path: str, doc: Any) -> tuple[dict[str, Any], list[Any]]:
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
        # torch 1.8 wrote a bare array of events: every element must be an event object.
        if doc and not any(isinstance(e, dict) and "ph" in e for e in doc[:1000]):
            raise TraceFormatError(f"{path}: JSON array holds no trace events (objects with 'ph'); not a trace")
        return {}, doc
    raise TraceFormatError(f"{path}: JSON {type(doc).__name__} at top level; not a PyTorch profiler trace")


def _bucket_events(path: str, events: list[Any]) -> tuple[dict[str, list[dict]], list[dict], dict[str, int], int]:
    """The single pass over all events: split complete (``ph == "X"``) events by
    category, keep ``M`` metadata, count what is skipped. Flows and instants are dropped."""
    lists: dict[str, list[dict]] = {b: [] for b in _BUCKETS}
    by_cat = {cat: lists[b] for cat, b in _BUCKET_OF_CAT.items()}
    meta_events: list[dict] = []
    skipped: dict[str, int] = {}
    typed = bool(events) and type(events[0]) is _Event
    get_ph = attrgetter("ph") if typed else (lambda e: e.get("ph"))
    get_cat = attrgetter("cat") if typed else (lambda e: e.get("cat"))
    try:
        for e in events:
            ph = get_ph(e)
            if ph == "X":
                cat = get_cat(e)
                lst = by_cat.get(cat)
                if lst is not None:
                    lst.append(e)
                else:
                    k = str(cat)
                    skipped[k] = skipped.get(k, 0) + 1
            elif ph == "M":
                meta_events.append(e)
    except (AttributeError, TypeError):
        bad = next(i for i, e in enumerate(events) if not isinstance(e, dict) or not _hashable(e.get("cat")))
        what = (f"has an unusable 'cat' ({type(events[bad].get('cat')).__name__})" if isinstance(events[bad], dict)
                else f"is a {type(events[bad]).__name__}, not an event object")
        raise TraceFormatError(f"{path}: trace event #{bad} {what}") from None
    return lists, meta_events, skipped, len(events)


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


# --- columns -----------------------------------------------------------------------------

def _num(values: list[Any]) -> np.ndarray:
    """float64 array of numbers given as int, float, numeric string, ``"stream 7"``;
    NaN where unknown. float64 is exact for every id and µs value below 2**53."""
    try:
        a = np.array(values, dtype=np.float64)
        if a.ndim == 1:
            return a
    except (TypeError, ValueError):
        pass
    s = pd.Series(values, dtype=object)
    s = s.where(s.map(lambda v: isinstance(v, (int, float, str))), None)
    out = pd.to_numeric(s, errors="coerce")
    bad = out.isna() & s.map(lambda v: isinstance(v, str))
    if bad.any():
        out[bad] = pd.to_numeric(s[bad].str.extract(r"^\D*?(-?\d+)\s*$")[0], errors="coerce")
    return out.to_numpy(dtype=np.float64, na_value=np.nan)


def _int_col(a: np.ndarray, fill: int) -> np.ndarray:
    """float ids -> int64, unknown -> ``fill``; unsigned -1 (4294967295, 2**64-1) -> -1."""
    a = np.where(np.isin(a, _UNSIGNED_MINUS_ONE), -1.0, a)
    a = np.where(np.isfinite(a) & (np.abs(a) < 2.0**63), a, np.nan)
    return np.where(np.isnan(a), fill, a).astype(np.int64)


def _args(evs: list[dict]) -> list[dict]:
    out = _col(evs, "args")
    if evs and type(evs[0]) is _Event:
        return [_EMPTY_ARGS if a is None else a for a in out]
    return [a if type(a) is dict else {} for a in out]


def _arg_num(args: list[dict], key: str) -> np.ndarray:
    return _num(_col(args, key))


def _dim3(args: list[dict], key: str) -> tuple[list[Any], list[Any], list[Any]]:
    vals = _col(args, key)
    ok = [v if isinstance(v, list) and len(v) == 3 else (None, None, None) for v in vals]
    return [v[0] for v in ok], [v[1] for v in ok], [v[2] for v in ok]


class _Times:
    """Raw µs start/duration arrays per bucket; converted once the global origin is known."""

    def __init__(self) -> None:
        self.ts: dict[str, np.ndarray] = {}
        self.dur: dict[str, np.ndarray] = {}

    def add(self, bucket: str, evs: list[dict]) -> None:
        self.ts[bucket] = _num(_col(evs, "ts"))
        # an absent dur reads None (NaN) on the typed path, 0 on the plain one: ns() makes both 0
        self.dur[bucket] = _num(_col(evs, "dur") if evs and type(evs[0]) is _Event else [e.get("dur", 0) for e in evs])

    def origin(self, exclude: tuple[str, ...]) -> float | None:
        mins = [float(np.nanmin(a)) for b, a in self.ts.items()
                if b not in exclude and len(a) and not np.isnan(a).all()]
        return min(mins) if mins else None

    def ns(self, bucket: str, t0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(start_ns, end_ns, valid)``: rows with a missing ts are invalid."""
        ts, dur = self.ts[bucket], self.dur[bucket]
        valid = ~np.isnan(ts)
        start = np.rint((np.where(valid, ts, t0) - t0) * 1000.0).astype(np.int64)
        d = np.where(np.isnan(dur) | (dur < 0), 0.0, dur)
        end = start + np.rint(d * 1000.0).astype(np.int64)
        return start, end, valid


# --- building the tables -------------------------------------------------------------------

def _build_trace(path: str, top: dict[str, Any], b: dict[str, list[dict]], meta_events: list[dict],
                 skipped: dict[str, int], n_events: int, *, is_array: bool) -> Trace:
    times = _Times()
    for bucket in _BUCKETS:
        times.add(bucket, b[bucket])
    t0 = times.origin(exclude=("trace",))
    dropped = 0

    def frame(bucket: str, cols: dict[str, Any]) -> pd.DataFrame:
        nonlocal dropped
        if not b[bucket]:
            return pd.DataFrame()
        start, end, valid = times.ns(bucket, t0 if t0 is not None else 0.0)
        df = pd.DataFrame({"start": start, "end": end, **cols})
        if not valid.all():
            dropped += int((~valid).sum())
            df = df[valid].reset_index(drop=True)
        return df

    # CPU side first: the api table decides which host process owns each correlation.
    api_parts = []
    for bucket, api_class in (("runtime", "runtime"), ("driver", "driver")):
        evs = b[bucket]
        if evs:
            args = _args(evs)
            api_parts.append(frame(bucket, {
                "pid": _int_col(_num(_col(evs, "pid")), -1),
                "tid": _int_col(_num(_col(evs, "tid")), -1),
                "correlation": _int_col(_arg_num(args, "correlation"), 0),
                "name": _col(evs, "name"),
                "api_class": api_class,
            }))
    api = pd.concat(api_parts, ignore_index=True) if api_parts else pd.DataFrame()

    ranges = _ranges(b, frame)
    cpu_pids = sorted(set(api["pid"].tolist() if len(api) else []) | set(ranges["pid"].tolist() if len(ranges) else []))
    cpu_pids = [p for p in cpu_pids if p >= 0]
    default_pid = cpu_pids[0] if len(cpu_pids) == 1 else -1

    if len(api):
        linked = api[api["correlation"] != 0].drop_duplicates("correlation")
        owner = pd.Series(linked["pid"].to_numpy(), index=linked["correlation"].to_numpy())
        graph_launch = api[api["name"].astype(str).str.match(_GRAPH_LAUNCH)]
        graph_keys = pd.MultiIndex.from_arrays([graph_launch["pid"], graph_launch["correlation"]])
    else:
        owner = pd.Series(dtype="int64")
        graph_keys = pd.MultiIndex.from_arrays([[], []])

    unmatched: dict[str, int] = {}

    def gpu_frame(bucket: str, extra: Any) -> pd.DataFrame:
        """Columns shared by every GPU table, plus ``extra(evs, args)``'s own."""
        evs = b[bucket]
        if not evs:
            return pd.DataFrame()
        args = _args(evs)
        dev = _arg_num(args, "device")
        dev = np.where(np.isnan(dev), _num(_col(evs, "pid")), dev)
        stream = _arg_num(args, "stream")
        stream = np.where(np.isnan(stream), _num(_col(evs, "tid")), stream)
        corr = _int_col(_arg_num(args, "correlation"), 0)
        host = pd.Series(corr).map(owner)
        unmatched[bucket] = int(host.isna().sum())
        df = frame(bucket, {
            "pid": host.fillna(default_pid).astype(np.int64).to_numpy(),
            "device": _int_col(dev, -1),
            "stream": _int_col(stream, -1),
            "correlation": corr,
            **extra(evs, args),
        })
        if bucket != "sync" and len(df):
            df["in_graph"] = pd.MultiIndex.from_arrays([df["pid"], df["correlation"]]).isin(graph_keys)
        return df

    def kernel_cols(evs: list[dict], args: list[dict]) -> dict[str, Any]:
        gx, gy, gz = _dim3(args, "grid")
        bx, by, bz = _dim3(args, "block")
        return {"name": _col(evs, "name"), "grid_x": gx, "grid_y": gy, "grid_z": gz,
                "block_x": bx, "block_y": by, "block_z": bz}

    kernels = gpu_frame("kernel", kernel_cols)

    def memcpy_cols(evs: list[dict], args: list[dict]) -> dict[str, Any]:
        names = pd.Series(_col(evs, "name"), dtype=object).fillna("").astype(str)
        parsed = {n: copy_kind_from_name(n) for n in names.unique()}
        kinds = names.map(lambda n: parsed[n][0])
        # ROCm also says args.kind ("HtoD"); use it where the name has no direction token.
        if (kinds == "other").any():
            akind = pd.Series(_col(args, "kind"), dtype=object)
            fb = akind.map(lambda k: _COPY_KIND_OF_TOKEN.get(k) if isinstance(k, str) else None)
            kinds = kinds.where((kinds != "other") | fb.isna(), fb)
        return {"bytes": _int_col(_arg_num(args, "bytes"), 0), "kind": kinds.to_numpy(),
                "src_mem": names.map(lambda n: parsed[n][1]).to_numpy(),
                "dst_mem": names.map(lambda n: parsed[n][2]).to_numpy()}

    memcpys = gpu_frame("memcpy", memcpy_cols)
    memsets = gpu_frame("memset", lambda evs, args: {"bytes": _int_col(_arg_num(args, "bytes"), 0)})

    def sync_cols(evs: list[dict], args: list[dict]) -> dict[str, Any]:
        out = []
        for e, a in zip(evs, args):
            t = _SYNC_TYPE_OF_NAME.get(e.get("name")) or _SYNC_TYPE_OF_NAME.get(a.get("cuda_sync_kind"))
            out.append(t or "unknown")
        return {"sync_type": out}

    syncs = gpu_frame("sync", sync_cols)

    threads, process_names = _threads(meta_events, set(cpu_pids))
    used_devices = sorted({int(d) for df in (kernels, memcpys, memsets, syncs) if len(df)
                           for d in df["device"].unique() if d >= 0})
    devices = _devices(top, used_devices)

    meta = _meta(top, is_array, t0, n_events, skipped, b, unmatched, dropped, process_names, times)
    trace = Trace(path=path, format="kineto-json", kernels=kernels, memcpys=memcpys, memsets=memsets,
                  api=api, syncs=syncs, ranges=ranges, threads=threads, devices=devices, meta=meta)
    return trace


def _ranges(b: dict[str, list[dict]], frame: Any) -> pd.DataFrame:
    parts = []
    for bucket in ("user_annotation", "cpu_op"):
        evs = b[bucket]
        if not evs:
            continue
        names = _col(evs, "name")
        if bucket == "cpu_op":
            # torch 1.8 recorded ProfilerStep#N as an Operator; it is a step annotation.
            source = ["user_annotation" if isinstance(n, str) and n.startswith("ProfilerStep#") else "cpu_op"
                      for n in names]
        else:
            source = "user_annotation"
        parts.append(frame(bucket, {
            "pid": _int_col(_num(_col(evs, "pid")), -1),
            "tid": _int_col(_num(_col(evs, "tid")), -1),
            "name": names,
            "source": source,
        }))
    if not parts:
        return pd.DataFrame()
    df = pd.concat(parts, ignore_index=True)
    df["depth"] = _depths(df["pid"].to_numpy(), df["tid"].to_numpy(), df["start"].to_numpy(), df["end"].to_numpy())
    return df


def _depths(pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting level of each range on its (pid, tid): one sort, one stack pass. A range
    that starts before the enclosing one ends is inside it (0 = outermost)."""
    n = len(start)
    order = np.lexsort((-end, start, tid, pid))
    p, t, s, e = (a[order].tolist() for a in (pid, tid, start, end))
    depth_sorted = [0] * n
    stack: list[int] = []
    prev = None
    for i in range(n):
        key = (p[i], t[i])
        if key != prev:
            stack = []
            prev = key
        si = s[i]
        while stack and stack[-1] <= si:
            stack.pop()
        depth_sorted[i] = len(stack)
        stack.append(e[i])
    out = np.empty(n, dtype=np.int64)
    out[order] = depth_sorted
    return out


def _threads(meta_events: list[dict], cpu_pids: set[int]) -> tuple[pd.DataFrame, dict[str, str]]:
    """CPU thread names from ``thread_name`` metadata. GPU rows (``"stream 7 "``,
    ``"Device 0"``) and pseudo rows of processes with no CPU events are left out;
    when a thread is renamed (``pt_main_thread`` -> ``pt_autograd_0``) the last name wins."""
    rows: dict[tuple[int, int], str] = {}
    procs: dict[str, str] = {}
    for e in meta_events:
        kind = e.get("name")
        if kind not in ("thread_name", "process_name"):
            continue
        args = e.get("args") or {}
        name = args.get("name") if isinstance(args, (dict, _Args)) else None
        pid = _int_col(_num([e.get("pid")]), -1)[0]
        if int(pid) not in cpu_pids or not isinstance(name, str):
            continue
        if kind == "process_name":
            procs[str(int(pid))] = name
            continue
        if name.startswith(("stream ", "Device ")):
            continue
        tid = _int_col(_num([e.get("tid")]), -1)[0]
        rows[(int(pid), int(tid))] = name
    if not rows:
        return pd.DataFrame(), procs
    return pd.DataFrame([(p, t, n) for (p, t), n in rows.items()], columns=["pid", "tid", "name"]), procs


def _devices(top: dict[str, Any], used: list[int]) -> pd.DataFrame:
    """GPUs that appear in GPU events; name/SM count from ``deviceProperties``, which
    lists every visible GPU, not only the traced one."""
    if not used:
        return pd.DataFrame()
    props: dict[int, dict] = {}
    dp = top.get("deviceProperties")
    if isinstance(dp, list):
        for i, d in enumerate(dp):
            if isinstance(d, dict):
                did = d.get("id", i)
                try:
                    props[int(did)] = d
                except (TypeError, ValueError):
                    continue
    rows = []
    for d in used:
        p = props.get(d, {})
        name = p.get("name")
        rows.append({"device": d, "name": name if isinstance(name, str) else None, "sm_count": p.get("numSms")})
    return pd.DataFrame(rows)


def _meta(top: dict[str, Any], is_array: bool, t0: float | None, n_events: int, skipped: dict[str, int],
          b: dict[str, list[dict]], unmatched: dict[str, int], dropped: int, process_names: dict[str, str],
          times: _Times) -> dict[str, Any]:
    meta: dict[str, Any] = {"tool": "pytorch-profiler", "container": "array" if is_array else "object",
                            "events": n_events}
    for k in ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "trace_id", "cupti_version",
              "cuda_runtime_version", "cuda_driver_version"):
        v = top.get(k)
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            meta[k] = v
    di = top.get("distributedInfo")
    if isinstance(di, dict):
        for k in ("rank", "world_size", "backend"):
            if isinstance(di.get(k), (str, int)):
                meta[k] = di[k]
    base = top.get("baseTimeNanoseconds")
    if t0 is None:
        meta["time_base"] = "none"
    else:
        meta["origin_us"] = t0
        t0_ns = _us_to_ns_exact(t0)
        if t0 >= _EPOCH_US_THRESHOLD:
            meta["time_base"] = "epoch"
            meta["origin_ns_epoch"] = t0_ns
        elif isinstance(base, int) and not isinstance(base, bool):
            meta["time_base"] = "baseTimeNanoseconds"
            meta["origin_ns_epoch"] = base + t0_ns
        else:
            meta["time_base"] = "unknown"
            meta["origin_ns_epoch"] = None
        if b["trace"]:
            s, e, valid = times.ns("trace", t0)
            if valid[0]:
                meta["profiler_window_ns"] = [int(s[0]), int(e[0])]
    meta["unmatched_gpu_events"] = int(sum(unmatched.get(k, 0) for k in ("kernel", "memcpy", "memset")))
    meta["unmatched_gpu_events_by_table"] = {
        t: unmatched.get(k, 0) for t, k in (("kernels", "kernel"), ("memcpys", "memcpy"), ("memsets", "memset"))
    }
    if skipped:
        meta["skipped_categories"] = dict(sorted(skipped.items()))
    if dropped:
        meta["dropped_events_without_ts"] = dropped
    if process_names:
        meta["process_names"] = process_names
    return meta


def _us_to_ns_exact(us: float) -> int:
    """µs -> ns without the float64 loss of ``us * 1000`` at epoch magnitudes."""
    whole = int(us // 1)
    return whole * 1000 + int(round((us - whole) * 1000.0))
