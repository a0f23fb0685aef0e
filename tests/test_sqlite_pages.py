"""The page reader (``_sqlite_pages``) against SQLite itself: every value it returns is the
value SQLite's own ``SELECT`` returns for the same rows, on databases made here with the
standard library (page sizes, integers of every stored width, NULLs and the constants 0/1,
multi-level b-trees, deleted rows, negative and huge rowids); and it refuses, instead of
guessing, what it does not decode (overflow pages, text, floats, short records after
``ALTER TABLE``, WAL databases, WITHOUT ROWID tables, truncated files). The loader reads
refused rows through SQLite: the canonical tables equal the sqlite3 engine's.

Every test runs twice: with the C row loop (``_pagecodec``, built by ``pip install``) and
with the numpy path it replaces where no compiler was at hand."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import recsys_doctor.loaders._sqlite_pages as sqlite_pages
from recsys_doctor.loaders._nsys_engine import page_frame, plain_select
from recsys_doctor.loaders._sqlite_pages import PageFile, Unsupported
from recsys_doctor.loaders.nsys import load_nsys_sqlite

#: values at each edge of SQLite's integer widths (1, 2, 3, 4, 6, 8 bytes) and the two
#: constants it stores with no bytes (0 and 1)
EDGES = [0, 1, -1, 2, 127, 128, -128, -129, 32767, 32768, -32768, -32769, 2**23 - 1, 2**23, -(2**23),
         -(2**23) - 1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**47 - 1, 2**47, -(2**47), -(2**47) - 1,
         2**63 - 1, -(2**63), 1_700_000_000_123_456_789]


@pytest.fixture(autouse=True, params=["c", "numpy"])
def decoder(request, monkeypatch):
    """Which row loop the page reader uses in this run of the test."""
    if request.param == "numpy":
        monkeypatch.setattr(sqlite_pages, "_c_decode", None)
    elif not sqlite_pages.compiled_available():
        pytest.skip("the C page decoder is not built in this install (test_codec_is_built says why)")
    return request.param


def test_codec_is_built(decoder):
    """Where a C compiler is at hand, ``pip install`` builds the C row loop (the extension
    is optional only so that an install without a compiler still works)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the numpy path is the page reader")
    import importlib

    importlib.import_module("recsys_doctor.loaders._pagecodec")  # ImportError: not built


def test_the_loop_in_use(decoder, tmp_path):
    p = _make(tmp_path / "one.sqlite", [(1, 2, 3, 4)])
    pf = PageFile(p)
    try:
        assert pf.compiled is (decoder == "c")
    finally:
        pf.close()


def _make(path: Path, rows: list[tuple], *, page_size: int = 4096, cols: int = 4, rowids: list[int] | None = None,
          extra_sql: str = "") -> Path:
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size = {page_size}")
    names = ", ".join(f"c{i} INTEGER" for i in range(cols))
    con.execute(f"CREATE TABLE t ({names})")
    marks = ", ".join("?" * cols)
    if rowids is None:
        con.executemany(f"INSERT INTO t VALUES ({marks})", rows)
    else:
        con.executemany(f"INSERT INTO t (rowid, {', '.join(f'c{i}' for i in range(cols))}) VALUES (?, {marks})",
                        [(r, *row) for r, row in zip(rowids, rows)])
    if extra_sql:
        con.executescript(extra_sql)
    con.commit()
    con.close()
    return path


def _root(path: Path, table: str = "t") -> int:
    with sqlite3.connect(path) as con:
        return con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]


def _read_all(path: Path, columns: list[int], rows_per_run: int = 1000, table: str = "t") -> list[list]:
    """Rows (as Python lists, None for NULL) the page reader returns, runs joined."""
    pf = PageFile(path)
    try:
        parts = [pf.read(run, columns) for run in pf.runs(_root(path, table), rows_per_run)]
    finally:
        pf.close()
    out_cols = []
    for c in columns:
        vals = [v for p in parts for v in np.where(p[c][1], 0, p[c][0]).tolist()] if parts else []
        nulls = [x for p in parts for x in (p[c][1].tolist() if p[c][1] is not None else [False] * len(p[c][0]))]
        out_cols.append([None if n else v for v, n in zip(vals, nulls)])
    return [list(r) for r in zip(*out_cols)]


def _sqlite_rows(path: Path, columns: list[int], table: str = "t") -> list[list]:
    with sqlite3.connect(path) as con:
        names = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        sel = ", ".join(names[c] for c in columns)
        return [list(r) for r in con.execute(f"SELECT {sel} FROM {table}")]


@pytest.mark.parametrize("page_size", [512, 4096, 65536])
def test_every_integer_width_and_null_equals_sqlite(tmp_path, page_size):
    rng = random.Random(page_size)
    pool = EDGES + [None]
    # column 0 always set, 1 from every width and NULL, 2 only 0/1/NULL (bytes-free), 3 random wide
    rows = [(i * 1000 + 3, rng.choice(pool), rng.choice([0, 1, None]), rng.randrange(-(2**62), 2**62))
            for i in range(20_000)]
    p = _make(tmp_path / "w.sqlite", rows, page_size=page_size)
    assert _read_all(p, [0, 1, 2, 3], rows_per_run=3_000) == _sqlite_rows(p, [0, 1, 2, 3])
    # a subset of columns, out of order in the request, skipping some
    assert _read_all(p, [3, 1]) == _sqlite_rows(p, [3, 1])


def test_uniform_columns_and_one_run(tmp_path):
    """Columns where every row has the same stored type take the scalar path; still SQLite's values."""
    rows = [(1_700_000_000_000 + i, 7, None, 1) for i in range(5_000)]
    p = _make(tmp_path / "u.sqlite", rows)
    assert _read_all(p, [0, 1, 2, 3], rows_per_run=10**9) == _sqlite_rows(p, [0, 1, 2, 3])


def test_deleted_rows_and_rowid_gaps(tmp_path):
    rows = [(i, i * 3, -i, i % 2) for i in range(30_000)]
    p = _make(tmp_path / "d.sqlite", rows, extra_sql="DELETE FROM t WHERE c0 % 7 = 3 OR (c0 > 9000 AND c0 < 15000);")
    got = _read_all(p, [0, 1, 2, 3], rows_per_run=2_000)
    assert got == _sqlite_rows(p, [0, 1, 2, 3])
    assert len(got) == 30_000 - len([i for i in range(30_000) if i % 7 == 3 or 9000 < i < 15000])


@pytest.mark.parametrize("rowids", ["negative", "huge", "sparse"])
def test_rowid_sizes(tmp_path, rowids):
    """Rowid varints of every length: the reader finds where each row's record starts."""
    n = 3_000
    ids = {"negative": [-(2**62) + i * 10**12 for i in range(n // 2)] + list(range(n // 2)),
           "huge": [2**56 + i for i in range(n // 2)] + [2**60 + i for i in range(n // 2)],
           "sparse": sorted(random.Random(1).sample(range(1, 2**50), n))}[rowids]
    rows = [(i, i * 11, None if i % 5 == 0 else i, 1) for i in range(n)]
    p = _make(tmp_path / "r.sqlite", rows, rowids=ids)
    assert _read_all(p, [0, 1, 2, 3], rows_per_run=500) == _sqlite_rows(p, [0, 1, 2, 3])
    pf = PageFile(p)
    runs = pf.runs(_root(p), 500)
    assert sum(r.rows for r in runs) == n
    pf.close()


def test_empty_table_has_no_runs(tmp_path):
    p = _make(tmp_path / "e.sqlite", [])
    pf = PageFile(p)
    assert pf.runs(_root(p), 100) == []
    pf.close()


def test_refuses_overflow_text_float_and_short_records(tmp_path):
    rows = [(i, i, i, i) for i in range(2_000)]
    p = _make(tmp_path / "o.sqlite", rows, extra_sql="""
        CREATE TABLE big (a INTEGER, b BLOB);
        INSERT INTO big VALUES (1, zeroblob(20000)), (2, NULL);
        CREATE TABLE txt (a INTEGER, b INTEGER);
        INSERT INTO txt VALUES (1, 2), (3, 'three');
        CREATE TABLE flt (a INTEGER, b INTEGER);
        INSERT INTO flt VALUES (1, 2), (3, 4.5);
        CREATE TABLE grown (a INTEGER);
        INSERT INTO grown VALUES (1), (2);
        ALTER TABLE grown ADD COLUMN b INTEGER;
        INSERT INTO grown VALUES (3, 4);
        CREATE TABLE wr (a INTEGER PRIMARY KEY, b INTEGER) WITHOUT ROWID;
        INSERT INTO wr VALUES (1, 2);
    """)
    pf = PageFile(p)
    for table, cols in (("big", [0]), ("txt", [1]), ("flt", [1]), ("grown", [1])):
        (run,) = pf.runs(_root(p, table), 100)
        with pytest.raises(Unsupported):
            pf.read(run, cols)
    # the columns it can read of those tables are still read right
    (run,) = pf.runs(_root(p, "txt"), 100)
    assert pf.read(run, [0])[0][0].tolist() == [1, 3]
    (run,) = pf.runs(_root(p, "grown"), 100)
    assert pf.read(run, [0])[0][0].tolist() == [1, 2, 3]
    with pytest.raises(Unsupported):
        pf.runs(_root(p, "wr"), 100)  # an index b-tree, not a rowid table
    pf.close()


def test_refuses_wal_truncated_and_foreign_files(tmp_path):
    p = _make(tmp_path / "ok.sqlite", [(1, 2, 3, 4)])
    wal = tmp_path / "wal.sqlite"
    shutil.copy(p, wal)
    with sqlite3.connect(wal) as con:
        con.execute("PRAGMA journal_mode = WAL")
    with pytest.raises(Unsupported):
        PageFile(wal)
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(Unsupported):
        PageFile(cut)
    other = tmp_path / "other.sqlite"
    other.write_bytes(b"not a database at all" * 100)
    with pytest.raises(Unsupported):
        PageFile(other)


def test_corrupt_child_page_number_is_refused(tmp_path):
    """An interior page pointing past the end of the file is refused, not followed."""
    rows = [(i, i, i, i) for i in range(20_000)]
    p = _make(tmp_path / "c.sqlite", rows, page_size=512)
    root = _root(p)
    data = bytearray(p.read_bytes())
    hdr = (root - 1) * 512 + (100 if root == 1 else 0)
    assert data[hdr] == 5  # an interior page
    data[hdr + 8: hdr + 12] = (10**6).to_bytes(4, "big")  # its right-most child
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(bytes(data))
    pf = PageFile(bad)
    with pytest.raises(Unsupported):
        pf.runs(root, 1000)
    pf.close()


def test_corrupt_leaf_pages_are_refused_or_read_alike(decoder, tmp_path):
    """Random bytes overwritten in the leaf pages (cell pointers, varints, record headers,
    values): the reader refuses or returns values, it never reads outside the file or
    crashes; both row loops refuse the same runs and return the same values."""
    rows = [(i, -i * 1001, None if i % 7 == 0 else i * 2**33, i % 3) for i in range(3000)]
    p = _make(tmp_path / "f.sqlite", rows, page_size=512)
    pf = PageFile(p)
    runs = pf.runs(_root(p), 10**9)
    pf.close()
    leaves = runs[0].pages
    clean = p.read_bytes()
    rng = random.Random(7)
    refused = 0
    for k in range(150):
        data = bytearray(clean)
        for _ in range(rng.choice([1, 3, 20])):
            page = int(rng.choice(leaves))
            data[(page - 1) * 512 + rng.randrange(512)] = rng.randrange(256)
        bad = tmp_path / f"bad{k}.sqlite"
        bad.write_bytes(bytes(data))
        got = {}
        for compiled in ([True, False] if sqlite_pages.compiled_available() else [False]):
            pf = PageFile(bad, compiled=compiled)
            try:
                got[compiled] = pf.read(runs[0], [0, 1, 2, 3])
            except Unsupported:
                got[compiled] = None
            finally:
                pf.close()
            bad.unlink() if compiled is False else None
        refused += got.get(True, got[False]) is None
        if len(got) == 2:  # both refuse the same runs (the numpy path parses the rowid too)
            assert (got[True] is None) == (got[False] is None), k
        if len(got) == 2 and got[True] is not None:
            for c in range(4):
                assert np.array_equal(got[True][c][0], got[False][c][0])
                a, b = got[True][c][1], got[False][c][1]
                assert (a is None and b is None) or np.array_equal(a, b)
    assert refused > 0


def test_plain_select_parses_the_loaders_selects_only():
    sel = plain_select('SELECT k.start AS start, k."end" AS "end", k."globalPid" AS gp_raw, 0 AS device, '
                       'NULL AS sn, -3 AS x FROM CUPTI_ACTIVITY_KIND_KERNEL k')
    assert sel is not None and sel.table == "CUPTI_ACTIVITY_KIND_KERNEL" and sel.alias == "k"
    assert sel.items == (("start", "start", None), ("end", "end", None), ("gp_raw", "globalPid", None),
                         ("device", None, 0), ("sn", None, None), ("x", None, -3))
    for sql in ("SELECT k.start AS start FROM T k LEFT JOIN S s ON s.id = k.x",
                "SELECT k.start + 1 AS start FROM T k",
                "SELECT k.start AS start FROM T k WHERE k.start > 0",
                "SELECT CASE WHEN typeof(k.a)='text' THEN k.a END AS a FROM T k",
                "SELECT j.start AS start FROM T k",
                "SELECT 0 AS a, NULL AS b FROM T k"):
        assert plain_select(sql) is None, sql


def test_page_frame_types_match_arrow(tmp_path):
    """int64 without NULLs, nullable Int64 with some, objects of None when all are NULL."""
    rows = [(i, None if i % 3 else i, None, 1) for i in range(100)]
    p = _make(tmp_path / "f.sqlite", rows)
    sel = plain_select('SELECT t.c0 AS a, t.c1 AS b, t.c2 AS c, 5 AS d, NULL AS e FROM t t')
    pf = PageFile(p)
    (run,) = pf.runs(_root(p), 1000)
    df = page_frame(sel, {"c0": 0, "c1": 1, "c2": 2, "c3": 3}, lambda cols: pf.read(run, cols))
    pf.close()
    assert df["a"].dtype == np.int64 and df["a"].tolist() == list(range(100))
    assert str(df["b"].dtype) == "Int64"
    assert df["b"].isna().sum() == len([i for i in range(100) if i % 3]) and df["b"].dropna().tolist() == list(range(0, 100, 3))
    assert df["c"].dtype == object and df["c"].isna().all()
    assert df["d"].tolist() == [5] * 100 and df["e"].isna().all()


def test_loader_reads_refused_rows_through_sqlite(tmp_path):
    """A long text in a column the loader does not read spills one kernel row to an
    overflow page; that run is refused and read through SQLite, the other rows from pages:
    the canonical tables equal the sqlite3 engine's."""
    from test_nsys_loader import make_tiny_export

    p = make_tiny_export(tmp_path / "spill.sqlite")
    con = sqlite3.connect(p)
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, streamId, correlationId, "
                    "globalPid, demangledName, extra_tool_col) VALUES (?, ?, 1, 7, 0, ?, 3, ?)",
                    [(1000 + i, 1001 + i, 1000 << 24, "x" * (9000 if i == 1500 else 3)) for i in range(3000)])
    con.commit()
    con.close()
    pages, ref = load_nsys_sqlite(p, engine="pages"), load_nsys_sqlite(p, engine="sqlite3")
    assert len(pages.kernels) == len(ref.kernels) >= 3000
    for t in ref.TABLES:
        pd.testing.assert_frame_equal(getattr(pages, t), getattr(ref, t), obj=t)
    pf = PageFile(p)
    (run,) = pf.runs(_root(p, "CUPTI_ACTIVITY_KIND_KERNEL"), 10**6)
    with pytest.raises(Unsupported):
        pf.read(run, [0])
    pf.close()


def test_unknown_engine_is_an_error(tmp_path):
    from test_nsys_loader import make_tiny_export

    with pytest.raises(ValueError, match="engine"):
        load_nsys_sqlite(make_tiny_export(tmp_path / "e.sqlite"), engine="duckdb")


def test_wide_records_many_type_words(tmp_path):
    """20 columns (serial types read 8 at a time): uniform words, mixed words, a partial word."""
    rng = random.Random(7)
    rows = [tuple([i, 1_700_000_000_000_000 + i] + [rng.choice(EDGES + [None]) if c % 3 == 0 else c
                                                    for c in range(2, 20)]) for i in range(6_000)]
    p = _make(tmp_path / "wide.sqlite", rows, cols=20)
    for cols in ([0, 9, 17, 19], [1, 2, 3, 4, 5, 6, 7, 8], [18], list(range(20))):
        assert _read_all(p, cols, rows_per_run=1_500) == _sqlite_rows(p, cols), cols
