"""The replica-per-thread held-out script (examples/heldout/replica_per_thread_serve.py) on the CPU.

It serves an xDeepFM ranker (field embeddings, a two-layer CIN, a DNN, a wide part over the
dense features) from one replica per worker thread: the ``ThreadPoolExecutor``'s initializer
makes each thread's own ``copy.deepcopy`` of one base model, inside that thread, and the raw ids
are hashed to embedding rows on the device inside ``forward``. Here its JSON line is checked (the
same checksum, exactly, at 1 and 3 threads; one replica serving at 1 thread, at most three at 3),
its requests are made again from the docstring's description (not through the script's
``make_request``), its parameters are made again from the docstring's module list (plain
``nn.Embedding``/``nn.Conv1d``/``nn.Linear`` after ``torch.manual_seed(0)``, not through the
script's class), and its checksum is recomputed from them in float64 numpy (the hashing in int64,
the embeddings by indexing, the CIN's outer products and 1x1 convolutions by ``einsum``, the DNN,
the wide part and the head by matmuls, the sigmoid). The replicas are shown to be made in the
worker threads, one a thread, as exact and separate copies of the base.
"""

from __future__ import annotations

import ast
import copy
import io
import json
import sys
import threading
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch
import torch.nn as nn
from test_heldout_scripts import HELDOUT, TINY, _tiny_run

NAME = "replica_per_thread_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, VOCAB = ARGS["--queries"], ARGS["--vocab"]
#: the docstring's defaults and sizes: fields, most rows a request, embedding width, dense
#: features, CIN feature maps a layer, the hash's multiplier and field step
FIELDS, MAX_ROWS, DIM, DENSE, MAPS = 6, 96, 16, 13, 8
MUL, STEP = 1_000_003, 7919


def _request(seed: int, rid: int) -> tuple[np.ndarray, np.ndarray]:
    """Request ``rid`` as the docstring describes it: ``default_rng([seed, rid])``, then the row
    count (16..96), the raw ids ``[rows, F]`` in ``[0, 2**40)``, the dense features (float32)."""
    rng = np.random.default_rng([seed, rid])
    rows = rng.integers(16, MAX_ROWS + 1)
    ids = rng.integers(0, 2**40, (rows, FIELDS))
    dense = rng.standard_normal((rows, DENSE)).astype(np.float32)
    return ids, dense


def _requests():
    return [_request(0, rid) for rid in range(QUERIES)]


def _docstring_params() -> dict[str, np.ndarray]:
    """The parameters as the docstring says they are made: after ``torch.manual_seed(0)``, the F
    embeddings, the two CIN convolutions, the DNN's two Linears, the wide Linear, the head; each
    with PyTorch's default initialization. Named as the script's ``state_dict`` names them."""
    torch.manual_seed(0)
    mods = {f"embs.{f}": nn.Embedding(VOCAB, DIM) for f in range(FIELDS)}
    mods["cin.0"] = nn.Conv1d(FIELDS * FIELDS, MAPS, 1)
    mods["cin.1"] = nn.Conv1d(MAPS * FIELDS, MAPS, 1)
    mods["dnn.0"] = nn.Linear(FIELDS * DIM, 64)
    mods["dnn.2"] = nn.Linear(64, 32)
    mods["wide"] = nn.Linear(DENSE, 1)
    mods["head"] = nn.Linear(2 * MAPS + 32, 1)
    return {f"{m}.{k}": v.detach().double().numpy() for m, mod in mods.items()
            for k, v in mod.state_dict().items()}


def _hand_scores(p: dict, ids: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """[rows] scores in float64 from the parameters alone, no module called."""
    rows = len(ids)
    idx = (ids * MUL + np.arange(FIELDS) * STEP) % VOCAB  # int64: ids * MUL < 2**60
    x0 = np.stack([p[f"embs.{f}.weight"][idx[:, f]] for f in range(FIELDS)], axis=1)  # [rows, F, DIM]
    h, pooled = x0, []
    for k in range(2):
        z = np.einsum("rid,rjd->rijd", h, x0).reshape(rows, -1, DIM)  # z[:, i * F + j] = h_i * x0_j
        h = np.einsum("oc,rcd->rod", p[f"cin.{k}.weight"][:, :, 0], z) + p[f"cin.{k}.bias"][None, :, None]
        pooled.append(h.sum(2))
    d = np.maximum(x0.reshape(rows, -1) @ p["dnn.0.weight"].T + p["dnn.0.bias"], 0.0)
    d = np.maximum(d @ p["dnn.2.weight"].T + p["dnn.2.bias"], 0.0)
    logit = (np.concatenate([*pooled, d], axis=1) @ p["head.weight"].T + p["head.bias"]
             + dense.astype(np.float64) @ p["wide.weight"].T + p["wide.bias"])[:, 0]
    return 1.0 / (1.0 + np.exp(-logit))



@pytest.fixture(scope="module")
def model():
    """The script's module and its base model as it builds it (``torch.manual_seed(seed)``, then
    ``XDeepFM(vocab, fields)``); used for its seeded parameters and a check of the hand math."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--vocab"]) == VOCAB
        net = mod.XDeepFM(VOCAB, FIELDS).eval()
    return mod, net


def test_json_line_and_the_same_checksum_at_every_thread_count(heldout_json):
    """The keys of the JSON line; rows_total is the row count of the requests made from the
    docstring; one replica serves at 1 thread, one to three at 3; the checksum is exactly the
    same at 1 and 3 threads."""
    rows_total = sum(len(ids) for ids, _ in _requests())
    for t, r in heldout_json.items():
        assert set(r) == {"script", "threads", "queries", "qps", "p50_ms", "p99_ms", "rows_total", "replicas",
                          "checksum"}
        assert r["script"] == "replica_per_thread_serve" and r["threads"] == t and r["queries"] == QUERIES
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["rows_total"] == rows_total
        assert isinstance(r["checksum"], float) and np.isfinite(r["checksum"])
    assert heldout_json[1]["replicas"] == 1
    assert 1 <= heldout_json[3]["replicas"] <= 3
    assert heldout_json[1]["checksum"] == heldout_json[3]["checksum"]


def test_requests_are_as_the_docstring_says(model):
    """The script's own requests are the arrays made from the docstring; the row counts change
    within 16..96, and the raw ids reach far past the vocabulary (so the hashing matters)."""
    mod, _ = model
    counts = set()
    for rid, (ids, dense) in enumerate(_requests()):
        i, d = mod.make_request(0, rid, FIELDS, MAX_ROWS)
        assert i.dtype == np.int64 and d.dtype == np.float32
        assert np.array_equal(i, ids) and np.array_equal(d, dense)
        assert 16 <= len(ids) <= MAX_ROWS and ids.shape == (len(ids), FIELDS) and dense.shape == (len(ids), DENSE)
        assert 0 <= ids.min() and ids.max() < 2**40 and ids.max() > 2**39
        counts.add(len(ids))
    assert len(counts) > QUERIES // 2


def test_parameters_are_as_the_docstring_says(model):
    """The script's base model holds exactly the parameters made from the docstring's module list
    (same names, shapes and values), and a ``field_offset`` buffer of ``f * 7919``."""
    _, net = model
    sd = net.state_dict()
    assert sd["field_offset"].tolist() == [f * STEP for f in range(FIELDS)]
    p = _docstring_params()
    assert set(sd) - {"field_offset"} == set(p)
    for k, v in p.items():
        assert np.array_equal(sd[k].double().numpy(), v), k


def test_checksum_recomputed_by_hand(heldout_json, model):
    """Every request made again from the docstring and scored by hand in float64 from the
    docstring's parameters; the checksum (the scores in request order dotted with
    ``linspace(1, 2, n)``) agrees with both heldout_json. The base model called on the same requests agrees
    score by score (a check on the hand math only)."""
    _, net = model
    p = _docstring_params()
    scores, worst = [], 0.0
    for ids, dense in _requests():
        hand = _hand_scores(p, ids, dense)
        with torch.no_grad():
            f32 = net(torch.from_numpy(ids), torch.from_numpy(dense)).double().numpy()
        worst = max(worst, float(np.abs(f32 - hand).max()))
        scores.append(hand)
    flat = np.concatenate(scores)
    assert 0 < flat.min() and flat.max() < 1 and flat.std() > 0.01  # (not saturated: every term counts)
    # the script scores in float32, the hand in float64: a score's error is the float32 rounding of
    # its logit's sums of a few hundred products (~1e-6 at worst) times the sigmoid's slope (<= 1/4),
    # so a few 1e-7 (measured with the TINY sizes: ~1.5e-7, scores 0.066-0.99). The checksum is a sum
    # of positive terms (scores in (0, 1), weights in [1, 2]), so its relative error is at most the
    # largest relative error of a score, at most worst / smallest score (~2e-6), shown below 1e-5
    # here: rel=1e-5 holds by that bound, while a wrong field, hash, map or layer moves it by far more
    assert worst / flat.min() < 1e-5, (worst, flat.min())
    print(f"largest float32 - float64 score difference: {worst:.2e}, over the smallest score: {worst / flat.min():.1e}")
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for r in heldout_json.values():
        assert r["checksum"] == pytest.approx(expected, rel=1e-5)


def test_replicas_are_made_in_the_worker_threads(monkeypatch):
    """The script's ``main`` run in-process (3 threads, the TINY sizes): every ``copy.deepcopy`` of
    the model happens in a worker thread, not the main one, one per worker thread, each a separate
    copy (no shared storage) with the base's exact values; the replicas that served are among
    them. In its source, the pool is made with ``initializer=`` a function that deep-copies."""
    made, real = [], copy.deepcopy
    buf = io.StringIO()
    with _tiny_run(NAME) as (mod, _), redirect_stdout(buf):

        def spy(x, memo=None, _nil=[]):  # noqa: B006 (copy.deepcopy's own signature)
            out = real(x, memo)
            if isinstance(x, mod.XDeepFM):
                made.append((threading.current_thread(), x, out))
            return out

        monkeypatch.setattr(copy, "deepcopy", spy)
        monkeypatch.setattr(sys, "argv", [NAME, "--device", "cpu", "--threads", "3", *TINY[NAME]])
        mod.main()
        monkeypatch.undo()
    r = json.loads(buf.getvalue().splitlines()[-1])
    threads = [t for t, _, _ in made]
    assert len(made) == len(set(threads)) and 1 <= len(made) <= 3
    assert threading.main_thread() not in threads
    assert 1 <= r["replicas"] <= len(made)
    base = made[0][1]
    assert all(b is base for _, b, _ in made)
    ptrs = {p.data_ptr() for p in base.parameters()}
    for _, _, rep in made:
        assert rep is not base and not rep.training
        for (k, a), b in zip(base.state_dict().items(), rep.state_dict().values()):
            assert torch.equal(a, b), k
        assert not ptrs & {p.data_ptr() for p in rep.parameters()}
    tree = ast.parse((HELDOUT / NAME).read_text())
    pool = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "ThreadPoolExecutor")
    init = next(k.value for k in pool.keywords if k.arg == "initializer")
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == ast.unparse(init))
    assert "copy.deepcopy(base)" in ast.unparse(fn)
