"""The engines that run the nsys loader's big ``SELECT``s: the file's pages read directly
(:mod:`._sqlite_pages`) where a ``SELECT`` only picks integer columns of one table, ADBC
(Arrow) for the rest and for rows the page reader refuses, the standard library's sqlite3
as the last fallback.

The ADBC SQLite driver steps SQLite and builds Arrow buffers in C without holding the
GIL, so two reads on two connections use two cores; integer columns come out of Arrow
as numpy arrays without a copy (each read is one Arrow batch). README "Why this engine"
has the measurements against sqlite3, connectorx, Polars and DuckDB.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ._nsys_file import one_line

__all__ = ["Engine", "BadValue", "adbc_available", "TEXT_COLUMNS", "PlainSelect", "plain_select", "page_frame"]

#: the only columns the big SELECTs return as text (NVTX's inline text); every other
#: column is an integer (an id, a code, a time)
TEXT_COLUMNS = ("tx_txt",)
#: StringIds references: an id, or the text itself (some post-processing tools write it)
_REFERENCES = ("dn", "sn", "nm", "ti")
_FROM_TABLE = re.compile(r"FROM (\w+) \w+")


class BadValue(Exception):
    """A value of a type no export holds where a number belongs (text in ``deviceId``):
    the loader refuses the file in one line naming the table and the column."""
#: rows per Arrow batch: more than a chunk of the loader, so a chunk is one batch and its
#: integer columns reach numpy without a copy
BATCH_ROWS = 1 << 21


def adbc_available() -> bool:
    try:
        import adbc_driver_sqlite.dbapi  # noqa: F401
    except ImportError:
        return False
    return True


def arrow_to_pandas(tab: Any) -> pd.DataFrame:
    """Arrow table -> pandas without float round trips: integer columns with nulls
    become nullable ``Int64``, text stays text. Columns are converted and released one
    at a time, so the peak is the Arrow table plus one column, not two full copies."""
    import pyarrow as pa

    cols = {}
    n = tab.num_rows
    for name in list(tab.column_names):
        col = tab.column(0)
        tab = tab.remove_column(0)
        if pa.types.is_null(col.type):
            cols[name] = pd.Series([None] * n, dtype=object)
        elif pa.types.is_integer(col.type):
            if col.null_count:
                cols[name] = pd.Series(col.to_pandas(types_mapper={col.type: pd.Int64Dtype()}.get), dtype="Int64")
            else:
                cols[name] = pd.Series(col.to_numpy(), dtype=np.int64, copy=False)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            cols[name] = pd.Series(col.to_numpy(zero_copy_only=False), dtype=object)
        else:
            cols[name] = col.to_pandas()
        del col
    return pd.DataFrame(cols, copy=False)


class Engine:
    """Runs a ``SELECT`` into a DataFrame: with ADBC on its own read-only connection (the
    caller runs two at a time in threads); with sqlite3 (``engine="sqlite3"``, or when ADBC
    refuses a query, e.g. a column whose values change type mid-table) through
    ``pandas.read_sql_query``."""

    def __init__(self, uri: str, engine: str) -> None:
        self.uri = uri
        self.engine = engine

    def run(self, sql: str) -> pd.DataFrame:
        if self.engine == "adbc":
            df = self._adbc(sql)
            if df is not None:
                return df
        with contextlib.closing(sqlite3.connect(self.uri, uri=True)) as con:
            return _numbers_checked(pd.read_sql_query(sql, con), sql)

    def _adbc(self, sql: str) -> pd.DataFrame | None:
        """The query through ADBC, or None where only sqlite3 reads it right."""
        import adbc_driver_manager
        import adbc_driver_sqlite.dbapi as dbapi
        import pyarrow as pa

        try:
            with dbapi.connect(self.uri) as c, c.cursor() as cur:
                cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
                cur.execute(sql)
                tab = cur.fetch_arrow_table()
        except adbc_driver_manager.Error as e:
            if "Type mismatch" not in str(e):
                raise sqlite3.DatabaseError(one_line(e)) from None
            return None
        # the reader types a column from its first batch and turns the integers of a
        # column that also holds text into strings ("3"): such a (rare) table is read
        # through sqlite3, which keeps each value's own type
        if any(pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
               for f in tab.schema if f.name not in TEXT_COLUMNS):
            return None
        try:
            return arrow_to_pandas(tab)
        except (pa.ArrowException, UnicodeDecodeError):  # text that is not UTF-8: sqlite3 words it
            return None


def _numbers_checked(df: pd.DataFrame, sql: str) -> pd.DataFrame:
    """``df`` (sqlite3 keeps each value's own type), refused with :class:`BadValue` where a
    column that holds numbers has text, a blob or a fraction in it."""
    for name in df.columns:
        col = df[name]
        if name in TEXT_COLUMNS or name in _REFERENCES or col.dtype.kind in "iub":
            continue
        if col.dtype.kind == "f":
            v = col.to_numpy()
            bad = ~np.isnan(v) & ((v != np.floor(v)) | (np.abs(v) >= 2.0**63))
            what = "a non-integer number"
        else:
            bad = col.map(lambda x: x is not None and not isinstance(x, int)).to_numpy(bool)
            what = "a value that is not an integer"
        if bad.any():
            m = _FROM_TABLE.search(sql)
            raise BadValue(f"{m.group(1) if m else 'a table'}: column {name} holds {what} "
                           f"({col[bad].iloc[0]!r}) where an integer belongs")
    return df


_SELECT = re.compile(r"^SELECT (.+) FROM (\w+) (\w+)$", re.DOTALL)
_ITEM = re.compile(r'^(?:(\w+)\.(?:"([^"]+)"|(\w+))|(NULL)|(-?\d+)) AS (?:"(\w+)"|(\w+))$')


@dataclass(frozen=True)
class PlainSelect:
    """A ``SELECT`` of one table's columns, renamed, and integer constants: what the page
    reader can answer. ``items``: (output name, column name or None, constant or None)."""

    table: str
    alias: str
    items: tuple[tuple[str, str | None, int | None], ...]


def plain_select(sql: str) -> PlainSelect | None:
    """``sql`` as a :class:`PlainSelect`, or None where it does anything else (a join, an
    expression, a filter)."""
    m = _SELECT.match(sql)
    if m is None:
        return None
    items = []
    for part in m.group(1).split(", "):
        it = _ITEM.match(part.strip())
        if it is None:
            return None
        alias, quoted, bare, null, const, out_q, out_b = it.groups()
        if alias is not None and alias != m.group(3):
            return None
        items.append((out_q or out_b, quoted or bare, None if null else (int(const) if const is not None else None)))
    if all(col is None for _, col, _ in items):  # constants only: no rows to count
        return None
    return PlainSelect(m.group(2), m.group(3), tuple(items))


def page_frame(sel: PlainSelect, position: dict[str, int], read: Any) -> pd.DataFrame:
    """The frame ADBC would return for ``sel``, from the page reader: ``position`` maps a
    column name to its place in the records, ``read(positions)`` returns {place: (int64
    values, NULL mask or None)}. Columns without NULLs are int64, with some NULLs nullable
    ``Int64``, all NULL (or a NULL constant) objects holding None, as in
    :func:`arrow_to_pandas`."""
    got = read(sorted({position[c] for _, c, _ in sel.items if c is not None}))
    n = len(next(iter(got.values()))[0])
    cols: dict[str, Any] = {}
    for out, col, const in sel.items:
        if col is not None:
            v, nulls = got[position[col]]
            if nulls is None:
                cols[out] = pd.Series(v, dtype=np.int64, copy=False)
            elif nulls.all():
                cols[out] = pd.Series([None] * len(v), dtype=object)
            else:
                cols[out] = pd.Series(pd.arrays.IntegerArray(v, nulls))
        else:
            cols[out] = (pd.Series(np.full(n, const, np.int64)) if const is not None
                         else pd.Series([None] * n, dtype=object))
    return pd.DataFrame(cols, copy=False)
