"""The executor-processes held-out script (examples/heldout/executor_procs_serve.py) on the CPU.

It serves a two-tower retrieval scorer (a user tower of 3 multi-hot ``EmbeddingBag(mode="sum")``
fields, passed as one values array with per-request offsets, beside a dense layer, into an MLP; an
item tower of an item-id ``Embedding`` and an MLP; the cosine of the two; ``torch.topk`` of the 10
best of each request's 50-300 candidates) from the worker processes of a
``concurrent.futures.ProcessPoolExecutor`` (``spawn``), each building the model in the executor's
initializer, scoring on its main thread, the parent submitting every request with
``executor.map(score, requests, chunksize=4)``. Here its JSON line is checked (the same checksum,
exactly, at 1, 2 and 3 processes), its requests are made again from the docstring's description
(not through the script's ``make_request``), its parameters are made again from the docstring's
module list (plain ``nn.EmbeddingBag``/``nn.Embedding``/``nn.Linear`` after
``torch.manual_seed(0)``, not through the script's classes) and compared with the model the
script's initializer builds, and its checksum is recomputed from them in float64 numpy (the bags
summed by indexing, the MLPs by matmuls, the cosines, the top 10 by ``argsort``), every top-10
boundary shown to be far wider than float32 rounding so the chosen candidates agree exactly.
"""

from __future__ import annotations

import ast
import os
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn
from test_heldout_scripts import HELDOUT, TINY, _tiny_run, tiny_json

NAME = "executor_procs_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, VOCAB = ARGS["--queries"], ARGS["--vocab"]
#: the docstring's sizes: fields, dense features, tower width, hidden width, items returned, the
#: fewest and most ids a field and candidates a request
FIELDS, DENSE, DIM, HIDDEN, K = 3, 8, 32, 64, 10
MIN_IDS, MAX_IDS, MIN_CANDS, MAX_CANDS = 1, 6, 50, 300


def _request(seed: int, rid: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Request ``rid`` as the docstring describes it: ``default_rng([seed, rid])``, then the dense
    features ``[1, 8]`` (float32), each field's id count (1..6) and ids in turn, the candidate count
    (50..300), the distinct candidates (``choice`` without replacement). The fields kept apart."""
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((1, DENSE)).astype(np.float32)
    fields = []
    for _ in range(FIELDS):
        n = rng.integers(MIN_IDS, MAX_IDS + 1)
        fields.append(rng.integers(0, VOCAB, n))
    n_cand = rng.integers(MIN_CANDS, MAX_CANDS + 1)
    return dense, fields, rng.choice(VOCAB, n_cand, replace=False)


def _requests():
    return [_request(0, rid) for rid in range(QUERIES)]


def _docstring_modules() -> dict[str, nn.Module]:
    """The modules as the docstring lists them, made after ``torch.manual_seed(0)`` in its order
    with PyTorch's default initializations (nothing re-drawn), named as the script's ``state_dict``
    names them."""
    torch.manual_seed(0)
    mods: dict[str, nn.Module] = {f"user.bags.{f}": nn.EmbeddingBag(VOCAB, DIM, mode="sum") for f in range(FIELDS)}
    mods["user.dense.0"] = nn.Linear(DENSE, DIM)
    mods["user.mlp.0"] = nn.Linear((FIELDS + 1) * DIM, HIDDEN)
    mods["user.mlp.2"] = nn.Linear(HIDDEN, DIM)
    mods["item.emb"] = nn.Embedding(VOCAB, DIM)
    mods["item.mlp.0"] = nn.Linear(DIM, HIDDEN)
    mods["item.mlp.2"] = nn.Linear(HIDDEN, DIM)
    return mods


def _docstring_params() -> dict[str, np.ndarray]:
    return {f"{m}.{k}": v.detach().double().numpy() for m, mod in _docstring_modules().items()
            for k, v in mod.state_dict().items()}


def _hand_scores(p: dict, dense: np.ndarray, fields: list[np.ndarray], candidates: np.ndarray) -> np.ndarray:
    """[candidates] cosines in float64 from the parameters alone, no module called."""
    bags = [p[f"user.bags.{f}.weight"][ids].sum(0) for f, ids in enumerate(fields)]
    d = np.maximum(p["user.dense.0.weight"] @ dense[0].astype(np.float64) + p["user.dense.0.bias"], 0.0)
    h = np.maximum(p["user.mlp.0.weight"] @ np.concatenate([*bags, d]) + p["user.mlp.0.bias"], 0.0)
    u = p["user.mlp.2.weight"] @ h + p["user.mlp.2.bias"]
    v = p["item.emb.weight"][candidates]
    v = np.maximum(v @ p["item.mlp.0.weight"].T + p["item.mlp.0.bias"], 0.0) @ p["item.mlp.2.weight"].T
    v = v + p["item.mlp.2.bias"]
    return (v / np.linalg.norm(v, axis=1, keepdims=True)) @ (u / np.linalg.norm(u))


def _float32_scores(mods: dict, dense: np.ndarray, fields: list[np.ndarray], candidates: np.ndarray) -> np.ndarray:
    """The same cosines in float32 through the docstring's plain modules (each field's bag on its
    own ids, not the script's classes): only to size float32 rounding against the float64 hand."""
    with torch.no_grad():
        zero = torch.zeros(1, dtype=torch.long)
        bags = [mods[f"user.bags.{f}"](torch.from_numpy(ids), zero) for f, ids in enumerate(fields)]
        d = torch.relu(mods["user.dense.0"](torch.from_numpy(dense)))
        u = mods["user.mlp.2"](torch.relu(mods["user.mlp.0"](torch.cat([*bags, d], 1))))
        v = mods["item.emb"](torch.from_numpy(candidates))
        v = mods["item.mlp.2"](torch.relu(mods["item.mlp.0"](v)))
        u, v = u / u.norm(dim=1, keepdim=True), v / v.norm(dim=1, keepdim=True)
        return (u @ v.T)[0].double().numpy()


def _gap(values: np.ndarray, n: int) -> float:
    """How far the n-th largest of ``values`` is above the next one: the room a top-n selection
    has before rounding can swap which candidates it keeps."""
    v = np.sort(values)[::-1]
    return float(v[n - 1] - v[n])


@pytest.fixture(scope="module")
def two_procs() -> dict:
    """The script's JSON line at 2 processes, run as conftest's ``heldout_runs`` runs it (its TINY
    arguments, one intra-op thread, nothing on PYTHONPATH: :func:`tiny_json`)."""
    return tiny_json(NAME, "--procs", "2")


@pytest.fixture(scope="module")
def worker_model():
    """The script's module and the model its executor initializer builds, the initializer run here
    in-process (``init("cpu", vocab, 0, barrier)``: the seed, the model, ``.to`` and ``eval``, the
    warm-up), with a one-party barrier for ``ready``."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--vocab"]) == VOCAB
        mod.init("cpu", VOCAB, 0, threading.Barrier(1))
        assert mod.ready() == os.getpid()
    assert not mod._model.training and mod._dev == torch.device("cpu")
    return mod, mod._model


def test_json_line_and_the_same_checksum_at_every_process_count(heldout_json, two_procs):
    """The keys of the JSON line; candidates_total is the candidate count of the requests made from
    the docstring; the checksum is exactly the same at 1, 2 and 3 processes."""
    total = sum(len(c) for *_, c in _requests())
    runs = {**heldout_json, 2: two_procs}
    assert set(runs) == {1, 2, 3}
    for n, r in runs.items():
        assert set(r) == {"script", "procs", "queries", "qps", "p50_ms", "p99_ms", "candidates_total", "checksum"}
        assert r["script"] == "executor_procs_serve" and r["procs"] == n and r["queries"] == QUERIES
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["candidates_total"] == total
        assert isinstance(r["checksum"], float) and np.isfinite(r["checksum"])
    assert runs[1]["checksum"] == runs[2]["checksum"] == runs[3]["checksum"]


def test_requests_are_as_the_docstring_says(worker_model):
    """The script's own requests are the arrays made from the docstring: the values are the fields'
    ids concatenated, the offsets each field's start (a Python list); the candidates are distinct,
    their count changes within 50..300, each field holds 1..6 ids."""
    mod, _ = worker_model
    counts = set()
    for rid, (dense, fields, candidates) in enumerate(_requests()):
        d, values, offsets, c = mod.make_request(0, rid, VOCAB)
        assert d.dtype == np.float32 and values.dtype == c.dtype == np.int64
        assert isinstance(offsets, list) and all(type(o) is int for o in offsets)
        assert np.array_equal(d, dense) and np.array_equal(c, candidates)
        assert np.array_equal(values, np.concatenate(fields))
        assert offsets == [0, len(fields[0]), len(fields[0]) + len(fields[1])]
        assert all(MIN_IDS <= len(ids) <= MAX_IDS for ids in fields) and values.max() < VOCAB
        assert MIN_CANDS <= len(c) <= MAX_CANDS and len(np.unique(c)) == len(c) and c.max() < VOCAB
        counts.add(len(c))
    assert len(counts) > QUERIES // 2


def test_parameters_are_as_the_docstring_says(worker_model):
    """The model the initializer builds holds exactly the parameters made from the docstring's module
    list (same names, shapes and values)."""
    _, net = worker_model
    sd = net.state_dict()
    p = _docstring_params()
    assert set(sd) == set(p)
    for k, v in p.items():
        assert np.array_equal(sd[k].double().numpy(), v), k


def test_checksum_recomputed_by_hand(heldout_json, two_procs, worker_model):
    """Every request made again from the docstring and scored by hand in float64 from the
    docstring's parameters; its top 10 taken by ``argsort``; the checksum (the top-10 values in
    request order dotted with ``linspace(1, 2, n)``, plus the sum of the top-10 positions) agrees
    with every run's: the position sum exactly, the values' part to 1e-6.

    The script scores in float32 and the hand in float64, so at the top-10 boundary two cosines
    within rounding of each other could keep different candidates in the two (the candidates are
    distinct ids and the weights continuous, so no two share a score). For every request, the 10th
    best cosine's gap above the 11th is shown to be more than twice the largest float32-vs-float64
    difference of its cosines (the docstring's modules in float32 on the same inputs), and the
    float32 top 10 to pick the same positions: so the position sum can be compared exactly."""
    mods = _docstring_modules()
    p = _docstring_params()
    values, index_sum, room, worst = [], 0, [], 0.0
    for rid, (dense, fields, candidates) in enumerate(_requests()):
        s = _hand_scores(p, dense, fields, candidates)
        s32 = _float32_scores(mods, dense, fields, candidates)
        err = float(np.abs(s32 - s).max())
        gap = _gap(s, K)
        assert gap > 2 * err, (rid, gap, err)
        room.append(gap / err)
        worst = max(worst, err)
        best = np.argsort(-s, kind="stable")[:K]
        assert np.array_equal(best, np.argsort(-s32, kind="stable")[:K]), rid
        assert np.all(np.diff(s[best]) < 0)  # best first, no tie
        values.append(s[best])
        index_sum += int(best.sum())
    assert min(room) > 10, min(room)  # (far from a swap, not barely)
    print(f"smallest top-10 gap / largest float32 difference over the requests: {min(room):.0f}")
    flat = np.concatenate(values)
    assert 0 < flat.min() and flat.max() < 1  # (the best cosines: positive terms, no cancellation)
    weights = np.linspace(1.0, 2.0, flat.size)
    value_part = float(flat @ weights)
    # the values' part is a sum of positive terms (cosines in (0, 1), weights in [1, 2]): float32
    # rounding moves it by at most worst * sum(weights), which over the part itself is its relative
    # error (measured with the TINY sizes and seed 0: worst ~1.3e-7, 240 values summing to ~92 with
    # their weights, ~5e-7), shown below 1e-6 here: rel=1e-6 holds by that bound, while a wrong
    # field, table, layer or normalization moves it by far more
    assert worst * weights.sum() / value_part < 1e-6, (worst, value_part)
    for r in [*heldout_json.values(), two_procs]:
        # the position sum, an integer far below 2**53, comes back exactly: what is left of the checksum
        # is the values' part, within far less than 0.5 of the hand's
        assert round(r["checksum"] - value_part) == index_sum
        assert r["checksum"] - index_sum == pytest.approx(value_part, rel=1e-6)
    # the script's model (its own forward, on the script's request) agrees on the first request, a check on the hand
    mod, net = worker_model
    d, v, o, c = mod.make_request(0, 0, VOCAB)
    with torch.no_grad():
        top = net(torch.from_numpy(d), torch.from_numpy(v), torch.tensor(o), torch.from_numpy(c))
    s = _hand_scores(p, *_request(0, 0))
    assert top.indices.tolist() == np.argsort(-s, kind="stable")[:K].tolist()
    np.testing.assert_allclose(top.values.double().numpy(), np.sort(s)[::-1][:K], rtol=1e-6, atol=1e-7)


def test_the_executor_is_made_and_ended_as_documented():
    """In the script's source: a ``ProcessPoolExecutor`` in a ``with`` block, ``max_workers`` the
    process count, a ``spawn`` context, the model built in ``initializer=init``; every request
    submitted by ``executor.map(score, requests, chunksize=4)``; no ``multiprocessing.Pool``, no
    ``terminate``, no thread of the workers' own; ``score`` moves its arrays with ``torch.from_numpy``
    and its offsets with ``torch.tensor(offsets, device=_dev)`` under ``torch.no_grad()``."""
    tree = ast.parse((HELDOUT / NAME).read_text())
    (with_,) = [n for n in ast.walk(tree) if isinstance(n, ast.With)
                and ast.unparse(n.items[0].context_expr).startswith("ProcessPoolExecutor(")]
    made = with_.items[0].context_expr
    kw = {k.arg: ast.unparse(k.value) for k in made.keywords}
    assert kw["max_workers"] == "args.procs" and kw["mp_context"] == "ctx" and kw["initializer"] == "init"
    assert kw["initargs"] == "(args.device, args.vocab, args.seed, barrier)"
    assert "ctx = multiprocessing.get_context('spawn')" in ast.unparse(tree)
    calls = {ast.unparse(n) for n in ast.walk(with_) if isinstance(n, ast.Call)}
    assert "executor.map(score, requests, chunksize=4)" in calls
    attrs = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert not attrs & {"terminate", "Pool", "shutdown"}  # (the with block's own shutdown(wait=True))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "threading" not in imported
    score = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "score")
    body = ast.unparse(score)
    assert "with torch.no_grad():" in body and "torch.tensor(offsets, device=_dev)" in body
    assert body.count("torch.from_numpy(") == 3
    init = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "init")
    body = ast.unparse(init)
    assert body.index("torch.manual_seed(seed)") < body.index("TwoTower(vocab).to(_dev).eval()")
