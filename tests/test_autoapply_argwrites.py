"""Models that write into their own arguments (``recsys_doctor/applying/_autoapply/argwrites.py``),
on the CPU: the watch on a key's first warm-up call finds in-place and ``out=`` writes into an
argument or a view of one, not writes into the model's own weights or into copies it made; such
a key runs eagerly from then on, and the script's tensors get every write exactly as eager
gives it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import accounting, argwrites, graphs  # noqa: E402


class Hashing(torch.nn.Module):
    """``ids %= vocab`` in forward: the script's ids are hashed in place."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(10, 3, mode="sum")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids %= 10
        return self.emb(ids)


class Clamp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 0].clamp_(-1, 1)  # (a view of the argument)
        return x.sum(1)


class OutArg(torch.nn.Module):
    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        torch.mul(x, 2, out=buf)
        return buf + 1


class Clean(torch.nn.Module):
    """Writes only into a copy of its argument and into its own weights (max_norm renormalizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 3, max_norm=0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y = ids.clone()
        y.add_(1)
        return self.emb(y % 10).sum(1)


@pytest.mark.parametrize("model,args,op", [
    (Hashing(), lambda: (torch.tensor([[3, 14], [25, 7]]),), "remainder_"),
    (Clamp(), lambda: (torch.tensor([[5.0, 2.0], [-4.0, 1.0]]),), "clamp_"),
    (OutArg(), lambda: (torch.ones(2, 2), torch.zeros(2, 2)), "mul.out"),
])
def test_a_write_into_an_argument_is_found_and_the_script_gets_it(model, args, op):
    a, b = args(), args()
    with torch.inference_mode():
        want = model(*a)
        got, hit = argwrites.watched_call(torch, lambda: model(*b), model, list(b))
    assert hit is not None and op in hit
    assert torch.equal(got, want) and all(torch.equal(x, y) for x, y in zip(a, b))  # the writes, once


def test_writes_into_copies_and_weights_are_not_the_arguments():
    m = Clean().eval()
    ids = torch.tensor([[1, 2], [3, 9]])
    with torch.no_grad():
        got, hit = argwrites.watched_call(torch, lambda: m(ids), m, [ids])
    assert hit is None and torch.equal(ids, torch.tensor([[1, 2], [3, 9]])) and got.shape == (2, 3)


def _call(g, module, key, x, site="s.py:5"):
    s = graphs._site_of(g, module)
    return graphs._keyed_call(torch, g, s, type(module).__call__, module, (x,), {}, site, key, [x], (x,), {}, None)


def test_a_key_whose_model_writes_its_arguments_runs_eagerly_from_its_first_call(hook_group, capsys):
    group = hook_group
    m = Hashing().eval()
    with torch.no_grad():
        for _ in range(4):
            ids = torch.tensor([[13, 24], [5, 36]])
            out = _call(group, m, "k", ids)
            assert torch.equal(ids, torch.tensor([[3, 4], [5, 6]]))  # every call's write reached the script
            assert torch.equal(out, m.emb(torch.tensor([[3, 4], [5, 6]])))
    e = group.entries["k"]
    assert e.graph is None and e.reason.startswith(argwrites.WRITES_ARGS) and "remainder_" in e.reason
    rows = [r for r in accounting.sites() if r["site"] == "s.py:5"]
    assert rows[0]["taken_over"] == 0 and rows[0]["fallback"] == 4
    assert "remainder_" in capsys.readouterr().err


def test_a_key_whose_model_leaves_its_arguments_warms_up_as_before(hook_group):
    group = hook_group
    m = Clean().eval()
    with torch.no_grad():
        ids = torch.tensor([[1, 2], [3, 9]])
        _call(group, m, "k", ids)
    e = group.entries["k"]
    assert e.reason is None and e.calls == 1


def test_a_scripted_model_is_watched_too():
    """TorchScript runs its operators through the dispatcher as well: the watch sees them."""
    m = torch.jit.script(Clamp())
    x = torch.tensor([[5.0, 2.0], [-4.0, 1.0]])
    with torch.inference_mode():
        out, hit = argwrites.watched_call(torch, lambda: m(x), m, [x])
    assert hit is not None and "clamp_" in hit
    assert torch.equal(x, torch.tensor([[1.0, 2.0], [-1.0, 1.0]])) and torch.equal(out, torch.tensor([3.0, 0.0]))


def test_a_wrapper_subclass_argument_is_passed_through():
    """A tensor subclass without a storage of its own (as the hook's host-argument proxies are)
    among the arguments: the watch names no write for it and the call runs as it is."""

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            r = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)
            r.inner = inner
            return r

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda t: t.inner if isinstance(t, Wrapper) else t  # noqa: E731
            return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})

    w = Wrapper(torch.tensor([1.0, -2.0]))
    m = torch.nn.ReLU()
    out, hit = argwrites.watched_call(torch, lambda: m(w) * 2, m, [w])
    assert hit is None and torch.equal(out, torch.tensor([2.0, 0.0]))


_NO_DYNAMO = """
import sys, torch
from recsys_doctor.applying._autoapply import argwrites

class Hashing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(10, 3, mode="sum")

    def forward(self, ids):
        ids %= 10
        return self.emb(ids)

m, ids = Hashing(), torch.tensor([[3, 14], [25, 7]])
with torch.no_grad():
    out, hit = argwrites.watched_call(torch, lambda: m(ids), m, [ids])
    out2, hit2 = argwrites.watched_call(torch, lambda: m(ids), m, [ids])
print(hit, hit2, ids.tolist(), "torch._dynamo" in sys.modules)
"""


def test_the_watch_does_not_load_dynamo():
    """PyTorch wraps a dispatch mode's method so that its first call imports ``torch._dynamo``
    (on the GPU machine, where nothing of it was compiled, seconds of the script's first
    requests with every other thread waiting on the import lock). The watch finds the write
    without loading it, in a fresh interpreter."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NO_DYNAMO], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    hit, hit2, *rest = r.stdout.split()
    assert "remainder_" in hit and "remainder_" in hit2
    assert " ".join(rest) == "[[3, 4], [5, 7]] False"


def test_where_dynamo_is_loaded_the_watch_keeps_pytorchs_wrapper():
    """Once ``torch._dynamo`` is loaded (the script compiles something), the watch's method
    keeps PyTorch's wrapper, so compiled code does not trace into it; it still finds writes."""
    import torch._dynamo  # noqa: F401

    classes = argwrites._per_state().classes
    cls = argwrites._watch_class()
    assert cls is classes[True]
    if classes.get(False) is not None:
        assert cls.__dict__["__torch_dispatch__"] is not classes[False].__dict__["__torch_dispatch__"]
    x = torch.tensor([[5.0, 2.0], [-4.0, 1.0]])
    m = Clamp()
    _, hit = argwrites.watched_call(torch, lambda: m(x), m, [x])
    assert hit is not None and "clamp_" in hit
