"""GPU tests of dynamic batching (marker ``gpu``): every request's result against eager,
output structures, faults (a failing batch, abandoned futures, close under load, out of
memory while capturing a large bucket), 128 clients with the defaults, refusal; inputs
with offsets ending in a total and KeyedJaggedTensor-style features, batched in graphs."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections import namedtuple
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from wdl_serving import WideDeep  # noqa: E402

from _jagged_models import BagTotal, KJTNet, bag_total_query, kjt_query, kjt_spec  # noqa: E402

from recsys_doctor.errors import RuntimeCudaError  # noqa: E402

pytestmark = pytest.mark.gpu
B = 64


def make_query(seed: int, batch: int = B, vocab: int = 1000):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 13, generator=g), [torch.randint(0, vocab, (batch * 4,), generator=g) for _ in range(26)],
            torch.arange(0, batch * 4, 4))


def reference(model, q):
    with torch.no_grad():
        return model(q[0].cuda(), [t.cuda() for t in q[1]], q[2].cuda()).cpu()


@pytest.fixture(scope="module")
def wdl():
    torch.manual_seed(0)
    return WideDeep(1000, hidden=128).cuda().eval()


def serve(model, example, **kw):
    from recsys_doctor.runtime import serve as _serve

    kw.setdefault("groups", 2)
    return _serve(model, example, batching=True, **kw)


def hammer(fn, n_threads, per_thread):
    """``fn(k)`` ``per_thread`` times on each of ``n_threads`` threads; results and errors."""
    res, errs = [], []

    def client(k):
        for _ in range(per_thread):
            try:
                res.append((k, fn(k)))
            except Exception as e:  # noqa: BLE001 - collected
                errs.append(e)

    ths = [threading.Thread(target=client, args=(k,)) for k in range(n_threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    assert not any(t.is_alive() for t in ths), "a client thread hangs"
    return res, errs


def every_result_matches(s, qs, ref, per_thread=20):
    """One client thread a query of ``qs`` sends it ``per_thread`` times through ``s(*q)``,
    then each is submitted once: every result equals ``ref`` (atol 1e-5), and queries did batch."""
    res, errs = hammer(lambda k: s(*qs[k]), len(qs), per_thread)
    sizes = s.stats()["batching"]["batch_sizes"]
    futs = [s.submit(*q) for q in qs]
    for f, r in zip(futs, ref):
        assert (f.result(30) - r).abs().max() <= 1e-5
    assert not errs and len(res) == len(qs) * per_thread
    assert max(float((o - ref[k]).abs().max()) for k, o in res) <= 1e-5
    assert max(sizes) > 1


def test_every_request_matches_eager(wdl):
    qs = [make_query(10 + k) for k in range(24)]
    ref = [reference(wdl, q) for q in qs]
    with serve(wdl, qs[0]) as s:
        assert s.stats()["batching"]["enabled"], s.batching_refused
        every_result_matches(s, qs, ref)  # 24 clients on 2 groups
        st = s.stats()
        side = [[x.cuda_stream for x in g] for g in s._sides]
    # each group has its own 3 extra streams: graphs of two groups run at once, and what PyTorch
    # keeps per stream (cuBLAS's workspace) must not be shared by them (branch_race_h100/)
    assert [len(g) for g in side] == [3, 3] and len({h for g in side for h in g}) == 6
    # every bucket's graph was captured with the forward's branches on 4 streams
    assert st["branch_streams"] == 4 and st["branch_fallbacks"] == {} and st["batching"]["eager_buckets"] == {}


def test_failed_branch_capture_of_a_bucket_is_captured_again_on_one_stream(wdl, monkeypatch):
    from _branch_break import REASON, broken_branched

    from recsys_doctor.runtime import _batched_cuda

    monkeypatch.setattr(_batched_cuda, "branched", broken_branched)
    qs = [make_query(40 + k) for k in range(8)]
    ref = [reference(wdl, q) for q in qs]
    with serve(wdl, qs[0], max_batch=4) as s:
        every_result_matches(s, qs, ref, per_thread=10)
        st = s.stats()
        kept = len(s._failed_graphs)
    fb = st["branch_fallbacks"]
    assert sorted(fb) == sorted(f"batch of {k} (group {g})" for k in (1, 2, 4) for g in (0, 1))
    assert set(fb.values()) == {REASON}
    assert kept == 3 * 2  # each failed capture's graph object stays alive: 3 buckets x 2 groups


def test_namedtuple_and_dict_outputs_keep_their_structure():
    Out = namedtuple("Out", "score emb")

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x):
            y = self.lin(x)
            return {"b": Out(y.sum(1), y), "a": y * 2}

    m = Two().cuda().eval()
    xs = [torch.randn(B, 8) for _ in range(6)]
    with serve(m, (xs[0],)) as s:
        outs = [f.result(30) for f in [s.submit(x) for x in xs]]
    for x, o in zip(xs, outs):
        with torch.no_grad():
            want = m(x.cuda())
        assert list(o) == ["b", "a"] and type(o["b"]) is Out
        assert torch.allclose(o["a"], want["a"].cpu(), atol=1e-5) and torch.allclose(o["b"].emb, want["b"].emb.cpu(), atol=1e-5)


class Picky(nn.Module):
    """Raises for a query whose first feature is 7 (eager only: it looks at the values)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        if bool((x[:, 0] == 7.0).any()):
            raise ValueError("poisoned query")
        return self.lin(x)


def test_model_exception_reaches_the_batch_and_serving_goes_on():
    m = Picky().cuda().eval()
    good = [torch.randn(B, 4) for _ in range(3)]
    bad = torch.randn(B, 4)
    bad[0, 0] = 7.0
    with serve(m, (good[0],), groups=1, graphs=False, max_batch=4, max_delay_ms=500) as s:
        futs = [s.submit(good[0]), s.submit(bad), s.submit(good[1]), s.submit(good[2])]
        for f in futs:
            with pytest.raises(ValueError, match="poisoned"):
                f.result(30)
        with torch.no_grad():
            assert torch.allclose(s(good[1]), m(good[1].cuda()).cpu(), atol=1e-5)
        assert s.stats()["batching"]["batch_sizes"].get(4) == 1


def test_abandoned_futures_and_dead_clients_lose_nobody_else(wdl):
    qs = [make_query(50 + k) for k in range(16)]
    ref = [reference(wdl, q) for q in qs]
    with serve(wdl, qs[0]) as s:
        def dying(k):
            s.submit(*qs[k])  # the future is dropped at once
            raise SystemExit  # the client thread dies

        ths = [threading.Thread(target=dying, args=(k,)) for k in range(8)]
        for t in ths:
            t.start()
        kept = [s.submit(*q) for q in qs]
        dropped = [s.submit(*q) for q in qs]
        for f in dropped[::2]:
            f.cancel()
        del dropped
        for t in ths:
            t.join(30)
        for f, r in zip(kept, ref):
            assert (f.result(30) - r).abs().max() <= 1e-5


def test_close_under_load_completes_or_fails_every_request(wdl):
    qs = [make_query(70 + k) for k in range(32)]
    ref = [reference(wdl, q) for q in qs]
    s = serve(wdl, qs[0])
    stop_at = time.monotonic() + 30

    def fn(k):
        if time.monotonic() > stop_at:
            raise RuntimeCudaError("closed")
        return s(*qs[k])

    threading.Timer(0.5, s.close).start()
    res, errs = hammer(fn, 32, 400)
    assert res and errs, "close() came after every request or before any"
    assert all(isinstance(e, RuntimeCudaError) for e in errs), {type(e).__name__ for e in errs}
    assert max(float((o - ref[k]).abs().max()) for k, o in res) <= 1e-5


class Greedy(nn.Module):
    """Asks for 1 TiB of GPU memory when it sees more than 4 queries' rows at once."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        if x.shape[0] > 4 * B:
            torch.empty(1 << 40, dtype=torch.uint8, device=x.device)
        return self.lin(x)


def test_out_of_memory_capturing_a_large_bucket_falls_back_to_smaller():
    m = Greedy().cuda().eval()
    xs = [torch.randn(B, 4) for _ in range(16)]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = serve(m, (xs[0],), max_batch=16)
    try:
        assert any("out of memory capturing the batch of 16" in str(x.message) for x in w), [str(x.message) for x in w]
        st = s.stats()["batching"]
        assert st["buckets"] == [1, 2, 4] and st["max_batch"] == 4
        res, errs = hammer(lambda k: s(xs[k]), 16, 20)
        assert not errs
        with torch.no_grad():
            assert max(float((o - m(xs[k].cuda()).cpu()).abs().max()) for k, o in res) <= 1e-5
    finally:
        s.close()


def test_128_clients_with_default_settings(wdl):
    qs = [make_query(300 + k) for k in range(128)]
    ref = [reference(wdl, q) for q in qs]
    with serve(wdl, qs[0], groups=4) as s:
        res, errs = hammer(lambda k: s(*qs[k]), 128, 10)
    assert not errs and len(res) == 1280
    assert max(float((o - ref[k]).abs().max()) for k, o in res) <= 1e-5


def test_two_driver_threads_by_default_at_most_one_per_group(wdl):
    q = make_query(403)
    ref = reference(wdl, q)
    for groups, kw, want in ((2, {}, 2), (1, {}, 1), (2, {"drivers": 1}, 1)):
        with serve(wdl, q, groups=groups, **kw) as s:
            assert len(s._batcher._threads) == want
            assert all(t.is_alive() for t in s._batcher._threads)
            assert (s(*q) - ref).abs().max() <= 1e-5
        assert not any(t.is_alive() for t in s._batcher._threads)


def test_refused_batching_serves_unbatched():
    class Total(nn.Module):
        def forward(self, x):
            return x.sum().reshape(1)

    m = Total().cuda()
    x = torch.randn(B, 4)
    with pytest.warns(RuntimeWarning, match="batching refused"):
        s = serve(m, (x,))
    with s:
        assert "does not grow by rows" in s.batching_refused
        assert torch.allclose(s(x), x.sum().reshape(1), atol=1e-4)
        assert torch.allclose(s.submit(x).result(10), x.sum().reshape(1), atol=1e-4)


def test_other_signature_served_unbatched_and_switch_interval_restored(wdl):
    q, small = make_query(400), make_query(401, batch=16)
    before = sys.getswitchinterval()
    with serve(wdl, q, switch_interval_ms=0.2) as s:
        assert abs(sys.getswitchinterval() - 0.0002) < 1e-9
        out = s(*small)  # 16 rows: not the batched signature
        assert out.shape == (16, 1) and (out - reference(wdl, small)).abs().max() <= 1e-5
        assert max(s.stats()["batching"]["batch_sizes"] or {0: 0}) <= 1
        assert (s(*q) - reference(wdl, q)).abs().max() <= 1e-5
    assert sys.getswitchinterval() == before


def test_switch_interval_by_default_and_left_alone_on_request(wdl):
    from recsys_doctor.runtime._serve_batching import DEFAULT_SWITCH_INTERVAL_MS

    q = make_query(402)
    before = sys.getswitchinterval()
    a = serve(wdl, q)
    b = serve(wdl, q, switch_interval_ms=1.0)
    assert abs(sys.getswitchinterval() - DEFAULT_SWITCH_INTERVAL_MS / 1e3) < 1e-9  # the shortest held
    a.close()  # the first closed first: the other's interval, then the one from before
    assert abs(sys.getswitchinterval() - 0.001) < 1e-9
    b.close()
    assert sys.getswitchinterval() == before
    with serve(wdl, q, switch_interval_ms=None) as s:
        assert sys.getswitchinterval() == before
        assert (s(*q) - reference(wdl, q)).abs().max() <= 1e-5


# ---------------------------------------------------------------------- include_last_offset and jagged features


VOCABS = [200, 70, 300]  # a table per key, of different sizes
NNZ = 3 * B


def eager_on_cuda(model, q):
    """The model run alone on query ``q`` (host tensors) on the GPU: the reference."""
    from torch.utils._pytree import tree_map

    with torch.no_grad():
        return model(*tree_map(lambda t: t.cuda(), q)).cpu()


def batched_count(s):
    return sum(n * c for n, c in s.stats()["batching"]["batch_sizes"].items())


def test_embedding_bag_include_last_offset_batched_in_graphs():
    torch.manual_seed(0)
    m = BagTotal(1000).cuda().eval()
    qs = [bag_total_query(500 + k, B, 1000) for k in range(24)]
    ref = [eager_on_cuda(m, q) for q in qs]
    with serve(m, qs[0]) as s:
        st = s.stats()["batching"]
        assert st["enabled"], s.batching_refused
        assert st["kinds"] == ["rows", "indices", "indices", "indices", "offsets_total"]
        assert st["eager_buckets"] == {}  # every bucket replays a CUDA graph
        res, errs = hammer(lambda k: s(*qs[k]), 24, 20)
        sizes = s.stats()["batching"]["batch_sizes"]
    assert not errs and len(res) == 480
    assert max(float((o - ref[k]).abs().max()) for k, o in res) <= 1e-5
    assert max(sizes) > 1


@pytest.mark.parametrize("as_offsets,weighted", [(False, False), (True, False), (False, True), (True, True)])
def test_kjt_features_batched_in_graphs(as_offsets, weighted):
    torch.manual_seed(0)
    m = KJTNet(VOCABS, as_offsets=as_offsets, weighted=weighted).cuda().eval()
    qs = [kjt_query(600 + k, B, VOCABS, NNZ, as_offsets, weighted) for k in range(24)]
    ref = [eager_on_cuda(m, q) for q in qs]
    with serve(m, qs[0], batch_spec=kjt_spec(as_offsets, weighted)) as s:
        st = s.stats()["batching"]
        assert st["enabled"], s.batching_refused
        assert st["eager_buckets"] == {}  # the key-major merge is captured with the model
        every_result_matches(s, qs, ref)


def test_kjt_query_with_another_values_count_served_unbatched():
    """More or fewer values than the example: another element total, so not the batched
    signature; served unbatched (its own graph), right, and the batches are untouched."""
    torch.manual_seed(0)
    m = KJTNet(VOCABS).cuda().eval()
    q = kjt_query(700, B, VOCABS, NNZ)
    odd = [kjt_query(701, B, VOCABS, NNZ + 5), kjt_query(702, B, VOCABS, NNZ - 7)]
    with serve(m, q, batch_spec=kjt_spec()) as s:
        assert s.stats()["batching"]["enabled"], s.batching_refused
        before = batched_count(s)
        for o in odd:
            assert (s(*o) - eager_on_cuda(m, o)).abs().max() <= 1e-5
            assert (s.submit(*o).result(30) - eager_on_cuda(m, o)).abs().max() <= 1e-5
        assert batched_count(s) == before
        assert (s(*q) - eager_on_cuda(m, q)).abs().max() <= 1e-5
        assert batched_count(s) == before + 1


def test_a_malformed_query_changes_no_neighbour(wdl):
    """Clients sending well-formed queries and one client whose offsets start above 0 and
    run past its indices share batches (captured graphs): every well-formed result equals
    eager, and the malformed client is answered (its own result is undefined)."""
    qs = [make_query(40 + k) for k in range(12)]
    ref = [reference(wdl, q) for q in qs]
    bad = (qs[0][0], qs[0][1], torch.arange(0, B * 4, 4) + 7)  # first offset 7, last past the 256 indices
    bad[2][5] = 10_000
    with serve(wdl, qs[0]) as s:
        assert s.stats()["batching"]["enabled"], s.batching_refused
        res, errs = hammer(lambda k: s(*(bad if k == 0 else qs[k])), 12, 30)
        sizes = s.stats()["batching"]["batch_sizes"]
    assert not errs, errs[:3]
    assert len(res) == 12 * 30
    assert any(int(n) > 1 for n in sizes), sizes  # the malformed query shared batches
    for k, out in res:
        if k:
            assert (out - ref[k]).abs().max().item() <= 1e-5, k
