"""The script hook's graphs per shape bucket, the parts that run without a GPU: the bucket of a
row count, which tensors are padded and with what, when a padded call's real rows count as
the unpadded call's, the bound per call site and the memory budget, the verification of a
padded call (a per-row model passes, a model that mixes rows turns padding off for its site),
and every model call counted at the script's line (``stats()["sites"]``).

CPU tensors stand in where the flow never reaches a capture (warm-up, bound, budget,
verification); capture and replay with padded rows are in ``tests/test_autoapply_gpu.py``."""

from __future__ import annotations

import operator
from collections import namedtuple

import pytest

from recsys_doctor.applying import _autoapply as hook
from recsys_doctor.applying._autoapply import accounting, buckets, graphs, modstate
from recsys_doctor.applying._autoapply.fallback import failure_reason, needs_host

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("n,want", [(0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (50, 64),
                                    (127, 128), (128, 128), (129, 256), (400, 512)])
def test_bucket_is_the_next_power_of_two(n, want):
    assert buckets.bucket_rows(n) == want


def test_rows_are_the_largest_leading_dimension():
    ts = [torch.zeros(1), torch.zeros(5, 3), torch.zeros(()), torch.zeros(5)]
    assert buckets.call_rows(ts) == 5
    assert buckets.row_tensors(ts, 5) == [False, True, False, True]
    assert buckets.call_rows([torch.zeros(())]) == 0


def test_padding_repeats_the_last_real_row():
    user, dense, items = torch.tensor([7]), torch.arange(15.0).reshape(5, 3), torch.tensor([4, 1, 9, 2, 6])
    pu, pd, pi = buckets.pad_rows(torch, [user, dense, items], 5, 8)
    assert pu is user  # one row: not a row tensor of a 5-row call
    assert pd.shape == (8, 3) and torch.equal(pd[:5], dense)
    assert torch.equal(pd[5:], torch.tensor([[12.0, 13.0, 14.0]] * 3))
    assert pi.tolist() == [4, 1, 9, 2, 6, 6, 6, 6]  # every padded value one of the script's own


def test_rows_must_differ_in_every_padded_tensor_to_verify():
    a, same = torch.arange(6.0).reshape(3, 2), torch.ones(3, 2)
    assert buckets.rows_differ(torch, [a, torch.tensor([1, 2, 1])], 3)
    assert not buckets.rows_differ(torch, [a, same], 3)  # a mean over `same`'s rows could not tell
    assert not buckets.rows_differ(torch, [torch.tensor([[1.0, 2.0]])], 1)


def test_outputs_are_cut_only_where_their_leading_dimension_is_the_bucket():
    assert buckets.cut_rows(torch.zeros(8, 2), 5, 8).shape == (5, 2)
    assert buckets.cut_rows(torch.zeros(4, 2), 5, 8).shape == (4, 2)
    assert buckets.cut_rows(torch.zeros(()), 5, 8).shape == ()


def test_same_rows():
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    xp = buckets.pad_rows(torch, [x], 5, 8)[0]
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        assert buckets.same_rows(torch, lin(x), lin(xp), 5, 8)
        # a tuple with a per-call scalar: the scalar must be equal too
        assert buckets.same_rows(torch, (lin(x), x.new_tensor(1.0)), (lin(xp), x.new_tensor(1.0)), 5, 8)
        # rows mixed: softmax over the batch, a mean over rows (each padded row repeats row 4)
        assert not buckets.same_rows(torch, x.softmax(0), xp.softmax(0), 5, 8)
        assert not buckets.same_rows(torch, x - x.mean(0), xp - xp.mean(0), 5, 8)
        # another structure, shape or dtype
        assert not buckets.same_rows(torch, (lin(x),), [lin(xp)], 5, 8)
        assert not buckets.same_rows(torch, x.sum(1), xp.sum(), 5, 8)
        assert not buckets.same_rows(torch, x.long(), xp, 5, 8)
        # dict and namedtuple outputs: compared leaf by leaf, their structures must match
        assert buckets.same_rows(torch, {"ctr": lin(x), "n": x.new_tensor(5.0)},
                                 {"ctr": lin(xp), "n": x.new_tensor(5.0)}, 5, 8)
        assert not buckets.same_rows(torch, {"a": lin(x)}, {"b": lin(xp)}, 5, 8)
        assert not buckets.same_rows(torch, {"a": x}, {"a": xp.softmax(0)}, 5, 8)
        Out = namedtuple("Out", "ctr cvr")
        assert buckets.same_rows(torch, Out(lin(x), x), Out(lin(xp), xp), 5, 8)
        assert not buckets.same_rows(torch, Out(lin(x), x), (lin(xp), xp), 5, 8)
    # integers exactly
    assert buckets.same_rows(torch, torch.tensor([1, 2]), torch.tensor([1, 2, 2, 2]), 2, 4)
    assert not buckets.same_rows(torch, torch.tensor([1, 2]), torch.tensor([1, 3, 2, 2]), 2, 4)
    # floats within the tolerance, not beyond
    assert buckets.same_rows(torch, torch.tensor([1.0]), torch.tensor([1.0 + 1e-7, 5.0]), 1, 2)
    assert not buckets.same_rows(torch, torch.tensor([1.0]), torch.tensor([1.0 + 1e-4, 5.0]), 1, 2)


def test_outputs_are_the_tensor_leaves_or_none():
    a, b = torch.zeros(2), torch.ones(3)
    assert buckets.outputs(torch, a) == (a,)
    got = buckets.outputs(torch, {"x": a, "y": [b, (a,)]})
    assert got is not None and [id(t) for t in got] == [id(a), id(b), id(a)]
    # plain immutable leaves (a count, a version string, None) stay in the structure, not listed
    assert buckets.outputs(torch, (a, 3)) == (a,) and buckets.outputs(torch, {"v": "2024-06", "s": b}) == (b,)
    assert buckets.outputs(torch, [a, None]) == (a,)
    assert buckets.plain_leaves(torch, {"v": "2024-06", "s": b, "n": [3, None]}) == ["2024-06", 3, None]
    # a leaf of another kind (a mutable object, a numpy array), or no tensor at all: not graphed
    assert buckets.outputs(torch, (a, [1, 2])) == (a,)  # (a list is a container: its items are plain)
    assert buckets.outputs(torch, (a, object())) is None and buckets.outputs(torch, (a, bytearray(b"x"))) is None
    assert buckets.outputs(torch, None) is None and buckets.outputs(torch, {}) is None
    assert buckets.outputs(torch, {"v": "x"}) is None


Scores = namedtuple("Scores", "ctr cvr")


@pytest.mark.parametrize("out", [
    torch.arange(8.0),
    (torch.arange(8.0), torch.arange(8)),
    [torch.arange(8.0), torch.arange(8)],
    {"ctr": torch.arange(8.0), "cvr": torch.arange(8.0) * 2, "b": torch.tensor(3.0)},
    Scores(torch.arange(8.0), torch.arange(8.0) + 1),
    {"tasks": [Scores(torch.arange(8.0), torch.arange(8.0)), None], "z": (torch.arange(8),)},
    (torch.arange(8.0), None),
    {"score": torch.arange(8.0), "model_version": "v7", "k": 3, "temperature": 0.5},
], ids=["tensor", "tuple", "list", "dict", "namedtuple", "nested", "tuple-with-None", "dict-with-plain-leaves"])
def test_a_replay_hands_out_the_structure_the_model_returns(out):
    """What graphs._clone_out makes of graphs._static_out: the same types, keys, order and
    values, each tensor a fresh copy; with rows (5 of 8), every 8-row tensor cut to 5."""
    from torch.utils._pytree import tree_flatten

    static = graphs._static_out(torch, out)
    want, want_spec = tree_flatten(out)
    for rows in (None, (5, 8)):
        got = graphs._clone_out(static, rows)
        assert type(got) is type(out)
        leaves, spec = tree_flatten(got)
        assert spec == want_spec
        for g, w in zip(leaves, want):
            if not isinstance(w, torch.Tensor):
                assert g == w and type(g) is type(w)  # (None, a string, a number: as captured)
                continue
            w = w[:5] if rows and w.dim() and w.shape[0] == 8 else w
            assert torch.equal(g, w) and g.data_ptr() != w.data_ptr()
    if isinstance(out, dict):
        assert list(graphs._clone_out(static)) == list(out)  # the dict's own key order


def test_an_output_holding_other_than_tensors_and_plain_values_is_not_graphed():
    with pytest.raises(TypeError, match="dict holding something other than tensors"):
        graphs._static_out(torch, {"ctr": torch.zeros(2), "cache": {3: object()}})


def test_padding_keeps_plain_leaves_only_where_they_are_the_same():
    """A plain leaf that a padded call changes (one counting the rows) turns padding off; a
    constant one (a version string) does not."""
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    xp = buckets.pad_rows(torch, [x], 5, 8)[0]
    assert buckets.same_rows(torch, {"s": x * 2, "v": "v7"}, {"s": xp * 2, "v": "v7"}, 5, 8)
    assert not buckets.same_rows(torch, {"s": x * 2, "n": 5}, {"s": xp * 2, "n": 8}, 5, 8)


class _OnGpu:
    """What :func:`graphs._key_part` reads of a CUDA tensor (its dtype, sizes, device), on the CPU."""

    def __init__(self, *shape, dtype=torch.float32):
        self.shape, self.dtype = torch.Size(shape), dtype

    def get_device(self):
        return 0


def _key(*args, **kwargs):
    """A call's key as :func:`graphs._key_or_reason` makes it, of :class:`_OnGpu` arguments."""
    tensors = []
    return 1234, (graphs._key_part(_OnGpu, args, tensors), graphs._key_part(_OnGpu, kwargs, tensors))


def test_keys_that_differ_in_sizes_alone_are_one_family():
    fam = buckets.family
    assert fam(_key(_OnGpu(8, 13), ids=_OnGpu(8, 4, dtype=torch.int64))) == \
        fam(_key(_OnGpu(128, 13), ids=_OnGpu(128, 4, dtype=torch.int64)))
    assert fam(_key(_OnGpu(8, 13, 20))) == fam(_key(_OnGpu(8, 13, 57)))  # (a sequence length)
    base = fam(_key(_OnGpu(8, 13), temperature=0.5))
    assert len({base, fam(_key(_OnGpu(8, 13), temperature=1.0)),  # a plain value
                fam(_key(_OnGpu(8, 13), temperature=0.5, topic=_OnGpu(8, 3))),  # an optional argument
                fam(_key(_OnGpu(8, 13, dtype=torch.float16), temperature=0.5)),  # a dtype
                fam(_key(_OnGpu(8, 13, 1), temperature=0.5))}) == 5  # a rank


def test_a_site_admits_at_most_the_bounds():
    s = buckets._Site()
    sizes = [_key(_OnGpu(n, 13)) for n in range(1, buckets.MAX_GRAPHS_PER_SITE + 2)]
    assert all(s.refused(k) is None for k in sizes[:-1])
    assert s.refused(sizes[-1]) == buckets.BOUND_REACHED
    assert s.refusals == {sizes[-1]: buckets.BOUND_REACHED}  # (remembered: its next calls look it up)
    assert s.refused(sizes[0]) is None  # one admitted before stays admitted
    assert len(s.keys) == buckets.MAX_GRAPHS_PER_SITE
    # other families, each with its own sizes, up to the families' bound
    others = [[_key(_OnGpu(n, 13), temperature=t) for n in (8, 16)] for t in range(buckets.MAX_FAMILIES_PER_SITE)]
    assert all(s.refused(k) is None for fam in others[:-1] for k in fam)
    assert s.refused(others[-1][0]) == buckets.FAMILIES_REACHED
    assert len(s.keys) == buckets.MAX_GRAPHS_PER_SITE + 2 * (buckets.MAX_FAMILIES_PER_SITE - 1)
    # a batching site's batch sizes: one family, given
    b = buckets._Site()
    assert all(b.refused((sizes[0], "batch", k), (buckets.family(sizes[0]), "batch")) is None
               for k in range(1, buckets.MAX_GRAPHS_PER_SITE + 1))
    assert b.refused((sizes[0], "batch", 99), (buckets.family(sizes[0]), "batch")) == buckets.BOUND_REACHED


def test_optional_features_and_two_temperatures_all_get_their_buckets():
    """optional_features_serve.py's calls: 4 sets of optional features, 2 temperatures, rows
    8-128 in 5 buckets: 40 keys, all admitted (one bound over all of them held 8)."""
    s = buckets._Site()
    keys = []
    for feats in ({}, {"topic": _OnGpu(1, 3)}, {"geo": _OnGpu(1, 2)}, {"topic": _OnGpu(1, 3), "geo": _OnGpu(1, 2)}):
        for t in (0.7, 1.0):
            for b in (8, 16, 32, 64, 128):
                keys.append(_key(_OnGpu(b, 13), **{k: _OnGpu(b, *v.shape[1:]) for k, v in feats.items()},
                                 temperature=t))
    assert len(set(keys)) == 40 and all(s.refused(k) is None for k in keys)


# ------------------------------------------------------------------------------ the flow on the CPU


@pytest.fixture
def group(hook_group):
    """A hooked thread's group (no stream: nothing here reaches a capture) and a fresh state (conftest)."""
    return hook_group


def _counts(site):
    rows = [s for s in accounting.sites() if s["kind"] == "model" and s["site"] == site]
    assert len(rows) == 1
    return rows[0]["taken_over"], rows[0]["fallback"], rows[0]["reasons"]


def test_calls_never_graphed_are_counted_with_the_reason(group):
    lin = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    want = lin(x)
    got = graphs._graphed_call(type(lin).__call__, lin, (x,), {}, "s.py:7")  # grad on, training mode
    lin.eval()
    with torch.no_grad():
        got2 = graphs._graphed_call(type(lin).__call__, lin, (x,), {}, "s.py:7")  # a CPU tensor
    assert torch.equal(got, want) and torch.equal(got2, want)
    assert _counts("s.py:7") == (0, 2, {graphs.GRAD_ON: 1, "not graphed: a CPU tensor argument": 1})


def _call(g, module, key, x, site="s.py:9"):
    s = graphs._site_of(g, module)
    return graphs._keyed_call(torch, g, s, type(module).__call__, module, (x,), {}, site, key, [x], (x,), {}, None)


def test_shapes_beyond_the_bound_run_eagerly_and_are_counted(group):
    lin = torch.nn.Linear(4, 2).eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = lin(x)
        for i in range(buckets.MAX_GRAPHS_PER_SITE + 3):  # (keys of one family, as sizes alone make them)
            assert torch.equal(_call(group, lin, _key(_OnGpu(i + 1, 4)), x), want)
    assert len(group.entries) == buckets.MAX_GRAPHS_PER_SITE
    assert _counts("s.py:9") == (0, buckets.MAX_GRAPHS_PER_SITE + 3,
                                 {buckets.WARMING_UP: buckets.MAX_GRAPHS_PER_SITE, buckets.BOUND_REACHED: 3})


def test_argument_families_beyond_their_bound_run_eagerly_and_are_counted(group):
    lin = torch.nn.Linear(4, 2).eval()
    x = torch.randn(3, 4)
    n = buckets.MAX_FAMILIES_PER_SITE
    with torch.no_grad():
        want = lin(x)
        for t in range(n + 2):  # a plain value that differs each call (a counter passed along)
            assert torch.equal(_call(group, lin, _key(_OnGpu(3, 4), step=t), x), want)
    assert len(group.entries) == n
    assert _counts("s.py:9") == (0, n + 2, {buckets.WARMING_UP: n, buckets.FAMILIES_REACHED: 2})


def test_no_capture_beyond_the_memory_budget(group, monkeypatch, capsys):
    monkeypatch.setitem(hook._state, "graph_bytes", buckets.GRAPH_MEMORY_BUDGET)
    lin = torch.nn.Linear(4, 2).eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(graphs.WARMUP_CALLS + 2):
            _call(group, lin, "k", x)
    e = group.entries["k"]
    assert e.graph is None and e.reason == buckets.BUDGET_SPENT and hook._state["captured"] == 0
    assert _counts("s.py:9") == (0, graphs.WARMUP_CALLS + 2,
                                 {buckets.WARMING_UP: graphs.WARMUP_CALLS, buckets.BUDGET_SPENT: 2})
    assert hook._state["fallbacks"] == [buckets.BUDGET_SPENT]
    assert capsys.readouterr().err.count(buckets.BUDGET_SPENT) == 1


def _verify(group, model, x, n, b, site="s.py:11"):
    s = graphs._site_of(group, model)
    xp = buckets.pad_rows(torch, [x], n, b)[0]
    with torch.no_grad():
        out = graphs._verify_padding(torch, s, type(model).__call__, model, (x,), {}, site, (xp,), {}, "pkey",
                                     [x], n, b)
    return s, out


class _SoftmaxOverBatch(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x.sum(1), dim=0)


def test_padding_of_a_per_row_model_is_verified(group):
    lin = torch.nn.Linear(4, 2).eval()
    for k in range(buckets.VERIFY_CALLS):
        x = torch.randn(5, 4)
        s, out = _verify(group, lin, x, 5, 8)
        with torch.no_grad():
            assert torch.equal(out, lin(x))  # the call's own result is the unpadded one
        assert s.padded_ok("pkey") == (k + 1 == buckets.VERIFY_CALLS) and s.no_pad is None
    assert _counts("s.py:11") == (0, buckets.VERIFY_CALLS, {buckets.VERIFYING: buckets.VERIFY_CALLS})


def test_a_model_that_mixes_rows_is_never_padded(group, capsys):
    m = _SoftmaxOverBatch()
    x = torch.randn(5, 4)
    s, out = _verify(group, m, x, 5, 8)
    assert torch.equal(out, m(x))
    assert not s.verified and s.no_pad == buckets.MIXES_ROWS
    assert hook._state["fallbacks"] == [buckets.MIXES_ROWS]
    assert buckets.MIXES_ROWS in capsys.readouterr().err


class _MinusSumOverRows(torch.nn.Module):
    def forward(self, x):
        return x - x.sum(0)


def test_a_sum_over_rows_is_caught_on_the_second_call(group):
    # copies of a last row of zeros leave the sum as it is: one call passes, the next fails
    m = _MinusSumOverRows()
    x = torch.tensor([[1.0, 2.0], [3.0, 5.0], [0.0, 0.0]])
    s, out = _verify(group, m, x, 3, 4)
    assert torch.equal(out, m(x)) and s.verified == {"pkey": 1} and not s.padded_ok("pkey")
    y = torch.tensor([[1.0, 2.0], [3.0, 5.0], [1.0, 1.0]])
    s, out = _verify(group, m, y, 3, 4)
    assert torch.equal(out, m(y)) and s.no_pad == buckets.MIXES_ROWS and not s.padded_ok("pkey")


def test_rows_all_equal_verify_nothing(group):
    m = _SoftmaxOverBatch()
    s, out = _verify(group, m, torch.ones(3, 4), 3, 4)
    assert not s.verified and s.no_pad is None  # the next padded call verifies
    assert torch.allclose(out, torch.full((3,), 1 / 3))


# ------------------------------------------------------------------------------ why a call is eager

MSG = "CUDA error: operation not permitted when stream is capturing\nduring aten::nonzero"


def _forward_that_fails():
    raise RuntimeError(MSG)


def test_failure_reason_names_the_op_and_the_scripts_line():
    try:
        _forward_that_fails()
    except RuntimeError as ex:
        reason = failure_reason(ex)
    line = _forward_that_fails.__code__.co_firstlineno + 1
    assert reason.startswith("RuntimeError: CUDA error: operation not permitted when stream is capturing (aten::nonzero; at ")
    assert reason.endswith(f"test_autoapply_buckets.py:{line}: raise RuntimeError(MSG))")
    # an exception never raised through the script's code: its first line alone
    assert failure_reason(ValueError("bad\nmore")) == "ValueError: bad"


def _end_capture():
    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")


def test_failure_reason_of_a_capture_ended_after_an_error_names_the_first():
    try:
        try:
            _forward_that_fails()
        finally:
            _end_capture()  # raised while the first is handled: the first is its __context__
    except RuntimeError as ex:
        reason = failure_reason(ex)
    line = _forward_that_fails.__code__.co_firstlineno + 1
    assert reason.startswith("RuntimeError: CUDA error: operation failed due to a previous error during capture; "
                             "first RuntimeError: CUDA error: operation not permitted when stream is capturing "
                             "(aten::nonzero; at ")
    assert reason.endswith(f"test_autoapply_buckets.py:{line}: raise RuntimeError(MSG))")


class _History(torch.nn.Module):
    """A sequence model as scripts write it: nn.TransformerEncoder over padded histories."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, batch_first=True), 1)

    def forward(self, x, mask):
        return self.enc(x, src_key_padding_mask=mask)


def test_failure_reason_names_pytorchs_line_under_the_scripts_and_a_known_way_out(monkeypatch):
    """A failure inside PyTorch's own Python (here its nested-tensor fast path, which on a GPU
    reads the mask on the host): the script's line, then PyTorch's line that made the failing
    call, then what keeps such a model capturable."""
    m = _History().eval()
    # a C function that fails on these arguments: no Python frame of its own under PyTorch's
    monkeypatch.setattr(torch, "_nested_tensor_from_mask", operator.truediv)
    x, mask = torch.randn(2, 3, 8), torch.tensor([[False, False, True], [False, False, False]])
    with torch.no_grad(), pytest.raises(TypeError) as ei:
        m(x, mask)
    reason = failure_reason(ei.value)
    line = _History.forward.__code__.co_firstlineno + 1
    assert f"test_autoapply_buckets.py:{line}: return self.enc(x, src_key_padding_mask=mask); " in reason
    assert "; in torch/nn/modules/transformer.py:" in reason and ": output = torch._nested_tensor_from_mask(" in reason
    assert "enable_nested_tensor" not in reason  # (a failure that does not need the host: no way out told)
    try:  # as a capture fails: CUDA's refusal, raised while the first failure is handled
        try:
            with torch.no_grad():
                m(x, mask)
        except TypeError:
            raise RuntimeError(MSG)  # noqa: B904 - its __context__ is the first failure, as in a capture
    except RuntimeError as ex:
        reason = failure_reason(ex)
    assert "; in torch/nn/modules/transformer.py:" in reason
    assert reason.endswith("TransformerEncoder(..., enable_nested_tensor=False) keeps it capturable)")
    # raised in the script's own line, with nothing of PyTorch's under it: no such part
    try:
        _forward_that_fails()
    except RuntimeError as ex:
        assert "; in " not in failure_reason(ex)


class _ReadsBack(torch.nn.Module):
    def forward(self, x):
        return x * float(x.sum().item())  # fails here


class _Branches(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def _needs_host_at(fn):
    """``fn()`` failing where it reads the host, with CUDA's refusal in a capture."""
    try:
        try:
            fn()
        except RuntimeError:
            raise RuntimeError(MSG)  # noqa: B904
    except RuntimeError as ex:
        return failure_reason(ex)


def test_a_host_read_in_the_scripts_forward_gets_its_way_out(monkeypatch):
    """Where the failing line of the script's forward reads a value back (``.item()``) or
    branches on one (``if``), the reason says what keeps such a call capturable."""
    from torch.utils import _pytree  # (a frame of PyTorch's own refuses, as the C++ under .item() would)

    space: dict = {}
    exec(compile("def refuse(*a, **k):\n    raise RuntimeError('CUDA error: operation not permitted when stream "
                 "is capturing')\n", _pytree.__file__, "exec"), space)
    refuse = space["refuse"]

    monkeypatch.setattr(torch.Tensor, "item", refuse)
    reason = _needs_host_at(lambda: _ReadsBack()(torch.ones(2)))
    assert "return x * float(x.sum().item())" in reason and "a value read back to the host inside forward" in reason
    monkeypatch.setattr(torch.Tensor, "__bool__", refuse)
    reason = _needs_host_at(lambda: _Branches()(torch.ones(2)))
    assert "if x.sum() > 0:" in reason and "a Python branch on a tensor's value reads it on the host" in reason
    assert "a value read back" not in reason


def test_what_needs_the_host_in_a_capture_is_told_from_other_failures():
    try:
        try:
            _forward_that_fails()
        finally:
            _end_capture()
    except RuntimeError as ex:
        assert needs_host(ex)  # the first failure of the chain said it
    assert needs_host(RuntimeError("CUDA error: operation would make the legacy stream depend on a capturing "
                                   "blocking stream"))
    assert not needs_host(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not needs_host(_end_capture_error())


def _end_capture_error():
    try:
        _end_capture()
    except RuntimeError as ex:
        return ex


def test_a_capture_that_needs_the_host_makes_every_later_call_of_its_module_eager(group, monkeypatch, capsys):
    """One capture of a model that reads a value on the host inside forward: no shape of it can be
    captured, so its module's record runs every later call eagerly (no capture tried per new
    shape, no graph's place taken); a capture that failed otherwise (out of memory) leaves it be."""
    def fails(*a):
        try:
            _forward_that_fails()
        finally:
            _end_capture()

    monkeypatch.setattr(graphs, "_capture", fails)
    monkeypatch.setattr(graphs, "_synchronize_quietly", lambda torch_: None)
    modstate.reset()
    try:
        lin, other = torch.nn.Linear(4, 2).eval(), torch.nn.Linear(4, 2).eval()
        x = torch.randn(3, 4)
        with torch.no_grad():
            assert modstate.check(torch, lin).eager is None
            for _ in range(graphs.WARMUP_CALLS + 1):
                assert torch.equal(_call(group, lin, "k", x), lin(x))
            rec = modstate.check(torch, lin)
            assert rec.eager.startswith(graphs.NEEDS_HOST + ": RuntimeError: CUDA error: operation failed due to")
            assert "operation not permitted when stream is capturing" in rec.eager
            # another group whose calls got past the record before it said so: no capture either
            from recsys_doctor.applying._autoapply.groups import _Group

            g2 = _Group(1, stream=None)
            monkeypatch.setattr(graphs, "_capture", lambda *a: pytest.fail("captured after the module went eager"))
            for _ in range(graphs.WARMUP_CALLS + 1):
                assert torch.equal(_call(g2, lin, "k", x, site="s.py:10"), lin(x))
            assert g2.entries["k"].reason == rec.eager
            assert _counts("s.py:10") == (0, graphs.WARMUP_CALLS + 1, {buckets.WARMING_UP: graphs.WARMUP_CALLS,
                                                                       rec.eager: 1})
            modstate.check(torch, other)
            monkeypatch.setattr(graphs, "_capture", lambda *a: (_ for _ in ()).throw(RuntimeError("CUDA out of memory")))
            for _ in range(graphs.WARMUP_CALLS + 1):
                _call(group, other, "k2", x)
            assert modstate.check(torch, other).eager is None and group.entries["k2"].reason.startswith("capture failed")
        err = capsys.readouterr().err
        assert err.count(graphs.NEEDS_HOST) == 1
    finally:
        modstate.reset()


class _FailsOnMoreRows(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] > 5:
            raise ValueError("no more than 5 rows")
        return x * 2


def test_a_model_that_fails_on_padded_rows_is_never_padded(group):
    m = _FailsOnMoreRows()
    x = torch.randn(5, 4)
    s, out = _verify(group, m, x, 5, 8)
    assert torch.equal(out, x * 2)
    line = _FailsOnMoreRows.forward.__code__.co_firstlineno + 2
    assert s.no_pad.startswith("padded rows fail: ValueError: no more than 5 rows (at ")
    assert s.no_pad.endswith(f"test_autoapply_buckets.py:{line}: raise ValueError(\"no more than 5 rows\"))")


# ------------------------------------------------------------------------------ the common row count


def test_the_common_row_count_is_graphed_at_its_own_shape():
    s = buckets._Site()
    k = buckets.COMMON_AFTER
    for _ in range(k - 1):
        s.seen(200)
        assert s.pads(200)  # too few calls to tell a common count from a first one
    s.seen(200)
    assert not s.pads(200)  # k of k calls: a graph of its own rows
    assert s.pads(37)  # a count seen on no call so far (a last partial batch) goes to its bucket
    for _ in range(k):
        s.seen(37)
    assert not s.pads(37) and not s.pads(200)  # k of 2k calls each: both at half, both common
    s.seen(37)
    assert not s.pads(37) and s.pads(200)  # k + 1 of 2k + 1 is over half; k is under it
    assert not s.pads(256)  # a bucket's own count is never padded
    s.no_pad = buckets.MIXES_ROWS
    assert not s.pads(37)  # padding off: exact shapes only


def test_row_counts_that_keep_changing_stay_padded_and_are_counted_within_a_bound():
    s = buckets._Site()
    for k in range(400):  # 50-249 rows, each count twice: none is half the calls
        s.seen(50 + k % 200)
    assert s.calls == 400 and len(s.rows) == buckets.MAX_ROW_COUNTS
    assert all(s.pads(n) for n in range(50, 250) if n not in (64, 128))


def test_a_call_of_the_common_row_count_goes_to_its_exact_shape(group, monkeypatch):
    """The flow of ``_graphed_call`` (CPU tensors standing in, the key and the graphed call
    recorded): the first calls of a 200-row batch go padded to 256 (its padding verified here
    already), from the ``COMMON_AFTER``-th on to the key of their own shape."""
    lin = torch.nn.Linear(4, 2).eval()
    monkeypatch.setattr(graphs, "_key_or_reason", lambda torch_, m, a, k, tag: (("key", a[0].shape[0]), [a[0]]))
    went = []
    monkeypatch.setattr(graphs, "_keyed_call", lambda *a: went.append((a[8], a[12])) or "graphed")
    monkeypatch.setattr(graphs, "_verify_padding", lambda *a: went.append(("verify", a[-1])) or "verified")
    s = graphs._site_of(group, lin)
    s.verified[("key", 256)] = buckets.VERIFY_CALLS  # (the 256-row bucket's padding verified already)
    with torch.no_grad():
        for _ in range(buckets.COMMON_AFTER + 1):
            graphs._graphed_call(type(lin).__call__, lin, (torch.randn(200, 4),), {}, "s.py:5")
    padded = [(("key", 256), (200, 256))] * (buckets.COMMON_AFTER - 1)
    assert went == padded + [(("key", 200), None)] * 2


class _Recorder:
    """A stand-in graph: its replay records what its inputs hold, and writes its output."""

    def __init__(self, e):
        self.e, self.seen = e, []

    def replay(self):
        self.seen.append([s.clone() for s in self.e.static_in])
        self.e.static_out.copy_(self.e.static_in[0][:, :1] * 10)


def test_a_padded_replay_copies_the_real_rows_and_repeats_the_last_one_into_the_graphs_inputs(group):
    """The steady state of a padded call (its padded key has a graph): no padded tensors are made;
    the call's 5 rows go into the 8-row static inputs, rows 5-7 copies of row 4; a tensor that is
    not padded (no leading dimension of 5) is copied whole. The expected inputs are written by hand."""
    e = graphs._Entry()
    e.static_in = [torch.full((8, 3), -1.0), torch.full((2,), -1.0)]
    e.static_out = torch.zeros(8, 1)
    e.graph = _Recorder(e)
    x = torch.arange(15.0).view(5, 3)
    w = torch.tensor([7.0, 9.0])
    for _ in range(2):  # the second time through the cached views
        out = graphs._replay(e, [x, w], (5, 8), pad=True)
        rows = x.tolist() + [x[4].tolist()] * 3
        assert e.graph.seen[-1][0].tolist() == rows and e.graph.seen[-1][1].tolist() == [7.0, 9.0]
        assert out.tolist() == [[0.0], [30.0], [60.0], [90.0], [120.0]]  # cut back to the call's 5 rows
    assert list(e.pad_views) == [5]


def test_a_padded_call_with_a_graph_takes_the_padded_replay(group, monkeypatch):
    """_graphed_call: once the padded key of (call key, bucket) is known, verified and graphed,
    a call of that key goes to its graph with the real rows, not through pad_rows."""
    lin = torch.nn.Linear(3, 1).eval()
    s = graphs._site_of(group, lin)
    x = torch.randn(5, 3)
    key = ("k", 5)
    s.pad_keys[(key, 8)] = "pkey"
    s.verified["pkey"] = buckets.VERIFY_CALLS
    e = group.entries["pkey"] = graphs._Entry()
    e.static_in, e.static_out = [torch.zeros(8, 3)], torch.zeros(8, 1)
    e.graph = _Recorder(e)
    s.keys.add("pkey")
    monkeypatch.setattr(graphs, "_key_or_reason", lambda *a: (key, [x]))
    monkeypatch.setattr(graphs, "pad_rows", lambda *a: pytest.fail("padded tensors made"))
    with torch.no_grad():
        out = graphs._graphed_call(type(lin).__call__, lin, (x,), {}, "s.py:21")
    assert torch.equal(e.graph.seen[0][0][:5], x) and torch.equal(e.graph.seen[0][0][5:], x[4:].expand(3, 3))
    assert out.shape == (5, 1) and _counts("s.py:21") == (1, 0, {})


# ------------------------------------------------------------------------------ index outputs

class _TopK(torch.nn.Module):
    """Scores its candidate rows and returns the indices of the best three: not one value per row."""

    def forward(self, x):
        return x.sum(1).topk(3).indices


def test_index_outputs_are_integer_outputs_that_are_not_per_row():
    x = torch.randn(5, 2)
    assert buckets.index_outputs(torch, _TopK()(x), 5)
    assert buckets.index_outputs(torch, (x.sum(1), x.sum(1).argmax()), 5)  # a 0-dim argmax beside the scores
    assert not buckets.index_outputs(torch, x.argmax(1), 5)  # one index per row: cut like any per-row output
    assert not buckets.index_outputs(torch, (x.sum(1), x.new_tensor(2.0)), 5)  # a float scalar: verified as before
    assert not buckets.index_outputs(torch, {"ctr": x[:, 0], "n": x.sum()}, 5)


def test_padding_would_put_a_copy_of_the_last_row_into_a_top_k():
    """Why index outputs are never padded: with the last real row among the best, its copies
    take the other places (indices >= n); with it elsewhere, padding changes nothing, so a
    verification on such calls passes."""
    m = _TopK()
    best_last = torch.tensor([[0.1, 0.0], [0.5, 0.0], [0.3, 0.0], [0.2, 0.0], [0.9, 0.0]])
    padded = buckets.pad_rows(torch, [best_last], 5, 8)[0]
    assert set(m(best_last).tolist()) == {1, 2, 4} and max(m(padded).tolist()) >= 5
    worst_last = best_last.flip(0)
    padded = buckets.pad_rows(torch, [worst_last], 5, 8)[0]
    assert buckets.same_rows(torch, m(worst_last), m(padded), 5, 8)  # the old verification passed here


def test_a_model_returning_top_k_indices_is_never_padded(group, capsys):
    m = _TopK().eval()
    s = graphs._site_of(group, m)
    x = torch.tensor([[0.9, 0.0], [0.5, 0.0], [0.3, 0.0], [0.2, 0.0], [0.1, 0.0]])  # last row not among the best
    px = buckets.pad_rows(torch, [x], 5, 8)[0]
    with torch.no_grad():
        out = graphs._verify_padding(torch, s, type(m).__call__, m, (x,), {}, "s.py:3", (px,), {}, "pk", [x], 5, 8)
    assert torch.equal(out, m(x))
    assert s.no_pad == buckets.INDEX_OUTPUT and "pk" not in s.verified
    assert buckets.INDEX_OUTPUT in capsys.readouterr().err
