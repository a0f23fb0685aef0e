"""Decoded Kineto events -> numpy columns per category, one batch at a time.

Each batch of structs is split by category with a few C-level passes (``map`` with
``attrgetter`` / ``dict.get``, numpy masks) and only the fields its tables need are kept,
as float64 numbers, int64 ns (``ts``/``dur``, :mod:`._kineto_time`) or int32 codes into
one shared string table; the structs are then
dropped. No dict and no Python loop per event: memory follows the kept columns.

pandas is imported only by the rare fallbacks (values that are not numbers, unhashable
names): a process that only decodes (the forked helper of
:mod:`~recsys_doctor.loaders._kineto_decode`, started before the rest of the program is
imported) needs numpy alone.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from ._kineto_decode import EMPTY_ARGS, Complete, Event, Metadata
from ._kineto_time import BadTime, ns_of

# Kineto category -> our bucket. Legacy (torch <= 1.9) and modern spellings share a bucket.
BUCKET_OF_CAT: dict[str, str] = {
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
BUCKETS = ("kernel", "memcpy", "memset", "runtime", "driver", "sync", "cpu_op", "user_annotation", "trace")
_CODE_OF_CAT = {cat: BUCKETS.index(b) for cat, b in BUCKET_OF_CAT.items()}
_GPU = ("device", "stream", "correlation")

#: per bucket, the numeric ``args`` fields, the string ones and the 3-vectors it keeps
ARG_NUMBERS: dict[str, tuple[str, ...]] = {
    "kernel": _GPU, "memcpy": (*_GPU, "bytes"), "memset": (*_GPU, "bytes"), "sync": _GPU,
    "runtime": ("correlation",), "driver": ("correlation",),
}
ARG_STRINGS: dict[str, tuple[str, ...]] = {"memcpy": ("kind",), "sync": ("cuda_sync_kind",)}
ARG_DIM3: dict[str, tuple[str, ...]] = {"kernel": ("grid", "block")}
#: the columns that hold codes into :class:`Strings`
STRING_FIELDS = frozenset({"name", *(f for fs in ARG_STRINGS.values() for f in fs)})

_PH, _CAT, _ARGS = attrgetter("ph"), attrgetter("cat"), attrgetter("args")
_PH_CODE = {"X": 1, "M": 2}
_PH_CODE_OF_TYPE: dict[type[Any], int] = {Complete: 1, Metadata: 2}  # events decoded by phase
_NAME = attrgetter("name")
_FIELD_OF = {f: attrgetter(f) for f in ("pid", "tid")}
_TIME_OF = {f: attrgetter(f) for f in ("ts", "dur")}
#: the columns that hold int64 ns (:mod:`._kineto_time`), not float64
TIME_FIELDS = frozenset(_TIME_OF)
_ARG_OF = {f: attrgetter(f) for f in ("device", "stream", "correlation", "bytes", "kind", "cuda_sync_kind",
                                      "grid", "block")}
_ARG_IN = {f: attrgetter(f"args.{f}") for f in _ARG_OF}  # the same, read from the event
# CUPTI writes "no stream" as an unsigned -1 in some builds (Context Sync: 4294967295).
_UNSIGNED_MINUS_ONE = (4294967295.0, 18446744073709551615.0)


class Strings:
    """One table of the distinct strings (names, copy kinds...) seen; columns hold int32
    codes into it, -1 where the value is missing."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.values: list[Any] = []

    def codes(self, vals: list[Any]) -> np.ndarray:
        """Codes of ``vals``, each new value added in the order met; None and NaN are
        missing (-1), as :func:`pandas.factorize` has them."""
        index = self.index
        met = dict.fromkeys(vals)  # the distinct values in the order met (TypeError: unhashable)
        for v in met:
            if v not in index and v is not None and v == v:  # v != v: NaN
                index[v] = len(self.values)
                self.values.append(printable(v))
        return np.fromiter(map(index.get, vals, repeat(-1)), dtype=np.int32, count=len(vals))

    def remap(self, values: Sequence[Any]) -> np.ndarray:
        """This table's code of each of ``values`` (each new one added, in order), with -1
        appended: index it with codes into ``values`` (-1 for missing) to get codes into
        this table."""
        remap = np.empty(len(values) + 1, dtype=np.int32)
        remap[-1] = -1
        for i, u in enumerate(values):
            c = self.index.get(u)
            if c is None:
                c = self.index[u] = len(self.values)
                self.values.append(printable(u))
            remap[i] = c
        return remap

    def codes_of(self, get: Callable[[Any], Any], items: Sequence[Any]) -> np.ndarray:
        """:meth:`codes` of ``get(item)`` for every item; when every value is already in the
        table (all but the first batches of a trace), by one dict lookup per item."""
        try:
            return np.fromiter(map(self.index.get, map(get, items)), dtype=np.int32, count=len(items))
        except (TypeError, ValueError):  # a new or missing value (None: not an int), or unhashable
            return self.codes(list(map(get, items)))


_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(v: Any) -> Any:
    """``v``, with a lone surrogate (``"\\ud800"``: JSON allows it, UTF-8 does not) of a
    string replaced by U+FFFD, so that every report can write the name."""
    if isinstance(v, str) and not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", v)
    return v


class EventColumns:
    """The sink the decoder feeds: per bucket, lists of per-batch column arrays."""

    def __init__(self, strings: Strings | None = None) -> None:
        #: the string table; sinks of one process may share one (:meth:`merge` then keeps
        #: the codes as they are)
        self.strings = Strings() if strings is None else strings
        self.parts: dict[str, dict[str, list[np.ndarray]]] = {b: {} for b in BUCKETS}
        self.meta_events: list[Event] = []
        self.skipped: Counter[str] = Counter()
        self.n_events = 0

    def __call__(self, evs: Sequence[Event]) -> None:
        n = len(evs)
        self.n_events += n
        if not n:
            return
        if type(evs[0]) is Event:  # a batch is all Event or all decoded by phase
            ph = np.fromiter(map(_PH_CODE.get, map(_PH, evs), repeat(0)), dtype=np.int8, count=n)
        else:
            ph = np.fromiter(map(_PH_CODE_OF_TYPE.get, map(type, evs), repeat(0)), dtype=np.int8, count=n)
        self.meta_events.extend(_take(evs, np.flatnonzero(ph == 2)))
        xs = _take(evs, np.flatnonzero(ph == 1))  # only complete events are loaded
        code = np.fromiter(map(_CODE_OF_CAT.get, map(_CAT, xs), repeat(-1)), dtype=np.int8, count=len(xs))
        unknown = np.flatnonzero(code == -1)
        if len(unknown):
            self.skipped.update(map(str, map(_CAT, _take(xs, unknown))))
        order = np.argsort(code, kind="stable")
        bounds = np.searchsorted(code[order], np.arange(len(BUCKETS) + 1))
        for b, bucket in enumerate(BUCKETS):
            if bounds[b + 1] > bounds[b]:
                self._add(bucket, _take(xs, order[bounds[b]:bounds[b + 1]]))

    def _add(self, bucket: str, evs: Sequence[Event]) -> None:
        cols = {f: num_of(get, evs) for f, get in _FIELD_OF.items()}
        try:
            cols |= {f: ns_of(get, evs, f) for f, get in _TIME_OF.items()}
        except BadTime as e:
            ev = evs[e.index]
            raise BadTime(e.index, f"trace event {printable(_NAME(ev))!r} (cat {_CAT(ev)}): {e.field}",
                          e.value) from None
        cols["name"] = self.strings.codes_of(_NAME, evs)
        if bucket in ARG_NUMBERS:
            try:  # straight from the events ("args.device")
                cols |= self._args(bucket, evs, _ARG_IN)
            except AttributeError:  # "args": null in this batch (raised by the first field)
                args = [EMPTY_ARGS if a is None else a for a in map(_ARGS, evs)]
                cols |= self._args(bucket, args, _ARG_OF)
        parts = self.parts[bucket]
        for k, v in cols.items():
            parts.setdefault(k, []).append(v)

    def _args(self, bucket: str, items: Sequence[Any], getters: Mapping[str, Callable[[Any], Any]]) -> dict[str, Any]:
        cols = {f: num_of(getters[f], items) for f in ARG_NUMBERS[bucket]}
        for f in ARG_STRINGS.get(bucket, ()):
            cols[f] = self.strings.codes_of(getters[f], items)
        for f in ARG_DIM3.get(bucket, ()):
            for axis, col in zip("xyz", dim3(list(map(getters[f], items)))):
                cols[f"{f}_{axis}"] = col
        return cols

    def export(self) -> dict[str, Any]:
        """Everything this sink kept, picklable, for :meth:`merge` in another process."""
        return {"values": self.strings.values, "parts": self.parts, "meta_events": self.meta_events,
                "skipped": dict(self.skipped), "n_events": self.n_events}

    def merge(self, other: dict[str, Any], remaps: dict[int, np.ndarray] | None = None) -> None:
        """Append what another sink (:meth:`export`) kept of the events that follow this
        sink's. Its string codes are renumbered into this sink's table (new strings take
        the next codes, in the order the other sink's table has them), unless both share
        one table. ``remaps`` caches the renumbering per table (sinks of one process share
        a table: it is worked out once for all of them). The tables made from the columns
        do not depend on how the strings are numbered (categoricals list them sorted)."""
        values = other["values"]
        remap = None
        if values is not self.strings.values:
            remap = None if remaps is None else remaps.get(id(values))
            if remap is None:
                remap = self.strings.remap(values)
                if remaps is not None:
                    remaps[id(values)] = remap
        for bucket, cols in other["parts"].items():
            mine = self.parts[bucket]
            for f, arrays in cols.items():
                mine.setdefault(f, []).extend(
                    [remap[a] for a in arrays] if remap is not None and f in STRING_FIELDS else arrays)
        self.meta_events.extend(other["meta_events"])
        self.skipped.update(other["skipped"])
        self.n_events += other["n_events"]

    def column(self, bucket: str, field: str) -> np.ndarray:
        """The whole column (all batches); empty float64 when the bucket had no event."""
        parts = self.parts[bucket].get(field)
        if not parts:
            return np.empty(0, dtype=np.int64 if field in TIME_FIELDS else np.float64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def size(self, bucket: str) -> int:
        return sum(len(p) for p in self.parts[bucket].get("ts", []))


def _take(evs: Sequence[Event], idx: np.ndarray) -> Sequence[Event]:
    if len(idx) == 0:
        return ()
    if len(idx) == 1:
        return (evs[int(idx[0])],)
    return itemgetter(*idx.tolist())(evs)


def num_of(get: Callable[[Any], Any], items: Sequence[Any]) -> np.ndarray:
    """:func:`num` of ``get(item)`` for every item: numbers go straight into the array
    (three times faster than through a list), anything else through :func:`num`."""
    try:
        return np.fromiter(map(get, items), dtype=np.float64, count=len(items))
    except (TypeError, ValueError):
        return num(list(map(get, items)))


def num(values: list[Any]) -> np.ndarray:
    """float64 array of numbers given as int, float, numeric string, ``"stream 7"``;
    NaN where unknown. float64 is exact for every id and µs value below 2**53."""
    try:
        a = np.array(values, dtype=np.float64)
        if a.ndim == 1:
            return a
    except (TypeError, ValueError):
        pass
    # text that cannot hold a number (the profiler span's "pid": "Spans") is missing, as
    # the general way below has it; pandas is not needed for that
    if all(v is None or type(v) in (int, float) or (type(v) is str and _no_number_in(v)) for v in values):
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            return np.array([None if type(v) is str else v for v in values], dtype=np.float64)
    import pandas as pd

    s = pd.Series(values, dtype=object)
    s = s.where(s.map(lambda v: isinstance(v, (int, float, str))), None)
    out = pd.to_numeric(s, errors="coerce")
    bad = out.isna() & s.map(lambda v: isinstance(v, str))
    if bad.any():
        out[bad] = pd.to_numeric(s[bad].str.extract(r"^\D*?(-?\d+)\s*$")[0], errors="coerce")
    return out.to_numpy(dtype=np.float64, na_value=np.nan)


def _no_number_in(text: str) -> bool:
    """No digit of any script, no "inf" (which pandas reads as infinity)."""
    return not any(c.isnumeric() for c in text) and "inf" not in text.lower()


def int_col(a: np.ndarray, fill: int) -> np.ndarray:
    """float ids -> int64, unknown -> ``fill``; unsigned -1 (4294967295, 2**64-1) -> -1."""
    a = np.where(np.isin(a, _UNSIGNED_MINUS_ONE), -1.0, a)
    a = np.where(np.isfinite(a) & (np.abs(a) < 2.0**63), a, np.nan)
    return np.where(np.isnan(a), fill, a).astype(np.int64)


def dim3(vals: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``grid``/``block`` ``[x, y, z]`` lists as three float columns, NaN where absent or
    not a list of three (the table makes them nullable integers)."""
    try:
        a = np.array(vals, dtype=np.float64)
        if a.ndim == 2 and a.shape[1] == 3:
            return a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy()
    except (TypeError, ValueError):
        pass
    import pandas as pd

    ok = [v if isinstance(v, list) and len(v) == 3 else (None, None, None) for v in vals]
    return tuple(pd.to_numeric(pd.Series([v[i] for v in ok], dtype=object), errors="coerce")
                 .to_numpy(dtype=np.float64, na_value=np.nan) for i in range(3))  # type: ignore[return-value]
