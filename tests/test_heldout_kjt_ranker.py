"""The KeyedJagged ranker held-out script (examples/heldout/kjt_ranker_serve.py) on the CPU.

Its requests' sparse features arrive as a ``KeyedJagged``, a plain class of the script's own
mirroring TorchRec's ``KeyedJaggedTensor`` (keys, flat values, key-major lengths, lazily cached
offsets, ``to(device)`` returning a new object), and every request has a different value count.
Here its JSON line is checked (the same checksum, exactly, at 1 and 3 threads), its requests are
made again from the docstring's description (not through the script's ``make_request``), and
its checksum is recomputed in float64 numpy straight from the seeded parameters: each key's bags
summed by scattering that key's values onto their rows (``np.add.at``, no offsets), the dense
arch and the over arch by matmuls, the sigmoid. The ``KeyedJagged`` class is checked as the
docstring describes it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from test_heldout_scripts import THREADS, TINY, _tiny_run

NAME = "kjt_ranker_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
#: the sizes the docstring gives: keys (the over arch takes 16 * (keys + 1) = 80), dense features,
#: the embedding width, the most ids a row has of one key
KEYS, DENSE, DIM, MAX_IDS = 4, 13, 16, 4


def _request(seed: int, rid: int, rows: int, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A request as the docstring describes it: ``default_rng([seed, rid])``, then the dense
    features (float32), the lengths ``[keys, rows]`` (0-4, key-major), the values for their total."""
    rng = np.random.default_rng([seed, rid])
    dense = rng.standard_normal((rows, DENSE)).astype(np.float32)
    lengths = rng.integers(0, MAX_IDS + 1, (KEYS, rows))
    values = rng.integers(0, vocab, int(lengths.sum()))
    return dense, values, lengths


def _requests():
    return [_request(0, rid, ARGS["--rows"], ARGS["--vocab"]) for rid in range(ARGS["--queries"])]


@pytest.fixture(scope="module")
def model():
    """The script's module and its model as it builds it (``torch.manual_seed(seed)``, then the
    ranker over its keys)."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--vocab"]) == ARGS["--vocab"]
        net = mod.KJTRanker(mod.KEYS, ARGS["--vocab"]).eval()
    return mod, net


def _hand_scores(p: dict, keys, dense: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[rows] scores in float64 from the parameters alone: key k's values are the k-th run of
    ``lengths[k].sum()`` values, each row's ids the next ``lengths[k, row]`` of them, summed."""
    rows = len(dense)
    d = dense.astype(np.float64)
    h = np.maximum(d @ p["dense_arch.0.weight"].T + p["dense_arch.0.bias"], 0.0)
    parts = [np.maximum(h @ p["dense_arch.2.weight"].T + p["dense_arch.2.bias"], 0.0)]
    start = 0
    for k, key in enumerate(keys):
        n = int(lengths[k].sum())
        ids = values[start:start + n]
        start += n
        bag = np.zeros((rows, DIM))
        np.add.at(bag, np.repeat(np.arange(rows), lengths[k]), p[f"bags.{key}.weight"][ids])
        parts.append(bag)
    assert start == len(values)
    h = np.maximum(np.concatenate(parts, axis=1) @ p["over_arch.0.weight"].T + p["over_arch.0.bias"], 0.0)
    logit = (h @ p["over_arch.2.weight"].T + p["over_arch.2.bias"])[:, 0]
    return 1.0 / (1.0 + np.exp(-logit))


def test_json_line_and_the_same_checksum_at_every_thread_count(heldout_runs):
    """The keys of the JSON line; values_total is the values count of the requests made from the
    docstring; the checksum is exactly the same at 1 and 3 threads."""
    runs = {t: json.loads(heldout_runs[(NAME, t)][0]) for t in THREADS}
    total = sum(len(v) for _, v, _ in _requests())
    for t, r in runs.items():
        assert len(heldout_runs[(NAME, t)]) == 1
        assert set(r) == {"script", "threads", "queries", "qps", "p50_ms", "p99_ms", "values_total", "checksum"}
        assert r["script"] == "kjt_ranker_serve" and r["threads"] == t and r["queries"] == ARGS["--queries"]
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["values_total"] == total
    assert runs[1]["checksum"] == runs[3]["checksum"]


def test_checksum_recomputed_by_hand(heldout_runs, model):
    """Every request made again from the docstring and scored by hand in float64 from the seeded
    parameters; the script's checksum at 1 and 3 threads agrees. The script's own requests are the
    same arrays (its lengths flattened key-major), and its model, given a ``KeyedJagged`` built the
    way its handler builds one, agrees with the hand scores request by request (the check on the
    hand math only). The value count changes between requests, and some bags are empty."""
    mod, net = model
    assert len(mod.KEYS) == KEYS
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    assert set(p) == {f"bags.{k}.weight" for k in mod.KEYS} | {
        f"{arch}.{i}.{w}" for arch in ("dense_arch", "over_arch") for i in (0, 2) for w in ("weight", "bias")}
    assert p["over_arch.0.weight"].shape == (64, DIM * (KEYS + 1))
    flat, counts, empty = [], set(), 0
    with torch.inference_mode():
        for rid, (dense, values, lengths) in enumerate(_requests()):
            theirs = mod.make_request(0, rid, ARGS["--rows"], ARGS["--vocab"])
            assert np.array_equal(theirs[0], dense) and np.array_equal(theirs[1], values)
            assert np.array_equal(theirs[2], lengths.reshape(-1))
            assert lengths.max() <= MAX_IDS and values.max() < ARGS["--vocab"] and values.dtype == np.int64
            counts.add(len(values))
            empty += int((lengths == 0).sum())
            s = _hand_scores(p, mod.KEYS, dense, values, lengths)
            kjt = mod.KeyedJagged(mod.KEYS, torch.from_numpy(values), torch.from_numpy(lengths.reshape(-1)))
            ref = net(torch.from_numpy(dense), kjt.to("cpu")).numpy()
            np.testing.assert_allclose(ref, s, rtol=1e-5, atol=1e-6)
            flat.append(s)
    assert len(counts) > ARGS["--queries"] // 2 and empty > 0
    flat = np.concatenate(flat)
    assert flat.size == ARGS["--queries"] * ARGS["--rows"]
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for t in THREADS:
        r = json.loads(heldout_runs[(NAME, t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)


def test_the_keyed_jagged_class_is_as_the_docstring_says(model):
    """A plain class (no dataclass, no tensor subclass) built from keys, values and lengths; its
    offsets are the lengths' cumsum with a leading zero, computed on first use and then the same
    cached tensor; ``to`` returns a new object holding the moved tensors and the cached offsets."""
    mod, _ = model
    cls = mod.KeyedJagged
    assert not dataclasses.is_dataclass(cls) and not issubclass(cls, torch.Tensor)
    dense, values, lengths = _request(0, 0, ARGS["--rows"], ARGS["--vocab"])
    kjt = cls(mod.KEYS, torch.from_numpy(values), torch.from_numpy(lengths.reshape(-1)))
    assert kjt._offsets is None
    offsets = kjt.offsets()
    assert kjt._offsets is offsets and kjt.offsets() is offsets
    assert offsets.tolist() == [0, *np.cumsum(lengths.reshape(-1)).tolist()]
    moved = kjt.to("cpu")
    assert isinstance(moved, cls) and moved is not kjt
    assert list(moved.keys()) == list(mod.KEYS)
    assert torch.equal(moved.values(), kjt.values()) and torch.equal(moved.lengths(), kjt.lengths())
    assert torch.equal(moved._offsets, offsets)
    fresh = cls(mod.KEYS, torch.from_numpy(values), torch.from_numpy(lengths.reshape(-1))).to("cpu")
    assert fresh._offsets is None  # (nothing computed before the move: nothing carried)
