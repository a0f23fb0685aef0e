"""Values a ``forward`` reads from outside its module (``runtime/_watched.py``): found in the
code with the module's other host values (``runtime/_hostvalues.py``), compared at each call of
the hook's module record (``_autoapply/modstate.py``), and a change retires the module's graphs
as a change of the module does. The GPU test that a script reloading its configuration between
request waves keeps the unhooked outputs: tests/test_autoapply_config_gpu.py."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import modstate  # noqa: E402
from recsys_doctor.applying._autoapply._common import _state, _tls  # noqa: E402
from recsys_doctor.runtime._hostvalues import PY_STATE, host_value_reason, inspect_forward  # noqa: E402
from recsys_doctor.runtime._watched import MAX_ITEMS, same_as, snap  # noqa: E402

FLAGS = {"blend": 0.5, "fresh": False}
TEMPERATURE = 2.0
FIELDS = ["a", "b", "c"]
SEEN: list = []
CALLS = 0
settings = types.ModuleType("rd_test_settings")  # a settings module of the script's own
settings.SCALE = 3.0
settings.helper = lambda x: x


@dataclass
class Cfg:
    clip: float
    bias: float


class Flagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.cfg = Cfg(1.0, 0.0)
        self.weights = {"ctr": 1.0}
        self.temperature = 1.0  # (a plain number of the module: nn.Module.__setattr__ sees it)

    def forward(self, x):
        y = self.lin(x) * FLAGS["blend"] / TEMPERATURE * settings.SCALE * self.weights["ctr"]
        if FLAGS["fresh"]:
            y = y + 1
        return torch.relu(y).clamp(-self.cfg.clip, self.cfg.clip) + self.cfg.bias + len(FIELDS) * 0


def _closure_model(scale):
    class Closed(torch.nn.Module):
        def forward(self, x):
            return x * scale

    return Closed()


class Counts(torch.nn.Module):
    def forward(self, x):
        global CALLS
        CALLS += 1  # GLOBAL COUNTER
        return x


class Collects(torch.nn.Module):
    def forward(self, x):
        SEEN.append(x.shape[0])  # GLOBAL LIST
        return x


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return torch.nn.functional.relu(self.lin(x)) * math.pi


def _labels(model):
    why, guard = inspect_forward(model)
    assert why is None, why
    return sorted(label for label, _ in guard.watches) if guard is not None else []


def test_snapshots_compare_by_value_type_and_address():
    assert snap(1.0) == snap(1.0) and snap(1) != snap(1.0) != snap(True)
    assert snap(float("nan")) == snap(float("nan"))  # (a NaN setting is not a change every call)
    assert snap([1, "a", None]) == snap([1, "a", None]) != snap([1, "a", 0]) != snap((1, "a", None))
    assert snap({"k": 1.5, "f": True}) != snap({"k": 1.5, "f": False})
    assert snap({"k": [1, 2]}) != snap({"k": [1, 3]})  # (nested: compared item by item)
    assert snap(Cfg(1.0, 0.0)) == snap(Cfg(1.0, 0.0)) != snap(Cfg(1.0, 0.5))
    assert snap(types.SimpleNamespace(a=1)) != snap(types.SimpleNamespace(a=2))
    t = torch.zeros(3)
    assert snap(t) == snap(t) != snap(torch.zeros(3))  # (by address: a new tensor is a change)
    assert snap(torch.float16) != snap(torch.float32)
    cache = {k: torch.zeros(1) for k in range(20)}  # (a dict of tensors: by keys and the same objects)
    same = same_as(cache)
    assert same(dict(cache)) and not same({**cache, 3: torch.zeros(1)}) and not same({**cache, 20: t})
    w = np.ones(4, np.float32)
    before = snap(w)
    w[2] = 5.0  # (a small table changed in place: its bytes)
    assert snap(w) != before and snap(np.float32(0.5)) == snap(np.float32(0.5)) != snap(np.float64(0.5))
    large = np.zeros(2048, np.float32)  # (8 KB: by identity, shape and dtype)
    assert snap(large) == snap(large) != snap(large.copy()) and snap(large)[0] == "np"
    big = list(range(MAX_ITEMS + 1))
    assert snap(big)[0] == "id" and snap(big) != snap(big + [1])  # (a larger one: identity and length)


def test_the_quick_test_a_call_pays_agrees_with_the_snapshots():
    t = torch.zeros(2)
    values = [1, 1.0, True, "a", None, float("nan"), [1, 2], [1, 2.0], (1, 2), {"k": 1}, {"k": 1.0}, {"k": [1]},
              {"k": [2]}, Cfg(1.0, 0.0), Cfg(1.0, 0.5), Cfg(1, 0.0), types.SimpleNamespace(a=1), t, torch.zeros(2),
              torch.float32, list(range(MAX_ITEMS + 1)), {"m": t}, {"m": torch.zeros(2)}, {"n": t}, [t, 1], (t,),
              [torch.nn.Identity()], np.ones(3), np.zeros(3), np.float32(1.0)]
    for a in values:
        same = same_as(a)
        for b in values:
            assert same(b) == (snap(a) == snap(b)) or (a is not b and snap(a) == snap(b)), (a, b)
        assert same(a)


def test_the_values_a_forward_reads_from_outside_are_found():
    assert _labels(Flagged()) == ["Flagged.cfg", "Flagged.weights", "global FIELDS", "global FLAGS",
                                  "global TEMPERATURE", "rd_test_settings.SCALE"]
    # each instance's own: two experts' dataclasses, one changed in place, are two values
    pair = torch.nn.Sequential(Flagged(), Flagged())
    assert _labels(pair).count("Flagged.cfg") == 2
    guard = inspect_forward(pair)[1]
    pair[1].cfg.clip = 0.5  # (the second expert's: the first's unchanged)
    assert not guard.holds()
    assert _labels(_closure_model(2.0)) == ["closure scale"]
    # code is not data (torch, math, functions), nor are the module's own plain numbers (setattr sees them)
    assert _labels(Plain()) == []


@pytest.mark.parametrize("model,what,mark", [(Counts(), "global CALLS += ...", "# GLOBAL COUNTER"),
                                             (Collects(), "SEEN.append(...)", "# GLOBAL LIST")])
def test_a_forward_changing_a_global_in_place_runs_eagerly(model, what, mark):
    line = next(i for i, ln in enumerate(open(__file__).read().splitlines(), 1) if ln.endswith(mark))
    assert host_value_reason(model) == (f"{type(model).__name__}.forward {PY_STATE}, {what} ({__file__}:{line}): "
                                        "a CUDA graph's replay would not run it: eager")


@pytest.fixture
def fresh_state(monkeypatch):
    saved = dict(_state)
    depth = getattr(_tls, "depth", 0)
    _tls.depth = 0
    _state.update(groups={}, late_groups=[], graph_bytes=0, batch_specs={}, routes={}, host_use={},
                  module_changes=0, fallbacks=[])
    modstate.reset()
    try:
        yield
    finally:
        modstate.reset()
        _state.clear()
        _state.update(saved)
        _tls.depth = depth


def test_a_changed_value_retires_the_module_like_a_change_of_it(fresh_state, monkeypatch):
    m = Flagged()
    rec = modstate.check(torch, m)
    assert rec.eager is None and rec.guard is not None and modstate.version(m) == 0
    for _ in range(3):
        modstate.check(torch, m)
    assert modstate.version(m) == 0 and _state["module_changes"] == 0  # (nothing changed: kept)
    changes = [lambda: FLAGS.__setitem__("blend", 0.25), lambda: globals().__setitem__("TEMPERATURE", 4.0),
               lambda: setattr(settings, "SCALE", 1.0), lambda: setattr(m.cfg, "clip", 0.5),
               lambda: m.weights.__setitem__("ctr", 2.0), lambda: FIELDS.append("d")]
    monkeypatch.setitem(FLAGS, "blend", FLAGS["blend"])  # (each put back after the test)
    monkeypatch.setitem(globals(), "TEMPERATURE", TEMPERATURE)
    monkeypatch.setattr(settings, "SCALE", settings.SCALE)
    monkeypatch.setattr(__import__(__name__), "FIELDS", FIELDS, raising=False)
    for k, change in enumerate(changes, 1):
        change()
        modstate.check(torch, m)
        assert modstate.version(m) == k, k
        for _ in range(modstate.PAYOFF_CALLS):  # (calls enough that the change paid off: not thrashing)
            modstate.check(torch, m)
        assert modstate.version(m) == k and rec.eager is None
    FIELDS.pop()
    assert _state["module_changes"] == len(changes)


def test_a_value_set_to_what_it_was_is_no_change_and_one_changing_every_call_makes_it_eager(fresh_state, monkeypatch):
    m = Flagged().eval()  # (a training module's changes do not count toward thrashing: DDP's no_sync())
    monkeypatch.setitem(FLAGS, "blend", 0.5)
    first = FLAGS["blend"]
    modstate.check(torch, m)
    FLAGS["blend"] = float("0.5")  # (a new float object, the same value)
    assert FLAGS["blend"] is not first
    modstate.check(torch, m)
    assert modstate.version(m) == 0
    for k in range(modstate.THRASH):
        FLAGS["blend"] = 0.1 * (k + 1)
        modstate.check(torch, m)
    rec = modstate.check(torch, m)
    assert rec.eager is not None and modstate.CHANGES_OFTEN in rec.eager and "global FLAGS changed" in rec.eager


def test_the_guard_takes_the_new_values_only_after_the_graphs_are_retired(fresh_state, monkeypatch):
    """Another thread's call must not pass the guard on the new values while the old graphs are
    still there: the guard keeps them after the retire (a call of another group replayed the old
    configuration when it kept them first: config_reload_serve.py on the H200)."""
    m = Flagged()
    rec = modstate.check(torch, m)
    seen = []
    monkeypatch.setattr(modstate, "_retire", lambda torch, mid: seen.append(rec.guard.holds()) or 0)
    monkeypatch.setitem(FLAGS, "blend", 0.125)
    modstate.check(torch, m)
    assert seen == [False] and rec.guard.holds() and modstate.version(m) == 1
