"""Threads placed in a group at their first model call (``_late_group``,
recsys_doctor/applying/_autoapply/interception.py) and the import watch that patches
``nn.Module.__call__`` once PyTorch is imported (``_autoapply/importwatch.py``), on the CPU.
The GPU test that a main-thread loop is graphed with outputs equal to eager:
tests/test_autoapply_gpu.py (``..._main_thread_...``)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import types

import pytest

from recsys_doctor.applying import _autoapply as aa
from recsys_doctor.applying._autoapply import importwatch, interception
from recsys_doctor.applying._autoapply._common import _tls
from recsys_doctor.applying.script_hook import script_env
from recsys_doctor.planning.io import write_plan
from recsys_doctor.planning.whatif import Candidate

ADVISED = {"schema": 1, "stream_groups": {"count": 2}, "cuda_graphs": {"enabled": True}}


# ------------------------------------------------------------------------------ the import watch

def test_a_watch_fires_once_after_the_module_ran_and_leaves(tmp_path, monkeypatch):
    (tmp_path / "rd_watched_mod.py").write_text("VALUE = 41\nVALUE += 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    w = importwatch.when_imported("rd_watched_mod", lambda m: seen.append(m.VALUE))
    assert w in sys.meta_path and not seen
    try:
        import rd_watched_mod  # noqa: F401
        assert seen == [42] and w not in sys.meta_path  # after the module's own code
        assert importwatch.when_imported("rd_watched_mod", lambda m: seen.append("now")) is None
        assert seen == [42, "now"]  # already imported: at once
    finally:
        sys.modules.pop("rd_watched_mod", None)
        importwatch.cancel(w)


def test_a_failing_callback_never_breaks_the_import(tmp_path, monkeypatch, capsys):
    (tmp_path / "rd_watched_bad.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    w = importwatch.when_imported("rd_watched_bad", lambda m: 1 / 0)
    try:
        import rd_watched_bad

        assert rd_watched_bad.X == 1
    finally:
        sys.modules.pop("rd_watched_bad", None)
        importwatch.cancel(w)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["recsys-doctor apply: after importing rd_watched_bad: ZeroDivisionError: division by zero"]


_PATCHED = "import torch; print(hasattr(torch.nn.Module.__call__, '__wrapped__'))"


@pytest.mark.parametrize("graphs,want", [(True, "True"), (False, "False")])
def test_the_module_call_is_patched_at_torch_import_where_the_plan_graphs(tmp_path, graphs, want):
    """A script that starts no thread (the check prints right after ``import torch``): with a
    plan that graphs, ``nn.Module.__call__`` is the hook's already; without graphs it is left."""
    pytest.importorskip("torch")
    plan = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2, True, False, graphs))
    env = script_env(plan, hook_dir=tmp_path / "hook")
    p = subprocess.run([sys.executable, "-c", _PATCHED], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == want


# ------------------------------------------------------------------------------ late placement

@pytest.fixture
def fake_cuda(monkeypatch):
    """A hook state with 2 plan groups and the runtime's streams, a stand-in torch whose CUDA is
    up and whose current stream is named by the calling thread; this thread unplaced."""
    state = dict(active=True, n_groups=2, graphs=True, groups={}, started=0, patched_module=True,
                 patched_copies=True, streams=types.SimpleNamespace(streams=["s0", "s1"]), streams_failed=None,
                 activation=7, late_threads=0)
    saved = dict(aa._state)
    aa._state.clear()
    aa._state.update(state)
    for name in ("group", "unplaced", "copies", "depth"):
        monkeypatch.delattr(_tls, name, raising=False)
    up = {"on": True}
    cuda = types.SimpleNamespace(is_initialized=lambda: up["on"], current_device=lambda: 0,
                                 current_stream=lambda dev=None: f"current-of-{threading.current_thread().name}")
    yield types.SimpleNamespace(cuda=cuda), up
    aa._state.clear()
    aa._state.update(saved)
    for name in ("group", "unplaced", "copies", "depth"):
        if hasattr(_tls, name):
            delattr(_tls, name)


def test_a_thread_is_placed_late_in_a_group_of_its_own_on_its_current_stream(fake_cuda):
    torch, _ = fake_cuda
    g = interception._late_group(torch)
    assert g is _tls.group and g.late == 7 and g.index == 2  # after the plan's groups 0 and 1
    assert g.stream == f"current-of-{threading.current_thread().name}" and _tls.depth == 0 and _tls.copies is None
    got = {}

    def other():
        got["g"] = interception._late_group(torch)

    t = threading.Thread(target=other, name="late-other")
    t.start()
    t.join()
    assert got["g"].index == 3 and got["g"].stream == "current-of-late-other" and got["g"] is not g
    assert aa._state["late_threads"] == 2 and aa._state["started"] == 0 and aa._state["groups"] == {}


def test_no_late_group_before_cuda_starts_nor_for_the_hooks_own_threads(fake_cuda, monkeypatch):
    torch, up = fake_cuda
    up["on"] = False
    assert interception._late_group(torch) is None
    assert getattr(_tls, "unplaced", None) is None  # asked again later: CUDA may start
    up["on"] = True
    monkeypatch.setattr(interception, "_runtime_thread", lambda t: True)
    assert interception._late_group(torch) is None and _tls.unplaced == 7  # never asked again this activation
    aa._state["graphs"] = False
    monkeypatch.setattr(interception, "_runtime_thread", lambda t: False)
    assert interception._late_group(torch) is None


_CPU_LOOP = r'''
import json, sys, torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).eval()
x = torch.randn(32, 8)
with torch.no_grad():
    out = [float(m(x * k).sum()) for k in range(5)]
print(json.dumps(out))
'''


def test_a_cpu_loop_under_the_hook_runs_as_it_is(tmp_path):
    """No CUDA: the main thread's model calls go through the patched call to PyTorch's own,
    unchanged; nothing is placed, taken over or counted."""
    pytest.importorskip("torch")
    plan = write_plan(tmp_path / "plan.json", ADVISED, Candidate(2, True, False, True))
    stats = tmp_path / "stats.json"
    plain = subprocess.run([sys.executable, "-c", _CPU_LOOP], capture_output=True, text=True, timeout=120)
    env = script_env(plan, hook_dir=tmp_path / "hook", stats_path=stats)
    hooked = subprocess.run([sys.executable, "-c", _CPU_LOOP], env=env, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and hooked.returncode == 0, hooked.stderr
    assert hooked.stdout == plain.stdout and hooked.stderr == ""
    from recsys_doctor.applying.script_hook import read_hook_stats

    st = read_hook_stats(stats)
    assert st["active"] and st["late_threads"] == 0 and st["threads"] == 0 and st["sites"] == [], st


# ------------------------------------------------------------------------------ placement at the first call

@pytest.fixture
def deferred(fake_cuda, monkeypatch):
    """The fake CUDA above with placement at the first model call (``RECSYS_DOCTOR_PLACE=first-call``):
    the plan's two group streams, the default stream 0, and every ``set_stream`` recorded."""
    torch, up = fake_cuda
    streams = [types.SimpleNamespace(device_index=0, cuda_stream=100 + k) for k in range(2)]
    current = {"s": types.SimpleNamespace(device_index=0, cuda_stream=0)}
    sets = []

    def set_stream(s):
        sets.append(s)
        current["s"] = s

    torch.cuda = types.SimpleNamespace(is_initialized=lambda: up["on"], current_stream=lambda dev=None: current["s"],
                                       default_stream=lambda dev=None: types.SimpleNamespace(cuda_stream=0),
                                       set_stream=set_stream, current_device=lambda: 0,
                                       device=lambda dev: contextlib.nullcontext())
    aa._state.update(place_at_first_call=True, thread_graphs=True,
                     streams=types.SimpleNamespace(streams=streams))
    monkeypatch.setattr(interception, "_torch", lambda: torch)
    monkeypatch.delattr(_tls, "defer", raising=False)
    yield torch, streams, current, sets
    if hasattr(_tls, "defer"):
        del _tls.defer


def test_a_deferred_thread_joins_the_next_plan_group_at_its_first_call(deferred):
    torch, streams, current, sets = deferred
    _tls.defer = 7
    g = interception._place_deferred(torch)
    assert g is _tls.group and g.index == 0 and g.late is None and g.stream is streams[0]
    assert _tls.depth == 0 and _tls.copies is not None and not hasattr(_tls, "defer")
    assert sets == [streams[0]] and current["s"] is streams[0]  # the default stream left for the group's
    assert aa._state["started"] == 1 and aa._state["groups"] == {0: g}


def test_a_deferred_thread_on_a_stream_of_its_own_stays_there(deferred):
    torch, streams, current, sets = deferred
    aa._state["started"] = 1  # (one thread placed before it: this one gets group 1)
    own = types.SimpleNamespace(device_index=0, cuda_stream=555)
    current["s"] = own
    _tls.defer = 7
    g = interception._place_deferred(torch)
    assert g.index == 1 and g.stream is streams[1]
    assert sets == [] and current["s"] is own  # the script's stream is not replaced


def test_with_placement_at_the_first_call_a_thread_starts_unplaced(deferred, monkeypatch):
    """A thread started once CUDA is up is only marked at its start: it runs on the stream it
    starts on (PyTorch's default), in no group, until it calls a model. The copy methods are
    patched before the first such thread runs (its copies before its first model call are
    counted, ``_autoapply/unplaced.py``), once."""
    torch, streams, current, sets = deferred
    aa._state["patched_copies"] = False
    patched = []
    monkeypatch.setattr(interception, "_patch_thread_copies",
                        lambda t: (patched.append(t), aa._state.update(patched_copies=True)))
    seen = {}

    def run():
        seen["defer"] = getattr(_tls, "defer", None)
        seen["group"] = hasattr(_tls, "group")
        seen["patched"] = list(patched)

    boot = interception._wrapped_bootstrap(lambda self: self.run())
    t = threading.Thread(target=run)
    boot(t)  # (the thread's body, run here: what _bootstrap_inner runs in the new thread)
    assert seen == {"defer": 7, "group": False, "patched": [torch]} and sets == [] and aa._state["started"] == 0
    boot(threading.Thread(target=run))
    assert patched == [torch]


@pytest.mark.parametrize("env,graphs,first_call", [(None, True, True), ("first-call", True, True),
                                                   ("start", True, False), (None, False, False),
                                                   ("Start", True, True)])
def test_threads_are_placed_at_their_first_model_call_by_default(monkeypatch, capsys, env, graphs, first_call):
    """Placement at the first model call is the default where the plan has CUDA graphs;
    ``RECSYS_DOCTOR_PLACE=start`` places threads at their start, as a plan without graphs does;
    any other value is said in one line and the default kept."""
    if env is None:
        monkeypatch.delenv("RECSYS_DOCTOR_PLACE", raising=False)
    else:
        monkeypatch.setenv("RECSYS_DOCTOR_PLACE", env)
    saved = dict(aa._state)
    aa._state.clear()
    aa._state["active"] = False
    try:
        aa.activate({"schema": 1, "stream_groups": {"count": 2}, "cuda_graphs": {"enabled": graphs}})
        assert aa._state["place_at_first_call"] is first_call
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ([] if env != "Start" else [
            "recsys-doctor apply: RECSYS_DOCTOR_PLACE='Start' is neither 'first-call' nor 'start': threads are "
            "placed at their first model call"]), err
    finally:
        aa.deactivate()
        aa._state.clear()
        aa._state.update(saved)


def test_copies_before_a_threads_first_model_call_are_counted_as_pytorchs(deferred):
    """A thread marked for placement at its first model call: its host-to-GPU copies until then
    (``.to``/``.cuda`` of a CPU tensor to CUDA, ``torch.as_tensor``/``torch.tensor`` of host data
    on CUDA, a non-blocking copy of pinned memory among them) are counted at the calling line as
    left to PyTorch, with why; a copy that is not host-to-GPU, one while the thread's stream
    captures, one of a tensor subclass, and any copy once the thread is placed are not counted here."""
    from recsys_doctor.applying._autoapply import accounting, unplaced

    torch, *_ = deferred
    accounting.reset()  # (a fresh count)
    # (a stand-in for pageable.to_args: a Move's non_blocking)
    to = lambda t, a, k: types.SimpleNamespace(non_blocking=k.get("non_blocking", False)) if a and a[0] == "cuda" else None  # noqa: E731
    torch.Tensor = type("Tensor", (), {"is_pinned": lambda self: self.pinned})  # (the stand-in torch's tensor type)
    cpu, gpu, pinned = torch.Tensor(), torch.Tensor(), torch.Tensor()
    cpu.device, gpu.device = types.SimpleNamespace(type="cpu"), types.SimpleNamespace(type="cuda")
    pinned.device, cpu.pinned, pinned.pinned = cpu.device, False, True
    facs = lambda t, a, k: ("cuda", None) if k.get("device") == "cuda" else None  # noqa: E731

    def copy(src, *a, **k):  # (as staging's Tensor.to / .cuda call it: one frame between the script and the count)
        unplaced.unplaced_copy(torch, src, to, a, k)

    def factory(*a, **k):  # (as staging's torch.as_tensor / torch.tensor call it)
        unplaced.unplaced_factory(torch, facs, a, k)

    _tls.defer = 7
    copy(cpu, "cuda"); line_to = sys._getframe().f_lineno  # noqa: E702
    copy(cpu, "cpu")  # (not to the GPU)
    copy(gpu, "cuda")  # (already on the GPU)
    copy(pinned, "cuda", non_blocking=True); line_async = sys._getframe().f_lineno  # noqa: E702  (counted as placed)
    unplaced.unplaced_copy(torch, cpu, to, ("cuda",), {}, lambda: True)  # (in the thread's own capture)
    unplaced.unplaced_factory(torch, facs, ([1, 2],), {"device": "cuda"}, lambda: True)  # (the same)
    factory(type("Param", (torch.Tensor,), {})(), device="cuda")  # (a tensor subclass: PyTorch's, as placed)
    copy(pinned, "cuda"); line_pinned = sys._getframe().f_lineno  # noqa: E702  (blocking: counted)
    factory([1, 2], device="cuda"); line_f = sys._getframe().f_lineno  # noqa: E702
    factory(gpu, device="cuda")  # (a GPU tensor: no host copy)
    factory([1, 2])  # (on the CPU)
    _tls.defer = 6  # (marked by an earlier activation: not this one's)
    copy(cpu, "cuda")
    del _tls.defer
    copy(cpu, "cuda")  # (placed)
    rows = {r["site"]: r for r in accounting.sites() if r["kind"] == "h2d"}
    here = __file__.rsplit("/", 1)[-1]
    assert {s.rsplit("/", 1)[-1] for s in rows} == {f"{here}:{n}" for n in (line_to, line_f, line_pinned, line_async)}, rows
    for r in rows.values():
        assert r["taken_over"] == 0 and r["fallback"] == 1 and list(r["reasons"]) == [unplaced.BEFORE_PLACED], r


def test_a_thread_started_before_cuda_is_placed_in_a_plan_group_at_its_first_call_once_cuda_is_up(deferred, monkeypatch):
    """With placement at the first model call, a thread started before CUDA is initialized (a
    pool started early) is marked too, its copies not patched yet; a model call before CUDA is
    up places nothing and keeps the mark, and the first call after joins the next plan group
    (not a group of its own on its current stream, as a thread placed at start would get)."""
    torch, streams, current, sets = deferred
    up = {"on": False}
    torch.cuda.is_initialized = lambda: up["on"]
    aa._state["patched_copies"] = False
    patched = []
    monkeypatch.setattr(interception, "_patch_thread_copies", lambda t: patched.append(t))
    boot = interception._wrapped_bootstrap(lambda self: self.run())
    seen = {}
    boot(threading.Thread(target=lambda: seen.setdefault("defer", getattr(_tls, "defer", None))))
    assert seen == {"defer": 7} and patched == []
    _tls.defer = 7  # (this thread, as marked above)
    assert interception._place_deferred(torch) is None and _tls.defer == 7 and not hasattr(_tls, "group")
    up["on"] = True
    g = interception._place_deferred(torch)
    assert g is _tls.group and g.index == 0 and g.late is None and g.stream is streams[0] and sets == [streams[0]]
    assert not hasattr(_tls, "defer") and aa._state["late_threads"] == 0


def test_a_call_nested_in_an_unplaced_call_places_nothing(deferred):
    """A thread's model call made before CUDA is up runs as PyTorch's; where CUDA comes up
    inside it (another thread moves the model meanwhile), a submodule's call nested in it does
    not place the thread (it would be taken for a top-level call and switch the thread's stream
    mid-forward); the next top-level call does."""
    torch, streams, current, sets = deferred
    up = {"on": False}
    torch.cuda.is_initialized = lambda: up["on"]
    _tls.defer = 7
    seen = {}

    def forward(module, x):
        up["on"] = True  # (CUDA comes up during this call)
        seen["nested"] = interception._place_deferred(torch)
        seen["late"] = interception._late_group(torch)
        return x + 1

    assert interception._unplaced_call(forward, "m", (1,), {}) == 2
    assert seen == {"nested": None, "late": None} and _tls.defer == 7 and not hasattr(_tls, "group")
    g = interception._place_deferred(torch)
    assert g is _tls.group and g.index == 0 and sets == [streams[0]]


# ------------------------------------------------------------------------------ several GPUs

class _FakeStreams:
    """The runtime's streams of one device, as the hook uses them (:class:`.groups._Streams`)."""

    def __init__(self, torch, n_groups, dev=None):
        self.device = types.SimpleNamespace(index=0 if dev is None else dev)
        self.streams = [types.SimpleNamespace(device_index=self.device.index, cuda_stream=1000 * self.device.index + k)
                        for k in range(n_groups)]


def test_each_gpu_gets_the_plans_groups_and_a_thread_takes_its_models_gpus(deferred, monkeypatch):
    """A process serving a replica per GPU (``examples/heldout/multi_gpu_serve.py``): a thread
    placed at its first call of a model on cuda:1 takes the next of cuda:1's own groups (their
    streams on that device, keyed by device), and its group's stream becomes its current stream
    on cuda:1 without changing its current device (PyTorch's ``set_stream`` would make the
    stream's device current: the worker's next ``.cuda()`` would land on another GPU)."""
    from recsys_doctor.applying._autoapply import groups as groups_mod

    torch, _, current, sets = deferred
    monkeypatch.setattr(groups_mod, "_Streams", _FakeStreams)
    monkeypatch.setitem(aa._state, "streams", None)
    monkeypatch.setitem(aa._state, "streams_by_dev", {})
    monkeypatch.setitem(aa._state, "groups", {})
    monkeypatch.setattr(interception, "_module_device", lambda m: m)  # (the "module" is its device)
    entered = []
    torch.cuda.device = lambda dev: (entered.append(dev), contextlib.nullcontext())[1]
    placed = []
    for dev in (0, 1, 1, 0, 1):  # (each a new thread, on its device's default stream)
        current["s"] = types.SimpleNamespace(device_index=dev, cuda_stream=0)
        _tls.defer = 7
        placed.append(interception._place_deferred(torch, dev))
        del _tls.group
    first, by_dev = aa._state["streams"], aa._state["streams_by_dev"]
    assert first.device.index == 0 and list(by_dev) == [1]
    assert [(g.dev, g.index) for g in placed] == [(0, 0), (1, 0), (1, 1), (0, 1), (1, 0)]
    assert placed[4] is placed[1] and aa._state["groups"] == {0: placed[0], 1: placed[3], (1, 0): placed[1],
                                                             (1, 1): placed[2]}
    assert all(g.stream is by_dev[1].streams[g.index] for g in placed if g.dev == 1)
    assert entered == [0, 1, 1, 0, 1] and sets == [g.stream for g in placed]  # (each under its device)
    assert aa._state["started"] == 5 and aa._state["started_by_dev"] == {1: 3}


def test_a_module_on_several_gpus_runs_eagerly_and_one_on_a_gpu_is_placed_there():
    from recsys_doctor.applying._autoapply import modstate

    def fake(*devs):
        ts = [types.SimpleNamespace(is_cuda=d is not None, get_device=lambda d=d: d) for d in devs]
        return types.SimpleNamespace(parameters=lambda: iter(ts[:1]), buffers=lambda: iter(ts[1:]))

    rec = types.SimpleNamespace(device="unset")
    assert modstate._place(rec, fake(1, 1)) is None and rec.device == 1
    assert modstate._place(rec, fake(None)) is None and rec.device is None  # (on the CPU)
    why = modstate._place(rec, fake(0, 1))
    assert rec.device == 0 and why == f"{modstate.SPANS_DEVICES} (cuda:0, cuda:1): eager"
    assert modstate.cuda_devices(object()) == ()  # (not a module: none)
