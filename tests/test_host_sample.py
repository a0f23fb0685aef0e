"""``profile --host-sample``: py-spy snapshots of a program's threads, on this CPU-only
machine (a plain Python script with two busy threads; no GPU needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from recsys_doctor.capture.backend import has_gpu
from recsys_doctor.capture.host_sample import find_py_spy, sample_process
from recsys_doctor.cli import main

needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed (the [test] extra has it)")

SCRIPT = '''
import threading, time

def busy_alpha(stop):
    x = 0
    while time.time() < stop:
        x += 1

def busy_beta(stop):
    y = 0
    while time.time() < stop:
        y = (y * 3 + 1) % 1000003

stop = time.time() + 3.0
ts = [threading.Thread(target=busy_alpha, args=(stop,), name="client-a"),
      threading.Thread(target=busy_beta, args=(stop,), name="client-b")]
for t in ts:
    t.start()
for t in ts:
    t.join()
'''


@needs_py_spy
@pytest.mark.skipif(has_gpu(), reason="the GPU path runs the full capture; this checks the CPU-only one")
def test_host_sample_names_the_busy_functions(tmp_path):
    script = tmp_path / "two_threads.py"
    script.write_text(SCRIPT)
    res = CliRunner().invoke(main, ["profile", "--host-sample", "--json", "--out", str(tmp_path / "out"), str(script)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["no_gpu"] is True and d["exit_code"] == 0
    h = d["host_sampling"]
    assert h["reason"] is None and h["snapshots"] >= 5
    by_name = {t["name"]: t for t in h["threads"]}
    for name, fn in (("client-a", "busy_alpha"), ("client-b", "busy_beta")):
        t = by_name[name]
        assert t["top_frames"][0]["frame"].startswith(f"{fn} (two_threads.py)"), t
        assert 0.1 <= t["gil_share"] <= 0.9, t  # two spinning threads take turns with the GIL
        assert 0.0 <= t["top_frames"][0]["share"] <= 1.0
    assert sum(t["gil_share"] for t in h["threads"]) <= 1.0 + 1e-3  # one GIL: at most one holder a snapshot (rounded)
    assert by_name["MainThread"]["gil_share"] <= 0.2  # it only waits in join()
    assert json.loads((tmp_path / "out" / "host_sample.json").read_text())["host_sampling"] == h


@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_ptrace_permission_one_clear_line(tmp_path):
    """py-spy run as an unprivileged user cannot read a root process: the samples say so
    in one line, nothing raises."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.3)
        stop = threading.Event()
        timer = threading.Timer(1.0, stop.set)
        timer.start()
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", find_py_spy()]
        s = sample_process(child.pid, stop, interval_s=0.2, command=cmd)
        timer.join()
    finally:
        child.kill()
        child.wait()
    assert s.snapshots == 0 and s.reason and "\n" not in s.reason
    assert "ptrace permission" in s.reason
    assert s.to_dict()["threads"] == []


def test_snapshots_inside_imports_are_start_up_not_top_frames():
    """10 snapshots of one running thread: 4 inside the import system (a stack through
    <frozen importlib._bootstrap>), 6 in the program's own ``work``: the thread's top frame
    is ``work`` at 6/10, its import share 4/10 (the import's own innermost frame is no top
    frame), and the report's table says so in its first line."""
    from recsys_doctor.capture.host_sample import HostSamples
    from recsys_doctor.cli.profile import render_host

    def snap(frames):
        return [{"os_thread_id": 7, "thread_name": "MainThread", "owns_gil": True, "active": True,
                 "frames": frames}]

    importing = [{"name": "_call_with_frames_removed", "filename": "<frozen importlib._bootstrap>"},
                 {"name": "_find_and_load", "filename": "<frozen importlib._bootstrap>"},
                 {"name": "<module>", "filename": "/x/job.py", "short_filename": "job.py"}]
    working = [{"name": "work", "filename": "/x/job.py", "short_filename": "job.py"},
               {"name": "<module>", "filename": "/x/job.py", "short_filename": "job.py"}]
    h = HostSamples(pid=1)
    for i in range(10):
        h.add(snap(importing if i < 4 else working))
    (t,) = h.to_dict()["threads"]
    assert t["import_share"] == 0.4 and t["gil_share"] == 1.0
    assert t["top_frames"] == [{"frame": "work (job.py)", "share": 0.6}]
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    render_host(h.to_dict(), Console(file=buf, width=200))
    assert "(importing modules: start-up) 40%" in buf.getvalue() and "work (job.py) 60%" in buf.getvalue()
