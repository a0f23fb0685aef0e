"""comm-exposed on the real rank traces of ../shared: DLRM workers (NCCL is most of the
busy time, almost none of it hidden) and the TorchRec pair (242 ms of NCCL a rank, 87 ms
exposed). Expected numbers come from a plain JSON parse of each file: the union of the
NCCL kernels, the union of the other kernels, and their intersection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _intervals import union_len
from conftest import shared_files
from recsys_doctor.diagnose.advise import advise
from recsys_doctor.options import Options

pytestmark = pytest.mark.shared

DLRM = shared_files("kineto", ("*dlrm_kineto__worker*_step_12.*.json",))
TORCHREC = shared_files("kineto", ("*torchrec*54105*.json",))


def _expected(path: Path) -> dict:
    """(ns) NCCL union, the part under other kernels, and per collective kind the same."""
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    iv = [(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000), e["name"]) for e in ev]
    comp = [(s, e) for s, e, n in iv if "nccl" not in n.lower()]
    out = {}
    kinds = {n.split("_")[1].split("(")[0] for _, _, n in iv if "nccl" in n.lower()}
    for kind in [None, *sorted(kinds)]:
        comm = [(s, e) for s, e, n in iv if "nccl" in n.lower() and (kind is None or n.split("_")[1].split("(")[0] == kind)]
        c, m = union_len(comp), union_len(comm)
        out[kind] = {"comm_ns": m, "hidden_ns": c + m - union_len(comp + comm), "kernels": len(comm),
                     "busy_ns": union_len(comp + comm)}
    return out


@pytest.mark.parametrize("path", DLRM + TORCHREC, ids=lambda p: p.name[-40:])
def test_exposed_communication_matches_json(path):
    res = advise(path, Options())
    exp = _expected(path)
    data = res.analyses["comm-exposed"]
    tol = 2 * exp[None]["kernels"]  # ns rounding of each interval edge
    assert data["comm_kernels"] == exp[None]["kernels"]
    assert abs(data["comm_ns"] - exp[None]["comm_ns"]) <= tol
    assert abs(data["hidden_ns"] - exp[None]["hidden_ns"]) <= 4 * tol
    assert abs(data["exposed_ns"] - (exp[None]["comm_ns"] - exp[None]["hidden_ns"])) <= 4 * tol
    assert data["comm_share_of_busy"] == pytest.approx(exp[None]["comm_ns"] / exp[None]["busy_ns"], abs=1e-3)
    (dev,) = data["devices"].values()
    for kind, v in dev["by_kind"].items():
        assert v["kernels"] == exp[kind]["kernels"]
        assert abs(v["exposed_ns"] - (exp[kind]["comm_ns"] - exp[kind]["hidden_ns"])) <= 4 * tol
    (f,) = [f for f in res.findings if f.id == "comm-exposed"]
    # recoverable: the exposed time in the steady state, never more than the exposed time
    assert 0 < f.recoverable_ns == data["steady_exposed_ns"] <= data["exposed_ns"]
    assert f.evidence["hidden_share"] == pytest.approx(exp[None]["hidden_ns"] / exp[None]["comm_ns"], abs=1e-3)
    assert "TrainPipelineSparseDist" in f.recommendation


@pytest.mark.skipif(not DLRM, reason="the DLRM rank traces of ../shared are not present")
def test_dlrm_nccl_is_most_of_the_busy_time_and_barely_hidden():
    for path in DLRM:
        exp = _expected(path)[None]
        res = advise(path, Options())
        (f,) = [f for f in res.findings if f.id == "comm-exposed"]
        assert exp["comm_ns"] / exp["busy_ns"] > 0.8 and exp["hidden_ns"] / exp["comm_ns"] < 0.1
        assert f.severity == "high"  # a third to two thirds of the window is exposed NCCL


@pytest.mark.skipif(not TORCHREC, reason="the TorchRec rank trace of ../shared is not present")
def test_torchrec_exposed_share_of_window():
    path = TORCHREC[0]
    exp = _expected(path)[None]
    ev = [e for e in json.loads(path.read_text())["traceEvents"]
          if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    window = round(max(e["ts"] + e["dur"] for e in ev) * 1000) - round(min(e["ts"] for e in ev) * 1000)
    data = advise(path, Options()).analyses["comm-exposed"]
    assert 240e6 < exp["comm_ns"] < 245e6  # 242 ms of NCCL
    assert data["exposed_ns"] / window == pytest.approx((exp["comm_ns"] - exp["hidden_ns"]) / window, abs=1e-4)
    assert 0.11 < data["exposed_ns"] / window < 0.13  # 86.9 ms, 12% of the window


def test_no_communication_no_finding(project_data):
    demo = next(project_data.rglob("*.sqlite*"), None)
    if demo is None:
        pytest.skip("no sqlite fixture")
    res = advise(demo, Options())
    assert res.analyses["comm-exposed"] == {"comm_kernels": 0}
    assert not [f for f in res.findings if f.id == "comm-exposed"]
