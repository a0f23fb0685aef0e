"""The script hook on a real GPU, its groups and its graphs per shape (run on the GPU machine:
``pytest -m gpu tests/test_autoapply_gpu.py``).

* the groups are the runtime's: every hooked thread's current stream is its group's
  stream of one ``streams_only`` ``StreamManager`` (thread ``i`` -> group ``i mod groups``,
  the threads of a group on one stream), bridged as ``torch.cuda.ExternalStream``;
* a model called with 5 row counts is graphed per row bucket (padded rows, verified first),
  a model that mixes rows (softmax over the batch) per exact shape, never padded; outputs
  equal the unhooked eager ones, graphs stay within the bound, and every call is counted at
  the test's line, taken over or left to PyTorch with the reason;
* a model with a host sync in its forward cannot be captured: it runs eagerly, with equal
  outputs, and the reason names the line of the forward that synchronized;
* a model that takes host tensors and copies them inside forward (the candidates ranker's) is
  taken over, copies and model in one graph per thread or per row bucket, with outputs equal to
  the unhooked run; one that also uses them on the host is left them, said with the line;
* the runtime's streams stay open to the process's end (PyTorch's allocator may still
  use them while it tears down), and a hooked script exits cleanly, with no word on stderr.
"""

from __future__ import annotations

import sys

import pytest
from test_apply_gpu import _run_hooked, _wdl, pinned_query

from recsys_doctor.applying._autoapply import buckets, graphs

pytestmark = pytest.mark.gpu


def test_hook_groups_are_the_runtimes_streams(tmp_path, monkeypatch):
    """Threads placed at their start (``RECSYS_DOCTOR_PLACE=start``; placed at their first model
    call, the default, these clients that call no model would stay on the default stream) run on
    the runtime's group streams, in start order, blocking streams."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("RECSYS_DOCTOR_PLACE", "start")
    torch.zeros(1, device="cuda")  # the hook takes threads started once CUDA is initialized
    seen: dict[int, int] = {}

    def client(k: int) -> None:
        seen[k] = torch.cuda.current_stream().cuda_stream

    st = _run_hooked(tmp_path, 2, 4, client)
    assert st["threads"] == 4 and not st["fallbacks"], st
    streams = sys.modules["_recsys_doctor_autoapply"]._state["streams"]
    mgr = streams.manager
    assert mgr.streams_only and mgr.merge and len(mgr.groups) == 2 and not mgr.closed
    handles = [g.stream_handles[0] for g in mgr.groups]
    assert len(set(handles)) == 2 and all(g.stream_handles == (h, h, h) for g, h in zip(mgr.groups, handles))
    assert all(isinstance(s, torch.cuda.ExternalStream) for s in streams.streams)
    assert [s.cuda_stream for s in streams.streams] == handles
    groups = sys.modules["_recsys_doctor_autoapply"]._state["groups"]
    assert all(g.streams is streams and g.stream is streams.streams[k] for k, g in groups.items())
    # thread k (in start order) on group k mod 2: threads 0 and 2 share a stream, 1 and 3 the other
    assert [seen[k] for k in range(4)] == [handles[0], handles[1], handles[0], handles[1]]
    assert torch.cuda.default_stream().cuda_stream not in handles
    # blocking streams (flags 0, not CU_STREAM_NON_BLOCKING): ordered with the default stream's
    # work, as the script's threads were on it (groups.py; a side stream, where captures run, is not)
    from cuda.bindings import driver

    def flags(h: int) -> int:
        err, f = driver.cuStreamGetFlags(driver.CUstream(h))
        assert int(err) == 0, err
        return int(f)

    assert [flags(h) for h in handles] == [0, 0]
    assert flags(int(mgr.side_stream())) == int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)


def test_streams_only_manager_has_its_streams_alone():
    pytest.importorskip("torch")
    from recsys_doctor.errors import RuntimeCudaError
    from recsys_doctor.runtime import StreamManager

    mgr = StreamManager(2, streams_only=True)
    assert all(not g.slots and g.mr is None for g in mgr.groups) and mgr.pool_stats() == []
    with pytest.raises(RuntimeCudaError, match="no slots"):
        with mgr.acquire_slot():
            pass
    with pytest.raises(RuntimeCudaError, match="no memory pool"):
        mgr.groups[0].allocate(16)
    with mgr.acquire() as g:
        assert g in mgr.groups
    side = mgr.side_stream()
    assert side not in {g.stream_handles[0] for g in mgr.groups}
    mgr.close()
    mgr.close()  # idempotent
    with pytest.raises(RuntimeCudaError, match="closed"):
        mgr.side_stream()


ROWS = (37, 50, 64, 100, 128)  # buckets 64 and 128
ROUNDS = 6


def _models(torch):
    nn = torch.nn

    class PerRow(nn.Module):
        """Rows independent, elementwise only (no reduction, no matrix product, whose kernels
        may change with the row count): padded rows give bit-equal real rows. Its second
        output is one value a call, the same for any row count (never cut)."""

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1000, 16)

        def forward(self, idx, w):
            return torch.sigmoid(self.emb(idx[:, 0]) * w[:, :1] + self.emb(idx[:, 1])), self.emb.weight[0, 0] * 2

    class SoftmaxOverBatch(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1000, 16)

        def forward(self, idx, w):
            return torch.softmax((self.emb(idx) * w.unsqueeze(2)).sum((1, 2)), dim=0)

    return PerRow, SoftmaxOverBatch


def _hooked_rows(tmp_path, torch, model, groups=2, threads=4, call=lambda model, q: model(*q)):
    """Every client calls ``model`` ROUNDS times with each row count of ROWS (``call(model,
    (idx, w))``); returns the outputs by (client, round, rows), the unhooked eager ones by rows,
    and the hook's stats."""
    g = torch.Generator().manual_seed(3)
    qs = {n: (torch.randint(0, 1000, (n, 4), generator=g).cuda(), torch.rand(n, 4, generator=g).cuda())
          for n in ROWS}
    with torch.no_grad():
        ref = {n: call(model, q) for n, q in qs.items()}
    torch.cuda.synchronize()
    got: dict = {}

    def client(k: int) -> None:
        with torch.no_grad():
            for r in range(ROUNDS):
                for n in ROWS:
                    got[k, r, n] = call(model, qs[n])
        torch.cuda.current_stream().synchronize()

    st = _run_hooked(tmp_path, groups, threads, client)
    return got, ref, st


def _model_sites(st):
    rows = [s for s in st["sites"] if s["kind"] == "model"]
    assert rows and all("test_autoapply_gpu.py:" in s["site"] for s in rows), rows
    return rows


def test_varying_rows_are_graphed_per_bucket(tmp_path):
    torch = pytest.importorskip("torch")
    PerRow, _ = _models(torch)
    torch.manual_seed(0)
    model = PerRow().cuda().eval()
    got, ref, st = _hooked_rows(tmp_path, torch, model)
    for (k, r, n), out in got.items():
        # the padded graph's real rows: within the verification's tolerance (elementwise kernels
        # give the same bits on the GPU for any row count; a CPU's vector tails may not)
        assert out[0].shape == ref[n][0].shape, (k, r, n)
        assert torch.allclose(out[0], ref[n][0], rtol=buckets.PAD_RTOL, atol=buckets.PAD_ATOL), (k, r, n)
        assert torch.equal(out[1], ref[n][1]), (k, r, n)  # a per-call scalar, not cut
    hook = sys.modules["_recsys_doctor_autoapply"]
    for g in hook._state["groups"].values():
        site = g.sites[id(model)]
        assert site.no_pad is None and len(site.verified) == 2, (site.no_pad, site.verified)
        assert all(site.padded_ok(k) for k in site.verified)
        assert len(site.keys) <= buckets.MAX_GRAPHS_PER_SITE
    _assert_two_buckets_replayed(st)


def _assert_two_buckets_replayed(st):
    """A bucketed run's hook stats: 2 buckets captured on each of 2 groups, every call of the
    4 threads counted, most of them replayed, and only verification or warm-up left eager."""
    assert st["captured"] == 2 * 2  # 2 buckets on each of 2 groups
    sites = _model_sites(st)
    calls = 4 * ROUNDS * len(ROWS)
    assert sum(s["taken_over"] + s["fallback"] for s in sites) == calls
    assert sum(s["taken_over"] for s in sites) > calls // 2
    reasons = {r for s in sites for r in s["reasons"]}
    assert reasons <= {buckets.VERIFYING, buckets.WARMING_UP}, reasons


def test_a_named_tuple_argument_is_graphed_per_bucket_like_plain_tensors(tmp_path):
    """The inputs in a named tuple, a list and a dict (``model(Batch(idx, [w]), opts={"w": w})``):
    padded, verified, captured and replayed as plain tensor arguments are. A padded call once
    made the named tuple again from one generator (a TypeError in the script's call) and a
    capture of such a call failed (its calls eager)."""
    from collections import namedtuple

    torch = pytest.importorskip("torch")
    PerRow, _ = _models(torch)
    Batch = namedtuple("Batch", "idx ws")

    class TakesABatch(PerRow):
        def forward(self, batch, opts):
            assert type(batch) is Batch and type(batch.ws) is list and list(opts) == ["w", "scale"]
            return super().forward(batch.idx, batch.ws[0] * opts["scale"] + opts["w"] * 0)

    torch.manual_seed(0)
    model = TakesABatch().cuda().eval()
    got, ref, st = _hooked_rows(tmp_path, torch, model,
                                call=lambda m, q: m(Batch(q[0], [q[1]]), opts={"w": q[1], "scale": 2.0}))
    for (k, r, n), out in got.items():
        assert out[0].shape == ref[n][0].shape, (k, r, n)
        assert torch.allclose(out[0], ref[n][0], rtol=buckets.PAD_RTOL, atol=buckets.PAD_ATOL), (k, r, n)
    _assert_two_buckets_replayed(st)


def test_a_dataclass_argument_is_graphed_per_bucket_like_plain_tensors(tmp_path):
    """The inputs in a frozen dataclass, as many scripts hand a batch to their model
    (``model(Features(idx, [w], 2.0))``): padded, verified, captured and replayed as plain tensor
    arguments are (it was 'not graphed: an argument of type Features', every call eager)."""
    from dataclasses import dataclass

    torch = pytest.importorskip("torch")
    PerRow, _ = _models(torch)

    @dataclass(frozen=True)
    class Features:
        idx: object
        ws: list
        scale: float = 1.0

    class TakesFeatures(PerRow):
        def forward(self, f):
            assert type(f) is Features and type(f.ws) is list and f.scale == 2.0
            return super().forward(f.idx, f.ws[0] * f.scale)

    torch.manual_seed(0)
    model = TakesFeatures().cuda().eval()
    got, ref, st = _hooked_rows(tmp_path, torch, model, call=lambda m, q: m(Features(q[0], [q[1]], 2.0)))
    for (k, r, n), out in got.items():
        assert out[0].shape == ref[n][0].shape, (k, r, n)
        assert torch.allclose(out[0], ref[n][0], rtol=buckets.PAD_RTOL, atol=buckets.PAD_ATOL), (k, r, n)
    _assert_two_buckets_replayed(st)


def test_a_model_that_mixes_rows_gets_exact_shapes_only(tmp_path):
    torch = pytest.importorskip("torch")
    _, SoftmaxOverBatch = _models(torch)
    torch.manual_seed(0)
    model = SoftmaxOverBatch().cuda().eval()
    got, ref, st = _hooked_rows(tmp_path, torch, model)
    for (k, r, n), out in got.items():
        assert out.shape == (n,) and torch.equal(out, ref[n]), (k, r, n)
    hook = sys.modules["_recsys_doctor_autoapply"]
    for g in hook._state["groups"].values():
        site = g.sites[id(model)]
        assert site.no_pad == buckets.MIXES_ROWS and not site.verified
        assert len(site.keys) == len(ROWS) <= buckets.MAX_GRAPHS_PER_SITE
    assert st["captured"] == 2 * len(ROWS)  # one graph per exact shape on each of 2 groups
    assert buckets.MIXES_ROWS in st["fallbacks"]
    sites = _model_sites(st)
    assert sum(s["taken_over"] + s["fallback"] for s in sites) == 4 * ROUNDS * len(ROWS)
    assert sum(s["taken_over"] for s in sites) > 0


def test_an_uncapturable_model_runs_eagerly_and_says_where(tmp_path):
    torch = pytest.importorskip("torch")

    class SyncsInForward(torch.nn.Module):
        def forward(self, x):
            return x * x.sum().item()

    model = SyncsInForward().eval()
    qs = [torch.rand(16, 4, device="cuda") for _ in range(4)]
    ref = [model(q) for q in qs]
    torch.cuda.synchronize()
    got: dict = {}

    def client(k: int) -> None:
        with torch.no_grad():
            for r in range(6):
                got[k, r] = model(qs[k])
        torch.cuda.current_stream().synchronize()

    st = _run_hooked(tmp_path, 2, 4, client)
    for (k, r), out in got.items():
        assert torch.equal(out, ref[k]), (k, r)
    line = SyncsInForward.forward.__code__.co_firstlineno + 1
    # the first failed capture (one a group where both groups capture at once) makes the module
    # eager: no other capture is tried, and every later call gives the reason of that
    failed = [r for r in st["fallbacks"] if r.startswith("capture failed: ")]
    eager = [r for r in st["fallbacks"] if r.startswith(graphs.NEEDS_HOST)]
    assert st["captured"] == 0 and 1 <= len(failed) <= 2 and len(eager) == 1, st["fallbacks"]
    assert len(failed) + len(eager) == len(st["fallbacks"])
    for reason in st["fallbacks"]:
        assert f"test_autoapply_gpu.py:{line}: return x * x.sum().item()" in reason
    sites = _model_sites(st)
    assert sum(s["fallback"] for s in sites) == 4 * 6 and sum(s["taken_over"] for s in sites) == 0
    reasons = {r: c for s in sites for r, c in s["reasons"].items()}
    assert set(reasons) == {buckets.WARMING_UP, *st["fallbacks"]}
    assert reasons[eager[0]] > 0 and reasons[buckets.WARMING_UP] <= 2 * graphs.WARMUP_CALLS


def test_a_frozen_model_called_with_gradients_on_is_graphed(tmp_path):
    """A model frozen with requires_grad_(False), called with gradients on (client threads with
    no no_grad: a script's torch.set_grad_enabled(False) reaches its main thread only): nothing
    of the call can require grad, so the hook runs it under no_grad and graphs it; every output
    equals eager's and requires no grad, as eager's does not."""
    torch = pytest.importorskip("torch")
    PerRow, _ = _models(torch)
    torch.manual_seed(0)
    model = PerRow().cuda().eval().requires_grad_(False)
    g = torch.Generator().manual_seed(5)
    qs = [(torch.randint(0, 1000, (32, 4), generator=g).cuda(), torch.rand(32, 4, generator=g).cuda()) for _ in range(4)]
    ref = [model(*q) for q in qs]
    assert torch.is_grad_enabled() and not ref[0][0].requires_grad
    torch.cuda.synchronize()
    got: dict = {}

    def client(k: int) -> None:
        for r in range(8):
            got[k, r] = model(*qs[k])
        torch.cuda.current_stream().synchronize()

    st = _run_hooked(tmp_path, 2, 4, client)
    for (k, r), out in got.items():
        assert torch.equal(out[0], ref[k][0]) and torch.equal(out[1], ref[k][1]) and not out[0].requires_grad, (k, r)
    sites = _model_sites(st)
    assert st["captured"] >= 1 and sum(s["taken_over"] for s in sites) > 0
    assert not any(graphs.GRAD_ON in s["reasons"] for s in sites), sites


#: candidates a request (the candidates ranker's 50-400), scored in batches of at most MAX_BATCH
#: rows: 128, 128, 44 / 128 / 77 / 128, 72 / 50 (buckets 64 and 128, most requests ending partial)
REQUESTS = (300, 128, 77, 200, 50)
MAX_BATCH = 128


def _host_input_models(torch):
    nn = torch.nn

    class HostInputs(nn.Module):
        """The candidates ranker's model: host tensors in, copied inside forward three ways.
        Rows independent and elementwise only, so a padded graph's real rows are bit-equal."""

        def __init__(self):
            super().__init__()
            self.device = "cuda"
            self.user, self.item = nn.Embedding(100, 16), nn.Embedding(1000, 16)

        def forward(self, user, items, dense):
            user, items = user.to(self.device), items.cuda()
            dense = dense.to(self.device, non_blocking=True)
            return torch.sigmoid(self.user(user).expand(items.shape[0], -1) * self.item(items) + dense)

    class UsesItsHostInputs(HostInputs):
        def forward(self, user, items, dense):
            top = int(items.max())  # a use of a host argument on the host
            return super().forward(user, items.clamp(max=top), dense)

    return HostInputs, UsesItsHostInputs


def _host_input_calls(tmp_path, torch, model, pinned_too=True, groups=2, threads=4, rounds=12):
    """Every client scores ``rounds`` requests (REQUESTS in turn) with ``model``, passing host
    tensors (pinned ones on odd clients where ``pinned_too``), one ``.cpu()`` a batch as the
    ranker does. Returns the outputs by (client, round, first row), the unhooked ones by
    (request, first row), the number of calls and the hook's stats."""
    g = torch.Generator().manual_seed(5)
    reqs = [(torch.randint(0, 100, (1,), generator=g), torch.randint(0, 1000, (n,), generator=g),
             torch.rand(n, 16, generator=g)) for n in REQUESTS]
    pinned = [tuple(t.pin_memory() for t in req) for req in reqs] if pinned_too else reqs
    with torch.no_grad():
        ref = {(q, s): model(u, i[s:s + MAX_BATCH], d[s:s + MAX_BATCH]).cpu()
               for q, (u, i, d) in enumerate(reqs) for s in range(0, len(i), MAX_BATCH)}
    got: dict = {}

    def client(k: int) -> None:
        with torch.no_grad():
            for r in range(rounds):
                user, items, dense = (pinned if k % 2 else reqs)[(k + r) % len(reqs)]
                for s in range(0, len(items), MAX_BATCH):
                    got[k, r, s] = model(user, items[s:s + MAX_BATCH], dense[s:s + MAX_BATCH]).cpu()

    st = _run_hooked(tmp_path, groups, threads, client)
    for (k, r, s), out in got.items():
        want = ref[(k + r) % len(reqs), s]
        assert out.shape == want.shape and torch.equal(out, want), (k, r, s)
    return len(got), st


def test_a_model_copying_its_host_inputs_in_forward_is_taken_over(tmp_path):
    """The candidates ranker's pattern: each host argument goes through the thread's pinned slot
    for its position, the copies inside forward are the hook's, and the whole call - copies and
    model - is one replay of the thread's graph (full batches) or of the group's graph of its
    row bucket (partial ones, padded); every output equals the unhooked one, and no copy is left
    to PyTorch."""
    torch = pytest.importorskip("torch")
    HostInputs, _ = _host_input_models(torch)
    torch.manual_seed(0)
    model = HostInputs().cuda().eval()
    calls, st = _host_input_calls(tmp_path, torch, model)
    assert not st["fallbacks"], st["fallbacks"]
    # each thread's graph of its full batches; per group the graphs of buckets 128 and 64
    assert st["thread_graphs"] == 4 and st["thread_replays"] > 0 and st["replays"] > 0, st
    assert st["captured"] == 2 * 2
    (site,) = _model_sites(st)
    assert site["taken_over"] + site["fallback"] == calls and site["taken_over"] > calls // 2, site
    assert set(site["reasons"]) <= {buckets.VERIFYING, buckets.WARMING_UP}, site
    # the three copies of every call, counted at the model call's line, none left to PyTorch
    # (none at forward's lines)
    h2d = [s for s in st["sites"] if s["kind"] == "h2d"]
    assert [(s["site"], s["taken_over"], s["fallback"]) for s in h2d] == [(site["site"], 3 * calls, 0)], h2d


def test_a_model_using_its_host_inputs_on_the_host_keeps_them(tmp_path):
    """A forward that reads a host argument on the host: the first calls still give the unhooked
    outputs, the model is left its host arguments from then on (said once, with the line of
    forward), and its copies are PyTorch's again, counted at forward's lines."""
    torch = pytest.importorskip("torch")
    _, UsesItsHostInputs = _host_input_models(torch)
    torch.manual_seed(0)
    model = UsesItsHostInputs().cuda().eval()
    calls, st = _host_input_calls(tmp_path, torch, model, pinned_too=False)
    line = UsesItsHostInputs.forward.__code__.co_firstlineno + 1
    (reason,) = st["fallbacks"]
    assert reason.startswith("the model uses a host argument on the host (") and f"test_autoapply_gpu.py:{line})" in reason
    (site,) = _model_sites(st)
    assert site["taken_over"] + site["fallback"] == calls
    h2d = [s for s in st["sites"] if s["kind"] == "h2d"]
    taken = [s for s in h2d if s["site"] == site["site"]]
    left = [s for s in h2d if s["site"] != site["site"]]
    # the calls made before the model was known (one a thread at most) went through the slots;
    # in those, forward's copy of what it made of `items` on the host is PyTorch's, and in every
    # later call its three copies are
    assert len(taken) == 1 and taken[0]["taken_over"] in (3, 6, 9, 12) and not taken[0]["fallback"], h2d
    first = taken[0]["taken_over"] // 3
    # ... plus, where such a first call was a partial batch, one more: the hook runs forward a
    # second time, padded, to verify the padding (buckets.py), and that run's copy of the
    # clamped items is PyTorch's as well (seen on the H100: 221 = 3 x 72 + 4 + 1, thread 2's
    # first request being 77 rows)
    want = 3 * (calls - first) + first
    assert want <= sum(s["fallback"] for s in left) <= want + first, h2d
    assert all(not s["taken_over"] and s["site"].startswith("tests/test_autoapply_gpu.py:") for s in left), left


_EXIT_SCRIPT = """
import atexit, sys, threading, time
import torch
torch.zeros(1, device="cuda")  # CUDA initialized: the threads started from now on are hooked
m = torch.nn.Linear(4, 4).cuda().eval()
def work():
    with torch.no_grad():
        for _ in range(4):
            m(torch.ones(8, 4, device="cuda")).sum().item()
t = threading.Thread(target=work)
t.start()
t.join()
if sys.argv[1] == "daemon":  # a hooked thread still running at exit
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
hook = sys.modules["_recsys_doctor_autoapply"]
mgr = hook._state["streams"].manager
atexit._run_exitfuncs()  # the exit handlers now (the hook's among them), to look at the manager after
print("closed" if mgr.closed else "open", flush=True)
"""


@pytest.mark.parametrize("mode,want", [("join", "open"), ("daemon", "open")])
def test_the_runtime_streams_stay_open_and_the_script_exits_cleanly(tmp_path, mode, want):
    pytest.importorskip("torch")
    import subprocess

    from recsys_doctor.applying.apply import write_plan
    from recsys_doctor.applying.script_hook import script_env
    from recsys_doctor.planning.whatif import Candidate

    plan = write_plan(tmp_path / "plan.json", {"schema": 1, "stream_groups": {"count": 2},
                                               "cuda_graphs": {"enabled": True}}, Candidate(2, True, True, True))
    env = script_env(plan, hook_dir=tmp_path / "hook")
    out = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, mode], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [want]
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr


# ------------------------------------------------------------------------------ batching (issue 24)

BATCH_ROUNDS = 40
#: how close a batched output must be to eager's: check_spec's own tolerance (a batch's GEMMs
#: have more rows than one call's, and cuBLAS may pick other kernels for them)
BATCH_ATOL, BATCH_RTOL = 1e-5, 1e-4


def _run_batched(tmp_path, groups: int, threads: int, client, max_batch: int = 8) -> dict:
    """``client(k)`` on ``threads`` threads under the script hook with a plan that batches
    (``groups`` graphed groups, batches of up to ``max_batch``); the hook's stats afterwards."""
    from recsys_doctor.planning.whatif import Candidate

    return _run_hooked(tmp_path, groups, threads, client,
                       Candidate(groups, True, False, True, batching=True, max_batch=max_batch))


def _batch_models(torch):
    nn = torch.nn

    class Ranker(nn.Module):
        """Dense rows and EmbeddingBag indices with their offsets: rows stacked, indices
        concatenated, offsets shifted when batched."""

        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(1000, 16, mode="sum")
            self.mlp = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 16))
            self.out = nn.Linear(16, 1)

        def forward(self, dense, idx, offsets):
            return torch.sigmoid(self.out(self.mlp(dense) + self.bag(idx, offsets)))

    class CentersRows(nn.Module):
        """Batch norm in its train-free form: each row minus the batch's mean (rows mixed)."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(13, 8)

        def forward(self, dense, idx, offsets):
            h = self.lin(dense)
            return h - h.mean(0, keepdim=True)

    return Ranker, CentersRows


def _batch_queries(torch, threads: int, rows: int = 16, per_row: int = 3):
    """One query a thread (its own seed): dense ``[rows, 13]``, ``rows * per_row`` indices and
    the offsets of ``per_row`` indices a row; on the GPU, made before the hook."""
    out = []
    for k in range(threads):
        g = torch.Generator().manual_seed(100 + k)
        out.append((torch.rand(rows, 13, generator=g).cuda(), torch.randint(0, 1000, (rows * per_row,), generator=g).cuda(),
                    torch.arange(0, rows * per_row, per_row).cuda()))
    torch.cuda.synchronize()
    return out


def _batched_clients(torch, model, qs, threads: int):
    """Clients that call ``model`` on their own query BATCH_ROUNDS times, all threads at each
    round together (a barrier: the calls arrive while the group is busy)."""
    import threading

    got: dict = {}
    bar = threading.Barrier(threads)

    def client(k: int) -> None:
        with torch.no_grad():
            for r in range(BATCH_ROUNDS):
                bar.wait(120)
                got[k, r] = model(*qs[k])
        torch.cuda.current_stream().synchronize()

    return got, client


def _batched_run(tmp_path, torch, which: int, groups: int, threads: int):
    """Model ``which`` of :func:`_batch_models` (0: the ranker, 1: the row-centering one) called
    by ``threads`` clients under a batching plan of ``groups`` groups: their outputs by (client,
    round), eager's per client, the hook's stats."""
    torch.manual_seed(0)
    model = _batch_models(torch)[which]().cuda().eval()
    qs = _batch_queries(torch, threads)
    with torch.no_grad():
        ref = [model(*q) for q in qs]
    torch.cuda.synchronize()
    got, client = _batched_clients(torch, model, qs, threads)
    return got, ref, _run_batched(tmp_path, groups, threads, client)


@pytest.mark.parametrize("groups", [1, 2])
def test_batched_calls_equal_eager_and_run_in_batches(tmp_path, groups):
    torch = pytest.importorskip("torch")
    threads = 8
    got, ref, st = _batched_run(tmp_path, torch, 0, groups, threads)
    for (k, r), out in got.items():
        assert out.shape == ref[k].shape == (16, 1), (k, r)
        assert torch.allclose(out, ref[k], atol=BATCH_ATOL, rtol=BATCH_RTOL), (k, r, (out - ref[k]).abs().max())
    calls = threads * BATCH_ROUNDS
    assert st["batching"] and st["max_batch"] == 8 and not st["fallbacks"], st["fallbacks"]
    sizes = {int(n): b for n, b in st["batch_sizes"].items()}
    # every call ran in a batch; batches of more than one call happened, none above the group's share
    assert st["batched_calls"] == sum(n * b for n, b in sizes.items()) == calls
    assert max(sizes) > 1 and max(sizes) <= threads // groups, sizes
    sites = _model_sites(st)
    assert sum(s["batched"] for s in sites) == calls and sum(s["taken_over"] for s in sites) == calls
    assert sum(s["fallback"] for s in sites) == 0
    assert {int(n) for s in sites for n in s["batch_sizes"]} == set(sizes)
    # a graph per bucket used (1, 2, 4, 8: the smallest >= the batch), per group
    buckets_used = {1 << (n - 1).bit_length() for n in sizes}
    assert groups <= st["captured"] <= groups * len(buckets_used), (st["captured"], sizes)
    assert st["replays"] == st["batches"]
    # no thread learned a graph of its own: with batching, a call goes to its group's batches
    assert st["thread_graphs"] == 0


def test_a_model_that_mixes_rows_is_not_batched_and_stays_correct(tmp_path):
    torch = pytest.importorskip("torch")
    threads = 8
    got, ref, st = _batched_run(tmp_path, torch, 1, 1, threads)
    for (k, r), out in got.items():
        # the group's graph path, unbatched: the same kernels as eager, replayed
        assert torch.allclose(out, ref[k], atol=1e-6, rtol=1e-6), (k, r)
    refused = [f for f in st["fallbacks"] if f.startswith("not batched: ")]
    assert len(refused) == 1 and "batching changes output 0" in refused[0], st["fallbacks"]
    assert st["batched_calls"] == 0 and st["batches"] == 0
    sites = _model_sites(st)
    assert sum(s["batched"] for s in sites) == 0
    assert sum(s["taken_over"] + s["fallback"] for s in sites) == threads * BATCH_ROUNDS
    assert sum(s["taken_over"] for s in sites) > 0  # graphed all the same
    # (48 indices are the call's most rows: padded to 64, verified first, as without batching)
    assert {r for s in sites for r in s["reasons"]} <= {buckets.WARMING_UP, buckets.VERIFYING}


_BATCH_SCRIPT = """
import json, threading
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda().eval()
qs = [torch.rand(32, 16, generator=torch.Generator().manual_seed(k)).cuda() for k in range(8)]
with torch.no_grad():
    ref = [model(q) for q in qs]  # the main thread is never hooked: eager
torch.cuda.synchronize()
out = {}
bar = threading.Barrier(8)
def client(k):
    with torch.no_grad():
        for r in range(50):
            bar.wait(120)
            out[k, r] = model(qs[k]).cpu()
ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
for t in ts:
    t.start()
for t in ts:
    t.join()
err = max(float((out[k, r] - ref[k].cpu()).abs().max()) for k in range(8) for r in range(50))
print(json.dumps({"qps": 1.0, "max_abs_err": err, "checksum": sum(float(out[k, 49].double().sum()) for k in range(8))}))
"""


@pytest.mark.parametrize("groups", [1, 2])
def test_a_script_run_with_a_batching_plan(tmp_path, groups):
    """A script run as ``profile --apply`` runs a candidate (``script_env``: the hook loaded by
    file path at interpreter start): its outputs are its unhooked run's, and the stats it wrote
    at exit show batches of more than one call."""
    pytest.importorskip("torch")
    import json
    import subprocess

    from recsys_doctor.applying.apply import write_plan
    from recsys_doctor.applying.script_hook import read_hook_stats, script_env
    from recsys_doctor.planning.whatif import Candidate

    plain = subprocess.run([sys.executable, "-c", _BATCH_SCRIPT], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    base = json.loads(plain.stdout.strip().splitlines()[-1])
    plan = write_plan(tmp_path / "plan.json", {"schema": 1}, Candidate(groups, True, False, True, batching=True))
    env = script_env(plan, hook_dir=tmp_path / "hook", stats_path=tmp_path / "stats.json")
    hooked = subprocess.run([sys.executable, "-c", _BATCH_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert hooked.returncode == 0, hooked.stderr
    assert "Traceback" not in hooked.stderr, hooked.stderr
    got = json.loads(hooked.stdout.strip().splitlines()[-1])
    assert base["max_abs_err"] <= 1e-6 and got["max_abs_err"] <= BATCH_ATOL, (base, got)
    assert got["checksum"] == pytest.approx(base["checksum"], rel=1e-5)
    st = read_hook_stats(tmp_path / "stats.json")
    assert st is not None and st["batching"] and st["threads"] == 8, st
    sizes = {int(n): b for n, b in st["batch_sizes"].items()}
    assert st["batched_calls"] == sum(n * b for n, b in sizes.items()) == 8 * 50 and max(sizes) > 1, sizes


# ------------------------------------------------- batching through the runtime (issue 25, .served)


def test_copies_into_a_batched_call_are_served_by_the_runtime(tmp_path):
    """A plain script's query (pinned host tensors copied with ``.to("cuda", non_blocking=True)``
    straight into the model call, the output read with ``.cpu()``) under a batching plan goes
    to the runtime's batched serving, fed from the pinned tensors: outputs equal eager's, the
    calls run in batches of more than one. Client 0 keeps its dense input copy and reads it
    after the call (it must hold the data PyTorch's copy would have); client 1 uses the output
    on the GPU (``* 2`` and ``topk``) before reading it back."""
    torch = pytest.importorskip("torch")
    import threading

    from recsys_doctor.planning.whatif import Candidate

    model, host_query = _wdl()
    threads, rounds = 8, BATCH_ROUNDS
    qs = []
    for k in range(threads):
        torch.manual_seed(70 + k)
        qs.append(host_query(32, 1000))
    with torch.no_grad():
        ref = [model(q[0].cuda(), [t.cuda() for t in q[1]], q[2].cuda()).cpu() for q in qs]
    got: dict = {}
    bar = threading.Barrier(threads)

    def client(k: int) -> None:
        dense, idx, offs = qs[k]
        with torch.no_grad():
            for r in range(rounds):
                bar.wait(120)
                d = dense.to("cuda", non_blocking=True)
                out = model(d, [t.to("cuda", non_blocking=True) for t in idx], offs.to("cuda", non_blocking=True))
                if k == 0:
                    got[k, r, "held"] = d.cpu()
                if k == 1:
                    got[k, r, "x2"] = (out * 2).cpu()
                    got[k, r, "top"] = torch.topk(out.squeeze(1), 5).values.cpu()
                got[k, r] = out.cpu()
                got[k, r, "list"] = out.squeeze(1).tolist()

    st = _run_hooked(tmp_path, 1, threads, client, Candidate(1, True, False, True, batching=True, max_batch=8))
    for k in range(threads):
        for r in range(rounds):
            out = got[k, r]
            assert out.device.type == "cpu" and out.shape == ref[k].shape, (k, r)
            assert torch.allclose(out, ref[k], atol=BATCH_ATOL, rtol=BATCH_RTOL), (k, r, (out - ref[k]).abs().max())
            assert got[k, r, "list"] == out.squeeze(1).tolist()
    for r in range(rounds):
        assert torch.equal(got[0, r, "held"], qs[0][0]), r
        assert torch.allclose(got[1, r, "x2"], ref[1] * 2, atol=2 * BATCH_ATOL, rtol=BATCH_RTOL)
        assert torch.equal(got[1, r, "top"], torch.topk(got[1, r].squeeze(1), 5).values)  # (values: ties at 1.0)
    calls = threads * rounds
    sizes = {int(n): b for n, b in st["served_batch_sizes"].items()}
    # each thread's first call places it in its group (its copies before it are PyTorch's), its
    # second teaches it its copies (the hook's path); every later one is served
    assert st["served_calls"] == calls - 2 * threads, (st["served_calls"], st["fallbacks"])
    assert max(sizes) > 1 and sum(n * b for n, b in sizes.items()) >= st["served_calls"], sizes
    sites = _model_sites(st)
    assert sum(s["taken_over"] for s in sites) >= st["served_calls"]
    assert not [f for f in st["fallbacks"] if "not served" in f], st["fallbacks"]


def _variant_queries(torch, model, host_query, threads: int, seed: int):
    """Per thread ``k``: a pinned query of the wide&deep (seeded ``seed + k``), 3 variants of its
    dense input, and eager's output for each variant."""
    qs, variants, ref = [], [], []
    for k in range(threads):
        torch.manual_seed(seed + k)
        q = host_query(32, 1000)
        vs = [torch.rand_like(q[0]) for _ in range(3)]
        with torch.no_grad():
            ref.append([model(v.cuda(), [t.cuda() for t in q[1]], q[2].cuda()).cpu() for v in vs])
        qs.append(q)
        variants.append(vs)
    return qs, variants, ref


def test_thread_graph_outputs_kept_and_used_on_the_gpu_while_inputs_change(tmp_path):
    """Thread graphs with the script's pinned dense input rewritten in place every query (3
    variants in turn, so each query's values differ from the last one's): ``.cpu()``, ``.item()``
    and a use on the GPU (``* 2``) of each output, and every output kept past the next query (a
    list of every query's, read at the end), equal eager's for that query's input."""
    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    threads, rounds = 4, 30
    qs, variants, ref = _variant_queries(torch, model, host_query, threads, seed=90)
    got: dict = {}

    def client(k: int) -> None:
        dense, idx, offs = qs[k]
        kept = []
        with torch.no_grad():
            for r in range(rounds):
                dense.copy_(variants[k][r % 3])  # (the last query's .cpu() waited for its copies)
                out = model(dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                            offs.to("cuda", non_blocking=True))
                kept.append(out)
                if r % 4 == 1:
                    got[k, r, "x2"] = (out * 2).cpu()
                if r % 5 == 2:
                    got[k, r, "item"] = out[3, 0].item()
                got[k, r] = out.cpu()
        got[k, "kept"] = [o.cpu() for o in kept]

    st = _run_hooked(tmp_path, 2, threads, client)
    for k in range(threads):
        for r in range(rounds):
            want = ref[k][r % 3]
            assert torch.allclose(got[k, r], want, atol=1e-6, rtol=1e-5), (k, r, (got[k, r] - want).abs().max())
            assert torch.allclose(got[k, "kept"][r], want, atol=1e-6, rtol=1e-5), (k, r)
            if (k, r, "x2") in got:
                assert torch.allclose(got[k, r, "x2"], want * 2, atol=2e-6, rtol=1e-5), (k, r)
            if (k, r, "item") in got:
                assert abs(got[k, r, "item"] - float(want[3, 0])) <= 1e-6, (k, r)
    assert st["thread_graphs"] == threads and st["thread_replays"] >= threads * (rounds - 8), st


def test_thread_graph_outputs_are_lent_and_what_the_script_keeps_stays_its_own(tmp_path):
    """Thread graphs lend their static outputs to the script instead of cloning them
    (:mod:`._autoapply.lentout`): threads that keep nothing of an output get the same object back
    every query once they replay (``outputs_lent`` counts those replays), with each query's
    values; a thread that keeps a view of every output (``out[:, 0]``) and one that keeps
    ``.detach()`` of some still read each query's values at the end (a replay waits while such a
    view lives), and every ``.cpu()`` equals eager's for that query's input."""
    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    threads, rounds = 4, 30
    qs, variants, ref = _variant_queries(torch, model, host_query, threads, seed=190)
    got: dict = {}

    def client(k: int) -> None:
        import weakref

        dense, idx, offs = qs[k]
        same, last, views = 0, None, []
        with torch.no_grad():
            for r in range(rounds):
                dense.copy_(variants[k][r % 3])  # (the last query's .cpu() waited for its copies)
                out = model(dense.to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in idx],
                            offs.to("cuda", non_blocking=True))
                got[k, r] = out.cpu()
                if k == 1:
                    views.append((r, out[:, 0]))
                elif k == 2 and r % 7 == 3:
                    views.append((r, out.detach()))
                else:  # the last query's output still alive (a weak reference holds nothing) and this one
                    same += last is not None and last() is out
                    last = weakref.ref(out)
                del out
        got[k, "views"] = [(r, v.cpu()) for r, v in views]
        got[k, "same"] = same

    st = _run_hooked(tmp_path, 2, threads, client)
    for k in range(threads):
        for r in range(rounds):
            want = ref[k][r % 3]
            assert torch.allclose(got[k, r], want, atol=1e-6, rtol=1e-5), (k, r, (got[k, r] - want).abs().max())
    assert [r for r, _ in got[1, "views"]] == list(range(rounds)) and len(got[2, "views"]) == 4
    for k in (1, 2):
        for r, v in got[k, "views"]:
            want = ref[k][r % 3][:, 0] if k == 1 else ref[k][r % 3]
            assert torch.allclose(v, want, atol=1e-6, rtol=1e-5), (k, r)
    # the threads that kept nothing: one object for every replayed query (a clone is a new one, and the
    # last one is gone by the next query)
    assert got[0, "same"] >= rounds - 10 and got[3, "same"] >= rounds - 10, (got[0, "same"], got[3, "same"])
    assert st["outputs_lent"] >= 2 * (rounds - 10), st


def test_pageable_numpy_copies_are_known_again_and_stay_exact(tmp_path):
    """The DLRM script's pattern: every query builds new numpy arrays and moves each with
    ``torch.from_numpy(a).cuda()`` or ``.to("cuda")`` (blocking copies from pageable memory).
    Once a thread has its graph, those copies are written straight into its slots
    (:mod:`._autoapply.pageable_fast`, counted in ``pageable_fast``); every output equals eager's
    for that query's arrays, a last partial batch (fewer rows) and a query on a stream the script
    set included; each query's values differ from the last one's."""
    import numpy as np

    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    threads, rounds, rows = 4, 40, 32
    q0 = host_query(rows, 1000)
    shapes = [tuple(q0[0].shape)] + [tuple(t.shape) for t in q0[1]]

    def arrays(k: int, r: int):
        rng = np.random.default_rng([k, r])
        n = rows if r != rounds - 1 else rows // 2  # the last query: a partial batch
        dense = rng.random((n, shapes[0][1]), dtype=np.float32)
        hot = shapes[1][0] // rows  # ids per sample
        idx = [rng.integers(0, 1000, n * hot, dtype=np.int64) for _ in shapes[1:]]
        return dense, idx, np.arange(0, n * hot, hot, dtype=np.int64)

    def run(k: int, r: int, own_stream=None):
        dense, idx, offs = arrays(k, r)
        with torch.no_grad():
            if own_stream is not None:
                with torch.cuda.stream(own_stream):
                    out = model(torch.from_numpy(dense).cuda(), [torch.from_numpy(i).to("cuda") for i in idx],
                                torch.from_numpy(offs).cuda())
                own_stream.synchronize()
                return out.cpu()
            return model(torch.from_numpy(dense).cuda(), [torch.from_numpy(i).to("cuda") for i in idx],
                         torch.from_numpy(offs).cuda()).cpu()

    ref = {(k, r): run(k, r) for k in range(threads) for r in range(rounds)}
    got: dict = {}

    def client(k: int) -> None:
        side = torch.cuda.Stream()
        for r in range(rounds):
            got[k, r] = run(k, r, side if r == rounds // 2 else None)

    st = _run_hooked(tmp_path, 2, threads, client)
    for key, want in ref.items():
        assert got[key].shape == want.shape and torch.allclose(got[key], want, atol=1e-6, rtol=1e-5), key
    assert st["thread_graphs"] == threads and st["thread_replays"] >= threads * (rounds - 10), st
    copies = 2 + len(shapes) - 1  # dense, offsets and one per index tensor
    assert st["pageable_fast"] >= threads * (rounds - 12) * copies, st


def _slow_model(torch, seed: int):
    """A model busy on the GPU ~1 ms a call at 256 rows (24 matmuls of 2048), seeded, on the GPU,
    in eval mode: ``model(dense [n, 16], idx [4n], offs [n])`` -> ``[n, 4]`` (a view of its last
    activation)."""
    nn = torch.nn

    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.EmbeddingBag(1000, 64, mode="sum")
            self.proj = nn.Linear(16 + 64, 2048)
            self.w = nn.Parameter(torch.randn(2048, 2048) / 48)

        def forward(self, dense, idx, offs):
            h = self.proj(torch.cat([dense, self.emb(idx, offs)], 1))
            for _ in range(24):
                h = torch.tanh(h @ self.w)
            return h[:, :4]

    torch.manual_seed(seed)
    return Slow().cuda().eval()


def _slow_queries(torch, threads: int, rounds: int, seed: int, salt: int):
    """A model busy on the GPU ~1 ms a call (24 matmuls of 2048), queried from numpy arrays with
    ``torch.from_numpy(a).cuda()``: eager's outputs ``ref[k, r]``, the dict ``got`` the client
    fills, and ``client(k)``, which keeps every output on the GPU and reads them all at the end (its
    host runs ahead of the GPU: the next query's copies come while its last replay may be queued)."""
    import numpy as np

    model = _slow_model(torch, seed)
    rows = 256

    def call(k: int, r: int):
        rng = np.random.default_rng([k, r, salt])
        dense, idx = rng.random((rows, 16), dtype=np.float32), rng.integers(0, 1000, rows * 4, dtype=np.int64)
        offs = np.arange(0, rows * 4, 4, dtype=np.int64)
        with torch.no_grad():
            return model(torch.from_numpy(dense).cuda(), torch.from_numpy(idx).cuda(), torch.from_numpy(offs).cuda())

    ref = {(k, r): call(k, r).cpu() for k in range(threads) for r in range(rounds)}
    got: dict = {}

    def client(k: int) -> None:
        kept = [call(k, r) for r in range(rounds)]  # (no read-back between queries)
        for r, out in enumerate(kept):
            got[k, r] = out.cpu()

    return ref, got, client


def test_copies_made_while_the_last_replay_still_runs_wait_for_its_mark(tmp_path):
    """A thread that does not read its outputs before its next query (each one kept on the GPU and
    read at the end), its model busy on the GPU ~1 ms a call: the next query's pageable copies come
    while the thread's last replay may still be queued, so their bytes go into the slots only once
    that replay's mark (:class:`ReadMark`: the count its graph copies to host memory after its input
    copies) shows them read; such waits are counted in ``mark_waits``. Every output equals eager's
    for its own query's arrays."""
    torch = pytest.importorskip("torch")
    threads, rounds = 2, 30
    ref, got, client = _slow_queries(torch, threads, rounds, seed=3, salt=25)
    st = _run_hooked(tmp_path, 1, threads, client)
    for key, want in ref.items():
        assert torch.allclose(got[key], want, atol=1e-5, rtol=1e-4), (key, (got[key] - want).abs().max())
    assert st["thread_graphs"] == threads and st["thread_replays"] >= threads * (rounds - 12), st
    assert st["mark_waits"] > 0, st


def test_autocast_calls_are_graphed_per_precision_without_the_autocast_cache(tmp_path):
    """A script scoring under ``torch.autocast("cuda", dtype=torch.bfloat16)`` that also calls
    the same model in float32 with inputs of the same shapes (``examples/heldout/amp_ranker_serve.py``):
    each call gets eager PyTorch's output in its own precision (a graph keyed by shapes alone
    replays the bf16 capture for the float32 call: off by ~1e-2). The first rounds run in one
    long autocast region, whose cache of cast weights PyTorch frees when it exits; NaN-filled
    tensors then take that memory, and later rounds (one region per call) must still be right:
    a graph captured with the cache on would read the freed casts. Inputs are pinned tensors
    copied with ``.to("cuda", non_blocking=True)`` (the thread graphs' path)."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8)).cuda().eval()
    threads, rounds = 4, 24
    g = torch.Generator().manual_seed(5)
    xs = {(k, r): torch.randn(32, 64, generator=g).pin_memory() for k in range(threads) for r in range(rounds)}

    def bf16(r: int) -> bool:
        return r % 3 != 2

    def call(x, r):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16(r)):
            return model(x.to("cuda", non_blocking=True)).float()

    with torch.no_grad():
        ref = {key: call(x, key[1]).cpu() for key, x in xs.items()}
    got: dict = {}
    weights = sum(p.numel() for p in model.parameters())

    def client(k: int) -> None:
        with torch.no_grad():
            with torch.autocast("cuda", dtype=torch.bfloat16):  # one region: the cache holds the casts
                for r in range(rounds // 2):
                    got[k, r] = call(xs[k, r], r).cpu()
            junk = [torch.full((weights,), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(4)]
            for r in range(rounds // 2, rounds):  # one region a call
                got[k, r] = call(xs[k, r], r).cpu()
            del junk

    st = _run_hooked(tmp_path, 2, threads, client)
    for key, want in ref.items():
        assert torch.allclose(got[key], want, atol=1e-5, rtol=1e-5), (key, (got[key] - want).abs().max())
    assert st["replays"] + st["thread_replays"] >= threads * rounds // 2, st


def test_workers_on_their_own_streams_share_the_groups_graphs_safely(tmp_path):
    """Each worker thread sets a stream of its own (``examples/heldout/pinned_stream_serve.py``):
    pinned buffers reused every query, ``.to("cuda", non_blocking=True)`` under that stream, the
    model, the scores copied back non-blocking into a pinned buffer, ``stream.synchronize()``.
    Two workers per group replay the group's graph (its static inputs and outputs shared) from
    two streams: every query's scores must equal eager's for that query's values. Unordered,
    one replay's inputs overwrote the other's while it ran (wrong checksums on the H100).
    The dense input is scaled on the GPU before the call, as scripts normalize: the call is
    then no thread's own graph of its copies (those are per thread, nothing shared)."""
    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    threads, rounds, rows = 4, 30, 64
    qs = {(k, r): host_query(rows, 1000) for k in range(threads) for r in range(rounds)}
    with torch.no_grad():
        ref = {key: model(q[0].cuda(), [t.cuda() for t in q[1]], q[2].cuda()).cpu() for key, q in qs.items()}
    torch.cuda.synchronize()
    got: dict = {}

    def client(k: int) -> None:
        s = torch.cuda.Stream()
        q0 = qs[k, 0]
        bufs = [q0[0].clone().pin_memory(), [t.clone().pin_memory() for t in q0[1]], q0[2].clone().pin_memory()]
        out = torch.empty(ref[k, 0].shape, pin_memory=True)
        with torch.no_grad():
            for r in range(rounds):
                dense, idx, offs = qs[k, r]
                bufs[0].copy_(dense)
                for b, t in zip(bufs[1], idx):
                    b.copy_(t)
                bufs[2].copy_(offs)
                with torch.cuda.stream(s):
                    # (the dense input scaled on the GPU: not a plain copy, so no thread graph of
                    # the copies; the calls take the group's graph, shared by the group's threads)
                    y = model(bufs[0].to("cuda", non_blocking=True) * 1.0,
                              [b.to("cuda", non_blocking=True) for b in bufs[1]], bufs[2].to("cuda", non_blocking=True))
                    out.copy_(y, non_blocking=True)
                s.synchronize()
                got[k, r] = out.clone()

    st = _run_hooked(tmp_path, 2, threads, client)
    bad = [key for key, want in ref.items() if not torch.allclose(got[key], want, atol=1e-6, rtol=1e-5)]
    assert not bad, f"{len(bad)} of {len(ref)} queries differ from eager, first {bad[:4]}"
    assert st["replays"] >= threads * (rounds - 10), st


def test_a_main_thread_loop_is_placed_at_its_first_call_and_graphed(tmp_path):
    """A script that serves from its main thread (a loop, or an asyncio server calling the model
    inline: ``examples/heldout/asyncio_inline_serve.py``) starts no thread for the hook to place:
    the thread is placed in a group of its own at its first model call, on its current stream,
    and its calls are graphed there: every output equals eager's, most calls replay. A graph the
    script then captures itself (warm-up on a side stream, ``torch.cuda.graph``) is left to it
    and replays right: the hook makes no call of its own inside the script's capture."""
    from recsys_doctor.applying.apply import write_plan
    from recsys_doctor.applying.script_hook import activate_in_process
    from recsys_doctor.planning.whatif import Candidate

    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    qs = []
    for _ in range(20):
        d, idx, offs = host_query(32, 1000)
        qs.append((d.cuda(), [t.cuda() for t in idx], offs.cuda()))
    with torch.no_grad():
        ref = [model(*q).cpu() for q in qs]
    undo = activate_in_process(write_plan(tmp_path / "plan.json", {}, Candidate(2, True, True, True)))
    hook = sys.modules["_recsys_doctor_autoapply"]
    try:
        with torch.no_grad():
            got = [model(*q).cpu() for q in qs]
            st = hook.stats()
            # then the script captures a graph of its own (as a hand-written graph server does):
            # warm-up on a side stream, capture, replay; the hook keeps out of the capture
            static = (qs[0][0].clone(), [t.clone() for t in qs[0][1]], qs[0][2].clone())
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(*static)
            torch.cuda.current_stream().wait_stream(side)
            own = torch.cuda.CUDAGraph()
            with torch.cuda.graph(own):
                own_out = model(*static)
            static[0].copy_(qs[5][0])
            for a, b in zip(static[1], qs[5][1]):
                a.copy_(b)
            static[2].copy_(qs[5][2])
            own.replay()
            own_got = own_out.cpu()
    finally:
        undo()
    for r, (a, b) in enumerate(zip(got, ref)):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), r
    assert st["late_threads"] == 1 and st["threads"] == 0, st
    assert st["captured"] == 1 and st["replays"] >= len(qs) - 3, st
    assert torch.allclose(own_got, ref[5], atol=1e-6, rtol=1e-5)


def test_threads_of_one_request_each_stop_learning_graphs_of_their_own(tmp_path):
    """A thread per request, at most two alive (a threading server's pattern: every thread makes
    the pinned copies and the model call once, then ends): every output equals eager's; thread
    graphs are captured only until enough threads have ended to judge their lives (each capture
    holds every other hooked thread off), none by a thread started after that; then one thread
    that lives long learns its graph once it has made enough calls, and replays it."""
    import threading

    from recsys_doctor.applying._autoapply.thread_graphs import LIVES_SEEN, MIN_THREAD_CALLS

    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    n_short, long_calls = 24, MIN_THREAD_CALLS + 8
    qs = []
    for r in range(n_short + 1):
        torch.manual_seed(300 + r)
        qs.append(host_query(32, 1000))

    def query(q):
        return pinned_query(model, q)

    ref = [query(q) for q in qs]
    got, learned = {}, {}

    def tls():  # the hooked thread's own state (the hook is loaded once _run_hooked starts it)
        return sys.modules["_recsys_doctor_autoapply._common"]._tls

    def one(r: int) -> None:
        got[r] = query(qs[r])
        learned[r] = tls().copies is not None and tls().copies.tg is not None

    def long_lived() -> None:
        got["long"] = [query(qs[-1]) for _ in range(long_calls)]
        learned["long"] = tls().copies.tg is not None

    def server(k: int) -> None:
        slots = threading.BoundedSemaphore(2)

        def run(r: int) -> None:
            try:
                one(r)
            finally:
                slots.release()

        threads = []
        for r in range(n_short):
            slots.acquire()
            threads.append(threading.Thread(target=run, args=(r,)))
            threads[-1].start()
        for t in threads:
            t.join()
        t = threading.Thread(target=long_lived)
        t.start()
        t.join()

    st = _run_hooked(tmp_path, 2, 1, server)
    for r in range(n_short):
        assert torch.allclose(got[r], ref[r], atol=1e-6, rtol=1e-5), r
    for out in got["long"]:
        assert torch.allclose(out, ref[-1], atol=1e-6, rtol=1e-5)
    assert st["ended_threads"] >= n_short + 1 and st["short_lived_threads"] >= n_short, st
    # the threads judged: every short thread alive while the LIVES_SEEN-th ended, at most
    assert sum(learned[r] for r in range(n_short)) <= LIVES_SEEN + 1, learned
    assert not any(learned[r] for r in range(LIVES_SEEN + 2, n_short)), learned
    assert learned["long"] and st["thread_graphs"] <= LIVES_SEEN + 2, st
    assert st["thread_replays"] >= long_calls - MIN_THREAD_CALLS - 1, st


def test_a_forward_drawing_host_random_numbers_runs_eagerly_and_stays_exact(tmp_path):
    """An epsilon-greedy ranker: ``forward`` draws from a ``random.Random`` the module keeps and
    reverses the ranking when the draw is under 0.3. A graph would replay the branch of its
    capture for every call; the hook runs the module eagerly instead (``runtime/_hostvalues.py``),
    so every output equals the unhooked run's with the same draws, both branches taken."""
    import random

    torch = pytest.importorskip("torch")

    class Explore(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 4)
            self.rng = random.Random(7)

        def forward(self, x):
            y = self.lin(x)
            if self.rng.random() < 0.3:
                y = y.flip(0)
            return y

    torch.manual_seed(0)
    model = Explore().cuda().eval()
    xs = [torch.randn(32, 16, device="cuda") for _ in range(40)]
    draws = random.Random(7)
    flips = sum(draws.random() < 0.3 for _ in xs)
    assert 0 < flips < len(xs)  # (both branches taken)
    with torch.no_grad():
        ref = [model(x).cpu() for x in xs]
    model.rng.seed(7)
    got = {}

    def client(k: int) -> None:
        with torch.no_grad():
            got["out"] = [model(x).cpu() for x in xs]

    st = _run_hooked(tmp_path, 1, 1, client)
    for r, (a, b) in enumerate(zip(got["out"], ref)):
        assert torch.equal(a, b), r
    assert st["captured"] == 0 and st["replays"] == 0, st
    sites = _model_sites(st)
    assert sum(s["fallback"] for s in sites) == len(xs), sites
    assert all("reads the host's clock or random numbers" in why for s in sites for why in s["reasons"]), sites



def test_forward_called_directly_and_a_model_that_is_no_module(tmp_path):
    """A script calling ``model.forward(...)`` itself: the model's own call never goes through
    ``nn.Module.__call__``, its submodules' calls do, and the hook takes those over one by one
    (their sites are the model's lines, not the script's); outputs equal eager's, and no note.
    A model that is a plain function of tensor operations (not an ``nn.Module``): the hook sees
    no model call, graphs nothing, its outputs are eager's, its copies are counted at their
    lines, and the note of ``profile --apply`` (``report.no_model_calls_note``) says so from
    those real stats."""
    from recsys_doctor.applying.report import no_model_calls_note

    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    qs = []
    for k in range(2):
        torch.manual_seed(500 + k)
        dense, idx, offs = host_query(32, 1000)  # (pageable copies of them: PyTorch's copies, counted)
        qs.append((dense.clone(), [t.clone() for t in idx], offs.clone()))

    def direct(q):
        dense, idx, offs = q
        with torch.no_grad():
            return model.forward(dense.cuda(), [t.cuda() for t in idx], offs.cuda()).cpu()

    w = torch.randn(qs[0][0].shape[1], 8, device="cuda")

    def plain(q):  # a "model" that is a function
        return torch.relu(q[0].cuda() @ w).sum(1).cpu()

    for fn in (direct, plain):
        ref = [fn(q) for q in qs]
        got = {}

        def client(k: int) -> None:
            got[k] = [fn(qs[k]) for _ in range(10)]

        st = _run_hooked(tmp_path, 2, 2, client)
        for k in range(2):
            for out in got[k]:
                assert torch.allclose(out, ref[k], atol=1e-6, rtol=1e-5), fn.__name__
        models = [s for s in st["sites"] if s["kind"] == "model"]
        if fn is direct:
            assert models and all("wdl_serving.py:" in s["site"] for s in models), models
            assert st["replays"] > 0 and no_model_calls_note(st) is None, st
            continue
        assert not models and st["captured"] == 0 and st["threads"] == 0, st
        copies = sum(s["taken_over"] + s["fallback"] for s in st["sites"])
        assert copies == 2 * 10, st["sites"]  # (one copy a query)
        note = no_model_calls_note(st)
        assert note is not None and "; 20 copies to the GPU were seen;" in note


def test_a_copy_into_the_scripts_own_gpu_buffer_is_counted_at_its_line(tmp_path):
    """The preallocated-input pattern: each client copies its numpy inputs into GPU buffers of
    its own with ``Tensor.copy_`` (pageable, and pinned non-blocking), then calls the model on
    them. The hook leaves those copies to PyTorch and counts them at their lines (the report
    lists every host-to-GPU copy); the model is graphed; every output equals eager's. The
    runtime's and the hook's own ``copy_`` calls are not counted as the script's."""
    import numpy as np

    from recsys_doctor.applying._autoapply.copyinto import COPY_INTO
    from recsys_doctor.applying._autoapply.unplaced import BEFORE_PLACED

    torch = pytest.importorskip("torch")
    PerRow, _ = _models(torch)
    torch.manual_seed(0)
    model = PerRow().cuda().eval()
    rng = np.random.default_rng(0)
    qs = [(rng.integers(0, 1000, (32, 4)), rng.random((32, 4), dtype=np.float32)) for _ in range(4)]
    with torch.no_grad():
        ref = [model(torch.from_numpy(i).cuda(), torch.from_numpy(w).cuda()) for i, w in qs]
    torch.cuda.synchronize()
    got: dict = {}
    rounds = 8

    def client(k: int) -> None:
        idx, w = torch.empty(32, 4, dtype=torch.long, device="cuda"), torch.empty(32, 4, device="cuda")
        pinned = torch.empty(32, 4).pin_memory()
        with torch.no_grad():
            for r in range(rounds):
                i_np, w_np = qs[(k + r) % 4]
                idx.copy_(torch.from_numpy(i_np))  # COPY_IDX
                pinned.copy_(torch.from_numpy(w_np))  # (host to host: not counted)
                w.copy_(pinned, non_blocking=True)  # COPY_W
                got[k, r] = model(idx, w)
        torch.cuda.current_stream().synchronize()

    st = _run_hooked(tmp_path, 2, 4, client)
    for (k, r), out in got.items():
        want = ref[(k + r) % 4]
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1]), (k, r)
    src = open(__file__).read().splitlines()
    lines = {tag: next(n for n, ln in enumerate(src, 1) if ln.rstrip().endswith(f"# {tag}")) for tag in ("COPY_IDX", "COPY_W")}
    h2d = {s["site"].rsplit(":", 1)[-1]: s for s in st["sites"] if s["kind"] == "h2d"}
    assert set(h2d) == {str(n) for n in lines.values()}, h2d
    for s in h2d.values():  # (a thread's first query's, before its first model call places it: so counted)
        assert s["site"].startswith("tests/test_autoapply_gpu.py:") and s["taken_over"] == 0
        assert s["fallback"] == 4 * rounds and s["reasons"] == {COPY_INTO: 4 * (rounds - 1), BEFORE_PLACED: 4}, s
    assert sum(s["taken_over"] for s in _model_sites(st)) > 0


@pytest.mark.parametrize("window", [None, "0"])
def test_a_thread_graph_serving_few_of_its_calls_is_dropped_and_outputs_stay_exact(tmp_path, monkeypatch, window):
    """Each thread cycles through 5 models (weights scaled apart, so a replay of the wrong one
    shows) with its pinned inputs copied non-blocking: its own graph, of one of them, serves
    at most 1 call in 5. 64 calls after its capture it is dropped, once a thread, with the reason
    (``thread_graphs.RARELY_REPLAYED``), and the thread's later calls take the groups' graphs
    with PyTorch's copies; ``RECSYS_DOCTOR_REPLAY_WINDOW=0`` keeps every thread graph (none
    dropped, as before). Every output equals eager's for its model and query either way."""
    import copy

    from recsys_doctor.applying._autoapply import thread_graphs

    torch = pytest.importorskip("torch")
    if window is None:
        monkeypatch.delenv("RECSYS_DOCTOR_REPLAY_WINDOW", raising=False)
    else:
        monkeypatch.setenv("RECSYS_DOCTOR_REPLAY_WINDOW", window)
    base, host_query = _wdl()
    models = [base] + [copy.deepcopy(base) for _ in range(4)]
    with torch.no_grad():
        for i, m in enumerate(models):
            for p in m.parameters():
                p.mul_(1 + 0.1 * i)
    threads, rounds = 4, 130
    qs = []
    for k in range(threads):
        torch.manual_seed(300 + k)
        qs.append(host_query(32, 1000))
    ref = {(k, i): pinned_query(m, qs[k]) for k in range(threads) for i, m in enumerate(models)}
    assert all(not torch.allclose(ref[0, 0], ref[0, i]) for i in range(1, 5))
    got: dict = {}

    def client(k: int) -> None:
        for r in range(rounds):
            got[k, r] = pinned_query(models[r % 5], qs[k])

    st = _run_hooked(tmp_path, 2, threads, client)
    for (k, r), out in got.items():
        want = ref[k, r % 5]
        assert torch.allclose(out, want, atol=1e-6, rtol=1e-5), (k, r, (out - want).abs().max())
    dropped = st["fallbacks"].count(thread_graphs.RARELY_REPLAYED)
    assert st["thread_graphs"] == threads, st
    if window is None:
        # each thread's graph served at most 1 in 5 of its calls: dropped within 64 calls of its
        # capture, so it replayed at most 64 / 4 = 16 times a thread
        assert dropped == threads and st["thread_replays"] <= threads * 16, st
    else:
        assert dropped == 0 and st["thread_replays"] >= threads * (rounds // 5 - 6), st
