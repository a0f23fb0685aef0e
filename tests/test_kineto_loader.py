"""Tests of the PyTorch profiler / Kineto JSON loader.

Expected numbers come either from hand arithmetic on tiny hand-built traces, or from a
separate, deliberately naive ``json`` parse of the real trace done here in the test.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import shared_files
from recsys_doctor.errors import TraceFormatError
from recsys_doctor.loaders import load
from recsys_doctor.loaders.kineto import copy_kind_from_name, load_kineto_json

SHARED_KINETO = shared_files("kineto", ("*.json", "*.json.gz")) + shared_files("h100", ("*.pt.trace.json.gz",))

GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
API_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}
LOADED_CATS = GPU_CATS | API_CATS | {"cuda_sync", "cpu_op", "Operator", "user_annotation"}


def _raw_events(path: Path, **parse: Any) -> tuple[Any, list[dict]]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = json.loads(data, **parse)
    return doc, (doc if isinstance(doc, list) else doc["traceEvents"])


def _find(name_part: str) -> Path:
    for p in SHARED_KINETO:
        if name_part in p.name:
            return p
    pytest.skip(f"no shared trace matching {name_part!r}")


def _write(tmp_path: Path, doc: Any, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


# --- every real trace ---------------------------------------------------------------------

@pytest.mark.shared
@pytest.mark.parametrize("path", SHARED_KINETO, ids=[p.name[:70] for p in SHARED_KINETO])
def test_real_trace_matches_independent_parse(shared_traces: Path, path: Path) -> None:
    doc, events = _raw_events(path)
    x = [e for e in events if e.get("ph") == "X"]
    by_cat = Counter(e.get("cat") for e in x)

    t = load_kineto_json(path)
    assert t.format == "kineto-json"

    # row counts per table
    assert len(t.kernels) == by_cat["kernel"] + by_cat["Kernel"]
    assert len(t.memsets) == by_cat["gpu_memset"] + by_cat["Memset"]
    assert len(t.api) == by_cat["cuda_runtime"] + by_cat["Runtime"] + by_cat["cuda_driver"]
    assert (t.api["api_class"] == "driver").sum() == by_cat["cuda_driver"]
    assert len(t.syncs) == by_cat["cuda_sync"]
    assert len(t.ranges) == by_cat["cpu_op"] + by_cat["Operator"] + by_cat["user_annotation"]
    assert len(t.graphs) == 0

    # copies by direction, read straight off the names
    raw_dirs = Counter()
    for e in x:
        if e.get("cat") in ("gpu_memcpy", "Memcpy"):
            m = re.search(r"(HtoD|DtoH|DtoD)", e["name"])
            raw_dirs[m.group(1) if m else "?"] += 1
    got_dirs = Counter(t.memcpys["kind"])
    assert got_dirs["h2d"] == raw_dirs["HtoD"]
    assert got_dirs["d2h"] == raw_dirs["DtoH"]
    assert got_dirs["d2d"] == raw_dirs["DtoD"]
    assert len(t.memcpys) == sum(raw_dirs.values())

    # api names as written
    raw_api_names = Counter(e["name"] for e in x if e.get("cat") in API_CATS)
    assert Counter(t.api["name"]) == raw_api_names

    # integer ns durations: sum of round(dur * 1000) per table
    raw_kernel_ns = sum(round(e.get("dur", 0) * 1000) for e in x if e.get("cat") in ("kernel", "Kernel"))
    assert int((t.kernels["end"] - t.kernels["start"]).sum()) == raw_kernel_ns
    for name in ("kernels", "memcpys", "memsets", "api", "ranges"):
        df = getattr(t, name)
        assert str(df["start"].dtype) == "int64" and str(df["end"].dtype) == "int64"
        assert (df["end"] >= df["start"]).all()
    # the earliest loaded event is time 0
    starts = [getattr(t, n)["start"].min() for n in ("kernels", "memcpys", "memsets", "api", "syncs", "ranges")
              if len(getattr(t, n))]
    assert min(starts) == 0

    # GPU events launched before the window: correlation absent from every runtime call
    api_corr = {e["args"]["correlation"] for e in x if e.get("cat") in API_CATS and "correlation" in e.get("args", {})}
    gpu = [e for e in x if e.get("cat") in GPU_CATS]
    unmatched = sum(1 for e in gpu if e.get("args", {}).get("correlation") not in api_corr)
    assert t.meta["unmatched_gpu_events"] == unmatched

    # kernels belonging to a cudaGraphLaunch (every file here has a single CPU process)
    graph_corr = {e["args"]["correlation"] for e in x if e.get("cat") in API_CATS and e["name"] == "cudaGraphLaunch"}
    raw_in_graph = sum(1 for e in x if e.get("cat") in ("kernel", "Kernel")
                       and e["args"].get("correlation") in graph_corr)
    assert int(t.kernels["in_graph"].sum()) == raw_in_graph

    # host pid: kernels with a matching launch carry that launch's pid
    corr_pid = {e["args"]["correlation"]: int(e["pid"]) for e in x
                if e.get("cat") in API_CATS and "correlation" in e.get("args", {})}
    k = t.kernels
    for corr, pid in zip(k["correlation"].head(200), k["pid"].head(200)):
        if corr in corr_pid:
            assert pid == corr_pid[corr]

    # devices: only GPUs that ran something, named from deviceProperties where present
    raw_devices = {int(e["args"].get("device", e.get("pid"))) for e in gpu}
    assert set(t.devices["device"]) == raw_devices
    if isinstance(doc, dict) and doc.get("deviceProperties"):
        props = {d["id"]: d for d in doc["deviceProperties"]}
        for dev, name, sms in zip(t.devices["device"], t.devices["name"], t.devices["sm_count"]):
            assert name == props[dev]["name"] and sms == props[dev]["numSms"]

    # every CPU thread that launches work or runs ops is an int tid
    raw_tids = {int(e["tid"]) for e in x if e.get("cat") in API_CATS}
    assert set(t.api["tid"]) == raw_tids


@pytest.mark.shared
def test_legacy_string_tids_become_ints(shared_traces: Path) -> None:
    path = _find("resnet50_autograd_api")
    _, events = _raw_events(path)
    raw_tids = {e["tid"] for e in events if e.get("ph") == "X" and e.get("cat") == "Runtime"}
    assert raw_tids and all(isinstance(v, str) for v in raw_tids)
    t = load_kineto_json(path)
    assert str(t.api["tid"].dtype) == "int64"
    assert set(t.api["tid"]) == {int(v) for v in raw_tids}
    # GPU rows are named "stream N": the stream comes out as the number
    raw_streams = {int(e["tid"].split()[1]) for e in events if e.get("ph") == "X" and e.get("cat") == "Kernel"}
    assert set(t.kernels["stream"]) == raw_streams
    # thread names kept for CPU threads only, keyed by the int tid
    raw_names = {(int(e["pid"]), int(e["tid"])): e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {(p, tid): n for p, tid, n in t.threads.itertuples(index=False)} == raw_names


@pytest.mark.shared
def test_bare_array_trace(shared_traces: Path) -> None:
    path = _find("resnet50_num_workers_0")
    doc, events = _raw_events(path)
    assert isinstance(doc, list)
    t = load_kineto_json(path)
    assert t.meta["container"] == "array"
    assert len(t.kernels) == sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "Kernel")
    # ProfilerStep#N was an Operator in torch 1.8; it is reported as a step annotation
    steps = sorted(e["name"] for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    got = t.ranges[t.ranges["source"] == "user_annotation"]
    assert sorted(got["name"]) == steps


@pytest.mark.shared
@pytest.mark.parametrize("part", ["ns_resolution_trace", "Qwen", "mmoe"])
def test_float_timestamps_keep_ns(shared_traces: Path, part: str) -> None:
    """ts/dur are read from their own decimal digits: every kernel's start and end, and
    the window, equal the exact decimal arithmetic on the JSON text (float64 resolves
    only 0.25 µs at 1.7e15 µs: the ns_resolution trace's window came out 48 ns long)."""
    path = _find(part) if part != "mmoe" else shared_traces / "h100" / "mmoe_4streams_h100.pt.trace.json.gz"
    if not path.exists():
        pytest.skip("no mmoe trace")
    doc, events = _raw_events(path, parse_float=Decimal)
    x = [e for e in events if e.get("ph") == "X" and e.get("cat") in LOADED_CATS]
    assert any(isinstance(e["ts"], Decimal) for e in x)

    def ns(v: Any) -> int:
        return int((Decimal(v) * 1000).to_integral_value(rounding="ROUND_HALF_EVEN"))

    t0 = min(ns(e["ts"]) for e in x)
    t = load_kineto_json(path)
    k = [e for e in x if e.get("cat") == "kernel"]
    assert sorted(t.kernels["start"].tolist()) == sorted(ns(e["ts"]) - t0 for e in k)
    assert sorted(t.kernels["end"].tolist()) == sorted(ns(e["ts"]) - t0 + max(ns(e.get("dur", 0)), 0) for e in k)
    span = max(ns(e["ts"]) + max(ns(e.get("dur", 0)), 0) for e in x) - t0
    got = max(int(df["end"].max()) for df in (t.kernels, t.memcpys, t.memsets, t.api, t.syncs, t.ranges) if len(df))
    assert got == span
    # the GPU window (first GPU start to last GPU end), what the summary reports
    g = [e for e in x if e.get("cat") in GPU_CATS]
    window = max(ns(e["ts"]) + max(ns(e.get("dur", 0)), 0) for e in g) - min(ns(e["ts"]) for e in g)
    gpu = [df for df in (t.kernels, t.memcpys, t.memsets) if len(df)]
    assert max(int(df["end"].max()) for df in gpu) - min(int(df["start"].min()) for df in gpu) == window
    if part == "ns_resolution_trace":
        assert window == 480_029_179  # 480029.179 µs exactly (float64 gave 480029.227)
    # sub-microsecond digits survive
    assert (t.kernels["start"] % 1000 != 0).any()
    if "baseTimeNanoseconds" in doc:
        assert t.meta["origin_ns_epoch"] == doc["baseTimeNanoseconds"] + t0


@pytest.mark.shared
def test_graph_launch_marks_kernels(shared_traces: Path) -> None:
    path = _find("negative_queue_length")
    _, events = _raw_events(path)
    x = [e for e in events if e.get("ph") == "X"]
    launches = [e for e in x if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"]
    assert len(launches) == 70
    corr = {e["args"]["correlation"] for e in launches}
    t = load_kineto_json(path)
    assert (t.api["name"] == "cudaGraphLaunch").sum() == 70
    k_in = sum(1 for e in x if e.get("cat") == "kernel" and e["args"]["correlation"] in corr)
    s_in = sum(1 for e in x if e.get("cat") == "gpu_memset" and e["args"]["correlation"] in corr)
    assert k_in > 0
    assert int(t.kernels["in_graph"].sum()) == k_in
    assert int(t.memsets["in_graph"].sum()) == s_in
    assert set(t.kernels.loc[t.kernels["in_graph"], "correlation"]) <= corr


@pytest.mark.shared
def test_cuda_sync_events(shared_traces: Path) -> None:
    path = _find("critical_path__alexnet")
    _, events = _raw_events(path)
    raw = Counter(e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_sync")
    t = load_kineto_json(path)
    got = Counter(t.syncs["sync_type"])
    assert got["stream"] == raw["Stream Sync"]
    assert got["stream_wait_event"] == raw["Stream Wait Event"]
    assert got["context"] == raw["Context Sync"]
    # "Context Sync" says stream 4294967295 (unsigned -1): no stream
    assert set(t.syncs.loc[t.syncs["sync_type"] == "context", "stream"]) == {-1}


# --- hand-built traces -----------------------------------------------------------------------

BASE = 1_700_000_000_000_000_000


def _three_events() -> dict:
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": BASE,
        "displayTimeUnit": "ms",
        "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
        "deviceProperties": [{"id": 0, "name": "GPU Zero", "numSms": 132}, {"id": 1, "name": "GPU One", "numSms": 132}],
        "traceEvents": [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": "101",
             "ts": 1000.5, "dur": 4.25, "args": {"cbid": 211, "correlation": 7}},
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1010.125, "dur": 2.0,
             "args": {"device": 0, "stream": 7, "correlation": 7, "grid": [4, 2, 1], "block": [128, 1, 1]}},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": "stream 9",
             "ts": 1020, "dur": 1.5, "args": {"correlation": 8, "bytes": 64}},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 100, "tid": 101, "ts": 1000.5},
            {"ph": "i", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "tid": "x", "ts": 999},
            {"ph": "M", "name": "thread_name", "pid": 100, "tid": "101", "args": {"name": "main"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
        ],
    }


def test_three_event_trace_exact_ns(tmp_path: Path) -> None:
    t = load_kineto_json(_write(tmp_path, _three_events()))
    # origin is the earliest event, ts = 1000.5 us
    api = t.api.iloc[0]
    assert (api["start"], api["end"]) == (0, 4250)                      # dur 4.25 us
    assert (api["pid"], api["tid"], api["correlation"]) == (100, 101, 7)
    assert api["name"] == "cudaLaunchKernel" and api["api_class"] == "runtime"
    k = t.kernels.iloc[0]
    assert (k["start"], k["end"]) == (9625, 11625)                      # (1010.125 - 1000.5) us, + 2 us
    assert (k["pid"], k["device"], k["stream"], k["correlation"]) == (100, 0, 7, 7)
    assert (k["grid_x"], k["grid_y"], k["grid_z"], k["block_x"], k["block_y"], k["block_z"]) == (4, 2, 1, 128, 1, 1)
    assert not k["in_graph"]
    m = t.memcpys.iloc[0]
    assert (m["start"], m["end"]) == (19500, 21000)                     # (1020 - 1000.5) us, + 1.5 us
    # no args.device / args.stream: device from pid, stream from "stream 9"; correlation 8
    # has no launch in the trace, so the only CPU process owns it
    assert (m["device"], m["stream"], m["pid"], m["bytes"]) == (0, 9, 100, 64)
    assert (m["kind"], m["src_mem"], m["dst_mem"]) == ("d2h", "device", "pinned")
    assert t.meta["unmatched_gpu_events"] == 1
    assert t.meta["origin_ns_epoch"] == BASE + 1_000_500
    assert t.meta["time_base"] == "baseTimeNanoseconds"
    assert (t.meta["rank"], t.meta["world_size"], t.meta["displayTimeUnit"]) == (3, 8, "ms")
    assert t.threads.values.tolist() == [[100, 101, "main"]]
    assert t.devices.values.tolist() == [[0, "GPU Zero", 132]]
    assert len(t.ranges) == len(t.syncs) == len(t.graphs) == 0
    json.dumps(t.meta)  # meta must stay JSON-serializable


def test_float_epoch_keeps_ns_that_naive_rounding_loses(tmp_path: Path) -> None:
    # float64 holds 1712195495505543.2 as ...543.25 and ...544.7 as ...544.75: the ns come
    # from the text's own digits (written here as text: json.dumps would print ...544.8)
    text = (
        '{"traceEvents": ['
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,'
        ' "ts": 1712195495505543.2, "dur": 3.123, "args": {"correlation": 1}},'
        '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1712195495505544.7, "dur": 0.8,'
        ' "args": {"device": 0, "stream": 7, "correlation": 1}}]}')
    p = tmp_path / "t.json"
    p.write_text(text)
    t = load_kineto_json(p)
    assert (t.api["start"][0], t.api["end"][0]) == (0, 3123)
    assert (t.kernels["start"][0], t.kernels["end"][0]) == (1500, 2300)
    assert t.meta["time_base"] == "epoch"
    assert t.meta["origin_ns_epoch"] == 1712195495505543200


def test_integer_epoch_and_legacy_categories(tmp_path: Path) -> None:
    doc = [
        {"ph": "X", "cat": "Runtime", "name": "cudaMemcpyAsync", "pid": 5, "tid": "4093687616",
         "ts": 1606910596350464, "dur": 10, "args": {"correlation": 3}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": "stream 7",
         "ts": 1606910596350470, "dur": 2, "args": {"device": 0, "stream": 7, "correlation": 3, "bytes": 1024}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 7",
         "ts": 1606910596350480, "dur": 1, "args": {"device": 0, "stream": 7, "correlation": 4, "bytes": 16}},
        {"ph": "X", "cat": "Operator", "name": "aten::copy_", "pid": 5, "tid": "4093687616",
         "ts": 1606910596350460, "dur": 30, "args": {}},
    ]
    t = load_kineto_json(_write(tmp_path, doc))
    assert t.ranges[["start", "end", "tid", "source", "depth"]].values.tolist() == [[0, 30000, 4093687616, "cpu_op", 0]]
    assert t.api[["start", "end", "tid"]].values.tolist() == [[4000, 14000, 4093687616]]
    assert t.memcpys[["start", "end", "pid", "kind", "src_mem", "bytes"]].values.tolist() == \
        [[10000, 12000, 5, "h2d", "pageable", 1024]]
    assert t.memsets[["start", "end", "bytes"]].values.tolist() == [[20000, 21000, 16]]
    assert t.meta["origin_ns_epoch"] == 1606910596350460000
    assert t.meta["container"] == "array"


def test_range_depth_per_thread(tmp_path: Path) -> None:
    def r(cat: str, name: str, tid: int, ts: int, dur: int) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    doc = {"traceEvents": [
        r("cpu_op", "b", 1, 20, 10),          # inside a, inside the step
        r("user_annotation", "ProfilerStep#1", 1, 0, 100),
        r("cpu_op", "a", 1, 10, 40),
        r("cpu_op", "c", 1, 60, 10),          # after a ended: depth 1
        r("cpu_op", "d", 2, 20, 10),          # another thread: outermost there
    ]}
    t = load_kineto_json(_write(tmp_path, doc))
    depth = dict(zip(t.ranges["name"], t.ranges["depth"]))
    assert depth == {"ProfilerStep#1": 0, "a": 1, "b": 2, "c": 1, "d": 0}
    src = dict(zip(t.ranges["name"], t.ranges["source"]))
    assert src["ProfilerStep#1"] == "user_annotation" and src["a"] == "cpu_op"


def test_range_depth_when_ranges_overlap_without_nesting(tmp_path: Path) -> None:
    """Sorted by start (longest first), a range is inside every earlier range of its thread
    still open when it starts (end > start), counted as a stack that is only popped from
    the top: on thread 1, B outlives A, so C (after A ended, inside B) still sits on A's
    stack entry; on thread 2 the ranges nest, with shared starts and a zero-length one."""
    def r(name: str, tid: int, ts: int, dur: int) -> dict:
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur}

    doc = {"traceEvents": [
        r("A", 1, 0, 10), r("B", 1, 5, 15), r("C", 1, 12, 3), r("D", 1, 30, 1),
        r("R", 2, 50, 0), r("S", 2, 50, 10), r("Q", 2, 0, 50), r("P", 2, 0, 100),
    ]}
    t = load_kineto_json(_write(tmp_path, doc))
    depth = dict(zip(t.ranges["name"], t.ranges["depth"]))
    assert depth == {"A": 0, "B": 1, "C": 2, "D": 0, "P": 0, "Q": 1, "S": 1, "R": 2}


def _stack_depth_reference(ranges: list[tuple[int, int, int]]) -> list[int]:
    """The plain definition, one thread at a time: ``(thread, start, end)`` in, depth out."""
    out = [0] * len(ranges)
    for thread in {g for g, _, _ in ranges}:
        idx = sorted((i for i, x in enumerate(ranges) if x[0] == thread), key=lambda i: (ranges[i][1], -ranges[i][2], i))
        stack: list[int] = []
        for i in idx:
            while stack and stack[-1] <= ranges[i][1]:
                stack.pop()
            out[i] = len(stack)
            stack.append(ranges[i][2])
    return out


@pytest.mark.parametrize("seed", range(40))
def test_range_depth_on_arrays_equals_the_stack_definition(seed: int) -> None:
    """Random ranges on a few threads with many shared instants, nested (even seeds) or
    overlapping freely (odd seeds): the loader's array method gives the stack's depths."""
    import numpy as np

    from recsys_doctor.loaders._kineto_tables import depths

    rng = np.random.default_rng(seed)
    ranges: list[tuple[int, int, int]] = []
    if seed % 2:
        for _ in range(int(rng.integers(1, 60))):
            s = int(rng.integers(0, 30))
            ranges.append((int(rng.integers(0, 3)), s, s + int(rng.integers(0, 8))))
    else:
        def nest(thread: int, lo: int, hi: int, level: int) -> None:
            t = lo
            while t < hi and rng.random() < 0.7:
                a = int(rng.integers(t, hi + 1))
                b = int(rng.integers(a, hi + 1))
                ranges.append((thread, a, b))
                if level < 4 and b > a:
                    nest(thread, a, b, level + 1)
                t = b
        for thread in range(3):
            nest(thread, 0, 60, 0)
    if not ranges:
        return
    g, s, e = (np.array(c, dtype=np.int64) for c in zip(*ranges))
    assert depths(np.zeros_like(g), g, s, e).tolist() == _stack_depth_reference(ranges)


def _call(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, corr: int) -> dict:
    """A CPU-side runtime/driver call event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def _gpu(cat: str, name: str, tid: int, ts: float, dur: float, corr: int, stream: int | None = None) -> dict:
    """A GPU event on device 0 (``pid`` 0), stream ``tid`` unless said."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": tid if stream is None else stream, "correlation": corr}}


def test_graph_launch_and_driver_and_sync(tmp_path: Path) -> None:
    doc = {"traceEvents": [
        _call("cuda_runtime", "cudaGraphLaunch", 1, 1, 0, 5, 5),
        _call("cuda_driver", "cuLaunchKernel", 1, 2, 6, 5, 6),
        _call("cuda_runtime", "cudaStreamSynchronize", 1, 1, 20, 9, 9),
        *[_gpu("kernel", f"g{i}", 7, 10 + i, 1, 5) for i in range(2)],
        _gpu("kernel", "triton", 7, 13, 1, 6),
        _gpu("cuda_sync", "Stream Sync", 7, 21, 7, 9),
        _gpu("cuda_sync", "Event Sync", -1, 22, 1, 9),
        {"ph": "X", "cat": "gpu_user_annotation", "name": "x", "pid": 0, "tid": 7, "ts": 10, "dur": 4, "args": {}},
    ]}
    t = load_kineto_json(_write(tmp_path, doc))
    assert dict(zip(t.kernels["name"], t.kernels["in_graph"])) == {"g0": True, "g1": True, "triton": False}
    assert dict(zip(t.api["name"], t.api["api_class"])) == {
        "cudaGraphLaunch": "runtime", "cuLaunchKernel": "driver", "cudaStreamSynchronize": "runtime"}
    assert t.syncs[["start", "end", "pid", "stream", "sync_type"]].values.tolist() == [
        [21000, 28000, 1, 7, "stream"], [22000, 23000, 1, -1, "event"]]
    assert t.meta["skipped_categories"] == {"gpu_user_annotation": 1}
    assert len(t.graphs) == 0


def test_unmatched_gpu_event_with_several_processes_has_no_pid(tmp_path: Path) -> None:
    doc = {"traceEvents": [
        _call("cuda_runtime", "cudaLaunchKernel", 1, 1, 0, 1, 1),
        _call("cuda_runtime", "cudaLaunchKernel", 2, 2, 0, 1, 2),
        _gpu("kernel", "a", 7, 2, 1, 2),
        _gpu("kernel", "early", 7, 3, 1, 99),
    ]}
    t = load_kineto_json(_write(tmp_path, doc))
    assert dict(zip(t.kernels["name"], t.kernels["pid"])) == {"a": 2, "early": -1}


@pytest.mark.parametrize("name, kind, src, dst", [
    ("Memcpy HtoD (Pageable -> Device)", "h2d", "pageable", "device"),
    ("Memcpy HtoD (Pinned -> Device)", "h2d", "pinned", "device"),
    ("Memcpy DtoH (Device -> Pageable)", "d2h", "device", "pageable"),
    ("Memcpy DtoD (Device -> Device)", "d2d", "device", "device"),
    ("Memcpy HtoD (Host -> Device)", "h2d", "unknown", "device"),
    ("Memcpy PtoP (Device -> Device)", "p2p", "device", "device"),
    ("Memcpy HtoH (Pinned -> Pinned)", "h2h", "pinned", "pinned"),
    ("Memcpy", "other", "unknown", "unknown"),
])
def test_copy_kind_from_name(name: str, kind: str, src: str, dst: str) -> None:
    assert copy_kind_from_name(name) == (kind, src, dst)


def test_gzip_detected_by_magic_not_extension(tmp_path: Path) -> None:
    p = tmp_path / "trace.json"  # gzip content behind a plain .json name
    p.write_bytes(gzip.compress(json.dumps(_three_events()).encode()))
    t = load_kineto_json(p)
    assert len(t.kernels) == 1 and len(t.memcpys) == 1
    # and through the dispatcher
    assert load(p).counts() == t.counts()


def test_empty_trace_is_valid(tmp_path: Path) -> None:
    t = load_kineto_json(_write(tmp_path, {"traceEvents": []}))
    assert all(n == 0 for n in t.counts().values())


def test_empty_bare_array_is_not_a_trace(tmp_path: Path) -> None:
    """Issue 26: ``[]`` was read as an empty trace (exit 0); nothing in it is a trace."""
    _assert_format_error(_write(tmp_path, []), "empty JSON array")


# --- bad input ----------------------------------------------------------------------------------

def _assert_format_error(path: Path, *fragments: str) -> None:
    with pytest.raises(TraceFormatError) as ei:
        load_kineto_json(path)
    msg = str(ei.value)
    assert "\n" not in msg
    assert str(path) in msg
    for f in fragments:
        assert f in msg
    # no chained "During handling of the above exception" traceback behind it
    assert ei.value.__cause__ is None
    assert ei.value.__context__ is None or ei.value.__suppress_context__


def test_truncated_json(tmp_path: Path) -> None:
    text = json.dumps(_three_events())
    p = tmp_path / "trunc.json"
    p.write_text(text[: len(text) // 2])
    _assert_format_error(p, "invalid JSON")


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(json.dumps(_three_events()).encode())
    p = tmp_path / "trunc.json.gz"
    p.write_bytes(data[: len(data) // 2])
    _assert_format_error(p, "gzip")


def test_corrupt_gzip(tmp_path: Path) -> None:
    p = tmp_path / "bad.json.gz"
    p.write_bytes(b"\x1f\x8b" + b"not really gzip at all" * 10)
    _assert_format_error(p, "corrupt gzip")


@pytest.mark.parametrize("doc, fragment", [
    ({"a": 1}, "traceEvents"),
    ([1, 2, 3], "no trace events"),
    ("just a string", "not a PyTorch profiler trace"),
    (42, "not a PyTorch profiler trace"),
    ({"traceEvents": 5}, "expected a list"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "args": {}}, 7]}, "event #1"),
])
def test_json_that_is_not_a_trace(tmp_path: Path, doc: Any, fragment: str) -> None:
    _assert_format_error(_write(tmp_path, doc), fragment)


def test_whitespace_only_file(tmp_path: Path) -> None:
    p = tmp_path / "blank.json"
    p.write_text("  \n ")
    _assert_format_error(p, "empty")


@pytest.mark.parametrize("text, expected", [
    ("Spans", float("nan")), ("PyTorch Profiler", float("nan")), ("", float("nan")), ("N/A", float("nan")),
    ("Ⅻ", float("nan")), ("inf", float("inf")), ("-Infinity", float("-inf")), ("stream 7", 7.0),
    (" 12 ", 12.0), ("1e3", 1000.0)])
def test_number_columns_read_text_as_pandas_does(text, expected):
    """A number column holding text (the profiler's own span: ``"pid": "Spans"``): text
    with no number in it is missing, "inf" is infinity, "stream 7" is 7 (pandas'
    ``to_numeric``, then the last integer of the text); the values beside it are kept."""
    import subprocess
    import sys

    from recsys_doctor.loaders._kineto_columns import num

    got = num([text, 3, None, 2.5, 1669783687464181])
    assert np.isnan(got[2]) and got[1] == 3.0 and got[3] == 2.5 and got[4] == 1669783687464181.0
    assert (np.isnan(got[0]) and np.isnan(expected)) or got[0] == expected
    # text with no number in it is read without pandas (the forked decoder has none)
    if np.isnan(expected) and text != "Ⅻ":
        code = ("import sys; from recsys_doctor.loaders._kineto_columns import num; "
                f"num([{text!r}, 3]); print('pandas' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "False", out.stderr
