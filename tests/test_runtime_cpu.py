"""CPU-only tests of the stream-group runtime: the parts that need no GPU (scheduling
policy, input-signature keying, staging layout, plan parsing, CUDA error formatting,
importing without torch). The GPU parts are tested for real in test_runtime_gpu.py."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from recsys_doctor.errors import BadInputError, RuntimeCudaError
from recsys_doctor.runtime import (
    FairSlotPool,
    RuntimeConfig,
    check,
    flatten,
    input_signature,
    pack_layout,
    pick_least_loaded,
    unflatten,
)

# ----------------------------------------------------------------------------- scheduling


def test_least_in_flight_wins():
    assert pick_least_loaded([2, 0, 1]) == 1
    assert pick_least_loaded([3, 3, 1, 2], start=0) == 2


def test_ties_rotate_from_start():
    assert [pick_least_loaded([0, 0, 0], start=s) for s in range(4)] == [0, 1, 2, 0]
    # only tied groups take part in the rotation
    assert pick_least_loaded([1, 0, 1, 0], start=2) == 3
    assert pick_least_loaded([1, 0, 1, 0], start=0) == 1


def test_idle_probe_breaks_ties_without_blocking():
    calls = []

    def probe(i, value):
        def f():
            calls.append(i)
            return value
        return f

    idle = [probe(0, False), probe(1, True), probe(2, True)]
    assert pick_least_loaded([0, 0, 0], start=0, idle=idle) == 1
    assert calls == [0, 1]  # stops at the first idle group


def test_idle_probe_not_consulted_without_a_tie():
    def boom():
        raise AssertionError("probe must not run when the load alone decides")

    assert pick_least_loaded([1, 0, 2], idle=[boom, boom, boom]) == 1


def test_simulated_dispatch_balances_queries():
    # fake in-flight counters: 7 queries arrive while none completes, then all complete
    loads = [0, 0, 0]
    start = 0
    picked = []
    for _ in range(7):
        i = pick_least_loaded(loads, start)
        loads[i] += 1
        start = (i + 1) % 3
        picked.append(i)
    assert picked == [0, 1, 2, 0, 1, 2, 0]
    assert loads == [3, 2, 2]


def test_no_groups_is_an_error():
    with pytest.raises(BadInputError):
        pick_least_loaded([])


# ----------------------------------------------------------------------------- fair slot pool


def _until(pred, what: str, timeout: float = 10.0) -> None:
    """Test-side wait for a state of the pool (the pool itself never polls)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.0005)


def test_pool_free_slots_go_to_the_least_loaded_group():
    pool = FairSlotPool([["a0", "a1"], ["b0", "b1"], ["c0", "c1"]])
    got = [pool.acquire() for _ in range(6)]
    # loads 0,0,0 -> rotate 0,1,2, then 1,1,1 -> rotate again (by hand)
    assert [g for g, _ in got] == [0, 1, 2, 0, 1, 2]
    assert sorted(s for _, s in got) == ["a0", "a1", "b0", "b1", "c0", "c1"]
    assert pool.in_use == [2, 2, 2] and pool.waiting == 0
    pool.release(1, "b1")
    assert pool.in_use == [2, 1, 2]
    assert pool.acquire() == (1, "b1")  # the only group with a free slot


def test_pool_idle_probe_breaks_ties_between_free_groups():
    pool = FairSlotPool([["a"], ["b"]], idle=[lambda: False, lambda: True])
    assert pool.acquire() == (1, "b")


def test_pool_serves_waiters_in_arrival_order_without_starvation():
    # K = 2 slots, N = 5 client threads, 3 rounds each. The main thread keeps slot "b",
    # so one slot circulates and every handoff is observable one at a time.
    n, rounds = 5, 3
    pool = FairSlotPool([["a"], ["b"]])
    held = [pool.acquire(), pool.acquire()]
    assert sorted(held) == [(0, "a"), (1, "b")]
    grants: "queue.Queue[tuple[int, int, str]]" = queue.Queue()
    go = [threading.Event() for _ in range(n)]

    def client(i: int) -> None:
        for _ in range(rounds):
            g, s = pool.acquire()
            grants.put((i, g, s))
            go[i].wait()
            go[i].clear()
            pool.release(g, s)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for i, t in enumerate(threads):  # arrival order 0, 1, 2, 3, 4
        t.start()
        _until(lambda: pool.waiting == i + 1, f"client {i} to queue")
    pool.release(0, "a")
    order: list[int] = []
    done = [0] * n
    while True:
        i, g, s = grants.get(timeout=10)
        assert (g, s) == (0, "a")
        order.append(i)
        done[i] += 1
        if len(order) == n * rounds:
            break
        # before the holder releases, the previous holder must be back in the queue (or finished)
        want = sum(1 for k in range(n) if k != i and done[k] < rounds)
        _until(lambda: pool.waiting == want, f"{want} waiters")
        go[i].set()
    go[order[-1]].set()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()
    # strict arrival order: each waiter was served after exactly the n - 1 waiters ahead of it
    assert order == list(range(n)) * rounds
    pool.release(1, "b")
    assert pool.in_use == [0, 0] and pool.waiting == 0


def test_pool_release_skips_waiters_that_cannot_take_that_group():
    pool = FairSlotPool([["a"], ["b"]])
    held = [pool.acquire(), pool.acquire()]
    out: "queue.Queue[tuple[str, tuple[int, str]]]" = queue.Queue()
    go = {name: threading.Event() for name in "ABC"}

    def client(name: str, only: int | None) -> None:
        got = pool.acquire(only=only)
        out.put((name, got))
        go[name].wait()
        pool.release(*got)

    ts = []
    for k, (name, only) in enumerate([("A", 1), ("B", None), ("C", 0)]):
        ts.append(threading.Thread(target=client, args=(name, only), daemon=True))
        ts[-1].start()
        _until(lambda: pool.waiting == k + 1, f"{name} to queue")
    pool.release(*held[0])                        # group 0: A may not take it, B is next
    assert out.get(timeout=10) == ("B", (0, "a"))
    pool.release(*held[1])                        # group 1: A, the oldest
    assert out.get(timeout=10) == ("A", (1, "b"))
    go["B"].set()                                 # B gives group 0 back: C
    assert out.get(timeout=10) == ("C", (0, "a"))
    go["A"].set()
    go["C"].set()
    for t in ts:
        t.join(timeout=10)
        assert not t.is_alive()
    assert pool.in_use == [0, 0] and pool.waiting == 0


def test_pool_many_threads_never_share_a_slot_and_all_finish():
    pool = FairSlotPool([["a0", "a1"], ["b0"]])   # K = 3 slots
    lock = threading.Lock()
    holding: set[str] = set()
    errors: list[str] = []
    served = [0] * 8

    def client(i: int) -> None:
        for _ in range(200):
            g, s = pool.acquire()
            with lock:
                if s in holding or len(holding) >= 3 or s[0] != "ab"[g]:
                    errors.append(f"bad grant {g} {s} while {sorted(holding)}")
                holding.add(s)
            time.sleep(0)  # hold the slot across a thread switch
            with lock:
                holding.discard(s)
            served[i] += 1
            pool.release(g, s)

    ts = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
        assert not t.is_alive()
    assert errors == []
    assert served == [200] * 8
    assert pool.in_use == [0, 0] and pool.waiting == 0


def test_pool_close_wakes_waiters_and_bad_arguments_are_user_errors():
    pool = FairSlotPool([["a"]])
    pool.acquire()
    raised: list[BaseException] = []

    def waiter() -> None:
        try:
            pool.acquire()
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            raised.append(e)

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    _until(lambda: pool.waiting == 1, "the waiter to queue")
    pool.close()
    t.join(timeout=10)
    assert not t.is_alive() and len(raised) == 1 and isinstance(raised[0], RuntimeCudaError)
    with pytest.raises(RuntimeCudaError):
        pool.acquire()
    with pytest.raises(BadInputError):
        FairSlotPool([])
    with pytest.raises(BadInputError):
        FairSlotPool([["a"], []])
    with pytest.raises(BadInputError):
        FairSlotPool([["a"]]).acquire(only=1)


# ----------------------------------------------------------------------------- signatures


def test_signature_ignores_values_but_not_shape_dtype_structure():
    a = (np.zeros((4, 3), np.float32), [np.arange(8), np.arange(8)], 5)
    b = (np.ones((4, 3), np.float32), [np.arange(8) + 7, np.arange(8)], 5)
    assert input_signature(a) == input_signature(b)
    assert hash(input_signature(a)) == hash(input_signature(b))
    changed_shape = (np.zeros((5, 3), np.float32), [np.arange(8), np.arange(8)], 5)
    changed_dtype = (np.zeros((4, 3), np.float64), [np.arange(8), np.arange(8)], 5)
    changed_const = (np.zeros((4, 3), np.float32), [np.arange(8), np.arange(8)], 6)
    changed_struct = (np.zeros((4, 3), np.float32), (np.arange(8), np.arange(8)), 5)
    one_less = (np.zeros((4, 3), np.float32), [np.arange(8)], 5)
    sigs = {input_signature(x) for x in (a, changed_shape, changed_dtype, changed_const, changed_struct, one_less)}
    assert len(sigs) == 6


def test_dict_key_order_does_not_matter():
    x, y = np.zeros(3), np.ones(2)
    assert input_signature({"a": x, "b": y}) == input_signature({"b": y, "a": x})


def test_flatten_unflatten_round_trip():
    tree = (np.zeros(2), {"z": [np.ones(1), 3], "a": np.full(4, 2.0)}, None)
    leaves, spec = flatten(tree, lambda v: isinstance(v, np.ndarray))
    # dict keys sorted: "a" before "z"; constants are leaves too
    assert [type(v).__name__ for v in leaves] == ["ndarray", "ndarray", "ndarray", "int", "NoneType"]
    assert leaves[1].shape == (4,) and leaves[3] == 3
    back = unflatten(leaves, spec)
    assert back[1]["z"][1] == 3 and back[2] is None and isinstance(back[1]["z"], list)
    assert back[1]["a"] is leaves[1]
    with pytest.raises(BadInputError):
        unflatten(leaves + [1], spec)


# ----------------------------------------------------------------------------- staging layout


def test_pack_layout_by_hand():
    # dense (3,5) float32 = 60 B; three int64 (8,) = 64 B each, one run; offs (2,) int64 = 16 B
    specs = [("float32", (3, 5), 4)] + [("int64", (8,), 8)] * 3 + [("int64", (2,), 8)]
    lay = pack_layout(specs, align=256)
    assert lay.offsets == (0, 256, 320, 384, 512)
    assert lay.nbytes_each == (60, 64, 64, 64, 16)
    assert lay.runs == ((0, 1), (1, 3), (4, 1))
    assert lay.nbytes == 768


def test_pack_layout_wide_and_deep():
    # the benchmark's query: (256,13) f32 + 26 x (1024,) i64 + (256,) i64
    specs = [("float32", (256, 13), 4)] + [("int64", (1024,), 8)] * 26 + [("int64", (256,), 8)]
    lay = pack_layout(specs)
    assert lay.runs == ((0, 1), (1, 26), (27, 1))
    assert lay.offsets[1] == 13312 and lay.offsets[26] == 13312 + 25 * 8192
    assert lay.offsets[27] == 13312 + 26 * 8192  # 226304 is a multiple of 256 already
    assert lay.nbytes == 226304 + 2048
    # no two tensors overlap
    spans = sorted(zip(lay.offsets, lay.nbytes_each))
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))


def test_pack_layout_rejects_bad_alignment():
    with pytest.raises(BadInputError):
        pack_layout([("f", (1,), 4)], align=48)


# ----------------------------------------------------------------------------- plans


def test_config_from_planner_schema():
    plan = {"schema": 1, "kind": "serving",
            "stream_groups": {"count": 6, "because": ["stream-contention"], "reason": "x"},
            "merge_copy_compute": {"enabled": False, "because": [], "reason": "y"},
            "per_stream_allocators": {"enabled": True, "because": [], "reason": "z"},
            "cuda_graphs": {"enabled": True, "already_graphed_share": None, "sequence_length": 89},
            "findings": ["launch-bound"]}
    cfg = RuntimeConfig.from_plan(plan)
    assert (cfg.groups, cfg.merge_streams, cfg.per_stream_allocator, cfg.cuda_graphs) == (6, False, True, True)


def test_config_from_flat_and_nested_plans():
    cfg = RuntimeConfig.from_plan({"groups": 2, "merge_streams": "false", "cuda_graphs": "yes", "other": 1})
    assert (cfg.groups, cfg.merge_streams, cfg.cuda_graphs) == (2, False, True)
    cfg = RuntimeConfig.from_plan({"runtime": {"groups": 8, "per_stream_allocator": False}})
    assert (cfg.groups, cfg.per_stream_allocator) == (8, False)
    assert RuntimeConfig.from_plan({}) == RuntimeConfig()
    # explicit arguments win over the plan; None means "not given"
    cfg = RuntimeConfig.from_plan({"groups": 8}, groups=3, merge_streams=None)
    assert cfg.groups == 3 and cfg.merge_streams is RuntimeConfig().merge_streams


@pytest.mark.parametrize("plan", [{"groups": 0}, {"groups": "four"}, {"groups": True},
                                  {"merge_streams": "maybe"}, {"cuda_graphs": 2},
                                  {"stream_groups": {"reason": "no count"}}, {"pool_limit_bytes": -1}])
def test_bad_plans_are_user_errors(plan):
    with pytest.raises(BadInputError):
        RuntimeConfig.from_plan(plan)


def test_plan_must_be_a_mapping():
    with pytest.raises(BadInputError):
        RuntimeConfig.from_plan([("groups", 2)])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- CUDA errors


def test_check_names_the_call_and_meaning_driver():
    from cuda.bindings import driver

    with pytest.raises(RuntimeCudaError) as ei:
        check((driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAllocFromPoolAsync")
    msg = str(ei.value)
    assert msg.startswith("cuMemAllocFromPoolAsync failed: CUDA_ERROR_OUT_OF_MEMORY (2): ")
    assert "unable to allocate enough memory" in msg
    assert "\n" not in msg  # one line


def test_check_runtime_enum_and_bare_results():
    from cuda.bindings import driver, runtime

    with pytest.raises(RuntimeCudaError, match=r"^cudaStreamSynchronize failed: cudaErrorIllegalAddress \(700\)"):
        check(runtime.cudaError_t.cudaErrorIllegalAddress, "cudaStreamSynchronize")
    with pytest.raises(RuntimeCudaError, match="CUDA_ERROR_NOT_READY"):
        check(driver.CUresult.CUDA_ERROR_NOT_READY, "cuEventSynchronize")
    assert check(driver.CUresult.CUDA_SUCCESS, "x") is None
    assert check((driver.CUresult.CUDA_SUCCESS, 7), "x") == 7
    assert check((runtime.cudaError_t.cudaSuccess, 1, 2), "x") == (1, 2)


def test_runtime_cuda_error_is_in_the_hierarchy():
    from recsys_doctor.errors import RecsysDoctorError

    assert issubclass(RuntimeCudaError, RecsysDoctorError)


# ----------------------------------------------------------------------------- imports


def test_package_imports_without_torch_and_without_gpu():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any 'import torch' now fails
        "import recsys_doctor.runtime as r\n"
        "assert r.RuntimeConfig().groups >= 1\n"
        "from recsys_doctor.errors import BadInputError\n"
        "try:\n"
        "    r.serve(object(), ())\n"
        "except BadInputError as e:\n"
        "    print('needs torch:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "needs torch" in out.stdout


def test_request_load_copies_bytes_and_checks_sizes():
    """Request.load's argument checks and copy, on a stand-in entry (no GPU needed)."""
    torch = pytest.importorskip("torch")
    import ctypes

    from recsys_doctor.errors import BadInputError
    from recsys_doctor.runtime._request import Request
    from recsys_doctor.runtime._serve_entry import Entry as _Entry

    class _Pinned:  # a host buffer like HostBuffer: a pointer we own
        def __init__(self, n):
            self.raw = ctypes.create_string_buffer(n)
            self.ptr = ctypes.addressof(self.raw)

    class _Served:
        torch = __import__("torch")

    e = _Entry()
    e.n_in = 16
    e.pinned_in = _Pinned(16)
    e.in_bytes = torch.zeros(16, dtype=torch.uint8)
    r = Request.__new__(Request)
    r._served, r._entry, r._open = _Served(), e, True
    r.load(b"abcdefgh")
    assert e.pinned_in.raw.raw[:8] == b"abcdefgh"
    r.load(torch.arange(4, dtype=torch.int32))  # 16 bytes, little-endian 0,1,2,3
    assert list(e.pinned_in.raw.raw[:16:4]) == [0, 1, 2, 3]
    r.load(bytearray(b"xy"))
    assert e.pinned_in.raw.raw[:2] == b"xy"
    with pytest.raises(BadInputError, match="do not fit"):
        r.load(bytes(17))
    with pytest.raises(BadInputError, match="contiguous"):
        r.load(torch.arange(8, dtype=torch.int32)[::2])
    r._open = False
    from recsys_doctor.errors import RuntimeCudaError

    with pytest.raises(RuntimeCudaError, match="closed"):
        r.load(b"a")


def test_call_keys_fast_path_equals_flatten_and_signature(monkeypatch):
    """served(*tensors) keys the usual query (tensors and lists of tensors) without
    flatten() once its structure is known; every key equals flatten + _signature."""
    torch = pytest.importorskip("torch")
    from recsys_doctor.runtime import serving
    from recsys_doctor.runtime._policy import flatten, flatten_inputs

    sm = serving.ServedModel.__new__(serving.ServedModel)
    sm.torch, sm._specs, sm._just_tensors = torch, {}, {torch.Tensor}
    calls = []
    monkeypatch.setattr(serving, "flatten_inputs", lambda *a: calls.append(1) or flatten_inputs(*a))

    def reference(args):
        leaves, spec = flatten(args, sm._is_tensor)
        return leaves, spec, sm._signature(leaves, spec)

    wdl = (torch.randn(4, 13), [torch.arange(8) for _ in range(3)], torch.arange(0, 8, 2))
    other = (torch.randn(4, 13), [torch.arange(6) for _ in range(3)], torch.arange(0, 8, 2))  # other shapes
    cases = [wdl, wdl, other,
             (torch.randn(2), [torch.randn(2)], 3),  # a constant
             (torch.nn.Parameter(torch.randn(2)),),  # a tensor subclass
             ({"a": torch.randn(2)},), ((torch.randn(2), torch.randn(2)),), ([],)]
    for args in cases:
        got, want = sm._key(args), reference(args)
        assert got[1] == want[1] and got[2] == want[2] and hash(got[2]) == hash(want[2])
        assert len(got[0]) == len(want[0]) and all(a is b for a, b in zip(got[0], want[0]))
    # flatten ran for the first wdl call only, not the second; `other` has the same list
    # lengths (the spec is cached) but its own signature
    assert len(calls) == 1 + 0 + 0 + 5
    assert sm._key(wdl)[2] != sm._key(other)[2]


def test_a_served_call_holding_an_object_or_an_array_is_refused(monkeypatch):
    """A served graph keys an input's non-tensor values by their repr: an object holding tensors
    (a dataclass batch) or a numpy array would be captured with what it held then, a call with
    other values in it keyed apart by chance only. Such an input is refused in one line; plain
    values, dtypes and devices are not."""
    import dataclasses
    import enum

    torch = pytest.importorskip("torch")
    from recsys_doctor.runtime import serving

    sm = serving.ServedModel.__new__(serving.ServedModel)
    sm.torch, sm._specs, sm._just_tensors = torch, {}, {torch.Tensor}

    @dataclasses.dataclass(frozen=True)
    class Batch:
        dense: object

    class Mode(enum.Enum):
        FAST = 1

    for bad in (Batch(torch.randn(2)), np.zeros(3), object()):
        with pytest.raises(BadInputError, match=f"an input of type {type(bad).__name__}: serve\\(\\) takes tensors"):
            sm._key((torch.randn(2), bad))
    for ok in (3, 2.5, True, "k", None, b"x", 1j, Mode.FAST, torch.float16, torch.device("cpu"), np.float32(0.5),
               np.int64(7)):
        assert sm._key((torch.randn(2), [torch.randn(2)], {"o": ok}))[0][-1] == ok


def test_launch_mode_setting_is_checked(monkeypatch):
    from recsys_doctor.errors import RuntimeCudaError
    from recsys_doctor.runtime import _fastpath

    monkeypatch.setattr(_fastpath, "_instance", None)
    monkeypatch.setenv(_fastpath.ENV_LAUNCH, "sometimes")
    with pytest.raises(RuntimeCudaError, match="keep-gil or release-gil"):
        _fastpath.driver_fastpath()
    # without a driver library (this CPU box) the bindings path stands in, whatever the mode
    monkeypatch.setenv(_fastpath.ENV_LAUNCH, "release-gil")
    fp = _fastpath.driver_fastpath()
    assert fp.source.startswith("ctypes") or fp.source == "cuda.bindings"
    monkeypatch.setattr(_fastpath, "_instance", None)


def test_graph_copies_setting_is_checked(monkeypatch):
    from recsys_doctor.errors import BadInputError
    from recsys_doctor.runtime._serve_entry import graph_copies_inside as _graph_copies_inside

    monkeypatch.delenv("RECSYS_DOCTOR_GRAPH_COPIES", raising=False)
    assert _graph_copies_inside() is True
    monkeypatch.setenv("RECSYS_DOCTOR_GRAPH_COPIES", "outside")
    assert _graph_copies_inside() is False
    monkeypatch.setenv("RECSYS_DOCTOR_GRAPH_COPIES", "both")
    with pytest.raises(BadInputError, match="inside or outside"):
        _graph_copies_inside()


def test_a_capture_runs_with_the_garbage_collector_off_and_one_at_a_time():
    """``capturing()``: no cyclic collection inside a capture (a finalizer calling CUDA there
    breaks it), the collector as it was afterwards (also after an error), captures serialized."""
    import gc

    from recsys_doctor.runtime._serve_entry import _CAPTURE_LOCK, capturing

    assert gc.isenabled()
    with capturing():
        assert not gc.isenabled() and _CAPTURE_LOCK.locked()
    assert gc.isenabled() and not _CAPTURE_LOCK.locked()
    with pytest.raises(RuntimeError), capturing():
        raise RuntimeError("capture failed")
    assert gc.isenabled() and not _CAPTURE_LOCK.locked()
    gc.disable()
    try:
        with capturing():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
