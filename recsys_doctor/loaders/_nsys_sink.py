"""Where the decoded chunks of one table land: each column is written into one array
sized for the whole table as the chunks arrive, so the table is built without a second
full copy (a concatenation at the end would touch every byte again).

The arrays are allocated at the table's rowid span (an upper bound of its rows, exact for
every export seen); pages past the rows actually written are never touched and cost no
memory. String columns arrive as (codes, values): codes are written like any integer
column (offset into the values of all chunks seen so far) and become one categorical at
the end. A column whose chunks do not share one numpy dtype (a nullable integer column
with NULLs in some chunks only, text from the sqlite3 fallback) is joined by pandas.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ._nsys_columns import categorical

__all__ = ["TableSink"]


class _Column:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.array: np.ndarray | None = None
        self.values: list[np.ndarray] = []  # string columns: the values of each distinct table
        self.n_values = 0
        self.parts: list[Any] | None = None  # the general way: chunks joined by pandas

    def write(self, at: int, part: Any) -> None:
        if isinstance(part, tuple):
            part = self._codes(*part)
        elif isinstance(part, pd.Series) and isinstance(part.dtype, np.dtype) and part.dtype != object:
            part = part.to_numpy()
        if self.parts is None and isinstance(part, np.ndarray) and part.dtype != object:
            if self.array is None:
                self.array = np.empty(self.capacity, dtype=part.dtype)
            if part.dtype == self.array.dtype and at + len(part) <= self.capacity:
                self.array[at: at + len(part)] = part
                return
        if self.parts is None:  # from here on, the general way
            self.parts = [] if self.array is None else [pd.Series(self.array[:at])]
            self.array = None
        self.parts.append(pd.Series(part))

    def _codes(self, codes: np.ndarray, values: np.ndarray) -> np.ndarray:
        for i, v in enumerate(self.values):  # the same table of values as an earlier chunk
            if v is values:
                off = sum(len(x) for x in self.values[:i])
                return codes + off * (codes >= 0) if off else codes
        off = self.n_values
        self.values.append(values)
        self.n_values += len(values)
        return codes + off * (codes >= 0) if off else codes

    def result(self, n: int) -> Any:
        if self.parts is not None:
            out = pd.concat(self.parts, ignore_index=True)
            return categorical(out.to_numpy(np.int64), np.concatenate(self.values)) if self.values else out
        arr = self.array[:n] if self.array is not None else np.empty(0)
        if self.values:
            return categorical(arr, self.values[0] if len(self.values) == 1 else np.concatenate(self.values))
        return arr


class TableSink:
    """The columns of one table, filled chunk by chunk, in order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows = 0
        self.columns: dict[str, _Column] = {}

    def write(self, chunk: dict[str, Any]) -> None:
        n = None
        for name, part in chunk.items():
            col = self.columns.setdefault(name, _Column(self.capacity))
            col.write(self.rows, part)
            n = len(part[0]) if isinstance(part, tuple) else len(part)
        self.rows += n or 0

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({c: col.result(self.rows) for c, col in self.columns.items()}, copy=False)
