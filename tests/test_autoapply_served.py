"""The CPU-testable parts of the hook's route to the runtime's batching (:mod:`._autoapply.served`):
the host-backed output type (read back with no copy to the device; any other use copies it there
first) and :func:`settle` (a routed query's input views the script still holds get their copy,
the others are left unwritten). ``meta`` stands for the GPU: no data, so a copy to it is visible
only as the materialized tensor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import served  # noqa: E402
from recsys_doctor.applying._autoapply.deferred import settle  # noqa: E402
from recsys_doctor.applying._autoapply.staging import _ThreadCopies, _ThreadGraph  # noqa: E402

META = torch.device("meta")


def _out(values):
    typ = served.host_output_type(torch)
    host = torch.tensor(values, dtype=torch.float32)
    return typ(host, META, None), host


def test_reading_back_needs_no_device_copy():
    x, host = _out([[0.25], [0.5], [1.5]])
    assert x.device == META and x.shape == (3, 1) and x.dtype == torch.float32 and x.is_meta
    got = x.cpu()
    assert got.device.type == "cpu" and torch.equal(got, host)
    assert got is not host and got.data_ptr() != host.data_ptr()  # a copy: the caller may write it
    assert torch.equal(x.to("cpu"), host) and x.tolist() == [[0.25], [0.5], [1.5]]
    assert (x.cpu().numpy() == host.numpy()).all()
    assert torch.equal(x.to(device="cpu", dtype=torch.float32), host)
    assert x._rd_dev is None  # none of these copied it to the device
    one, _ = _out([2.75])
    assert one.item() == 2.75 and one._rd_dev is None


def test_any_other_use_copies_to_the_device_first():
    x, _host = _out([[1.0, 2.0], [3.0, 4.0]])
    y = x * 2
    assert type(y) is torch.Tensor and y.device == META and y.shape == (2, 2)
    assert x._rd_dev is not None and x._rd_dev.device == META
    # a cast on the device is a device operation
    x2, _ = _out([1.0])
    w = x2.to(torch.float64)
    assert w.device == META and x2._rd_dev is not None


def _routed(n: int):
    st = _ThreadCopies(None)
    src = [torch.full((4,), float(i + 1)) for i in range(n)]
    tin = [torch.zeros(4) for _ in range(n)]
    tg = _ThreadGraph(None, None, src, tin, None, None, 0)
    tg.handed = [t.view(-1) for t in tin]
    st.tg, st.routed = tg, True
    return st, tg


def test_settle_copies_only_the_views_the_script_still_holds():
    st, tg = _routed(3)
    kept = tg.handed[1]  # the script's name for its second input copy
    settle(torch, st)
    assert torch.equal(kept, torch.full((4,), 2.0))
    assert torch.equal(tg.tin[0], torch.zeros(4)) and torch.equal(tg.tin[2], torch.zeros(4))
    assert st.routed is False
    tg.tin[1].zero_()
    settle(torch, st)  # once a query: nothing more to do
    assert torch.equal(kept, torch.zeros(4))


def test_settle_without_a_routed_call_does_nothing():
    st, tg = _routed(2)
    st.routed = False
    kept = tg.handed[0]
    settle(torch, st)
    assert torch.equal(kept, torch.zeros(4))


def test_raw_call_knows_a_copy_again_only_from_plain_arguments():
    from recsys_doctor.applying._autoapply.pageable import Move
    from recsys_doctor.applying._autoapply.pageable import raw_call

    orig = torch.Tensor.to
    m0 = Move(torch.device("cuda", 0), None, True, False, None)
    m2 = Move(torch.device("cuda", 2), None, True, False, None)
    # "cuda" names no index: the current device's (0 here) is remembered, to be checked again
    assert raw_call(torch, orig, ("cuda",), {"non_blocking": True}, m0) == (orig, ("cuda",), {"non_blocking": True}, 0)
    # an index named in the call: nothing to check again
    assert raw_call(torch, orig, ("cuda:2",), {"non_blocking": True}, m2)[3] is None
    assert raw_call(torch, orig, (torch.device("cuda", 2),), {"non_blocking": True}, m2)[3] is None
    assert raw_call(torch, orig, (2, None, True), {}, m2)[3] is None
    assert raw_call(torch, orig, (torch.device("cuda"), torch.float32), {}, m0)[3] == 0
    # a tensor argument (``to(other)``): compared by value it would not say the same copy
    assert raw_call(torch, orig, (torch.zeros(1),), {"non_blocking": True}, m0) is None
    assert raw_call(torch, orig, ("cuda",), {}, None) is None  # not a copy to the GPU


def test_copy_sources_maps_a_calls_tensors_to_this_querys_copies():
    import weakref

    from recsys_doctor.applying._autoapply.thread_graphs import copy_sources

    srcs = [torch.zeros(2), torch.ones(3), torch.full((1,), 7.0)]
    outs = [s.clone() for s in srcs]  # (what each .to() returned)
    recent = [(weakref.ref(o), weakref.ref(s), f"move{i}", f"raw{i}", f"s.py:{10 + i}")
              for i, (o, s) in enumerate(zip(outs, srcs))]
    got = copy_sources(recent, [outs[2], outs[0]])  # the call's order, not the copies'
    assert got is not None
    src, moves, raws, lines = got
    assert src[0] is srcs[2] and src[1] is srcs[0] and moves == ["move2", "move0"] and raws == ["raw2", "raw0"]
    assert lines == ["s.py:12", "s.py:10"]
    # a tensor the thread did not copy just before: not learned
    assert copy_sources(recent, [outs[0], torch.zeros(2)]) is None
    # a copy whose source is gone (weak references): not learned either
    del srcs[1]
    gone = [(weakref.ref(outs[1]), weakref.ref(torch.ones(3)), "m", "r", "s.py:11")]
    assert copy_sources(gone, [outs[1]]) is None


def test_same_call_compares_values_and_types():
    from recsys_doctor.applying._autoapply.pageable import Move, raw_call, same_call

    m0 = Move(torch.device("cuda", 0), None, True, False, None)
    raw = raw_call(torch, torch.Tensor.to, ("cuda",), {"non_blocking": True}, m0)
    assert same_call(raw, ("cuda",), {"non_blocking": True})
    assert same_call(raw, ("cu" + "da",), {"non_blocking": True})  # equal, not the same object
    assert not same_call(raw, ("cuda",), {"non_blocking": 1})  # PyTorch refuses this one: never taken over
    assert not same_call(raw, ("cuda",), {})
    assert not same_call(raw, ("cuda", None), {"non_blocking": True})
    assert not same_call(raw, ("cuda",), {"non_blocking": True, "copy": False})
    rd = raw_call(torch, torch.Tensor.to, (torch.device("cuda", 0),), {}, m0)
    assert same_call(rd, (torch.device("cuda", 0),), {}) and not same_call(rd, (0,), {})


def test_any_use_of_a_routed_output_settles_its_querys_held_views():
    """An output whose call the runtime served, used anywhere (here inside a list, as
    ``torch.stack`` takes it, not as the first argument), first gives the query's input views
    the script still holds their copies."""
    st, tg = _routed(2)
    kept = tg.handed[0]
    typ = served.host_output_type(torch)
    out = typ(torch.tensor([1.0, 2.0]), META, st)
    y = torch.stack([out, out])
    assert y.shape == (2, 2) and y.device == META
    assert torch.equal(kept, torch.full((4,), 1.0)) and st.routed is False
