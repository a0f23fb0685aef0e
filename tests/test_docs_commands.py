"""The command lines of README.md and docs/ci.md, run as they are written (issue 26).

They are read from the documents at test time, so a document that changes changes the
test: a synopsis whose options a command would refuse, or an example whose lines the tool
does not print, fails here.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from _gitrepo import git_repo
from click.testing import CliRunner

from recsys_doctor.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_MD = ROOT / "docs" / "ci.md"

# --- README: every synopsis line parses as written -------------------------------------------


def _synopses() -> list[str]:
    """The indented ``recsys-doctor CMD ...`` lines of README.md with their continuation
    lines (indented, starting with ``[``) joined on."""
    out: list[str] = []
    for line in README.read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if line.startswith("    recsys-doctor "):
            out.append(s)
        elif out and line.startswith("    ") and s.startswith("[") and out[-1] and not line.startswith("    recsys"):
            out[-1] += " " + s
    return out


_VALUES = {"N": "3", "S": "2", "NAME": "query", "TIME": "1s", "NAME=VALUE": "short_gap_us=3", "FILE": "out.x",
           "ADDRESS|local": "local", "DIR": "outdir", "B": "main", "W": "wdl", "BRANCH": "main", "X": "0.4",
           "D": "0.05", "auto|nsys|torch": "torch", "high|medium|low": "high"}


def _instance(synopsis: str) -> list[str]:
    """The synopsis with every optional part taken (the first alternative of ``a | b``)
    and every metavar replaced by a value of its kind: the words a user would type."""
    words: list[str] = []
    for part in re.findall(r"\[[^\]]*\]|\S+", synopsis):
        if part.startswith("["):
            part = part[1:-1].split(" | ")[0]
            if part.endswith(" ..."):
                part = part[:-4]
        for w in part.split():
            if w in _VALUES:
                words.append(_VALUES[w])
            elif w in ("...", "--") or w.startswith("-") or w.islower():
                words.append(w)
            else:
                words.append(_VALUES.get(w, w.lower().rstrip(".")))
    return words[1:]  # without the program name


SYNOPSES = _synopses()


def test_readme_has_the_synopses():
    cmds = {s.split()[1] for s in SYNOPSES}
    assert {"advise", "profile", "apply", "history", "check", "compare"} <= cmds


@pytest.mark.parametrize("synopsis", SYNOPSES, ids=[" ".join(s.split()[:3]) for s in SYNOPSES])
def test_readme_synopsis_parses_as_written(synopsis):
    """Each synopsis, with all its options, is accepted by click where it stands (a
    parse only: nothing is run), and every option lands in the command's parameters."""
    words = _instance(synopsis)
    cmd = main.commands[words[0]]
    with cmd.make_context(words[0], words[1:], resilient_parsing=False) as ctx:
        params = ctx.params
    ours = words[1:words.index("--")] if "--" in words else words[1:]
    for w in ours:
        if w.startswith("--"):
            opt = next(p for p in cmd.params if w in p.opts)
            assert params[opt.name] not in (None, False, ()), f"{w} of {synopsis!r} was not taken as an option"


def test_readme_apply_line_runs_as_written(tmp_path, monkeypatch):
    """``apply PLAN.json [--compare] [--json] -- python SCRIPT.py`` with its options where
    the README puts them (after PLAN): the script is run twice and compared (issue 26:
    it said "cannot run '--compare': no such program")."""
    line = next(s for s in SYNOPSES if s.split()[1] == "apply")
    script = tmp_path / "x.py"
    script.write_text("import json\nprint(json.dumps({'qps': 100.0, 'checksum': 1.5}))\n")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"kind": "multi-stream", "stream_groups": {"count": 2, "reason": "r"}}))
    argv = []
    for part in re.findall(r"\[[^\]]*\]|\S+", line)[1:]:
        argv.append(part.strip("[]"))
    argv = [{"PLAN.json": str(plan), "python": sys.executable, "SCRIPT.py": str(script)}.get(w, w)
            for w in argv if w != "ARGS"]
    assert argv[:4] == ["apply", str(plan), "--compare", "--json"]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["before"]["qps"] == 100.0 and out["after"]["qps"] == 100.0
    # the command keeps its own options after --: --json goes to the script, not to apply
    script.write_text("import json, sys\nprint(json.dumps({'qps': float(len(sys.argv))}))\n")
    r = CliRunner().invoke(main, ["apply", str(plan), "--compare", "--", sys.executable, str(script), "--json"])
    assert r.exit_code == 0, r.output
    assert r.stdout.split()[:4] == ["queries/s", "2.0", "->", "2.0"]  # argv = [x.py, --json]: 2
    # an option apply does not have, before --, is a usage error (exit 2), not a program name
    r = CliRunner().invoke(main, ["apply", str(plan), "--bogus", "--", sys.executable, str(script)])
    assert r.exit_code == 2 and "--bogus" in r.output


def test_readme_inline_command_lines_run(tmp_path, monkeypatch):
    """The complete command lines README.md quotes inline (`recsys-doctor ...` with
    arguments, not a bare section title), run with plan.json and script.py made here."""
    lines = [m for m in re.findall(r"`(recsys-doctor [^`]+)`", README.read_text(encoding="utf-8"))
             if len(m.split()) > 2 or m.split()[1].startswith("-")]
    assert "recsys-doctor --help" in lines and "recsys-doctor apply plan.json -- python script.py" in lines
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(json.dumps({"kind": "serving", "stream_groups": {"count": 2, "reason": "r"}}))
    Path("script.py").write_text("print('ran')\n")
    for line in lines:
        argv = [sys.executable if w == "python" else w for w in shlex.split(line)[1:]]
        r = CliRunner().invoke(main, argv)  # apply: the script's own exit status
        assert r.exit_code == 0, (line, r.output)


def test_apply_without_dashes_keeps_the_command_options(tmp_path):
    """Without ``--`` the command starts at the first word after PLAN (as before)."""
    ctx = main.commands["apply"].make_context("apply", ["p.json", "--compare", "python", "x.py", "--json"])
    assert ctx.params["compare"] is True and ctx.params["as_json"] is False
    assert ctx.params["command"] == ("python", "x.py", "--json")


# --- docs/ci.md: the gate example prints what the document says --------------------------------


def _ci_example() -> list[tuple[str, list[str]]]:
    """(command line, the lines printed after it) of the example block in docs/ci.md."""
    text = CI_MD.read_text(encoding="utf-8")
    block = text[text.index("Example (the project's own acceptance"):]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```")]
    out: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


@pytest.mark.shared
def test_ci_md_gate_example_prints_its_lines(shared_traces, tmp_path, monkeypatch):
    """Baseline wdl_graphs_q4_h100, candidate wdl_serial_q4_h100: the example's lines are
    what the tool prints, the findings that rose from note/medium to high among them."""
    h100 = shared_traces / "h100"
    monkeypatch.chdir(tmp_path)
    steps = _ci_example()
    assert [c.split()[:2] for c, _ in steps] == [["recsys-doctor", "advise"], ["recsys-doctor", "check"],
                                                 ["echo", "$?"], ["recsys-doctor", "check"], ["echo", "$?"]]
    rc = None
    for cmd, expected in steps:
        if cmd.startswith("echo"):
            assert expected == [str(rc)]
            continue
        words, out_file = shlex.split(cmd), None
        if ">" in words:
            out_file = words[words.index(">") + 1]
            words = words[:words.index(">")]
        args = [str(h100 / w) if w.endswith(".sqlite") else w for w in words[1:]]
        r = CliRunner().invoke(main, args)
        rc = r.exit_code
        if out_file:
            Path(out_file).write_text(r.stdout)
        else:
            assert r.stdout.splitlines() == expected
    assert rc == 1
    # independently of the rule's code, from the JSONs: per candidate, the ids that are high
    # and were milder in the baseline (risen) or absent (new)
    base = {f["id"]: f["severity"] for f in json.loads(Path("graphs.json").read_text())["findings"]}
    checks = [(c, lines) for c, lines in steps if c.split()[1] == "check"]
    risen_all = set()
    for cmd, lines in checks:
        cur = json.loads(CliRunner().invoke(main, ["advise", "--json", "--no-history",
                                                   str(h100 / shlex.split(cmd)[2])]).stdout)
        high = {f["id"] for f in cur["findings"] if f["severity"] == "high"}
        risen = {i for i in high if base.get(i) in ("medium", "low", "note")}
        new = {i for i in high if i not in base}
        assert {m for line in lines for m in re.findall(r"^finding '([^']+)' rose", line)} == risen
        assert {m for line in lines for m in re.findall(r"^new high finding '([^']+)'", line)} == new
        risen_all |= risen
    assert "memcpy-ping-pong" in risen_all  # medium in graphs, high in torch_matmul


@pytest.mark.shared
def test_baseline_db_gate_sees_severity_rise(shared_traces, tmp_path, monkeypatch):
    """The issue's steps: graphs recorded as main's baseline, a candidate checked with
    ``--baseline-db main``: it fails on the risen finding, not only on the drop. (Since
    every idle gap is counted once, the serial run's short-kernels and graph-candidate stay
    notes and its contention is new; torch_matmul's memcpy-ping-pong rises medium -> high.)"""
    h100 = shared_traces / "h100"
    git_repo(tmp_path / "repo", "main")
    monkeypatch.chdir(tmp_path / "repo")
    db = tmp_path / "h.db"
    r = CliRunner().invoke(main, ["check", str(h100 / "wdl_graphs_q4_h100.sqlite"), "--workload", "wdl",
                                  "--write-baseline", str(tmp_path / "b.json"), "--db", str(db)])
    assert r.exit_code == 0, r.output
    # the utilization rule alone would fail it too: allow any drop, so only --fail-on speaks
    r = CliRunner().invoke(main, ["check", str(h100 / "torch_matmul_2threads_h100.sqlite"), "--workload", "wdl",
                                  "--baseline-db", "main", "--max-drop", "1", "--fail-on", "high",
                                  "--db", str(db), "--no-history"])
    assert r.exit_code == 1, r.output
    assert "finding 'memcpy-ping-pong' rose from medium in the baseline to high" in r.stdout
    assert "no new" not in r.stdout
