"""The script hook's stream groups are the runtime's: what runs without a GPU (the GPU side,
ExternalStreams over a ``StreamManager``'s handles shared by a group's threads, is in
``tests/test_autoapply_gpu.py``).

* the runtime's ``streams_only`` manager checks its arguments before any CUDA call;
* at interpreter start the hook imports neither the runtime nor pandas nor torch: the
  runtime is imported on the first hooked thread only;
* where the runtime cannot give the streams, the hook says why once, counts it, and hooks
  no thread (the script runs as it is).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from recsys_doctor.applying import _autoapply as hook
from recsys_doctor.applying._autoapply import groups
from recsys_doctor.applying.apply import write_plan
from recsys_doctor.applying.script_hook import script_env
from recsys_doctor.errors import BadInputError
from recsys_doctor.planning.whatif import Candidate
from recsys_doctor.runtime import StreamManager

ADVISED = {"schema": 1, "stream_groups": {"count": 4}, "cuda_graphs": {"enabled": True}}


@pytest.mark.parametrize("kwargs", [{"groups": 0, "streams_only": True}, {"groups": 2, "slots": 0},
                                    {"groups": 0}])
def test_stream_manager_arguments_are_checked_first(kwargs):
    with pytest.raises(BadInputError):
        StreamManager(**kwargs)


_PROBE = ("import sys, threading\n"
          "m = sys.modules['_recsys_doctor_autoapply']\n"
          "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
          "print(m.stats()['active'], *(x in sys.modules for x in ('recsys_doctor.runtime', 'pandas', 'torch')))\n")


def test_hook_at_interpreter_start_imports_no_runtime_pandas_or_torch(tmp_path):
    p = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2, True, True, True))
    env = script_env(p, hook_dir=tmp_path / "hook")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False", "False"]


def test_no_streams_from_the_runtime_means_no_hooked_thread(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine where the runtime cannot make streams (no CUDA)")
    for k, v in {"n_groups": 2, "fallbacks": [], "streams": None, "streams_failed": None}.items():
        monkeypatch.setitem(hook._state, k, v)
    assert groups._streams(torch) is None
    assert groups._streams(torch) is None  # said once, not again
    reason = hook._state["streams_failed"]
    assert reason.startswith("no stream groups from the runtime: ")
    assert hook._state["fallbacks"] == [reason]
    assert capsys.readouterr().err.count("not applied: no stream groups from the runtime") == 1
