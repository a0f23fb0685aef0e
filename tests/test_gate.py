"""The CI gate: rules, baselines, JUnit/GitHub output, compare, the CLI exit codes."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from _gitrepo import git_repo
from click.testing import CliRunner

from recsys_doctor import gate
from recsys_doctor.cli import main
from recsys_doctor.errors import BadInputError


def _run(util, findings=(), path="/x/run.sqlite", **extra):
    return {"schema": 1, "trace": {"path": path, "format": "nsys-sqlite"},
            "summary": {"kernels": 10, "gpu_utilization": util, "short_kernel_fraction": 0.5,
                        "launch_threads_per_stream_max": 1, "memcpy": {"h2d": 3, "d2h": 1, "direction_switches": 2},
                        "sync_calls": 0, **extra},
            "findings": [{"id": i, "severity": s, "title": f"{i} title", "evidence": {}, "recommendation": "",
                          "where": []} for i, s in findings],
            "plan": {}, "analyses": {}}


def _write(tmp_path: Path, name: str, data) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("text,want", [("0.4", 0.4), ("40%", 0.4), (" 5% ", 0.05), ("1", 1.0), ("0", 0.0)])
def test_parse_fraction(text, want):
    assert gate.parse_fraction(text, "--x") == pytest.approx(want)


@pytest.mark.parametrize("text", ["40", "abc", "-0.1", "120%"])
def test_parse_fraction_rejects(text):
    with pytest.raises(BadInputError):
        gate.parse_fraction(text, "--x")


def test_min_utilization():
    bad = gate.check(_run(0.25), min_utilization=0.3)
    assert not bad.passed and len(bad.reasons) == 1
    assert "gpu_utilization" in bad.reasons[0] and "0.2500" in bad.reasons[0] and "0.3000" in bad.reasons[0]
    assert gate.check(_run(0.3), min_utilization=0.3).passed


def test_max_drop_is_absolute():
    base = gate.baseline_from_result(_run(0.50))
    assert gate.check(_run(0.46), base, max_drop=0.05).passed  # 4 points
    res = gate.check(_run(0.40), base, max_drop=0.05)  # 10 points
    assert not res.passed
    (reason,) = res.reasons
    assert "gpu_utilization" in reason and "0.5000" in reason and "0.4000" in reason and "0.1000" in reason
    assert gate.check(_run(0.9), base, max_drop=0.0).passed  # a rise is never a drop


def test_fail_on_only_new_findings():
    base = gate.baseline_from_result(_run(0.5, [("launch-bound", "high")]))
    cur = _run(0.5, [("launch-bound", "high"), ("sync-api", "medium"), ("small-grid", "low")])
    assert gate.check(cur, base, fail_on="high").passed
    res = gate.check(cur, base, fail_on="medium")
    assert res.reasons == ["new medium finding 'sync-api' (not in the baseline): sync-api title"]
    assert len(gate.check(cur, base, fail_on="low").reasons) == 2
    # without a baseline every finding at that severity is new
    assert len(gate.check(cur, None, fail_on="high").reasons) == 1


def test_baseline_alone_uses_defaults():
    base = gate.baseline_from_result(_run(0.5))
    assert [r.name for r in gate.check(_run(0.5), base).rules] == ["max-drop", "fail-on-high"]
    assert gate.check(_run(0.5 - gate.DEFAULT_MAX_DROP + 0.001), base).passed
    assert not gate.check(_run(0.5 - gate.DEFAULT_MAX_DROP - 0.001), base).passed


def test_bad_rule_combinations():
    with pytest.raises(BadInputError, match="nothing to check"):
        gate.check(_run(0.5))
    with pytest.raises(BadInputError, match="needs a baseline"):
        gate.check(_run(0.5), max_drop=0.1)
    with pytest.raises(BadInputError, match="gpu_utilization"):
        gate.check(_run(None), min_utilization=0.1)


def test_load_baseline_formats(tmp_path):
    adv = _write(tmp_path, "adv.json", _run(0.4, [("a", "high")]))
    lst = _write(tmp_path, "list.json", [_run(0.4)])
    b = gate.load_baseline(adv)
    assert b.utilization == 0.4 and b.finding_ids == {"a"}
    assert gate.load_baseline(lst).utilization == 0.4
    wb = tmp_path / "wb.json"
    gate.write_baseline(_run(0.33, [("x", "low")]), wb)
    data = json.loads(wb.read_text())
    assert data["kind"] == "recsys-doctor-baseline" and "analyses" not in data
    assert gate.load_baseline(wb).utilization == 0.33
    for bad in (_write(tmp_path, "two.json", [_run(0.1), _run(0.2)]), _write(tmp_path, "nosum.json", {"a": 1}),
                tmp_path / "missing.json"):
        with pytest.raises(BadInputError):
            gate.load_baseline(bad)
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(BadInputError):
        gate.load_baseline(tmp_path / "garbage.json")


def test_junit_xml_escapes_and_counts():
    base = gate.baseline_from_result(_run(0.5))
    cur = _run(0.2, [("k<&>", "high")])
    res = gate.check(cur, base, max_drop=0.05, fail_on="high", min_utilization=0.1)
    root = ET.fromstring(gate.junit_xml(res))
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "2"
    fails = {tc.get("name"): tc.find("failure") for tc in suite.findall("testcase")}
    assert fails["min-utilization"] is None
    assert "k<&>" in fails["fail-on-high"].get("message")


def test_github_annotations():
    res = gate.check(_run(0.2), min_utilization=0.5)
    assert gate.github_annotations(res, env={}) == []
    (line,) = gate.github_annotations(res, env={"GITHUB_ACTIONS": "true"})
    assert line.startswith("::error") and "::gpu_utilization 0.2000" in line


def test_compare():
    a = _run(0.2, [("launch-bound", "high"), ("sync-api", "low")], kernels_extra=1)
    b = _run(0.5, [("launch-bound", "medium"), ("small-grid", "low")])
    c = gate.compare(a, b)
    m = {x["metric"]: x for x in c.metrics}
    assert m["gpu_utilization"]["delta"] == pytest.approx(0.3)
    assert m["memcpy_h2d"]["delta"] == 0
    assert m["kernels_extra"]["b"] is None and m["kernels_extra"]["delta"] is None
    assert [f["id"] for f in c.appeared] == ["small-grid"]
    assert [f["id"] for f in c.disappeared] == ["sync-api"]
    assert c.changed == [{"id": "launch-bound", "a": "high", "b": "medium", "title": "launch-bound title"}]


# --- CLI ----------------------------------------------------------------------------------

def _cli(*args):
    return CliRunner().invoke(main, [*map(str, args)])


def test_check_cli_exit_codes(tmp_path):
    base = _write(tmp_path, "base.json", _run(0.5))
    good = _write(tmp_path, "good.json", _run(0.48))
    bad = _write(tmp_path, "bad.json", _run(0.3, [("launch-bound", "high")]))
    db = tmp_path / "h.db"
    r = _cli("check", good, "--baseline", base, "--db", db)
    assert r.exit_code == 0, r.output
    r = _cli("check", bad, "--baseline", base, "--db", db, "--junit", tmp_path / "j.xml")
    assert r.exit_code == 1
    assert r.stderr.strip() == f"wrote {tmp_path / 'j.xml'}"  # every written file named on stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "0.5000" in lines[0] and "0.3000" in lines[0] and "gpu_utilization" in lines[0]
    assert "launch-bound" in lines[1]
    assert ET.parse(tmp_path / "j.xml").getroot().find("testsuite").get("failures") == "2"
    # both checks recorded, with their verdicts
    r = _cli("history", "--db", db, "--json")
    assert [x["passed"] for x in json.loads(r.output)] == [False, True]
    # bad input: exit 2, one line, no traceback
    for args in (["check", good, "--baseline", tmp_path / "nope.json"], ["check", good],
                 ["check", good, "--min-utilization", "40"], ["check", tmp_path / "nope.sqlite", "--min-utilization", "0.1"]):
        r = _cli(*args, "--no-history")
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output


def test_check_cli_github(tmp_path):
    bad = _write(tmp_path, "bad.json", _run(0.1))
    r = CliRunner(env={"GITHUB_ACTIONS": "true"}).invoke(
        main, ["check", str(bad), "--min-utilization", "50%", "--no-history"])
    assert r.exit_code == 1
    assert re.search(r"^::error title=recsys-doctor check::gpu_utilization 0\.1000", r.output, re.M)


def test_check_write_baseline_and_baseline_db(tmp_path, monkeypatch):
    git_repo(tmp_path / "repo", "main")
    monkeypatch.chdir(tmp_path / "repo")
    db = tmp_path / "h.db"
    main_run = _write(tmp_path, "run.json", _run(0.6, path="/ci/run.sqlite"))
    wb = tmp_path / "wb.json"
    r = _cli("check", main_run, "--write-baseline", wb, "--db", db)
    assert r.exit_code == 0 and gate.load_baseline(wb).utilization == 0.6
    cur = _write(tmp_path, "cur.json", _run(0.3, path="/ci/run.sqlite"))
    r = _cli("check", cur, "--baseline-db", "main", "--db", db, "--no-history")
    assert r.exit_code == 1 and "0.6000" in r.output and "0.3000" in r.output
    r = _cli("check", cur, "--baseline-db", "no-such-branch", "--db", db, "--no-history")
    assert r.exit_code == 2 and "no passed check recorded" in r.output


def test_compare_cli(tmp_path):
    a = _write(tmp_path, "a.json", _run(0.2, [("x", "high")]))
    b = _write(tmp_path, "b.json", _run(0.5, [("y", "low")]))
    r = _cli("compare", a, b, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [f["id"] for f in d["appeared"]] == ["y"] and [f["id"] for f in d["disappeared"]] == ["x"]
    r = _cli("compare", a, b, "--html", tmp_path / "c.html")
    assert r.exit_code == 0 and "gpu_utilization" in r.output and "+0.3" in r.output
    assert "data:image/png;base64," in (tmp_path / "c.html").read_text()


# --- acceptance on the real H100 traces ----------------------------------------------------

@pytest.fixture(scope="module")
def h100_json(shared_traces, tmp_path_factory):
    d = tmp_path_factory.mktemp("h100")
    out = {}
    for name in ("graphs", "serial"):
        r = _cli("advise", "--json", shared_traces / "h100" / f"wdl_{name}_q4_h100.sqlite")
        assert r.exit_code == 0, r.output[-2000:]
        p = d / f"{name}.json"
        p.write_text(r.stdout)
        out[name] = p
    return out


@pytest.mark.shared
def test_acceptance_serial_regresses_against_graphs(shared_traces, h100_json, tmp_path):
    serial = shared_traces / "h100" / "wdl_serial_q4_h100.sqlite"
    graphs = shared_traces / "h100" / "wdl_graphs_q4_h100.sqlite"
    u_g = json.loads(h100_json["graphs"].read_text())["summary"]["gpu_utilization"]
    u_s = json.loads(h100_json["serial"].read_text())["summary"]["gpu_utilization"]
    r = _cli("check", serial, "--baseline", h100_json["graphs"], "--no-history")
    assert r.exit_code == 1, r.output
    line = next(ln for ln in r.output.splitlines() if "gpu_utilization" in ln)
    assert f"{u_g:.4f}" in line and f"{u_s:.4f}" in line
    r = _cli("check", graphs, "--baseline", h100_json["serial"], "--no-history")
    assert r.exit_code == 0, r.output
    # the same through a --write-baseline file
    wb = tmp_path / "graphs.baseline.json"
    assert _cli("check", h100_json["graphs"], "--write-baseline", wb, "--no-history").exit_code == 0
    r = _cli("check", h100_json["serial"], "--baseline", wb, "--no-history")
    assert r.exit_code == 1 and f"{u_g:.4f}" in r.output
