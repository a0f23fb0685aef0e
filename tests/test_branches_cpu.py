"""Branch-parallel capture (runtime/_branches.py) without a GPU: real PyTorch operations on
CPU tensors go through the dispatch mode with a recording stand-in for streams and events,
and the schedule it makes is checked against dependencies worked out by hand (which
stream each operation runs on, which events it waits for, where the capture stream joins
the others). The GPU tests (test_runtime_gpu.py, test_batching_gpu.py) capture real graphs
this way and compare their outputs with eager."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from recsys_doctor.errors import BadInputError

torch = pytest.importorskip("torch")

from recsys_doctor.runtime._branches import BranchCapture, check_branch_streams  # noqa: E402


class Ev:
    def __init__(self, stream: str, n: int) -> None:
        self.stream, self.n = stream, n

    def __repr__(self) -> str:
        return f"ev{self.n}@{self.stream}"


class Recorder:
    """Streams are names; every call is logged: ("event", stream, n), ("wait", stream,
    event n), ("run", stream), ("record_stream", stream)."""

    def __init__(self, n: int) -> None:
        self.extra = [f"s{i}" for i in range(1, n)]
        self.log: list[tuple] = []
        self.n = 0

    def current(self) -> str:
        return "s0"

    def event(self, stream: str) -> Ev:
        self.n += 1
        self.log.append(("event", stream, self.n))
        return Ev(stream, self.n)

    def wait(self, stream: str, ev: Ev) -> None:
        self.log.append(("wait", stream, ev.n))
        if stream == "s0":
            self._origin_moved()

    @contextlib.contextmanager
    def use(self, stream: str):
        self.log.append(("run", stream))
        yield
        if stream == "s0":
            self._origin_moved()

    def record_stream(self, t, stream: str) -> None:
        self.log.append(("record_stream", stream))

    def on_device(self, t) -> bool:
        return True

    #: what the capture stream's next node would depend on (None: not capturing); an
    #: operation or a wait on s0 moves it on, as a captured node does
    origin_deps = None

    def capture_deps(self, stream: str):
        return self.origin_deps

    def _origin_moved(self) -> None:
        if self.origin_deps is not None:
            self.origin_deps = frozenset({max(self.origin_deps) + 1})

    def runs(self) -> list[str]:
        return [e[1] for e in self.log if e[0] == "run"]

    def after_run(self, i: int) -> list[tuple]:
        """The calls between run ``i`` (0-based) and the next (its event, the next op's waits)."""
        starts = [j for j, e in enumerate(self.log) if e[0] == "run"] + [len(self.log)]
        return self.log[starts[i]:starts[i + 1]]


def test_schedule_of_two_branches_matches_the_dependencies():
    rec = Recorder(2)
    a, b = torch.ones(4), torch.ones(4)
    with BranchCapture([], backend=rec) as mode:
        x = a * 2  # op 0: reads only inputs -> branch on s0
        y = b + 1  # op 1: a new branch -> s1
        z = x + y  # op 2: x from s0, y from s1 -> s0, waits op 1's event
        x.add_(1)  # op 3: writes x; its only reader (op 2) ran on s0 -> s0, no wait
        w = y * 3  # op 4: reads y (s1) -> s1
        y.mul_(2)  # op 5: writes y (s1); readers z (s0, op 2) and w (s1) -> s1, waits op 2's event
    assert rec.runs() == ["s0", "s1", "s0", "s0", "s1", "s1"]
    # the events: 1 = the start (recorded on s0), then one per op: op i -> event i + 2
    assert rec.log[0] == ("event", "s0", 1)
    waits = [e for e in rec.log if e[0] == "wait"]
    assert ("wait", "s1", 1) in waits  # s1 joined the capture before its first op
    assert rec.log.index(("wait", "s1", 1)) < rec.log.index(("run", "s1"))
    assert ("wait", "s0", 3) in waits  # op 2 waits for op 1 (event 3)
    assert ("wait", "s1", 4) in waits  # op 5 waits for op 2's read of y (event 4)
    assert waits[-1] == ("wait", "s0", 7)  # on exit s0 waits for s1's last op (op 5, event 7)
    assert len(waits) == 4 and mode.joins == 2 and mode.branches == 2
    # y was allocated on s1 and read on s0 by op 2: marked for s0 there, and only there
    assert [e for e in rec.log if e[0] == "record_stream"] == [("record_stream", "s0")]
    assert rec.after_run(2)[0] == ("run", "s0") and ("record_stream", "s0") in rec.log[:rec.log.index(("run", "s0"), 3)]
    assert z.tolist() == [4.0] * 4 and x.tolist() == [3.0] * 4 and y.tolist() == [4.0] * 4 and w.tolist() == [6.0] * 4


def test_views_launch_nothing_and_keep_their_base_dependencies():
    rec = Recorder(3)
    a, b = torch.ones(4), torch.ones(4)
    with BranchCapture([], backend=rec):
        x = a * 2  # s0
        y = b * 2  # s1
        v = y.view(2, 2)  # a view: no run, no event
        u = v.t() + 1  # reads y's storage -> s1
        r = x.sum() + u.sum()  # x.sum on s0; u.sum on s1; add of the two -> s0 waits
    assert rec.runs() == ["s0", "s1", "s1", "s0", "s1", "s0"]
    assert float(r) == 8 + 12


def test_writes_through_out_wait_for_earlier_readers():
    rec = Recorder(2)
    a, b, c = torch.ones(3), torch.ones(3), torch.zeros(3)
    with BranchCapture([], backend=rec):
        x = c * 5  # reads c (an input) -> branch s0; c now has a reader on s0
        y = a + 0  # branch s1
        torch.add(y, b, out=c)  # writes c through out=: runs on y's stream s1, waits for x's read of c
    assert rec.runs() == ["s0", "s1", "s1"]
    run2 = rec.log.index(("run", "s1"), rec.log.index(("run", "s1")) + 1)
    assert ("wait", "s1", 2) in rec.log[:run2]  # event 2 = op 0 (x = c * 5)
    assert x.tolist() == [0.0] * 3 and c.tolist() == [2.0] * 3


def test_independent_lookups_spread_round_robin_and_the_concatenation_joins_them():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from wdl_serving import WideDeep

    torch.manual_seed(0)
    m = WideDeep(500, hidden=32).eval()
    dense = torch.randn(8, 13)
    idx = [torch.randint(0, 500, (32,)) for _ in range(26)]
    offs = torch.arange(0, 32, 4)
    with torch.no_grad():
        ref = m(dense, idx, offs)
        rec = Recorder(4)
        with BranchCapture([], backend=rec) as mode:
            got = m(dense, idx, offs)
    assert torch.equal(got, ref)
    runs = rec.runs()
    # 26 deep + 26 wide lookups read only weights and inputs: each starts a branch, round
    # robin; the wide sums follow their lookups; the concatenation of the deep lookups comes
    # when every stream has moved on to the wide ones, so it starts one more (and waits)
    assert mode.branches == 53
    assert {s: runs[:26].count(s) for s in ("s0", "s1", "s2", "s3")} == {"s0": 7, "s1": 7, "s2": 6, "s3": 6}
    # every stream joined once, and the capture stream waits for the other three at the end
    joins = [e for e in rec.log if e[0] == "wait" and e[2] == 1]
    assert sorted(e[1] for e in joins) == ["s1", "s2", "s3"]
    assert sorted(e[1] for e in rec.log[-3:]) == ["s0"] * 3


def test_an_input_made_once_and_read_by_independent_ops_does_not_chain_them():
    rec = Recorder(4)
    offs, w = torch.arange(0, 16, 4), torch.randn(3, 50, 8)
    idx = [torch.randint(0, 50, (16,)) for _ in range(3)]
    with BranchCapture([], backend=rec) as mode:
        o = offs + 0  # op 0: the one offsets tensor, made in the forward (root: s0)
        bags = [torch.nn.functional.embedding_bag(i, w[k], o, mode="sum") for k, i in enumerate(idx)]
        out = torch.cat(bags, 1)
    runs = rec.runs()
    # bag 0 goes on after op 0 on s0; bags 1 and 2 read o too but s0 has moved on: new branches
    assert runs[:4] == ["s0", "s0", "s1", "s2"] and mode.branches == 3
    waits = [e for e in rec.log if e[0] == "wait"]
    assert ("wait", "s1", 2) in waits and ("wait", "s2", 2) in waits  # both wait for op 0 (event 2)
    ref = torch.cat([torch.nn.functional.embedding_bag(i, w[k], offs, mode="sum") for k, i in enumerate(idx)], 1)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("when", ["between", "last"])
def test_work_outside_the_dispatcher_on_the_capture_stream_is_refused_after_the_join(when):
    a, b = torch.ones(4), torch.ones(4)
    ok = Recorder(2)
    ok.origin_deps = frozenset({1})  # capturing: the mode's own operations on s0 are expected
    with BranchCapture([], backend=ok):
        x = a * 2  # s0
        y = b * 2  # s1
        x + y  # s0, after waiting for s1
    rec = Recorder(2)
    rec.origin_deps = frozenset({1})
    with pytest.raises(RuntimeError, match="outside PyTorch's dispatcher"):
        with BranchCapture([], backend=rec):
            x = a * 2  # s0
            if when == "between":
                rec.origin_deps = frozenset({50})  # a node the dispatcher never saw, on s0
            y = b * 2  # s1
            x + y  # s0
            if when == "last":
                rec.origin_deps = frozenset({50})
    # the branch streams were joined before the error: the capture can still end
    assert rec.log[-1][:2] == ("wait", "s0")


def test_branch_streams_setting_is_checked():
    assert check_branch_streams(4) == 4
    for bad in (0, 33, True, "4", 2.0):
        with pytest.raises(BadInputError, match="branch_streams"):
            check_branch_streams(bad)
