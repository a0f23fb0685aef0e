"""Dynamic batching on the CPU: spec inference, offsets shifting, the eager check, the
batcher's queue (backpressure, timeouts, faults, close), futures, asyncio and output
structures. The batches run through the real CPU worker on small CPU models."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from recsys_doctor.runtime._batched import BatchSetup, CpuWorker, bucket_table, buckets_for  # noqa: E402
from recsys_doctor.runtime._batcher import Batcher, QueueFullError, RequestTimeoutError  # noqa: E402
from recsys_doctor.runtime._batchspec import BatchPlan, SpecRefused, infer_spec  # noqa: E402
from recsys_doctor.runtime._policy import flatten, out_flatten, out_unflatten  # noqa: E402
from recsys_doctor.errors import RuntimeCudaError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from wdl_serving import WideDeep  # noqa: E402
from _threads import run_threads  # noqa: E402

B, HOT, NS, VOCAB = 8, 3, 4, 50


def query(seed: int, rows: int = B):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 13, generator=g), [torch.randint(0, VOCAB, (rows * HOT,), generator=g) for _ in range(NS)],
            torch.arange(0, rows * HOT, HOT))


def tensors(args):
    return flatten(args, lambda x: isinstance(x, torch.Tensor))[0]


@pytest.fixture(scope="module")
def wdl():
    torch.manual_seed(0)
    return WideDeep(VOCAB, n_sparse=NS, hidden=32).eval()


def run(worker, reqs):
    """A CPU worker's batch start to finish (what a gate or spy wraps)."""
    return worker.finish(worker.start(reqs))


def batcher(setup, workers=1, max_batch=8, max_queue=64, wrap=None, **kw):
    """A batcher over ``workers`` real CPU workers (``wrap``: a gate or spy around each,
    turning it into a plain ``run(requests)`` callable)."""
    ws = [CpuWorker(setup, max_batch) for _ in range(workers)]
    return Batcher([wrap(w) if wrap else w for w in ws], max_batch=max_batch, max_queue=max_queue, **kw)


# ---------------------------------------------------------------------- spec inference

def test_infer_spec_wide_and_deep():
    assert infer_spec(tensors(query(0))) == ("rows",) + ("indices",) * NS + ("offsets",)


def test_infer_spec_sorted_ids_without_indices_are_rows():
    ids = torch.arange(B)  # starts at 0, non-decreasing, but nothing is indexed by it
    assert infer_spec([torch.randn(B, 4), ids]) == ("rows", "rows")


def test_infer_spec_refusals_say_why():
    with pytest.raises(SpecRefused, match="no floating-point input"):
        infer_spec([torch.arange(B)])
    with pytest.raises(SpecRefused, match="2 offsets candidates"):
        infer_spec([torch.randn(B, 4), torch.zeros(20, dtype=torch.long), torch.arange(B), torch.arange(B) * 2])
    with pytest.raises(SpecRefused, match="rows where the first float input has"):
        infer_spec([torch.randn(B, 4), torch.randn(B + 1, 4)])
    with pytest.raises(SpecRefused, match="scalar"):
        infer_spec([torch.randn(B, 4), torch.tensor(3)])


def test_declared_spec_checked():
    ts = tensors(query(0))
    with pytest.raises(SpecRefused, match="kinds for"):
        BatchPlan(ts, ["rows"])
    with pytest.raises(SpecRefused, match="unknown batch_spec kind 'ragged'"):
        BatchPlan(ts, ["ragged"] * len(ts))
    with pytest.raises(SpecRefused, match="exactly one offsets"):
        BatchPlan(ts, ["rows"] + ["indices"] * NS + ["rows"])


def test_regroup_concatenates_and_shifts_offsets():
    qs = [tensors(query(s)) for s in (1, 2, 3)]
    plan = BatchPlan(qs[0], infer_spec(qs[0]))
    assert plan.shift == B * HOT
    buf = torch.zeros(3 * plan.block, dtype=torch.uint8)
    for dst, src in zip(plan.slot_views(buf, 3), [t for q in qs for t in q]):
        dst.copy_(src)
    out = plan.regroup(buf, 3, torch.arange(3) * plan.shift)
    assert torch.equal(out[0], torch.cat([q[0] for q in qs]))
    for i in range(1, NS + 1):
        assert torch.equal(out[i], torch.cat([q[i] for q in qs]))
    # offsets by hand: query j's offsets plus j * (B * HOT)
    want = [j * B * HOT + k * HOT for j in range(3) for k in range(B)]
    assert out[-1].tolist() == want


def test_check_spec_accepts_wdl_and_refuses_row_mixing(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    assert s.out_rows == (B,)

    class Centered(nn.Module):  # mixes rows: x - mean over the batch
        def forward(self, x):
            return x - x.mean(0)

    class Total(nn.Module):  # no per-query rows
        def forward(self, x):
            return x.sum()

    x = (torch.randn(B, 4),)
    with pytest.raises(SpecRefused, match="batching changes output 0"):
        BatchSetup(Centered(), x, "cpu")
    with pytest.raises(SpecRefused, match="does not grow by rows"):
        BatchSetup(Total(), x, "cpu")


def test_buckets():
    assert buckets_for(32) == (1, 2, 4, 8, 16, 32)
    assert buckets_for(12) == (1, 2, 4, 8, 12)
    assert buckets_for(6, [2, 5]) == (2, 5, 6)
    t = bucket_table((1, 2, 4, 8))
    assert t[1:] == [1, 2, 4, 4, 8, 8, 8, 8]


# ---------------------------------------------------------------------- serving on the CPU

def test_many_threads_every_result_matches_eager(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    qs = [query(100 + k) for k in range(12)]
    with torch.no_grad():
        ref = [wdl(*q) for q in qs]
    b = batcher(s, workers=2, max_batch=8)
    errs: list[float] = []

    def client(k):
        for _ in range(10):
            errs.append(float((b.call(tensors(qs[k])) - ref[k]).abs().max()))

    assert run_threads(client, 12, timeout_s=30) == []
    b.close()
    assert len(errs) == 120 and max(errs) <= 1e-5
    sizes = b.stats.sizes()
    assert sum(n * c for n, c in sizes.items()) == 120 and max(sizes) <= 8


def test_max_delay_coalesces_one_batch(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    b = batcher(s, max_batch=4, max_delay_s=2.0)
    futs = [b.submit(tensors(query(k))) for k in range(4)]
    outs = [f.result(10) for f in futs]
    b.close()
    assert b.stats.sizes() == {4: 1}
    with torch.no_grad():
        for k, o in enumerate(outs):
            assert torch.allclose(o, wdl(*query(k)), atol=1e-6)


class Gate:
    """The real CPU worker behind a gate the test opens (to hold a batch in flight)."""

    def __init__(self, worker):
        self.worker, self.open, self.entered = worker, threading.Event(), threading.Event()

    def __call__(self, reqs):
        self.entered.set()
        self.open.wait(10)
        return run(self.worker, reqs)


def test_backpressure_and_timeouts_name_the_setting(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    gates = []
    b = batcher(s, max_batch=2, max_queue=3, timeout_s=0.3, wrap=lambda w: gates.append(Gate(w)) or gates[-1])
    gate = gates[0]
    first = b.submit(tensors(query(1)))
    assert gate.entered.wait(5)  # the worker holds the first batch (its slot stays taken)
    queued = [b.submit(tensors(query(k))) for k in (2, 3)]  # fills max_queue
    t0 = time.monotonic()
    with pytest.raises(QueueFullError, match=r"max_queue=\.\.\.\) or timeout_s"):
        b.submit(tensors(query(4)))
    assert 0.25 <= time.monotonic() - t0 < 3
    gate.open.set()
    assert first.result(5) is not None and all(f.result(5) is not None for f in queued)
    b.close()


def test_a_request_that_does_not_fit_fails_alone(wdl):
    """Three requests in one batch, the middle one with a tensor of another shape: it gets
    its own error, the two others their results."""
    s = BatchSetup(wdl, query(0), "cpu")
    b = batcher(s, max_batch=3, max_delay_s=2.0)
    bad = tensors(query(2))
    bad[0] = torch.randn(B + 1, 13)
    futs = [b.submit(tensors(query(1))), b.submit(bad), b.submit(tensors(query(3)))]
    with pytest.raises(RuntimeError):
        futs[1].result(10)
    with torch.no_grad():
        assert torch.allclose(futs[0].result(10), wdl(*query(1)), atol=1e-6)
        assert torch.allclose(futs[2].result(10), wdl(*query(3)), atol=1e-6)
    b.close()
    assert b.stats.sizes() == {2: 1}


def test_other_dtypes_and_layouts_are_converted_like_the_example(wdl):
    """float64 dense rows, int32 ids and a non-contiguous tensor: converted to the
    example's dtypes by the staging copy, the result is the eager model's on the converted
    query."""
    s = BatchSetup(wdl, query(0), "cpu")
    b = batcher(s, max_batch=4)
    d, ids, offs = query(7)
    wide = torch.randn(13, B).t()  # non-contiguous view of the dense rows
    q = tensors((d.double(), [i.int() for i in ids], offs))
    q2 = tensors((wide, ids, offs))
    outs = [b.call(q), b.call(q2)]
    b.close()
    with torch.no_grad():
        assert torch.allclose(outs[0], wdl(d.double().float(), ids, offs), atol=1e-6)
        assert torch.allclose(outs[1], wdl(wide.contiguous(), ids, offs), atol=1e-6)


def test_result_timeout(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    gates = []
    b = batcher(s, max_batch=2, timeout_s=0.3, max_delay_s=0.01, wrap=lambda w: gates.append(Gate(w)) or gates[-1])
    gate = gates[0]
    with pytest.raises(RequestTimeoutError, match="no result within timeout_s=0.3"):
        b.call(tensors(query(5)))
    gate.open.set()
    b.close()


def test_exception_reaches_the_whole_batch_and_serving_goes_on():
    class Picky(nn.Module):
        def forward(self, x):
            if bool((x == 7.0).any()):
                raise ValueError("poisoned query")
            return x * 2

    x = (torch.randn(B, 4),)
    s = BatchSetup(Picky(), x, "cpu")
    b = batcher(s, max_batch=3, max_delay_s=2.0)
    futs = [b.submit([torch.randn(B, 4)]), b.submit([torch.full((B, 4), 7.0)]), b.submit([torch.randn(B, 4)])]
    for f in futs:
        with pytest.raises(ValueError, match="poisoned"):
            f.result(10)
    ok = torch.randn(B, 4)
    assert torch.equal(b.call([ok]), ok * 2)
    b.close()


def test_cancelled_future_is_dropped_others_served(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    gates = []
    b = batcher(s, max_batch=4, wrap=lambda w: gates.append(Gate(w)) or gates[-1])
    gate = gates[0]
    b.submit(tensors(query(1)))
    assert gate.entered.wait(5)
    gone = b.submit(tensors(query(2)))
    kept = b.submit(tensors(query(3)))
    assert gone.cancel()
    gate.open.set()
    with torch.no_grad():
        assert torch.allclose(kept.result(5), wdl(*query(3)), atol=1e-6)
    b.close()
    assert gone.cancelled()


def test_close_fails_queued_and_finishes_running(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    gates = []
    b = batcher(s, max_batch=1, wrap=lambda w: gates.append(Gate(w)) or gates[-1])
    gate = gates[0]
    running = b.submit(tensors(query(1)))
    assert gate.entered.wait(5)
    queued = [b.submit(tensors(query(k))) for k in range(2, 6)]
    threading.Timer(0.2, gate.open.set).start()
    b.close()
    assert running.result(5) is not None
    for f in queued:
        with pytest.raises(RuntimeCudaError, match="closed before the request ran"):
            f.result(5)
    with pytest.raises(RuntimeCudaError, match="closed"):
        b.submit(tensors(query(9)))


def test_asyncio_coroutines_on_one_loop(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    b = batcher(s, workers=2, max_batch=8)
    qs = [query(200 + k) for k in range(16)]

    async def main():
        return await asyncio.gather(*[b.infer(tensors(q)) for q in qs])

    outs = asyncio.run(main())
    b.close()
    with torch.no_grad():
        for q, o in zip(qs, outs):
            assert torch.allclose(o, wdl(*q), atol=1e-6)


Pair = namedtuple("Pair", "score emb")


def test_output_structure_kept_per_request():
    class Multi(nn.Module):
        def forward(self, x):
            return {"z": Pair(x.sum(1, keepdim=True), x * 3), 1: x[:, :2]}  # mixed key types, insertion order

    x = torch.randn(B, 4)
    s = BatchSetup(Multi(), (x,), "cpu")
    b = batcher(s, max_batch=4)
    ys = [torch.randn(B, 4) for _ in range(3)]
    outs = [f.result(5) for f in [b.submit([y]) for y in ys]]
    b.close()
    for y, o in zip(ys, outs):
        assert list(o) == ["z", 1] and type(o["z"]) is Pair
        assert torch.allclose(o["z"].score, y.sum(1, keepdim=True)) and torch.equal(o["z"].emb, y * 3)
        assert torch.equal(o[1], y[:, :2])


def test_out_flatten_round_trip_keeps_namedtuple_and_dict_order():
    tree = {"b": Pair(torch.ones(1), torch.zeros(1)), "a": [torch.ones(2)], 3: torch.zeros(3)}
    leaves, spec = out_flatten(tree)
    back = out_unflatten(leaves, spec)
    assert list(back) == ["b", "a", 3] and type(back["b"]) is Pair and len(leaves) == 4


def test_lone_caller_runs_its_own_request_on_an_idle_group(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    seen = []

    def spy(w):
        def spied(reqs):
            seen.append((threading.current_thread(), len(reqs)))
            return run(w, reqs)
        return spied

    b = batcher(s, workers=2, wrap=spy)
    time.sleep(0.05)  # both workers asleep
    with torch.no_grad():
        assert torch.allclose(b.call(tensors(query(3))), wdl(*query(3)), atol=1e-6)
        assert torch.allclose(b.submit(tensors(query(4))).result(5), wdl(*query(4)), atol=1e-6)
    b.close()
    assert seen[0] == (threading.current_thread(), 1)  # call(): no hand-off
    assert seen[1][0] is not threading.current_thread()  # submit(): a worker thread


# ---------------------------------------------------------------------- plan fields

def test_plan_carries_batching():
    from recsys_doctor.errors import BadInputError
    from recsys_doctor.plan import Plan
    from recsys_doctor.runtime import RuntimeConfig

    p = Plan.from_dict({"runtime": {"groups": 4, "batching": True, "max_batch": 16, "max_delay_ms": "0.5"}})
    assert (p.batching, p.max_batch, p.max_delay_ms) == (True, 16, 0.5)
    assert p.to_runtime() == {"groups": 4, "merge_streams": True, "per_stream_allocator": True, "cuda_graphs": True,
                              "batching": True, "max_batch": 16, "max_delay_ms": 0.5}
    assert Plan.from_dict(p.to_runtime()) == p
    cfg = RuntimeConfig.from_plan({"dynamic_batching": "on"}, max_batch=8)
    assert cfg.batching and cfg.max_batch == 8 and cfg.max_delay_ms == 0.0
    assert not RuntimeConfig().batching  # off unless asked for
    # a script honours batching and max_batch (the hook batches), not a queue delay
    assert [ln.split("=")[0] for ln in p.unhonoured("script")] == ["plan max_delay_ms"]
    assert any("batching" in line for line in p.unhonoured("train"))
    assert p.unhonoured("serve") == []
    for bad in ({"max_batch": 0}, {"max_delay_ms": -1}, {"max_delay_ms": "soon"}, {"batching": "maybe"}):
        with pytest.raises(BadInputError):
            Plan.from_dict(bad)


def test_close_waits_for_a_caller_running_on_a_lent_group(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    gates = []
    b = batcher(s, wrap=lambda w: gates.append(Gate(w)) or gates[-1])
    time.sleep(0.05)  # the worker is asleep: the next call runs on the caller's thread
    got = []
    caller = threading.Thread(target=lambda: got.append(b.call(tensors(query(5)))))
    caller.start()
    assert gates[0].entered.wait(5)
    closer = threading.Thread(target=b.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # close() waits for the lent group's batch
    gates[0].open.set()
    closer.join(5)
    caller.join(5)
    assert not closer.is_alive() and len(got) == 1
    with torch.no_grad():
        assert torch.allclose(got[0], wdl(*query(5)), atol=1e-6)


class Overlapped:
    """The real CPU worker split the way the CUDA one is: ``start`` computes the batch,
    ``finish`` returns it after ``delay`` seconds (a batch 'in flight' on its group)."""

    def __init__(self, worker, delay):
        self.worker, self.delay = worker, delay

    def start(self, reqs):
        return self.worker.start(reqs)

    def finish(self, reqs):
        time.sleep(self.delay)
        return self.worker.finish(reqs)


@pytest.mark.parametrize("drivers", [1, 3])
def test_many_clients_close_under_load_answers_everyone(wdl, drivers):
    """64 client threads on 4 groups with batches in flight (one driver thread, or three
    sharing the queue and the groups); close() in the middle: every call returns the eager
    result or raises the batcher's 'closed' error, none hangs, the batches started on every
    group, and every driver thread has ended."""
    s = BatchSetup(wdl, query(0), "cpu")
    ws = [Overlapped(CpuWorker(s, 8), 0.002) for _ in range(4)]
    b = Batcher(ws, max_batch=8, max_queue=128, drivers=drivers)
    assert len(b._threads) == drivers
    qs = [query(300 + k) for k in range(8)]
    with torch.no_grad():
        ref = [wdl(*q) for q in qs]
    ok, closed, other = [], [], []

    def client(k):
        for i in range(200):
            try:
                out = b.call(tensors(qs[(k + i) % 8]))
            except RuntimeCudaError as e:
                closed.append(str(e))
                return
            except Exception as e:  # noqa: BLE001 - counted: the test fails on any
                other.append(repr(e))
                return
            ok.append(float((out - ref[(k + i) % 8]).abs().max()))

    ths = [threading.Thread(target=client, args=(k,)) for k in range(64)]
    for t in ths:
        t.start()
    time.sleep(0.5)
    b.close()
    for t in ths:
        t.join(10)
    assert not any(t.is_alive() for t in ths)
    assert not other and ok and max(ok) <= 1e-5
    assert all("closed" in m for m in closed)
    assert len(ok) + len(closed) >= 64
    assert len(b.stats.batches) == 4 and all(b.stats.batches)  # every group ran batches
    assert max(b.stats.sizes()) > 1  # and requests were batched
    assert not any(t.is_alive() for t in b._threads)


def test_more_drivers_than_groups_refused(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    with pytest.raises(RuntimeCudaError, match="drivers=3"):
        Batcher([CpuWorker(s, 8), CpuWorker(s, 8)], max_batch=8, drivers=3)


# ---------------------------------------------------------------------- asyncio timeouts (one timer a loop)

def test_asyncio_timeout_names_the_setting_and_a_late_result_is_dropped(wdl):
    """A coroutine's request held past timeout_s fails with RequestTimeoutError (not a bare
    TimeoutError); the batch's late result is dropped without an error on the loop, and the
    next request is served."""
    s = BatchSetup(wdl, query(0), "cpu")
    gates = []
    b = batcher(s, max_batch=2, timeout_s=0.3, wrap=lambda w: gates.append(Gate(w)) or gates[-1])
    loop_errors = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: loop_errors.append(ctx))
        t0 = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="no result within timeout_s=0.3"):
            await b.infer(tensors(query(5)))
        waited = time.monotonic() - t0
        gates[0].open.set()
        await asyncio.sleep(0.2)  # the held batch ends: its result reaches a future already failed
        out = await b.infer(tensors(query(6)))
        return waited, out

    waited, out = asyncio.run(main())
    b.close()
    assert 0.25 <= waited < 2.0
    assert loop_errors == []
    with torch.no_grad():
        assert torch.allclose(out, wdl(*query(6)), atol=1e-6)


def test_asyncio_deadlines_stay_small_and_cancelled_callers_are_dropped(wdl):
    """64 coroutines, 20 requests each, every result right; what the loop keeps for the
    timeouts never holds more than the requests still waiting (plus those answered since the
    last request came), and a coroutine cancelled while waiting leaves nothing behind."""
    s = BatchSetup(wdl, query(0), "cpu")
    b = batcher(s, workers=2, max_batch=8, max_queue=128, timeout_s=5.0)
    qs = [query(500 + k) for k in range(8)]
    with torch.no_grad():
        ref = [wdl(*q) for q in qs]
    worst = [0]

    async def client(k):
        errs = []
        for i in range(20):
            o = await b.infer(tensors(qs[(k + i) % 8]))
            errs.append(float((o - ref[(k + i) % 8]).abs().max()))
            worst[0] = max(worst[0], len(b._deadlines.waiting))
        return max(errs)

    async def main():
        errs = await asyncio.gather(*[client(k) for k in range(64)])
        gone = asyncio.ensure_future(b.infer(tensors(qs[0])))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0.05)
        await b.infer(tensors(qs[1]))  # (drops the done and cancelled futures from the front)
        return errs, len(b._deadlines.waiting)

    errs, left = asyncio.run(main())
    b.close()
    assert max(errs) <= 1e-5
    assert worst[0] <= 2 * 64 and left <= 1


def test_asyncio_loops_in_two_threads_share_one_batcher(wdl):
    s = BatchSetup(wdl, query(0), "cpu")
    b = batcher(s, workers=2, max_batch=8, timeout_s=5.0)
    outs: dict[int, list] = {}

    def loop_thread(t):
        async def main():
            return await asyncio.gather(*[b.infer(tensors(query(700 + 10 * t + k))) for k in range(10)])
        outs[t] = asyncio.run(main())

    assert run_threads(loop_thread, 2, timeout_s=30) == []
    b.close()
    assert len(b._deadlines_by_loop) <= 2
    with torch.no_grad():
        for t in range(2):
            for k, o in enumerate(outs[t]):
                assert torch.allclose(o, wdl(*query(700 + 10 * t + k)), atol=1e-6)


def test_asyncio_loops_that_are_gone_leave_nothing_in_the_batcher(wdl):
    """Three asyncio.run() in a row, each with requests (one timed out and one cancelled among
    them): once the loops are gone, the batcher keeps no deadlines of theirs."""
    import gc

    s = BatchSetup(wdl, query(0), "cpu")
    b = batcher(s, workers=2, max_batch=8, timeout_s=5.0)

    async def main(k):
        outs = await asyncio.gather(*[b.infer(tensors(query(900 + k * 8 + j))) for j in range(8)])
        gone = asyncio.ensure_future(b.infer(tensors(query(1))))
        await asyncio.sleep(0)
        gone.cancel()
        return outs

    for k in range(3):
        outs = asyncio.run(main(k))
        with torch.no_grad():
            for j, o in enumerate(outs):
                assert torch.allclose(o, wdl(*query(900 + k * 8 + j)), atol=1e-6)
    b.close()
    gc.collect()
    assert len(b._deadlines_by_loop) == 0
