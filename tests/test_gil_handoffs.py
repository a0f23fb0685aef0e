"""Who gave the GIL up (``os_waits["gil_by"]``, ``loaders/_nsys_gil.py``) and the
``gil-handoffs`` finding, against SQL of our own on the H100 fixture
(``tests/data/gil_wdl_eager_q4``: four eager client threads, OS-runtime call stacks) and on
the shared H100 trace that has call stacks for its longer waits."""

from __future__ import annotations

import gzip
import shutil
import sqlite3

import pytest

from recsys_doctor.analyzers import gil_handoffs
from recsys_doctor.loaders import load
from recsys_doctor.loaders._nsys_gil import PYTHON_FRAMES, releasers, short_symbol
from recsys_doctor.options import Options

#: a GIL wait, in SQL: a condition wait whose call stack goes through a taker of the GIL
TAKERS = "('PyEval_RestoreThread', 'PyEval_AcquireThread', 'PyGILState_Ensure')"
GIL_WAIT = f"""
    n.value IN ('pthread_cond_timedwait', 'pthread_cond_wait') AND EXISTS (
        SELECT 1 FROM OSRT_CALLCHAINS c JOIN StringIds s ON s.id = c.symbol
        WHERE c.id = o.callchainId AND s.value IN {TAKERS})"""
#: the first frame above the taker in libtorch_python.so that is not pybind11's GIL guard
#: nor PyTorch's interpreter hook: the binding that gave the GIL up
BINDING = f"""
    (SELECT s2.value FROM OSRT_CALLCHAINS c2 JOIN StringIds s2 ON s2.id = c2.symbol
       JOIN StringIds m2 ON m2.id = c2.module
     WHERE c2.id = o.callchainId AND m2.value LIKE '%/libtorch_python.so'
       AND s2.value NOT LIKE '%gil_scoped%' AND s2.value NOT LIKE '%PyInterpreterVTable%'
       AND c2.stackDepth > (SELECT MIN(c3.stackDepth) FROM OSRT_CALLCHAINS c3 JOIN StringIds s3
                            ON s3.id = c3.symbol WHERE c3.id = o.callchainId AND s3.value IN {TAKERS})
     ORDER BY c2.stackDepth LIMIT 1)"""


@pytest.fixture(scope="module")
def fixture_db(project_data, tmp_path_factory):
    src = project_data / "gil_wdl_eager_q4" / "gil_wdl_eager_q4.sqlite.gz"
    dst = tmp_path_factory.mktemp("gil") / "gil_wdl_eager_q4.sqlite"
    with gzip.open(src) as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return dst


def _sql(db, q):
    with sqlite3.connect(db) as con:
        return con.execute(q).fetchall()


def test_the_loader_finds_every_gil_wait_and_who_gave_the_gil_up(fixture_db):
    trace = load(fixture_db)
    ow = trace.os_waits
    (n_gil,), = _sql(fixture_db, f"SELECT COUNT(*) FROM OSRT_API o JOIN StringIds n ON n.id = o.nameId WHERE {GIL_WAIT}")
    assert n_gil > 1000 and int(ow["gil_by"].notna().sum()) == n_gil
    # the bindings that gave it up, counted by our own SQL (a hook's wait counts for its binding)
    want = dict(_sql(fixture_db, f"""SELECT b, COUNT(*) FROM (SELECT {BINDING} AS b FROM OSRT_API o
                                     JOIN StringIds n ON n.id = o.nameId WHERE {GIL_WAIT}) WHERE b IS NOT NULL
                                     GROUP BY b"""))
    got = ow["gil_by"].dropna().astype(str)
    for sym in ("torch::autograd::THPVariable_embedding_bag(_object*, _object*, _object*)",
                "torch::autograd::THPVariable_add(_object*, _object*, _object*)"):
        name = short_symbol(sym)
        assert int(got.str.startswith(name + " [libtorch_python.so]").sum()) == want[sym] > 0, name
    assert int((got == "THPVariable_clear [libtorch_python.so]").sum()) == want["THPVariable_clear(THPVariable*)"]


def test_gil_handoffs_evidence_matches_sql(fixture_db):
    trace = load(fixture_db)
    res = gil_handoffs.analyze(trace, Options())
    (f,) = res.findings
    ev = f.evidence
    lo, hi = ev["window_start_ns"], ev["window_end_ns"]
    assert 0 < lo < hi and ev["window_ms"] == pytest.approx((hi - lo) / 1e6, abs=1e-3)
    rows = _sql(fixture_db, f"""SELECT o.globalTid % 16777216, COUNT(*), SUM(MIN(o.end, {hi}) - o.start)
                                FROM OSRT_API o JOIN StringIds n ON n.id = o.nameId
                                WHERE {GIL_WAIT} AND o.start >= {lo} AND o.start < {hi} GROUP BY 1""")
    per = {tid: (n, ns) for tid, n, ns in rows}
    # the four client threads wait; a thread that waits less than report_min_share of the window
    # (the main thread, once) is not one of them
    clients = {tid: v for tid, v in per.items() if v[1] >= 0.05 * (hi - lo)}
    assert ev["threads"] == len(ev["per_thread"]) == len(clients) == 4 and len(per) == 5
    assert ev["gil_waits"] == sum(n for n, _ in clients.values())
    assert ev["gil_wait_ms"] == pytest.approx(sum(ns for _, ns in clients.values()) / 1e6, abs=1e-3)
    for t in ev["per_thread"]:
        tid = int(t["thread"].split("tid ")[1].split()[0])
        assert (t["gil_waits"], t["gil_wait_ms"]) == (per[tid][0], pytest.approx(per[tid][1] / 1e6, abs=1e-3))
    assert ev["wait_share"] == pytest.approx(ev["gil_wait_ms"] / (4 * ev["window_ms"]), abs=1e-3)
    # the first releaser by wait time, from SQL: its waits and time in the window
    tids = ", ".join(map(str, clients))
    clear = _sql(fixture_db, f"""SELECT COUNT(*), SUM(MIN(o.end, {hi}) - o.start) FROM OSRT_API o
                                 JOIN StringIds n ON n.id = o.nameId WHERE {GIL_WAIT} AND o.start >= {lo}
                                 AND o.start < {hi} AND o.globalTid % 16777216 IN ({tids})
                                 AND {BINDING} = 'THPVariable_clear(THPVariable*)'""")[0]
    top = ev["released_by"][0]
    assert top["by"] == "THPVariable_clear [libtorch_python.so]"
    assert (top["waits"], top["ms"]) == (clear[0], pytest.approx(clear[1] / 1e6, abs=1e-3))
    assert f"{top['share']:.0%} of it after THPVariable_clear" in f.title
    assert "a tensor freed every query" in f.recommendation and "CUDA graph" in f.recommendation
    assert f.where and f.where[0]["nvtx"] == "query"  # the waits happen inside the queries
    assert 0 < f.recoverable_ns <= (hi - lo) and f.severity in ("low", "medium", "high")
    assert ev["gpu_idle_while_waiting_ms"] == pytest.approx(f.recoverable_ns / 1e6, abs=1e-3)


def test_no_call_stacks_no_gil_finding(project_data):
    """The pathology fixtures keep their OS-runtime waits but not the call stacks: no GIL wait
    can be told from another condition wait, so nothing is said."""
    trace = load(project_data / "patho_threads8_one_stream" / "threads8_one_stream.sqlite.gz")
    assert len(trace.os_waits) and trace.os_waits["gil_by"].isna().all()
    res = gil_handoffs.analyze(trace, Options())
    assert res.findings == [] and res.data == {"gil_waits": 0}


def test_shared_trace_gil_waits_match_sql(shared_traces):
    """The shared H100 trace traced call stacks only for waits of 80 us or more (nsys's default):
    its GIL waits are named, and too few to report."""
    db = shared_traces / "h100" / "wdl_serial_q4_h100.sqlite"
    trace = load(db)
    (n_gil,), = _sql(db, f"SELECT COUNT(*) FROM OSRT_API o JOIN StringIds n ON n.id = o.nameId WHERE {GIL_WAIT}")
    assert int(trace.os_waits["gil_by"].notna().sum()) == n_gil > 100
    assert gil_handoffs.analyze(trace, Options()).findings == []


def test_releasers_name_the_call_that_gave_the_gil_up():
    py = "/usr/bin/python3.12"
    tp = "/x/torch/lib/libtorch_python.so"
    rows = [
        # an op's binding, past pybind11's guard and unresolved interpreter frames
        (1, "pthread_cond_timedwait", "/lib/libc.so.6"), (1, "0x5fbe07", py), (1, "PyEval_RestoreThread", py),
        (1, "pybind11::gil_scoped_release::~gil_scoped_release()", tp),
        (1, "torch::autograd::THPVariable_clone(_object*, _object*, _object*)", tp), (1, "PyObject_Vectorcall", py),
        # Python's own wait (a lock, sleep): nothing but the interpreter and a thread entry above
        (2, "pthread_cond_timedwait", "/lib/libc.so.6"), (2, "PyEval_RestoreThread", py), (2, "0x64db06", py),
        (2, "_PyEval_EvalFrameDefault", py), (2, "__libc_start_main", "/lib/libc.so.6"),
        # PyTorch's interpreter hook inside an op: named by the op's binding
        (3, "PyEval_AcquireThread", py), (3, "pybind11::gil_scoped_acquire::gil_scoped_acquire()", tp),
        (3, "torch::detail::(anonymous namespace)::ConcretePyInterpreterVTable::incref(_object*) const", tp),
        (3, "c10::TensorImpl::incref_pyobject() const", "/x/libc10.so"),
        (3, "torch::autograd::THPVariable_copy_(_object*, _object*, _object*)", tp),
        # not a GIL wait: no taker in the stack
        (4, "pthread_cond_timedwait", "/lib/libc.so.6"), (4, "std::condition_variable::wait", "/lib/libstdc++.so.6"),
        # numpy, a Cython symbol
        (5, "PyEval_RestoreThread", py), (5, "__pyx_f_5numpy_6random_7_common_cont", "/np/_common.cpython-312.so"),
    ]
    assert releasers(rows) == {
        1: "THPVariable_clone [libtorch_python.so]", 2: PYTHON_FRAMES,
        3: "THPVariable_copy_ [libtorch_python.so] (inside the op: incref)",
        5: "__pyx_f_5numpy_6random_7_common_cont [_common.cpython-312.so]"}
    assert short_symbol("at::_ops::copy_::call(at::Tensor&, at::Tensor const&, bool)") == "call"
    assert short_symbol("void f<int (a::*)()>(int) const") == "void f<int (a::*)()>"
    assert gil_handoffs.advice_for(releasers(rows)[5]).startswith("numpy on the serving threads")


def test_a_releaser_without_advice_still_reads(fixture_db):
    """Calls the finding has no specific advice for: named, and the recommendation still a sentence."""
    import dataclasses

    import pandas as pd

    trace = load(fixture_db)
    ow = trace.os_waits.copy()
    ow["gil_by"] = pd.Categorical(ow["gil_by"].astype(object).where(ow["gil_by"].isna(), "my_codec [libmine.so]"))
    (f,) = gil_handoffs.analyze(dataclasses.replace(trace, os_waits=ow), Options()).findings
    assert f.evidence["released_by"] == [{"by": "my_codec [libmine.so]", "waits": f.evidence["gil_waits"],
                                          "ms": f.evidence["gil_wait_ms"], "share": 1.0}]
    assert "Cut those calls per query or step. Measure again" in f.recommendation


def test_the_dataloader_pin_memory_thread_is_named_with_what_to_measure(fixture_db):
    """When one of the waiting threads is the DataLoader's pin-memory thread (PyTorch names it
    pt_data_pin): the recommendation says that thread competes with the loop for the GIL, with
    its share of the window (checked against SQL in the evidence test), and to keep pin_memory
    on (off was slower on the H200: results/session23_h200/6_nopin/); the other threads'
    recommendation does not."""
    import dataclasses
    import re

    import pandas as pd

    trace = load(fixture_db)
    (plain,) = gil_handoffs.analyze(trace, Options()).findings
    assert "pin-memory" not in plain.recommendation and "pin_memory" not in plain.recommendation
    assert plain.recommendation.startswith("The threads queue for Python's interpreter lock")
    second = plain.evidence["per_thread"][1]
    pid, tid = map(int, re.match(r"pid (\d+) tid (\d+)", second["thread"]).groups())
    th = trace.threads.copy()
    named = (th["pid"] == pid) & (th["tid"] == tid)
    th = pd.concat([th[~named], pd.DataFrame({"pid": [pid], "tid": [tid], "name": ["pt_data_pin"]})],
                   ignore_index=True)
    (f,) = gil_handoffs.analyze(dataclasses.replace(trace, threads=th), Options()).findings
    assert f.evidence["gil_wait_ms"] == plain.evidence["gil_wait_ms"]  # the same waits, another name
    assert f.recommendation.startswith(f"The loop's thread and the DataLoader's pin-memory thread (pt_data_pin, "
                                       f"{second['share']:.0%} of the window waiting)")
    assert "Keep pin_memory on" in f.recommendation and f.action.startswith("cut the loop's calls")
