"""The Triton-Python-backend held-out script (examples/heldout/triton_backend_serve.py) on the CPU.

Its ``TritonPythonModel`` (``initialize``, ``execute`` on a list of requests, ``finalize``) is
driven by a stand-in of Triton's server in the same file: client threads queue requests, one
scheduler thread forms dynamic batches of up to ``--max-batch`` requests within
``--max-delay-ms``. Batches depend on timing, so, as for ``own_batcher_serve.py``, the checksums
agree to rounding, not exactly. Here its JSON line is checked, its requests are made again from
the docstring's description (not through the script's ``make_request``), and its checksum is
recomputed in float64 numpy straight from the parameters ``initialize`` seeds (the first-order
weights and the embeddings by indexing, the FM term, the deep MLP by matmuls, the sigmoid);
``execute`` is called on batches of our own, and the stand-in's batcher is shown to form full
batches from requests already queued.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_heldout_scripts import APPROX, THREADS, TINY, _tiny_run

NAME = "triton_backend_serve.py"
ARGS = {k: float(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, VOCAB = int(ARGS["--queries"]), int(ARGS["--vocab"])
#: the sizes the docstring gives: fields, dense features, embedding width, most rows a request
FIELDS, DENSE, DIM, MAX_ROWS = 8, 13, 16, 32


def _request(seed: int, rid: int, vocab: int) -> dict[str, np.ndarray]:
    """A request's inputs as the docstring describes them: ``default_rng([seed, rid])``, the row
    count (1-32), the dense features (float32), the ids of every field."""
    rng = np.random.default_rng([seed, rid])
    n = int(rng.integers(1, MAX_ROWS + 1))
    return {"DENSE": rng.standard_normal((n, DENSE)).astype(np.float32),
            "SPARSE_IDS": rng.integers(0, vocab, (n, FIELDS))}


def _requests() -> list[dict[str, np.ndarray]]:
    return [_request(0, rid, VOCAB) for rid in range(QUERIES)]


def _triton_args(seed: int, vocab: int) -> dict[str, str]:
    """``initialize``'s ``args`` as Triton passes them to a CPU instance: strings, the model
    configuration as JSON with its parameters as ``string_value``s."""
    config = {"name": "deepfm", "backend": "python", "max_batch_size": 512,
              "output": [{"name": "SCORE", "data_type": "TYPE_FP32", "dims": [1]}],
              "parameters": {"seed": {"string_value": str(seed)}, "vocab": {"string_value": str(vocab)}}}
    return {"model_config": json.dumps(config), "model_instance_kind": "CPU", "model_instance_device_id": "0"}


def _backend(mod):
    b = mod.TritonPythonModel()
    b.initialize(_triton_args(0, VOCAB))
    return b


@pytest.fixture(scope="module")
def backend():
    """The script's module and a backend ``initialize``d as Triton would (seed 0, the TINY vocab)."""
    with _tiny_run(NAME) as (mod, _):
        b = _backend(mod)
    return mod, b


def _hand_scores(p: dict, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[rows] scores in float64 from the parameters alone: every field's ids offset into its
    slice of the shared tables."""
    idx = ids + np.arange(FIELDS) * VOCAB
    first = p["first.weight"][idx, 0].sum(axis=1)
    e = p["emb.weight"][idx]  # [rows, fields, dim]
    fm = 0.5 * (e.sum(axis=1) ** 2 - (e ** 2).sum(axis=1)).sum(axis=1)
    x = np.concatenate([e.reshape(len(ids), -1), dense.astype(np.float64)], axis=1)
    h = np.maximum(x @ p["deep.0.weight"].T + p["deep.0.bias"], 0.0)
    h = np.maximum(h @ p["deep.2.weight"].T + p["deep.2.bias"], 0.0)
    deep = (h @ p["deep.4.weight"].T + p["deep.4.bias"])[:, 0]
    return 1.0 / (1.0 + np.exp(-(first + fm + deep)))


def test_json_line_batches_and_checksums_to_rounding(heldout_runs):
    """The keys of the JSON line; one client: one ``execute`` a request; three clients: fewer
    (their requests batched together within the 20 ms delay), mean_batch the requests over the
    batches; the checksums at 1 and 3 threads agree to rounding (the batches' row counts differ)."""
    runs = {t: json.loads(heldout_runs[(NAME, t)][0]) for t in THREADS}
    for t, r in runs.items():
        assert len(heldout_runs[(NAME, t)]) == 1
        assert set(r) == {"script", "threads", "queries", "qps", "p50_ms", "p99_ms", "batches", "mean_batch",
                          "checksum"}
        assert r["script"] == "triton_backend_serve" and r["threads"] == t and r["queries"] == QUERIES
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert 1 <= r["batches"] <= QUERIES and r["mean_batch"] == round(QUERIES / r["batches"], 2)
    assert runs[1]["batches"] == QUERIES and runs[1]["mean_batch"] == 1.0
    assert runs[3]["batches"] < QUERIES and runs[3]["mean_batch"] > 1.0
    assert APPROX[NAME] == 1e-9
    assert runs[1]["checksum"] == pytest.approx(runs[3]["checksum"], rel=APPROX[NAME])


def test_checksum_recomputed_by_hand(heldout_runs, backend):
    """Every request made again from the docstring and scored by hand in float64 from the
    parameters ``initialize`` seeded (the same as ``torch.manual_seed(0)`` and the script's
    ``DeepFM``); the script's checksum at 1 and 3 threads agrees. The script's own requests are
    the same arrays, and ``execute`` on each request alone agrees with the hand scores (the check
    on the hand math only)."""
    mod, b = backend
    p = {k: v.detach().double().numpy() for k, v in b.model.state_dict().items()}
    assert set(p) == {"offsets", "first.weight", "emb.weight", "deep.0.weight", "deep.0.bias", "deep.2.weight",
                      "deep.2.bias", "deep.4.weight", "deep.4.bias"}
    assert np.array_equal(p["offsets"], np.arange(FIELDS) * VOCAB)
    torch.manual_seed(0)
    again = mod.DeepFM(VOCAB)
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in again.state_dict().items())
    assert not b.model.training and b.device == torch.device("cpu")
    flat, sizes = [], set()
    for rid, inputs in enumerate(_requests()):
        theirs = mod.make_request(0, rid, VOCAB)
        assert set(theirs) == {"DENSE", "SPARSE_IDS"}
        assert all(np.array_equal(theirs[k], inputs[k]) for k in inputs)
        n = len(inputs["DENSE"])
        assert 1 <= n <= MAX_ROWS and inputs["DENSE"].dtype == np.float32
        sizes.add(n)
        s = _hand_scores(p, inputs["DENSE"], inputs["SPARSE_IDS"])
        (resp,) = b.execute([mod.InferenceRequest(inputs)])
        np.testing.assert_allclose(resp.outputs["SCORE"], s, rtol=1e-5, atol=1e-6)
        flat.append(s)
    assert len(sizes) > 10  # the row count changes between requests
    flat = np.concatenate(flat)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for t in THREADS:
        r = json.loads(heldout_runs[(NAME, t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)


def test_execute_scores_a_dynamic_batch_in_one_call_and_splits_it_back(backend):
    """``execute`` on batches of our own (1, 2, 5 and 16 requests): one model call a batch, one
    response a request in request order, each the request's own rows, equal to the request
    executed alone up to rounding."""
    mod, b = backend
    reqs = [mod.InferenceRequest(inputs) for inputs in _requests()[:16]]
    alone = [b.execute([r])[0].outputs["SCORE"] for r in reqs]
    calls = []
    handle = b.model.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    try:
        for size in (1, 2, 5, 16):
            calls.clear()
            responses = b.execute(reqs[:size])
            assert calls == [sum(len(r.inputs["DENSE"]) for r in reqs[:size])]
            assert len(responses) == size
            for resp, req, ref in zip(responses, reqs, alone):
                out = resp.outputs["SCORE"]
                assert set(resp.outputs) == {"SCORE"} and isinstance(out, np.ndarray) and out.dtype == np.float32
                assert out.shape == (len(req.inputs["DENSE"]),)
                np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)
    finally:
        handle.remove()


def test_the_stand_in_batcher_forms_full_batches_from_queued_requests():
    """Ten requests queued before the scheduler starts, ``max_batch`` 4: three ``execute`` calls
    (4, 4 and 2 requests: the last after the delay runs out), every request answered with its own
    scores; ``stop`` ends the scheduler and calls ``finalize``."""
    with _tiny_run(NAME) as (mod, _):
        b = _backend(mod)
    seen = []
    execute = b.execute
    b.execute = lambda requests: seen.append(len(requests)) or execute(requests)
    server = mod.StandInServer(b, max_batch=4, max_delay_ms=50)
    inputs = _requests()[:10]
    reqs = [server.enqueue(x) for x in inputs]
    server.start()
    for r in reqs:
        assert r.done.wait(timeout=30)
    server.stop()
    assert seen == [4, 4, 2] and (server.batches, server.batched) == (3, 10)
    assert b.model is None and not server.scheduler.is_alive()
    with _tiny_run(NAME) as (mod, _):
        ref = _backend(mod)
    for r, x in zip(reqs, inputs):
        expected = ref.execute([mod.InferenceRequest(x)])[0].outputs["SCORE"]
        np.testing.assert_allclose(r.response.outputs["SCORE"], expected, rtol=0, atol=1e-6)


def test_the_backends_args_are_tritons_strings():
    """The script's own ``args`` for ``initialize`` are strings, the configuration JSON with the
    seed, the vocabulary, the batch bound in rows and the delay in microseconds."""
    with _tiny_run(NAME) as (mod, _):
        args = mod.backend_args(0, VOCAB, "cpu", 4, 20.0)
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_instance_kind"] == "CPU"
    config = json.loads(args["model_config"])
    assert config["parameters"] == {"seed": {"string_value": "0"}, "vocab": {"string_value": str(VOCAB)}}
    assert config["max_batch_size"] == 4 * MAX_ROWS
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 20_000}
    assert mod.backend_args(0, VOCAB, "cuda:1")["model_instance_kind"] == "GPU"
    assert mod.backend_args(0, VOCAB, "cuda:1")["model_instance_device_id"] == "1"
