"""The start-up hook's capture gate (pure threading logic, no GPU): a capture waits for
running model executions to finish and blocks new ones until it is done."""

from __future__ import annotations

import threading

from recsys_doctor.applying._autoapply import _Gate


def test_capture_waits_for_running_executions_and_blocks_new_ones():
    gate = _Gate()
    log: list[str] = []
    reader_in = threading.Event()
    release_reader = threading.Event()
    writer_waiting = threading.Event()

    def reader():
        gate.acquire_shared()
        log.append("reader 1 in")
        reader_in.set()
        release_reader.wait(5)
        log.append("reader 1 out")
        gate.release_shared()

    def writer():
        reader_in.wait(5)
        writer_waiting.set()
        gate.acquire_exclusive()
        log.append("capture")
        gate.release_exclusive()

    def late_reader():
        writer_waiting.wait(5)
        # the writer is (about to be) waiting: give it the chance to register first
        while not gate._writers_waiting and not gate._writer:
            pass
        gate.acquire_shared()
        log.append("reader 2 in")
        gate.release_shared()

    ts = [threading.Thread(target=f) for f in (reader, writer, late_reader)]
    for t in ts:
        t.start()
    writer_waiting.wait(5)
    while not gate._writers_waiting:
        pass
    release_reader.set()
    for t in ts:
        t.join(5)
        assert not t.is_alive()
    # the capture ran only after reader 1 left, and reader 2 (arriving while the capture
    # was pending) ran only after the capture
    assert log == ["reader 1 in", "reader 1 out", "capture", "reader 2 in"]


def test_many_readers_share_the_gate():
    gate = _Gate()
    inside = []
    barrier = threading.Barrier(4, timeout=5)

    def reader():
        gate.acquire_shared()
        inside.append(1)
        barrier.wait()  # all four are inside at once, or this times out
        gate.release_shared()

    ts = [threading.Thread(target=reader) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(5)
    assert len(inside) == 4
    gate.acquire_exclusive()  # nobody left inside: a capture gets in at once
    gate.release_exclusive()


def test_unhonoured_plan_fields_are_named():
    from recsys_doctor.applying._autoapply import unhonoured

    plan = {"runtime": {"groups": 4, "cuda_graphs": True, "merge_streams": False, "per_stream_allocator": True,
                        "slots_per_group": 2}}
    lines = unhonoured(plan)
    assert len(lines) == 3
    assert lines[0].startswith("plan merge_streams=false is not applied to a plain script")
    assert any("per_stream_allocator=true" in x for x in lines)
    assert any("slots_per_group=2" in x for x in lines)
    # what the hook does anyway is not reported
    assert unhonoured({"runtime": {"groups": 2, "cuda_graphs": False, "merge_streams": True,
                                   "per_stream_allocator": False}}) == []
    assert unhonoured({"stream_groups": {"count": 2}}) == []


def test_threads_go_round_robin_to_groups_without_a_limit(capsys):
    import sys
    import types

    from recsys_doctor.applying import _autoapply as aa

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    # the runtime's streams of the activation (made by the first hooked thread on a GPU)
    streams = types.SimpleNamespace(streams=[object(), object()])
    saved = dict(aa._state)
    try:
        aa._state.clear()
        aa._state.update(active=True, n_groups=2, graphs=True, groups={}, started=0, patched_module=True,
                         patched_copies=True, streams=streams, streams_failed=None)
        real = sys.modules.get("torch")
        sys.modules["torch"] = fake  # the hook reads torch from sys.modules only
        try:
            got = [aa._group_for_new_thread() for _ in range(8)]
            placed = [g.index for g in got]
            assert all(g.stream is streams.streams[g.index] for g in got)
        finally:
            if real is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = real
    finally:
        aa._state.clear()
        aa._state.update(saved)
    err = capsys.readouterr().err
    # 8 threads on 2 groups: threads go round-robin, 4 per group, and nothing is said
    # (captures no longer fail with more than 2 threads per group: the capturing thread
    # warms up its own cuBLAS handle before capturing)
    assert placed == [0, 1, 0, 1, 0, 1, 0, 1]
    assert "threads per group" not in err
