"""The torch backend traces its own process only: a script whose GPU work ran in the processes it
started gets one line saying so (recsys_doctor/capture/profiling.py, ``_check_children_traced``),
not a diagnosis of an empty trace. No GPU: the check is fed a real child process's CPU time and
hand-made summaries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recsys_doctor.capture import profiling as pr
from recsys_doctor.errors import WorkloadError


def _run(backend="torch", is_wl=False):
    return pr._Run(Path("serve.py"), [], is_wl, backend, Path("."), {}, {}, 0, False, 0.05, None)


def _cap(children_cpu_s):
    return pr._Captured(Path("trace.json"), [], 1.0, None, children_cpu_s=children_cpu_s)  # type: ignore[arg-type]


def _res(kernels=0, memcpys=0, graph_executions=0):
    return SimpleNamespace(summary={"kernels": kernels, "memcpys": memcpys, "graph_executions": graph_executions})


def test_children_cpu_time_is_measured_from_a_real_child():
    before = pr._children_cpu_s()
    subprocess.run([sys.executable, "-c", "x = sum(i * i for i in range(3_000_000))"], check=True)
    assert pr._children_cpu_s() - before > 0.05  # the child's own CPU time, reaped by run()


def test_no_cuda_work_here_while_children_worked_is_one_line():
    with pytest.raises(WorkloadError) as e:
        pr._check_children_traced(_run(), _cap(3.0), _res())
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("serve.py ran no CUDA work in its own process, while the processes it started used 3.0 s")
    assert "--backend nsys" in msg


@pytest.mark.parametrize("run, cpu, res", [
    (_run(), 3.0, _res(kernels=1)),                 # the script's own kernels: diagnose them
    (_run(), 3.0, _res(memcpys=2)),
    (_run(), 3.0, _res(graph_executions=1)),
    (_run(), pr.CHILDREN_CPU_S - 0.01, _res()),     # children that did next to nothing
    (_run(backend="nsys"), 3.0, _res()),            # nsys traces the children itself
    (_run(is_wl=True), 3.0, _res()),                # a workload is driven here
])
def test_left_to_the_diagnosis(run, cpu, res):
    pr._check_children_traced(run, _cap(cpu), res)


def _record(backend, children_cpu_s):
    run = _run(backend=backend)
    cap = _cap(children_cpu_s)
    cap.samples = SimpleNamespace(summary=lambda *a: {"n": 0, "reason": "off"})
    return pr._capture_record(run, cap, backend_requested=backend, window=None, files={}, wall_s=1.0)


def _rendered(record) -> str:
    from rich.console import Console

    from recsys_doctor.cli.profile import render_capture

    console = Console(record=True, width=200)
    render_capture(record, console)
    return console.export_text()


def test_the_report_says_what_the_torch_backend_left_untraced():
    rec = _record("torch", 2.3456)
    assert rec["children_cpu_s"] == 2.346
    text = _rendered(rec)
    assert "not traced" in text and "the processes the program started (2.35 s of CPU)" in text
    # below the threshold, or under nsys (which traces them), nothing is said
    assert "not traced" not in _rendered(_record("torch", pr.CHILDREN_CPU_S - 0.01))
    nsys = _record("nsys", 2.0)
    assert nsys["children_cpu_s"] is None and "not traced" not in _rendered(nsys)
