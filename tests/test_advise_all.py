"""Acceptance: ``advise --json`` succeeds on every trace in ../shared/traces and prints
strict JSON (no NaN/Infinity) that follows the contract."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import shared_files
from recsys_doctor.cli import main

ALL = (shared_files("nsys", ("*.sqlite",)) + shared_files("h100", ("*.sqlite", "*.json.gz"))
       + shared_files("kineto", ("*.json", "*.json.gz")))
FINDING_IDS = {"short-kernels", "launch-bound", "stream-contention", "memcpy-ping-pong", "sync-api",
               "small-grid", "graph-candidate", "no-gpu-activity", "embedding-bound", "optimizer-unfused",
               "input-stall", "streams-never-overlap", "copy-kernels", "fp32-gemm"}


def _no_constants(name: str):
    raise AssertionError(f"non-standard JSON constant {name} in advise --json output")


@pytest.mark.shared
@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name[-70:])
def test_advise_json_on_every_shared_trace(path, shared_traces):
    res = CliRunner().invoke(main, ["advise", "--json", str(path)], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout, parse_constant=_no_constants)
    assert d["schema"] == 1
    assert d["trace"]["format"] in ("nsys-sqlite", "kineto-json")
    s = d["summary"]
    assert isinstance(s["kernels"], int)
    assert s["gpu_utilization"] is None or 0.0 <= s["gpu_utilization"] <= 1.0
    assert s["short_kernel_fraction"] is None or 0.0 <= s["short_kernel_fraction"] <= 1.0
    ids = {f["id"] for f in d["findings"]}
    assert ids <= FINDING_IDS
    if s["kernels"] == 0:
        assert "no-gpu-activity" in ids
    for f in d["findings"]:
        assert f["severity"] in ("high", "medium", "low", "note")
        assert f["title"] and f["recommendation"]
    assert d["plan"]["schema"] == 1


def test_the_corpus_is_all_there_when_shared_is():
    """Guards the parametrization: where ../shared exists, every trace file is iterated."""
    if not ALL:
        pytest.skip("../shared/traces not present")
    assert len(ALL) >= 50
