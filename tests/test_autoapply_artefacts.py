"""Models served as artefacts and models that write into their arguments, under the script hook
(recsys_doctor/applying/_autoapply/), on the CPU. Found with the held-out scripts on the H200
(``bench/apply/results/heldout6_h200/``):

* ``torch.export``: the served module is ``ExportedProgram.module()``, whose ``training`` flag is
  True (its ``eval()`` raises) while its graph fixed eval at export: every call was left eager as
  "in training mode" (``examples/heldout/exported_ranker_serve.py``);
* ``torch.jit.trace`` of a model inside a hooked process: the tracer runs the model through the
  patched ``nn.Module.__call__`` with tracer-backed sizes, and the hook's row bucketing failed
  on them (``AttributeError: 'Tensor' object has no attribute 'bit_length'``, the script dead);
* a KV-cache decode step that writes into its cache arguments (``generative_decode_serve.py``):
  the batching path replayed it (the script's caches never written: a wrong checksum), where the
  graph path leaves such a call eager.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recsys_doctor.applying._autoapply import _common, batching, interception, modstate, trainers
from recsys_doctor.applying._autoapply.argwrites import WRITES_ARGS
from recsys_doctor.applying._autoapply.groups import _Gate


def test_an_exported_programs_module_is_not_in_training_whatever_its_flag():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).eval()
    gm = torch.export.export(m, (torch.randn(3, 4),)).module()
    assert gm.training  # (PyTorch's flag, and eval() cannot change it)
    with pytest.raises(NotImplementedError):
        gm.eval()
    assert not _common.trains(gm)
    x = torch.randn(3, 4)
    assert torch.equal(gm(x), m(x))  # (its dropout is the eval one: fixed at export)
    assert _common.trains(nn.Linear(2, 2)) and not _common.trains(nn.Linear(2, 2).eval())
    fx = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))  # (its flag is honoured)
    assert _common.trains(fx) and not _common.trains(fx.eval())


@pytest.fixture
def patched(monkeypatch, hook_group):
    """``nn.Module.__call__`` patched as in a hooked process, this thread placed (no stream), and
    every model call that reaches the hook's record look-up noted."""
    saved = nn.Module.__call__
    for key, value in {"graphs": True, "gate": _Gate(), "patched_module": False, "active": True}.items():
        monkeypatch.setitem(_common._state, key, value)
    monkeypatch.setattr(_common._tls, "depth", 0, raising=False)
    looked: list[tuple[str, bool]] = []  # (the module, whether the JIT tracer was recording)
    real = modstate.check
    monkeypatch.setattr(interception.modstate, "check",
                        lambda t, m: (looked.append((type(m).__name__, torch._C._is_tracing())), real(t, m))[1])
    interception._patch_module(torch)
    try:
        yield looked
    finally:
        nn.Module.__call__ = saved
        modstate.unpatch(torch)
        trainers.uninstall(torch)


def test_a_model_traced_by_torch_jit_in_a_hooked_thread_is_traced_as_pytorch_does(patched):
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).eval()
    x = torch.randn(5, 4)
    traced = torch.jit.trace(m, (x,))
    # no call the tracer recorded reached the hook (its sanity check's eager run of the model may)
    assert not any(tracing for _, tracing in patched), patched
    n = len(patched)
    with torch.no_grad():
        y = torch.randn(7, 4)
        assert torch.allclose(traced(y), m(y))
    assert patched[n:] == [("TopLevelTracedModule", False), ("Sequential", False)]  # (ordinary calls still do)


class Decode(nn.Module):
    """One decode step writing its key into the cache argument in place."""

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(4, 4)

    def forward(self, x, cache, pos: int):
        cache[:, pos] = self.k(x)
        return cache[:, : pos + 1].sum(1)


@pytest.fixture
def batching_state(monkeypatch, hook_group):
    import threading

    for key, value in {"batch_specs": {}, "batch_lock": threading.Lock(), "batch_refusals_said": set()}.items():
        monkeypatch.setitem(_common._state, key, value)


def test_a_model_writing_into_its_arguments_is_not_batched_and_its_check_leaves_them(batching_state, capsys):
    m = Decode().eval()
    x, cache = torch.randn(3, 4), torch.zeros(3, 5, 4)
    before = cache.clone()
    sp = batching._Spec()
    with torch.no_grad():
        batching._decide(torch, sp, nn.Module.__call__, m, (x, cache, 2), {}, [x, cache], "serve.py:10")
    assert sp.refused == f"not batched: {WRITES_ARGS} (aten.copy_.default)", sp.refused
    assert torch.equal(cache, before)  # (the check ran on clones: the script's call is still to be made)
    assert WRITES_ARGS in capsys.readouterr().err


def test_a_model_that_writes_nothing_of_its_arguments_still_batches(batching_state):
    m = nn.Linear(4, 2).eval()
    x = torch.randn(3, 4)
    sp = batching._Spec()
    with torch.no_grad():
        batching._decide(torch, sp, nn.Module.__call__, m, (x,), {}, [x], "serve.py:10")
    assert sp.refused is None and sp.out_rows == (3,)


def test_the_hooks_buffers_are_normal_tensors_inside_the_scripts_inference_mode():
    """A buffer the hook makes during a call under ``torch.inference_mode()`` and fills later,
    outside it (a script that copies its inputs before ``with torch.inference_mode(): model(x)``:
    ``optional_features_serve.py``, whose run under the hook died of it on the H200)."""
    with torch.inference_mode():
        plain = torch.empty(3)
        with _common.normal_tensors(torch):
            kept = torch.empty(3)
    kept.copy_(torch.ones(3))  # (outside inference mode now)
    assert not kept.is_inference() and torch.equal(kept, torch.ones(3))
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
        plain.copy_(torch.ones(3))
