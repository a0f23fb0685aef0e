"""The multi-tenant PLE held-out script (examples/heldout/tenant_ple_serve.py) on the CPU.

One model per market, of different sizes and task counts, chosen per request with a skew
(one hot market), each request with its own row count, the tasks blended outside the model.
A replay keyed by shapes alone could score one market's request with another market's
graph; here the checksum is recomputed from each market's parameters by hand, in float64
(lookups, the experts' Linear/ReLU layers, the gates' softmax, the towers), never through
``forward``, and the requests are shown to spread over markets, task counts and row counts.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import torch
from test_heldout_scripts import THREADS, TINY, _load, _tiny_run

NAME = "tenant_ple_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}


def _requests(mod):
    return [mod.make_request(0, rid, ARGS["--tenants"], ARGS["--vocab"], ARGS["--max-rows"])
            for rid in range(ARGS["--queries"])]


def _relu(x):
    return np.maximum(x, 0.0)


def _linear(p, name, x):
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _expert(p, name, x):
    return _relu(_linear(p, f"{name}.2", _relu(_linear(p, f"{name}.0", x))))


def _tasks_by_hand(model, dense: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Each task's [rows] probabilities in float64 from the state_dict: the fields' rows
    beside the dense features, the task's own experts then the shared ones mixed by the
    gate's softmax, the tower, a sigmoid; the tasks in the order of their gates."""
    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    fields = ids.shape[1]
    x = np.concatenate([dense.astype(np.float64)] + [p[f"embs.{f}.weight"][ids[:, f]] for f in range(fields)], axis=1)
    shared = [_expert(p, f"shared.{i}", x) for i in range(len({k.split(".")[1] for k in p if k.startswith("shared.")}))]
    tasks = [k.split(".")[1] for k in p if k.startswith("gates.") and k.endswith(".weight")]
    out = {}
    for t in tasks:
        own = sorted({int(k.split(".")[2]) for k in p if k.startswith(f"experts.{t}.")})
        ex = np.stack([_expert(p, f"experts.{t}.{i}", x) for i in own] + shared, axis=1)  # [rows, E, OUT]
        logits = _linear(p, f"gates.{t}", x)
        w = np.exp(logits - logits.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
        mixed = (w[:, :, None] * ex).sum(1)
        logit = _linear(p, f"towers.{t}.2", _relu(_linear(p, f"towers.{t}.0", mixed)))[:, 0]
        out[t] = 1.0 / (1.0 + np.exp(-logit))
    return out


def test_checksum_recomputed_by_hand_from_each_markets_parameters(heldout_runs):
    """Every request scored by its market's model written out in float64, blended as the
    script does, the top k by a stable full sort instead of ``topk``; the script's models
    agree with the hand outputs request by request (the check on the hand math only)."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--tenants"]) == ARGS["--tenants"]
        models = mod.build_models(ARGS["--tenants"], ARGS["--vocab"], 0)
        top = ARGS["--top"]
        scores, positions, means, seen = [], [], 0.0, set()
        for tenant, dense, ids in _requests(mod):
            out = _tasks_by_hand(models[tenant], dense, ids)
            with torch.inference_mode():
                ref = models[tenant](torch.from_numpy(dense), torch.from_numpy(ids))
            assert list(ref) == list(out)
            for t in out:
                np.testing.assert_allclose(ref[t].numpy(), out[t], rtol=1e-5, atol=1e-6)
            score = out["ctr"] * (1 + out["cvr"]) + (0.1 * out["dwell"] if "dwell" in out else 0.0)
            order = np.argsort(-score, kind="stable")[:min(top, len(score))]
            scores.append(score[order])
            positions.append(order.astype(np.float64))
            means += sum(float(v.mean()) for v in out.values())
            seen.add(tenant)
    s, pos = np.concatenate(scores), np.concatenate(positions)
    expected = float(s @ np.linspace(1.0, 2.0, s.size)) + 1e-6 * float(pos @ np.linspace(1.0, 2.0, pos.size)) + means
    for th in THREADS:
        r = json.loads(heldout_runs[(NAME, th)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-6) and r["tenants_seen"] == len(seen)


def test_requests_spread_over_markets_task_counts_and_row_counts():
    """More than one market serves, the markets used differ in their task count (and their
    expert width), the row counts vary within 20..--max-rows, and the hot market gets the most."""
    mod = _load(NAME)
    reqs = _requests(mod)
    counts = collections.Counter(t for t, _, _ in reqs)
    assert len(counts) > 1
    models = mod.build_models(ARGS["--tenants"], ARGS["--vocab"], 0)
    assert len({len(models[t].tasks) for t in counts}) > 1
    assert len({models[t].shared[0][0].out_features for t in counts}) > 1
    rows = [len(ids) for _, _, ids in reqs]
    assert len(set(rows)) > 1 and min(rows) >= 20 and max(rows) <= ARGS["--max-rows"]
    assert all(d.shape == (len(i), mod.N_DENSE) and d.dtype == np.float32 and i.max() < ARGS["--vocab"]
               for _, d, i in reqs)
    hot = f"m{mod.HOT}"
    assert counts.most_common(1)[0][0] == hot and all(n < counts[hot] for t, n in counts.items() if t != hot)
