"""The engines that run the nsys loader's big ``SELECT``s: ADBC (Arrow) by default, the
standard library's sqlite3 as the fallback.

The ADBC SQLite driver steps SQLite and builds Arrow buffers in C without holding the
GIL, so two reads on two connections use two cores; integer columns come out of Arrow
as numpy arrays without a copy (each read is one Arrow batch). README "Why this engine"
has the measurements against sqlite3, connectorx, Polars and DuckDB.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import numpy as np
import pandas as pd

from ._nsys_file import one_line

__all__ = ["Engine", "adbc_available", "TEXT_COLUMNS"]

#: the only columns the big SELECTs return as text (NVTX's inline text); every other
#: column is an integer (an id, a code, a time)
TEXT_COLUMNS = ("tx_txt",)
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
            return pd.read_sql_query(sql, con)

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
        return arrow_to_pandas(tab)
