"""A thread graph's outputs lent to the script instead of cloned (:mod:`._autoapply.lentout`), checked
without a GPU: CPU tensors stand in for the static outputs and a function that rewrites them for the
replay. Whatever the script keeps of an output - the tensor, a view of it, ``.detach()`` of it - must
keep the values of the query that made it, as a clone would; a script that keeps nothing gets the same
objects back every replay, with no clone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import lentout  # noqa: E402
from recsys_doctor.applying._autoapply._common import _state  # noqa: E402
from recsys_doctor.applying._autoapply.thread_graphs import _thread_replay  # noqa: E402


class _Graph:
    """A graph stand-in: each replay writes the next query's values into the static outputs."""

    def __init__(self, outs):
        self.outs, self.n = outs, 0

    def replay(self):
        self.n += 1
        for j, o in enumerate(self.outs):
            with torch.inference_mode(o.is_inference()):  # (a real replay writes device memory, whatever the mode)
                o.fill_(100 * self.n + j)


def _tg(outs, single=True):
    static = outs[0] if single else tuple(outs)
    tg = SimpleNamespace(graph=_Graph(outs), replays=0, static_out=static, lent=lentout.lend(torch, static))
    return tg


def _query(tg):
    """One call as :func:`.thread_graphs._copies_call` makes it: replayed only when the lent outputs
    are ready, else (a miss) its output computed as eager would, here the next values directly."""
    _state.setdefault("thread_replays", 0)
    _state.setdefault("outputs_lent", 0)
    if tg.lent is None or tg.lent.ready():
        return _thread_replay(tg), True
    tg.graph.n += 1  # the eager call: this query's values, in fresh memory
    n = tg.graph.n
    outs = [torch.full_like(o, 100 * n + j) for j, o in enumerate(tg.graph.outs)]
    return (outs[0] if isinstance(tg.static_out, torch.Tensor) else tuple(outs)), False


def _want(n, j=0):
    return float(100 * n + j)


def test_a_script_that_keeps_nothing_gets_the_same_object_and_no_clone():
    tg = _tg([torch.zeros(4, 3)])
    before = _state.get("outputs_lent", 0)
    firsts = []
    for n in range(1, 6):
        out, replayed = _query(tg)
        assert replayed and out.eq(_want(n)).all()
        assert out.data_ptr() == tg.static_out.data_ptr()  # the graph's own memory, not a clone
        firsts.append(id(out))
        del out
    assert len(set(firsts)) == 1 and _state["outputs_lent"] == before + 5 and not tg.lent.off


def test_a_kept_output_keeps_its_values_and_later_replays_clone():
    tg = _tg([torch.zeros(4, 3)])
    kept = []
    for _ in range(6):
        out, replayed = _query(tg)
        assert replayed
        kept.append(out)
    # every kept output has its own query's values: the second replay moved the first into memory
    # of its own before overwriting the static output; from then on each replay is a clone
    assert [float(k[0, 0]) for k in kept] == [_want(n) for n in range(1, 7)]
    assert tg.lent.off and kept[0].data_ptr() != tg.static_out.data_ptr()
    assert all(k.data_ptr() != tg.static_out.data_ptr() for k in kept)


@pytest.mark.parametrize("derive", ["view", "detach", "slice_of_tuple"])
def test_a_kept_view_holds_the_replays_back_until_it_is_gone(derive):
    single = derive != "slice_of_tuple"
    tg = _tg([torch.zeros(4, 3), torch.zeros(4)], single=single) if not single else _tg([torch.zeros(4, 3)])
    out, replayed = _query(tg)
    assert replayed
    first = out if single else out[0]
    kept = first[:, 1] if derive != "detach" else first.detach()
    del out, first
    for n in range(2, 5):  # while the view lives, no replay may overwrite its memory
        got, replayed = _query(tg)
        assert not replayed
        g0 = got if single else got[0]
        assert g0.eq(_want(n)).all() and kept.eq(_want(1)).all()
        del got, g0
    del kept
    out, replayed = _query(tg)  # the view gone: replays (lending) again
    assert replayed and (out if single else out[0]).eq(_want(5)).all() and not tg.lent.off


@pytest.mark.parametrize("export", ["to_dlpack", "__dlpack__"])
def test_a_dlpack_export_holds_the_replays_back_like_a_view(export):
    """A DLPack export holds the alias's tensor, not a new reference to its memory (its storage's
    use count does not move): the tensor's own use count must show it, or the next replay would
    overwrite what the consumer (CuPy, JAX) reads."""
    from torch.utils import dlpack

    tg = _tg([torch.zeros(4, 3)])
    out, replayed = _query(tg)
    assert replayed
    cap = dlpack.to_dlpack(out) if export == "to_dlpack" else out.__dlpack__()
    del out  # (the script keeps only the export)
    for n in range(2, 4):
        got, replayed = _query(tg)
        assert not replayed and got.eq(_want(n)).all()
        del got
    held = torch.from_dlpack(cap)  # the consumer's array: still the first query's values
    assert held.eq(_want(1)).all()
    del cap, held
    out, replayed = _query(tg)  # the export gone: lent again
    assert replayed and out.eq(_want(4)).all() and not tg.lent.off


def test_an_output_read_by_address_is_not_moved_while_the_script_holds_it():
    """An array made from ``__cuda_array_interface__`` (CuPy's ``asarray``) keeps the tensor and reads
    its memory by address: a lent output whose interface was read, still held at the next call, holds
    the replays back (its memory is not moved from under that address). The property marks the tensor
    (here on the CPU it then raises, as PyTorch's does for a CPU tensor)."""
    prop = lentout.exported_property(torch.Tensor.__dict__["__cuda_array_interface__"])
    tg = _tg([torch.zeros(4, 3)])
    out, replayed = _query(tg)
    assert replayed
    with pytest.raises((TypeError, AttributeError, RuntimeError)):
        prop.__get__(out, torch.Tensor)
    ptr = out.data_ptr()
    for n in range(2, 4):
        got, replayed = _query(tg)
        assert not replayed and got.eq(_want(n)).all() and out.data_ptr() == ptr and out.eq(_want(1)).all()
        del got
    del out
    out, replayed = _query(tg)
    assert replayed and out.eq(_want(4)).all()


def test_the_hook_patches_the_interface_property_and_puts_it_back():
    from recsys_doctor.applying import _autoapply as hook
    from recsys_doctor.applying._autoapply import interception

    orig = torch.Tensor.__dict__["__cuda_array_interface__"]
    hook.activate({"runtime": {"groups": 1, "cuda_graphs": True}})
    try:
        interception._patch_thread_copies(torch)
        assert torch.Tensor.__dict__["__cuda_array_interface__"] is not orig
    finally:
        hook.deactivate()
    assert torch.Tensor.__dict__["__cuda_array_interface__"] is orig


def test_tuple_outputs_are_lent_together_and_any_kept_one_is_moved():
    tg = _tg([torch.zeros(2, 2), torch.zeros(3)], single=False)
    a, b = _query(tg)[0]
    assert a.eq(_want(1, 0)).all() and b.eq(_want(1, 1)).all()
    keep_b = b
    del a, b
    (a2, b2), replayed = _query(tg)
    assert replayed and a2.eq(_want(2, 0)).all() and b2.eq(_want(2, 1)).all()
    assert keep_b.eq(_want(1, 1)).all() and tg.lent.off  # moved, with its values, before the replay
    t, _ = _query(tg)
    assert type(t) is tuple and t[0].data_ptr() != tg.static_out[0].data_ptr()  # clones now


def test_outputs_sharing_one_memory_are_lent_and_checked_together():
    base = torch.zeros(4, 2)
    tg = _tg([base[:, 0], base[:, 1]], single=False)
    for n in range(1, 4):
        (x, y), replayed = _query(tg)
        assert replayed and x.eq(_want(n, 0)).all() and y.eq(_want(n, 1)).all()
        del x, y
    x, y = _query(tg)[0]
    v = y[1:]  # a view of the shared memory, kept
    del x, y
    got, replayed = _query(tg)
    assert not replayed and v.eq(_want(4, 1)).all()


def test_inference_mode_outputs_are_lent_only_in_inference_mode():
    with torch.inference_mode():
        static = torch.zeros(3)
    tg = _tg([static])
    assert tg.lent.aliases[0].is_inference()
    with torch.inference_mode():
        out, _ = _query(tg)
        assert out is tg.lent.aliases[0] and out.is_inference()
        del out
    with torch.no_grad():
        out, _ = _query(tg)  # a clone made here is a normal tensor, so the replay clones
        assert out is not tg.lent.aliases[0] and not out.is_inference()


def test_what_is_not_lent():
    assert lentout.lend(torch, {"a": torch.zeros(2)}) is None
    assert lentout.lend(torch, (torch.zeros(2), 3)) is None
    assert lentout.lend(torch, torch.nn.Parameter(torch.zeros(2), requires_grad=False)) is None
    assert lentout.lend(torch, ()) is None
    mp = pytest.MonkeyPatch()
    mp.setattr(lentout, "LEND", False)
    try:
        tg = _tg([torch.zeros(2)])
        assert tg.lent is None
        out, _ = _query(tg)
        assert out.data_ptr() != tg.static_out.data_ptr()  # a clone
    finally:
        mp.undo()
