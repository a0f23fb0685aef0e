"""The offline batch-scoring held-out script (examples/heldout/offline_scoring_serve.py) on the CPU.

It scores every row of an in-memory table (13 dense features, 8 categorical ids, a row id; the
row ids a permutation, so the table is not sorted by id) through a ``DataLoader`` (``--workers``
processes, a ``collate_fn`` returning a dict of tensors, ``drop_last=False``: the last batch is
partial) with a DCN-v2-style ranker (8 ``nn.Embedding`` tables, a dense MLP, 2 cross layers, an MLP
head, a sigmoid), one consumer loop on the main thread, and prints a checksum of every row's score
in row-id order. Here it is run at 0 and 2 workers (its JSON line checked: the batches scored, the
rows, the partial last batch, the same checksum exactly), its table is made again from the
docstring's description (not through the script's ``Impressions``), its parameters are made again
from the docstring's module list (plain ``nn.Embedding``/``nn.Linear`` after ``torch.manual_seed(0)``)
and shown equal to the script's ``Ranker``'s, and its checksum is recomputed from them in float64
numpy (embedding rows by indexing, the MLPs and cross layers by matmuls), no module called.
"""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
import torch.nn as nn
from test_heldout_scripts import HELDOUT, TINY, _tiny_run, tiny_json

NAME = "offline_scoring_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, BATCH, VOCAB = ARGS["--queries"], ARGS["--batch"], ARGS["--vocab"]
#: the docstring's default row count: --queries batches, the last one short by batch // 3 rows
ROWS = QUERIES * BATCH - BATCH // 3
#: the docstring's sizes: dense features, categorical features, embedding width, cross layers
DENSE, SPARSE, DIM, CROSS = 13, 8, 16, 2
WIDTH = (SPARSE + 1) * DIM


def _run(*extra: str) -> dict:
    """The script's one JSON line with its TINY arguments and ``extra`` (:func:`tiny_json`)."""
    return tiny_json(NAME, *extra, timeout=120)


@pytest.fixture(scope="module")
def runs() -> dict[int, dict]:
    """The JSON line at 0 workers (the main thread loads) and at 2 worker processes."""
    return {w: _run("--workers", str(w)) for w in (0, 2)}


def _table(rows: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The table as the docstring describes it: ``default_rng(seed)``, then the dense features
    (``log1p`` of exponentials of scale 2, float32), the ids, the row ids (a permutation)."""
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.exponential(2.0, (rows, DENSE))).astype(np.float32)
    ids = rng.integers(0, vocab, (rows, SPARSE))
    return dense, ids, rng.permutation(rows)


def _docstring_modules() -> dict[str, nn.Module]:
    """The modules as the docstring lists them, made after ``torch.manual_seed(0)`` in its order
    with PyTorch's default initializations, named as the script's ``state_dict`` names them."""
    torch.manual_seed(0)
    mods: dict[str, nn.Module] = {f"embs.{f}": nn.Embedding(VOCAB, DIM) for f in range(SPARSE)}
    mods["bottom.0"] = nn.Linear(DENSE, 64)
    mods["bottom.2"] = nn.Linear(64, DIM)
    mods.update({f"cross.{k}": nn.Linear(WIDTH, WIDTH) for k in range(CROSS)})
    mods["head.0"] = nn.Linear(WIDTH, 128)
    mods["head.2"] = nn.Linear(128, 64)
    mods["head.4"] = nn.Linear(64, 1)
    return mods


def _docstring_params() -> dict[str, np.ndarray]:
    return {f"{m}.{k}": v.detach().double().numpy() for m, mod in _docstring_modules().items()
            for k, v in mod.state_dict().items()}


def _hand_scores(p: dict, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[rows] scores in float64 from the parameters alone, no module called."""
    def lin(name, x):
        return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    d = lin("bottom.2", np.maximum(lin("bottom.0", dense.astype(np.float64)), 0.0))
    x0 = np.concatenate([d] + [p[f"embs.{f}.weight"][ids[:, f]] for f in range(SPARSE)], axis=1)
    x = x0
    for k in range(CROSS):
        x = x0 * lin(f"cross.{k}", x) + x
    h = np.maximum(lin("head.2", np.maximum(lin("head.0", x), 0.0)), 0.0)
    return 1.0 / (1.0 + np.exp(-lin("head.4", h)[:, 0]))


def _checksum(scores_by_id: np.ndarray) -> float:
    return float(scores_by_id @ np.linspace(1.0, 2.0, scores_by_id.size))


def test_json_line_a_partial_last_batch_and_the_same_checksum_at_0_and_2_workers(runs):
    """The keys of the JSON line; ``queries`` batches scored, the last one partial (the rows are not
    a multiple of the batch); the checksum exactly the same with the main thread loading and with
    two worker processes."""
    assert ROWS % BATCH != 0 and -(-ROWS // BATCH) == QUERIES
    for w, r in runs.items():
        assert set(r) == {"script", "workers", "queries", "rows", "last_batch", "qps", "p50_ms", "p99_ms",
                          "checksum"}
        assert r["script"] == "offline_scoring_serve" and r["workers"] == w
        assert r["queries"] == QUERIES and r["rows"] == ROWS
        assert r["last_batch"] == ROWS - (QUERIES - 1) * BATCH == BATCH - BATCH // 3 < BATCH
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert isinstance(r["checksum"], float) and np.isfinite(r["checksum"])
    assert runs[0]["checksum"] == runs[2]["checksum"]


def test_rows_overrides_the_row_count():
    """``--rows`` sets the table's size; the batches scored are then ``ceil(rows / batch)``."""
    r = _run("--workers", "0", "--rows", str(2 * BATCH + 5))
    assert (r["rows"], r["queries"], r["last_batch"]) == (2 * BATCH + 5, 3, 5)
    dense, ids, row_id = _table(2 * BATCH + 5, VOCAB, 0)
    assert r["checksum"] == pytest.approx(_checksum(_by_id(_hand_scores(_docstring_params(), dense, ids), row_id)),
                                          rel=1e-5)


def _by_id(scores: np.ndarray, row_id: np.ndarray) -> np.ndarray:
    out = np.full(len(row_id), np.nan)
    out[row_id] = scores
    return out


def test_the_table_and_its_loader_are_as_the_docstring_says():
    """The script's table is the arrays made from the docstring; the row ids are a permutation, not
    sorted; its collate gives a dict of int64 / float32 tensors; its loader (drop_last=False) gives
    ``QUERIES`` batches, the last one partial, in table order."""
    with _tiny_run(NAME) as (mod, _):
        t = mod.Impressions(ROWS, VOCAB, 0)
        dense, ids, row_id = _table(ROWS, VOCAB, 0)
        assert np.array_equal(t.dense, dense) and np.array_equal(t.ids, ids) and np.array_equal(t.row_id, row_id)
        assert sorted(row_id.tolist()) == list(range(ROWS)) and not np.array_equal(row_id, np.arange(ROWS))
        assert ids.min() >= 0 and ids.max() < VOCAB
        sizes, seen = [], []
        for b in torch.utils.data.DataLoader(t, batch_size=BATCH, shuffle=False, num_workers=0,
                                             collate_fn=mod.collate, drop_last=False):
            assert set(b) == {"row_id", "dense", "ids"}
            assert (b["row_id"].dtype, b["dense"].dtype, b["ids"].dtype) == (torch.int64, torch.float32, torch.int64)
            assert b["dense"].shape == (len(b["row_id"]), DENSE) and b["ids"].shape == (len(b["row_id"]), SPARSE)
            sizes.append(len(b["row_id"]))
            seen += b["row_id"].tolist()
    assert sizes == [BATCH] * (QUERIES - 1) + [BATCH - BATCH // 3]
    assert seen == row_id.tolist()


def test_parameters_are_as_the_docstring_says():
    """The script's ``Ranker`` built after ``torch.manual_seed(0)`` holds exactly the parameters
    made from the docstring's module list (same names, shapes and values)."""
    with _tiny_run(NAME) as (mod, _):
        torch.manual_seed(0)
        sd = mod.Ranker(VOCAB).eval().state_dict()
    p = _docstring_params()
    assert set(sd) == set(p)
    for k, v in p.items():
        assert np.array_equal(sd[k].double().numpy(), v), k


def test_checksum_recomputed_by_hand(runs):
    """Every row of the table made again from the docstring, scored by hand in float64 from the
    docstring's parameters, placed at its row id; the checksum (the scores in row-id order dotted
    with ``linspace(1, 2, rows)``) agrees with both runs' to float32 rounding (rel 1e-5: the scores
    are in (0, 1) and the weights positive, no cancellation), while the same scores in table order
    (ignoring the row ids) give a checksum off by far more. The script's own model on the table
    agrees with the hand row by row (a check on the hand)."""
    dense, ids, row_id = _table(ROWS, VOCAB, 0)
    s = _hand_scores(_docstring_params(), dense, ids)
    assert 0 < s.min() and s.max() < 1
    expected = _checksum(_by_id(s, row_id))
    for r in runs.values():
        assert r["checksum"] == pytest.approx(expected, rel=1e-5)
    # the row ids matter: the scores of an untrained ranker lie close together (~0.39-0.52 here), yet
    # in table order they move the checksum by ~6e-4 of itself, far beyond the tolerance
    assert abs(_checksum(s) - expected) > 1e-4 * expected
    with _tiny_run(NAME) as (mod, _), torch.inference_mode():
        torch.manual_seed(0)
        model = mod.Ranker(VOCAB).eval()
        got = model(torch.from_numpy(dense), torch.from_numpy(ids)).double().numpy()
    np.testing.assert_allclose(got, s, rtol=1e-5, atol=1e-7)


def test_the_loop_is_as_documented():
    """In the script's source: the timed loader is a ``DataLoader`` with ``shuffle=False``,
    ``drop_last=False``, ``persistent_workers=False``, ``pin_memory`` on CUDA and ``collate``; the
    loop moves every tensor with ``.to(dev, non_blocking=True)``, scores under
    ``torch.inference_mode()`` and reads back with ``.cpu().numpy()``; no thread of its own."""
    tree = ast.parse((HELDOUT / NAME).read_text())
    (made,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "DataLoader"]
    kw = {k.arg: ast.unparse(k.value) for k in made.keywords}
    assert kw == {"batch_size": "args.batch", "shuffle": "False", "num_workers": "workers", "collate_fn": "collate",
                  "pin_memory": "pin", "drop_last": "False", "persistent_workers": "False"}
    src = ast.unparse(tree)
    assert "pin = dev.type == 'cuda'" in src and "with torch.inference_mode():" in src
    assert src.count("{k: v.to(dev, non_blocking=True) for k, v in batch.items()}") == 2
    assert "model(on_dev['dense'], on_dev['ids']).cpu().numpy()" in src
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"threading", "multiprocessing", "concurrent.futures"}
