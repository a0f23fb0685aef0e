"""The DataParallel held-out script (examples/heldout/dataparallel_serve.py) on the CPU.

On the GPU it serves a wide&deep ranker through ``nn.DataParallel`` (one GPU: the wrapper
scatters the inputs and a Python float keyword, then calls the module), loaded from a
checkpoint of the wrapped model (keys prefixed ``module.``); on the CPU it leaves the model
unwrapped. Here its checksum is recomputed in float64 numpy straight from the parameters (the
wide bag summed over the field-offset ids, the embeddings, the MLP, the sigmoid), the
``module.`` round trip is shown to give back the same parameters, and the requests' row
counts are shown to change.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
from test_heldout_scripts import THREADS, TINY, _load, _tiny_run

NAME = "dataparallel_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}


@pytest.fixture(scope="module")
def model():
    """The script's weights as it makes them (``torch.manual_seed(seed)``, then the first model built)."""
    mod = _load(NAME)
    torch.manual_seed(0)
    return mod, mod.WideDeep(ARGS["--vocab"]).eval()


def _requests(mod):
    return [mod.make_request(0, rid, ARGS["--vocab"], ARGS["--max-rows"]) for rid in range(ARGS["--queries"])]


def _hand_scores(net, dense, ids, temperature=1.0) -> np.ndarray:
    """[rows] scores in float64 from the parameters alone, no module called."""
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    vocab, fields = ARGS["--vocab"], ids.shape[1]
    wide = p["wide.weight"][ids + np.arange(fields) * vocab, 0].sum(axis=1)  # each field its own slice
    x = np.concatenate([dense.astype(np.float64)] + [p[f"embs.{k}.weight"][ids[:, k]] for k in range(fields)], axis=1)
    h = np.maximum(x @ p["mlp.0.weight"].T + p["mlp.0.bias"], 0.0)
    h = np.maximum(h @ p["mlp.2.weight"].T + p["mlp.2.bias"], 0.0)
    deep = (h @ p["mlp.4.weight"].T + p["mlp.4.bias"])[:, 0]
    return 1.0 / (1.0 + np.exp(-(wide + deep) / temperature))


def test_checksum_recomputed_by_hand(heldout_runs, model):
    """Every request scored by hand in float64; the module, wrapped in ``nn.DataParallel`` on the
    CPU and called with the script's ``temperature=`` keyword, agrees request by request (and the
    temperature reaches the logit); the script ran unwrapped on the CPU."""
    mod, net = model
    wrapped = nn.DataParallel(net)
    flat = []
    with _tiny_run(NAME), torch.no_grad():
        for dense, ids in _requests(mod):
            s = _hand_scores(net, dense, ids)
            ref = wrapped(torch.from_numpy(dense), torch.from_numpy(ids), temperature=mod.TEMPERATURE).numpy()
            np.testing.assert_allclose(ref, s, rtol=1e-5, atol=1e-6)
            flat.append(s)
        dense, ids = _requests(mod)[0]
        hot = wrapped(torch.from_numpy(dense), torch.from_numpy(ids), temperature=2.0).numpy()
        np.testing.assert_allclose(hot, _hand_scores(net, dense, ids, 2.0), rtol=1e-5, atol=1e-6)
        assert not np.allclose(hot, flat[0], rtol=1e-4, atol=1e-5)
    flat = np.concatenate(flat)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for t in THREADS:
        r = json.loads(heldout_runs[(NAME, t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)
        assert r["wrapped"] is False


def test_module_prefixed_checkpoint_round_trip(tmp_path, model):
    """The wrapper's state_dict has every key prefixed ``module.``; saved and loaded with
    ``weights_only=True`` into a fresh wrapped model it gives back the same parameters (the fresh
    model's own differed), and it does not load into a bare module. The script's own loader, on
    the CPU, returns the bare module with the weights of the first model it built."""
    mod, net = model
    vocab = ARGS["--vocab"]
    sd = nn.DataParallel(net).state_dict()
    assert sd and all(k.startswith("module.") for k in sd)
    assert {k.removeprefix("module.") for k in sd} == set(net.state_dict())
    torch.save(sd, tmp_path / "ckpt.pt")
    torch.manual_seed(1)
    fresh = nn.DataParallel(mod.WideDeep(vocab))
    assert not torch.equal(fresh.module.mlp[0].weight, net.mlp[0].weight)
    fresh.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    for k, v in net.state_dict().items():
        assert torch.equal(fresh.module.state_dict()[k], v), k
    with pytest.raises(RuntimeError):
        mod.WideDeep(vocab).load_state_dict(sd)
    loaded = mod.load_model(vocab, 0, torch.device("cpu"))
    assert type(loaded) is mod.WideDeep and not loaded.training
    for k, v in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_the_row_count_changes_between_requests(model):
    mod, _ = model
    rows = [len(d) for d, _ in _requests(mod)]
    assert len(set(rows)) > 4 and min(rows) >= mod.MIN_ROWS and max(rows) <= ARGS["--max-rows"]
    assert all(ids.shape == (len(d), mod.FIELDS) and ids.dtype == np.int64 and d.shape[1] == mod.N_DENSE
               for d, ids in _requests(mod))
