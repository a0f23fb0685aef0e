"""A two-stage server under the script hook on a real GPU (run on the GPU machine:
``pytest -m gpu tests/test_autoapply_pipeline_gpu.py``).

``examples/heldout/feature_pipeline_serve.py``: a feature thread moves each request to the GPU,
hashes and normalizes it there, and hands the GPU tensors over a queue to model threads, with
nothing synchronizing the two stages (on PyTorch's one default stream the order holds by itself).
Every score must be the unhooked run's, with threads placed in their groups at their start
(the default) and at their first model call (``RECSYS_DOCTOR_PLACE=first-call``: the feature
thread, which calls no model, stays on the default stream, with which the blocking group streams
are ordered). First run on the H200 in the twelfth session: 4 passed
(``bench/apply/results/dynamo_import_h200/``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _hooked_script import run_hooked, run_json

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "heldout" / "feature_pipeline_serve.py"
ARGS = ["--threads", "4", "--queries", "2000"]


@pytest.fixture(scope="module")
def unhooked() -> dict:
    return run_json(SCRIPT, ARGS)


@pytest.mark.parametrize("place", ["start", "first-call"])
@pytest.mark.parametrize("groups", [2, 4])
def test_a_pipeline_keeps_the_unhooked_scores(tmp_path, unhooked, place, groups):
    got, st = run_hooked(tmp_path, SCRIPT, ARGS, groups, extra_env={"RECSYS_DOCTOR_PLACE": place})
    assert got["checksum"] == pytest.approx(unhooked["checksum"], rel=1e-9), st
    # the model threads placed (the feature thread too where placed at its start)
    assert st["threads"] == (5 if place == "start" else 4), st
    assert st["replays"] + st["thread_replays"] >= 2000 // 2, st
