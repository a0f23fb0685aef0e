"""The suite of realistic scripts in examples/scripts/ (issue 25) runs on the CPU too.

Each is a plain program that imports nothing of ours; its last output line is the JSON
that ``profile --apply`` reads (``qps`` ... or ``step_ms``) with a ``checksum`` over every
output of its timed window. A serving script's checksum must not depend on its thread
count (the GPU test compares a hooked run with an unhooked one by it), and must depend on
what the model computed (another seed gives another one). The DLRM's checksum is also
recomputed here, request by request, from the script's own model and request builder.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "examples" / "scripts"
#: tiny sizes for each serving script (with --device cpu)
SERVE = {
    "dlrm_numpy_serve.py": ["--queries", "24", "--batch", "8", "--vocab", "500", "--warmup", "1"],
    "deepfm_serve.py": ["--queries", "24", "--rows", "8", "--vocab", "300"],
    "two_tower_retrieval.py": ["--queries", "24", "--items", "1500", "--users", "300", "-k", "10"],
    "mmoe_ranker.py": ["--queries", "24", "--items", "16", "--vocab", "500"],
    "candidates_ranker.py": ["--queries", "12", "--items", "3000", "--users", "300", "--categories", "40"],
}
TRAIN = ["--samples", "1000", "--batch", "96", "--vocab", "500", "--epochs", "2", "--warmup", "3"]
#: what the scripts may import: the standard library and the usual stack, nothing of ours
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "pandas", "torch"}


def run(name: str, *args: str) -> dict:
    """Run ``examples/scripts/NAME --device cpu ARGS`` (one intra-op thread, nothing on
    PYTHONPATH); its last output line, parsed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    p = subprocess.run([sys.executable, str(SCRIPTS / name), "--device", "cpu", *args], capture_output=True,
                       text=True, timeout=180, cwd=SCRIPTS, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    last = p.stdout.strip().splitlines()[-1]
    return json.loads(last)


def test_the_suite_is_what_the_tests_cover():
    assert sorted(p.name for p in SCRIPTS.glob("*.py")) == sorted([*SERVE, "dataloader_train.py"])


@pytest.mark.parametrize("name", sorted([*SERVE, "dataloader_train.py"]))
def test_a_script_imports_nothing_of_ours(name):
    tree = ast.parse((SCRIPTS / name).read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods and mods <= ALLOWED, mods - ALLOWED
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


@pytest.mark.parametrize("name", sorted(SERVE))
def test_serving_checksum_does_not_depend_on_the_thread_count(name):
    one = run(name, *SERVE[name], "--threads", "1")
    three = run(name, *SERVE[name], "--threads", "3")
    other_seed = run(name, *SERVE[name], "--threads", "2", "--seed", "1")
    n = int(SERVE[name][SERVE[name].index("--queries") + 1])
    for r, threads in ((one, 1), (three, 3), (other_seed, 2)):
        assert r["threads"] == threads and r["queries"] == n
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    assert three["checksum"] == one["checksum"]
    assert other_seed["checksum"] != one["checksum"]


def test_dlrm_checksum_is_every_request_in_order():
    """The DLRM's checksum recomputed here: its model and requests (imported from the
    script), scored one request at a time, position-weighted in request order."""
    import numpy as np
    import torch

    spec = importlib.util.spec_from_file_location("dlrm_numpy_serve", SCRIPTS / "dlrm_numpy_serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    queries, batch, vocab = 10, 8, 500
    got = run("dlrm_numpy_serve.py", "--queries", str(queries), "--batch", str(batch), "--vocab", str(vocab),
              "--warmup", "1", "--threads", "2")
    torch.manual_seed(0)
    model = mod.DLRM(vocab).eval()
    outs, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # as in the script's run: the same matmul order, bit for bit
    try:
        with torch.no_grad():
            for rid in range(queries):
                dense, ids = mod.make_request(0, rid, batch, vocab)
                outs.append(model(torch.from_numpy(dense), torch.from_numpy(ids), torch.arange(batch)).numpy())
    finally:
        torch.set_num_threads(threads)
    flat = np.concatenate(outs).astype(np.float64)
    assert flat.size == queries * batch and ((flat > 0) & (flat < 1)).all()  # sigmoid scores
    weights = 1.0 + np.arange(flat.size) / (flat.size - 1)
    assert got["checksum"] == pytest.approx(float(flat @ weights), rel=1e-12)


def test_training_script_is_deterministic_and_counts_its_steps():
    a = run("dataloader_train.py", *TRAIN)
    b = run("dataloader_train.py", *TRAIN)
    c = run("dataloader_train.py", *TRAIN, "--seed", "1")
    # 1000 samples in batches of 96: 11 steps an epoch (the last one 40 rows), 3 not timed
    assert a["steps"] == 2 * 11 - 3
    assert a["step_ms"] > 0
    assert a["checksum"] == b["checksum"] and a["final_loss"] == b["final_loss"]
    assert c["checksum"] != a["checksum"]


def test_training_script_refuses_a_run_with_nothing_to_time():
    p = subprocess.run([sys.executable, str(SCRIPTS / "dataloader_train.py"), "--device", "cpu", "--samples", "100",
                        "--batch", "50", "--epochs", "1", "--warmup", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no step left to time" in p.stderr


def test_the_tool_reads_each_run_the_gpu_suite_compares(tmp_path):
    """What ``profile --apply`` runs a script with (``run_script``: its printed measurement,
    each run appended to one program.log) and what the GPU suite reads back from that log:
    every run's checksum, in the order the runs were made."""
    from recsys_doctor.applying.script_hook import run_script
    from test_scripts_suite_gpu import _results

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "program.log"
    dlrm = [sys.executable, str(SCRIPTS / "dlrm_numpy_serve.py"), "--device", "cpu", *SERVE["dlrm_numpy_serve.py"]]
    a, _ = run_script([*dlrm, "--threads", "2"], env=env, log=log)
    b, _ = run_script([*dlrm, "--threads", "2", "--seed", "1"], env=env, log=log)
    t, _ = run_script([sys.executable, str(SCRIPTS / "dataloader_train.py"), "--device", "cpu", *TRAIN],
                      env=env, log=log)
    assert a["qps"] > 0 and t["step_ms"] > 0 and "qps" not in t
    assert [r["checksum"] for r in _results(log)] == [a["checksum"], b["checksum"], t["checksum"]]
    # a run under a plan says so in the log (confirm.log holds the script as it is, then the plan)
    plan = tmp_path / "plan.json"
    run_script([*dlrm, "--threads", "1"], env={**env, "RECSYS_DOCTOR_PLAN": str(plan)}, log=log)
    heads = [ln for ln in log.read_text().splitlines() if ln.startswith("$ ")]
    assert len(heads) == 4 and not any("RECSYS_DOCTOR_PLAN" in h for h in heads[:3])
    assert heads[3].startswith(f"$ RECSYS_DOCTOR_PLAN={plan} {sys.executable} ")
