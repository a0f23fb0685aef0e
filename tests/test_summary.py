"""summarize() on a hand-built trace; every expected number is worked out by hand below."""

from __future__ import annotations

import json

import pytest

from recsys_doctor.analyzers.summary import summarize
from recsys_doctor.model import Trace

from _tracebuild import T, api, copy, kern


def _trace():
    return T(
        kernels=[
            kern(0, 4000, corr=1), kern(2000, 6000, corr=2), kern(10000, 30000, corr=3),
            kern(100, 200, corr=5, device=1, stream=9),
        ],
        memcpys=[
            copy(30000, 40000, "h2d", corr=4),
            copy(35000, 36000, "d2h", corr=6),
            copy(38000, 39000, "h2d"),
            copy(20000, 21000, "uvm_h2d"),
            copy(1000, 2000, "d2h", pid=2),
        ],
        memsets=[{"start": 400, "end": 500, "pid": 1, "device": 1, "stream": 9, "correlation": 0, "bytes": 4}],
        graphs=[{"start": 150, "end": 400, "pid": 1, "device": 1, "stream": 9, "correlation": 0, "graph_id": 1}],
        api=[
            api(-500, -100, 1, tid=10), api(1000, 1500, 2, tid=11), api(7000, 8000, 3, tid=10),
            api(29000, 29500, 4, tid=12, name="cudaMemcpyAsync"), api(50, 90, 5, tid=10),
            api(41000, 42000, 0, tid=10, name="cudaStreamSynchronize"),
            api(43000, 44000, 0, tid=11, name="cudaDeviceSynchronize"),
            api(45000, 46000, 0, tid=11, name="cudaEventQuery"),
        ],
    )


def test_summary_by_hand():
    s = summarize(_trace())
    assert s["kernels"] == 4
    # dev0: window 0..40000, busy = [0,6000] U [10000,30000] = 26000
    # dev1: window 100..500 (memset ends 500), busy = [100,200] U [150,400] = 300
    assert s["gpu_utilization"] == pytest.approx((26000 + 300) / (40000 + 400))
    # durations 4000, 4000, 20000, 100 -> 3 short
    assert s["short_kernel_fraction"] == pytest.approx(0.75)
    # stream (1,0,7): tids 10, 11, 10 (kernels) and 12 (copy corr 4) -> 3
    assert s["launch_threads_per_stream_max"] == 3
    # pid 1 h2d/d2h by start: h2d 30000, d2h 35000, h2d 38000 -> 2 switches; pid 2 alone -> 0
    assert s["memcpy"] == {"h2d": 2, "d2h": 2, "direction_switches": 2}
    assert s["sync_calls"] == 2
    assert s["window_ns"] == 40400 and s["busy_ns"] == 26300
    json.dumps(s)


def test_summary_empty_trace():
    s = summarize(Trace(path="x", format="test"))
    assert s["kernels"] == 0
    assert s["gpu_utilization"] is None
    assert s["short_kernel_fraction"] is None
    assert s["launch_threads_per_stream_max"] == 0
    assert s["memcpy"] == {"h2d": 0, "d2h": 0, "direction_switches": 0}
    assert s["sync_calls"] == 0


def test_copies_only_give_zero_utilization():
    s = summarize(T(memcpys=[copy(0, 100, "h2d")]))
    assert s["gpu_utilization"] == 0.0
