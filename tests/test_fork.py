"""Work shared with a forked process (recsys_doctor._util.fork): the results are those of one
process, in list order, whoever ran each task; what the child cannot deliver is run
here; errors come as the plain loop raises them. And ``advise`` on a large trace, whose
analyzers two processes share, gives the report of one process."""

from __future__ import annotations

import json
import os

import pytest

import recsys_doctor._util.fork as fork
import recsys_doctor.diagnose.advise as advise_mod
from conftest import shared_files
from recsys_doctor._util.json import json_default
from recsys_doctor.loaders import load

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
