"""The online-learning held-out script (examples/heldout/online_learning_serve.py) on the CPU.

One wide&deep CTR model is served by client threads and trained in place by a learner thread
(Adagrad, dense embedding gradients, never toggled out of ``eval()``). In its default
``alternate`` mode the learner trains a few steps, signals without synchronizing, and the
clients serve a wave of requests with the model as those steps left it; so every score depends
on exactly how many steps came before it. Here the script is run at 1 and 3 client threads and
in ``concurrent`` mode, and its checksums are recomputed on one thread from the docstring's
description: the model built from the seed (the script's class, checked against a float64
forward by hand), the training batches, the requests, the order (train, then serve, each wave)
and the checksum formula all made again here, not taken from the script. Serving the waves
before their training steps gives another checksum, so the recompute would catch a request
scored with the wrong weights.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_heldout_scripts import HELDOUT, THREADS, TINY, _load, _tiny_run

NAME = "online_learning_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
#: the sizes the docstring gives: fields, dense features, the embedding width, the default
#: hidden width (the TINY run keeps it), the seed base of the training batches, Adagrad's lr
FIELDS, DENSE, DIM, HIDDEN, TRAIN_BASE, LR = 6, 13, 32, 1024, 1_000_000, 0.01
KEYS = {"script", "mode", "threads", "queries", "qps", "p50_ms", "p99_ms", "waves", "train_steps", "served",
        "checksum"}


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int], dict]:
    """The script at its TINY sizes on the CPU (one intra-op thread, as the generic runs): the
    default alternate mode at each thread count of THREADS, concurrent mode at 3 threads, all at
    once; each run's one stdout line, parsed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    cases = {("alternate", t): [] for t in THREADS} | {("concurrent", 3): ["--mode", "concurrent"]}
    procs = {key: subprocess.Popen([sys.executable, str(HELDOUT / NAME), "--device", "cpu", *TINY[NAME],
                                    "--threads", str(key[1]), *extra],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HELDOUT, env=env)
             for key, extra in cases.items()}
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{key}: {stderr[-2000:]}"
        lines = stdout.splitlines()
        assert len(lines) == 1, lines
        out[key] = json.loads(lines[0])
    return out


def _request(rid: int) -> tuple[np.ndarray, np.ndarray]:
    """Request ``rid`` as the docstring makes it: ``default_rng([seed, rid])``, ids ``[rows, 6]``
    in [0, vocab), then float32 standard normal dense features ``[rows, 13]``."""
    rng = np.random.default_rng([0, rid])
    ids = rng.integers(0, ARGS["--vocab"], (ARGS["--rows"], FIELDS))
    return ids, rng.standard_normal((ARGS["--rows"], DENSE)).astype(np.float32)


def _batch(step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training step ``step``'s batch: ``default_rng([seed, 1_000_000 + step])``, ids, dense, then
    the labels (the first dense feature plus standard normal noise, > 0) as float32."""
    rng = np.random.default_rng([0, TRAIN_BASE + step])
    n = ARGS["--train-batch"]
    ids = rng.integers(0, ARGS["--vocab"], (n, FIELDS))
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    return ids, dense, (dense[:, 0] + rng.standard_normal(n) > 0).astype(np.float32)


def _replay(serve_first: bool = False) -> dict[str, float]:
    """The alternate-mode run on one thread: a fresh model from the seed and Adagrad(lr=0.01);
    each wave its training steps, then its requests (``serve_first``: the other way round).
    Returns the checksum's three terms: the position-weighted scores, the float32 losses' sum
    (read once at the end) and the parameters' float64 sum."""
    waves, steps, queries = ARGS["--waves"], ARGS["--train-steps"], ARGS["--queries"]
    with _tiny_run(NAME) as (mod, _):
        net = mod.WideDeep(ARGS["--vocab"], HIDDEN).eval()
        opt = torch.optim.Adagrad(net.parameters(), lr=LR)
        losses, served, step = [], 0.0, 0

        def train() -> None:
            nonlocal step
            for _ in range(steps):
                ids, dense, y = (torch.from_numpy(a) for a in _batch(step))
                opt.zero_grad(set_to_none=True)
                loss = F.binary_cross_entropy_with_logits(net(ids, dense), y)
                loss.backward()
                opt.step()
                losses.append(loss.detach())
                step += 1

        def serve(w: int) -> None:
            nonlocal served
            with torch.no_grad():
                for rid in range(w * queries // waves, (w + 1) * queries // waves):
                    ids, dense = (torch.from_numpy(a) for a in _request(rid))
                    scores = torch.sigmoid(net(ids, dense)).numpy().astype(np.float64)
                    served += (rid + 1) * float(scores.sum())

        for w in range(waves):
            if serve_first:
                serve(w)
                train()
            else:
                train()
                serve(w)
        assert step == waves * steps and not net.training
        return {"serve": served, "losses": float(torch.stack(losses).sum()),
                "params": sum(float(p.detach().double().sum()) for p in net.parameters())}


@pytest.fixture(scope="module")
def replay() -> dict[str, float]:
    return _replay()


def test_json_line_and_the_same_checksum_at_every_thread_count(runs):
    """The keys of the JSON line in both modes; every request served, every step trained; the
    alternate checksum exactly the same at 1 and 3 threads."""
    for (mode, t), r in runs.items():
        assert set(r) == KEYS, set(r) ^ KEYS
        assert r["script"] == "online_learning_serve" and r["mode"] == mode and r["threads"] == t
        assert r["queries"] == r["served"] == ARGS["--queries"] and r["waves"] == ARGS["--waves"]
        assert r["train_steps"] == ARGS["--waves"] * ARGS["--train-steps"]
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert isinstance(r["checksum"], float) and np.isfinite(r["checksum"])
    assert runs[("alternate", THREADS[0])]["checksum"] == runs[("alternate", THREADS[1])]["checksum"]


def test_the_model_is_as_the_docstring_says():
    """The script's class from the seed: 6 ``Embedding(vocab, 32)`` (dense gradients), an MLP
    205-1024-1024-1, a wide ``Embedding(vocab * 6, 1)`` at zero; no dropout, no batch norm. Its
    logit agrees with a float64 forward by hand (field f's wide row ``f * vocab + id``) once the
    wide table is non-zero. The script never calls ``.train()`` and never synchronizes."""
    vocab = ARGS["--vocab"]
    with _tiny_run(NAME) as (mod, _):
        net = mod.WideDeep(vocab, HIDDEN).eval()
    shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    assert shapes == {**{f"embs.{f}.weight": (vocab, DIM) for f in range(FIELDS)},
                      "mlp.0.weight": (HIDDEN, FIELDS * DIM + DENSE), "mlp.0.bias": (HIDDEN,),
                      "mlp.2.weight": (HIDDEN, HIDDEN), "mlp.2.bias": (HIDDEN,),
                      "mlp.4.weight": (1, HIDDEN), "mlp.4.bias": (1,), "wide.weight": (vocab * FIELDS, 1)}
    assert not net.wide.weight.any()
    assert all(isinstance(m, torch.nn.Embedding) and not m.sparse for m in (*net.embs, net.wide))
    assert not any(isinstance(m, (torch.nn.Dropout, torch.nn.modules.batchnorm._BatchNorm)) for m in net.modules())
    with torch.no_grad():
        net.wide.weight.normal_()
        ids, dense = _request(0)
        ref = net(torch.from_numpy(ids), torch.from_numpy(dense)).numpy()
    p = {k: v.double().numpy() for k, v in net.state_dict().items()}
    x = np.concatenate([p[f"embs.{f}.weight"][ids[:, f]] for f in range(FIELDS)] + [dense.astype(np.float64)], 1)
    h = np.maximum(x @ p["mlp.0.weight"].T + p["mlp.0.bias"], 0.0)
    h = np.maximum(h @ p["mlp.2.weight"].T + p["mlp.2.bias"], 0.0)
    deep = (h @ p["mlp.4.weight"].T + p["mlp.4.bias"])[:, 0]
    wide = p["wide.weight"][ids + np.arange(FIELDS) * vocab, 0].sum(1)
    np.testing.assert_allclose(ref, deep + wide, rtol=1e-5, atol=1e-5)
    tree = ast.parse((HELDOUT / NAME).read_text())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "train" not in calls and "synchronize" not in calls
    assert issubclass(_load(NAME).Learner, threading.Thread)


def test_alternate_checksum_recomputed_and_the_order_matters(runs, replay):
    """The alternate run replayed on one thread (train, then serve, each wave) gives the script's
    checksum at 1 and 3 threads. Serving each wave before its steps gives the same losses and
    final parameters (serving never writes the model) but other scores: a checksum off by far
    more than the tolerance."""
    expected = replay["serve"] + replay["losses"] + replay["params"]
    for t in THREADS:
        assert runs[("alternate", t)]["checksum"] == pytest.approx(expected, rel=1e-9)
    early = _replay(serve_first=True)
    assert early["losses"] == replay["losses"] and early["params"] == replay["params"]
    wrong = early["serve"] + early["losses"] + early["params"]
    assert abs(wrong - expected) > 1e-4 * abs(expected)
    assert runs[("alternate", 3)]["checksum"] != pytest.approx(wrong, rel=1e-6)


def test_concurrent_checksum_is_the_losses_and_the_parameters(runs, replay):
    """In concurrent mode the serving outputs depend on timing and are left out: the checksum is
    the training losses' sum plus the final parameters' sum, the same steps as the alternate
    run's; every request is still served. Training moved the weights (the wide table is no
    longer zero, so the parameters' sum is not the seeded one)."""
    r = runs[("concurrent", 3)]
    assert r["served"] == r["queries"] == ARGS["--queries"]
    assert r["checksum"] == pytest.approx(replay["losses"] + replay["params"], rel=1e-9)
    assert 0 < replay["losses"] / (ARGS["--waves"] * ARGS["--train-steps"]) < 5
    with _tiny_run(NAME) as (mod, _):
        seeded = sum(float(p.detach().double().sum()) for p in mod.WideDeep(ARGS["--vocab"], HIDDEN).parameters())
    assert abs(seeded - replay["params"]) > 1e-3
