"""A thread that trains the model the other threads serve, under the script hook on a real GPU
(run on the GPU machine: ``pytest -m gpu tests/test_autoapply_trainers_gpu.py``).

Unhooked, an online learner's in-place updates and every request's kernels share PyTorch's
default stream, so a request made after the learner's last step reads the new weights. Placed on
a group stream of its own, the learner's steps ran beside the other groups' replays with nothing
between them. The hook now takes a thread that trains off its group at its first backward or
optimizer step (``_autoapply/trainers.py``). In-process: a learner thread trains a few steps a
wave, its GPU lagging its host (a ``torch.cuda._sleep`` before each step, as a learner's big
batches make it lag), then the serving threads score; every output must be eager's with that
wave's weights, and the same run with the learner kept in its group must not be (the negative
control: so the test sees a stale read when there is one). ``examples/heldout/online_learning_serve.py``
must print the unhooked checksum under one and two groups, in both its modes."""

from __future__ import annotations

import copy
import sys
import threading
from pathlib import Path

import pytest
from _hooked_script import assert_same_scores, graphed_calls, run_hooked, run_json
from _threads import run_threads

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "heldout" / "online_learning_serve.py"
WAVES, STEPS, CALLS, SERVERS = 4, 3, 30, 3
LAG_CYCLES = 20_000_000  # ~10-20 ms of GPU time queued before each optimizer step


def _setup(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).cuda().eval()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(1024, 64, generator=gen).cuda(), torch.randn(1024, 1, generator=gen).cuda())
               for _ in range(WAVES * STEPS)]
    queries = [torch.randn(16, 64, generator=gen).cuda() for _ in range(SERVERS)]
    return model, batches, queries


def _train_wave(torch, model, opt, batches, w: int, lag: bool) -> None:
    for x, y in batches[w * STEPS:(w + 1) * STEPS]:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        if lag:
            torch.cuda._sleep(LAG_CYCLES)
        opt.step()


def _reference(torch, model, batches, queries) -> list[list]:
    """Per wave, each server's query scored after that wave's steps, all on one thread."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref = []
    for w in range(WAVES):
        _train_wave(torch, model, opt, batches, w, lag=False)
        with torch.no_grad():
            ref.append([model(q).cpu() for q in queries])
    return ref


def _serve_and_learn(tmp_path, torch, groups: int, keep_learner_placed: bool):
    from recsys_doctor.applying.apply import write_plan
    from recsys_doctor.applying.script_hook import activate_in_process
    from recsys_doctor.planning.whatif import Candidate

    model, batches, queries = _setup(torch)
    ref = _reference(torch, model, batches, queries)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    got: dict[tuple[int, int], list] = {}
    bar = threading.Barrier(1 + SERVERS)

    def client(k: int) -> None:
        for w in range(WAVES):
            if k == 0:  # the learner: its wave's steps, then the servers go (nothing synchronized)
                _train_wave(torch, model, opt, batches, w, lag=True)
                bar.wait(120)
            else:
                bar.wait(120)
                with torch.no_grad():
                    got[(w, k - 1)] = [model(queries[k - 1]).cpu() for _ in range(CALLS)]
            bar.wait(120)  # (the wave served before the next steps)

    plan = write_plan(tmp_path / "plan.json", {}, Candidate(groups, True, False, True))
    undo = activate_in_process(plan)
    hook = sys.modules["_recsys_doctor_autoapply"]
    if keep_learner_placed:
        sys.modules[hook.__name__ + ".trainers"].leave_for_training = lambda t: None
    try:
        errors = run_threads(client, 1 + SERVERS, timeout_s=300)
        st = hook.stats()
    finally:
        undo()
    assert not errors, errors[0]
    return got, ref, st


def _stale(torch, got, ref) -> int:
    return sum(not torch.allclose(out, ref[w][k], rtol=1e-4, atol=1e-5) for (w, k), outs in got.items() for out in outs)


@pytest.mark.parametrize("groups", [2, 4])
def test_serving_threads_read_the_weights_of_the_learners_last_step(tmp_path, groups):
    torch = pytest.importorskip("torch")
    got, ref, st = _serve_and_learn(tmp_path, torch, groups, keep_learner_placed=False)
    assert _stale(torch, got, ref) == 0, st
    assert st["training_thread_count"] == 1 and len(st["training_threads"]) == 1, st
    assert graphed_calls(st) >= WAVES * SERVERS * CALLS // 2, st


def test_a_learner_kept_on_its_group_stream_makes_stale_reads(tmp_path):
    """The negative control: the learner left on its group's stream, the servers of the other
    groups read weights its lagging steps had not yet written."""
    torch = pytest.importorskip("torch")
    got, ref, st = _serve_and_learn(tmp_path, torch, 4, keep_learner_placed=True)
    assert _stale(torch, got, ref) > 0 and st["training_thread_count"] == 0, st


@pytest.fixture(scope="module", params=["alternate", "concurrent"])
def mode_unhooked(request) -> tuple[list[str], dict]:
    args = ["--threads", "4", "--queries", "1200", "--waves", "6", "--train-steps", "10", "--mode", request.param]
    return args, run_json(SCRIPT, args)


@pytest.mark.parametrize("groups", [1, 2])
def test_the_online_learning_script_keeps_its_unhooked_checksum(tmp_path, mode_unhooked, groups):
    args, unhooked = mode_unhooked
    got, st = run_hooked(tmp_path, SCRIPT, args, groups)
    assert_same_scores(got, unhooked, st)
    assert got["served"] == unhooked["served"] and st["training_thread_count"] == 1, st
