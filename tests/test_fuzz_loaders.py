"""The fuzz suite: seeded mutants of the project's own fixtures (``tests/data``), each read
by the loader and by the reference reader of its format (Python's sqlite3 by full scans,
the standard library's json with exact decimals; ``tests/_fuzz.py``). Every mutant must
end one of two ways: the loader's numbers equal the reference's, or the loader refuses the
file with one line (a :class:`RecsysDoctorError`, exit 2 on the command line). A silent
difference or any other exception (a traceback) fails the test. SQLite mutants go through
both page decoders (the C loop and numpy), which must also agree with each other.

Runs in the GPU-free CI without ../shared: 220 SQLite mutants x 2 decoders (113 read as
sqlite3 reads them, 107 refused, the same for both decoders) and 240 Kineto mutants (164
read as json reads them, 76 refused), ~40 s on this 2-core machine shared with others."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import pytest

import recsys_doctor.loaders._sqlite_pages as sqlite_pages
import recsys_doctor.loaders.nsys as nsys
from recsys_doctor.errors import RecsysDoctorError
from recsys_doctor.loaders.kineto import load_kineto_json
from recsys_doctor.loaders.nsys import load_nsys_sqlite

from _fuzz import (NSYS_TABLES, NotIntegers, OutOfRange, kineto_mutant, kineto_sample, kineto_reference, kineto_summary,
                   nsys_mutant, nsys_reference, nsys_summary)

DATA = Path(__file__).resolve().parent / "data"
SQLITE_FIXTURES = ("patho_pingpong/pingpong.sqlite.gz", "patho_large_kernels/large_kernels.sqlite.gz")
SQLITE_MUTANTS = 110  # per fixture
KINETO_MUTANTS = 240


def _outcome(load, path: Path, reference, summary) -> str:
    """"same", "refused" (one line), or raises AssertionError for a silent difference."""
    try:
        ref = reference(path)
    except Exception as e:  # noqa: BLE001 - the reference cannot read it: we must refuse
        ref = e
    try:
        got = load(path)
    except RecsysDoctorError as e:
        assert "\n" not in str(e).strip(), f"{path.name}: a message of several lines: {e}"
        return "refused"
    assert not isinstance(ref, Exception), f"{path.name}: the reference refuses ({ref!r}), the loader read it"
    assert summary(got) == ref, f"{path.name}: silent difference"
    return "same"


@pytest.fixture(scope="module")
def sqlite_fixtures(tmp_path_factory) -> list[Path]:
    out = []
    for rel in SQLITE_FIXTURES:
        p = tmp_path_factory.mktemp("clean") / Path(rel).name.removesuffix(".gz")
        p.write_bytes(gzip.decompress((DATA / rel).read_bytes()))
        out.append(p)
    return out


@pytest.mark.parametrize("decoder", ["c", "numpy"])
def test_sqlite_mutants_read_as_sqlite3_reads_them_or_refused(decoder, sqlite_fixtures, tmp_path, monkeypatch):
    """Bytes, 16-byte runs, child pointers and cell pointers of the big tables' b-trees
    overwritten (small chunks: many runs per table, so a refused run sits between read
    ones). The clean fixtures themselves must read the same as sqlite3."""
    if decoder == "numpy":
        monkeypatch.setattr(sqlite_pages, "_c_decode", None)
    elif not sqlite_pages.compiled_available():
        pytest.skip("the C page decoder is not built here")
    monkeypatch.setattr(nsys, "CHUNK_ROWS", 400)
    seen: Counter[str] = Counter()
    for clean in sqlite_fixtures:
        assert _outcome(load_nsys_sqlite, clean, nsys_reference, nsys_summary) == "same"
        data = clean.read_bytes()
        import sqlite3

        with sqlite3.connect(f"file:{clean}?mode=ro", uri=True) as con:
            roots = [r[0] for r in con.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name IN "
                                               f"({','.join('?' * len(NSYS_TABLES))})", list(NSYS_TABLES))]
        con.close()
        rng = random.Random(f"{clean.name}-28")  # the same mutants for both decoders
        for k in range(SQLITE_MUTANTS):
            bad = tmp_path / f"{clean.stem}-{k}.sqlite"
            bad.write_bytes(nsys_mutant(data, roots, rng))
            seen[_outcome(load_nsys_sqlite, bad, nsys_reference, nsys_summary)] += 1
            bad.unlink()
    # the mutants are worth their time: both outcomes happen many times
    print(f"sqlite {decoder}: {dict(seen)}")
    assert seen["same"] > 30 and seen["refused"] > 30, seen


def test_kineto_mutants_read_as_json_reads_them_or_refused(tmp_path):
    """ts/dur replaced by hostile numbers (Infinity, 1e308, 1e29, 1e19, NaN, strings, more
    than 3 decimals...), names by lone surrogates and control characters, a nested
    ``traceEvents`` placed first, random bytes changed (mostly invalid JSON: refused)."""
    whole = gzip.decompress((DATA / "wdl_eager_q2_kineto/wdl_eager_q2.pt.trace.json.gz").read_bytes())
    clean = kineto_sample(whole, 9)  # ~2,500 of its 22,213 events, each as the profiler wrote it
    assert len(json.loads(clean)["traceEvents"]) > 2000
    p = tmp_path / "clean.json"
    p.write_bytes(clean)
    assert _outcome(load_kineto_json, p, _kineto_ref, kineto_summary) == "same"
    rng = random.Random(28)
    seen: Counter[str] = Counter()
    for k in range(KINETO_MUTANTS):
        bad = tmp_path / f"m{k}.json"
        bad.write_bytes(kineto_mutant(clean, rng))
        seen[_outcome(load_kineto_json, bad, _kineto_ref, kineto_summary)] += 1
        bad.unlink()
    print(f"kineto: {dict(seen)}")
    assert seen["same"] > 50 and seen["refused"] > 30, seen


def _kineto_ref(path: Path) -> dict:
    return kineto_reference(path.read_bytes())


def test_the_reference_refuses_out_of_range_times():
    """The reference's own rule, checked by hand: non-finite and beyond-int64 ns times."""
    from _fuzz import exact_ns

    assert exact_ns(1) == 1000 and exact_ns(json.loads("1.5e3", parse_float=__import__("decimal").Decimal)) == 1500000
    for text in ("1e308", "1e19", "-1e19"):
        with pytest.raises(OutOfRange):
            exact_ns(json.loads(text, parse_float=__import__("decimal").Decimal))
    with pytest.raises(OutOfRange):
        exact_ns(float("inf"))
    assert NotIntegers  # (used by the SQLite reference)
