"""The exported-artefact ranker held-out script (examples/heldout/exported_ranker_serve.py) on the CPU.

It serves a DCN-v2 ranker not as the eager module but as a graph artefact made from it at
start-up: ``torch.export`` (saved and loaded back, then ``ep.module()``), ``torch.fx.symbolic_trace``
or ``torch.jit.trace``. Here the script runs once per ``--export`` mode (its own subprocesses, not
conftest's ``heldout_runs``, which runs every held-out script): the JSON keys, the three modes'
checksums agreeing (one function, three artefacts), and the checksum recomputed in float64 numpy
from the seeded eager model's parameters with the requests made again from the docstring's
description. The artefacts are built in-process as the script builds them and checked to be what
the JSON's ``artefact`` names, and the request maker is checked to keep every row count inside the
exported ``Dim``'s range (the exported module's guards do not check that range's lower end).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from test_heldout_scripts import HELDOUT, TINY, _tiny_run

NAME = "exported_ranker_serve.py"
ARGS = {k: v for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, VOCAB, MAX_ROWS = (
    int(ARGS[k]) for k in ("--queries", "--vocab", "--max-rows")
)
MODES = ("export", "fx", "trace")
#: the sizes the docstring gives: fields, dense features, embedding width, cross layers
FIELDS, DENSE, DIM, CROSS = 8, 13, 16, 2
KEYS = {
    "script",
    "threads",
    "queries",
    "qps",
    "p50_ms",
    "p99_ms",
    "export",
    "artefact",
    "checksum",
}


def _args(mode: str, threads: int) -> list[str]:
    args = {**ARGS, "--export": mode, "--threads": str(threads)}
    return ["--device", "cpu", *(x for kv in args.items() for x in kv)]


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """The script at 3 client threads once per ``--export`` mode, all at once (one intra-op thread,
    nothing on PYTHONPATH, as conftest's runs): each one's single JSON line, by mode."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    procs = {
        m: subprocess.Popen(
            [sys.executable, str(HELDOUT / NAME), *_args(m, 3)],
            cwd=HELDOUT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for m in MODES
    }
    out = {}
    for m, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{m}: {stderr[-2000:]}"
        lines = stdout.splitlines()
        assert len(lines) == 1, lines
        out[m] = json.loads(lines[0])
    return out


@contextlib.contextmanager
def _script():
    """The script's module under ``_tiny_run`` (seed 0, one intra-op thread), and the process-wide
    settings its top level makes (the allocator variable, matmul precision, cudnn benchmark) put
    back afterwards: they are the script's, not the test session's."""
    env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    precision, benchmark = (
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.benchmark,
    )
    try:
        with _tiny_run(NAME) as (mod, a):
            assert a == ARGS
            yield mod
    finally:
        if env is None:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = env
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.benchmark = benchmark


@pytest.fixture(scope="module")
def script():
    """The module, the eager model as the script builds it (seeded, eval) and each mode's
    artefact built from it in-process by the script's ``build_artefact``."""
    with _script() as mod:
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert (
            torch.get_float32_matmul_precision() == "high"
            and torch.backends.cudnn.benchmark
        )
        torch.manual_seed(0)
        net = mod.DCNv2Ranker(VOCAB).eval()
        # torch.jit.trace's deprecation notice (recent torch) is not this test's
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", r".*torch\.jit\.trace", DeprecationWarning
            )
            served = {
                m: mod.build_artefact(net, m, MAX_ROWS, torch.device("cpu"))
                for m in MODES
            }
    return mod, net, served


def _request(
    seed: int, rid: int, max_rows: int, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """A request as the docstring describes it: ``default_rng([seed, rid])``, then the row count in
    [max(2, max_rows // 8), max_rows], the ids ``[rows, 8]`` int64, the dense features float32."""
    rng = np.random.default_rng([seed, rid])
    rows = rng.integers(max(2, max_rows // 8), max_rows + 1)
    ids = rng.integers(0, vocab, (rows, FIELDS), dtype=np.int64)
    dense = rng.standard_normal((rows, DENSE)).astype(np.float32)
    return ids, dense


def _hand(p: dict, ids: np.ndarray, dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ctr, logit), ``[rows]`` each, in float64 from the parameters alone."""
    lin = lambda name, x: x @ p[f"{name}.weight"].T + p[f"{name}.bias"]
    x0 = np.concatenate(
        [p[f"tables.{k}.weight"][ids[:, k]] for k in range(FIELDS)]
        + [dense.astype(np.float64)],
        axis=1,
    )
    x = x0
    for layer in range(CROSS):
        x = x0 * lin(f"cross.{layer}", x) + x
    deep = np.maximum(lin("deep.2", np.maximum(lin("deep.0", x0), 0.0)), 0.0)
    logit = lin("head", np.concatenate([x, deep], axis=1))[:, 0]
    return 1.0 / (1.0 + np.exp(-logit)), logit


def test_json_line_of_every_mode_and_their_checksums_agree(runs):
    """One JSON line per mode with the script's keys; the three artefacts compute one function, so
    their checksums agree."""
    for m, r in runs.items():
        assert set(r) == KEYS, r
        assert r["script"] == "exported_ranker_serve" and r["export"] == m
        assert r["threads"] == 3 and r["queries"] == QUERIES
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    sums = [runs[m]["checksum"] for m in MODES]
    assert sums[1] == pytest.approx(sums[0], rel=1e-5) and sums[2] == pytest.approx(
        sums[0], rel=1e-5
    )


def test_checksum_recomputed_by_hand(runs, script):
    """Every request made again from the docstring and scored in float64 numpy from the seeded
    eager model's parameters (lookups by indexing, the cross layers and the MLP by matmuls, the
    sigmoid); every mode's checksum agrees. The script's requests are the same arrays, and the
    eager model agrees with the hand math request by request (the check on the hand math)."""
    mod, net, _ = script
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    assert set(p) == (
        {f"tables.{k}.weight" for k in range(FIELDS)}
        | {
            f"{n}.{w}"
            for n in ("cross.0", "cross.1", "deep.0", "deep.2", "head")
            for w in ("weight", "bias")
        }
    )
    assert p["cross.0.weight"].shape == (141, 141) and p["head.weight"].shape == (
        1,
        141 + 128,
    )
    expected, rows = 0.0, set()
    with torch.inference_mode():
        for rid in range(QUERIES):
            ids, dense = _request(0, rid, MAX_ROWS, VOCAB)
            theirs = mod.make_request(0, rid, MAX_ROWS, VOCAB)
            assert np.array_equal(theirs[0], ids) and np.array_equal(theirs[1], dense)
            assert ids.dtype == np.int64 and dense.dtype == np.float32
            rows.add(len(ids))
            ctr, logit = _hand(p, ids, dense)
            out = net(torch.from_numpy(ids), torch.from_numpy(dense))
            np.testing.assert_allclose(out["ctr"].numpy(), ctr, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(
                out["logit"].numpy(), logit, rtol=1e-4, atol=1e-5
            )
            expected += (rid + 1) * (ctr.sum() + 0.01 * logit.sum())
    assert len(rows) > QUERIES // 3  # the shapes vary
    for m in MODES:
        assert runs[m]["checksum"] == pytest.approx(expected, rel=1e-5), m


def test_the_artefacts_are_what_the_json_names(runs, script):
    """export and fx serve a ``torch.fx.GraphModule`` (fx's named after the traced class), trace a
    ``torch.jit.ScriptModule``; none is the eager class, each gives the eager model's outputs, and
    the exported one carries the declared row range and refuses a request above it."""
    _, net, served = script
    for m, art in served.items():
        assert type(art).__name__ == runs[m]["artefact"], m
        assert not isinstance(art, type(net)), m
    assert (
        isinstance(served["export"], torch.fx.GraphModule)
        and runs["export"]["artefact"] == "GraphModule"
    )
    assert (
        isinstance(served["fx"], torch.fx.GraphModule)
        and runs["fx"]["artefact"] == "DCNv2Ranker"
    )
    assert (
        isinstance(served["trace"], torch.jit.ScriptModule)
        and runs["trace"]["artefact"] == "TopLevelTracedModule"
    )
    ids, dense = (torch.from_numpy(a) for a in _request(0, 0, MAX_ROWS, VOCAB))
    with torch.inference_mode():
        ref = net(ids, dense)
        for m, art in served.items():
            out = art(ids, dense)
            assert set(out) == {"ctr", "logit"}, m
            for k in out:
                torch.testing.assert_close(out[k], ref[k], rtol=1e-5, atol=1e-6)
    (rng,) = served["export"].range_constraints.values()
    assert (int(rng.lower), int(rng.upper)) == (2, MAX_ROWS)
    big = (
        torch.zeros(MAX_ROWS + 1, FIELDS, dtype=torch.int64),
        torch.zeros(MAX_ROWS + 1, DENSE),
    )
    with (
        torch.inference_mode(),
        pytest.raises((AssertionError, RuntimeError, ValueError)),
    ):
        served["export"](*big)


@pytest.mark.parametrize("max_rows", [MAX_ROWS, 8, 256])
def test_request_rows_stay_inside_the_exported_range(script, max_rows):
    """Every row count the request maker makes is inside the exported Dim's [2, max_rows] (from
    max(2, max_rows // 8)), both ends of its range are made, and the ids are inside the vocabulary."""
    mod, _, _ = script
    lo = max(2, max_rows // 8)
    rows = []
    for rid in range(3000):
        ids, dense = mod.make_request(0, rid, max_rows, VOCAB)
        assert ids.shape == (len(dense), FIELDS) and dense.shape == (len(ids), DENSE)
        assert 0 <= ids.min() and ids.max() < VOCAB
        rows.append(len(ids))
    assert 2 <= min(rows) and max(rows) <= max_rows
    assert min(rows) == lo and max(rows) == max_rows
