"""Seeded mutants of the project's own fixtures and what the reference readers (Python's
sqlite3 by full scans, the standard library's json) read from them: the fuzz suite
(``test_fuzz_loaders.py``) holds the loaders to "the reference's numbers, or exit 2 in
one line". Nothing here calls the code under test."""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import struct
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

#: per nsys table: the trace table it becomes, a (column, kept values) filter, and the
#: (export column, trace column) pairs whose count and sum are compared
NSYS_TABLES: dict[str, tuple[str, tuple[str, tuple[int, ...]] | None, tuple[tuple[str, str], ...]]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("kernels", None, (("start", "start"), ("end", "end"), ("deviceId", "device"),
                                                     ("streamId", "stream"), ("correlationId", "correlation"),
                                                     ("gridX", "grid_x"), ("blockX", "block_x"))),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("memcpys", None, (("start", "start"), ("end", "end"), ("bytes", "bytes"),
                                                     ("deviceId", "device"), ("streamId", "stream"))),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("memsets", None, (("start", "start"), ("end", "end"), ("bytes", "bytes"))),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ("syncs", None, (("start", "start"), ("end", "end"),
                                                            ("streamId", "stream"))),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("api", ("eventClass", (0, 1)), (("start", "start"), ("end", "end"),
                                                                    ("correlationId", "correlation"))),
    "NVTX_EVENTS": ("ranges", ("eventType", (59, 60)), (("start", "start"),)),
}


class NotIntegers(Exception):
    """The reference read a value that is not an integer where the loader wants one."""


def nsys_reference(path: Path) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Per trace table: (rows, per compared column the sum of its non-NULL values), by a
    full scan of each table through sqlite3 (raises sqlite3.Error where it cannot read,
    :class:`NotIntegers` where a compared value is text, a blob or a fraction)."""
    out = {}
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for t, (name, filt, pairs) in NSYS_TABLES.items():
            if t not in tables:
                continue
            have = {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}
            cols = [c for c, _ in pairs if c in have]
            sel = ", ".join(f'"{c}"' for c in cols + ([filt[0]] if filt else []))
            n, sums = 0, [0] * len(cols)
            for row in con.execute(f'SELECT {sel} FROM "{t}"'):
                if filt and row[-1] not in filt[1]:
                    continue
                n += 1
                for i, v in enumerate(row[:len(cols)]):
                    if v is None:
                        continue
                    if type(v) is not int:
                        raise NotIntegers(f"{t}.{cols[i]} = {v!r}")
                    sums[i] += v
            if n:
                out[name] = (n, tuple(sums))
    return out


def nsys_summary(trace: Any) -> dict[str, tuple[int, tuple[int, ...]]]:
    """The same summary of a loaded trace (its tables, NULLs left out of the sums)."""
    out = {}
    for _t, (name, _, pairs) in NSYS_TABLES.items():
        df = getattr(trace, name)
        if df is None or not len(df):  # (an absent table and an empty one alike)
            continue
        sums = []
        for _, col in pairs:
            if col in df.columns:
                sums.append(sum(int(v) for v in df[col].dropna()))
        out[name] = (len(df), tuple(sums))
    return out


def btree_pages(data: bytes, root: int) -> tuple[list[int], list[int]]:
    """(interior pages, leaf pages) of the table b-tree at ``root``, walked in Python."""
    psz = struct.unpack(">H", data[16:18])[0] or 65536
    psz = 65536 if psz == 1 else psz
    inner, leaves, todo, seen = [], [], [root], set()
    while todo:
        pg = todo.pop()
        if pg in seen or not 1 <= pg <= len(data) // psz:
            continue
        seen.add(pg)
        base = (pg - 1) * psz
        h = base + (100 if pg == 1 else 0)
        kind, n = data[h], struct.unpack(">H", data[h + 3:h + 5])[0]
        if kind == 13:
            leaves.append(pg)
        elif kind == 5:
            inner.append(pg)
            for i in range(n):
                ptr = struct.unpack(">H", data[h + 12 + 2 * i:h + 14 + 2 * i])[0]
                todo.append(struct.unpack(">I", data[base + ptr:base + ptr + 4])[0])
            todo.append(struct.unpack(">I", data[h + 8:h + 12])[0])
    return inner, leaves


def nsys_mutant(clean: bytes, roots: list[int], rng: random.Random) -> bytes:
    """One seeded mutant: bytes, a 16-byte run, a child pointer or a cell pointer of a big
    table's pages overwritten, or a byte anywhere after the file header."""
    data = bytearray(clean)
    psz = struct.unpack(">H", clean[16:18])[0]
    psz = 65536 if psz == 1 else psz
    inner, leaves = btree_pages(clean, rng.choice(roots))
    kind = rng.choice(["bytes", "run16", "child", "cellptr", "anywhere"])
    if kind == "child" and inner:
        pg = rng.choice(inner)
        h = (pg - 1) * psz + (100 if pg == 1 else 0)
        n = struct.unpack(">H", clean[h + 3:h + 5])[0]
        target = rng.choice([rng.choice(leaves), rng.choice(inner), rng.randrange(1, len(clean) // psz + 3)])
        if n and rng.random() < 0.7:
            ptr = struct.unpack(">H", clean[h + 12 + 2 * (i := rng.randrange(n)):h + 14 + 2 * i])[0]
            data[(pg - 1) * psz + ptr:(pg - 1) * psz + ptr + 4] = struct.pack(">I", target)
        else:
            data[h + 8:h + 12] = struct.pack(">I", target)
    elif kind == "cellptr" and leaves:
        pg = rng.choice(leaves)
        h = (pg - 1) * psz + (100 if pg == 1 else 0)
        n = struct.unpack(">H", clean[h + 3:h + 5])[0]
        if n:
            i = rng.randrange(n)
            data[h + 8 + 2 * i:h + 10 + 2 * i] = struct.pack(">H", rng.choice([psz - 1, psz - 2, rng.randrange(psz),
                                                                               rng.randrange(65536)]))
    elif kind == "anywhere":
        data[rng.randrange(100, len(data))] = rng.randrange(256)
    else:
        pg = rng.choice(leaves + inner)
        base = (pg - 1) * psz
        if kind == "run16":
            at = base + rng.randrange(psz - 16)
            data[at:at + 16] = bytes(rng.randrange(256) for _ in range(16))
        else:
            for _ in range(rng.choice([1, 2, 4, 8])):
                data[base + rng.randrange(psz)] = rng.randrange(256)
    return bytes(data)


# --- Kineto -------------------------------------------------------------------------------

KINETO_BUCKETS = {"kernel": "kernels", "Kernel": "kernels", "gpu_memcpy": "memcpys", "Memcpy": "memcpys",
                  "gpu_memset": "memsets", "Memset": "memsets", "cuda_runtime": "api", "Runtime": "api",
                  "cuda_driver": "api"}


class OutOfRange(Exception):
    """A ts or dur the reference reads that is not a finite number of int64 nanoseconds."""


def exact_ns(v: Any) -> int | None:
    """µs as JSON has them -> integer ns exactly (the number's own decimal digits, rounded
    half to even at the ns); None for a missing or non-numeric value; raises
    :class:`OutOfRange` for non-finite values and values beyond int64 ns."""
    if isinstance(v, str):  # a number given as text is read as one (as Python reads it: " 7", "+7")
        try:
            v = Decimal(v)
        except InvalidOperation:
            return None
        if v.is_nan():  # the text "nan": no number (Python's float reads NaN: missing)
            return None
    if v is None or not isinstance(v, (int, float, Decimal)):  # (a bool is an int: True is 1)
        return None
    if isinstance(v, float):  # only NaN / Infinity reach here (parse_float=Decimal)
        raise OutOfRange(repr(v))
    try:
        ns = int((Decimal(v) * 1000).to_integral_value(rounding="ROUND_HALF_EVEN"))
    except (InvalidOperation, OverflowError):
        raise OutOfRange(str(v)) from None
    if not -(2**63) <= ns < 2**63:
        raise OutOfRange(str(v))
    return ns


def kineto_reference(text: bytes) -> dict[str, tuple[int, int, int]]:
    """Per trace table (kernels, memcpys, memsets, api): (rows, sum of start ns, sum of
    duration ns) of the complete events with a ``ts``, from the stdlib json (exact
    decimals); ``start`` counts from the earliest ``ts`` of the loaded categories."""
    doc = json.loads(text, parse_float=Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    rows: dict[str, list[tuple[int, int]]] = {}
    t0 = None
    from recsys_doctor.loaders._kineto_columns import BUCKET_OF_CAT  # the category names (a table, not logic)

    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("cat") not in BUCKET_OF_CAT:
            continue
        if BUCKET_OF_CAT[e["cat"]] == "trace":
            continue
        ts = exact_ns(e.get("ts"))
        dur = exact_ns(e.get("dur"))
        if ts is None:
            continue
        t0 = ts if t0 is None else min(t0, ts)
        if e["cat"] in KINETO_BUCKETS:
            rows.setdefault(KINETO_BUCKETS[e["cat"]], []).append((ts, max(dur or 0, 0)))
    out = {}
    for name, r in rows.items():
        out[name] = (len(r), sum(ts - t0 for ts, _ in r), sum(d for _, d in r))
    return out


def kineto_summary(trace: Any) -> dict[str, tuple[int, int, int]]:
    out = {}
    for name in ("kernels", "memcpys", "memsets", "api"):
        df = getattr(trace, name)
        if df is None or not len(df):
            continue
        s = [int(v) for v in df["start"]]
        e = [int(v) for v in df["end"]]
        out[name] = (len(df), sum(s), sum(b - a for a, b in zip(s, e)))
    return out


#: values a hostile or broken profiler might write for a number
HOSTILE_NUMBERS = ["Infinity", "-Infinity", "NaN", "1e308", "1e29", "1e19", "-1e19", "9.3e15", "1.5e3",
                   "-5", "0", "\"12\"", "null", "true", "[]", "{}", "\"abc\"", "1e-7", "123.4567"]
HOSTILE_STRINGS = ['"\\ud800"', '"\\udfff x"', '""', '"\\u0000"', "123", "null", '"a\\nb"']


def kineto_sample(text: bytes, every: int) -> bytes:
    """Every ``every``-th event of a Kineto text laid out one event object after another
    (``  {`` ... ``  },``), each event's text kept as it is: a smaller fixture of the same kind."""
    head, _, rest = text.partition(b'"traceEvents": [')
    body, _, _ = rest.rpartition(b"]")
    events = body.strip().removesuffix(b"}").split(b"},\n  {")
    kept = events[::every]
    return head + b'"traceEvents": [\n' + b"},\n  {".join(kept) + b"}\n]}\n"


def kineto_mutant(clean: bytes, rng: random.Random) -> bytes:
    """One seeded mutant of a Kineto JSON text: a ts/dur replaced by a hostile number, a
    name by a hostile string, a nested ``traceEvents`` key placed first, or bytes changed."""
    kind = rng.choice(["ts", "dur", "name", "nested", "bytes", "ts", "dur"])
    if kind in ("ts", "dur", "name"):
        key = f'"{kind}": '.encode()
        hits = []
        at = clean.find(key)
        while at >= 0 and len(hits) < 4000:
            hits.append(at)
            at = clean.find(key, at + 1)
        if not hits:
            return clean
        at = rng.choice(hits) + len(key)
        end = at
        if clean[at:at + 1] == b'"':
            end = clean.index(b'"', at + 1) + 1
            while clean[end - 2:end - 1] == b"\\":  # an escaped quote: go on
                end = clean.index(b'"', end) + 1
        else:
            while clean[end:end + 1] not in (b",", b"}", b"\n", b" "):
                end += 1
        new = rng.choice(HOSTILE_STRINGS if kind == "name" else HOSTILE_NUMBERS).encode()
        return clean[:at] + new + clean[end:]
    if kind == "nested":
        i = clean.index(b"{") + 1
        return clean[:i] + b'"distributedInfo": {"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1}]},' \
            + clean[i:]
    data = bytearray(clean)
    for _ in range(rng.choice([1, 2, 5])):
        data[rng.randrange(len(data))] = rng.choice(b'{}[],:"0123456789.eE-+ ntruefalsIiyNa\\')
    return bytes(data)
