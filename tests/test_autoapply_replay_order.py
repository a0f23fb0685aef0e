"""Replays of a group's graphs ordered across streams (``_Group.before_replay`` /
``after_replay``, recsys_doctor/applying/_autoapply/groups.py), with a stand-in for
``torch.cuda`` that logs every stream operation. The GPU test of the same:
tests/test_autoapply_gpu.py (``..._own_streams_...``)."""

from __future__ import annotations

from types import SimpleNamespace

from recsys_doctor.applying._autoapply.groups import _Group

GROUP, A, B = 100, 201, 202  # raw stream handles


class FakeCuda:
    def __init__(self) -> None:
        self.cur = GROUP
        self.log: list[tuple] = []
        fake = self

        class Event:
            n = 0

            def __init__(self) -> None:
                Event.n += 1
                self.id = Event.n

            def record(self) -> None:
                fake.log.append(("record", self.id, fake.cur))

        class Stream:
            def __init__(self, raw: int) -> None:
                self.raw = raw

            def wait_stream(self, other) -> None:
                fake.log.append(("wait_stream", self.raw, other.cuda_stream))

            def wait_event(self, ev) -> None:
                fake.log.append(("wait_event", self.raw, ev.id))

        self.cuda = SimpleNamespace(Event=Event, current_stream=lambda dev: Stream(fake.cur))
        self._C = SimpleNamespace(_cuda_getCurrentRawStream=lambda dev: fake.cur)


def _replay_on(torch: FakeCuda, g: _Group, raw: int) -> None:
    torch.cur = raw
    cur = g.before_replay(torch)
    torch.log.append(("replay", raw))
    g.after_replay(cur)


def test_replays_on_the_group_stream_alone_cost_nothing():
    torch = FakeCuda()
    g = _Group(0, SimpleNamespace(cuda_stream=GROUP, device_index=0))
    for _ in range(3):
        _replay_on(torch, g, GROUP)
    assert torch.log == [("replay", GROUP)] * 3 and not g.mixed


def test_replays_on_other_streams_wait_for_the_last_one():
    torch = FakeCuda()
    g = _Group(0, SimpleNamespace(cuda_stream=GROUP, device_index=0))
    _replay_on(torch, g, GROUP)
    _replay_on(torch, g, A)  # the first foreign replay: after all the group stream queued
    _replay_on(torch, g, A)  # the same stream as the last replay: stream order is enough
    _replay_on(torch, g, B)  # another stream: waits for A's replay
    _replay_on(torch, g, GROUP)  # and the group stream, once mixed, waits too
    assert torch.log == [
        ("replay", GROUP),
        ("wait_stream", A, GROUP), ("replay", A), ("record", 1, A),
        ("replay", A), ("record", 1, A),
        ("wait_event", B, 1), ("replay", B), ("record", 1, B),
        ("wait_event", GROUP, 1), ("replay", GROUP), ("record", 1, GROUP),
    ]
    assert g.mixed and g.last_raw == GROUP
