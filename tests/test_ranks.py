"""advise over many rank traces: the combined view, local processes vs a Dask LocalCluster
of 2 workers, on the real per-rank Kineto traces of a DLRM run (4 workers) in ../shared.

Numbers are checked against a plain JSON parse of each rank's file (kernel intervals,
NCCL kernels by name), not against the code's own output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SHARED_TRACES
from recsys_doctor.cli import main
from recsys_doctor.ranks import STRAGGLER_SHARE, advise_ranks, expand_traces, is_multi_target

pytestmark = pytest.mark.shared

DLRM = "facebookresearch__param__et_replay__tests__inputs__dlrm_kineto.tar.gz__dlrm_kineto__worker*_step_12.*.json"


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory) -> Path:
    src = sorted((SHARED_TRACES / "kineto").glob(DLRM))
    if len(src) != 4:
        pytest.skip("the 4 DLRM rank traces of ../shared/traces/kineto are not present")
    d = tmp_path_factory.mktemp("ranks")
    for p in src:
        shutil.copy(p, d / p.name)
    return d


def _union_ns(pairs: list[tuple[int, int]]) -> int:
    total, cs, ce = 0, None, None
    for s, e in sorted(pairs):
        if ce is None or s > ce:
            total += 0 if ce is None else ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    return total + (0 if ce is None else ce - cs)


def _expected(path: Path) -> dict:
    """comm/compute union lengths (ns) and overlap from a plain JSON parse."""
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    ts0 = min(e["ts"] for e in ev if e.get("cat") in (
        "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation",
        "cuda_sync"))
    comm, comp = [], []
    for e in ev:
        if e.get("cat") != "kernel":
            continue
        s = round((e["ts"] - ts0) * 1000)
        iv = (s, s + round(e.get("dur", 0) * 1000))
        (comm if "nccl" in e["name"].lower() else comp).append(iv)
    c, m, both = _union_ns(comp), _union_ns(comm), _union_ns(comp + comm)
    return {"compute_ns": c, "comm_ns": m, "overlap_ns": c + m - both, "nccl_kernels": len(comm),
            "kernels": len(comm) + len(comp)}


def test_rank_dir_combined_view_matches_json(rank_dir):
    res = advise_ranks(expand_traces(rank_dir), workers=2)
    assert sorted(r.rank for r in res.ranks) == [0, 1, 2, 3]  # from "worker<N>" in the file names
    for r in res.ranks:
        exp = _expected(Path(r.path))
        assert r.summary["kernels"] == exp["kernels"]
        assert r.nccl_kernels == exp["nccl_kernels"] > 0
        # rounding each interval to ns may move an edge by 1 ns
        assert abs(r.comm_ns - exp["comm_ns"]) <= exp["nccl_kernels"]
        assert abs(r.compute_ns - exp["compute_ns"]) <= exp["kernels"]
        assert abs(r.overlap_ns - exp["overlap_ns"]) <= exp["kernels"]
    utils = [r.summary["gpu_utilization"] for r in res.ranks]
    assert utils == sorted(utils)  # worst first
    assert res.totals["ranks"] == 4
    med = sorted(r.compute_ns for r in res.ranks)
    med = (med[1] + med[2]) / 2
    assert [s["rank"] for s in res.stragglers] == [
        r.rank for r in sorted(res.ranks, key=lambda r: -r.compute_ns) if r.compute_ns > med * (1 + STRAGGLER_SHARE)]


def test_local_processes_and_dask_localcluster_agree(rank_dir):
    paths = expand_traces(str(rank_dir / "*.json"))
    local = advise_ranks(paths, workers=2)
    dask = advise_ranks(paths, dask="local", workers=2)
    a, b = local.to_dict(), dask.to_dict()
    assert a.pop("engine") == "local processes" and b.pop("engine") == "dask LocalCluster"
    assert a == b


def test_straggler_found(rank_dir, tmp_path):
    """Rank 3's kernels made 1.5x longer: its compute time is the only one far above the median."""
    for p in sorted(rank_dir.iterdir()):
        doc = json.loads(p.read_text())
        if "worker3" in p.name:
            for e in doc["traceEvents"]:
                if e.get("cat") == "kernel" and "nccl" not in e.get("name", "").lower():
                    e["dur"] = e["dur"] * 1.5
        (tmp_path / p.name).write_text(json.dumps(doc))
    res = advise_ranks(expand_traces(tmp_path), workers=1)
    assert [s["rank"] for s in res.stragglers][:1] == [3]
    exp = _expected(next(tmp_path.glob("*worker3*")))
    assert abs(res.stragglers[0]["compute_ns"] - exp["compute_ns"]) <= exp["kernels"]


def test_cli_dir_json_and_errors(rank_dir, tmp_path):
    r = CliRunner().invoke(main, ["advise", str(rank_dir), "--json", "--workers", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["kind"] == "multi-rank" and len(doc["ranks"]) == 4
    assert set(doc["finding_ids"]) == {f["id"] for rk in doc["ranks"] for f in rk["findings"]}
    r = CliRunner().invoke(main, ["advise", str(tmp_path / "nothing*.json")])
    assert r.exit_code == 2 and "matches no file" in r.output
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(main, ["advise", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no trace files" in r.output
    one = next(rank_dir.iterdir())
    r = CliRunner().invoke(main, ["advise", str(one), "--dask", "local"])
    assert r.exit_code == 2 and "DIR or GLOB" in r.output
    # a window is per trace (each rank has its own clock); --db and --html do apply (tests/test_ranks_report.py)
    r = CliRunner().invoke(main, ["advise", str(rank_dir), "--start", "1s"])
    assert r.exit_code == 2 and "--end apply to single traces" in r.output
    assert is_multi_target(rank_dir) and not is_multi_target(one)


def test_markdown_report(rank_dir, tmp_path):
    md = tmp_path / "ranks.md"
    r = CliRunner().invoke(main, ["advise", str(rank_dir), "--md", str(md), "--workers", "1"])
    assert r.exit_code == 0, r.output
    text = md.read_text()
    assert text.startswith("# 4 ranks") and text.count("worker") >= 4
