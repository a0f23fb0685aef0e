"""The held-out JSON-over-HTTP DeepFM service (examples/heldout/http_json_serve.py) on the CPU.

Its model is called by the handler threads of a ``ThreadingHTTPServer``, one per client
connection; its checksum must not depend on the number of client threads, and is recomputed
here from the model's parameters by hand (lookups, the FM identity, the MLP's weights), in
float64, never through ``forward``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_heldout_scripts import THREADS, TINY, _load

NAME = "http_json_serve.py"


def _scores_by_hand(model, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """DeepFM written out from the parameters, in float64: first order (dense linear term and
    each field's weight), the FM term 0.5 * ((sum v)^2 - sum v^2), then the MLP layer by layer."""
    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    fields = ids.shape[1]
    x = dense.astype(np.float64)
    first = x @ p["linear.weight"][0] + p["linear.bias"][0]
    first += sum(p[f"first.{k}.weight"][ids[:, k], 0] for k in range(fields))
    v = np.stack([p[f"embs.{k}.weight"][ids[:, k]] for k in range(fields)], axis=1)  # [rows, fields, dim]
    fm = 0.5 * (v.sum(1) ** 2 - (v**2).sum(1)).sum(1)
    h = np.concatenate([v.reshape(len(ids), -1), x], axis=1)
    linears = sorted({k.rsplit(".", 1)[0] for k in p if k.startswith("deep.")}, key=lambda k: int(k.split(".")[1]))
    for i, name in enumerate(linears):
        h = h @ p[f"{name}.weight"].T + p[f"{name}.bias"]
        if i < len(linears) - 1:
            h = np.maximum(h, 0.0)
    return 1.0 / (1.0 + np.exp(-(first + fm + h[:, 0])))


def test_checksum_recomputed_by_hand_and_the_row_count_varies(heldout_runs):
    mod = _load(NAME)
    a = dict(zip(TINY[NAME][::2], TINY[NAME][1::2]))
    queries, vocab, max_rows = (int(a[k]) for k in ("--queries", "--vocab", "--max-rows"))
    torch.manual_seed(0)  # the script's default --seed, set before it builds the model
    model = mod.DeepFM(vocab).eval()
    assert len([k for k in model.state_dict() if k.startswith("deep.") and k.endswith(".weight")]) == 3
    flat, rows = [], []
    for rid in range(queries):
        body = mod.make_request(0, rid, vocab, max_rows)
        assert body["rid"] == rid and isinstance(body["dense"][0][0], float) and isinstance(body["ids"][0][0], int)
        dense, ids = np.array(body["dense"], dtype=np.float32), np.array(body["ids"], dtype=np.int64)
        assert dense.shape == (len(ids), mod.N_DENSE) and ids.shape[1] == mod.FIELDS and ids.max() < vocab
        rows.append(len(ids))
        flat.append(_scores_by_hand(model, dense, ids))
    assert len(set(rows)) > 1 and min(rows) >= max_rows // 8 and max(rows) <= max_rows
    flat = np.concatenate(flat)
    assert 0.05 < flat.std() and 0.0 < flat.min() and flat.max() < 1.0  # scores spread, not saturated
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for t in THREADS:
        assert json.loads(heldout_runs[(NAME, t)][0])["checksum"] == pytest.approx(expected, rel=1e-6)
    # a request's body is a function of (seed, rid) alone, and another seed gives other requests
    assert mod.make_request(0, 5, vocab, max_rows) == mod.make_request(0, 5, vocab, max_rows)
    assert mod.make_request(1, 5, vocab, max_rows) != mod.make_request(0, 5, vocab, max_rows)
