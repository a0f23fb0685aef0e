"""Evidence values carry a declared unit (issue 27): each analyzer declares the unit of
every evidence key it reports (``EVIDENCE_UNITS``), the terminal report prints by it, and
no numeric evidence on any trace goes undeclared."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import shared_files
from recsys_doctor.analyzers import ANALYZERS, EVIDENCE_UNITS, evidence_units
from recsys_doctor._util.format import UNITS, fmt_evidence, fmt_unit

DATA = Path(__file__).resolve().parent / "data"
FIXTURES = sorted(p for p in DATA.glob("*/*") if p.name.endswith((".sqlite.gz", ".json.gz", ".sqlite")))
SHARED = shared_files("nsys", ("*.sqlite",)) + shared_files("h100", ("*.sqlite", "*.json.gz")) + \
    shared_files("kineto", ("*.json", "*.json.gz"))


def test_declarations_are_known_units():
    assert EVIDENCE_UNITS and all(u in UNITS for d in EVIDENCE_UNITS.values() for u in d.values())
    # every finding id the registry runs under its own name is declared (the others are
    # the utilization summary, which makes no finding)
    assert set(ANALYZERS) - set(EVIDENCE_UNITS) == {"utilization", "kernel-mix"}
    assert {"copy-kernels", "fp32-gemm"} <= set(EVIDENCE_UNITS)  # kernel-mix's two findings


def test_units_print_by_hand():
    assert fmt_unit("ns", 1_200_000) == "1.200 ms" and fmt_unit("ns", 77_630.0) == "77.63 us"
    assert fmt_unit("us", 3.0) == "3.00 us" and fmt_unit("ms", 2.5) == "2.500 ms"
    assert fmt_unit("share", 0.25) == "25.0%" and fmt_unit("share", 3.5) == "3.5"  # not a 0..1 share
    assert fmt_unit(None, 12_345) == "12,345" and fmt_unit("number", 0.123456) == "0.123"
    assert fmt_unit("bytes", 4096) == "4,096" and fmt_unit(None, None) == "n/a" and fmt_unit("ns", True) == "yes"
    units = {"shared_idle_ns": "ns", "median_us": "us"}
    # a nested key without a unit of its own (a finding id) takes its parent's
    assert fmt_evidence(units, "shared_idle_ns", {"also_counted_by": {"sync-api": 2_000_000}}) == \
        "also_counted_by=sync-api=2.000 ms"
    assert fmt_evidence(units, "rows", [{"median_us": 1.5}]) == "median_us=1.50 us"
    assert fmt_evidence(units, "idle_ns", 5) == "5"  # undeclared: a plain number, never guessed


def _undeclared(findings) -> list[str]:
    out = []

    def walk(fid: str, units: dict[str, str], key: str, v, inherited: str | None) -> None:
        u = units.get(key, inherited)
        if isinstance(v, dict):
            for k, x in v.items():
                walk(fid, units, str(k), x, u)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(fid, units, key, x, inherited)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and u is None:
            out.append(f"{fid}: {key}")

    for f in findings:
        units = evidence_units(f.id)
        for k, v in f.evidence.items():
            walk(f.id, units, k, v, None)
    return sorted(set(out))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_every_numeric_evidence_of_the_fixtures_has_a_unit(path):
    from recsys_doctor.diagnose.advise import advise

    missing = _undeclared(advise(path).findings)
    assert not missing, missing


@pytest.mark.shared
@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.name[:60])
def test_every_numeric_evidence_of_the_shared_traces_has_a_unit(path):
    from recsys_doctor.diagnose.advise import advise

    missing = _undeclared(advise(path).findings)
    assert not missing, missing
