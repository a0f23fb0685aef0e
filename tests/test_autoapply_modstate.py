"""Models that change while they serve (``recsys_doctor/applying/_autoapply/modstate.py``), on
the CPU: what a module's signature follows, which ``nn.Module`` operations bump the revision,
and what :func:`check` retires when a module changed. The GPU test that a script refreshing its
model four ways keeps the unhooked run's outputs under the hook: tests/test_autoapply_refresh_gpu.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import modstate  # noqa: E402
from recsys_doctor.applying._autoapply._common import _state, _tls  # noqa: E402
from recsys_doctor.applying._autoapply.groups import _Group  # noqa: E402
from recsys_doctor.applying._autoapply.staging import _ThreadGraph  # noqa: E402


class Scorer(torch.nn.Module):
    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(50, 4, mode="sum")
        self.head = torch.nn.Linear(4, 1)
        self.temperature = temperature

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.head(self.emb(ids)) / self.temperature)


@pytest.fixture
def hooked(monkeypatch):
    """modstate patched into nn.Module over a fresh hook state with one group (no stream)."""
    g = _Group(0, None)
    saved = dict(_state)
    modstate.unpatch(torch)  # (patched afresh, whatever an earlier test's activation left)
    depth = getattr(_tls, "depth", 0)
    _tls.depth = 0  # (outside any hooked call, whatever an earlier test left)
    _state.update(groups={0: g}, late_groups=[], graph_bytes=0, batch_specs={}, routes={}, host_use={},
                  module_changes=0, fallbacks=[])
    modstate.reset()
    modstate.patch(torch)
    try:
        yield g
    finally:
        modstate.unpatch(torch)
        modstate.reset()
        _state.clear()
        _state.update(saved)
        _tls.depth = depth


# ------------------------------------------------------------------------------ the signature

def test_the_signature_follows_what_a_graph_reads_and_nothing_else():
    m = Scorer()
    sig = modstate.signature(torch, m)
    assert modstate.signature(torch, m) == sig
    m.load_state_dict(Scorer().state_dict())  # in place: the same parameters, new values
    assert modstate.signature(torch, m) == sig
    m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()}, assign=True)  # new tensors
    sig2 = modstate.signature(torch, m)
    assert sig2 != sig
    assert modstate._changed(sig, sig2) == "weight changed"
    m.temperature = 0.5
    sig3 = modstate.signature(torch, m)
    assert sig3 != sig2 and modstate._changed(sig2, sig3) == "temperature changed"
    m.double()
    assert modstate.signature(torch, m) != sig3


def test_a_nan_attribute_equals_itself_and_numbers_of_other_types_differ():
    m = Scorer(temperature=math.nan)
    assert modstate.signature(torch, m) == modstate.signature(torch, m)
    a, b = Scorer(temperature=1), Scorer(temperature=1.0)
    b.load_state_dict(a.state_dict(), assign=True)  # (the same tensors: only the attribute's type differs)
    b.emb, b.head = a.emb, a.head
    assert modstate.signature(torch, a) != modstate.signature(torch, b)


def test_a_forward_hook_added_later_changes_the_signature():
    m = Scorer()
    sig = modstate.signature(torch, m)
    h = m.head.register_forward_hook(lambda mod, inp, out: out * 2)
    assert modstate.signature(torch, m) != sig
    h.remove()
    assert modstate.signature(torch, m) == sig


# ------------------------------------------------------------------------------ the revision

def test_module_changes_bump_the_revision_but_not_inside_a_hooked_call(hooked):
    m = Scorer()
    r0 = modstate._rev[0]
    m.temperature = 2.0
    assert modstate._rev[0] > r0
    for change in (lambda: m.to(torch.float64), lambda: m.register_buffer("b", torch.zeros(1)),
                   lambda: m.head.register_forward_pre_hook(lambda mod, inp: None)):
        r = modstate._rev[0]
        change()
        assert modstate._rev[0] > r
    r = modstate._rev[0]
    m.load_state_dict(m.state_dict())  # (in place: setattr is not called)
    assert modstate._rev[0] == r
    _tls.depth = 1  # a forward writing its own attributes
    try:
        m.last = 3
        assert modstate._rev[0] == r
    finally:
        _tls.depth = 0
    modstate.unpatch(torch)
    assert not hasattr(torch.nn.Module.__setattr__, "__wrapped__")
    m.temperature = 3.0
    assert modstate._rev[0] == r


# ------------------------------------------------------------------------------ retiring

class _FakeGraph:
    def __init__(self, nbytes: int) -> None:
        self.rd_bytes = nbytes


def _entry(nbytes: int) -> SimpleNamespace:
    return SimpleNamespace(graph=_FakeGraph(nbytes))


def test_a_changed_module_has_its_graphs_retired_and_no_other(hooked):
    g = hooked
    m, other = Scorer(), Scorer()
    key = (id(m), ("parts",))
    tagged = ((id(m), ("autocast", "torch.bfloat16", None)), ("parts",))
    okey = (id(other), ("parts",))
    g.entries.update({key: _entry(100), tagged: _entry(50), okey: _entry(7)})
    g.sites.update({id(m): "site", id(other): "osite"})
    _state["graph_bytes"] = 157
    _state["batch_specs"].update({key: "spec", okey: "ospec"})
    _state["routes"][id(m)] = ("route",)
    rec = modstate.check(torch, m)
    assert rec.version == 0 and modstate.check(torch, other).version == 0
    assert modstate.check(torch, m) is rec and len(g.entries) == 3  # unchanged: nothing retired
    m.temperature = 0.25
    rec = modstate.check(torch, m)
    assert rec.version == 1 and rec.eager is None
    assert list(g.entries) == [okey] and list(g.sites) == [id(other)]
    assert _state["graph_bytes"] == 7 and list(_state["batch_specs"]) == [okey] and not _state["routes"]
    assert _state["module_changes"] == 1
    assert modstate.check(torch, other).version == 0  # the other's revision moved, its signature did not


def test_a_new_object_at_a_collected_ones_address_gets_none_of_its_graphs(hooked):
    g = hooked
    m = Scorer()
    old = Scorer()
    modstate.check(torch, old)
    # stand the new object in for one that got the collected model's id: the record names another object
    modstate._recs[id(m)] = modstate._recs.pop(id(old))
    g.entries[(id(m), ("parts",))] = _entry(10)
    rec = modstate.check(torch, m)
    assert rec.ref() is m and rec.version == 0 and not g.entries


def test_a_collected_module_is_retired_at_the_next_look(hooked):
    g = hooked
    m = Scorer()
    modstate.check(torch, m)
    mid = id(m)
    g.entries[(mid, ("parts",))] = _entry(10)
    del m
    import gc

    gc.collect()
    assert mid in modstate._dead
    modstate.check(torch, Scorer())  # (any slow look-up)
    assert not g.entries and mid not in modstate._recs


def test_a_module_changing_every_few_calls_goes_eager_with_the_reason(hooked):
    m = Scorer().eval()
    modstate.check(torch, m)
    for i in range(modstate.THRASH):
        m.temperature = 2.0 + i  # (each a new value: the first is not the initial 1.0)
        rec = modstate.check(torch, m)
    assert rec.eager is not None and rec.eager.startswith(modstate.CHANGES_OFTEN)
    assert "temperature changed" in rec.eager
    assert _state["fallbacks"] == [modstate.CHANGES_OFTEN]


def test_changes_made_while_it_trains_do_not_make_it_eager_for_its_evaluation(hooked):
    """DistributedDataParallel's no_sync() sets an attribute around every accumulating call: a
    training module's calls are eager anyway (gradients on), and its evaluation calls later, in
    eval mode, are graphed as any; its graphs are still retired at each change."""
    m = Scorer().train()
    modstate.check(torch, m)
    for i in range(4 * modstate.THRASH):
        m.temperature = 2.0 + i
        assert modstate.check(torch, m).eager is None
    m.eval()
    assert modstate.check(torch, m).eager is None and not _state["fallbacks"]
    assert modstate.check(torch, m).version == 4 * modstate.THRASH  # (each change seen, its graphs retired)


def test_a_change_after_its_graphs_paid_off_starts_the_count_again(hooked):
    m = Scorer().eval()
    modstate.check(torch, m)
    for i in range(2 * modstate.THRASH):
        for _ in range(modstate.PAYOFF_CALLS):
            modstate.check(torch, m)
        m.temperature = 2.0 + i
        assert modstate.check(torch, m).eager is None


def test_a_thread_graph_goes_stale_when_its_model_changes_or_is_freed(hooked):
    m, other = Scorer(), Scorer()
    modstate.check(torch, m)
    tg = _ThreadGraph(m, None, [], [], None, None, 0)
    assert modstate.fresh(tg, m) and not modstate.stale(tg, m) and not modstate.stale(tg, other)
    m.temperature = 9.0
    modstate.check(torch, m)
    assert modstate.stale(tg, m) and not modstate.fresh(tg, m)
    assert not modstate.stale(tg, other)  # (a call of another model keeps it)
    tg2 = _ThreadGraph(other, None, [], [], None, None, 0)
    del other
    import gc

    gc.collect()
    assert modstate.stale(tg2, m)


def test_no_call_takes_the_fast_path_before_the_retire_is_done(hooked, monkeypatch):
    """While one thread retires a changed module's graphs, another thread's call of it must not
    pass :func:`check` at once (it would replay a graph being retired): the record's revision
    is brought up to date only after the retire. Set before, one request of a wave was scored
    with the weights before ``load_state_dict(assign=True)`` (H200)."""
    m = Scorer()
    modstate.check(torch, m)
    m.temperature = 0.5
    seen = []
    real = modstate._retire

    def retire(torch_, mid):
        rec = modstate._recs[mid]
        seen.append(rec.rev == modstate._rev[0] and rec.ref() is m)  # the fast path's own test
        return real(torch_, mid)

    monkeypatch.setattr(modstate, "_retire", retire)
    assert modstate.check(torch, m).version == 1
    assert seen == [False]
    assert modstate.check(torch, m).rev == modstate._rev[0]


def test_model_eval_before_every_request_changes_nothing(hooked):
    """A handler calling ``model.eval()`` before every request sets ``training`` to the same
    False on every submodule: no revision bump, so no signature is taken again at the call."""
    m = Scorer().eval()
    rec = modstate.check(torch, m)
    r = modstate._rev[0]
    for _ in range(3):
        m.eval()
        assert modstate.check(torch, m) is rec
    assert modstate._rev[0] == r
    m.train()  # (a real change: training True)
    assert modstate._rev[0] > r


def test_scripted_traced_and_sparse_modules_have_a_signature_and_a_broken_one_never_raises():
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)
            self.t = 2.0
            self.register_buffer("sp", torch.eye(3).to_sparse())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) / self.t

    m = M().eval()
    for mod in (m, torch.jit.script(m), torch.jit.trace(m, torch.randn(3, 4))):
        sig = modstate.signature(torch, mod)
        assert sig == modstate.signature(torch, mod) and len(sig) > 2

    class Broken(torch.nn.Module):
        def named_modules(self, *a, **k):  # (a module that cannot be walked)
            raise RuntimeError("no")

    assert modstate.signature(torch, Broken()) == (("signature not taken", "RuntimeError"),)


# ------------------------------------------------------------------------------ frozen models, gradients on

def test_a_frozen_model_called_with_gradients_on_records_nothing_and_is_told_apart(hooked):
    """A model frozen with requires_grad_(False) and in eval mode, called where gradients are on
    (a worker thread: the script's torch.set_grad_enabled(False) is per thread): nothing of the call
    can require grad, so it may run under no_grad; not where a parameter or an input requires grad,
    or the module trains. What the parameters require is read at every call."""
    m = Scorer().eval().requires_grad_(False)
    ids = torch.tensor([[1, 2], [3, 4]])
    rec = modstate.check(torch, m)
    assert modstate.frozen_call(torch, rec, m, (ids,), {})
    out = m(ids)
    assert not out.requires_grad and out.grad_fn is None  # (what no_grad gives too)
    x = torch.ones(2, 4, requires_grad=True)
    assert not modstate.frozen_call(torch, rec, m, (ids,), {"extra": {"x": [x]}})  # an input that does
    m.head.weight.requires_grad_(True)  # (a tensor method: no revision bump, read live)
    assert not modstate.frozen_call(torch, modstate.check(torch, m), m, (ids,), {})
    m.head.weight.requires_grad_(False)
    m.train()
    assert not modstate.frozen_call(torch, modstate.check(torch, m), m, (ids,), {})
    m.eval()
    assert modstate.frozen_call(torch, modstate.check(torch, m), m, (ids,), {})
    m.head = torch.nn.Linear(4, 1)  # a new submodule, its parameters requiring grad: taken again
    assert not modstate.frozen_call(torch, modstate.check(torch, m), m, (ids,), {})
