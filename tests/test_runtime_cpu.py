"""CPU-only tests of the stream-group runtime: the parts that need no GPU (scheduling
policy, input-signature keying, staging layout, plan parsing, CUDA error formatting,
importing without torch). The GPU parts are tested for real in test_runtime_gpu.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from recsys_doctor.errors import BadInputError, RuntimeCudaError
from recsys_doctor.runtime import (
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
