"""The held-out scripts of examples/heldout/ run on the CPU, and their checksums hold.

They are written the way other teams write serving code, in patterns the suite of
examples/scripts/ does not use, to be run through ``profile --apply`` on the GPU
(tests/test_heldout_gpu.py). That comparison rests on one property checked here: with the
same seed, a script's checksum does not depend on its thread count. The branchy DLRM's
checksum is also recomputed here from its own model and requests, one request at a time,
and both sides of its data-dependent branch are shown to be taken and to matter.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_example_scripts import ALLOWED

HELDOUT = Path(__file__).resolve().parents[1] / "examples" / "heldout"
#: tiny sizes for each script (with --device cpu)
TINY = {
    "dcn_frame_serve.py": ["--queries", "16", "--rows", "8", "--vocab", "300"],
    "async_rerank_server.py": ["--queries", "16", "--items", "1500", "--users", "300", "--history", "12"],
    "fresh_boost_dlrm.py": ["--queries", "24", "--batch", "16", "--vocab", "300"],
    "amp_ranker_serve.py": ["--queries", "40", "--batch", "16", "--vocab", "500"],
    "pinned_stream_serve.py": ["--queries", "40", "--rows", "16", "--vocab", "500"],
    "mp_pool_serve.py": ["--queries", "24", "--procs", "2", "--batch", "16", "--vocab", "500"],
    "asyncio_inline_serve.py": ["--queries", "24", "--batch", "16", "--vocab", "500"],
    "compiled_ranker_serve.py": ["--queries", "24", "--batch", "16", "--vocab", "500", "--mode", "none"],
    "model_refresh_serve.py": ["--queries", "40", "--refresh-every", "8", "--batch", "16", "--vocab", "500"],
    "jagged_dlrm_serve.py": ["--queries", "24", "--batch", "16", "--vocab", "500"],
    "feature_pipeline_serve.py": ["--queries", "24", "--batch", "16", "--vocab", "500"],
    "topk_candidates_serve.py": ["--queries", "24", "--items", "2000", "--users", "300"],
    "own_graphs_serve.py": ["--queries", "24", "--rows", "16", "--vocab", "500"],
    "own_batcher_serve.py": ["--queries", "40", "--vocab", "500", "--max-delay-ms", "20"],
    "early_pool_serve.py": ["--queries", "24", "--rows", "16", "--vocab", "500"],
    "proc_pool_serve.py": ["--queries", "24", "--rows", "16", "--vocab", "500"],
    "short_threads_serve.py": ["--queries", "24", "--rows", "16", "--vocab", "500"],
    "log_only_serve.py": ["--queries", "24", "--rows", "16", "--vocab", "500"],
    "cascade_serve.py": ["--queries", "24", "--items", "600", "--retrieve", "40", "--top", "8"],
    "event_timed_serve.py": ["--queries", "24", "--batch", "16", "--vocab", "500"],
    "frozen_pool_serve.py": ["--queries", "24", "--vocab", "500", "--max-rows", "16"],
    "dataparallel_serve.py": ["--queries", "24", "--vocab", "500", "--max-rows", "48"],
    "seqrec_serve.py": ["--queries", "24", "--users", "4", "--items", "500", "--max-len", "12", "--cands", "10"],
    "http_json_serve.py": ["--queries", "24", "--vocab", "500", "--max-rows", "16"],
    "gru4rec_serve.py": ["--queries", "24", "--sessions", "4", "--items", "500", "--max-len", "8", "--cands", "10",
                         "--top", "3"],
    "tenant_ple_serve.py": ["--queries", "24", "--tenants", "3", "--vocab", "500", "--max-rows", "32", "--top", "5"],
    "dataclass_batch_serve.py": ["--queries", "24", "--vocab", "500", "--max-rows", "48"],
    "config_reload_serve.py": ["--queries", "48", "--reload-every", "6", "--rows", "16", "--vocab", "500"],
    "multi_gpu_serve.py": ["--queries", "40", "--replicas", "2", "--vocab", "500"],
    "kjt_ranker_serve.py": ["--queries", "24", "--rows", "16", "--vocab", "500"],
    "triton_backend_serve.py": ["--queries", "40", "--vocab", "500", "--max-delay-ms", "20"],
    "online_learning_serve.py": ["--queries", "48", "--waves", "4", "--train-steps", "3", "--train-batch", "64",
                                 "--rows", "16", "--vocab", "500"],
    "generative_decode_serve.py": ["--queries", "16", "--rows", "4", "--items", "500", "--max-len", "12",
                                   "--steps", "4"],
    "exported_ranker_serve.py": ["--queries", "24", "--vocab", "500", "--max-rows", "32", "--export", "export"],
    "optional_features_serve.py": ["--queries", "24", "--vocab", "500", "--max-rows", "32"],
    "method_api_serve.py": ["--queries", "24", "--vocab", "500"],
    "replica_per_thread_serve.py": ["--queries", "24", "--vocab", "500"],
    "subprocess_server_serve.py": ["--queries", "24", "--vocab", "500"],
    "executor_procs_serve.py": ["--queries", "24", "--vocab", "500"],
    "offline_scoring_serve.py": ["--queries", "8", "--batch", "16", "--vocab", "500"],
    "sparse_amp_train.py": ["--samples", "1000", "--batch", "64", "--vocab", "500", "--log-every", "4"],
    "log_train.py": ["--steps", "30", "--batch", "32", "--users", "500", "--items", "500", "--log-every", "4"],
    "ddp_train.py": ["--samples", "1000", "--batch", "64", "--vocab", "500", "--accum", "3", "--epochs", "2",
                     "--log-every", "4"],
    "amp_accum_train.py": ["--samples", "2048", "--batch", "128", "--vocab", "500", "--epochs", "1",
                           "--eval-every", "2"],
}
#: scripts whose batches depend on timing (each row's score up to the rounding of products of
#: other sizes): their checksums agree to this relative difference, not exactly
APPROX = {"own_batcher_serve.py": 1e-9, "triton_backend_serve.py": 1e-9}
#: the training loops among them (a step time, no queries): their worker count must not change the checksum
TRAIN = {"amp_accum_train.py", "log_train.py", "sparse_amp_train.py", "ddp_train.py"}
#: the flag a script takes for its number of clients, where it is not --threads (and its JSON key)
CLIENTS = {"asyncio_inline_serve.py": ("--concurrency", "concurrency"), "amp_accum_train.py": ("--workers", "workers"),
           "proc_pool_serve.py": ("--procs", "procs"), "executor_procs_serve.py": ("--procs", "procs"),
           "offline_scoring_serve.py": ("--workers", "workers"),
           "log_train.py": ("--prefetch", "prefetch"),
           "sparse_amp_train.py": ("--workers", "workers"), "ddp_train.py": ("--workers", "workers")}
THREADS = (1, 3)
#: scripts that print no throughput or latency (``profile --apply`` measures them itself)
NO_QPS = {"log_only_serve.py"}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name[:-3], HELDOUT / name)
    mod = importlib.util.module_from_spec(spec)
    grad = torch.is_grad_enabled()
    try:
        spec.loader.exec_module(mod)
    finally:  # a script's top-level set_grad_enabled(False) (frozen_pool_serve.py) is not the tests'
        torch.set_grad_enabled(grad)
    return mod


def json_runs(heldout_runs: dict, name: str) -> dict[int, dict]:
    """Script ``name``'s one JSON line at each thread count of ``THREADS``, parsed, from conftest's
    ``heldout_runs``."""
    for t in THREADS:
        assert len(heldout_runs[(name, t)]) == 1, heldout_runs[(name, t)]
    return {t: json.loads(heldout_runs[(name, t)][0]) for t in THREADS}


def tiny_json(name: str, *extra: str, timeout: float = 300) -> dict:
    """``name``'s one JSON line on the CPU with its TINY arguments and ``extra``, run as conftest's
    ``heldout_runs`` runs it (one intra-op thread, nothing on PYTHONPATH); it must print only that line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    p = subprocess.run([sys.executable, str(HELDOUT / name), "--device", "cpu", *TINY[name], *extra],
                       capture_output=True, text=True, cwd=HELDOUT, env=env, timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 1, lines
    return json.loads(lines[0])


@contextlib.contextmanager
def _tiny_run(name: str):
    """``name``'s module and its TINY arguments as a dict, with the seed set and one intra-op
    thread meanwhile, as the runs (OMP_NUM_THREADS=1: the same summation order)."""
    mod = _load(name)
    torch.manual_seed(0)
    intra = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield mod, dict(zip(TINY[name][::2], TINY[name][1::2]))
    finally:
        torch.set_num_threads(intra)


@pytest.fixture
def runs(heldout_runs) -> dict[tuple[str, int], list[str]]:
    """Every script at 1 and 3 client threads (conftest's ``heldout_runs``, run once a session)."""
    return heldout_runs


def test_the_folder_is_what_the_tests_cover():
    assert sorted(p.name for p in HELDOUT.glob("*.py")) == sorted(TINY)


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_heldout_script_imports_nothing_of_ours(name):
    tree = ast.parse((HELDOUT / name).read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods and mods <= ALLOWED, mods - ALLOWED
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


@pytest.mark.parametrize("name", sorted(set(TINY) - TRAIN))
def test_one_json_line_and_a_checksum_that_ignores_the_thread_count(name, runs):
    queries = int(TINY[name][TINY[name].index("--queries") + 1])
    results = {}
    for t in THREADS:
        lines = runs[(name, t)]
        assert len(lines) == 1, lines
        r = json.loads(lines[0])
        assert r["script"] == name[:-3] and r[CLIENTS.get(name, ("", "threads"))[1]] == t and r["queries"] == queries
        if name in NO_QPS:
            assert not {"qps", "p50_ms", "p99_ms", "step_ms"} & set(r), r
        else:
            assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert isinstance(r["checksum"], float) and math.isfinite(r["checksum"]) and r["checksum"] != 0
        results[t] = r
    if name in APPROX:
        assert results[1]["checksum"] == pytest.approx(results[3]["checksum"], rel=APPROX[name])
    else:
        assert results[1]["checksum"] == results[3]["checksum"]


def test_fresh_boost_checksum_recomputed_and_its_branch_matters(runs):
    """The DLRM with ``if fresh.sum() > 0:`` in forward: its checksum recomputed from the
    script's model and requests one at a time; some requests take the boost, some do not,
    and the boost changes the fresh rows' scores (so a replay of the wrong branch shows)."""
    mod = _load("fresh_boost_dlrm.py")
    args = dict(zip(TINY["fresh_boost_dlrm.py"][::2], TINY["fresh_boost_dlrm.py"][1::2]))
    queries, batch, vocab = int(args["--queries"]), int(args["--batch"]), int(args["--vocab"])
    torch.manual_seed(0)
    model = mod.FreshDLRM(vocab).eval()
    flat, fresh_requests, boosted = [], 0, 0
    with torch.no_grad():
        for rid in range(queries):
            dense, ids, fresh = mod.make_request(0, rid, batch, vocab)
            x = (torch.from_numpy(dense).float(), torch.from_numpy(ids))
            probs = model(*x, torch.from_numpy(fresh)).numpy()
            plain = model(*x, torch.zeros(batch)).numpy()
            fresh_requests += bool(fresh.any())
            boosted += int(np.sum(probs[fresh > 0] != plain[fresh > 0]))
            assert np.array_equal(probs[fresh == 0], plain[fresh == 0])
            flat += [probs.max(), np.sum(probs * fresh > 0.5), *probs]
    flat = np.asarray(flat, dtype=np.float64)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    assert 0 < fresh_requests < queries
    assert boosted > 0
    r = json.loads(runs[("fresh_boost_dlrm.py", 3)][0])
    assert r["fresh_requests"] == fresh_requests
    assert r["checksum"] == pytest.approx(expected, rel=1e-12)


def test_rerank_requests_vary_in_size():
    """Every request of the asyncio re-ranker goes through the model whole: its candidate
    counts differ from request to request, within 50..400."""
    mod = _load("async_rerank_server.py")
    sizes = {len(mod.make_request(0, rid, 300, 1500, 12)["items"]) for rid in range(16)}
    assert len(sizes) > 8 and min(sizes) >= 50 and max(sizes) <= 400


def test_amp_ranker_checksum_recomputed_and_its_precisions_differ(runs):
    """The bf16 autocast ranker: its checksum recomputed from the script's model and requests
    one at a time (bf16 scores, and the float32 shadow gap of every 16th request); the shadow
    gaps are not zero (a call replayed in the other precision shows in the checksum)."""
    mod = _load("amp_ranker_serve.py")
    args = dict(zip(TINY["amp_ranker_serve.py"][::2], TINY["amp_ranker_serve.py"][1::2]))
    queries, batch, vocab = int(args["--queries"]), int(args["--batch"]), int(args["--vocab"])
    torch.manual_seed(0)
    model = mod.Ranker(vocab).eval()
    flat, gaps = [], []
    with torch.inference_mode():
        for rid in range(queries):
            dense, ids = (torch.from_numpy(a) for a in mod.make_request(0, rid, batch, vocab))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = model(dense, ids)
            assert low.dtype == torch.bfloat16
            scores = torch.sigmoid(low.float())
            gap = 0.0
            if rid % 16 == 0:
                gap = float((torch.sigmoid(model(dense, ids)) - scores).abs().max())
                gaps.append(gap)
            flat += [*scores.double().tolist(), gap]
    flat = np.asarray(flat, dtype=np.float64)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    assert len(gaps) == 3 and min(gaps) > 1e-4, gaps
    r = json.loads(runs[("amp_ranker_serve.py", 3)][0])
    assert r["shadow_requests"] == 3
    assert r["checksum"] == pytest.approx(expected, rel=1e-12)


def test_model_refresh_checksum_recomputed_and_every_refresh_changes_the_scores(runs):
    """The server that installs a new model version between request waves, four ways in turn
    (in place, ``assign=True``, a new object, a new temperature): its checksum recomputed with a
    model built for each wave from the version's weights and the temperature in force, and every
    refresh changes the next wave's scores (a graph of the version before would show)."""
    mod = _load("model_refresh_serve.py")
    args = dict(zip(TINY["model_refresh_serve.py"][::2], TINY["model_refresh_serve.py"][1::2]))
    queries, every = int(args["--queries"]), int(args["--refresh-every"])
    batch, vocab = int(args["--batch"]), int(args["--vocab"])
    w_version, temp = 0, mod.weights(0, 0, vocab, "cpu")[1]
    flat, modes = [], []
    prev = None
    for wave, start in enumerate(range(0, queries, every)):
        if wave:
            mode = mod.MODES[(wave - 1) % len(mod.MODES)]
            modes.append(mode)
            new_temp = mod.weights(wave, 0, vocab, "cpu")[1]
            w_version = w_version if mode == "calibrate" else wave
            temp = new_temp if mode in ("calibrate", "swap") else temp
        model = mod.Ranker(vocab, temperature=temp)
        model.load_state_dict(mod.weights(w_version, 0, vocab, "cpu")[0])
        model.eval()
        with torch.inference_mode():
            for rid in range(start, min(start + every, queries)):
                ids, dense = mod.make_request(0, rid, batch, vocab)
                scores = model(torch.from_numpy(ids), torch.from_numpy(dense)).numpy()
                if rid == start and prev is not None:
                    assert not np.allclose(scores, prev(torch.from_numpy(ids), torch.from_numpy(dense)).numpy())
                flat += list(scores)
        prev = model
    assert modes == ["inplace", "assign", "swap", "calibrate"]
    flat = np.asarray(flat, dtype=np.float64)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    r = json.loads(runs[("model_refresh_serve.py", 3)][0])
    assert r["versions"] == 5
    assert r["checksum"] == pytest.approx(expected, rel=1e-9)


def test_jagged_requests_change_shape_every_time():
    """The jagged DLRM's requests: the same batch, but every feature's number of ids (so the
    shape of its values tensor) differs from request to request; empty bags occur."""
    mod = _load("jagged_dlrm_serve.py")
    shapes = set()
    empty = 0
    for rid in range(8):
        dense, values, lengths = mod.make_request(0, rid, 64, 500, 20)
        assert dense.shape == (64, mod.N_DENSE) and [len(v) for v in values] == [int(n.sum()) for n in lengths]
        shapes.add(tuple(len(v) for v in values))
        empty += sum(int((n == 0).sum()) for n in lengths)
    assert len(shapes) == 8 and empty > 0


def test_topk_requests_vary_in_size_and_the_model_returns_positions_among_them():
    """The top-k ranker: candidate counts 50..400 change from request to request, and the model
    returns k positions within the request's own candidates (a padded row would be one past them)."""
    mod = _load("topk_candidates_serve.py")
    torch.manual_seed(0)
    m = mod.TopKRanker(300, 2000, 10).eval()
    sizes = set()
    with torch.no_grad():
        for rid in range(12):
            user, items, feats = mod.make_request(0, rid, 300, 2000)
            sizes.add(len(items))
            best = m(torch.as_tensor(user), torch.as_tensor(items), torch.as_tensor(feats))
            assert best.indices.shape == (10,) and int(best.indices.max()) < len(items)
    assert len(sizes) > 8 and min(sizes) >= 50 and max(sizes) <= 400


def test_own_graphs_checksum_recomputed_without_padding(runs):
    """The script that pads its partial requests itself (to the size of its own graphs) and
    drops the padded rows' scores: its checksum recomputed from its model and requests, each
    request scored at its own row count; some requests are partial."""
    mod = _load("own_graphs_serve.py")
    args = dict(zip(TINY["own_graphs_serve.py"][::2], TINY["own_graphs_serve.py"][1::2]))
    queries, rows, vocab = int(args["--queries"]), int(args["--rows"]), int(args["--vocab"])
    torch.manual_seed(0)
    model = mod.WideDeep(vocab).eval()
    flat, partial = [], 0
    with torch.inference_mode():
        for rid in range(queries):
            dense, ids = mod.make_request(0, rid, rows, vocab)
            partial += len(dense) < rows
            flat += list(model(torch.from_numpy(dense), torch.from_numpy(ids)).numpy())
    flat = np.asarray(flat, dtype=np.float64)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    assert 0 < partial < queries
    for t in THREADS:
        r = json.loads(runs[("own_graphs_serve.py", t)][0])
        assert r["partial_requests"] == partial and r["capture"] == "main"
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)


def test_the_training_loop_prints_its_steps_and_a_checksum_that_ignores_its_workers(runs):
    """The AMP / accumulation training loop: 2,048 samples in batches of 128 are 16 micro-batches,
    8 optimizer steps at 2 a step, a validation pass every 2 steps (4); its DataLoader's worker
    processes (1 or 3) do not change what it trains on, so not its checksum either."""
    out = {}
    for t in THREADS:
        lines = runs[("amp_accum_train.py", t)]
        assert len(lines) == 1, lines
        r = json.loads(lines[0])
        assert r["script"] == "amp_accum_train" and r["workers"] == t and r["amp"] is False
        assert (r["steps"], r["evals"]) == (2048 // 128 // 2, 2048 // 128 // 2 // 2)
        assert r["step_ms"] > 0 and math.isfinite(r["checksum"])
        out[t] = r["checksum"]
    assert out[1] == out[3]


def test_own_batcher_checksum_recomputed_request_by_request(runs):
    """The server that batches its clients' requests itself: each request scored alone (no
    batch) gives its checksum to within the rounding of products of other sizes, so every
    request got its own rows back; with 3 clients requests were batched together."""
    mod = _load("own_batcher_serve.py")
    args = dict(zip(TINY["own_batcher_serve.py"][::2], TINY["own_batcher_serve.py"][1::2]))
    queries, vocab = int(args["--queries"]), int(args["--vocab"])
    torch.manual_seed(0)
    model = mod.WideDeep(vocab).eval()
    flat = []
    with torch.inference_mode():
        for rid in range(queries):
            dense, ids = mod.make_request(0, rid, 32, vocab)
            flat += list(model(torch.from_numpy(dense), torch.from_numpy(ids)).numpy())
    flat = np.asarray(flat, dtype=np.float64)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    one, three = (json.loads(runs[("own_batcher_serve.py", t)][0]) for t in THREADS)
    assert one["batches"] == queries and three["batches"] < queries  # alone: a batch a request
    for r in (one, three):
        assert r["checksum"] == pytest.approx(expected, rel=1e-9)


def _rows_checksum(name: str, make_model) -> float:
    """``name``'s checksum recomputed one request at a time: ``make_model(mod, vocab)`` (its
    weights set), each of the script's TINY requests scored alone, every score weighted by
    position; one intra-op thread, as the runs (OMP_NUM_THREADS=1: the same summation order)."""
    with _tiny_run(name) as (mod, args), torch.no_grad():
        queries, rows, vocab = int(args["--queries"]), int(args["--rows"]), int(args["--vocab"])
        model = make_model(mod, vocab).eval()
        flat = [model(torch.from_numpy(d), torch.from_numpy(i)).numpy()
                for d, i in (mod.make_request(0, rid, rows, vocab) for rid in range(queries))]
    flat = np.concatenate(flat).astype(np.float64)
    return float(flat @ np.linspace(1.0, 2.0, flat.size))


def _early_pool_model(mod, vocab):
    model = mod.DLRM(vocab)
    for k, table in enumerate(model.tables):  # (the tables from the script's own shard loader)
        table.weight.copy_(torch.from_numpy(mod.load_shard(0, k, vocab)))
    return model


def test_early_pool_checksum_recomputed_request_by_request(runs):
    """The scorer whose pool builds the tables before the model moves to the device: its
    checksum recomputed one request at a time, and its pool threads were up before the model
    moved (at least one; as many as the shard loads needed, up to the thread count)."""
    expected = _rows_checksum("early_pool_serve.py", _early_pool_model)
    for t in THREADS:
        r = json.loads(runs[("early_pool_serve.py", t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-12)
        assert 1 <= r["pool_threads_before_cuda"] <= t


def test_proc_pool_checksum_recomputed_request_by_request(runs):
    """The pool of worker processes scoring on their main threads: its checksum recomputed
    one request at a time, the same at 1 and 3 processes."""
    expected = _rows_checksum("proc_pool_serve.py", lambda mod, vocab: mod.Ranker(vocab))
    for t in THREADS:
        r = json.loads(runs[("proc_pool_serve.py", t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-12)


def test_short_threads_checksum_recomputed_for_both_spawn_modes(runs):
    """The scorer whose threads serve one request each (the default, ``--spawn request``), or
    one wave each (a new pool per ``--wave`` requests): its checksum recomputed one request at a
    time; one thread per request started, and in waves of 5 at 3 threads a pool per wave."""
    expected = _rows_checksum("short_threads_serve.py", lambda mod, vocab: mod.WideDeep(vocab))
    for t in THREADS:
        r = json.loads(runs[("short_threads_serve.py", t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-12)
        assert r["spawn"] == "request" and r["threads_started"] == r["queries"] == 24
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, str(HELDOUT / "short_threads_serve.py"), "--device", "cpu",
                          *TINY["short_threads_serve.py"], "--threads", "3", "--spawn", "wave", "--wave", "5"],
                         capture_output=True, text=True, cwd=HELDOUT, env=env, timeout=180, check=True)
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["checksum"] == pytest.approx(expected, rel=1e-12)
    # 5 waves (24 requests, 5 a wave), each its own pool of at most 3 threads, at least 1
    assert r["spawn"] == "wave" and 5 <= r["threads_started"] <= 15


def test_log_only_checksum_recomputed_and_the_hook_measures_it(runs, tmp_path):
    """The scorer that logs and prints no throughput: its checksum recomputed one request at a
    time; run as ``profile --apply`` runs a script as it is (``script_hook.run_as_is``), it prints
    no measurement, so it is run again metered and measured by its model calls: one a request."""
    from recsys_doctor.applying.script_hook import run_as_is

    expected = _rows_checksum("log_only_serve.py", lambda mod, vocab: mod.TwoTower(vocab))
    for t in THREADS:
        r = json.loads(runs[("log_only_serve.py", t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-12) and r["served"] == 24
    env_args = [sys.executable, str(HELDOUT / "log_only_serve.py"), "--device", "cpu", *TINY["log_only_serve.py"],
                "--threads", "3"]
    m, out, metered = run_as_is(env_args, tmp_path / "run", log=tmp_path / "log")
    assert metered and m["calls"] == 24 and m["qps"] > 0 and m["source"] == "hook"
    assert "INFO scored 24/24 requests" in out


def test_cascade_checksum_recomputed_and_seen_items_never_returned(runs):
    """The two-stage recommender: recomputed one request at a time with the seen items left out
    by a mask (``torch.isin``) instead of the script's in-place ``-inf``; no request returns an
    item its user has seen, and each returns ``--top`` distinct ids."""
    ids, vals = [], []
    with _tiny_run("cascade_serve.py") as (mod, a):
        queries, items, retrieve, top = (int(a[k]) for k in ("--queries", "--items", "--retrieve", "--top"))
        with torch.no_grad():
            retrieval, ranker = mod.Retrieval(items).eval(), mod.Ranker(items).eval()
            for rid in range(queries):
                dense, hist, seen = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                                     for x in mod.make_request(0, rid, items))
                s = retrieval(dense, hist)
                s = torch.where(torch.isin(torch.arange(items), torch.tensor(seen)), float("-inf"), s)
                cand = torch.topk(s, retrieve).indices
                best = torch.topk(ranker(dense, hist, cand), top)
                got = cand[best.indices]
                assert len(set(got.tolist())) == top and not set(got.tolist()) & set(seen)
                ids += got.tolist()
                vals += best.values.tolist()
    w = np.linspace(1.0, 2.0, len(ids))
    expected = float(np.array(ids, dtype=np.float64) @ w) * 1e-6 + float(np.array(vals, dtype=np.float64) @ w)
    for t in THREADS:
        r = json.loads(runs[("cascade_serve.py", t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-12)


def test_log_train_checksum_recomputed_and_the_hook_times_its_optimizer_steps(runs, tmp_path):
    """The training loop that logs its loss and prints no step time: its checksum recomputed
    here step by step (the same batches, model and Adam, one intra-op thread), whatever its
    prefetch threads; run as ``profile --apply`` runs a script as it is, it prints no
    measurement, so it is run again metered and timed by its optimizer steps."""
    from recsys_doctor.applying.script_hook import run_as_is

    with _tiny_run("log_train.py") as (mod, a):
        steps, batch, users, items = (int(a[k]) for k in ("--steps", "--batch", "--users", "--items"))
        model = mod.TwoTower(users, items).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses = []
        for step in range(steps):
            u, d, i = (torch.from_numpy(x) for x in mod.make_batch(0, step, batch, users, items))
            logits = model(u, d, i)
            assert logits.shape == (batch, batch)
            loss = torch.nn.functional.nll_loss(torch.log_softmax(logits, dim=1), torch.arange(batch))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        w = np.linspace(1.0, 2.0, steps)
        expected = float(np.array(losses) @ w) + float(model.user_emb.weight.detach().double().sum()) \
            + float(model.item_emb.weight.detach().double().sum())
    for t in THREADS:
        r = json.loads(runs[("log_train.py", t)][0])
        assert r["prefetch"] == t and r["steps"] == steps and not {"qps", "step_ms"} & set(r)
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)
    argv = [sys.executable, str(HELDOUT / "log_train.py"), "--device", "cpu", *TINY["log_train.py"]]
    m, out, metered = run_as_is(argv, tmp_path / "run", log=tmp_path / "log")
    assert metered and m["source"] == "hook" and m["step_ms"] > 0 and "INFO step 8 loss" in out


def test_seqrec_checksum_recomputed_and_its_padded_width_changes(runs):
    """The Transformer over click histories: recomputed one request at a time (histories
    padded by hand to the request's longest, the mask from the lengths, not from the ids),
    the top items by a full sort instead of ``topk``; the requests had several padded widths."""
    scores, tops, widths = [], [], set()
    with _tiny_run("seqrec_serve.py") as (mod, a):
        queries, users, items, max_len, cands, top = (int(a.get(k, d)) for k, d in (
            ("--queries", 0), ("--users", 0), ("--items", 0), ("--max-len", 0), ("--cands", 0), ("--top", 5)))
        model = mod.SeqRec(items, max_len).eval()
        with torch.inference_mode():
            for rid in range(queries):
                hists, c = mod.make_request(0, rid, users, items, max_len, cands)
                width = max(map(len, hists))
                widths.add(width)
                hist = torch.tensor([h + [0] * (width - len(h)) for h in hists])
                mask = torch.arange(width)[None, :] >= torch.tensor([len(h) for h in hists])[:, None]
                s = model(hist, mask, torch.from_numpy(c)).numpy()
                assert s.shape == (users, cands)
                scores.append(s.ravel())
                tops.append(np.take_along_axis(c, np.argsort(-s, axis=1, kind="stable")[:, :top], axis=1).ravel())
    assert len(widths) > 1
    s, t = np.concatenate(scores).astype(np.float64), np.concatenate(tops).astype(np.float64)
    expected = float(s @ np.linspace(1.0, 2.0, s.size)) + 1e-6 * float(t @ np.linspace(1.0, 2.0, t.size))
    for th in THREADS:
        r = json.loads(runs[("seqrec_serve.py", th)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-9) and r["widths"] == len(widths)


def test_sparse_amp_train_checksum_recomputed_step_by_step(runs):
    """The sparse-gradient AMP loop: retrained here batch by batch (the script's samples, no
    DataLoader, bfloat16 autocast, no scaler as on the CPU, SparseAdam and AdamW with the
    clip), one step per batch of 64 over 1,000 samples: 16 steps, the last of 40 samples;
    the same whatever its worker processes."""
    with _tiny_run("sparse_amp_train.py") as (mod, a):
        samples, batch, vocab = (int(a[k]) for k in ("--samples", "--batch", "--vocab"))
        data = mod.Clicks(samples, vocab, 0)
        model = mod.CTR(vocab).train()
        sparse = [p for bag in model.bags for p in bag.parameters()]
        dense = list(model.bottom.parameters()) + list(model.top.parameters())
        opt_s, opt_d = torch.optim.SparseAdam(sparse, lr=1e-3), torch.optim.AdamW(dense, lr=1e-3, weight_decay=1e-5)
        losses = []
        for lo in range(0, samples, batch):
            d, v, o, y = mod.collate([data[i] for i in range(lo, min(samples, lo + batch))])
            assert [int(x[-1]) + 1 <= len(vals) for x, vals in zip(o, v)] == [True] * len(v)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logit = model(d, v, o)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit.float(), y)
            opt_s.zero_grad(set_to_none=True)
            opt_d.zero_grad(set_to_none=True)
            loss.backward()
            assert all(p.grad.is_sparse for p in sparse)
            torch.nn.utils.clip_grad_norm_(dense, 1.0)
            opt_d.step()
            opt_s.step()
            losses.append(loss.item())
        steps = len(losses)
        assert steps == 16 and samples - (steps - 1) * batch == 40
        expected = float(np.array(losses) @ np.linspace(1.0, 2.0, steps)) + sum(
            float(p.detach().double().sum()) for p in model.parameters())
    for t in THREADS:
        r = json.loads(runs[("sparse_amp_train.py", t)][-1])
        assert r["workers"] == t and r["steps"] == steps and r["step_ms"] > 0 and r["scale"] is None
        assert r["checksum"] == pytest.approx(expected, rel=1e-9)


def test_frozen_pool_checksum_recomputed_and_its_workers_score_with_gradients_on(runs):
    """The frozen checkpoint served by a pool: recomputed one request at a time from a model built
    here with the script's seed (the checkpoint round trip changes no weight), under no_grad; its
    workers scored with gradients on (the script's set_grad_enabled(False) is the main thread's)."""
    with _tiny_run("frozen_pool_serve.py") as (mod, a), torch.no_grad():
        queries, vocab, max_rows = (int(a[k]) for k in ("--queries", "--vocab", "--max-rows"))
        torch.manual_seed(0)
        model = mod.Ranker(vocab).eval()
        flat = [model(torch.from_numpy(d), torch.from_numpy(i)).numpy()
                for d, i in (mod.make_request(0, rid, vocab, max_rows) for rid in range(queries))]
    assert len({len(f) for f in flat}) > 1  # the row count changes between requests
    flat = np.concatenate(flat).astype(np.float64)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for t in THREADS:
        r = json.loads(runs[("frozen_pool_serve.py", t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-12) and r["grad_in_workers"] is True


def test_event_timed_checksum_recomputed_and_padding_weighs_nothing(runs):
    """The weighted-bag ranker timed with CUDA events: recomputed one request at a time with the
    bags summed by hand over the real ids only (the padding, weight 0, left out), against the
    model's own 2-D per-sample-weighted EmbeddingBag; no GPU time on the CPU."""
    with _tiny_run("event_timed_serve.py") as (mod, a), torch.no_grad():
        queries, batch, vocab = (int(a[k]) for k in ("--queries", "--batch", "--vocab"))
        model = mod.WeightedBags(vocab).eval()
        flat = []
        for rid in range(queries):
            dense, ids, weights = mod.make_request(0, rid, batch, vocab)
            assert all(i.shape == (batch, mod.MAX_IDS) for i in ids)
            pooled = [torch.stack([(bag.weight[torch.from_numpy(i[r][w[r] > 0])] *
                                    torch.from_numpy(w[r][w[r] > 0])[:, None]).sum(0) for r in range(batch)])
                      for bag, i, w in zip(model.bags, ids, weights)]
            x = torch.cat([torch.relu(model.dense(torch.from_numpy(dense)))] + pooled, dim=1)
            flat.append(torch.sigmoid(model.mlp(x)).squeeze(1).numpy())
    flat = np.concatenate(flat).astype(np.float64)
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for t in THREADS:
        r = json.loads(runs[("event_timed_serve.py", t)][0])
        assert r["checksum"] == pytest.approx(expected, rel=1e-6) and r["gpu_p50_ms"] is None
