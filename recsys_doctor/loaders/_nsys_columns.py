"""Whole-column decoding for the nsys loader: ids, string references, enums, categoricals.

Nothing here works per row in Python: ``globalTid``/``globalPid`` are split with numpy bit
arithmetic, ``StringIds`` references become codes by an offset (or a binary search), and
string columns become pandas categoricals through a lookup table over the distinct values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["Strings", "text_codes", "categorical", "enum_codes", "coalesce", "decode_ids",
           "distinct_threads", "nesting_depth", "release_free_memory", "Codes"]

#: a string column not yet made categorical: codes into an array of values (None = missing)
Codes = tuple[np.ndarray, np.ndarray]


def text_codes(s: pd.Series) -> Codes:
    """(codes, values) of a column of text values (None = missing)."""
    if not len(s) or not s.notna().any():
        return np.full(len(s), -1, dtype=np.int64), np.zeros(0, dtype=object)
    codes, uniq = pd.factorize(s.astype(object))
    return codes.astype(np.int64), np.asarray(uniq, dtype=object)


def coalesce(a: Codes, b: Codes) -> Codes:
    """SQL ``COALESCE`` of two (codes, values) string columns."""
    ca, va = a
    cb, vb = b
    if not len(va):
        return cb, vb
    if not len(vb):
        return ca, va
    present = np.append(np.array([v is not None for v in va], dtype=bool), False)
    if va is vb:  # two references into the same table: no need to append the values
        return np.where(present[ca], ca, cb), va
    codes = np.where(present[ca], ca, np.where(cb >= 0, cb + len(va), -1))
    return codes, np.concatenate([va, vb])


def categorical(codes: np.ndarray, values: np.ndarray) -> pd.Categorical:
    """A pandas categorical from codes into ``values`` (which may repeat and hold None).

    Categories are the distinct values used, sorted (so sorting the column orders it as
    the plain strings would); work is per row only in numpy (``bincount``, one ``take``)."""
    n_val = len(values)
    codes = np.asarray(codes)
    if codes.dtype.kind not in "iu":
        codes = codes.astype(np.int64)
    if n_val == 0 or not len(codes) or codes.max() < 0:
        return pd.Categorical.from_codes(np.full(len(codes), -1, dtype=np.int8), categories=[])
    # (no mask and no copy when every row has a value: the usual case)
    used = np.flatnonzero(np.bincount(codes if codes.min() >= 0 else codes[codes >= 0], minlength=n_val))
    vals = [values[i] for i in used]
    distinct = {v for v in vals if v is not None and not (isinstance(v, float) and v != v)}
    try:
        cats = sorted(distinct)
    except TypeError:  # mixed types (never in a real export): first-seen order
        cats = list(dict.fromkeys(v for v in vals if v in distinct))
    index = {v: i for i, v in enumerate(cats)}
    # the codes come out in the narrowest type pandas keeps them in, checked here: the
    # lookup table holds only -1 and category numbers
    lut: np.ndarray = np.full(n_val + 1, -1, dtype=_code_dtype(len(cats)))  # the extra last slot maps code -1
    lut[used] = [index.get(v, -1) if v in distinct else -1 for v in vals]
    return pd.Categorical.from_codes(lut[codes], categories=pd.Index(cats, dtype=object), validate=False)


def _code_dtype(n: int) -> type:
    """The integer type pandas stores the codes of ``n`` categories in."""
    for t in (np.int8, np.int16, np.int32):
        if n < np.iinfo(t).max:
            return t
    return np.int64


def enum_codes(col: pd.Series | None, names: dict[int, str], default: str | None, n: int) -> Codes:
    """SQL ``CASE col WHEN k THEN names[k] ... ELSE default END`` as (codes, values)
    (``col`` None: the column is absent, every row is ``default``)."""
    if col is None:
        return np.zeros(n, dtype=np.int64), np.array([default], dtype=object)
    v = col.to_numpy() if col.dtype == np.int64 else None
    if v is not None and len(v) and 0 <= v.min() and v.max() < 1024:  # small codes: a lookup table
        return v, np.array([names.get(i, default) for i in range(int(v.max()) + 1)], dtype=object)
    codes, uniq = pd.factorize(pd.to_numeric(col), use_na_sentinel=True)
    values = [names.get(int(u), default) if float(u).is_integer() else default for u in uniq] + [default]
    return np.where(codes < 0, len(uniq), codes), np.array(values, dtype=object)


class Strings:
    """The export's ``StringIds`` table, and the lookups of the columns that refer to it."""

    def __init__(self, ids: np.ndarray, values: np.ndarray) -> None:
        self.ids = ids
        self.values = values
        #: every export seen numbers its strings 0..n-1 (or from some base, densely)
        self.dense = bool(ids.size) and int(ids[-1] - ids[0]) == ids.size - 1

    def codes(self, iv: np.ndarray) -> np.ndarray:
        """Positions in the table of integer ids (-1 for an unknown id)."""
        sid = self.ids
        if self.dense:
            pos = iv - sid[0]
            return np.where((pos >= 0) & (pos < sid.size), pos, -1)
        pos = np.searchsorted(sid, iv)
        pos_c = np.minimum(pos, sid.size - 1)
        return np.where((iv >= 0) & (pos < sid.size) & (sid[pos_c] == iv), pos_c, -1)

    def resolve(self, raw: pd.Series) -> Codes:
        """(codes, values) of a reference column: an id is looked up (unknown ids ->
        missing); a text value (some post-processing tools write the text in place) is
        used as is."""
        if raw.dtype == np.int64:  # the usual case: ids only, no NULL
            return (self.codes(raw.to_numpy()) if self.ids.size else np.full(len(raw), -1, np.int64)), self.values
        txt = None
        if raw.dtype == object or str(raw.dtype) == "str":  # text, or ids and text mixed
            is_txt = raw.map(lambda v: isinstance(v, str)).to_numpy(dtype=bool)
            txt = raw.where(is_txt, None).astype(object)
            raw = pd.to_numeric(raw.where(~is_txt, None), errors="coerce")
        codes = np.full(len(raw), -1, dtype=np.int64)
        if self.ids.size and raw.notna().any():
            codes = self.codes(pd.to_numeric(raw).fillna(-1).to_numpy(dtype=np.int64))
        if txt is None:
            return codes, self.values
        return coalesce(text_codes(txt), (codes, self.values))


def _split_global_id(v: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``globalTid``/``globalPid`` (``vid << 48 | pid << 24 | tid``) -> (pid, tid); a
    missing id (NULL) gives 0 for both."""
    if v.dtype == np.int64:
        g = v.to_numpy()
        return (g >> 24) & 0xFFFFFF, g & 0xFFFFFF
    v = pd.to_numeric(v, errors="coerce")
    ok = v.notna().to_numpy()
    g = v.fillna(0).to_numpy().astype(np.int64)
    return np.where(ok, (g >> 24) & 0xFFFFFF, 0), np.where(ok, g & 0xFFFFFF, 0)


def decode_ids(df: pd.DataFrame) -> pd.DataFrame:
    """Raw nsys columns -> canonical ones, whole-column: ``gp_raw`` (globalPid) -> ``pid``;
    ``gt_raw`` (globalTid) -> ``pid``, ``tid``; ``ig_raw`` (graphNodeId) -> ``in_graph``
    (set and non-zero)."""
    if "gp_raw" in df.columns:
        df.insert(2, "pid", _split_global_id(df.pop("gp_raw"))[0])
    if "gt_raw" in df.columns:
        pid, tid = _split_global_id(df.pop("gt_raw"))
        df.insert(2, "pid", pid)
        df.insert(3, "tid", tid)
    if "ig_raw" in df.columns:
        v = df.pop("ig_raw")
        if v.dtype == np.int64:
            df["in_graph"] = v.to_numpy() != 0
        elif isinstance(v.dtype, pd.Int64Dtype):  # some NULLs (not in a graph)
            df["in_graph"] = v.fillna(0).to_numpy(np.int64) != 0
        elif v.dtype == object and v.isna().all():  # all NULL: a column of None, no number to parse
            df["in_graph"] = np.zeros(len(v), bool)
        else:
            v = pd.to_numeric(v, errors="coerce")
            df["in_graph"] = (v.notna() & (v != 0)).to_numpy(dtype=bool)
    return df


def distinct_threads(df: pd.DataFrame) -> pd.DataFrame:
    """The distinct non-null (pid, tid) pairs of a table, as int64 columns."""
    if all(df[c].dtype.kind in "iu" for c in ("pid", "tid")):  # no nulls to drop: no copy of the table
        t = df[["pid", "tid"]]
        p = df["pid"].to_numpy(dtype=np.int64)
        q = df["tid"].to_numpy(dtype=np.int64)
    else:
        t = df[["pid", "tid"]].dropna()
        p = pd.to_numeric(t["pid"]).to_numpy(dtype=np.int64)
        q = pd.to_numeric(t["tid"]).to_numpy(dtype=np.int64)
    if len(p) and (p.min() < -(1 << 30) or p.max() >= 1 << 30 or q.min() < -(1 << 31) or q.max() >= 1 << 31):
        return t.astype("int64").drop_duplicates()  # ids beyond 32 bits: the general way
    k = p * (1 << 32) + (q & 0xFFFFFFFF)
    if len(k) > 1:  # a call's thread is mostly the previous call's: hash only where it changes
        k = k[np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))]
    k = pd.unique(k)  # a hash pass, no sort
    lo = k & 0xFFFFFFFF
    return pd.DataFrame({"pid": (k - lo) >> 32, "tid": np.where(lo >= 1 << 31, lo - (1 << 32), lo)})


def nesting_depth(df: pd.DataFrame) -> np.ndarray:
    """Nesting level of each range on its ``(pid, tid)``: how many other ranges of the
    same thread are open when it starts (0 = outermost).

    One sort over start/end events and a cumulative sum, no Python loop: each range adds
    +1 at its start and -1 at its end; per thread the running sum returns to 0, so one
    global cumsum is correct once events are grouped by thread. At equal timestamps ends
    close before starts (adjacent ranges are siblings), longer ranges open first (the
    parent), and a zero-length range closes after the starts at its timestamp."""
    n = len(df)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    grp = pd.factorize(pd.MultiIndex.from_arrays([df["pid"].to_numpy(), df["tid"].to_numpy()]))[0]
    start = df["start"].to_numpy(dtype=np.int64)
    end = df["end"].to_numpy(dtype=np.int64)
    end = np.maximum(end, start)
    zero = end == start
    g = np.concatenate([grp, grp])
    t = np.concatenate([start, end])
    # order at equal (thread, time): 0 = end of a non-empty range, 1 = start, 2 = end of an empty one
    phase = np.concatenate([np.ones(n, dtype=np.int8), np.where(zero, 2, 0).astype(np.int8)])
    longer_first = np.concatenate([-end, np.zeros(n, dtype=np.int64)])
    order = np.lexsort((longer_first, phase, t, g))
    delta = np.concatenate([np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)])[order]
    running = np.cumsum(delta)
    is_start = order < n
    depth = np.empty(n, dtype=np.int64)
    depth[order[is_start]] = running[is_start] - 1
    return depth


def release_free_memory() -> None:
    """Hand freed memory back to the system (Arrow's pool, glibc's heap), so the analysis
    starts from the size of the trace, not of the peak of the load."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except ImportError:  # pragma: no cover - a dependency
        pass
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def as_int(v: Any) -> int | None:
    """An integer from a database value, None for NULL/NaN/text."""
    try:
        if v is None or pd.isna(v):
            return None
        return int(v)
    except (TypeError, ValueError):
        return None


def as_str(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return str(v)
