"""Configuration a model's ``forward`` reads from outside the module, changed while it serves,
under the script hook on a real GPU (run on the GPU machine:
``pytest -m gpu tests/test_autoapply_config_gpu.py``).

A CUDA graph bakes the Python values its capture read into its kernels: a ``FLAGS["blend"]``
multiplier, the branch a ``FLAGS["fresh"]`` flag chose, a ``self.cfg.clip`` a dataclass holds.
The hook guards them (``runtime/_watched.py``, ``_autoapply/modstate.py``): a call that finds
one changed retires the module's graphs, which are captured again. In-process, threads score in
waves and the configuration changes between waves: every output must equal eager's with that
wave's configuration, and the same run with the guard taken out must not (so the test sees a
stale replay when there is one). ``examples/heldout/config_reload_serve.py`` (a module-level
dict, a rebound global float, a dataclass changed in place) must print the unhooked checksum
under one group, two groups, and two groups batching."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from _hooked_script import assert_same_scores, graphed_calls, run_hooked, run_json
from test_apply_gpu import _run_hooked

pytestmark = pytest.mark.gpu

FLAGS = {"blend": 0.5, "fresh": False}
SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "heldout" / "config_reload_serve.py"
ARGS = ["--threads", "4", "--queries", "1200", "--reload-every", "150"]
#: per wave: FLAGS' blend and fresh, the dataclass's clip (wave 4 sets wave 3's values again)
WAVES = [(0.5, False, 1.0), (0.25, False, 1.0), (0.25, True, 1.0), (0.25, True, 0.3), (0.25, True, 0.3),
         (0.75, False, 0.3)]
CALLS = 40  # per thread and wave: enough for each group to capture and replay within a wave
THREADS = 4


@dataclass
class Cfg:
    clip: float


def _model(torch):
    class Flagged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
            self.cfg = Cfg(1.0)

        def forward(self, x):
            y = self.mlp(x) * FLAGS["blend"]
            if FLAGS["fresh"]:
                y = y + x[:, :4]
            return y.clamp(-self.cfg.clip, self.cfg.clip)

    torch.manual_seed(0)
    return Flagged().cuda().eval()


def _set(model, wave: int) -> None:
    FLAGS["blend"], FLAGS["fresh"], model.cfg.clip = WAVES[wave]


def _serve_waves(tmp_path, torch, model, groups: int):
    """Every thread's outputs per wave under the hook, the configuration set between waves by the
    barrier's action; the eager references per wave and thread; the hook's stats."""
    qs = [torch.randn(32, 16, generator=torch.Generator().manual_seed(k)).cuda() for k in range(THREADS)]
    ref = []
    with torch.no_grad():
        for w in range(len(WAVES)):
            _set(model, w)
            ref.append([model(q).cpu() for q in qs])
    _set(model, 0)
    got: dict[tuple[int, int], list] = {}
    wave = [0]

    def next_wave() -> None:
        wave[0] += 1
        if wave[0] < len(WAVES):
            _set(model, wave[0])

    bar = threading.Barrier(THREADS, action=next_wave)

    def client(k: int) -> None:
        with torch.no_grad():
            for w in range(len(WAVES)):
                got[(w, k)] = [model(qs[k]).cpu() for _ in range(CALLS)]
                bar.wait(120)

    st = _run_hooked(tmp_path, groups, THREADS, client)
    return got, ref, st


@pytest.mark.parametrize("groups", [1, 2])
def test_a_changed_configuration_is_never_replayed_stale(tmp_path, groups):
    torch = pytest.importorskip("torch")
    model = _model(torch)
    got, ref, st = _serve_waves(tmp_path, torch, model, groups)
    for (w, k), outs in got.items():
        for out in outs:
            assert torch.equal(out, ref[w][k]), (w, k)
    real_changes = sum(WAVES[w] != WAVES[w - 1] for w in range(1, len(WAVES)))
    assert st["module_changes"] >= real_changes, st
    assert st["replays"] + st["thread_replays"] >= len(WAVES) * THREADS * CALLS // 2, st


def test_without_the_guard_the_same_waves_replay_a_stale_configuration(tmp_path, monkeypatch):
    """The negative control: with the guard taken out, graphs captured in one wave replay its
    configuration in the next, and the outputs differ from eager's (what the test above would see)."""
    torch = pytest.importorskip("torch")
    from recsys_doctor.runtime import _hostvalues

    real = _hostvalues.inspect_forward
    monkeypatch.setattr(_hostvalues, "inspect_forward", lambda m: (real(m)[0], None))
    model = _model(torch)
    got, ref, st = _serve_waves(tmp_path, torch, model, 1)
    stale = sum(not torch.equal(out, ref[w][k]) for (w, k), outs in got.items() for out in outs)
    assert stale > 0 and st["module_changes"] == 0, (stale, st)


@pytest.fixture(scope="module")
def unhooked() -> dict:
    return run_json(SCRIPT, ARGS)


@pytest.mark.parametrize("groups,batching", [(1, False), (2, False), (2, True)])
def test_a_script_reloading_its_configuration_keeps_the_unhooked_scores(tmp_path, unhooked, groups, batching):
    got, st = run_hooked(tmp_path, SCRIPT, ARGS, groups, batching)
    assert_same_scores(got, unhooked, st)
    assert got["reloads"] == unhooked["reloads"] and got["wave_sums"] == pytest.approx(unhooked["wave_sums"], rel=1e-6)
    assert st["module_changes"] >= 2, st
    assert graphed_calls(st) >= 1200 // 2, st
