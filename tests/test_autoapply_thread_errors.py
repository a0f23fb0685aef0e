"""Exceptions that end a thread of the script under the hook (``_autoapply/threaderrors.py``):
counted and kept in the hook's stats with the thread, the exception and the script's line; the
script's own ``threading.excepthook`` still runs; ``profile --apply`` does not keep a plan under
which a thread raised where none did as it is (``script_hook.fail_on_thread_errors``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

from recsys_doctor.applying._autoapply import threaderrors
from recsys_doctor.applying._autoapply._common import _state
from recsys_doctor.applying.script_hook import (fail_on_thread_errors, merge_hook_stats, read_hook_stats,
                                                script_env, thread_errors_note)
from recsys_doctor.planning.io import write_plan
from recsys_doctor.planning.whatif import Candidate

# a worker dies in its first request; the others finish; the main thread prints its line and exits 0
_SCRIPT = """import json, threading
def work(k):
    if k == 1:
        {}["missing"]
ts = [threading.Thread(target=work, args=(k,), name=f"worker-{k}") for k in range(3)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps({"qps": 1.0}))
"""


def test_a_thread_that_raises_under_the_hook_is_in_its_stats(tmp_path):
    (tmp_path / "threads.py").write_text(_SCRIPT)
    plan = write_plan(tmp_path / "plan.json", {}, Candidate(2, True, False, True))
    env = script_env(plan, hook_dir=tmp_path / "hook", stats_path=tmp_path / "stats.json")
    p = subprocess.run([sys.executable, "threads.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == '{"qps": 1.0}'
    st = read_hook_stats(tmp_path / "stats.json")
    assert st is not None and st["thread_error_count"] == 1
    assert st["thread_errors"] == [{"thread": "worker-1", "error": "KeyError: 'missing'",
                                    "at": "threads.py:4: {}[\"missing\"]", "in_hook": False}]
    assert "recsys-doctor apply: thread worker-1 raised KeyError: 'missing' (at threads.py:4" in p.stderr
    assert "Exception in thread worker-1" in p.stderr  # Python's own report as without the hook


def test_install_wraps_the_excepthook_once_and_uninstall_puts_it_back(monkeypatch):
    monkeypatch.setitem(_state, "thread_errors", [])
    monkeypatch.setitem(_state, "thread_error_count", 0)
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.thread.name))
    own = threading.excepthook
    threaderrors.install()
    threaderrors.install()
    try:
        assert threading.excepthook.__wrapped__ is own
        for k in range(threaderrors.MAX_KEPT + 2):
            t = threading.Thread(target=lambda: 1 / 0, name=f"t{k}")
            t.start()
            t.join()
        t = threading.Thread(target=lambda: sys.exit(3), name="quits")  # SystemExit ends a thread quietly
        t.start()
        t.join()
    finally:
        threaderrors.uninstall()
    assert threading.excepthook is own
    # the script's own hook, every time (SystemExit too: Python's default hook ignores it; ours keeps none)
    assert seen == [f"t{k}" for k in range(threaderrors.MAX_KEPT + 2)] + ["quits"]
    assert _state["thread_error_count"] == threaderrors.MAX_KEPT + 2
    assert [e["thread"] for e in _state["thread_errors"]] == [f"t{k}" for k in range(threaderrors.MAX_KEPT)]
    assert {e["error"] for e in _state["thread_errors"]} == {"ZeroDivisionError: division by zero"}


_ERRS = {"thread_error_count": 3, "thread_errors": [
    {"thread": "worker-2", "error": "RuntimeError: operation not permitted when stream is capturing",
     "at": "own.py:95: self.out = model(x)", "in_hook": True},
    {"thread": "worker-3", "error": "KeyError: 2", "at": None, "in_hook": False}]}


def test_the_note_names_the_first_exception_and_counts_the_rest():
    assert thread_errors_note(_ERRS) == ("a thread of the script raised under this plan: worker-2: RuntimeError: "
                                         "operation not permitted when stream is capturing at own.py:95: "
                                         "self.out = model(x) (and 2 more)")
    assert thread_errors_note({"thread_errors": [], "thread_error_count": 0}) is None
    assert thread_errors_note(None) is None


def test_a_plan_under_which_a_thread_raised_is_not_kept():
    r = SimpleNamespace(measured={"qps": 900.0}, error=None, info={})
    fail_on_thread_errors(r, _ERRS, output_as_is='{"qps": 500.0}\n')
    assert r.measured is None and r.error == thread_errors_note(_ERRS)
    failed = SimpleNamespace(measured=None, error="s.py exited with status 1: KeyError: 2", info={})
    fail_on_thread_errors(failed, _ERRS, output_as_is="")
    assert failed.error == "s.py exited with status 1: KeyError: 2; " + thread_errors_note(_ERRS)
    clean = SimpleNamespace(measured={"qps": 900.0}, error=None, info={})
    fail_on_thread_errors(clean, {"thread_errors": [], "thread_error_count": 0}, output_as_is="")
    assert clean.measured == {"qps": 900.0} and clean.error is None


def test_where_threads_raised_as_it_is_too_it_is_only_noted():
    as_is = 'Exception in thread monitor:\nTraceback (most recent call last):\nOSError: gone\n{"qps": 500.0}\n'
    r = SimpleNamespace(measured={"qps": 900.0}, error=None, info={})
    fail_on_thread_errors(r, _ERRS, output_as_is=as_is)
    assert r.measured == {"qps": 900.0} and r.error is None
    assert r.info["thread_errors"].endswith("(threads raised in the script as it is too)")


def test_worker_processes_thread_errors_are_merged():
    main = {"active": True, "thread_error_count": 1, "thread_errors": [{"thread": "a", "error": "E: 1"}]}
    child = {"active": True, "thread_error_count": 2, "thread_errors": [{"thread": "b", "error": "E: 2"},
                                                                        {"thread": "c", "error": "E: 3"}]}
    m = merge_hook_stats(main, [child])
    assert m["thread_error_count"] == 3 and [e["thread"] for e in m["thread_errors"]] == ["a", "b", "c"]


def test_profile_apply_keeps_no_plan_under_which_a_worker_died(tmp_path):
    """A script whose worker raises only when the hook is active (as a worker that captures its
    own graph did under the hook on the H200): it still prints a faster line and exits 0, but
    the candidate is not measured, its error names the thread, and no plan can be kept."""
    import pytest

    from recsys_doctor.applying import apply as ap
    from recsys_doctor.errors import WorkloadError
    from recsys_doctor.planning.whatif import Prediction

    script = tmp_path / "dies_hooked.py"
    script.write_text(_SCRIPT.replace("if k == 1:", "if k == 1 and os.environ.get('RECSYS_DOCTOR_PLAN'):")
                      .replace("import json,", "import json, os,"))
    run = SimpleNamespace(out=tmp_path, say=lambda s: None, device_index=0, nvml=False)
    preds = [Prediction(Candidate(2, True, False, True), 0, 0, 0, "host")]
    as_is = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert as_is.returncode == 0 and not as_is.stderr
    results = ap._measure_script_candidates(run, [sys.executable, str(script)], preds, preds, {}, 60.0,
                                            as_is.stdout + as_is.stderr)
    r = results[0]
    assert r.measured is None and r.error.startswith(
        "a thread of the script raised under this plan: worker-1: KeyError: 'missing' at ")
    assert r.info["hook"]["thread_error_count"] == 1
    with pytest.raises(WorkloadError, match="no candidate plan could be measured: g2 .*worker-1: KeyError"):
        ap._keep_best(results, "script")
