"""A process serving a replica of its model on each GPU, under the script hook (run on a GPU
machine with two GPUs or more: ``pytest -m gpu tests/test_autoapply_multigpu_gpu.py``; skipped
with fewer).

``examples/heldout/multi_gpu_serve.py``: worker ``k`` calls ``torch.cuda.set_device(k % n)`` at
its start and serves with replica ``k % n``, its dense inputs moved with ``.cuda()`` (the current
device) and its ids with ``device=f"cuda:{i}"``. Under every plan the scores must be the unhooked
run's (the checksum covers every request in order) and every replica must serve."""

from __future__ import annotations

from pathlib import Path

import pytest
from _hooked_script import assert_same_scores, graphed_calls, run_hooked, run_json

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "heldout" / "multi_gpu_serve.py"
ARGS = ["--threads", "4", "--queries", "2000"]


@pytest.fixture(scope="module")
def unhooked() -> dict:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs or more")
    got = run_json(SCRIPT, ARGS)
    assert got["replicas"] >= 2 and all(got["per_replica"]), got
    return got


@pytest.mark.parametrize("groups,batching", [(1, False), (2, False), (2, True)])
def test_replicas_on_several_gpus_keep_the_unhooked_scores(tmp_path, unhooked, groups, batching):
    got, st = run_hooked(tmp_path, SCRIPT, ARGS, groups, batching)
    assert_same_scores(got, unhooked, st)
    assert got["replicas"] == unhooked["replicas"] and all(got["per_replica"]), got
    if not batching:  # (graphs of both GPUs' replicas replayed: 1,991 and 1,981 of 2,012 calls on two H200s)
        assert graphed_calls(st) >= 2000 // 2, st
