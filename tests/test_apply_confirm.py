"""profile --apply on a plain script: a close win is measured once more before it is kept
(:mod:`recsys_doctor.applying.confirm`). The script runs are stand-ins (each returns the
measurement a script would print); what is checked is what is run, kept, declined and said."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from recsys_doctor.applying import confirm as cf
from recsys_doctor.errors import WorkloadError
from recsys_doctor.planning.whatif import Candidate, Prediction


def test_the_ratio_is_qps_after_over_before_or_step_before_over_after():
    assert cf.ratio({"qps": 200.0}, {"qps": 250.0}, train=False) == 1.25
    assert cf.ratio({"step_ms": 8.0}, {"step_ms": 6.4}, train=True) == 1.25
    assert cf.ratio({"qps": 200.0}, {"step_ms": 6.4}, train=False) is None
    assert cf.ratio({"qps": 200.0}, None, train=False) is None


def test_only_a_win_below_the_threshold_is_measured_again():
    assert cf.needs_confirming({"qps": 721.3}, {"qps": 740.2}, train=False)  # 1.03x (a held-out script)
    assert cf.needs_confirming({"qps": 728.9}, {"qps": 1019.0}, train=False)  # 1.40x (another one)
    assert not cf.needs_confirming({"qps": 600.0}, {"qps": 900.0}, train=False)  # 1.5x: kept on one run
    assert not cf.needs_confirming({"qps": 546.5}, {"qps": 2766.3}, train=False)  # 5.06x
    assert cf.needs_confirming({"step_ms": 7.54}, {"step_ms": 6.63}, train=True)  # 1.14x
    assert not cf.needs_confirming({"qps": 546.5}, None, train=False)


@pytest.fixture
def search(tmp_path, monkeypatch):
    """A search's set-up (its folder, its progress lines) and the script runs it makes: each call
    of ``run_script`` takes the next measurement of ``printed`` and records whether it was hooked."""
    st = SimpleNamespace(out=tmp_path, said=[], runs=[], printed=[])
    st.run = SimpleNamespace(out=tmp_path, say=st.said.append)

    def run_script(argv, env=None, log=None, timeout_s=0.0):
        st.runs.append("hooked" if env and env.get("RECSYS_DOCTOR_PLAN") else "as it is")
        m = st.printed.pop(0)
        if isinstance(m, Exception):
            raise m
        return m, ""

    monkeypatch.setattr(cf, "run_script", run_script)
    best = SimpleNamespace(prediction=Prediction(Candidate(1, True, False, True), 0, 0, 0, "host"),
                           measured={"qps": 740.2})
    st.best = best
    return st


def _confirm(st, base=None, train=False):
    notes: list[str] = []
    why, st.shown = cf.confirm(st.run, ["python", "s.py"], {}, base or {"qps": 721.3}, st.best, train, 30.0, notes)
    return why, notes


def test_a_close_win_that_wins_again_is_kept_and_both_rounds_are_said(search):
    search.printed = [{"qps": 700.0}, {"qps": 770.0}]
    why, notes = _confirm(search)
    assert why is None and search.runs == ["as it is", "hooked"]
    assert notes[0] == ("a close win (1.03x) measured once more, the script as it is and g1 merged shared-pool "
                        "graphs: 700.0 -> 770.0 q/s (1.10x)")
    assert (search.out / "confirm.plan.json").is_file() and "1.03x" in search.said[0]
    # reported: each side's mean over its two rounds, (721.3 + 700.0) / 2 -> (740.2 + 770.0) / 2
    before, after = search.shown
    assert before["qps"] == pytest.approx(710.65) and after["qps"] == pytest.approx(755.1)
    assert notes[1] == "before and after are the means of both rounds: 710.65 -> 755.1 q/s (1.06x)"


def test_both_rounds_averages_the_numbers_both_rounds_have_and_keeps_the_first_rounds_others():
    first = {"qps": 2491.9, "p99_ms": 4.0, "calls": 4000, "checksum": 1.5}
    second = {"qps": 3024.8, "calls": 3990}
    assert cf.both_rounds(first, second) == {"qps": 2758.35, "p99_ms": 4.0, "calls": 4000, "checksum": 1.5}
    assert cf.both_rounds({"step_ms": 7.54}, {"step_ms": 7.0}) == {"step_ms": 7.27}


def test_a_close_win_that_loses_the_second_round_is_declined(search):
    search.printed = [{"qps": 760.0}, {"qps": 700.0}]
    why, notes = _confirm(search)
    assert why.startswith("declined: the best plan measured, g1 merged shared-pool graphs, won its first run "
                          "by 1.03x and lost the second (760.0 -> 700.0 q/s)")
    assert notes[0].endswith("(0.92x)") and len(notes) == 1
    assert search.shown == ({"qps": 721.3}, {"qps": 740.2})  # declined: the first round stands


def test_a_training_loop_is_confirmed_by_its_step_time(search):
    search.best.measured = {"step_ms": 6.63}
    search.printed = [{"step_ms": 7.0}, {"step_ms": 7.2}]  # the plan's step is slower this time
    why, notes = _confirm(search, base={"step_ms": 7.54}, train=True)
    assert why is not None and "7.0 -> 7.2 ms a step" in why and "1.14x" in why


def test_a_plan_whose_second_run_fails_is_declined_and_one_whose_baseline_fails_stands(search):
    search.printed = [{"qps": 700.0}, WorkloadError("python s.py exited with status 1: boom")]
    why, _ = _confirm(search)
    assert why.startswith("declined: g1 merged shared-pool graphs won its first run by 1.03x and failed the "
                          "second: python s.py exited with status 1: boom")
    search.runs.clear()
    search.printed = [WorkloadError("python s.py exited with status 1: boom")]
    why, notes = _confirm(search)
    assert why is None and search.runs == ["as it is"]  # the plan is not run again
    assert notes == ["a close win (1.03x) not measured again: the script as it is failed its second run: "
                     "python s.py exited with status 1: boom"]


def test_a_second_run_under_which_a_thread_raised_is_declined(search, monkeypatch):
    """The plan's second run printed a faster line, but a thread of the script raised under it
    (the hook's stats say so, :mod:`._autoapply.threaderrors`): that run failed."""
    stats = {"thread_error_count": 1, "thread_errors": [{"thread": "worker-2", "error": "KeyError: 2", "at": None}]}
    monkeypatch.setattr(cf, "read_hook_stats", lambda path: stats if path.name == "confirm.hook_stats.json" else None)
    search.printed = [{"qps": 700.0}, {"qps": 800.0}]
    why, _ = _confirm(search)
    assert why == ("declined: g1 merged shared-pool graphs won its first run by 1.03x and failed the second: "
                   "a thread of the script raised under this plan: worker-2: KeyError: 2")
