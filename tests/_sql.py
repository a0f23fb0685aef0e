"""The tests' own SQL reader: every row a query returns from a SQLite file, through
Python's sqlite3 (not the package's loaders), the connection closed after it."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def sql_rows(db: Path | str, q: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(q).fetchall()
    finally:
        con.close()
