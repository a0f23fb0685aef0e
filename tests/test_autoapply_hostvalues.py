"""Models whose ``forward`` reads the host's clock or random numbers run eagerly under the hook
(``runtime/_hostvalues.py``): a CUDA graph would replay the values of
its capture. Each way such a value reaches a ``forward`` is found, with its line; PyTorch's own
random operations and plain models are not flagged; the module's record runs it eagerly from its
first call. The GPU test that outputs stay exact: tests/test_autoapply_gpu.py."""

from __future__ import annotations

import datetime
import random
import time
from datetime import datetime as dt
from time import perf_counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import modstate  # noqa: E402
from recsys_doctor.applying._autoapply._common import _state  # noqa: E402
from recsys_doctor.runtime._hostvalues import HOST_VALUES, host_value_reason  # noqa: E402

HERE = __file__


def _line_of(text: str) -> int:
    """The line of this file ending with ``text`` (once)."""
    lines = [i for i, ln in enumerate(open(HERE).read().splitlines(), 1) if ln.endswith(text)]
    assert len(lines) == 1, (text, lines)
    return lines[0]


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):  # PyTorch's own randomness: graph-safe
        return self.drop(torch.relu(self.lin(x))) + torch.rand_like(x[:, :2]) * 0


class Decay(torch.nn.Module):
    def forward(self, x, ts):
        return x * torch.exp(-(time.time() - ts))  # DECAY


class Explore(torch.nn.Module):
    def forward(self, x):
        if random.random() < 0.1:  # EXPLORE
            return x.flip(0)
        return x


class NpNoise(torch.nn.Module):
    def forward(self, x):
        return x + float(np.random.rand())  # NPNOISE


class OwnRng(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(0)

    def forward(self, x):
        return self._noisy(x)

    def _noisy(self, x):
        return x + float(self.rng.random())  # OWNRNG


def hour_weight(x):
    return x * dt.now().hour  # HELPER


class ViaHelper(torch.nn.Module):
    def forward(self, x):
        return hour_weight(x)


class Timed(torch.nn.Module):
    def forward(self, x):
        t0 = perf_counter()  # TIMED
        y = x * 2
        self.last_ms = (perf_counter() - t0) * 1e3
        return y


class Today(torch.nn.Module):
    def forward(self, x):
        return x * datetime.date.today().weekday()  # TODAY


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Explore()
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.head(self.inner(x))


class UsesTimedelta(torch.nn.Module):
    """``datetime`` without the clock (a constant): not flagged."""

    def forward(self, x):
        return x * dt(2024, 1, 1).month


@pytest.mark.parametrize("model,what,mark", [
    (Decay(), "time.time", "# DECAY"), (Explore(), "random.random", "# EXPLORE"),
    (NpNoise(), "np.random", "# NPNOISE"), (OwnRng(), "self.rng", "# OWNRNG"),
    (ViaHelper(), "dt.now", "# HELPER"), (Timed(), "perf_counter", "# TIMED"),
    (Today(), "datetime", "# TODAY"),
])
def test_each_way_a_host_value_reaches_forward_is_found_with_its_line(model, what, mark):
    why = host_value_reason(model)
    assert why is not None and why.startswith(f"{type(model).__name__}.forward {HOST_VALUES}, {what}")
    assert f"{HERE}:{_line_of(mark)})" in why and why.endswith("a CUDA graph would replay the values of its capture: eager")


def test_a_submodule_reading_them_is_named():
    why = host_value_reason(Outer())
    assert why.startswith(f"Explore.forward {HOST_VALUES}, random.random ({HERE}:{_line_of('# EXPLORE')})")


@pytest.mark.parametrize("model", [Plain(), UsesTimedelta(), torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()),
                                   torch.nn.EmbeddingBag(10, 4), torch.nn.TransformerEncoderLayer(8, 2)])
def test_models_without_host_values_are_not_flagged(model):
    assert host_value_reason(model) is None


def test_the_record_of_such_a_module_runs_it_eagerly_from_its_first_call(monkeypatch):
    monkeypatch.setitem(_state, "fallbacks", [])
    modstate.reset()
    try:
        rec = modstate.check(torch, Explore())
        assert rec.eager is not None and HOST_VALUES in rec.eager
        assert _state["fallbacks"] == [HOST_VALUES]
        assert modstate.check(torch, Plain()).eager is None and _state["fallbacks"] == [HOST_VALUES]
        from recsys_doctor.runtime._hostvalues import PY_STATE

        assert PY_STATE in modstate.check(torch, Counted()).eager and _state["fallbacks"] == [HOST_VALUES, PY_STATE]
    finally:
        modstate.reset()


def test_the_runtime_serves_such_a_model_without_graphs_or_batching():
    """``serve()``'s config for a model reading host values: CUDA graphs and batching off, with a
    warning naming the line; any other model's config is left as it is (the same object)."""
    from recsys_doctor.runtime._hostvalues import host_values_off
    from recsys_doctor.runtime._policy import RuntimeConfig

    cfg = RuntimeConfig.from_plan({}, groups=2, cuda_graphs=True, batching=True)
    with pytest.warns(RuntimeWarning, match=r"served without CUDA graphs or batching: Explore.forward reads") as w:
        off = host_values_off(Explore(), cfg)
    assert f"{HERE}:{_line_of('# EXPLORE')}" in str(w[0].message)
    assert (off.cuda_graphs, off.batching, off.groups) == (False, False, 2)
    assert host_values_off(Plain(), cfg) is cfg
    eager = RuntimeConfig.from_plan({}, groups=2, cuda_graphs=False, batching=False)
    assert host_values_off(Explore(), eager) is eager  # (nothing to turn off: no warning)


class Counted(torch.nn.Module):
    """Every 100th call recalibrated: a counter in Python, which a replay would never advance."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # COUNTED
        y = self.lin(x)
        return y * 0.5 if self.calls % 100 == 0 else y


class Logged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.history = []

    def forward(self, x):
        self.history.append(x.shape[0])  # LOGGED
        return x * 2


class RunningBuffer(torch.nn.Module):
    """A tensor buffer changed in place (a kernel a replay runs) and a mask set once: not flagged."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(1))
        self._mask = None

    def forward(self, x):
        self.seen += x.shape[0]
        if self._mask is None:
            self._mask = torch.ones(x.shape[1])
        total = 0
        total += 1
        return x * self._mask * total


@pytest.mark.parametrize("model,what,mark", [(Counted(), "self.calls += ...", "# COUNTED"),
                                             (Logged(), "self.history.append(...)", "# LOGGED")])
def test_a_forward_changing_python_state_of_its_module_is_found(model, what, mark):
    from recsys_doctor.runtime._hostvalues import PY_STATE, reason_kind

    why = host_value_reason(model)
    assert why == (f"{type(model).__name__}.forward {PY_STATE}, {what} ({HERE}:{_line_of(mark)}): "
                   "a CUDA graph's replay would not run it: eager")
    assert reason_kind(why) == PY_STATE and reason_kind(host_value_reason(Explore())) == HOST_VALUES


def test_a_tensor_buffer_changed_in_place_and_a_mask_set_once_are_not_flagged():
    assert host_value_reason(RunningBuffer()) is None
