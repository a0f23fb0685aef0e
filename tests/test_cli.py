"""The CLI: exit codes, one-line errors for bad input, JSON contract shape, --help."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from recsys_doctor.cli import main
from recsys_doctor.cli.advise import demo_trace_path, parse_time

DEMO = demo_trace_path()


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def assert_bad_input(res, *needles: str) -> None:
    """Exit 2, exactly one line on stderr, no traceback, nothing on stdout."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout == ""
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]


def test_help_lists_commands_and_exit_codes():
    res = run("--help")
    assert res.exit_code == 0
    assert "advise" in res.stdout
    assert "2 bad input" in res.stdout
    res = run("advise", "--help")
    assert res.exit_code == 0
    for opt in ("--json", "--nvtx", "--start", "--end", "--short-kernel-us", "--set", "--demo"):
        assert opt in res.stdout


def test_python_dash_m_works():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "recsys_doctor", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "recsys-doctor" in out.stdout


def test_missing_file(tmp_path):
    assert_bad_input(run("advise", str(tmp_path / "nope.sqlite")), "nope.sqlite", "no such file")


def test_directory(tmp_path):
    assert_bad_input(run("advise", str(tmp_path)), "directory")


def test_no_trace_given():
    assert_bad_input(run("advise"), "no trace")


def test_not_a_trace(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello, this is not a trace\n")
    assert_bad_input(run("advise", str(p)), "notes.txt", "not a trace")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    assert_bad_input(run("advise", str(p)), "empty")


def test_truncated_sqlite(tmp_path):
    p = tmp_path / "trunc.sqlite"
    with gzip.open(DEMO) as f:
        p.write_bytes(f.read(8192))
    assert_bad_input(run("advise", str(p)), "trunc.sqlite")


def test_corrupt_sqlite_body(tmp_path):
    p = tmp_path / "corrupt.sqlite"
    with gzip.open(DEMO) as f:
        data = bytearray(f.read())
    # keep the header, scribble over the schema and the first data pages
    data[100:200_000] = os.urandom(200_000 - 100)
    p.write_bytes(bytes(data))
    assert_bad_input(run("advise", str(p)), "corrupt.sqlite")


def test_sqlite_not_nsys(tmp_path):
    p = tmp_path / "other.sqlite"
    with contextlib.closing(sqlite3.connect(p)) as con, con:  # a valid SQLite database, not an nsys export
        con.executescript("CREATE TABLE users(id INTEGER, name TEXT); INSERT INTO users VALUES (1, 'a');")
    assert_bad_input(run("advise", str(p)), "other.sqlite", "nsys")


def test_invalid_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1')
    assert_bad_input(run("advise", str(p)), "bad.json")


def test_json_not_a_trace(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"learning_rate": 0.1}))
    assert_bad_input(run("advise", str(p)), "config.json")


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "trace.json.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(64))
    assert_bad_input(run("advise", str(p)), "trace.json.gz")


def test_nsys_rep_without_nsys(tmp_path, project_data, monkeypatch):
    import recsys_doctor.loaders.nsysrep as nsysrep

    monkeypatch.setattr(nsysrep, "NSYS_GLOBS", ())  # no install folders to search
    rep = project_data / "wdl_serial_q4_nsysrep" / "wdl_serial_q4.nsys-rep"
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {"PATH": str(empty_bin), "RECSYS_DOCTOR_NSYS": "", "RECSYS_DOCTOR_CACHE": str(tmp_path / "cache")}
    res = run("advise", str(rep), env=env)
    assert_bad_input(res, "nsys")
    assert "nsys export --type sqlite" in res.stderr


def test_real_nsys_rep_matches_its_export(tmp_path, project_data, monkeypatch):
    """Where a real nsys is installed (the GPU machine), the shipped .nsys-rep exports and
    loads to the same tables as the SQLite export that was made from it."""
    from recsys_doctor.errors import NsysNotFoundError
    from recsys_doctor.loaders import load
    from recsys_doctor.loaders.nsysrep import find_nsys

    try:
        find_nsys()
    except NsysNotFoundError:
        pytest.skip("no nsys on this machine")
    monkeypatch.setenv("RECSYS_DOCTOR_CACHE", str(tmp_path / "cache"))
    a = load(project_data / "wdl_serial_q4_nsysrep" / "wdl_serial_q4.nsys-rep")
    b = load(DEMO)
    for t in ("kernels", "memcpys", "api", "ranges"):
        assert len(getattr(a, t)) == len(getattr(b, t)), t


def test_bad_option_value():
    assert_bad_input(run("advise", str(DEMO), "--set", "no_such_threshold=3"), "no_such_threshold")
    assert_bad_input(run("advise", str(DEMO), "--start", "yesterday"), "--start")
    assert_bad_input(run("advise", str(DEMO), "--start", "2s", "--end", "1s"), "window")


def test_unknown_nvtx_range():
    assert_bad_input(run("advise", str(DEMO), "--nvtx", "no-such-range"), "no-such-range")


def test_unreadable_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can read any file")
    p = tmp_path / "secret.sqlite"
    p.write_bytes(b"x")
    p.chmod(0)
    assert_bad_input(run("advise", str(p)), "permission")


@pytest.mark.parametrize("text,ns", [("1.5s", 1_500_000_000), ("200ms", 200_000_000), ("35us", 35_000),
                                     ("1000ns", 1000), ("2", 2_000_000_000)])
def test_parse_time(text, ns):
    assert parse_time(text, "--start") == ns


def test_demo_json_contract():
    res = run("advise", "--demo", "--json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["schema"] == 1
    assert set(d) >= {"schema", "trace", "summary", "findings", "plan"}
    for k in ("kernels", "gpu_utilization", "short_kernel_fraction", "launch_threads_per_stream_max",
              "memcpy", "sync_calls"):
        assert k in d["summary"]
    assert set(d["summary"]["memcpy"]) >= {"h2d", "d2h", "direction_switches"}
    for f in d["findings"]:
        assert set(f) >= {"id", "severity", "title", "evidence", "recommendation", "where"}
        assert f["severity"] in ("high", "medium", "low", "note")


def test_demo_terminal_report():
    res = run("advise", "--demo")
    assert res.exit_code == 0, res.stderr
    assert "Summary" in res.stdout
    assert "launch-bound" in res.stdout
    assert "Proposed multi-stream plan" in res.stdout


def test_several_traces_give_a_json_array(project_data):
    k = project_data / "wdl_eager_q2_kineto" / "wdl_eager_q2.pt.trace.json.gz"
    res = run("advise", "--json", str(DEMO), str(k))
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert isinstance(d, list) and len(d) == 2
    assert [x["trace"]["format"] for x in d] == ["nsys-sqlite", "kineto-json"]


def test_docs_options_md_is_current():
    """docs/options.md documents every threshold, as generated from options.py."""
    from recsys_doctor.options import Options, options_markdown

    doc = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    assert doc == options_markdown()
    for name, _default, text in Options.documented():
        assert text, f"Options.{name} has no #: comment saying what it means"


def test_advise_starts_a_large_kineto_decode_before_pandas(tmp_path):
    """``advise`` on one large PyTorch profiler trace forks the decoding helper before it
    imports pandas and the analyzers: the command line, the package and the decoding
    modules import without pandas, and ``prefetch`` is called with pandas still absent."""
    import subprocess
    import sys

    big = tmp_path / "big.json"
    ev = '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": %d, "dur": 2, "args": {}}'
    big.write_text('{"traceEvents": [\n' + ",\n".join(ev % (1000 + i) for i in range(4000)) + "\n]}\n")
    code = f"""
import sys
import recsys_doctor.loaders._kineto_chunks as c
import recsys_doctor.loaders._kineto_decode as d
import recsys_doctor.loaders._kineto_stream as s
assert "pandas" not in sys.modules, "imported pandas"
s.STREAM_MIN = s.SPLIT_MIN = 0
c.STREAM_CHUNK = 20_000
seen = []
real = d.prefetch
def spy(p, factory):
    seen.append("pandas" in sys.modules)
    return real(p, factory)
d.prefetch = spy
from recsys_doctor.cli import main
assert "pandas" not in sys.modules, "imported pandas"
try:
    main(["advise", "--json", "--no-history", {str(big)!r}])
except SystemExit as e:
    assert not e.code, e.code
assert seen == [False], seen
print("kernels", "pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"kernels": 4000' in out.stdout and out.stdout.rstrip().endswith("kernels True")
