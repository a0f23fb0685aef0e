"""The runtime's dispatch modes (``runtime/_modes.py``): a mode made while ``torch._dynamo`` is
not loaded runs its first operator without importing it; once it is loaded, PyTorch's wrapper
stays on the modes made from then on."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

_FRESH = """
import sys, torch
from recsys_doctor.runtime._serve_entry import host_syncs
from recsys_doctor.runtime._branches import _mode_class
with host_syncs(torch):
    y = torch.nn.Embedding(10, 3)(torch.tensor([1, 2])).sum()
try:
    with host_syncs(torch):
        torch.ones(3).nonzero()  # (a CPU tensor: no synchronization to refuse)
    ok = True
except RuntimeError:
    ok = False
cls = _mode_class()
print(ok, hasattr(cls.__dict__["__torch_dispatch__"], "__wrapped__"), "torch._dynamo" in sys.modules)
"""


def test_modes_made_before_dynamo_do_not_load_it():
    r = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False", "False"]


def test_once_dynamo_is_loaded_the_wrapper_stays():
    import torch._dynamo  # noqa: F401
    from torch.utils._python_dispatch import TorchDispatchMode

    from recsys_doctor.runtime._modes import dynamo_loaded, unwrapped_dispatch

    class M(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    before = M.__dict__["__torch_dispatch__"]
    assert dynamo_loaded() and unwrapped_dispatch(M) is M
    assert M.__dict__["__torch_dispatch__"] is before
    with M():
        assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0))
