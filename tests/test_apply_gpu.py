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
from recsys_doctor.applying._autoapply.unplaced import BEFORE_PLACED

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


def pinned_query(model, q):
    """One query of the examples' wide&deep: its pinned host tensors copied non-blocking, the
    model called without gradients, the output read back."""
    import torch

    dense, idx, offs = q
    with torch.no_grad():
        return model(dense.cuda(non_blocking=True), [t.cuda(non_blocking=True) for t in idx],
                     offs.cuda(non_blocking=True)).cpu()


def _run_hooked(tmp_path, groups: int, threads: int, client, cand=None) -> dict:
    """``client(k)`` on ``threads`` threads under the script hook with ``groups`` graphed
    groups (or the plan of candidate ``cand``); the hook's stats afterwards (the test fails
    on any client's error)."""
    import sys

    from recsys_doctor.applying.apply import write_plan
    from recsys_doctor.applying.script_hook import activate_in_process
    from recsys_doctor.planning.whatif import Candidate

    plan = write_plan(tmp_path / "plan.json", ADVISED, cand or Candidate(groups, True, True, True))
    undo = activate_in_process(plan)
    hook = sys.modules["_recsys_doctor_autoapply"]
    try:
        errors = run_threads(client, threads)
        st = hook.stats()
    finally:
        undo()
    assert not errors, errors[0]
    return st


@pytest.mark.parametrize("groups,threads", [(3, 6), (2, 8), (1, 8)])
def test_script_hook_outputs_equal_eager(tmp_path, groups, threads):
    """2, 4 and 8 client threads per graphed group: every group captures (no fallback)
    and every output equals eager's (more than 2 threads per group once failed to capture:
    the capturing thread had no cuBLAS handle of its own)."""
    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    qs = []
    for k in range(threads):
        torch.manual_seed(50 + k)
        qs.append(host_query(32, 1000))

    def query(q):
        return pinned_query(model, q)

    ref = [query(q) for q in qs]
    got: dict[int, list] = {}

    def client(k: int) -> None:
        got[k] = [query(qs[(k + i) % len(qs)]) for i in range(12)]

    st = _run_hooked(tmp_path, groups, threads, client)
    assert st["threads"] >= threads and st["captured"] == groups and st["replays"] > 0 and not st["fallbacks"]
    for k, outs in got.items():
        for i, o in enumerate(outs):
            assert torch.equal(o, ref[(k + i) % len(qs)]), (k, i)


@pytest.mark.parametrize("groups,threads", [(8, 8), (2, 6)])
def test_thread_graphs_take_over_a_threads_own_pinned_copies(tmp_path, groups, threads):
    """The plain script's pattern: each client copies its own pinned inputs with
    ``.to("cuda", non_blocking=True)``, the same tensors every query. Every thread captures
    a graph of its own (the copies and the model) and replays it. Outputs equal eager's
    while the inputs' values change in place between queries, when the script reads a
    copy before the model call (the deferred copies are made first) or changes one in place
    (the model sees the change), and for copies the script keeps from an earlier query
    (they keep their values). Groups of 3 threads too."""
    torch = pytest.importorskip("torch")
    model, host_query = _wdl()
    rounds, keep_at, peek_at, write_at = 10, 6, 7, 8
    base = []
    for k in range(threads):
        torch.manual_seed(70 + k)
        base.append(host_query(32, 1000))
    qs = [(d.clone().pin_memory(), [t.clone().pin_memory() for t in i], o.clone().pin_memory()) for d, i, o in base]

    def set_round(k, r):  # new values, in place, in the same pinned tensors
        (d0, i0, _), (d, i, _) = base[k], qs[k]
        d.copy_(d0 * (1 + r))
        for a, b in zip(i, i0):
            a.copy_((b + r) % 1000)

    def query(k, r):
        dense, idx, offs = qs[k]
        with torch.no_grad():
            d = dense.to("cuda", non_blocking=True)
            ii = [t.to("cuda", non_blocking=True) for t in idx]
            o = offs.to("cuda", non_blocking=True)
            peek = float(d.sum()) if r == peek_at else None  # a use before the model call
            if r == write_at:
                d.add_(0.5)  # the script changes its copy before the model call
            return model(d, ii, o).cpu(), peek, ii

    ref = {}
    for k in range(threads):
        for r in range(rounds):
            set_round(k, r)
            ref[k, r] = query(k, r)[0]
    got: dict = {}

    def client(k: int) -> None:
        for r in range(rounds):
            set_round(k, r)
            out, peek, ii = query(k, r)
            got[k, r] = out
            if r == keep_at:
                got[k, "kept"] = ii
            if r == peek_at:
                got[k, "peek"] = (peek, float(qs[k][0].sum()))

    st = _run_hooked(tmp_path, groups, threads, client)
    assert not st["fallbacks"], st["fallbacks"]
    # replays: every round but the first three (two warm-up calls, the capture) and the two
    # whose views the script used before the model call (the group's path)
    assert st["thread_graphs"] == threads and st["thread_replays"] >= threads * (rounds - 5), st
    assert st["materialized"] >= 2 * threads  # the read and the write before the model call
    for k in range(threads):
        for r in range(rounds):
            assert torch.equal(got[k, r], ref[k, r]), (k, r)
        peek, want = got[k, "peek"]
        assert peek == pytest.approx(want, rel=1e-6)
        kept = [t.cpu() for t in got[k, "kept"]]
        assert all(torch.equal(a, (b + keep_at) % 1000) for a, b in zip(kept, base[k][1])), k



def _numpy_queries(torch, host_query, threads: int, seed: int) -> list:
    """One wide&deep query a thread (seeded ``seed + k``), as a script that reads its inputs
    with numpy has them: the dense rows and each id list as numpy arrays of their own, the
    offsets as a Python list."""
    qs = []
    for k in range(threads):
        torch.manual_seed(seed + k)
        d, i, o = host_query(32, 1000)
        qs.append((d.numpy().copy(), [t.numpy().copy() for t in i], o.tolist()))
    return qs


@pytest.mark.parametrize("staging", ["1", "0"])
def test_pageable_copies_are_staged_and_outputs_equal_eager(tmp_path, monkeypatch, staging):
    """The copies real scripts make (issue 25): numpy and lists moved with
    ``torch.from_numpy(a).cuda()``, ``torch.as_tensor(a, device=...)``, ``torch.tensor(list,
    device=...)`` and ``.to("cuda", dtype)``. Under the hook they are staged through each
    thread's pinned buffers (64 KiB here, so the two are reused every few queries) and copied
    asynchronously; every output equals eager's although each numpy array is overwritten right
    after its copy, and every copy is counted as taken over at this function's lines. With
    staging off (the default) the same copies are PyTorch's, counted as left to it."""
    torch = pytest.importorskip("torch")
    import numpy as np

    monkeypatch.setenv("RECSYS_DOCTOR_STAGING_BYTES", str(64 << 10))
    monkeypatch.setenv("RECSYS_DOCTOR_STAGE_PAGEABLE", staging)
    model, host_query = _wdl()
    threads, rounds = 6, 12
    qs = [(d.astype(np.float64), i, o) for d, i, o in _numpy_queries(torch, host_query, threads, 90)]

    def query(k, r):
        dense, idx, offs = qs[k]
        d_np = dense * (1 + r)
        i_np = [(a + r) % 1000 for a in idx]
        with torch.no_grad():
            d = torch.from_numpy(d_np).cuda().float()
            d_np[:] = -7.0  # the script reuses its array at once: the copy has its values
            ii = [torch.as_tensor(a, device="cuda") for a in i_np]
            for a in i_np:
                a[:] = 0
            o = torch.tensor(offs, device="cuda")
            d2 = torch.from_numpy(dense).to("cuda", torch.float32)
            return model(d + 0 * d2, ii, o).cpu()

    ref = {(k, r): query(k, r) for k in range(threads) for r in range(rounds)}
    got: dict = {}

    def client(k: int) -> None:
        for r in range(rounds):
            got[k, r] = query(k, r)

    st = _run_hooked(tmp_path, 2, threads, client)
    for key, want in ref.items():
        assert torch.equal(got[key], want), key
    h2d = [s for s in st["sites"] if s["kind"] == "h2d"]
    assert h2d and all(s["site"].startswith("tests/test_apply_gpu.py:") for s in h2d), h2d
    # per query: the dense copy, 26 ids, the offsets, the second dense copy; a thread's first
    # query's copies come before its first model call, where it is placed: PyTorch's, counted so
    per_query = 1 + 26 + 1 + 1
    n, first = threads * rounds * per_query, threads * per_query
    before = sum(s["reasons"].get(BEFORE_PLACED, 0) for s in h2d)
    assert before == first, h2d
    if staging == "1":
        assert sum(s["fallback"] for s in h2d) == first, h2d
        assert sum(s["taken_over"] for s in h2d) == n - first and st["staged_copies"] == n - first
    else:
        # the next queries of each thread go through its slots, until its model call is
        # known not to take its copies straight (d + 0 * d2): PyTorch's copies from then on
        took, left = sum(s["taken_over"] for s in h2d), sum(s["fallback"] for s in h2d)
        assert took + left == n and left >= n - threads * 3 * per_query, (took, left)
        assert all(set(s["reasons"]) <= {pageable_reason(), BEFORE_PLACED} for s in h2d), h2d


@pytest.mark.parametrize("groups,threads", [(2, 6), (4, 4)])
def test_pageable_copies_straight_into_the_model_join_the_thread_graph(tmp_path, groups, threads):
    """The DLRM script's pattern: numpy arrays moved with ``torch.from_numpy(a).cuda()``,
    ``torch.as_tensor(a, device=...)`` and ``torch.tensor(list, device=...)`` straight into the
    model call. The hook copies them into the thread's own pinned slots (the same every query)
    and the thread graph takes the copies over with the model: each thread captures its graph
    and replays it, every output equals eager's although each array is overwritten right after
    its copy, and a copy the script keeps from an earlier query keeps its values."""
    torch = pytest.importorskip("torch")
    import numpy as np

    model, host_query = _wdl()
    rounds, keep_at = 12, 7
    qs = _numpy_queries(torch, host_query, threads, 110)

    def query(k, r):
        dense, idx, offs = qs[k]
        d_np = dense * (1 + r)
        i_np = [(a + r) % 1000 for a in idx]
        with torch.no_grad():
            d = torch.from_numpy(d_np).cuda()
            d_np[:] = -7.0
            ii = [torch.as_tensor(a, device="cuda") for a in i_np]
            for a in i_np:
                a[:] = 0
            o = torch.tensor(offs, device="cuda")
            return model(d, ii, o).cpu(), ii

    ref = {(k, r): query(k, r)[0] for k in range(threads) for r in range(rounds)}
    got: dict = {}

    def client(k: int) -> None:
        for r in range(rounds):
            out, ii = query(k, r)
            got[k, r] = out
            if r == keep_at:
                got[k, "kept"] = ii

    st = _run_hooked(tmp_path, groups, threads, client)
    assert not st["fallbacks"], st["fallbacks"]
    assert st["thread_graphs"] == threads and st["thread_replays"] >= threads * (rounds - 5), st
    for k in range(threads):
        for r in range(rounds):
            assert torch.equal(got[k, r], ref[k, r]), (k, r)
        kept = [t.cpu().numpy() for t in got[k, "kept"]]
        assert all(np.array_equal(a, (b + keep_at) % 1000) for a, b in zip(kept, qs[k][1])), k
    h2d = [s for s in st["sites"] if s["kind"] == "h2d"]
    # every query's 28 copies taken over but the first query's, made before the thread's first
    # model call (where it is placed): PyTorch's, counted so
    assert sum(s["taken_over"] for s in h2d) == threads * (rounds - 1) * 28, h2d
    assert sum(s["fallback"] for s in h2d) == threads * 28, h2d
    assert all(set(s["reasons"]) <= {BEFORE_PLACED} for s in h2d), h2d

def pageable_reason() -> str:
    import sys

    return sys.modules["_recsys_doctor_autoapply.pageable"].LEFT_SYNCHRONOUS


def test_served_workload_equals_default_query():
    torch = pytest.importorskip("torch")
    from recsys_doctor.capture._drive import _default_serve_query
    from recsys_doctor.applying.apply import make_runner, runtime_plan
    from recsys_doctor.planning.whatif import Candidate
    from recsys_doctor.capture.workload import load_workload, measure

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
    from recsys_doctor.applying.apply import make_runner
    from recsys_doctor.capture.workload import load_workload, measure

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


def test_a_batching_candidate_reports_its_bucket_costs(tmp_path):
    """The measured candidate's ``info`` carries ``served.bucket_gpu_us()`` for every bucket
    it captured (what ``profile --apply`` writes to ``bucket_gpu_us.json``), in the shape
    ``whatif --bucket-costs`` reads; an unbatched candidate carries none, nor does the
    after-profile's run of a batching plan (``bucket_costs=False``)."""
    pytest.importorskip("torch")
    from recsys_doctor.applying.apply import make_runner, runtime_plan
    from recsys_doctor.capture.workload import load_workload, measure
    from recsys_doctor.planning.io import read_bucket_costs
    from recsys_doctor.planning.whatif import Candidate

    wl = load_workload(ROOT / "examples" / "wdl_workload.py", ["--vocab", "1000", "--batch", "64"])
    run, close, info, wl2 = make_runner(wl, runtime_plan(Candidate(2, batching=True, max_batch=8), 8))
    try:
        measure(wl2, threads=8, duration_s=0.3, run=run)
    finally:
        close()
    b = info["stats"]["batching"]
    assert b["enabled"], json.dumps(info, default=str)
    costs = info["bucket_gpu_us"]
    assert sorted(int(k) for k in costs) == sorted(b["buckets"]) and all(v > 0 for v in costs.values())
    f = tmp_path / "bucket_gpu_us.json"
    f.write_text(json.dumps(costs))
    assert read_bucket_costs(f) == {int(k): v * 1e3 for k, v in costs.items()}
    run, close, info, wl2 = make_runner(wl, runtime_plan(Candidate(2), 4))
    close()
    assert "bucket_gpu_us" not in info
    # the after-profile's runner (bucket_costs=False): the same batching plan, its buckets not measured
    run, close, info, wl2 = make_runner(wl, runtime_plan(Candidate(2, batching=True, max_batch=8), 8),
                                        bucket_costs=False)
    try:
        measure(wl2, threads=8, duration_s=0.3, run=run)
    finally:
        close()
    assert info["stats"]["batching"]["enabled"] and "bucket_gpu_us" not in info
