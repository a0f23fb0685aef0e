"""The replica-per-GPU held-out script (examples/heldout/multi_gpu_serve.py) on the CPU.

On the GPU it serves a wide&deep ranker from one ``copy.deepcopy`` of the model per GPU, worker
``k`` on replica ``k % n`` after ``torch.cuda.set_device``; on the CPU (``--replicas 2``) the
replicas are CPU copies. Here its JSON line is checked (every request served once, by both
replicas when there are workers for both), its requests are made again from the docstring's
description (not through the script's ``make_request``), and its checksum is recomputed in
float64 numpy straight from the seeded parameters (the wide bag summed over the field-offset ids
by indexing, the embeddings by indexing, the MLP by matmuls, the sigmoid); the replicas are shown
to be exact, separate copies.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from test_heldout_scripts import THREADS, TINY, _tiny_run

NAME = "multi_gpu_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
#: the model's sizes as the docstring gives them: fields, dense features
FIELDS, DENSE = 10, 13


def _request(seed: int, rid: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A request as the docstring describes it: ``default_rng([seed, rid])``, 64-256 rows, then
    each row's ids of every field, then its dense features (float32)."""
    rng = np.random.default_rng([seed, rid])
    rows = int(rng.integers(64, 257))
    ids = rng.integers(0, vocab, (rows, FIELDS))
    dense = rng.standard_normal((rows, DENSE)).astype(np.float32)
    return ids, dense


def _requests() -> list[tuple[np.ndarray, np.ndarray]]:
    return [_request(0, rid, ARGS["--vocab"]) for rid in range(ARGS["--queries"])]


@pytest.fixture(scope="module")
def model():
    """The script's module and its model as it builds it (``torch.manual_seed(seed)``, then the
    one ``WideDeep`` the replicas are copied from)."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--vocab"]) == ARGS["--vocab"]
        net = mod.WideDeep(ARGS["--vocab"]).eval()
    return mod, net


def _hand_scores(p: dict, ids: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """[rows] scores in float64 from the parameters alone, no module called: every field's ids
    offset into its slice of the shared tables."""
    vocab = ARGS["--vocab"]
    idx = ids + np.arange(ids.shape[1]) * vocab
    wide = p["wide.weight"][idx, 0].sum(axis=1)  # EmbeddingBag(mode="sum"), one bag a row
    x = np.concatenate([p["emb.weight"][idx].reshape(len(ids), -1), dense.astype(np.float64)], axis=1)
    h = np.maximum(x @ p["mlp.0.weight"].T + p["mlp.0.bias"], 0.0)
    h = np.maximum(h @ p["mlp.2.weight"].T + p["mlp.2.bias"], 0.0)
    deep = (h @ p["mlp.4.weight"].T + p["mlp.4.bias"])[:, 0]
    return 1.0 / (1.0 + np.exp(-(wide + deep)))


def test_json_line_and_every_request_served_once(heldout_runs):
    """The keys of the JSON line; per_replica sums to the request count; one worker uses replica 0
    alone, three workers (replicas 0, 1, 0) use both; the checksum is the same at 1 and 3 threads."""
    runs = {t: json.loads(heldout_runs[(NAME, t)][0]) for t in THREADS}
    for t, r in runs.items():
        assert len(heldout_runs[(NAME, t)]) == 1
        assert set(r) == {"script", "threads", "queries", "qps", "p50_ms", "p99_ms", "replicas", "per_replica",
                          "checksum"}
        assert r["script"] == "multi_gpu_serve" and r["threads"] == t and r["queries"] == ARGS["--queries"]
        assert r["replicas"] == ARGS["--replicas"] == 2 and len(r["per_replica"]) == 2
        assert sum(r["per_replica"]) == ARGS["--queries"] and min(r["per_replica"]) >= 0
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    assert runs[1]["per_replica"] == [ARGS["--queries"], 0]
    assert min(runs[3]["per_replica"]) > 0
    assert runs[1]["checksum"] == runs[3]["checksum"]


def test_checksum_recomputed_by_hand(heldout_runs, model):
    """Every request made again from the docstring and scored by hand in float64 from the seeded
    parameters; the script's checksum at 1 and 3 threads agrees. The script's own requests are the
    same arrays, and its model agrees with the hand scores request by request (the check on the
    hand math only)."""
    mod, net = model
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    assert set(p) == {"offsets", "wide.weight", "emb.weight", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight",
                      "mlp.2.bias", "mlp.4.weight", "mlp.4.bias"}
    assert np.array_equal(p["offsets"], np.arange(FIELDS) * ARGS["--vocab"])
    assert p["emb.weight"].shape == (FIELDS * ARGS["--vocab"], mod.DIM)
    flat = []
    with torch.inference_mode():
        for rid, (ids, dense) in enumerate(_requests()):
            theirs = mod.make_request(0, rid, ARGS["--vocab"])
            assert np.array_equal(theirs[0], ids) and np.array_equal(theirs[1], dense)
            assert dense.dtype == np.float32 and 64 <= len(ids) <= 256 and ids.max() < ARGS["--vocab"]
            s = _hand_scores(p, ids, dense)
            ref = net(torch.as_tensor(ids), torch.from_numpy(dense)).numpy()
            np.testing.assert_allclose(ref, s, rtol=1e-5, atol=1e-6)
            flat.append(s)
    assert len({len(s) for s in flat}) > 10  # the row count changes between requests
    flat = np.concatenate(flat)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for t in THREADS:
        r = json.loads(heldout_runs[(NAME, t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)


def test_the_replicas_are_exact_separate_copies(model):
    """``copy.deepcopy`` as the script makes its replicas: their parameters are equal to the base
    model's and share no memory with it or each other, and every replica's output on one request
    is bit-equal; a change to one replica leaves the others as they were."""
    mod, net = model
    replicas = [copy.deepcopy(net).to("cpu") for _ in range(ARGS["--replicas"])]
    ids, dense = _request(0, 0, ARGS["--vocab"])
    with _tiny_run(NAME), torch.inference_mode():
        outs = [m(torch.as_tensor(ids), torch.from_numpy(dense)).numpy() for m in replicas]
        base = net(torch.as_tensor(ids), torch.from_numpy(dense)).numpy()
    for out in outs:
        assert np.array_equal(out, base)
    ptrs = [{k: v.data_ptr() for k, v in m.state_dict().items()} for m in [net, *replicas]]
    for k, v in net.state_dict().items():
        assert all(torch.equal(m.state_dict()[k], v) for m in replicas), k
        assert len({pt[k] for pt in ptrs}) == len(ptrs), k
    with torch.no_grad():
        replicas[0].mlp[4].bias.add_(1.0)
    assert not torch.equal(replicas[0].mlp[4].bias, replicas[1].mlp[4].bias)
    assert torch.equal(replicas[1].mlp[4].bias, net.mlp[4].bias)
