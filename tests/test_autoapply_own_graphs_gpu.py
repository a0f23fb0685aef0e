"""A script that replays CUDA graphs of its own, under the script hook on a real GPU (run on the
GPU machine: ``pytest -m gpu tests/test_autoapply_own_graphs_gpu.py``).

``examples/heldout/own_graphs_serve.py``: one graph per worker, captured the documented way (warm-up
on a side stream, ``torch.cuda.graph``), replayed on the worker's own stream between pinned
non-blocking copies. Captured in the main thread before the workers start, or by each worker at
its first request while the others replay theirs (``capture_error_mode="thread_local"``). The
hook must leave those captures and replays as they are: every score the unhooked run's. Written
after the twelfth session's last full GPU call."""

from __future__ import annotations

from pathlib import Path

import pytest
from _hooked_script import run_hooked, run_json

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "heldout" / "own_graphs_serve.py"
ARGS = ["--threads", "4", "--queries", "2000"]


@pytest.mark.parametrize("capture", ["main", "worker"])
def test_a_script_with_its_own_graphs_keeps_its_scores(tmp_path, capture):
    args = [*ARGS, "--capture", capture]
    unhooked = run_json(SCRIPT, args)
    got, st = run_hooked(tmp_path, SCRIPT, args, 2)
    assert got["capture"] == capture and got["queries"] == 2000
    assert got["checksum"] == pytest.approx(unhooked["checksum"], rel=1e-9), st
