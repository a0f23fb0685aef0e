"""Work shared with a forked process (recsys_doctor._util.fork): the results are those of one
process, in list order, whoever ran each task; what the child cannot deliver is run
here; errors come as the plain loop raises them. And ``advise`` on a large trace, whose
analyzers two processes share, gives the report of one process."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

import recsys_doctor._util.fork as fork
import recsys_doctor.diagnose.advise as advise_mod
from conftest import shared_files
from recsys_doctor._util.json import json_default
from recsys_doctor.loaders import load
from recsys_doctor._util.progress import progress

pytestmark = pytest.mark.skipif(not fork.second_cpu(), reason="needs Linux and a second CPU")


def _task(i: int):
    return lambda: (i, i * i)


def test_results_in_list_order_from_both_processes():
    seen = []
    tasks = [(lambda i=i: (i, os.getpid())) for i in range(12)]
    out = fork.run_in_two(tasks, on_done=seen.append)
    assert [i for i, _ in out] == list(range(12))
    assert sorted(seen) == list(range(12))  # every task reported once, here


def test_order_is_the_order_of_taking_not_of_results():
    out = fork.run_in_two([_task(i) for i in range(5)], order=[4, 3, 2, 1, 0])
    assert out == [(i, i * i) for i in range(5)]
    with pytest.raises(ValueError):
        fork.run_in_two([_task(i) for i in range(3)], order=[0, 0, 1])


def test_what_the_child_cannot_deliver_is_run_here():
    me = os.getpid()

    def only_here():
        if os.getpid() != me:
            raise RuntimeError("not in the child")
        return "here"

    def unpicklable():
        return lambda: None  # a lambda does not pickle: the child cannot send it back

    tasks = [only_here if i % 2 else _task(i) for i in range(8)] + [unpicklable]
    out = fork.run_in_two(tasks)
    assert out[:8] == ["here" if i % 2 else (i, i * i) for i in range(8)]
    assert callable(out[8])


def test_the_first_failing_task_in_list_order_raises():
    def boom(msg):
        def f():
            raise KeyError(msg)
        return f

    tasks = [_task(0), boom("first"), _task(2), boom("second"), _task(4)]
    with pytest.raises(KeyError, match="first"):
        fork.run_in_two(tasks)


def test_a_hung_child_is_killed_after_the_timeout_and_its_share_runs_here(tmp_path, monkeypatch, capfd):
    me = os.getpid()
    mark = tmp_path / "child_pid"
    monkeypatch.setenv("RECSYS_DOCTOR_CHILD_TIMEOUT", "0.5")

    def task(i):
        def f():
            if os.getpid() != me:  # the child: say who it is, then hang
                mark.write_text(str(os.getpid()))
                time.sleep(3600)
            if i == 0:  # here: the first task waits until the child holds one
                for _ in range(500):
                    if mark.exists() and mark.read_text():
                        break
                    time.sleep(0.01)
            return (i, os.getpid())
        return f

    t0 = time.monotonic()
    out = fork.run_in_two([task(i) for i in range(4)])
    took = time.monotonic() - t0
    assert out == [(i, me) for i in range(4)]  # every task, the hung one's too, ran here
    assert took < 30  # not the child's hour: the 0.5 s timeout ended the wait
    child = int(mark.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped: no such process left
        os.kill(child, 0)
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [f"recsys-doctor: warning: the helper process {child} sent nothing for 0.5 s: "
                   "stopped it, its share runs here (RECSYS_DOCTOR_CHILD_TIMEOUT sets the limit)"]


def _refresh_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if type(t).__name__ == "_RefreshThread" and t.is_alive()]


def test_no_fork_while_a_progress_bar_thread_runs(monkeypatch):
    real_fork = os.fork
    at_fork: list[list[threading.Thread]] = []

    def watched_fork():
        at_fork.append(_refresh_threads())
        return real_fork()

    monkeypatch.setattr(os, "fork", watched_fork)
    with progress("working", total=4, enabled=True) as bar:
        assert _refresh_threads()  # the bar's thread runs before the fork...
        out = fork.run_in_two([_task(i) for i in range(4)], on_done=lambda i: bar.advance())
        assert _refresh_threads()  # ... and again after it
    assert out == [(i, i * i) for i in range(4)]
    assert at_fork == [[]]  # one fork, with no refresh thread alive at it


KINETO = shared_files("kineto", ("*.json.gz", "*.json"))
NSYS = shared_files("h100", ("*.sqlite",))


@pytest.mark.shared
@pytest.mark.parametrize("path", [p for p in KINETO if "df_index_resolver" in p.name or "alexnet" in p.name]
                         + NSYS[:1], ids=lambda p: p.name)
def test_parallel_analysis_gives_the_report_of_one_process(path, shared_traces, monkeypatch):
    trace = load(path)
    monkeypatch.setattr(advise_mod, "PARALLEL_ANALYSIS_ROWS", 1 << 62)
    one = advise_mod.advise_trace(load(path)).to_dict()
    monkeypatch.setattr(advise_mod, "PARALLEL_ANALYSIS_ROWS", 0)
    two = advise_mod.advise_trace(trace).to_dict()
    assert json.dumps(two, default=json_default) == json.dumps(one, default=json_default)
