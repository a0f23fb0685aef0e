"""A model refreshed while it serves, under the script hook on a real GPU (run on the GPU
machine: ``pytest -m gpu tests/test_autoapply_refresh_gpu.py``).

``examples/heldout/model_refresh_serve.py`` installs a new model version between request waves
in the four ways teams do (``load_state_dict`` in place, ``load_state_dict(assign=True)``, a new
model object, a new Python-float temperature). Under each plan - one group, two groups (with
the threads' own graphs of their copies), two groups batching (the runtime's served route) -
every score must be the unhooked run's: the checksum covers every request in order. Before
``_autoapply/modstate.py`` the graphs captured from the first version replayed for every later
one (wrong checksums), and the batching plan crashed the process
(``bench/apply/results/refresh_h200/``). The graphs must also be used (most calls replayed),
and the changes seen (``module_changes``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _hooked_script import assert_same_scores, graphed_calls, run_hooked, run_json

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "heldout" / "model_refresh_serve.py"
ARGS = ["--threads", "4", "--queries", "1200", "--refresh-every", "150"]


@pytest.fixture(scope="module")
def unhooked() -> dict:
    return run_json(SCRIPT, ARGS)


@pytest.mark.parametrize("groups,batching", [(1, False), (2, False), (2, True)])
def test_a_refreshed_model_keeps_the_unhooked_scores(tmp_path, unhooked, groups, batching):
    got, st = run_hooked(tmp_path, SCRIPT, ARGS, groups, batching)
    assert_same_scores(got, unhooked, st)
    assert got["versions"] == unhooked["versions"] == 8
    # assign x2, calibrate x1 (in place needs nothing; a new object is a new module)
    assert st["module_changes"] >= 3, st
    assert graphed_calls(st) >= 1200 // 2, st
