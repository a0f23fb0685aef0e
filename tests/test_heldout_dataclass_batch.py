"""The dataclass-batch DLRM held-out script (examples/heldout/dataclass_batch_serve.py) on the CPU.

Its model takes one argument, a ``Batch`` dataclass whose tensors sit in its fields and in a
list of frozen ``SparseFeatures`` dataclasses, and returns a dict whose ``"ids"`` is one of
those input tensors passed through: a hook that looks for tensors only among positional
arguments sees none, and one that replays a graph hands back a static input buffer as an
output. Here its checksum is recomputed by hand in float64 numpy from the model's parameters
(each bag summed from its values and offsets, the MLPs, the pairwise dots in the model's order,
the sigmoid; never through ``forward``), and the dataclasses are shown to behave as written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_heldout_scripts import THREADS, TINY, _load

NAME = "dataclass_batch_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}


@pytest.fixture(scope="module")
def model():
    """The script's model as it builds it (``torch.manual_seed(seed)``, then the module)."""
    mod = _load(NAME)
    torch.manual_seed(0)
    return mod, mod.DLRM(ARGS["--vocab"]).eval()


def _requests(mod):
    return [mod.make_request(0, rid, ARGS["--vocab"], ARGS["--max-rows"]) for rid in range(ARGS["--queries"])]


def _hand_scores(net, batch) -> np.ndarray:
    """A request's scores in float64 from the parameters alone."""
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    relu = lambda a: np.maximum(a, 0.0)
    dense = batch.dense.numpy().astype(np.float64)
    n = dense.shape[0]
    x = relu(relu(dense @ p["bottom.0.weight"].T + p["bottom.0.bias"]) @ p["bottom.2.weight"].T + p["bottom.2.bias"])
    feats = [x]
    for k, f in enumerate(batch.sparse):
        values, offsets = f.values.numpy(), f.offsets.numpy()
        ends = np.append(offsets[1:], len(values))
        table = p[f"bags.{k}.weight"]
        feats.append(np.stack([table[values[s:e]].sum(0) for s, e in zip(offsets, ends)]))
    m = len(feats)
    dots = np.stack([(feats[i] * feats[j]).sum(1) for i in range(m) for j in range(i + 1, m)], axis=1)
    h = np.concatenate([x, dots], axis=1)
    h = relu(h @ p["top.0.weight"].T + p["top.0.bias"])
    h = relu(h @ p["top.2.weight"].T + p["top.2.bias"])
    logit = (h @ p["top.4.weight"].T + p["top.4.bias"])[:, 0]
    assert logit.shape == (n,)
    return 1.0 / (1.0 + np.exp(-logit))


def test_checksum_recomputed_by_hand(heldout_runs, model):
    """Every request scored by hand (no EmbeddingBag, no bmm, no forward), the top 10 candidate
    ids by a stable sort of the hand scores; the script's model agrees request by request, and
    the checksum is the same at every thread count."""
    mod, net = model
    scores, tops = [], []
    for batch in _requests(mod):
        s = _hand_scores(net, batch)
        with torch.inference_mode():
            ref = net(batch)["score"].numpy()
        np.testing.assert_allclose(ref, s, rtol=1e-5, atol=1e-6)
        scores.append(s)
        tops.append(batch.candidate_ids.numpy()[np.argsort(-s, kind="stable")[:mod.TOP]])
    assert all(len(t) == mod.TOP for t in tops)
    s, t = np.concatenate(scores), np.concatenate(tops).astype(np.float64)
    expected = float(s @ np.linspace(1.0, 2.0, s.size)) + 1e-6 * float(t @ np.linspace(1.0, 2.0, t.size))
    for th in THREADS:
        assert json.loads(heldout_runs[(NAME, th)][0])["checksum"] == pytest.approx(expected, rel=1e-6)


def test_the_batch_dataclasses_and_their_move(model):
    """``Batch.n`` is the row count (set in ``__post_init__``, not a constructor argument); a
    Batch moved with ``.to("cpu")`` is a new Batch with the same values; ``SparseFeatures`` is
    frozen; the row count and every field's values length change between requests (1-4 ids a
    row, the offsets each row's start)."""
    mod, _ = model
    reqs = _requests(mod)
    rows, lengths = set(), set()
    for b in reqs:
        assert b.n == b.dense.shape[0] == len(b.candidate_ids)
        assert min(32, ARGS["--max-rows"]) <= b.n <= ARGS["--max-rows"] and len(b.sparse) == mod.FIELDS
        for f in b.sparse:
            assert len(f.offsets) == b.n and f.offsets[0] == 0
            per_row = np.diff(np.append(f.offsets.numpy(), len(f.values)))
            assert per_row.min() >= 1 and per_row.max() <= mod.MAX_IDS
        moved = b.to("cpu")
        assert isinstance(moved, mod.Batch) and moved is not b and moved.n == b.n
        assert torch.equal(moved.dense, b.dense) and torch.equal(moved.candidate_ids, b.candidate_ids)
        assert all(isinstance(g, mod.SparseFeatures) and torch.equal(g.values, f.values)
                   and torch.equal(g.offsets, f.offsets) for f, g in zip(b.sparse, moved.sparse))
        rows.add(b.n)
        lengths.add(tuple(len(f.values) for f in b.sparse))
    assert len(rows) > 1 and len(lengths) == len(reqs)
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        reqs[0].sparse[0].values = torch.zeros(1, dtype=torch.long)
    with pytest.raises(TypeError):  # n is no constructor argument
        mod.Batch(dense=reqs[0].dense, sparse=reqs[0].sparse, candidate_ids=reqs[0].candidate_ids, n=1)


def test_the_model_returns_the_candidate_ids_unchanged(model):
    """The model's ``"ids"`` output is the request's own candidate ids, unchanged (the input
    tensor itself), beside one score a row."""
    mod, net = model
    for rid, b in enumerate(_requests(mod)[:6]):
        expected = mod.make_request(0, rid, ARGS["--vocab"], ARGS["--max-rows"]).candidate_ids.clone()
        with torch.inference_mode():
            out = net(b)
        assert set(out) == {"score", "ids"} and out["score"].shape == (b.n,)
        assert out["ids"] is b.candidate_ids and torch.equal(out["ids"], expected)
