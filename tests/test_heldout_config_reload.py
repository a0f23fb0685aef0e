"""The live-configuration held-out script (examples/heldout/config_reload_serve.py) on the CPU.

Its ranker's ``forward`` reads a module-level ``FLAGS`` dict (a blend weight, and a flag that
turns a freshness term on), a module-level ``TEMPERATURE`` the reloader rebinds, and a mutable
``ServingConfig`` dataclass (clip, bias) the reloader changes in place; between request waves an
admin reloader changes one of them. A CUDA graph captured in the first wave would replay the
first configuration for every later wave. Here the reload schedule is replayed from the
script's docstring (not through its reloader), every request is scored by hand in float64 from
the parameters under the configuration in force in its wave (bags summed by numpy indexing, the
MLPs and the wide part by matmuls), and every real change is shown to move its wave's scores,
so the script's checksum and wave sums would catch a stale configuration.
"""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest
import torch
from test_heldout_scripts import THREADS, TINY, _load, _tiny_run

NAME = "config_reload_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}

#: the configuration at start and the reloader's changes, as the script's docstring gives them:
#: change w (before wave w, w >= 1) is KINDS[(w - 1) % 6]; a kind with values takes the next of
#: its four in turn, ``freshness`` flips the flag, ``reload`` writes back the same values
START = {"blend": 0.5, "use_freshness": False, "fresh_weight": 0.3, "temperature": 1.0, "clip": 1.0, "bias": 0.0}
KINDS = ("blend", "freshness", "temperature", "clip", "bias", "reload")
VALUES = {"blend": (0.8, 0.35, 0.65, 0.2), "temperature": (1.6, 0.7, 1.25, 0.5),
          "clip": (0.4, 2.5, 0.7, 1.5), "bias": (0.3, -0.2, 0.15, -0.35)}


def _schedule(queries: int, every: int) -> list[tuple[str | None, dict]]:
    """Each wave's (change before it, configuration in force): None and START for wave 0."""
    cfg, done = dict(START), collections.Counter()
    out = [(None, dict(cfg))]
    for w in range(1, math.ceil(queries / every)):
        kind = KINDS[(w - 1) % len(KINDS)]
        if kind == "freshness":
            cfg["use_freshness"] = not cfg["use_freshness"]
        elif kind in VALUES:
            cfg[kind] = VALUES[kind][done[kind] % len(VALUES[kind])]
        done[kind] += 1
        out.append((kind, dict(cfg)))
    return out


@pytest.fixture(scope="module")
def model():
    """The script's module and its model as it builds it (``torch.manual_seed(seed)``, then the
    ranker with the starting ``ServingConfig``)."""
    with _tiny_run(NAME) as (mod, _):
        net = mod.Ranker(ARGS["--vocab"], mod.ServingConfig(clip=START["clip"], bias=START["bias"])).eval()
    return mod, net


def _requests(mod):
    return [mod.make_request(0, rid, ARGS["--rows"], ARGS["--vocab"]) for rid in range(ARGS["--queries"])]


def _parts(p: dict, ids: np.ndarray, dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The deep and the wide logit, [rows] each, in float64 from the parameters alone."""
    d = dense.astype(np.float64)
    bags = [p[f"tables.{i}.weight"][ids[:, i]].sum(axis=1) for i in range(ids.shape[1])]  # mode="sum"
    h = np.maximum(d @ p["dense.0.weight"].T + p["dense.0.bias"], 0.0)
    x = np.concatenate(bags + [h @ p["dense.2.weight"].T + p["dense.2.bias"]], axis=1)
    h = np.maximum(x @ p["top.0.weight"].T + p["top.0.bias"], 0.0)
    deep = (h @ p["top.2.weight"].T + p["top.2.bias"])[:, 0]
    wide = (d @ p["wide.weight"].T + p["wide.bias"])[:, 0]
    return deep, wide


def _hand_scores(p: dict, request, cfg: dict) -> np.ndarray:
    ids, dense, fresh = request
    deep, wide = _parts(p, ids, dense)
    logits = cfg["blend"] * deep + (1.0 - cfg["blend"]) * wide
    if cfg["use_freshness"]:
        logits = logits + cfg["fresh_weight"] * fresh.astype(np.float64)
    logits = np.clip(logits / cfg["temperature"], -cfg["clip"], cfg["clip"]) + cfg["bias"]
    return 1.0 / (1.0 + np.exp(-logits))


def _waves(p: dict, reqs, schedule) -> list[list[np.ndarray]]:
    """Every request's hand scores, grouped by wave, each wave under its configuration."""
    every = ARGS["--reload-every"]
    return [[_hand_scores(p, reqs[rid], cfg) for rid in range(w * every, min((w + 1) * every, len(reqs)))]
            for w, (_, cfg) in enumerate(schedule)]


def _params(net) -> dict:
    return {k: v.detach().double().numpy() for k, v in net.state_dict().items()}


def test_checksum_and_wave_sums_recomputed_by_hand_under_each_waves_configuration(heldout_runs, model):
    """Every request scored in float64 by hand under the configuration its wave was served with;
    the script's checksum and wave sums agree at 1 and 3 threads. The model's own ``forward``,
    given each wave's configuration through the module's ``FLAGS``/``TEMPERATURE`` and its
    ``cfg``, agrees with the hand scores on each wave's first request (the check on the hand math
    only)."""
    mod, net = model
    assert mod.FLAGS == {k: START[k] for k in ("blend", "use_freshness", "fresh_weight")}
    assert mod.TEMPERATURE == START["temperature"]
    p, reqs = _params(net), _requests(mod)
    schedule = _schedule(ARGS["--queries"], ARGS["--reload-every"])
    waves = _waves(p, reqs, schedule)
    every = ARGS["--reload-every"]
    saved = dict(mod.FLAGS), mod.TEMPERATURE
    try:
        with torch.inference_mode():
            for w, (_, cfg) in enumerate(schedule):
                mod.FLAGS.update({k: cfg[k] for k in ("blend", "use_freshness", "fresh_weight")})
                mod.TEMPERATURE = cfg["temperature"]
                net.cfg = mod.ServingConfig(clip=cfg["clip"], bias=cfg["bias"])
                ids, dense, fresh = reqs[w * every]
                ref = net(torch.from_numpy(ids), torch.from_numpy(dense), torch.from_numpy(fresh)).numpy()
                np.testing.assert_allclose(ref, waves[w][0], rtol=1e-5, atol=1e-6)
    finally:
        mod.FLAGS.update(saved[0])
        mod.TEMPERATURE = saved[1]
        net.cfg = mod.ServingConfig(clip=START["clip"], bias=START["bias"])
    flat = np.concatenate([s for wave in waves for s in wave])
    assert flat.size == ARGS["--queries"] * ARGS["--rows"]
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    sums = [float(np.concatenate(wave).sum()) for wave in waves]
    for t in THREADS:
        r = json.loads(heldout_runs[(NAME, t)][0])
        assert set(r) == {"script", "qps", "p50_ms", "p99_ms", "threads", "queries", "reloads", "wave_sums",
                          "checksum"}
        assert r["threads"] == t and r["queries"] == ARGS["--queries"]
        assert r["reloads"] == len(schedule) - 1 == 7
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)
        assert r["wave_sums"] == pytest.approx(sums, rel=1e-6)
    one, three = (json.loads(heldout_runs[(NAME, t)][0]) for t in THREADS)
    assert one["checksum"] == three["checksum"] and one["wave_sums"] == three["wave_sums"]


def test_every_change_moves_its_wave_and_a_stale_configuration_shows(heldout_runs, model):
    """Each wave recomputed under the configuration of the wave before it: every real change
    (blend, freshness on or off, temperature, clip, bias) changes its wave's scores and sum, the
    no-change reload leaves them exactly as they were. With the first wave's configuration held
    for the whole run (a graph captured in wave 0 and replayed), every later wave's sum is off the
    script's by far more than the tolerance of the recompute."""
    mod, net = model
    p, reqs = _params(net), _requests(mod)
    schedule = _schedule(ARGS["--queries"], ARGS["--reload-every"])
    every = ARGS["--reload-every"]
    waves = _waves(p, reqs, schedule)
    for w in range(1, len(schedule)):
        kind, prev = schedule[w][0], schedule[w - 1][1]
        before = np.concatenate([_hand_scores(p, reqs[rid], prev)
                                 for rid in range(w * every, min((w + 1) * every, len(reqs)))])
        now = np.concatenate(waves[w])
        if kind == "reload":
            assert schedule[w][1] == prev and np.array_equal(now, before)
        else:
            assert schedule[w][1] != prev, kind
            assert not np.allclose(now, before, rtol=1e-4, atol=1e-5), kind
            assert abs(float(now.sum()) - float(before.sum())) > 1e-3, kind
    stale = _waves(p, reqs, [(None, START)] * len(schedule))
    r = json.loads(heldout_runs[(NAME, 3)][0])
    assert r["wave_sums"][0] == pytest.approx(float(np.concatenate(stale[0]).sum()), rel=1e-6)
    for w in range(1, len(schedule)):
        gap = abs(r["wave_sums"][w] - float(np.concatenate(stale[w]).sum()))
        assert gap > 1e-2, (w, schedule[w])


def test_every_kind_of_change_is_made_at_the_tiny_and_the_default_sizes():
    """At the tiny sizes every kind of change happens at least once (freshness both on and off
    later), at the script's defaults (3,000 requests, waves of 150) at least twice; the script's
    own reloader, run on a fresh copy of its module, leaves the configuration the docstring's
    schedule gives after every change."""
    tiny = _schedule(ARGS["--queries"], ARGS["--reload-every"])
    assert collections.Counter(k for k, _ in tiny[1:]) == {k: 1 for k in KINDS} | {"blend": 2}
    assert {cfg["use_freshness"] for _, cfg in tiny} == {False, True}
    mod = _load(NAME)
    defaults = mod.parse_args([])
    assert (defaults.queries, defaults.reload_every, defaults.rows, defaults.threads) == (3000, 150, 64, 8)
    full = _schedule(defaults.queries, defaults.reload_every)
    counts = collections.Counter(k for k, _ in full[1:])
    assert len(full) == 20 and set(counts) == set(KINDS) and min(counts.values()) >= 2
    net = mod.Ranker(ARGS["--vocab"], mod.ServingConfig(clip=START["clip"], bias=START["bias"]))
    for w, (kind, cfg) in enumerate(full[1:], start=1):
        assert mod.reload_config(net, w) == kind
        seen = {**mod.FLAGS, "temperature": mod.TEMPERATURE, "clip": net.cfg.clip, "bias": net.cfg.bias}
        assert seen == cfg, (w, kind)
