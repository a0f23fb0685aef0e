"""The method-API held-out script (examples/heldout/method_api_serve.py) on the CPU.

Its ``Recommender`` is never called: its ``forward`` raises, and it is served through
``recommend(...)``, a method decorated with ``@torch.no_grad()`` that calls the user tower, the
item tower and the re-ranker (each a top-level module call), with a dot product, two
``torch.topk`` and gathers of its own between them and ``k`` a Python int. Here its JSON line is
checked (the same checksum and id checksum, exactly, at 1 and 3 threads), its requests are made
again from the docstring's description (not through the script's ``make_request``), its
checksum is recomputed in float64 numpy from the seeded parameters (the mean bag by indexing,
the Linear layers by matmuls, both top-k selections by ``argsort``), and the model is shown to
be served only through ``recommend``: ``forward`` raises, the script calls no model object
(its source read), and ``recommend``'s outputs do not require grad with gradients on.
"""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
from test_heldout_scripts import HELDOUT, THREADS, TINY, _tiny_run

NAME = "method_api_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, VOCAB = ARGS["--queries"], ARGS["--vocab"]
#: the sizes the docstring gives: embedding width, hidden width, shortlist, items returned
DIM, HIDDEN, SHORTLIST, K = 32, 64, 32, 10


def _request(seed: int, rid: int) -> tuple[np.ndarray, np.ndarray]:
    """Request ``rid`` as the docstring describes it: ``default_rng([seed, rid])``, then the
    history length (5..50), the history ids, the candidate count (64..256), the distinct
    candidate ids (``choice`` without replacement); (the offsets are one zero, not drawn)."""
    rng = np.random.default_rng([seed, rid])
    n_hist = rng.integers(5, 51)
    history = rng.integers(0, VOCAB, n_hist)
    n_cand = rng.integers(64, 257)
    candidates = rng.choice(VOCAB, n_cand, replace=False)
    return history, candidates


def _requests():
    return [_request(0, rid) for rid in range(QUERIES)]



@pytest.fixture(scope="module")
def model():
    """The script's module and its model as it builds it (``torch.manual_seed(seed)``, then the
    recommender); used for its seeded parameters and its methods only."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--vocab"]) == VOCAB
        net = mod.Recommender(VOCAB).eval()
    return mod, net


def _params(net) -> dict[str, np.ndarray]:
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    assert set(p) == {"user_tower.bag.weight", "item_tower.emb.weight"} | {
        f"{m}.{w}" for m in ("user_tower.fc1", "user_tower.fc2", "item_tower.proj", "reranker.0", "reranker.2")
        for w in ("weight", "bias")}
    assert p["user_tower.bag.weight"].shape == p["item_tower.emb.weight"].shape == (VOCAB, DIM)
    assert p["user_tower.fc1.weight"].shape == (HIDDEN, DIM) and p["user_tower.fc2.weight"].shape == (DIM, HIDDEN)
    assert p["item_tower.proj.weight"].shape == (DIM, DIM)
    assert p["reranker.0.weight"].shape == (HIDDEN, 3 * DIM) and p["reranker.2.weight"].shape == (1, HIDDEN)
    return p


def _hand_recommend(p: dict, history: np.ndarray, candidates: np.ndarray) -> dict[str, np.ndarray]:
    """One request ranked in float64 from the parameters alone: the user vector ``u``, the
    candidates' item vectors and dot-product ``scores``, the ``shortlist`` positions (best
    first), the re-ranker logits ``r`` of the shortlist, and the ``K`` best candidates' ``ids``
    and ``logits``, best first."""
    bag = p["user_tower.bag.weight"][history].mean(0)
    h = np.maximum(p["user_tower.fc1.weight"] @ bag + p["user_tower.fc1.bias"], 0.0)
    u = p["user_tower.fc2.weight"] @ h + p["user_tower.fc2.bias"]
    items = p["item_tower.emb.weight"][candidates] @ p["item_tower.proj.weight"].T + p["item_tower.proj.bias"]
    scores = items @ u
    pre = np.argsort(-scores, kind="stable")[:SHORTLIST]
    short = items[pre]
    ue = np.tile(u, (SHORTLIST, 1))
    x = np.concatenate([ue, short, ue * short], axis=1)
    r = (np.maximum(x @ p["reranker.0.weight"].T + p["reranker.0.bias"], 0.0) @ p["reranker.2.weight"].T
         + p["reranker.2.bias"])[:, 0]
    best = np.argsort(-r, kind="stable")[:K]
    return {"u": u, "items": items, "scores": scores, "pre": pre, "r": r,
            "ids": candidates[pre[best]], "logits": r[best]}


def _gap(values: np.ndarray, n: int) -> float:
    """How far the n-th largest of ``values`` is above the next one: the room a top-n selection
    has before rounding can swap which items it keeps."""
    v = np.sort(values)[::-1]
    return float(v[n - 1] - v[n])


def test_json_line_and_the_same_checksum_at_every_thread_count(heldout_json):
    """The keys of the JSON line; candidates_total is the candidate count of the requests made from
    the docstring; the checksum and the id checksum are exactly the same at 1 and 3 threads."""
    total = sum(len(c) for _, c in _requests())
    for t, r in heldout_json.items():
        assert set(r) == {"script", "qps", "p50_ms", "p99_ms", "threads", "queries", "candidates_total",
                          "id_checksum", "checksum"}
        assert r["script"] == "method_api_serve" and r["threads"] == t and r["queries"] == QUERIES
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["candidates_total"] == total
        assert isinstance(r["id_checksum"], int) and isinstance(r["checksum"], float)
        assert np.isfinite(r["checksum"]) and r["checksum"] != r["id_checksum"]
    assert heldout_json[1]["checksum"] == heldout_json[3]["checksum"]
    assert heldout_json[1]["id_checksum"] == heldout_json[3]["id_checksum"]


def test_requests_are_as_the_docstring_says(model):
    """The script's own requests are the arrays made from the docstring (and a one-zero offsets
    array); the candidates are distinct, their count changes from request to request within
    64..256, and the history lengths within 5..50."""
    mod, _ = model
    counts = set()
    for rid, (history, candidates) in enumerate(_requests()):
        h, o, c = mod.make_request(0, rid, VOCAB)
        assert h.dtype == c.dtype == o.dtype == np.int64
        assert np.array_equal(h, history) and np.array_equal(c, candidates) and o.tolist() == [0]
        assert 5 <= len(history) <= 50 and 64 <= len(candidates) <= 256
        assert len(np.unique(candidates)) == len(candidates) and candidates.max() < VOCAB
        counts.add(len(candidates))
    assert len(counts) > QUERIES // 2


def test_checksum_recomputed_by_hand(heldout_json, model):
    """Every request made again from the docstring and ranked by hand in float64 from the seeded
    parameters; the id checksum agrees exactly, the checksum's score part (checksum less id
    checksum) to float32 rounding. The model's ``recommend``, called the handler's way, agrees
    request by request (the check on the hand math only).

    The script ranks in float32 and the hand in float64, so at a top-k boundary two scores within
    rounding of each other could keep different items in the two (a tie: the candidates are
    distinct ids, so no two candidates share a score by being one item). For every request, the
    gap at each boundary (the 32nd dot-product score above the 33rd, the 10th re-ranker logit
    above the 11th) is shown to be more than twice the largest float32-vs-float64 difference of
    those scores (the towers and the re-ranker run in float32 on the same inputs): so both keep
    the same items, and the ids can be compared exactly, the logits to rounding. (With the TINY
    sizes and seed 0 the smallest gap is ~9e-5, the largest difference ~2e-7.)"""
    mod, net = model
    p = _params(net)
    assert net.shortlist == SHORTLIST
    id_sum, score_sum, room = 0, 0.0, []
    with torch.inference_mode():
        for rid, (history, candidates) in enumerate(_requests()):
            hand = _hand_recommend(p, history, candidates)
            h, o, c = torch.as_tensor(history), torch.zeros(1, dtype=torch.long), torch.from_numpy(candidates)
            # float32 scores of the same inputs: the dot products of all candidates, the re-ranker
            # logits of the hand's shortlist
            u32, items32 = net.user_tower(h, o), net.item_tower(c)
            s32 = (u32 @ items32.T)[0].double().numpy()
            short32 = items32[torch.from_numpy(hand["pre"])]
            ue32 = u32.expand(SHORTLIST, DIM)
            r32 = net.reranker(torch.cat([ue32, short32, ue32 * short32], 1))[:, 0].double().numpy()
            err_s, err_r = np.abs(s32 - hand["scores"]).max(), np.abs(r32 - hand["r"]).max()
            gap_s, gap_r = _gap(hand["scores"], SHORTLIST), _gap(hand["r"], K)
            assert gap_s > 2 * err_s and gap_r > 2 * err_r, (rid, gap_s, err_s, gap_r, err_r)
            room.append(min(gap_s / err_s, gap_r / err_r))
            top_ids, top_scores = net.recommend(h, o, c, K)
            assert top_ids.dtype == torch.int64 and top_scores.dtype == torch.float32
            assert top_ids.tolist() == hand["ids"].tolist()
            np.testing.assert_allclose(top_scores.numpy(), hand["logits"], rtol=1e-5, atol=1e-6)
            id_sum += (rid + 1) * int(hand["ids"].sum())
            score_sum += (rid + 1) * float(hand["logits"].sum())
    assert min(room) > 10, min(room)  # (far from a swap, not barely)
    print(f"smallest gap / largest float32 difference over the requests: {min(room):.0f}")
    for r in heldout_json.values():
        assert r["id_checksum"] == id_sum
        # the score part: 240 float32 logits of ~0.1, weighted up to 24, summed with cancellation
        # (~3 in all): float32 rounding leaves a few 1e-6 of it, so an absolute tolerance
        assert r["checksum"] - r["id_checksum"] == pytest.approx(score_sum, rel=1e-5, abs=1e-4)
        assert r["checksum"] == pytest.approx(id_sum + score_sum, rel=0, abs=1e-4)


def test_served_only_through_recommend_under_no_grad(heldout_json, model):
    """``Recommender.forward`` raises, yet the heldout_json succeeded: the script never calls the model
    object (nor is a call of any name holding it in its source: only ``model.recommend(...)``,
    and ``recommend`` calls the three submodules). ``recommend`` is decorated with
    ``@torch.no_grad()`` in its source, and called with gradients on its outputs do not require
    grad, while the same towers called directly do."""
    mod, net = model
    assert set(heldout_json) == set(THREADS)
    history, candidates = _request(0, 0)
    h, o, c = torch.as_tensor(history), torch.zeros(1, dtype=torch.long), torch.from_numpy(candidates)
    with pytest.raises(NotImplementedError, match="recommend"):
        net(h, o, c, K)
    tree = ast.parse((HELDOUT / NAME).read_text())
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert not any(isinstance(f, ast.Name) and f.id in ("model", "net") for f in calls)
    served = [f for f in calls if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
              and f.value.id == "model"]
    assert [f.attr for f in served] == ["recommend"]
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Recommender")
    rec = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "recommend")
    assert [ast.unparse(d) for d in rec.decorator_list] == ["torch.no_grad()"]
    inner = {ast.unparse(n.func) for n in ast.walk(rec) if isinstance(n, ast.Call)}
    assert {"self.user_tower", "self.item_tower", "self.reranker"} <= inner
    with torch.enable_grad():
        assert torch.is_grad_enabled()
        top_ids, top_scores = net.recommend(h, o, c, K)
        assert torch.is_grad_enabled()  # (restored after the method)
        assert not top_scores.requires_grad and top_scores.grad_fn is None
        assert top_ids.shape == top_scores.shape == (K,)
        assert net.user_tower(h, o).requires_grad and net.item_tower(c).requires_grad
