"""Threads placed at their start that copied host data to the GPU but called no model
(``interception._note_copy_only``): counted in the hook's stats, and the kept plan's notes say
what that risks and which setting avoids it (``report.copy_only_note``). The placement itself
needs CUDA (the GPU tests); here each thread's end is run as the hook runs it."""

from __future__ import annotations

import pytest

import threading

from recsys_doctor.applying._autoapply import accounting, interception
from recsys_doctor.applying._autoapply._common import _state, _tls
from recsys_doctor.applying.report import copy_only_note
from recsys_doctor.applying.script_hook import merge_hook_stats


def _thread(name, copies, calls):
    """A thread that made ``copies`` host-to-device copies and ``calls`` model calls, then ended."""

    def body():
        for _ in range(copies):
            accounting.fell_back("h2d", "pipe.py:80", "left to PyTorch")
        if calls:
            _tls.called = True
            accounting.taken_over("model", "pipe.py:93", calls)
        interception._note_copy_only(threading.current_thread())

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join()


def test_a_thread_that_copied_but_called_no_model_is_counted(monkeypatch):
    monkeypatch.setitem(_state, "copy_only_threads", [])
    monkeypatch.setitem(_state, "copy_only_count", 0)
    monkeypatch.setattr(interception, "MAX_COPY_ONLY", 2)
    accounting.reset()
    _thread("features-0", copies=3, calls=0)
    _thread("model-0", copies=3, calls=5)  # copies its own inputs and calls the model: not counted
    _thread("idle", copies=0, calls=0)  # no GPU copy: not counted
    _thread("features-1", copies=1, calls=0)
    _thread("features-2", copies=1, calls=0)  # counted, not named (2 kept)
    assert _state["copy_only_count"] == 3 and _state["copy_only_threads"] == ["features-0", "features-1"]


def test_the_note_names_the_threads_and_the_setting():
    assert copy_only_note(None) is None and copy_only_note({"copy_only_threads": []}) is None
    note = copy_only_note({"copy_only_threads": ["features-0", "features-1"], "copy_only_count": 3})
    assert note.startswith("3 threads (features-0, features-1, ...) copied data to the GPU but called no model")
    assert note.endswith("threads are placed at their first model call (the default, unless "
                         "RECSYS_DOCTOR_PLACE=start), so such threads stay on PyTorch's default stream, with which "
                         "the group streams are ordered")
    one = copy_only_note({"copy_only_threads": ["features-0"], "copy_only_count": 1})
    assert one.startswith("1 thread (features-0) copied")


def test_worker_processes_copy_only_threads_are_merged():
    m = merge_hook_stats({"copy_only_count": 1, "copy_only_threads": ["a"]},
                         [{"copy_only_count": 2, "copy_only_threads": ["b", "c"]}])
    assert m["copy_only_count"] == 3 and m["copy_only_threads"] == ["a", "b", "c"]


def test_a_run_that_called_no_model_through_module_call_says_so():
    from recsys_doctor.applying.report import no_model_calls_note

    h2d = {"kind": "h2d", "site": "s.py:9", "taken_over": 0, "fallback": 120, "reasons": {}}
    model = {"kind": "model", "site": "s.py:10", "taken_over": 50, "fallback": 10, "reasons": {}}
    assert no_model_calls_note(None) is None
    assert no_model_calls_note({"active": True, "graphs": False, "sites": [h2d]}) is None  # (not counted then)
    assert no_model_calls_note({"active": True, "graphs": True, "sites": [h2d, model]}) is None
    note = no_model_calls_note({"active": True, "graphs": True, "sites": [h2d, dict(h2d, site="s.py:11")]})
    assert note.startswith("the hook saw no model call: the script's model is not called through "
                           "torch.nn.Module.__call__ (a model that is not a torch.nn.Module")
    assert "; 240 copies to the GPU were seen;" in note and note.endswith("lets a plan take it over")
    assert "copies" not in no_model_calls_note({"active": True, "graphs": True, "sites": []})


def test_a_serving_script_calling_with_gradients_on_is_told_how_to_let_a_plan_graph_it():
    """Model calls left to PyTorch with gradients on (counted by the hook's own accounting, as
    ``graphs._graphed_call`` counts them): where they are most of the calls, the note says how
    many and what the script can do; where they are not, or the plan had no graphs, nothing."""
    from recsys_doctor.applying._autoapply import accounting
    from recsys_doctor.applying._autoapply.graphs import GRAD_ON
    from recsys_doctor.applying.report import grad_on_note

    accounting.reset()
    try:
        accounting.fell_back("model", "s.py:20", GRAD_ON, 30)
        accounting.taken_over("model", "s.py:20", 10)
        accounting.fell_back("model", "s.py:31", "CUDA graph capture failed", 5)
        accounting.fell_back("h2d", "s.py:19", "before the thread's first model call", 45)
        sites = accounting.sites()
    finally:
        accounting.reset()
    note = grad_on_note({"graphs": True, "sites": sites})
    assert note.startswith("30 of the 45 model calls ran with gradients on or the module in training mode")
    assert "torch.inference_mode()" in note and "model.eval()" in note and "requires_grad_(False)" in note
    assert grad_on_note({"graphs": False, "sites": sites}) is None
    assert grad_on_note({"graphs": True, "sites": [dict(s, reasons={}) for s in sites]}) is None
    half = [dict(s, taken_over=30) if s["site"] == "s.py:20" else s for s in sites]  # 30 of 65: not most
    assert grad_on_note({"graphs": True, "sites": half}) is None


def test_a_model_left_its_host_arguments_gets_a_note_with_the_hooks_reason():
    """Most model calls of a graphed plan eager because a tensor argument stays on the CPU: the
    note carries the hook's reason where the model uses it on the host (PyTorch's function, the
    line, the way out), a generic one where the hook said none; none where most calls were graphed."""
    from recsys_doctor.applying._autoapply import accounting
    from recsys_doctor.applying._autoapply.graphs import CPU_ARG
    from recsys_doctor.applying.report import call_notes, host_args_note

    accounting.reset()
    try:
        accounting.fell_back("model", "s.py:91", "the first calls of a shape run eagerly before its capture", 4)
        accounting.fell_back("model", "s.py:91", CPU_ARG, 4004)
        sites = accounting.sites()
    finally:
        accounting.reset()
    used = ("the model uses a host argument on the host (to in PyTorch's pack_padded_sequence "
            "(torch/nn/utils/rnn.py:313), s.py:52; a way out)")
    note = host_args_note({"graphs": True, "sites": sites, "fallbacks": ["other", used]})
    assert note == ("4004 of the 4008 model calls ran eagerly under the graphed plan: a tensor argument stays on the "
                    "CPU (the model uses it on the host (to in PyTorch's pack_padded_sequence (torch/nn/utils/rnn.py:313)"
                    ", s.py:52; a way out)), so no plan can graph those calls as they are")
    assert call_notes({"graphs": True, "sites": sites, "fallbacks": [used]}, train=False)[2] == note
    assert "(a model on the CPU, or one that uses such an argument on the host)" in host_args_note(
        {"graphs": True, "sites": sites})
    assert host_args_note({"graphs": True, "sites": [dict(s, taken_over=9000) for s in sites]}) is None


def test_calls_with_an_argument_no_graph_takes_get_a_note_naming_its_type():
    """kjt_ranker_serve.py under a graphed plan (session21_h200: every call eager for its
    KeyedJagged): the note names the type, from the reason the hook's own key function gives (two
    types: both, sorted); none where most calls were graphed, nor without graphs."""
    torch = pytest.importorskip("torch")
    from recsys_doctor.applying._autoapply import accounting
    from recsys_doctor.applying._autoapply.buckets import WARMING_UP
    from recsys_doctor.applying._autoapply.graphs import _key_or_reason
    from recsys_doctor.applying.report import call_notes, unkeyed_note

    class KeyedJagged:  # (a plain class holding tensors: no key)
        pass

    class Batch:
        pass

    lin = torch.nn.Linear(2, 2)
    why = _key_or_reason(torch, lin, (KeyedJagged(),), {})
    why2 = _key_or_reason(torch, lin, (), {"b": Batch()})
    assert why == "not graphed: an argument of type KeyedJagged" and why2.endswith("of type Batch")
    accounting.reset()
    try:
        accounting.fell_back("model", "s.py:139", WARMING_UP, 8)
        accounting.fell_back("model", "s.py:139", why, 2992)
        one = accounting.sites()
        accounting.fell_back("model", "s.py:150", why2, 3000)
        two = accounting.sites()
    finally:
        accounting.reset()
    note = unkeyed_note({"graphs": True, "sites": one})
    assert note.startswith("2992 of the 3000 model calls ran eagerly under the graphed plan: an argument of type "
                           "KeyedJagged is not what a CUDA graph is keyed by")
    assert "making its class a dataclass" in note and ".tolist()" in note
    assert call_notes({"graphs": True, "sites": one}, train=False) == (None, None, None, note)
    assert unkeyed_note({"graphs": True, "sites": two}).startswith(
        "5992 of the 6000 model calls ran eagerly under the graphed plan: arguments of types Batch, KeyedJagged are ")
    assert unkeyed_note({"graphs": False, "sites": one}) is None
    assert unkeyed_note({"graphs": True, "sites": [dict(s, taken_over=3000) for s in one]}) is None


def test_a_model_that_needs_the_host_in_a_capture_gets_a_note_with_the_reason():
    """Most model calls of a graphed plan eager because the model's forward needs the host in a
    capture (the hook's reason NEEDS_HOST + the failure): a note says no plan graphs it as it is,
    with the failure and its way out; not where most calls were graphed, nor without graphs."""
    from recsys_doctor.applying._autoapply import accounting
    from recsys_doctor.applying._autoapply.buckets import WARMING_UP
    from recsys_doctor.applying._autoapply.graphs import NEEDS_HOST
    from recsys_doctor.applying.report import call_notes, needs_host_note

    why = "AcceleratorError: CUDA error: ... (at s.py:55: x = self.encoder(...); keeps it capturable)"
    accounting.reset()
    try:
        accounting.fell_back("model", "s.py:90", WARMING_UP, 3)
        accounting.fell_back("model", "s.py:90", f"capture failed: {why}", 1)
        accounting.fell_back("model", "s.py:90", f"{NEEDS_HOST}: {why}", 96)
        sites = accounting.sites()
    finally:
        accounting.reset()
    note = needs_host_note({"graphs": True, "sites": sites})
    assert note == ("96 of the 100 model calls ran eagerly under the graphed plan: the model's forward needs the "
                    f"host inside a CUDA graph capture, so no plan can graph it as it is ({why})")
    assert call_notes({"graphs": True, "sites": sites}, train=True) == (None, note, None, None)
    assert needs_host_note({"graphs": False, "sites": sites}) is None
    most_graphed = [dict(s, taken_over=200) for s in sites]
    assert needs_host_note({"graphs": True, "sites": most_graphed}) is None


def test_a_kept_plan_whose_p99_grew_gets_a_note_with_both_numbers_and_the_way_to_bound_it():
    """The tenant PLE run on the H200 (bench/apply/results/heldout4_h200/4_dataclass_tenant/): 410.6 ->
    616.4 q/s, p99 13.802 -> 24.733 ms (1.79x), 48 group graphs and 4 thread graphs captured while it
    ran. No note within 1.25x, under a latency budget, or without both p99s."""
    from recsys_doctor.applying.report import tail_note

    base, kept = {"qps": 410.6, "p99_ms": 13.802}, {"qps": 616.4, "p99_ms": 24.733}
    note = tail_note(base, kept, {"captured": 48, "thread_graphs": 4}, None)
    assert note == ("the kept plan's p99 grew from 13.802 to 24.733 ms (1.79x) while it served more queries a second "
                    "(410.6 -> 616.4 q/s); the hook captured 52 CUDA graphs while the script ran, each holding the "
                    "other threads' model calls off while it was made, inside the measured window (a longer run "
                    "spreads them thinner); --p99-ms MS keeps the fastest plan whose measured p99 is within MS")
    assert "captured" not in tail_note(base, kept, {}, None)
    assert tail_note(base, {"qps": 616.4, "p99_ms": 1.25 * 13.802}, {}, None) is None
    assert tail_note(base, kept, {}, 30.0) is None
    assert tail_note({"qps": 410.6}, kept, {}, None) is None


def test_a_baseline_waiting_mostly_on_host_work_gets_a_note():
    """The diagnosis of the script as it is says most of the GPU's wait for the host followed host
    work outside CUDA calls (launch-bound's evidence): a note says no plan removes it. Not under
    half, not without a launch-bound finding; run_notes adds it after the model-call notes."""
    from types import SimpleNamespace

    from recsys_doctor.applying.report import call_notes, host_work_note, run_notes

    def advise(share, fid="launch-bound"):
        ev = {"host_work_share_of_host_wait": share, "host_work_us": 50.0}
        return SimpleNamespace(findings=[SimpleNamespace(id="sync-api", evidence={}), SimpleNamespace(id=fid, evidence=ev)])

    note = host_work_note(advise(0.947))
    assert note == ("as it is, 95% of the time the script's GPU waited for the host followed at least 50 us in which "
                    "the launching thread made no CUDA call (the script's own Python, preprocessing, another thread "
                    "holding the GIL): graphs and stream groups remove launch calls, not that work; py-spy --gil on "
                    "the script shows what it is")
    assert host_work_note(advise(0.49)) is None and host_work_note(advise(0.9, "short-kernels")) is None
    assert host_work_note(None) is None and host_work_note(advise(None)) is None
    hook = {"graphs": True, "sites": []}
    assert run_notes(hook, False, advise(0.947)) == (*call_notes(hook, False), note, None)


def test_graphed_plans_are_not_all_run_where_no_graph_can_be_captured(tmp_path, monkeypatch):
    """profile --apply on a script whose model calls no graph takes (kjt_ranker_serve.py): once a
    graphed plan captured nothing and most calls ran eagerly for such a reason, the other graphed
    plans are not run (each would give the same eager calls), but the batching plan still is; each
    skipped one says why. A plan that captured something, or a training script's, skips nothing."""
    from types import SimpleNamespace

    from recsys_doctor.applying import apply as ap
    from recsys_doctor.applying._autoapply.graphs import UNKEYED
    from recsys_doctor.planning.whatif import Candidate, Prediction

    accounting.reset()
    try:
        accounting.fell_back("model", "s.py:139", f"{UNKEYED}KeyedJagged", 3000)
        sites = accounting.sites()
    finally:
        accounting.reset()
    eager = {"active": True, "graphs": True, "captured": 0, "thread_graphs": 0, "sites": sites}
    cands = [Candidate(1, True, False, True), Candidate(2, True, False, True), Candidate(4, True, True, True),
             Candidate(2, True, False, True, batching=True)]
    preds = [Prediction(c, 0, 0, 0, "host") for c in cands]
    ran: list[str] = []

    def go(hook: dict, line: dict) -> list:
        ran.clear()
        monkeypatch.setattr(ap, "run_script", lambda argv, env, log, timeout_s: (ran.append(env["RECSYS_DOCTOR_PLAN"])
                                                                                 or dict(line), ""))
        monkeypatch.setattr(ap, "read_hook_stats", lambda p: dict(hook))
        run = SimpleNamespace(out=tmp_path, say=lambda s: None, device_index=0, nvml=False)
        return ap._measure_script_candidates(run, ["python", "s.py"], preds, preds, {}, 60.0)

    res = go(eager, {"qps": 500.0})
    assert len(ran) == 2  # the first graphed plan and the batching one
    assert res[0].measured == {"qps": 500.0} and res[3].measured == {"qps": 500.0}
    for r in res[1:3]:
        assert r.measured is None and r.error is None and r.info["skipped"].startswith(
            "under g1 ") and "no graph was captured" in r.info["skipped"]
        assert "3000 of the 3000 model calls ran eagerly (not graphed: an argument of type KeyedJagged)" in r.info[
            "skipped"]
    assert len(go(dict(eager, captured=1), {"qps": 500.0}) and ran) == 4  # a graph captured: all run
    assert len(go(eager, {"step_ms": 9.0}) and ran) == 4  # a training script's: all run
