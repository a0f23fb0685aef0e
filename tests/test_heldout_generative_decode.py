"""The generative decode held-out script (examples/heldout/generative_decode_serve.py) on the CPU.

A SASRec/HSTU-style model generates ``--steps`` items a user greedily, with a key/value cache
that its decode step (``model(last_ids, k_cache, v_cache, pos)``, ``pos`` a Python int) writes
in place, attending over a cache slice one longer every step. Here the script is run at 1 and 3
threads (the same checksum, exactly) and with another ``--steps``; its requests are made again
from the docstring's description (not through its ``make_request``), and every request is
decoded again WITHOUT a cache, in float64: at each step full causal attention over the whole
sequence so far (history + generated), computed here from the model's own layers. Those ids
(exactly), scores and the checksum they give must agree with the script's. The decode step is
shown to write into the caller's caches, one position a call, through ``nn.Module.__call__``
with a plain int position.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_heldout_scripts import HELDOUT, THREADS, TINY, _tiny_run

NAME = "generative_decode_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, ROWS, ITEMS, MAX_LEN, STEPS = (ARGS[k] for k in ("--queries", "--rows", "--items", "--max-len", "--steps"))
#: the sizes the docstring gives: the width and the heads
DIM, HEADS = 64, 2
HD = DIM // HEADS
#: the other step count run, to show the checksum depends on it
OTHER_STEPS = 3


def _request(seed: int, rid: int) -> np.ndarray:
    """A request as the docstring describes it: ``default_rng([seed, rid])``, one history length
    in [max_len // 2, max_len], then ``rows`` histories of that length, ids in [1, items)."""
    rng = np.random.default_rng([seed, rid])
    length = int(rng.integers(MAX_LEN // 2, MAX_LEN + 1))
    return rng.integers(1, ITEMS, (ROWS, length))


@pytest.fixture(scope="module")
def runs() -> dict[tuple[int, int], dict]:
    """The script's JSON line at 1 and 3 threads (TINY sizes) and at 2 threads with
    ``--steps OTHER_STEPS``, by (threads, steps); one intra-op thread, nothing on PYTHONPATH."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    cases = [(t, STEPS) for t in THREADS] + [(2, OTHER_STEPS)]
    procs = {}
    for t, steps in cases:
        args = [*TINY[NAME]]
        args[args.index("--steps") + 1] = str(steps)
        procs[(t, steps)] = subprocess.Popen([sys.executable, str(HELDOUT / NAME), "--device", "cpu", *args,
                                              "--threads", str(t)], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, cwd=HELDOUT, env=env)
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{key}: {stderr[-2000:]}"
        lines = stdout.splitlines()
        assert len(lines) == 1, lines
        out[key] = json.loads(lines[0])
    return out


def _build(steps: int):
    """The script's module and its model as it builds it (``torch.manual_seed(0)``, then
    ``GenRec(items, max_len, steps)``), in eval mode."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--items"]) == ITEMS and int(a["--max-len"]) == MAX_LEN
        net = mod.GenRec(ITEMS, MAX_LEN, steps).eval()
    return mod, net


@pytest.fixture(scope="module")
def model():
    return _build(STEPS)


def _heads(t: torch.Tensor) -> torch.Tensor:
    """[rows, T, D] -> [rows, heads, T, HD]."""
    return t.view(t.shape[0], t.shape[1], HEADS, HD).transpose(1, 2)


def _full_pass(ref, seq: torch.Tensor):
    """The whole sequence ``seq`` [rows, T] through the model's layers, no cache: explicit causal
    softmax attention over every position. Returns (the last position's logits [rows, items], the
    keys and values [rows, heads, T, HD])."""
    t = seq.shape[1]
    x = ref.item(seq) + ref.pos.weight[:t]
    q, k, v = _heads(ref.q(x)), _heads(ref.k(x)), _heads(ref.v(x))
    att = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
    att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    h = x + (att @ v).transpose(1, 2).reshape(seq.shape[0], t, DIM)
    y = h + ref.ff(ref.norm(h))
    return y[:, -1] @ ref.item.weight.T, k, v


def _reference(ref, hist: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy decode without a cache: each step runs the full sequence so far again, masks the
    items of the history and those generated, takes the argmax and its logit."""
    seq = torch.from_numpy(hist)
    ids, scores = [], []
    with torch.no_grad():
        for _ in range(steps):
            logits, _, _ = _full_pass(ref, seq)
            logits[torch.arange(seq.shape[0])[:, None], seq] = float("-inf")
            best = logits.max(dim=1)
            ids.append(best.indices)
            scores.append(best.values)
            seq = torch.cat([seq, best.indices[:, None]], dim=1)
    return torch.stack(ids, 1).numpy(), torch.stack(scores, 1).numpy()


def _checksum(outputs) -> float:
    return sum((rid + 1) * (float(ids.sum()) + float(scores.astype(np.float64).sum()))
               for rid, (ids, scores) in enumerate(outputs))


def test_json_line_and_the_same_checksum_at_every_thread_count(runs):
    for t in THREADS:
        r = runs[(t, STEPS)]
        assert set(r) == {"script", "threads", "queries", "qps", "p50_ms", "p99_ms", "steps", "rows", "checksum"}
        assert r["script"] == "generative_decode_serve" and r["threads"] == t and r["queries"] == QUERIES
        assert (r["steps"], r["rows"]) == (STEPS, ROWS)
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert isinstance(r["checksum"], float) and math.isfinite(r["checksum"])
    assert runs[(1, STEPS)]["checksum"] == runs[(3, STEPS)]["checksum"]


def test_requests_are_as_the_docstring_says(model):
    """The script's requests are the docstring's arrays; their history lengths vary."""
    mod, _ = model
    lengths = set()
    for rid in range(QUERIES):
        hist = _request(0, rid)
        theirs = mod.make_request(0, rid, ROWS, ITEMS, MAX_LEN)
        assert theirs.dtype == np.int64 and np.array_equal(theirs, hist)
        assert hist.min() >= 1 and hist.max() < ITEMS
        lengths.add(hist.shape[1])
    assert len(lengths) > 3 and min(lengths) >= MAX_LEN // 2 and max(lengths) <= MAX_LEN


def test_cached_decode_and_checksum_agree_with_a_decode_without_cache(runs, model):
    """Every request decoded by the script's ``decode`` (KV cache, float32) and by the
    no-cache float64 reference: the same ids, scores within rtol 1e-5; the ids are new (not in
    the history, none twice); the reference's checksum is the script's at 1 and 3 threads."""
    mod, net = model
    ref = copy.deepcopy(net).double()
    outputs = []
    with _tiny_run(NAME):
        for rid in range(QUERIES):
            hist = _request(0, rid)
            ids, scores = _reference(ref, hist, STEPS)
            theirs_ids, theirs_scores = mod.decode(net, torch.from_numpy(hist), STEPS)
            assert np.array_equal(np.asarray(theirs_ids), ids), rid
            assert theirs_scores.dtype == np.float32 and theirs_scores.shape == (ROWS, STEPS)
            np.testing.assert_allclose(theirs_scores, scores, rtol=1e-5)
            for row in range(ROWS):
                assert len(set(ids[row])) == STEPS and not set(ids[row]) & set(hist[row])
            outputs.append((ids, scores))
    expected = _checksum(outputs)
    for t in THREADS:
        assert runs[(t, STEPS)]["checksum"] == pytest.approx(expected, rel=1e-6)


def test_the_decode_step_writes_the_callers_caches_in_place(model):
    """``prefill`` returns new zeroed caches [rows, heads, L + steps, HD] holding the history's
    keys and values; each decode call, made through ``model(...)`` with a plain int position,
    writes that one position of the caller's cache tensors (equal to the keys and values of a full
    pass over the sequence), leaves the later ones zero; at the end no position is zero."""
    mod, net = model
    ref = copy.deepcopy(net).double()
    hist = _request(0, 1)
    length = hist.shape[1]
    calls = []
    handle = net.register_forward_pre_hook(lambda m, args: calls.append((type(args[3]), args[3], args[1], args[2])))
    try:
        with torch.inference_mode():
            logits, kc, vc = net.prefill(torch.from_numpy(hist))
            assert kc.shape == vc.shape == (ROWS, HEADS, length + STEPS, HD)
            assert not kc[:, :, length:].any() and not vc[:, :, length:].any()
            seq = torch.from_numpy(hist)
            for step in range(STEPS):
                pos = length + step
                nxt = logits.argmax(dim=1)
                seq = torch.cat([seq, nxt[:, None]], dim=1)
                logits = net(nxt, kc, vc, pos)
                assert kc[:, :, pos].abs().amax(dim=-1).min() > 0 and vc[:, :, pos].abs().amax(dim=-1).min() > 0
                assert not kc[:, :, pos + 1:].any() and not vc[:, :, pos + 1:].any()
                _, k, v = _full_pass(ref, seq)
                np.testing.assert_allclose(kc[:, :, : pos + 1].numpy(), k.float().numpy(), rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(vc[:, :, : pos + 1].numpy(), v.float().numpy(), rtol=1e-4, atol=1e-5)
        assert (kc.abs().amax(dim=(0, 1, 3)) > 0).all() and (vc.abs().amax(dim=(0, 1, 3)) > 0).all()
        calls.clear()
        mod.decode(net, torch.from_numpy(hist), STEPS)  # the script's loop: one __call__ a step
    finally:
        handle.remove()
    assert [(c[0], c[1]) for c in calls] == [(int, length + s) for s in range(STEPS)]
    assert all(c[2] is calls[0][2] and c[3] is calls[0][3] for c in calls)  # the same cache tensors each step


def test_the_step_count_matters(runs, model):
    """``--steps OTHER_STEPS`` gives another checksum, and it is the no-cache reference's for that
    step count (its model built with that count: a shorter position table). With one model, fewer
    steps generate a prefix of the same ids."""
    mod, net = model
    other = runs[(2, OTHER_STEPS)]
    assert other["steps"] == OTHER_STEPS and other["checksum"] != runs[(1, STEPS)]["checksum"]
    _, net_other = _build(OTHER_STEPS)
    ref = copy.deepcopy(net_other).double()
    expected = _checksum([_reference(ref, _request(0, rid), OTHER_STEPS) for rid in range(QUERIES)])
    assert other["checksum"] == pytest.approx(expected, rel=1e-6)
    hist = torch.from_numpy(_request(0, 2))
    with _tiny_run(NAME):
        short, _ = mod.decode(net, hist, 2)
        full, _ = mod.decode(net, hist, STEPS)
    assert [row[:2] for row in full] == short
