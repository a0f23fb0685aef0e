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

from _intervals import union_len
from conftest import SHARED_TRACES
from recsys_doctor.cli import main
from recsys_doctor.diagnose.ranks import STRAGGLER_SHARE, advise_ranks, expand_traces, is_multi_target

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
    c, m, both = union_len(comp), union_len(comm), union_len(comp + comm)
    return {"compute_ns": c, "comm_ns": m, "overlap_ns": c + m - both, "nccl_kernels": len(comm),
            "kernels": len(comm) + len(comp)}


def test_rank_dir_combined_view_matches_json(rank_dir):
    res = advise_ranks(expand_traces(rank_dir), workers=2)
    for r in res.ranks:  # the rank each trace says it is (distributedInfo), not a number in its name
        di = json.loads(Path(r.path).read_text())["distributedInfo"]
        assert (r.rank, r.world_size, r.rank_source) == (di["rank"], di["world_size"], "trace")
    assert sorted(r.rank for r in res.ranks) == [0, 1, 2, 3] and res.warnings == []
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
    assert res.totals["ranks"] == 4 and res.totals["world_size"] == 8


def _nccl_durations(path: Path) -> list[tuple[str, int, int]]:
    """(kind, duration ns, end on the epoch clock ns) of each NCCL kernel, in start order
    (all on one stream in these traces), from a plain JSON parse."""
    ev = [e for e in json.loads(path.read_text())["traceEvents"]
          if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    ev.sort(key=lambda e: e["ts"])
    return [(e["name"].split("_")[1], round(e["dur"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in ev]


def _expected_waits(paths: list[Path]) -> dict[int, dict]:
    """Per late rank: the others' wait per collective (duration minus the shortest)."""
    per_rank = {int(json.loads(p.read_text())["distributedInfo"]["rank"]): _nccl_durations(p) for p in paths}
    n = {len(v) for v in per_rank.values()}
    assert len(n) == 1
    out: dict[int, dict] = {}
    for i in range(n.pop()):
        durs = {r: v[i][1] for r, v in per_rank.items()}
        assert len({v[i][0] for v in per_rank.values()}) == 1  # the same collective on every rank
        late = min(durs, key=durs.get)
        waits = {r: d - durs[late] for r, d in durs.items() if r != late}
        e = out.setdefault(late, {"total": 0, "mean": 0.0, "count": 0, "first": None})
        e["total"] += sum(waits.values())
        e["mean"] += sum(waits.values()) / len(waits)
        e["count"] += 1
        e["first"] = e["first"] or waits
    return out


def test_stragglers_are_the_ranks_the_others_wait_for(rank_dir):
    """DLRM: ranks 1 and 3 have the most compute and the longest collectives, but they
    arrive first and wait; rank 2 arrives last at the first all-to-all (the others wait
    1.6-7.1 ms there) and the ranks finish each collective within 10 us of each other."""
    paths = expand_traces(rank_dir)
    res = advise_ranks(paths, workers=1)
    exp = _expected_waits(paths)
    windows = sorted(r.summary["window_ns"] for r in res.ranks)
    med = (windows[1] + windows[2]) / 2
    strag = [r for r, e in exp.items() if e["mean"] >= STRAGGLER_SHARE * med]
    assert strag == [2]
    assert [s["rank"] for s in res.stragglers] == [2]
    s = res.stragglers[0]
    assert s["others_waited_ns"] == exp[2]["total"] and s["collectives_arrived_last"] == exp[2]["count"]
    assert s["mean_wait_per_rank_ns"] == int(exp[2]["mean"])
    first = s["collectives"][0]
    assert first["collective"] == "SendRecv #1"
    assert first["waited_ns"] == {str(r): w for r, w in exp[2]["first"].items()}
    assert first["waited_ns"]["1"] == 7635000 - 518000  # 7.63 ms on rank 1 against 0.52 ms on rank 2
    # the ranks finish together: the spread of the ends on the epoch clock is what the JSON says
    ends = [_nccl_durations(p) for p in paths]
    spread = max(max(e[i][2] for e in ends) - min(e[i][2] for e in ends) for i in range(len(ends[0])))
    assert res.collectives["end_spread_ns"]["max"] == spread <= 10_000
    assert res.collectives["matched"] == len(ends[0]) and res.collectives["alignment"] == "end"
    assert "4 of the job's 8 ranks" in res.collectives["note"]
    top = res.collectives["largest_skews"][0]
    assert (top["collective"], top["late_rank"], top["skew_ns"]) == ("SendRecv #1", 2, max(exp[2]["first"].values()))
    per_rank = {int(json.loads(p.read_text())["distributedInfo"]["rank"]): _nccl_durations(p) for p in paths}
    for r in res.ranks:  # each rank's own wait: its duration minus the shortest, summed
        own = sum(v[i][1] - min(w[i][1] for w in per_rank.values()) for i, v in [(i, per_rank[r.rank])
                                                                               for i in range(len(ends[0]))])
        assert r.waits["waited_ns"] == own
    assert max(res.ranks, key=lambda r: r.waits["waited_ns"]).rank == 1


def test_straggler_found(rank_dir, tmp_path):
    """Rank 3 made to arrive last at every collective (each NCCL kernel cut to 1 us, ending
    where it ended): the others wait their whole kernel minus 1 us for it."""
    for p in sorted(rank_dir.iterdir()):
        doc = json.loads(p.read_text())
        if "worker3" in p.name:
            for e in doc["traceEvents"]:
                if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower():
                    e["ts"], e["dur"] = e["ts"] + e["dur"] - 1, 1
        (tmp_path / p.name).write_text(json.dumps(doc))
    res = advise_ranks(expand_traces(tmp_path), workers=1)
    assert [s["rank"] for s in res.stragglers] == [3]
    others = [_nccl_durations(p) for p in sorted(tmp_path.iterdir()) if "worker3" not in p.name]
    assert res.stragglers[0]["others_waited_ns"] == sum(d - 1000 for o in others for _, d, _ in o)
    assert res.stragglers[0]["collectives_arrived_last"] == len(others[0])


def test_unrelated_traces_are_not_ranks(tmp_path):
    """Four unrelated H100 traces: no rank in them (numbered by order, not '100' from
    'h100'), and a warning that they are not the ranks of one job."""
    src = sorted((SHARED_TRACES / "h100").glob("*"))
    src = [p for p in src if p.name.endswith((".sqlite", ".json.gz"))]
    if len(src) < 2:
        pytest.skip("../shared/traces/h100 is not present")
    for p in src:
        (tmp_path / p.name).symlink_to(p)
    r = CliRunner().invoke(main, ["advise", str(tmp_path), "--json", "--workers", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert sorted(x["rank"] for x in doc["ranks"]) == list(range(len(src)))
    assert {x["rank_source"] for x in doc["ranks"]} == {"order"}
    assert any("say no rank" in w for w in doc["warnings"])
    assert any("different kernels" in w for w in doc["warnings"])
    assert doc["stragglers"] == []
    r = CliRunner().invoke(main, ["advise", str(tmp_path), "--workers", "1"])
    assert r.output.count("warning:") == 1 and "rank 100" not in r.output


def test_local_processes_and_dask_localcluster_agree(rank_dir):
    paths = expand_traces(str(rank_dir / "*.json"))
    local = advise_ranks(paths, workers=2)
    dask = advise_ranks(paths, dask="local", workers=2)
    a, b = local.to_dict(), dask.to_dict()
    assert a.pop("engine") == "local processes" and b.pop("engine") == "dask LocalCluster"
    assert a == b


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


def test_rank_of_an_nsys_mpi_trace(tmp_path):
    """nsys names an MPI process's main thread ``MPI Rank N`` (an NVTX thread-name event);
    the rank comes from there, not from the '0' at the end of the file name."""
    import sqlite3

    src = SHARED_TRACES / "nsys" / "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
    if not src.exists():
        pytest.skip("the MPI export of ../shared is not present")
    con = sqlite3.connect(src)
    (name,) = con.execute("SELECT text FROM NVTX_EVENTS WHERE text LIKE 'MPI Rank %'").fetchone()
    con.close()
    (tmp_path / "job_a.sqlite").symlink_to(src)
    res = advise_ranks(expand_traces(tmp_path), workers=1)
    (r,) = res.ranks
    assert (r.rank, r.rank_source) == (int(name.split()[-1]), "trace")


def test_html_and_markdown_name_the_straggler_by_the_waits(rank_dir, tmp_path):
    """The many-rank HTML and Markdown reports say what the terminal says: rank 2 is the
    straggler, with the others' total wait from the JSON (not the old compute-excess rule)."""
    paths = expand_traces(rank_dir)
    exp = _expected_waits(paths)
    out_html, out_md = tmp_path / "r.html", tmp_path / "r.md"
    r = CliRunner().invoke(main, ["advise", str(rank_dir), "--no-history", "--workers", "1",
                                  "--html", str(out_html), "--md", str(out_md)])
    assert r.exit_code == 0, r.output
    waited = f"the others waited {exp[2]['total'] / 1e6:.1f} ms in total"
    for page in (out_html.read_text(), out_md.read_text()):
        assert "rank 2: arrives last at" in page and waited in page
        assert "above the median rank" not in page
