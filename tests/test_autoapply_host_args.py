"""The script hook taking over a model that copies its host arguments inside ``forward`` (the
candidates ranker's ``user.to(self.device)``), the parts that run without a GPU: which arguments
go through the thread's slots, the slots themselves (one pinned buffer a position, one view a
shape, reused), the host proxies ``forward`` gets (their one copy to the device is the hook's
copy; any other use runs on the host data and leaves the model its host arguments from then on,
said with the line of ``forward``) and the result (never a proxy, never a slot).

CPU tensors stand in for the device copies and for the pinned slots, and ``cuda:3`` is only a
name (``FAKE`` parses it): the bookkeeping is the same. The GPU side (copies and model in the
thread's graph, row buckets, outputs equal to the unhooked run) is in
``tests/test_autoapply_gpu.py``."""

from __future__ import annotations

import inspect
from collections import namedtuple

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from recsys_doctor.applying._autoapply import accounting, host_args, pageable, staging
from recsys_doctor.applying._autoapply.pageable import Move

torch = pytest.importorskip("torch")
nn = torch.nn

FAKE = SimpleNamespace(device=torch.device, Tensor=torch.Tensor, dtype=torch.dtype,
                       preserve_format=torch.preserve_format, contiguous_format=torch.contiguous_format,
                       cuda=SimpleNamespace(current_device=lambda: 3))
C3, CPU = torch.device("cuda", 3), torch.device("cpu")


def _host_type(parse_to, parse_cuda=lambda a, k: None):
    return host_args.make_host_type(torch, parse_to, parse_cuda, torch.Tensor.to, torch.Tensor.cuda)


def _cuda_type():
    """Proxies parsing ``.to`` / ``.cuda`` as the hook does (``cuda`` is ``cuda:3`` here)."""
    return _host_type(lambda a, k: pageable.to_args(FAKE, a, k), lambda a, k: pageable.cuda_args(FAKE, a, k))


def _cpu_to(a, k):
    """``Tensor.to("cpu"[, dtype])`` / ``to(device="cpu", ...)`` parsed as :func:`.pageable.to_args`
    parses a copy to the GPU: the CPU plays the group's device in the tests that run a model."""
    dev = a[0] if a and isinstance(a[0], str) else k.get("device")
    dtype = a[1] if len(a) > 1 and isinstance(a[1], torch.dtype) else k.get("dtype")
    return Move(CPU, dtype, bool(k.get("non_blocking")), bool(k.get("copy")), None) if dev == "cpu" else None


class Ranker(nn.Module):
    """The candidates ranker's shape: host tensors in, moved inside forward ("cpu" standing in
    for the GPU, so that the same model run unhooked is the reference)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.user, self.item = nn.Embedding(50, 4), nn.Embedding(100, 4)

    def forward(self, user, items, dense):
        user, items = user.to("cpu"), items.long().to("cpu")
        dense = dense.to(device="cpu", non_blocking=True)
        u = self.user(user).expand(items.shape[0], -1)
        return torch.sigmoid(u * self.item(items) + dense)


class UsesOnHost(Ranker):
    def forward(self, user, items, dense):
        top = int(items.numpy().max())  # a use of a host argument on the host
        return super().forward(user, items % (top + 1), dense)


class PassesThrough(Ranker):
    def forward(self, user, items, dense):
        return super().forward(user, items, dense), items


@pytest.fixture
def hooked(monkeypatch):
    """A hooked thread's state with its slots on CPU memory and a device copy that is a clone
    (recorded); the group's device is the CPU."""
    copied = []

    def fake_to(t, *a, **k):
        copied.append(t)
        return t.clone()

    accounting.reset()
    monkeypatch.setattr(pageable, "_pinned", lambda torch_, n: torch.zeros(n, dtype=torch.uint8))
    monkeypatch.setattr(host_args, "copy_hazard", lambda torch_, dev: None)
    monkeypatch.setattr(host_args, "_capturing", lambda torch_: False)
    for key, value in {"orig_tensor_methods": {"to": fake_to}, "host_type": _host_type(_cpu_to), "host_use": {},
                       "fallbacks": []}.items():
        monkeypatch.setitem(staging._state, key, value)
    monkeypatch.setattr(staging._tls, "group", SimpleNamespace(stream=SimpleNamespace(device=CPU), late=None), raising=False)
    st = staging._ThreadCopies(stream=None)
    return SimpleNamespace(st=st, copied=copied)


def _request(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.tensor([7]), torch.randint(0, 100, (n,), generator=g), torch.rand(n, 4, generator=g))


def _take(h, model, args, site="s.py:1"):
    with torch.no_grad():
        return host_args.take(torch, h.st, nn.Module.__call__, model, args, {}, site)


def _unhooked(model, args):
    with torch.no_grad():
        return model(*args)


def test_which_host_arguments_go_through_the_slots():
    ok = [torch.arange(5), torch.rand(3, 2), torch.tensor(1.5), torch.zeros(0, 4)]
    arrays = host_args.host_arrays(torch, ok)
    assert arrays is not None and [a.shape for a in arrays] == [(5,), (3, 2), (), (0, 4)]
    assert all(np.array_equal(a, t.numpy()) for a, t in zip(arrays, ok))
    # any one that cannot go: none goes (the call stays the script's)
    for bad in (torch.rand(4, 3).t(),  # not contiguous: its device copy would keep other strides
                torch.rand(3, requires_grad=True), torch.zeros(3, dtype=torch.bfloat16), torch.eye(3).to_sparse(),
                nn.Parameter(torch.zeros(2), requires_grad=False),  # a subclass
                torch.zeros(pageable.MAX_COPY // 8 + 1, dtype=torch.int64)):
        assert host_args.host_arrays(torch, [torch.arange(3), bad]) is None, bad


def test_a_slot_keeps_one_buffer_and_one_view_a_shape(hooked):
    st = hooked.st
    full, part = np.arange(128, dtype=np.int64), np.arange(44, dtype=np.int64) + 1000
    v128 = staging.slot_fill(torch, st, full)
    st.slot_n = 0
    v44 = staging.slot_fill(torch, st, part)
    st.slot_n = 0
    again = staging.slot_fill(torch, st, full + 1)
    # the same pinned memory for both row counts, the same view object for the same shape
    assert again is v128 and v44 is not v128 and v44.data_ptr() == v128.data_ptr()
    assert again.tolist() == (full + 1).tolist() and st.slot_churn == 0
    # room for twice the first copy: a copy larger than that gets new memory (churn counted)
    st.slot_n = 0
    big = staging.slot_fill(torch, st, np.arange(300, dtype=np.int64))
    assert big.data_ptr() != v128.data_ptr() and st.slot_churn == 1 and big.tolist() == list(range(300))


def test_slots_are_written_again_only_after_the_last_call_read_them(hooked):
    waits = []
    hooked.st.slot_event = SimpleNamespace(query=lambda: False, synchronize=lambda: waits.append(1))
    staging.slot_fill(torch, hooked.st, np.arange(3))
    staging.slot_fill(torch, hooked.st, np.arange(4))
    assert waits == [1]  # once a query, before its first slot


def test_host_arguments_are_copied_through_the_slots_and_forward_gets_those_copies(hooked):
    model = Ranker().eval()
    user, items, dense = _request(300)
    batch = (user, items[128:256], dense[128:256])
    call, args, kwargs = _take(hooked, model, batch)
    # the device copies (clones here) are of the slots, which hold the host arguments' bytes
    slots = [s.views[(tuple(t.shape), t.numpy().dtype)][0] for s, t in zip(hooked.st.slots, batch)]
    assert len(hooked.copied) == 3 and all(a is b for a, b in zip(hooked.copied, slots)) and kwargs == {}
    assert all(torch.equal(d, t) and d is not t and d.data_ptr() != s.data_ptr()
               for d, t, s in zip(args, batch, slots))
    n = len(hooked.copied)
    with torch.no_grad():
        out = call(model, *args)
    assert len(hooked.copied) == n  # forward's own copies were the hook's: none made again
    assert type(out) is torch.Tensor and torch.equal(out, _unhooked(model, batch))
    assert not staging._state["host_use"] and not staging._state["fallbacks"]
    rows = accounting.sites()
    assert [(r["kind"], r["site"], r["taken_over"], r["fallback"]) for r in rows] == [("h2d", "s.py:1", 3, 0)]
    # the next query (the same shapes): the same slots, the same views (a thread graph knows
    # its sources by identity)
    hooked.st.slot_n = 0
    _take(hooked, model, (user, items[:128], dense[:128]))
    assert len(hooked.copied) == n + 3 and all(a is b for a, b in zip(hooked.copied[n:], slots))


def test_forward_on_the_hooks_own_tensors_reads_their_values(hooked):
    """What a capture, a warm-up or a padded verification passes (static inputs, rows padded to
    a bucket): forward runs on those, its copies to the device being those tensors."""
    model = Ranker().eval()
    user, items, dense = _request(3)
    call, args, _ = _take(hooked, model, (user, items, dense))
    padded = [args[0], torch.cat([args[1], args[1][-1:]]), torch.cat([args[2], args[2][-1:]])]
    with torch.no_grad():
        out = call(model, *padded)
    assert out.shape == (4, 4) and torch.equal(out[:3], _unhooked(model, (user, items, dense)))
    assert torch.equal(out[3], out[2]) and not staging._state["host_use"]


def test_a_model_that_uses_a_host_argument_on_the_host_is_left_its_arguments(hooked):
    model = UsesOnHost().eval()
    batch = _request(40, seed=1)
    call, args, _ = _take(hooked, model, batch)
    with torch.no_grad():
        out = call(model, *args)
    assert torch.equal(out, _unhooked(model, batch))  # the host data, as unhooked
    line = UsesOnHost.forward.__code__.co_firstlineno + 1
    (reason,) = staging._state["host_use"].values()
    assert reason == f"the model uses a host argument on the host (numpy, tests/test_autoapply_host_args.py:{line})"
    assert staging._state["fallbacks"] == [reason]
    hooked.st.slot_n = 0
    assert _take(hooked, model, batch) is None  # from its next call on: the script's arguments


class PackedGRU(nn.Module):
    """A session model: padded clicks moved inside forward, the lengths kept on the host for
    pack_padded_sequence (as PyTorch requires), the GRU's last state scored."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.item, self.gru = nn.Embedding(30, 4), nn.GRU(4, 6, batch_first=True)

    def forward(self, clicks, lengths):
        emb = self.item(clicks.to("cpu"))
        packed = nn.utils.rnn.pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
        return self.gru(packed)[1][-1]


def test_a_host_argument_used_inside_pytorchs_pack_padded_sequence_is_named_with_the_way_out(hooked):
    """The lengths are read on the host inside PyTorch's pack_padded_sequence: the reason names that
    function and its line under forward's, and what keeps such a model capturable."""
    model = PackedGRU().eval()
    clicks = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0], [8, 9, 10, 11]])
    lengths = torch.tensor([3, 2, 4])
    call, args, _ = _take(hooked, model, (clicks, lengths))
    with torch.no_grad():
        out = call(model, *args)
    assert torch.equal(out, _unhooked(model, (clicks, lengths)))
    (reason,) = staging._state["host_use"].values()
    src = inspect.getsource(nn.utils.rnn.pack_padded_sequence).splitlines()
    first = nn.utils.rnn.pack_padded_sequence.__code__.co_firstlineno
    used = first + next(k for k, ln in enumerate(src) if "lengths = lengths.to(" in ln)
    line = PackedGRU.forward.__code__.co_firstlineno + 2
    assert reason.startswith(f"the model uses a host argument on the host (to in PyTorch's pack_padded_sequence "
                             f"(torch/nn/utils/rnn.py:{used}), tests/test_autoapply_host_args.py:{line}; ")
    assert "out[torch.arange(n), lengths - 1]" in reason and reason.endswith("are capturable)")
    # that way out gives the packed GRU's last states
    with torch.no_grad():
        full = model.gru(model.item(clicks))[0]
        assert torch.allclose(full[torch.arange(3), lengths - 1], out, atol=1e-6)


def test_on_the_hooks_own_tensors_a_use_on_the_host_reads_their_values(hooked):
    model = UsesOnHost().eval()
    call, args, _ = _take(hooked, model, _request(8))
    static = [a + 0 for a in args]  # not the call's own copies: no host tensor behind them
    static[1][:] = torch.arange(30, 38)
    with torch.no_grad():
        out = call(model, *static)
    assert torch.equal(out, _unhooked(model, static))


def test_in_a_capture_a_use_on_the_host_fails_the_capture(hooked, monkeypatch):
    model = UsesOnHost().eval()
    call, args, _ = _take(hooked, model, _request(8))
    monkeypatch.setattr(host_args, "_capturing", lambda torch_: True)
    static = [a.clone() for a in args]  # not the call's own copies: no host tensor behind them
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"host argument used on the host during a capture \(numpy\)"):
        call(model, *static)


def test_a_returned_host_argument_is_the_scripts_own_tensor(hooked):
    model = PassesThrough().eval()
    batch = _request(5)
    call, args, _ = _take(hooked, model, batch)
    with torch.no_grad():
        out, items = call(model, *args)
    assert items is batch[1] and type(items) is torch.Tensor  # not a proxy, not a slot
    assert "returned by forward" in next(iter(staging._state["host_use"].values()))


class PassesThroughNamed(Ranker):
    def forward(self, user, items, dense):
        return Scored(super().forward(user, items, dense), [items])


Scored = namedtuple("Scored", "score extra")


def test_a_host_argument_returned_in_a_named_tuple_is_the_scripts_own_tensor(hooked):
    # (a named tuple holding a proxy was made again from one generator: a TypeError in the
    # script's call; a proxy nested deeper than one container was handed back as a proxy)
    model = PassesThroughNamed().eval()
    batch = _request(5)
    call, args, _ = _take(hooked, model, batch)
    with torch.no_grad():
        out = call(model, *args)
    assert type(out) is Scored and type(out.extra) is list
    assert out.extra[0] is batch[1] and type(out.extra[0]) is torch.Tensor
    assert torch.equal(out.score, _unhooked(model, batch).score)


def test_a_host_proxy_copies_once_and_is_its_host_tensor_otherwise():
    """Metadata and casts that give the tensor itself need nothing; the one copy to the group's
    device is the hook's copy; a second copy, or any other use, is the host tensor's own, and an
    in-place change reaches the script's tensor."""
    cls = _host_type(_cpu_to)
    host = torch.arange(6)
    d = host.clone()

    def proxy():
        return host_args._proxy(torch, cls, host, d, CPU, None)

    p = proxy()
    assert (p.shape, p.dtype, p.device.type, len(p), p.dim(), p.is_contiguous()) == ((6,), torch.int64, "cpu", 6, 1, True)
    assert p.long() is p and p.contiguous() is p and p.detach() is p
    assert p.to("cpu", non_blocking=True) is d
    accounting.reset()
    line = sys._getframe().f_lineno + 1
    assert p.to("cpu") is not d  # a second copy: PyTorch's (here the tensor itself), counted at its line
    assert [(r["site"], r["fallback"], list(r["reasons"])) for r in accounting.sites()] == [
        (f"tests/test_autoapply_host_args.py:{line}", 1, [host_args.LEFT_TO_PYTORCH])]
    for ask in (lambda q: q.to("cpu", copy=True), lambda q: q.to("cpu", torch.float64), lambda q: q.float()):
        q = proxy()
        out = ask(q)
        assert out is not d and torch.equal(out, host.to(out.dtype))
    q = proxy()
    q.add_(1)
    assert host.tolist() == [1, 2, 3, 4, 5, 6]  # the script's tensor, changed in place as unhooked
    assert q.to("cpu") is not d  # used: its copy is its own from now on


def test_the_copies_forward_asks_for_as_the_hook_parses_them():
    cls = _cuda_type()
    host = torch.arange(3)
    d = host.clone()
    for ask in (lambda q: q.cuda(), lambda q: q.cuda(non_blocking=True), lambda q: q.to("cuda"),
                lambda q: q.to(device="cuda:3", non_blocking=True), lambda q: q.to(C3, torch.int64),
                lambda q: q.to(3), lambda q: q.cuda(3), lambda q: q.to("cuda", memory_format=torch.contiguous_format)):
        assert ask(host_args._proxy(torch, cls, host, d, C3, None)) is d
    # another device, another dtype, a new tensor asked for: PyTorch's copy (which a CPU-only
    # build cannot make: it says so)
    for ask in (lambda q: q.to("cuda:1"), lambda q: q.to("cuda", torch.float32), lambda q: q.to("cuda", copy=True),
                lambda q: q.cuda(1), lambda q: q.to("cuda", memory_format=torch.channels_last)):
        with pytest.raises((AssertionError, RuntimeError)):
            ask(host_args._proxy(torch, cls, host, d, C3, None))


def test_torch_as_tensor_of_a_host_argument_in_forward(hooked, monkeypatch):
    monkeypatch.setattr(staging._tls, "copies", hooked.st, raising=False)
    cls = _cuda_type()
    as_tensor = staging._factory(torch, torch.as_tensor, lambda t, a, k: pageable.as_tensor_args(FAKE, a, k),
                                 "as_tensor")
    host = torch.arange(4)
    d = host.clone()
    p = host_args._proxy(torch, cls, host, d, C3, None)
    assert as_tensor(p) is p  # no copy asked for: the tensor itself
    assert as_tensor(p, device="cuda") is d
    q = host_args._proxy(torch, cls, host, d, C3, None)
    out = as_tensor(q, dtype=torch.float64)  # a conversion on the host: the host tensor's
    assert out.dtype == torch.float64 and out.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("why", ["training", "grad", "pending", "not contiguous", "on a stream of its own"])
def test_calls_left_as_the_script_made_them(hooked, monkeypatch, why):
    model = Ranker()
    if why != "training":
        model.eval()
    user, items, dense = _request(10)
    args = (user, items, dense)
    if why == "pending":
        hooked.st.pending = True  # this query's own copies wait for the thread graph
    if why == "not contiguous":
        args = (user, items, torch.rand(4, 10).t())
    if why == "on a stream of its own":
        monkeypatch.setattr(host_args, "copy_hazard", lambda torch_, dev: "a copy on a stream the script set")
    if why == "grad":
        assert host_args.take(torch, hooked.st, nn.Module.__call__, model, args, {}, "s.py:1") is None
    else:
        assert _take(hooked, model, args) is None
    assert hooked.st.slot_n == 0 and not hooked.copied and not accounting.sites()


def test_numpy_arguments_are_not_taken(hooked):
    assert _take(hooked, Ranker().eval(), (np.arange(3), np.zeros((3, 4), np.float32))) is None


class TakesABatch(Ranker):
    def forward(self, batch):
        b = SimpleNamespace(**batch) if isinstance(batch, dict) else batch
        return super().forward(b.user, b.items, b.dense)


def test_arguments_in_a_named_tuple_are_taken_and_forward_gets_the_same_named_tuple(hooked):
    # (the arguments were once made again as a plain tuple, which failed: such calls were left to PyTorch)
    from collections import namedtuple

    Batch = namedtuple("Batch", "user items dense")
    model = TakesABatch().eval()
    batch = Batch(*_request(4))
    call, args, kwargs = _take(hooked, model, (batch,))
    assert len(hooked.copied) == 3 and kwargs == {} and len(args) == 1 and type(args[0]) is Batch
    assert all(torch.equal(d, t) and d is not t for d, t in zip(args[0], batch))
    with torch.no_grad():
        out = call(model, *args)
    assert len(hooked.copied) == 3 and torch.equal(out, _unhooked(model, (batch,)))


def test_host_arguments_in_a_frozen_dataclass_are_taken_and_forward_gets_that_dataclass(hooked):
    """A request dataclass of host tensors (the hook walks dataclasses): its tensors go through the
    slots, forward gets an instance of the same class whose fields are the device copies (the
    script's own instance untouched), and the output is the unhooked one."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Request:
        user: torch.Tensor
        items: torch.Tensor
        dense: torch.Tensor
        tag: str = "r"

    model = TakesABatch().eval()
    batch = Request(*_request(5))
    call, args, kwargs = _take(hooked, model, (batch,))
    assert len(hooked.copied) == 3 and kwargs == {} and len(args) == 1 and type(args[0]) is Request
    got = [getattr(args[0], f) for f in ("user", "items", "dense")]
    want = [batch.user, batch.items, batch.dense]
    assert all(torch.equal(d, t) and d is not t for d, t in zip(got, want)) and args[0].tag == "r"
    assert batch.user is want[0] and type(batch.items) is torch.Tensor  # the script's own instance as it was
    with torch.no_grad():
        out = call(model, *args)
    assert len(hooked.copied) == 3 and torch.equal(out, _unhooked(model, (batch,)))


def test_arguments_in_a_dict_subclass_are_not_taken(hooked):
    # (the hook would hand forward a plain dict in its place)
    from collections import OrderedDict

    user, items, dense = _request(4)
    assert _take(hooked, TakesABatch().eval(), (OrderedDict(user=user, items=items, dense=dense),)) is None
    assert hooked.st.slot_n == 0 and not hooked.copied


def test_keys_of_taken_calls_are_not_those_of_device_calls():
    from recsys_doctor.applying._autoapply import graphs

    m = object()
    plain = graphs._key(torch, m, (), {})
    tagged = graphs._key(torch, m, (), {}, host_args.KEY_TAG)
    assert plain[0] != tagged[0] and tagged[0][0] == (id(m), host_args.KEY_TAG)


def test_refcounts_unchanged_by_a_taken_call(hooked):
    # the call's closure holds the script's tensors only while the call is made
    model = Ranker().eval()
    batch = _request(6)
    before = [sys.getrefcount(t) for t in batch]
    call, args, _ = _take(hooked, model, batch)
    with torch.no_grad():
        call(model, *args)
    del call, args
    assert [sys.getrefcount(t) for t in batch] == before


def test_the_hooks_model_call_hands_forward_the_copies(hooked, monkeypatch):
    """Through the patched ``nn.Module.__call__`` of a hooked thread: the host arguments go
    through the slots, the call goes on with the copies (here eagerly: CPU copies have no graph)
    and forward's own copies are not made again nor counted; the result equals the unhooked one."""
    from recsys_doctor.applying._autoapply import groups, interception

    T = torch.Tensor
    saved = (nn.Module.__call__, T.to, T.cuda, torch.as_tensor, torch.tensor)
    for key, value in {"graphs": True, "gate": groups._Gate(), "patched_module": False}.items():
        monkeypatch.setitem(staging._state, key, value)
    monkeypatch.setattr(interception, "slots_read", lambda torch_, st: setattr(st, "slot_n", 0))
    model = Ranker().eval()
    batch = _request(20, seed=3)
    want = _unhooked(model, batch)
    interception._patch_module(torch)
    interception._patch_thread_copies(torch)  # (as the first thread placed at its start does)
    try:
        staging._state["host_type"] = _host_type(_cpu_to)  # (the CPU plays the group's device)
        monkeypatch.setitem(staging._state["orig_tensor_methods"], "to", lambda t, *a, **k: t.clone())
        monkeypatch.setattr(staging._tls, "copies", hooked.st, raising=False)
        monkeypatch.setattr(staging._tls, "depth", 0, raising=False)
        line = sys._getframe().f_lineno + 2
        with torch.no_grad():
            out = model(*batch)
    finally:
        nn.Module.__call__, T.to, T.cuda, torch.as_tensor, torch.tensor = saved
    assert torch.equal(out, want) and not staging._state["host_use"]
    rows = {(r["kind"], r["site"]): r for r in accounting.sites()}
    here = f"tests/test_autoapply_host_args.py:{line}"
    assert set(rows) == {("h2d", here), ("model", here)}  # nothing counted at forward's lines
    assert (rows["h2d", here]["taken_over"], rows["h2d", here]["fallback"]) == (3, 0)
    assert rows["model", here]["reasons"] == {"not graphed: a CPU tensor argument": 1}
