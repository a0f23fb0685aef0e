"""``profile --host-sample`` on the GPU machine (``pytest -m gpu tests/test_host_sample_gpu.py``):
the batch-scoring held-out script (a DataLoader with 2 worker processes and its pin-memory
thread feeding one loop on the main thread) sampled by py-spy, then captured by nsys.

Start-up (importing torch takes the main thread a second or more, 10 or more snapshots at one
every 0.1 s) is its own share, not a top frame: no thread's top frame is in the import system,
and the main thread's top frames include the script's own scoring path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from recsys_doctor.capture.host_sample import find_py_spy
from recsys_doctor.cli import main

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "heldout" / "offline_scoring_serve.py"


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed")
def test_host_sample_splits_start_up_from_the_scoring_loop(tmp_path):
    res = CliRunner().invoke(main, ["profile", "--host-sample", "--json", "--no-nvml", "--out", str(tmp_path / "o"),
                                    str(SCRIPT), "--", "--workers", "2", "--queries", "1500"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output[-3000:]
    d = json.loads(res.stdout)
    h = d["capture"]["host_sampling"]
    assert h["reason"] is None and h["snapshots"] >= 20, h
    by_name = {t["name"]: t for t in h["threads"]}
    main_t = by_name["MainThread"]
    assert main_t["import_share"] >= 0.05, main_t  # importing torch, before the model is built
    for t in h["threads"]:
        assert not any("importlib" in f["frame"] for f in t["top_frames"]), t
    assert any(f["frame"].split(" (")[1].startswith(("offline_scoring_serve.py", "module.py", "functional.py"))
               for f in main_t["top_frames"]), main_t
    # the DataLoader's pin-memory thread (Python names it after its target) is one of the threads
    assert any("_pin_memory_loop" in n for n in by_name), sorted(by_name)
    print(json.dumps(h, indent=1), file=sys.stderr)
