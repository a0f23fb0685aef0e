"""--apply on a real GPU (run on the GPU machine: ``pytest -m gpu tests/test_apply_gpu.py``).

The applied runtime must compute what the eager code computes: the plain-script hook
(stream per thread + graphed top-level model calls) gives the same outputs as eager
queries, the served workload the same outputs as the default query, and the applied
MMoE training (branch streams + whole-step CUDA graph) the same losses as eager steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _threads import run_threads

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
ADVISED = {"schema": 1, "stream_groups": {"count": 4}, "cuda_graphs": {"enabled": True}}


def _wdl(vocab=1000):
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    import torch
    from wdl_serving import WideDeep, host_query

    torch.manual_seed(0)
    return WideDeep(vocab).cuda().eval(), host_query


@pytest.mark.parametrize("groups,threads", [(3, 6), (2, 8), (1, 8)])
def test_script_hook_outputs_equal_eager(tmp_path, groups, threads):
    """2, 4 and 8 client threads per graphed group: every group captures (no fallback)
    and every output equals eager's (more than 2 threads per group once failed to capture:
    the capturing thread had no cuBLAS handle of its own)."""
    torch = pytest.importorskip("torch")
    from recsys_doctor.apply import write_plan
    from recsys_doctor.script_hook import activate_in_process
    from recsys_doctor.whatif import Candidate

    model, host_query = _wdl()
    qs = []
    for k in range(threads):
        torch.manual_seed(50 + k)
        qs.append(host_query(32, 1000))

    def query(q):
        dense, idx, offs = q
        with torch.no_grad():
            return model(dense.cuda(non_blocking=True), [t.cuda(non_blocking=True) for t in idx],
                         offs.cuda(non_blocking=True)).cpu()

    ref = [query(q) for q in qs]
    plan = write_plan(tmp_path / "plan.json", ADVISED, Candidate(groups, True, True, True))
    undo = activate_in_process(plan)
    import sys

    hook = sys.modules["_recsys_doctor_autoapply"]
    got: dict[int, list] = {}

    def client(k: int) -> None:
        got[k] = [query(qs[(k + i) % len(qs)]) for i in range(12)]

    try:
        errors = run_threads(client, threads)
        st = hook.stats()
    finally:
        undo()
    assert not errors, errors[0]
    assert st["threads"] >= threads and st["captured"] == groups and st["replays"] > 0 and not st["fallbacks"]
    for k, outs in got.items():
        for i, o in enumerate(outs):
            assert torch.equal(o, ref[(k + i) % len(qs)]), (k, i)


def test_served_workload_equals_default_query():
    torch = pytest.importorskip("torch")
    from recsys_doctor._drive import _default_serve_query
    from recsys_doctor.apply import make_runner, runtime_plan
    from recsys_doctor.whatif import Candidate
    from recsys_doctor.workload import load_workload, measure

    wl = load_workload(ROOT / "examples" / "wdl_workload.py", ["--vocab", "1000", "--batch", "64"])
    ref = _default_serve_query(wl.model)(*wl.inputs(1))
    run, close, info, wl2 = make_runner(wl, runtime_plan(Candidate(2, True, True, True), 4))
    try:
        out = run(*wl.inputs(1))
        m = measure(wl2, threads=4, duration_s=0.3, run=run)
    finally:
        close()
    assert torch.equal(out, ref)
    assert m.calls > 0 and m.qps > 0
    assert info["stats"]["groups"][0]["graphs"] >= 1


def test_applied_mmoe_training_keeps_the_losses():
    pytest.importorskip("torch")
    from recsys_doctor.apply import make_runner
    from recsys_doctor.workload import load_workload, measure

    path = ROOT / "examples" / "mmoe_training.py"
    args = ["--vocab", "2000", "--batch", "128"]
    base = measure(load_workload(path, args), steps=30)
    wl = load_workload(path, args)
    run, close, info, wl2 = make_runner(wl, {"groups": 4, "cuda_graphs": True})
    try:
        m = measure(wl2, steps=30, run=run)
    finally:
        close()
    assert info.get("whole_step_graph") and "fallback" not in info, json.dumps(info, default=str)
    assert len(m.losses) == len(base.losses) == 30
    for a, b in zip(base.losses, m.losses):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), (base.losses[:5], m.losses[:5])
    assert m.losses[-1] < m.losses[0]
