"""The nsys loader's engines agree: the page reader (the default), ADBC (Arrow) and the
standard library's sqlite3 through pandas (the first loader path), read in chunks or
whole, give the same canonical tables on every shared export; each table is compared
column by column."""

from __future__ import annotations

import pandas as pd
import pytest

import recsys_doctor.loaders._sqlite_pages as sqlite_pages
import recsys_doctor.loaders.nsys as nsys
from conftest import shared_files
from recsys_doctor.loaders.nsys import load_nsys_sqlite

pytestmark = pytest.mark.shared

NSYS = shared_files("h100", ("*.sqlite",)) + shared_files("nsys", ("*.sqlite",))


def _same(a, b) -> None:
    assert a.counts() == b.counts()
    for t in a.TABLES:
        pd.testing.assert_frame_equal(getattr(a, t), getattr(b, t), obj=t)
    assert a.meta == b.meta


@pytest.mark.parametrize("path", NSYS, ids=lambda p: p.name)
def test_engines_equal_sqlite3(path, shared_traces, monkeypatch):
    ref = load_nsys_sqlite(path, engine="sqlite3")
    _same(load_nsys_sqlite(path, engine="adbc"), ref)
    _same(load_nsys_sqlite(path, engine="pages"), ref)  # the C row loop where built
    monkeypatch.setattr(sqlite_pages, "_c_decode", None)
    _same(load_nsys_sqlite(path, engine="pages"), ref)  # its numpy path


@pytest.mark.parametrize("path", NSYS[:3] + [p for p in NSYS if "DLProf" in p.name], ids=lambda p: p.name)
def test_chunked_equals_whole(path, shared_traces, monkeypatch):
    whole = load_nsys_sqlite(path)
    monkeypatch.setattr(nsys, "CHUNK_ROWS", 997)  # many chunks, none aligned with anything
    _same(load_nsys_sqlite(path), whole)


def test_mixed_type_column_falls_back(tmp_path):
    """A name column holding ids in some rows and text in others (as post-processing tools
    leave it) makes the Arrow reader refuse the query; the loader reads that table through
    sqlite3 instead and resolves both kinds of value."""
    from test_nsys_loader import make_tiny_export

    p = make_tiny_export(tmp_path / "mixed.sqlite")
    con = __import__("sqlite3").connect(p)
    # 2,000 id rows first (the reader types the column from its first rows), then text
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, streamId, correlationId, "
                    "globalPid, demangledName) VALUES (?, ?, 1, 7, 0, ?, ?)",
                    [(1000 + i, 1001 + i, 1000 << 24, 3) for i in range(2000)]
                    + [(5000, 5001, 1000 << 24, "kernel named in place")])
    con.commit()
    con.close()
    ref = load_nsys_sqlite(p, engine="sqlite3")
    for engine in ("adbc", "pages"):  # the page reader refuses the text, then ADBC does
        tr = load_nsys_sqlite(p, engine=engine)
        names = tr.kernels["name"].astype(object)
        assert (names == "void gemm<float>(float*)").sum() == 2003  # 3 original rows with id 3 + 2,000
        assert (names == "kernel named in place").sum() == 1
        _same(tr, ref)


def test_progress_advances_per_chunk(shared_traces, monkeypatch):
    """The load reports one step per rowid chunk of each big table (plus the NVTX table and
    the final assembly): the bar on a multi-GB export moves as rows arrive."""
    import sqlite3

    p = shared_traces / "h100" / "wdl_graphs_q4_h100.sqlite"
    monkeypatch.setattr(nsys, "CHUNK_ROWS", 20_000)
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    names = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    expected = 1
    for t in ("KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "RUNTIME", "GRAPH_TRACE"):
        t = "CUPTI_ACTIVITY_KIND_" + t
        if t in names:
            lo, hi = con.execute(f"select min(rowid), max(rowid) from {t}").fetchone()
            expected += -(-(hi - lo + 1) // 20_000)
    expected += "NVTX_EVENTS" in names

    class Rec:
        steps, total = 0, None

        def advance(self, n=1):
            self.steps += n

        def update(self, *, completed=None, total=None, description=None):
            self.total = total if total is not None else self.total

    rec = Rec()
    load_nsys_sqlite(p, progress=rec)
    assert rec.steps == rec.total == expected > 8
