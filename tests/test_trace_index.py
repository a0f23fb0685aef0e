"""The per-trace index (recsys_doctor.model.TraceIndex): what analyzers derive from a trace
is built once per trace, kept with it (no module-level cache), and dropped when a table
of the trace is replaced."""

from __future__ import annotations

import pandas as pd

from _tracebuild import T, kern
from recsys_doctor.analyzers import _ops
from recsys_doctor.analyzers._ops import op_table
from recsys_doctor.analyzers._recoverable import idle_gaps
from recsys_doctor.options import Options


def test_derived_data_is_built_once_per_trace_and_key():
    tr = T(kernels=pd.DataFrame([kern(0, 10), kern(30, 50)]))
    calls: list[str] = []
    make = lambda: calls.append("built") or len(calls)
    assert tr.derived("x", make) == 1
    assert tr.derived("x", make) == 1 and calls == ["built"]
    assert tr.derived(("y", 2), make) == 2  # another key: built again
    other = T(kernels=tr.kernels)
    assert other.derived("x", make) == 3  # another trace has its own index


def test_replacing_a_table_drops_what_was_derived_from_it(monkeypatch):
    builds = []
    real = _ops._build_op_table
    monkeypatch.setattr(_ops, "_build_op_table", lambda *a: builds.append(1) or real(*a))
    tr = T(kernels=pd.DataFrame([kern(0, 10), kern(30, 50)]))
    assert len(op_table(tr)) == 2 and len(op_table(tr)) == 2
    assert len(builds) == 1  # built once for both calls
    assert int(idle_gaps(tr, Options())["ns"].sum()) == 20  # the one gap, 10..30, by hand
    tr.kernels = T(kernels=pd.DataFrame([kern(0, 10), kern(30, 50), kern(60, 70)])).kernels
    assert len(op_table(tr)) == 3 and len(builds) == 2
    assert int(idle_gaps(tr, Options())["ns"].sum()) == 30  # 10..30 and 50..60


def test_windowed_copies_get_their_own_index():
    tr = T(kernels=pd.DataFrame([kern(0, 10), kern(30, 50)]))
    assert len(op_table(tr)) == 2
    assert len(op_table(tr.window(25, 60))) == 1
    assert len(tr.index) >= 1 and len(tr.window(25, 60).index) == 0
