"""bench/apply/gil_share.py's split of a hooked run's GIL samples: the hook's own work (its
frames, and PyTorch's calls it makes itself) apart from the model's forward it calls and the
script's own lines, on py-spy stacks written by hand."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "apply"))

from gil_share import hook_own  # noqa: E402

BASE = ["_bootstrap (threading.py:1030)", "bootstrap_inner (recsys_doctor/applying/_autoapply/interception.py:208)",
        "run (concurrent/futures/thread.py:58)", "handle (kjt_ranker_serve.py:139)"]
CALL = ["__call__ (recsys_doctor/applying/_autoapply/interception.py:331)",
        "_eager (recsys_doctor/applying/_autoapply/graphs.py:207)"]
MODEL = ["_call_impl (torch/nn/modules/module.py:1790)", "forward (kjt_ranker_serve.py:107)",
         "embedding_bag (torch/nn/functional.py:2783)"]
COPY = ["method (recsys_doctor/applying/_autoapply/staging.py:261)", "to (torch/_tensor.py:10)"]


def test_the_hooks_own_work_is_told_from_the_model_and_the_script():
    assert hook_own(BASE + CALL)  # the hook's frame innermost
    assert hook_own(BASE + COPY)  # PyTorch's copy the hook makes
    assert not hook_own(BASE + CALL + MODEL)  # the model's forward, under the hook's call
    assert not hook_own(BASE + CALL + MODEL[:1])  # the module call itself
    assert not hook_own(BASE)  # the script's line
    assert not hook_own(BASE[:3])  # the thread's bootstrap, wrapped by the hook (not a query's work)
    imp = ["_find_and_load (<frozen importlib._bootstrap>:1360)"]
    assert hook_own(BASE + CALL + imp + ["<module> (recsys_doctor/runtime/_cuda.py:121)"])  # its runtime's import
    assert not hook_own(BASE + imp + ["<module> (numpy/__init__.py:1)"])  # one the script's line makes


def test_the_printed_shares_are_the_samples_counted_by_hand(tmp_path):
    """Samples at 200 Hz over 100 queries: 40 of the model (under the hook's call), 20 of the hook's
    own, 10 of the script, 30 of another thread: serving 70 samples = 0.35 s, 3,500 us a query; the
    hook's frames 60 samples (3,000 us), its own 20 (1,000 us)."""
    rows = {";".join(BASE + CALL + MODEL): 40, ";".join(BASE + COPY): 20, ";".join(BASE): 10,
            "_bootstrap (threading.py:1030);loop (other.py:3)": 30}
    for run in ("unhooked", "hooked"):
        with gzip.open(tmp_path / f"{run}.folded.gz", "wt") as fh:
            fh.writelines(f"{k} {v}\n" for k, v in rows.items())
        (tmp_path / f"{run}.json").write_text(json.dumps({"queries": 100, "qps": 50.0}))
    out = subprocess.run([sys.executable, str(ROOT / "bench/apply/gil_share.py"), str(tmp_path),
                          "handle (kjt_ranker_serve.py", "--by-frame"], capture_output=True, text=True, check=True).stdout
    line = out.splitlines()[1]
    assert " 3500 us a query" in line and "hook frames  3000 us" in line and "the hook's own  1000 us" in line, line
    assert "18% of the  2.00 s window" in line  # 0.35 s of 2 s (100 queries at 50 q/s)
    # the hooked run's own samples by the hook's outermost frame: all 20 entered at staging.py:261
    assert out.splitlines()[2].split() == ["20", "samples", "1000.0", "us", "a", "query", "staging.py:261"]
    assert len(out.splitlines()) == 3
