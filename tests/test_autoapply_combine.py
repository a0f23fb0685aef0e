"""The script hook's batching, the parts that run without CUDA: the combining queue
(:class:`recsys_doctor.applying._autoapply.combine.Combiner`, driven by real threads), the plan
fields a script honours, and the per-site batch accounting."""

from __future__ import annotations

import threading
import time

import pytest
from _threads import run_threads

from recsys_doctor.applying._autoapply import accounting, unhonoured
from recsys_doctor.applying._autoapply.combine import BatchWaitTimeout, Combiner
from recsys_doctor.applying._autoapply.settings import read_runtime


def _threads(n, target):
    return run_threads(target, n, timeout_s=30)


def test_concurrent_calls_combine_and_every_caller_gets_its_own_result():
    batches: list[list[int]] = []
    hold = threading.Lock()

    def run(payloads):
        assert hold.locked()  # a batch runs holding the group
        batches.append(list(payloads))
        time.sleep(0.01)  # the group is busy: the other callers queue meanwhile
        return [p * 10 for p in payloads]

    comb = Combiner(run, max_batch=4, hold=hold)
    got: dict[tuple[int, int], int] = {}

    def client(i):
        for r in range(20):
            got[i, r] = comb.call(i * 100 + r)

    assert _threads(8, client) == []
    assert got == {(i, r): (i * 100 + r) * 10 for i in range(8) for r in range(20)}
    ran = [p for b in batches for p in b]
    assert sorted(ran) == sorted(i * 100 + r for i in range(8) for r in range(20))  # each call once
    assert max(len(b) for b in batches) == 4  # bounded by max_batch, and reached with 8 callers
    assert len(batches) < 8 * 20


def test_a_lone_caller_runs_at_once_as_a_batch_of_one():
    sizes: list[int] = []
    comb = Combiner(lambda ps: (sizes.append(len(ps)), ps)[1], max_batch=8)
    t0 = time.monotonic()
    assert [comb.call(k) for k in range(5)] == list(range(5))
    assert sizes == [1] * 5 and time.monotonic() - t0 < 1.0


def test_an_exception_reaches_every_caller_of_its_batch_and_the_next_batch_runs():
    gate = threading.Event()
    first: list[list[int]] = []

    def run(payloads):
        if not first:
            first.append(list(payloads))
            gate.wait(5)  # hold the first batch until every other caller has queued
            return [p for p in payloads]
        if any(p < 0 for p in payloads):
            raise ValueError(f"bad batch {sorted(payloads)}")
        return [p + 1 for p in payloads]

    comb = Combiner(run, max_batch=16)
    out: dict[int, object] = {}

    def client(i):
        if i == 0:
            out[i] = comb.call(0)
            return
        while not first:
            time.sleep(0.001)
        try:
            out[i] = comb.call(-i if i <= 3 else i)
        except ValueError as ex:
            out[i] = ex

    def release():
        while len(comb._queue) < 5:
            time.sleep(0.001)
        gate.set()

    rel = threading.Thread(target=release)
    rel.start()
    assert _threads(6, client) == []
    rel.join()
    assert out[0] == 0
    # the five callers queued behind the first batch ran as one batch, which raised: all five got it
    errs = [out[i] for i in range(1, 6)]
    assert all(isinstance(e, ValueError) and str(e) == "bad batch [-3, -2, -1, 4, 5]" for e in errs), errs
    assert comb.call(7) == 8  # the queue still serves


def test_a_stuck_group_fails_its_waiters_within_the_bound_and_loses_nobody():
    release = threading.Event()
    ran: list[int] = []

    def run(payloads):
        ran.extend(payloads)
        if payloads == [0]:
            release.wait(10)  # the first batch is stuck
        return list(payloads)

    comb = Combiner(run, max_batch=4, timeout_s=0.3)
    out: dict[int, object] = {}

    def client(i):
        if i:
            while not ran:
                time.sleep(0.001)
        t0 = time.monotonic()
        try:
            out[i] = comb.call(i)
        except BatchWaitTimeout as ex:
            out[i] = (ex, time.monotonic() - t0)
        if 1 in out and 2 in out:  # both waiters gave up: the stuck batch may end now (ending it
            release.set()          # after one only let the other, a little later, run its own call)

    assert _threads(3, client) == []
    assert out[0] == 0  # the stuck batch finished, its caller got its result
    for i in (1, 2):
        ex, waited = out[i]
        assert "waited 0.3 s, queued" in str(ex) and 0.25 < waited < 3, (ex, waited)
    assert ran == [0] and not comb._queue  # the callers that gave up left the queue: no batch ran them
    assert comb.call(9) == 9


def test_a_result_count_that_does_not_match_fails_the_batch():
    comb = Combiner(lambda ps: [], max_batch=2)
    with pytest.raises(RuntimeError, match="a batch of 1 calls gave 0 results"):
        comb.call(1)
    with pytest.raises(ValueError):
        Combiner(lambda ps: ps, max_batch=0)


def test_batching_is_a_plan_setting_a_script_honours():
    plan = {"runtime": {"groups": 2, "cuda_graphs": True, "batching": True, "max_batch": 8, "max_delay_ms": 0.0}}
    assert read_runtime(plan) == {"groups": 2, "cuda_graphs": True, "batching": True, "max_batch": 8}
    assert unhonoured(plan) == []
    # off unless the plan says so
    assert read_runtime({"runtime": {"groups": 2}})["batching"] is False
    # a queue delay is not honoured (the hook never holds a call back), nor batching without graphs
    lines = unhonoured({"runtime": {"groups": 2, "batching": True, "max_delay_ms": 0.5}})
    assert lines == ["plan max_delay_ms=0.5 is not applied to a plain script: the hook never holds a call back "
                     "for company: it batches the calls that queue while their group is busy"]
    no_graphs = {"runtime": {"groups": 2, "batching": True, "cuda_graphs": False}}
    assert read_runtime(no_graphs)["batching"] is False
    assert [ln.split(":")[0] for ln in unhonoured(no_graphs)] == [
        "plan batching=true is not applied to a plain script without cuda_graphs"]


def test_batches_are_counted_per_call_site():
    accounting.reset()
    try:
        accounting.batched(["s.py:1"] * 3 + ["s.py:2"])  # one batch of 4: 3 calls from line 1, 1 from line 2
        accounting.batched(["s.py:1"] * 2)
        accounting.batched(["s.py:1"])
        accounting.taken_over("model", "s.py:1", 6)
        rows = {s["site"]: s for s in accounting.sites()}
        assert rows["s.py:1"]["batched"] == 6 and rows["s.py:1"]["batch_sizes"] == {4: 1, 2: 1, 1: 1}
        assert rows["s.py:2"]["batched"] == 1 and rows["s.py:2"]["batch_sizes"] == {4: 1}
        from recsys_doctor.applying._autoapply import stats

        st = stats()
        assert st["batch_sizes"] == {1: 1, 2: 1, 4: 1} and st["batches"] == 3 and st["batched_calls"] == 7
    finally:
        accounting.reset()


def test_a_keys_batches_give_every_caller_its_own_eager_output_on_the_cpu():
    """The batch path's own code without CUDA: the runtime's spec inferred and checked on the
    first call, 8 threads' calls combined through one :class:`_Batches` (its buckets eager: no
    CUDA graph on the CPU), every caller's output equal to the model's on its own query, in the
    model's output structure; a model that mixes rows is refused with the reason, once."""
    torch = pytest.importorskip("torch")
    from collections import namedtuple

    from recsys_doctor.applying._autoapply import _state
    from recsys_doctor.applying._autoapply import batching as B
    from recsys_doctor.applying._autoapply.groups import _Gate, _Group

    Out = namedtuple("Out", "score emb")

    class Ranker(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = torch.nn.EmbeddingBag(100, 4, mode="sum")
            self.lin = torch.nn.Linear(3, 4)

        def forward(self, dense, idx, offsets, scale=1.0):
            e = self.bag(idx, offsets)
            return Out((self.lin(dense) * scale + e).sum(1), e)

    class CentersRows(torch.nn.Module):
        def forward(self, x):
            return x - x.mean(0)

    def query(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(5, 3, generator=g), torch.randint(0, 100, (12,), generator=g),
                torch.tensor([0, 2, 5, 5, 9]))

    saved = dict(_state)
    _state.update(batch_specs={}, batch_lock=threading.Lock(), batch_refusals_said=set(), gate=_Gate(), fallbacks=[],
                  replays=0, captured=0, max_batch=8)
    accounting.reset()
    orig = torch.nn.Module.__call__
    try:
        torch.manual_seed(0)
        model = Ranker().eval()
        qs = [query(s) for s in range(8)]
        with torch.no_grad():
            want = [model(*q, scale=2.0) for q in qs]
            sp = B._spec_of(torch, "k", orig, model, qs[0], {"scale": 2.0}, list(qs[0]), "t.py:1")
            assert sp.refused is None and sp.plan.kinds == ("rows", "indices", "offsets")
            b = B._Batches(_Group(0, None), sp, B._model(orig, model), model, "k", 8)
            b.eager = {k: "no CUDA" for k in (1, 2, 4, 8)}
            got: dict = {}

            def client(i):
                with torch.no_grad():
                    for r in range(5):
                        got[i, r] = b.combiner.call((list(qs[i]), f"t.py:{10 + i % 2}"))

            assert _threads(8, client) == []
        for (i, _r), out in got.items():
            assert type(out) is Out, type(out)
            assert out.score.shape == (5,) and out.emb.shape == (5, 4)
            assert torch.allclose(out.score, want[i].score, atol=1e-6) and torch.allclose(out.emb, want[i].emb, atol=1e-6)
        rows = {s["site"]: s for s in accounting.sites()}
        assert rows["t.py:10"]["batched"] == rows["t.py:11"]["batched"] == 4 * 5
        assert rows["t.py:10"]["fallback"] == 20 and rows["t.py:10"]["reasons"] == {"no CUDA": 20}
        sizes = _state["batch_sizes"]
        assert sum(k * v for k, v in sizes.items()) == 40 and max(sizes) <= 8
        with torch.no_grad():
            x = torch.rand(6, 3)
            mix = B._spec_of(torch, "m", orig, CentersRows(), (x,), {}, [x], "t.py:2")
        assert mix.refused is not None and mix.refused.startswith("not batched: batching changes output 0")
        assert _state["fallbacks"] == [mix.refused]
    finally:
        _state.clear()
        _state.update(saved)
        accounting.reset()



def test_a_refusal_is_printed_once_per_site_and_reason_and_counted_for_every_shape(capsys):
    """A model whose inputs vary in length call by call (per-request candidate counts) is
    refused batching once per shape; stderr gets one line for the site and reason, not one per
    shape, while the fallbacks count every refused shape."""
    torch = pytest.importorskip("torch")
    from recsys_doctor.applying._autoapply import batching as B
    from recsys_doctor.applying._autoapply._common import _state
    from recsys_doctor.applying._autoapply.groups import _Gate

    class Scorer(torch.nn.Module):  # user [1, 4], candidate ids [n]: no offsets tell the ids' rows
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 4)

        def forward(self, user, ids):
            return self.emb(ids) @ user.squeeze(0)

    saved = dict(_state)
    _state.update(batch_specs={}, batch_lock=threading.Lock(), batch_refusals_said=set(), gate=_Gate(), fallbacks=[],
                  replays=0, captured=0, max_batch=8)
    orig = torch.nn.Module.__call__
    try:
        model = Scorer().eval()
        user = torch.rand(1, 4)
        with torch.no_grad():
            for n in (7, 9, 11):  # three shapes of the first site, then one of a second site
                ids = torch.randint(0, 50, (n,))
                assert B._spec_of(torch, ("s1", n), orig, model, (user, ids), {}, [user, ids], "t.py:1").refused
            ids = torch.randint(0, 50, (5,))
            assert B._spec_of(torch, ("s2", 5), orig, model, (user, ids), {}, [user, ids], "t.py:2").refused
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if "not batched" in ln]
        assert len(lines) == 2, err
        assert "(t.py:1)" in lines[0] and "int64[7]" in lines[0] and "(t.py:2)" in lines[1]
        assert len(_state["fallbacks"]) == 4 and len(set(_state["fallbacks"])) == 1
    finally:
        _state.clear()
        _state.update(saved)
