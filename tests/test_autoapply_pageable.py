"""The script hook's staging of pageable host-to-device copies, the parts that run without a
GPU: which calls it recognizes (``Tensor.to`` / ``.cuda``, ``torch.as_tensor``, ``torch.tensor``),
what it leaves to PyTorch and why, the bytes staged through the thread's two buffers (switching
when one is full) and the counts per line of the script.

A CPU tensor stands in for the thread's pinned buffers and ``cpu`` for the device: the
bookkeeping is the same; the GPU side (asynchronous copies on the group's stream, outputs equal
to PyTorch's copies, the scripts suite) is in ``tests/test_apply_gpu.py``."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from recsys_doctor.applying._autoapply import accounting, pageable, staging

torch = pytest.importorskip("torch")

FAKE = SimpleNamespace(device=torch.device, Tensor=torch.Tensor, dtype=torch.dtype,
                       preserve_format=torch.preserve_format, contiguous_format=torch.contiguous_format,
                       cuda=SimpleNamespace(current_device=lambda: 3))
C3, C1 = torch.device("cuda", 3), torch.device("cuda", 1)
F16 = torch.float16


@pytest.mark.parametrize("args,kwargs,want", [
    (([1],), {"device": "cuda"}, (C3, None)),
    (([1], F16, "cuda:1"), {}, (C1, F16)),
    ((), {"data": [1], "device": 1}, (C1, None)),
    (([1],), {}, None),  # a host tensor: nothing to stage
    (([1],), {"device": "cpu"}, None),
    (([1], None), {"dtype": F16, "device": "cuda"}, None),  # dtype twice: PyTorch's error
    (([1],), {"device": "cuda", "memory_format": torch.contiguous_format}, None),  # not a parameter of as_tensor
])
def test_which_as_tensor_calls_are_staged(args, kwargs, want):
    assert pageable.as_tensor_args(FAKE, args, kwargs) == want


@pytest.mark.parametrize("args,kwargs,want", [
    (([1],), {"device": "cuda"}, (C3, None)),
    (([1],), {"device": "cuda", "dtype": F16, "requires_grad": False}, (C3, F16)),
    (([1],), {"device": "cuda", "requires_grad": True}, None),
    (([1],), {"device": "cuda", "pin_memory": True}, None),
    (([1],), {"device": "cuda", "names": None}, None),
    (([1], [2]), {"device": "cuda"}, None),
])
def test_which_tensor_calls_are_staged(args, kwargs, want):
    assert pageable.tensor_args(FAKE, args, kwargs) == want


@pytest.fixture
def stager(monkeypatch):
    """A hooked thread's stager over CPU "pinned" buffers of 4 KiB, counts reset."""
    monkeypatch.setattr(pageable, "ARENA_BYTES", 4096)
    monkeypatch.setattr(pageable, "MAX_COPY", 2048)
    accounting.reset()
    monkeypatch.setitem(pageable._state, "stage_pageable", True)
    st = pageable._Stager(torch, torch.device("cpu"), host_alloc=lambda n: torch.zeros(n, dtype=torch.uint8))
    monkeypatch.setattr(pageable._tls, "pageable", st, raising=False)
    yield st
    pageable._tls.pageable = None


def test_staged_copies_equal_their_sources_and_own_their_memory(stager):
    srcs = [torch.arange(10, dtype=torch.int64), torch.linspace(0, 1, 7), torch.tensor(True),
            torch.ones(3, 4, dtype=torch.float16).t(), torch.empty(0, 5), torch.arange(6).reshape(2, 3)[:, 1]]
    outs = [pageable.stage(torch, s, torch.device("cpu")) for s in srcs]
    for s, o in zip(srcs, outs):
        assert o is not None and o.dtype == s.dtype and o.shape == s.shape and torch.equal(o, s)
        assert o.data_ptr() != s.data_ptr() or s.numel() == 0
    # each copy starts on the allocator's alignment, one after the other in the first buffer
    nbytes = [s.numel() * s.element_size() for s in srcs]
    want_off = 0
    for n in nbytes:
        want_off = -(-want_off // 512) * 512 + n
    assert (stager.cur, stager.off) == (0, want_off)
    srcs[0].add_(100)  # the script's array changes after the call: the copy does not
    assert torch.equal(outs[0], torch.arange(10))


def test_a_full_buffer_switches_to_the_other_one(stager):
    src = torch.arange(256, dtype=torch.int64)  # 2 KiB: two fit in a 4 KiB buffer
    outs = [pageable.stage(torch, src + i, torch.device("cpu")) for i in range(5)]
    assert [bool(torch.equal(o, src + i)) for i, o in enumerate(outs)] == [True] * 5
    # buffers 0, 0, 1, 1, 0: the fifth copy went back to the first buffer, at its start
    assert (stager.cur, stager.off) == (0, 2048)


def test_a_conversion_is_made_on_the_host_first(stager):
    src = torch.tensor([0.1, 1e-8, 70000.0], dtype=torch.float64)
    out = pageable.stage(torch, src, torch.device("cpu"), torch.float16)
    assert out.dtype == torch.float16 and torch.equal(out, src.to(torch.float16))


def test_what_is_left_to_pytorch_is_counted_with_the_reason_and_the_line(stager):
    line = sys._getframe().f_lineno + 1
    assert pageable.stage(torch, torch.ones(3, requires_grad=True), torch.device("cpu")) is None
    big = torch.zeros(1024, dtype=torch.int64)  # 8 KiB > MAX_COPY
    assert pageable.stage(torch, big, torch.device("cpu")) is None
    assert pageable.stage(torch, torch.ones(2), torch.device("cpu")) is not None
    rows = {r["site"]: r for r in accounting.sites()}
    here = f"tests/test_autoapply_pageable.py:{line}"
    assert rows[here]["reasons"] == {"not taken over: a tensor that requires grad": 1}
    assert rows[here]["fallback"] == 1 and rows[here]["taken_over"] == 0
    nxt = rows[f"tests/test_autoapply_pageable.py:{line + 2}"]
    assert nxt["reasons"] == {"not taken over: a copy of 8192 bytes (over 2048)": 1}
    ok = rows[f"tests/test_autoapply_pageable.py:{line + 3}"]
    assert (ok["kind"], ok["taken_over"], ok["fallback"]) == ("h2d", 1, 0)


def test_factories_make_host_data_with_pytorchs_rules_then_stage_it(stager, monkeypatch):
    """``torch.as_tensor`` / ``torch.tensor`` of numpy and lists in a hooked thread: the
    dtype PyTorch's own function picks (int64 numpy stays int64, a list of floats becomes the
    default float32), the values equal, the numpy array free to change right after."""
    monkeypatch.setattr(pageable._tls, "group", object(), raising=False)
    calls = []

    def fake_stage(torch_, host, dev, dtype=None, site=None):
        calls.append((host.dtype, dev, dtype, site))
        return pageable._tls.pageable.copy(torch_, pageable._host_array(torch_, host, dtype)[0])

    monkeypatch.setattr(staging, "stage", fake_stage)
    as_tensor = staging._factory(torch, torch.as_tensor, lambda t, a, k: (torch.device("cpu"), k.get("dtype")),
                                 "as_tensor")
    tensor = staging._factory(torch, torch.tensor, lambda t, a, k: (torch.device("cpu"), k.get("dtype")), "tensor")
    a = np.arange(5, dtype=np.int64)
    x = as_tensor(a, device="cuda")
    a[:] = -1
    y = tensor([0.5, 1.5], device="cuda")
    z = as_tensor(np.array([1.0, 2.0]), dtype=torch.float32, device="cuda")
    assert x.dtype == torch.int64 and x.tolist() == [0, 1, 2, 3, 4]
    assert y.dtype == torch.get_default_dtype() and y.tolist() == [0.5, 1.5]
    assert z.dtype == torch.float32 and z.tolist() == [1.0, 2.0]
    line = sys._getframe().f_lineno
    assert [c[3] for c in calls] == [f"tests/test_autoapply_pageable.py:{line - 7}",
                                     f"tests/test_autoapply_pageable.py:{line - 5}",
                                     f"tests/test_autoapply_pageable.py:{line - 4}"]


def test_numpy_arrays_are_staged_as_pytorch_would_copy_them(stager):
    """A numpy array goes in as it is (its dtype; 0-d stays 0-d; a strided view copied in C
    order); object arrays are left to PyTorch (its own error)."""
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    for x in (a, a[:, 1], np.array(2.5), np.array([True, False])):
        out = pageable.stage(torch, x, torch.device("cpu"))
        assert out.shape == x.shape and out.dtype == torch.from_numpy(np.ascontiguousarray(x)).dtype
        assert np.array_equal(out.numpy(), x)
    assert pageable.stage(torch, np.array([1, "a"], dtype=object), torch.device("cpu")) is None


def test_take_copy_looks_for_hazards_only_where_it_could_take_the_copy(monkeypatch):
    """The default path (no slots for the thread, staging off) counts the copy as PyTorch's
    without looking at streams; where the copy could be taken, a hazard (a capture, a stream
    the script set) leaves it to PyTorch with that reason, before any slot or staging."""
    accounting.reset()
    dev = torch.device("cpu")
    monkeypatch.setattr(staging._tls, "copies", None, raising=False)
    monkeypatch.setitem(staging._state, "stage_pageable", False)
    monkeypatch.setattr(staging, "copy_hazard", lambda *a: pytest.fail("looked at streams"))
    assert staging._take_copy(torch, torch.ones(2), dev, None, "s.py:1") is None
    monkeypatch.setitem(staging._state, "stage_pageable", True)
    monkeypatch.setattr(staging, "copy_hazard", lambda *a: "a copy on a stream the script set")
    monkeypatch.setattr(staging, "stage", lambda *a, **k: pytest.fail("staged despite the hazard"))
    assert staging._take_copy(torch, torch.ones(2), dev, None, "s.py:2") is None
    rows = {r["site"]: r["reasons"] for r in accounting.sites()}
    assert rows == {"s.py:1": {pageable.LEFT_SYNCHRONOUS: 1}, "s.py:2": {"a copy on a stream the script set": 1}}
