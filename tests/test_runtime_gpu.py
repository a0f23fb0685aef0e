"""GPU tests of the stream-group runtime (marker ``gpu``; skipped without a GPU).

Every expected value is computed independently: a single-stream eager run of the same
PyTorch model on the same inputs (serving), or single-stream eager training from the same
initial weights and data (training).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from mmoe_training import MMoE as _MMoE  # noqa: E402 - the examples' models, one definition each
from mmoe_training import warm_up_aside  # noqa: E402
from wdl_serving import WideDeep  # noqa: E402

from _threads import run_threads  # noqa: E402

pytestmark = pytest.mark.gpu

N_SPARSE, VOCAB, DIM, N_DENSE, HOT = 26, 5000, 16, 13, 4


def WDL() -> nn.Module:  # noqa: N802
    """The examples' wide&deep (as in ../shared/probe/opportunity.py), smaller vocabulary and MLP."""
    return WideDeep(VOCAB, hidden=128)


def make_query(seed: int, batch: int = 64):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, N_DENSE, generator=g)
    idx = [torch.randint(0, VOCAB, (batch * HOT,), generator=g) for _ in range(N_SPARSE)]
    offs = torch.arange(0, batch * HOT, HOT)
    return dense, idx, offs


def reference(model, q):
    with torch.no_grad():
        d, i, o = q
        return model(d.cuda(), [t.cuda() for t in i], o.cuda()).cpu()


@pytest.fixture(scope="module")
def wdl():
    torch.manual_seed(0)
    return WDL().cuda().eval()


def _hammer(served, queries, n_threads):
    results: dict[int, torch.Tensor] = {}
    barrier = threading.Barrier(n_threads)

    def worker(k: int) -> None:
        barrier.wait()
        for j in range(k, len(queries), n_threads):
            results[j] = served(*queries[j])

    errors = run_threads(worker, n_threads)
    assert not errors, errors
    return results


@pytest.mark.parametrize("groups,merge,graphs", [(4, True, True), (3, False, True), (2, True, False),
                                                 (2, False, False), (1, True, True)])
def test_serve_matches_single_stream_eager(wdl, groups, merge, graphs):
    from recsys_doctor.runtime import serve

    queries = [make_query(100 + j) for j in range(160)]
    refs = [reference(wdl, q) for q in queries]
    # distinct inputs really give distinct outputs (so a mix-up would be caught)
    assert not torch.allclose(refs[0], refs[1])
    with serve(wdl, queries[0], groups=groups, merge=merge, graphs=graphs) as served:
        got = _hammer(served, queries, n_threads=8)
        st = served.stats()
    assert sorted(got) == list(range(len(queries)))
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j], ref, rtol=1e-5, atol=1e-6)
    assert sum(g["served"] for g in st["groups"]) == len(queries)
    assert st["fallbacks"] == {}
    if graphs:
        assert all(g["graphs"] >= 1 for g in st["groups"])
    if groups > 1:  # least-loaded dispatch spreads 8 threads over all groups
        assert all(g["served"] > 0 for g in st["groups"])


def test_request_zero_copy_matches_eager_under_threads(wdl):
    """The zero-copy path: clients write into the slot's pinned views / flat buffer."""
    from recsys_doctor.runtime import serve

    queries = [make_query(300 + j) for j in range(96)]
    refs = [reference(wdl, q) for q in queries]
    got: dict[int, torch.Tensor] = {}
    with serve(wdl, queries[0], groups=4, merge=True, graphs=True) as served:
        # the flat buffer holds the inputs at the layout's offsets: pack one query by hand
        with served.request() as r:
            lay = r.layout
            flat = [queries[5][0], *queries[5][1], queries[5][2]]
            for t, off in zip(flat, lay.offsets):
                nb = t.numel() * t.element_size()
                r.buffer[off:off + nb].copy_(t.reshape(-1).view(torch.uint8))
            torch.testing.assert_close(r.run().clone(), refs[5], rtol=1e-5, atol=1e-6)

        def worker(k: int) -> None:
            for j in range(k, len(queries), 8):
                d, i, o = queries[j]
                with served.request() as q:
                    q.inputs[0].copy_(d)
                    for dst, src in zip(q.inputs[1], i):
                        dst.copy_(src)
                    q.inputs[2].copy_(o)
                    got[j] = q.run().clone()

        errors = run_threads(worker, 8)
        st = served.stats()
    assert not errors, errors
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j], ref, rtol=1e-5, atol=1e-6)
    assert st["driver_path"] == "ctypes"
    assert st["fallbacks"] == {}


def test_request_after_close_and_reuse_errors(wdl):
    from recsys_doctor.errors import RuntimeCudaError
    from recsys_doctor.runtime import serve

    q0 = make_query(1)
    with serve(wdl, q0, groups=1, slots_per_group=1) as served:
        r = served.request()
        r.close()
        with pytest.raises(RuntimeCudaError, match="closed"):
            r.run()
        # the slot went back: a second request does not block
        with served.request(*make_query(2, batch=32)) as r2:  # another signature, captured on demand
            assert r2.inputs[0].shape == (32, N_DENSE)


@pytest.mark.parametrize("launch,copies", [("release-gil", "inside"), ("keep-gil", "outside")])
def test_hot_path_variants_match_eager(wdl, monkeypatch, launch, copies):
    """The measured variants of the hot path (launch mode, copies in or around the graph)."""
    from recsys_doctor.runtime import _fastpath, serve

    monkeypatch.setattr(_fastpath, "_instance", None)
    monkeypatch.setenv(_fastpath.ENV_LAUNCH, launch)
    monkeypatch.setenv("RECSYS_DOCTOR_GRAPH_COPIES", copies)
    queries = [make_query(500 + j) for j in range(48)]
    refs = [reference(wdl, q) for q in queries]
    try:
        with serve(wdl, queries[0], groups=3) as served:
            got = _hammer(served, queries, n_threads=6)
            st = served.stats()
    finally:
        monkeypatch.setattr(_fastpath, "_instance", None)
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j], ref, rtol=1e-5, atol=1e-6)
    assert st["copies_in_graph"] is (copies == "inside")
    assert ("releases the GIL" in st["driver_path"]) is (launch == "release-gil")


@pytest.mark.parametrize("own", [True, False])
def test_activations_come_from_the_groups_own_pool(wdl, own):
    """per_stream_allocator: each group's graph activations live in that group's pool."""
    from recsys_doctor.runtime import serve

    with serve(wdl, make_query(1), groups=3, per_stream_allocator=own) as served:
        for j in range(12):
            served(*make_query(j))
        st = served.stats()
    if own:
        assert st["activation_pool"] == "group"
        sizes = st["activation_pool_bytes"]
        assert sizes is not None and len(sizes) == 3 and all(b > 0 for b in sizes)
    else:
        assert st["activation_pool"] == "shared"
        assert st["activation_pool_bytes"] is None


def test_new_shape_is_captured_on_demand_and_correct(wdl):
    from recsys_doctor.runtime import serve

    with serve(wdl, make_query(1, batch=64), groups=2) as served:
        for b in (32, 64, 17):
            q = make_query(7 + b, batch=b)
            torch.testing.assert_close(served(*q), reference(wdl, q), rtol=1e-5, atol=1e-6)
        st = served.stats()
    assert st["fallbacks"] == {}
    assert sum(g["graphs"] for g in st["groups"]) >= 2 * 2 + 2  # example shape everywhere + new ones


def test_an_input_holding_tensors_in_an_object_is_refused_and_nothing_is_left_open(wdl):
    """A dataclass batch as the example (or in a later call) would be keyed by its repr and
    captured with the tensors it held: refused in one line, the streams of the refused example
    closed, the served model's next calls unharmed."""
    import dataclasses

    from recsys_doctor.errors import BadInputError
    from recsys_doctor.runtime import serve

    @dataclasses.dataclass
    class Query:
        dense: torch.Tensor

    before = threading.active_count()
    with pytest.raises(BadInputError, match="an input of type Query"):
        serve(wdl, (Query(torch.randn(64, N_DENSE)),), groups=2)
    assert threading.active_count() == before
    with serve(wdl, make_query(1), groups=2) as served:
        d, i, o = make_query(2)
        with pytest.raises(BadInputError, match="an input of type Query"):
            served(Query(d), i, o)
        torch.testing.assert_close(served(d, i, o), reference(wdl, (d, i, o)), rtol=1e-5, atol=1e-6)


def test_failed_cuda_call_names_the_call_and_meaning():
    from cuda.bindings import driver

    from recsys_doctor.errors import RuntimeCudaError
    from recsys_doctor.runtime import call
    from recsys_doctor.runtime._cuda import ensure_context
    from recsys_doctor.runtime._streams import StreamManager

    with StreamManager(1) as mgr:
        ensure_context(mgr.context)
        with pytest.raises(RuntimeCudaError) as ei:
            call(driver.cuMemAlloc, 1 << 62)
    msg = str(ei.value)
    assert msg.startswith("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)")
    assert "allocate enough memory" in msg


def test_manager_spreads_and_closes():
    from recsys_doctor.runtime import StreamManager

    mgr = StreamManager(3, merge=False, slots=1)
    with mgr.acquire() as a, mgr.acquire() as b, mgr.acquire() as c:
        assert {a.index, b.index, c.index} == {0, 1, 2}
        assert len(set(a.stream_handles)) == 3  # unmerged: three distinct streams
    assert [g.in_flight for g in mgr.groups] == [0, 0, 0]
    mgr.close()
    mgr.close()  # idempotent


def test_no_memory_growth_over_many_queries(wdl):
    from cuda.bindings import driver

    from recsys_doctor.runtime import serve

    queries = [make_query(500 + j) for j in range(16)]
    with serve(wdl, queries[0], groups=4) as served:
        _hammer(served, queries * 20, n_threads=8)  # warm
        torch.cuda.synchronize()
        free0 = driver.cuMemGetInfo()[1]
        res0 = torch.cuda.memory_reserved()
        pools0 = served.manager.pool_stats()
        _hammer(served, queries * 250, n_threads=8)  # 4000 queries
        torch.cuda.synchronize()
        free1 = driver.cuMemGetInfo()[1]
        assert torch.cuda.memory_reserved() == res0
        assert served.manager.pool_stats() == pools0
        assert free0 - free1 < (4 << 20)


# ----------------------------------------------------------------------------- training

F, T, H, B, VOC = 26, 4, 64, 256, 4000  # features, tasks, expert width, batch, vocabulary


def MMoE(streams) -> nn.Module:  # noqa: N802
    """The examples' MMoE, smaller: experts 416-64-64-32, towers 32-16-1, vocabulary 4000."""
    return _MMoE(VOC, hidden=H, expert_out=32, tower=16, streams=streams)


def _train(streams, graph: bool, steps: int = 50):
    torch.manual_seed(0)
    m = MMoE(streams).cuda()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2, capturable=True)
    lossf = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(123)
    data = [(torch.randint(0, VOC, (B, F), generator=gen), torch.rand(B, T, generator=gen)) for _ in range(steps)]
    ids = torch.empty(B, F, dtype=torch.long, device="cuda")
    y = torch.empty(B, T, device="cuda")
    loss_buf = torch.zeros((), device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        loss = lossf(m(ids), y)
        loss.backward()
        opt.step()
        loss_buf.copy_(loss.detach())

    losses = []
    if not graph:
        for a, b in data:
            ids.copy_(a)
            y.copy_(b)
            step()
            losses.append(loss_buf.item())
        return losses
    # warm-up on a side stream with the first batch, then start over from the same
    # weights and optimizer state: capture must not change what is computed
    init = {k: v.clone() for k, v in m.state_dict().items()}
    ids.copy_(data[0][0])
    y.copy_(data[0][1])
    warm_up_aside(step, 3)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    torch.cuda.synchronize()
    with torch.no_grad():
        m.load_state_dict(init)
        for st in opt.state.values():
            for _k, v in st.items():
                if torch.is_tensor(v):
                    v.zero_()
    for a, b in data:
        ids.copy_(a)
        y.copy_(b)
        g.replay()
        losses.append(loss_buf.item())
    return losses


def test_training_branches_on_streams_match_single_stream():
    from recsys_doctor.runtime import BranchStreams

    ref = _train(False, graph=False)
    assert ref[-1] < ref[0]  # it learns: a real training run
    with BranchStreams(8) as bs:
        eager = _train(bs, graph=False)
        graphed = _train(bs, graph=True)
    ref_graph = _train(False, graph=True)
    torch.testing.assert_close(torch.tensor(eager), torch.tensor(ref), rtol=2e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(ref_graph), rtol=2e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(ref), rtol=2e-3, atol=1e-4)


def test_stream_scope_runs_forward_and_backward_on_the_branch_stream():
    from recsys_doctor.runtime import stream_scope

    torch.manual_seed(3)
    lin = nn.Linear(64, 64).cuda()
    x = torch.randn(128, 64, device="cuda", requires_grad=True)
    ref_y = lin(x).relu().sum()
    ref_y.backward()
    ref_gx, ref_gw = x.grad.clone(), lin.weight.grad.clone()
    x.grad = None
    lin.weight.grad = None
    main = torch.cuda.current_stream()
    with stream_scope(2, inputs=[x]) as sc:
        assert torch.cuda.current_stream() == sc.stream and sc.stream != main
        y = sc.returns(lin(x).relu())
    assert torch.cuda.current_stream() == main
    y.sum().backward()
    torch.testing.assert_close(x.grad, ref_gx)
    torch.testing.assert_close(lin.weight.grad, ref_gw)


class Branchy(nn.Module):
    """Two branches that write each other's tensors in place: a capture on several streams
    must order every read before a later in-place write (and the writes before the reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x, y):
        h1, h2 = self.a(x), self.b(y)
        h1.relu_()
        h2 += h1
        s = h2.sum(dim=1, keepdim=True)
        h1.mul_(0.5)
        return self.c(h2) + s, h1


@pytest.mark.parametrize("streams", [1, 2, 4, 8])
def test_branch_parallel_capture_matches_eager(streams):
    from recsys_doctor.runtime import serve

    torch.manual_seed(2)
    m = Branchy().cuda().eval()
    qs = [(torch.randn(16, 32), torch.randn(16, 32)) for _ in range(40)]
    with torch.no_grad():
        refs = [tuple(o.cpu() for o in m(x.cuda(), y.cuda())) for x, y in qs]
    with serve(m, qs[0], groups=2, graphs=True, branch_streams=streams) as served:
        got = _hammer(served, qs, n_threads=4)
        st = served.stats()
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j][0], ref[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[j][1], ref[1], rtol=1e-5, atol=1e-6)
    assert st["branch_streams"] == streams and st["branch_fallbacks"] == {} and st["fallbacks"] == {}
    assert all(g["graphs"] >= 1 for g in st["groups"])


class Foreign(nn.Module):
    """Writes a tensor with a driver call PyTorch's dispatcher never sees (as a Triton kernel
    or a custom extension called from forward would): a memset to 2.0 on the current stream."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x):
        from cuda.bindings import driver as cu

        y = self.a(x)
        z = torch.empty_like(y)
        cu.cuMemsetD32Async(cu.CUdeviceptr(z.data_ptr()), 0x40000000, z.numel(),
                            cu.CUstream(torch.cuda.current_stream().cuda_stream))
        return y * z


def test_work_outside_the_dispatcher_is_captured_on_one_stream():
    from recsys_doctor.runtime import serve

    torch.manual_seed(4)
    m = Foreign().cuda().eval()
    xs = [torch.randn(8, 16) for _ in range(24)]
    with torch.no_grad():
        refs = [(m.a(x.cuda()) * 2).cpu() for x in xs]
    with serve(m, (xs[0],), groups=2, graphs=True) as served:
        got = _hammer(served, [(x,) for x in xs], n_threads=4)
        st = served.stats()
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j], ref, rtol=1e-5, atol=1e-6)
    assert st["fallbacks"] == {} and all(g["graphs"] >= 1 for g in st["groups"])
    (reason,) = set(st["branch_fallbacks"].values())
    assert "outside PyTorch's dispatcher" in reason


def test_failed_branch_capture_is_captured_again_on_one_stream(wdl, monkeypatch):
    from _branch_break import REASON, broken_branched

    from recsys_doctor.runtime import _serve_entry, serve

    monkeypatch.setattr(_serve_entry, "branched", broken_branched)
    queries = [make_query(700 + j) for j in range(24)]
    refs = [reference(wdl, q) for q in queries]
    with serve(wdl, queries[0], groups=2, graphs=True) as served:
        got = _hammer(served, queries, n_threads=4)
        st = served.stats()
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j], ref, rtol=1e-5, atol=1e-6)
    assert st["fallbacks"] == {} and all(g["graphs"] >= 1 for g in st["groups"])
    assert list(st["branch_fallbacks"].values()) == [REASON]


class WatchesSyncMode(nn.Module):
    """Records PyTorch's process-wide sync debug mode each time its forward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.modes: list[int] = []

    def forward(self, x):
        self.modes.append(torch.cuda.get_sync_debug_mode())
        return self.lin(x)


def test_capture_leaves_the_process_sync_debug_mode_alone():
    """The eager run before a capture finds host syncs with a dispatch mode of its own thread,
    not with PyTorch's sync debug mode, one flag for the process: while it was set, any other
    thread's synchronization raised (a script's .cpu(), bench/apply/results/served_route_h100/)."""
    from recsys_doctor.runtime import serve

    torch.manual_seed(2)
    m = WatchesSyncMode().cuda().eval()
    x = torch.randn(16, 8)
    with serve(m, (x,), groups=2, graphs=True) as served:
        out = served(x)
        fb = dict(served.fallbacks)
    with torch.no_grad():
        torch.testing.assert_close(out, m(x.cuda()).cpu(), rtol=1e-5, atol=1e-6)
    assert fb == {} and m.modes and set(m.modes) == {torch.cuda.get_sync_debug_mode()} == {0}, m.modes


# runs last: it exercises a capture that must fail
class HostSync(nn.Module):
    """Reads a value back to the host in forward: cannot be captured in a CUDA graph."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        y = self.lin(x)
        scale = float(y.abs().max().item()) + 1.0
        return y / scale


def test_capture_failure_falls_back_to_eager_and_says_why():
    from recsys_doctor.runtime import serve

    torch.manual_seed(1)
    m = HostSync().cuda().eval()
    xs = [torch.randn(16, 8) for _ in range(24)]
    with torch.no_grad():
        refs = [m(x.cuda()).cpu() for x in xs]
    with serve(m, (xs[0],), groups=2, graphs=True) as served:
        got = _hammer(served, [(x,) for x in xs], n_threads=4)
        fb = dict(served.fallbacks)
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j], ref, rtol=1e-5, atol=1e-6)
    assert len(fb) == 1
    (reason,) = fb.values()
    assert "capture failed" in reason and "running eagerly" in reason


def test_a_model_drawing_host_random_numbers_is_served_without_graphs(wdl):
    """An epsilon-greedy wrapper whose ``forward`` draws from a ``random.Random`` it keeps:
    ``serve(graphs=True, batching=True)`` warns and serves it eagerly and unbatched
    (``runtime/_hostvalues.py``); from one client thread every output equals the unserved
    model's with the same draws, both branches taken."""
    import random

    from recsys_doctor.runtime import serve

    class Explore(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.rng = random.Random(11)

        def forward(self, dense, idx, offs):
            y = self.inner(dense, idx, offs)
            return y.flip(0) if self.rng.random() < 0.3 else y

    model = Explore(wdl)
    queries = [make_query(400 + j) for j in range(30)]
    refs = [reference(model, q) for q in queries]
    draws = random.Random(11)
    assert 0 < sum(draws.random() < 0.3 for _ in queries) < len(queries)
    with pytest.warns(RuntimeWarning, match="served without CUDA graphs or batching"):
        served = serve(model, queries[0], groups=2, graphs=True, batching=True)
    model.rng.seed(11)  # (whatever serve() ran of the model while setting up)
    with served:
        got = [served(*q) for q in queries]
        st = served.stats()
    for j, ref in enumerate(refs):
        torch.testing.assert_close(got[j], ref, rtol=1e-5, atol=1e-6)
    assert st["config"]["cuda_graphs"] is False and st["batching"]["enabled"] is False
    assert all(g["graphs"] == 0 for g in st["groups"])
