"""The optional-features held-out script (examples/heldout/optional_features_serve.py) on the CPU.

Its ranker takes keyword-only features, two of them optional (``history`` with
``history_len``, and ``context``) and simply absent from a request's features dict when
missing, a Python float ``temperature`` keyword (2.0 for every 10th request), and returns a
dict with a string leaf (``model_version``); requests are served from asyncio through
``asyncio.to_thread``. Here its JSON line is checked (the same checksum, exactly, at 1 and 3
threads), its requests are made again from the docstring's description (not through the
script's ``make_request``) and both sides of each optional feature are shown to occur in the
tiny run, its checksum is recomputed in float64 numpy from the seeded parameters (embedding
lookups by indexing, the masked history mean by hand, the Linear layers by matmuls, the
sigmoid), and the optional features and the temperature are shown to change the scores.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from test_heldout_scripts import TINY, _tiny_run

NAME = "optional_features_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, VOCAB, MAX_ROWS = ARGS["--queries"], ARGS["--vocab"], ARGS["--max-rows"]
#: the sizes the docstring gives: dense features, context features, embedding width, history positions
DENSE, CONTEXT, DIM, H = 13, 4, 32, 20
VERSION = "ranker-2024.06"


def _request(seed: int, rid: int) -> tuple[dict[str, np.ndarray], float]:
    """Request ``rid`` as the docstring describes it: ``default_rng([seed, rid])``, then the row
    count (8..max_rows), user ids, item ids, dense (float32), a uniform draw (history when below
    0.6: ids [rows, 20], lengths 1..20, padded with 0 past each length), a uniform draw (context
    when below 0.5: [rows, 4] float32); temperature 2.0 when ``rid % 10 == 0``, else 1.0."""
    rng = np.random.default_rng([seed, rid])
    rows = rng.integers(8, MAX_ROWS + 1)
    req = {
        "user_id": rng.integers(0, VOCAB, rows),
        "item_ids": rng.integers(0, VOCAB, rows),
    }
    req["dense"] = rng.standard_normal((rows, DENSE)).astype(np.float32)
    if rng.random() < 0.6:
        req["history"] = rng.integers(0, VOCAB, (rows, H))
        req["history_len"] = rng.integers(1, H + 1, rows)
        for r in range(rows):
            req["history"][r, req["history_len"][r] :] = 0
    if rng.random() < 0.5:
        req["context"] = rng.standard_normal((rows, CONTEXT)).astype(np.float32)
    return req, (2.0 if rid % 10 == 0 else 1.0)


def _requests():
    return [_request(0, rid) for rid in range(QUERIES)]



@pytest.fixture(scope="module")
def model():
    """The script's module and its model as it builds it (``torch.manual_seed(seed)``, then the ranker)."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--vocab"]) == VOCAB
        net = mod.OptionalFeatureRanker(VOCAB).eval()
    return mod, net


def _params(net) -> dict[str, np.ndarray]:
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    assert set(p) == {"user_emb.weight", "item_emb.weight", "cold_user"} | {
        f"{m}.{w}"
        for m in ("context_proj", "dense_proj", "mlp.0", "mlp.2")
        for w in ("weight", "bias")
    }
    assert p["user_emb.weight"].shape == p["item_emb.weight"].shape == (VOCAB, DIM)
    assert p["context_proj.weight"].shape == (DIM, CONTEXT) and p[
        "dense_proj.weight"
    ].shape == (DIM, DENSE)
    assert p["mlp.0.weight"].shape == (64, 4 * DIM) and p["mlp.2.weight"].shape == (
        1,
        64,
    )
    return p


def _hand_logits(p: dict, req: dict) -> np.ndarray:
    """[rows] logits at temperature 1 in float64 from the parameters alone."""
    rows = len(req["user_id"])
    user = p["user_emb.weight"][req["user_id"]]
    if "context" in req:
        user = (
            user
            + req["context"].astype(np.float64) @ p["context_proj.weight"].T
            + p["context_proj.bias"]
        )
    item = p["item_emb.weight"][req["item_ids"]]
    if "history" in req:
        hist = np.zeros((rows, DIM))
        for r in range(rows):
            n = int(req["history_len"][r])
            hist[r] = p["item_emb.weight"][req["history"][r, :n]].sum(0) / n
    else:
        hist = np.tile(p["cold_user"], (rows, 1))
    dense = (
        req["dense"].astype(np.float64) @ p["dense_proj.weight"].T
        + p["dense_proj.bias"]
    )
    x = np.concatenate([user, item, hist, dense], axis=1)
    h = np.maximum(x @ p["mlp.0.weight"].T + p["mlp.0.bias"], 0.0)
    return (h @ p["mlp.2.weight"].T + p["mlp.2.bias"])[:, 0]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def test_json_line_and_the_same_checksum_at_every_thread_count(heldout_json):
    keys = {
        "script",
        "qps",
        "p50_ms",
        "p99_ms",
        "threads",
        "queries",
        "with_history",
        "with_context",
        "checksum",
    }
    for t, r in heldout_json.items():
        assert set(r) == keys
        assert (
            r["script"] == "optional_features_serve"
            and r["threads"] == t
            and r["queries"] == QUERIES
        )
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert (
            isinstance(r["checksum"], float)
            and np.isfinite(r["checksum"])
            and r["checksum"] != 0
        )
    assert heldout_json[1]["checksum"] == heldout_json[3]["checksum"]


def test_optional_feature_counts_and_both_sides_occur(heldout_json, model):
    """with_history and with_context are the counts of the requests made from the docstring, and
    each optional feature is present in some requests of the tiny run and missing in others. The
    script's own requests are the same arrays and temperatures."""
    mod, _ = model
    reqs = _requests()
    with_history = sum("history" in q for q, _ in reqs)
    with_context = sum("context" in q for q, _ in reqs)
    assert 0 < with_history < QUERIES and 0 < with_context < QUERIES
    assert any(
        ("history" in q) != ("context" in q) for q, _ in reqs
    )  # the two are drawn apart
    for r in heldout_json.values():
        assert r["with_history"] == with_history and r["with_context"] == with_context
    rows = set()
    for rid, (req, temp) in enumerate(reqs):
        theirs, their_temp = mod.make_request(0, rid, VOCAB, MAX_ROWS)
        assert their_temp == temp and isinstance(their_temp, float)
        assert list(theirs) == list(req)  # the same features present, in the same order
        for k, v in req.items():
            assert theirs[k].dtype == v.dtype and np.array_equal(theirs[k], v), (rid, k)
        assert ("history" in req) == ("history_len" in req)
        if "history" in req:
            assert req["history_len"].min() >= 1 and req["history_len"].max() <= H
        rows.add(len(req["user_id"]))
        assert 8 <= len(req["user_id"]) <= MAX_ROWS
    assert len(rows) > QUERIES // 2


def test_checksum_recomputed_by_hand(heldout_json, model):
    """Every request made again from the docstring and scored by hand in float64 from the seeded
    parameters (temperature applied); the checksum, the sum of (rid + 1) x each request's score sum,
    agrees with the script's at 1 and 3 threads. The model, called the handler's way (keywords,
    missing ones left out), agrees request by request (the check on the hand math only)."""
    mod, net = model
    p = _params(net)
    expected = 0.0
    with torch.inference_mode():
        for rid, (req, temp) in enumerate(_requests()):
            s = _sigmoid(_hand_logits(p, req) / temp)
            out = net(
                **{k: torch.as_tensor(v) for k, v in req.items()}, temperature=temp
            )
            assert out["model_version"] == VERSION and isinstance(
                out["model_version"], str
            )
            np.testing.assert_allclose(out["score"].numpy(), s, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(
                out["logit"].numpy(), _hand_logits(p, req) / temp, rtol=1e-4, atol=1e-5
            )
            expected += (rid + 1) * float(s.sum())
    for r in heldout_json.values():
        assert r["checksum"] == pytest.approx(expected, rel=1e-5)


def test_optional_features_and_the_temperature_matter(model):
    """The same request with and without its history, and with and without its context, scores
    differently (so a replay keyed without the missing features would show); the temperature of
    every 10th request divides the logit (scores at 2.0 are the sigmoid of half the logit at 1.0,
    and differ from them). forward takes its features by keyword only."""
    mod, net = model
    sig = inspect.signature(net.forward)
    assert all(
        q.kind is inspect.Parameter.KEYWORD_ONLY for q in sig.parameters.values()
    )
    assert sig.parameters["temperature"].default == 1.0
    p = _params(net)
    reqs = _requests()
    hot = [rid for rid, (_, temp) in enumerate(reqs) if temp == 2.0]
    assert hot == list(range(0, QUERIES, 10)) and len(hot) >= 2

    def score(req, temp=1.0):
        with torch.inference_mode():
            return net(
                **{k: torch.as_tensor(v) for k, v in req.items()}, temperature=temp
            )["score"].numpy()

    seen = set()
    for req, _ in reqs:
        for names in (("history", "history_len"), ("context",)):
            if names[0] in req:
                less = {k: v for k, v in req.items() if k not in names}
                full, cut = score(req), score(less)
                assert np.abs(full - cut).max() > 1e-4, names
                np.testing.assert_allclose(
                    cut, _sigmoid(_hand_logits(p, less)), rtol=1e-5, atol=1e-6
                )
                seen.add(names[0])
    assert seen == {"history", "context"}
    # the history's lengths count: the same ids with every row's length cut to 1 score differently
    req = next(q for q, _ in reqs if "history" in q and q["history_len"].max() > 1)
    short = {**req, "history_len": np.ones_like(req["history_len"])}
    assert np.abs(score(req) - score(short)).max() > 1e-4
    for rid in hot:
        req, temp = reqs[rid]
        logit = _hand_logits(p, req)
        at_two, at_one = score(req, temp), score(req, 1.0)
        np.testing.assert_allclose(at_two, _sigmoid(logit / 2.0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(at_one, _sigmoid(logit), rtol=1e-5, atol=1e-6)
        assert np.abs(at_two - at_one).max() > 1e-4
