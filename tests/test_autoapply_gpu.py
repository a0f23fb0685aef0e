"""The script hook on a real GPU, its groups and its graphs per shape (run on the GPU machine:
``pytest -m gpu tests/test_autoapply_gpu.py``).

* the groups are the runtime's: every hooked thread's current stream is its group's
  stream of one ``streams_only`` ``StreamManager`` (thread ``i`` -> group ``i mod groups``,
  the threads of a group on one stream), bridged as ``torch.cuda.ExternalStream``.
"""

from __future__ import annotations

import sys

import pytest
from test_apply_gpu import _run_hooked

pytestmark = pytest.mark.gpu


def test_hook_groups_are_the_runtimes_streams(tmp_path):
    torch = pytest.importorskip("torch")
    torch.zeros(1, device="cuda")  # the hook takes threads started once CUDA is initialized
    seen: dict[int, int] = {}

    def client(k: int) -> None:
        seen[k] = torch.cuda.current_stream().cuda_stream

    st = _run_hooked(tmp_path, 2, 4, client)
    assert st["threads"] == 4 and not st["fallbacks"], st
    streams = sys.modules["_recsys_doctor_autoapply"]._state["streams"]
    mgr = streams.manager
    assert mgr.streams_only and mgr.merge and len(mgr.groups) == 2 and not mgr.closed
    handles = [g.stream_handles[0] for g in mgr.groups]
    assert len(set(handles)) == 2 and all(g.stream_handles == (h, h, h) for g, h in zip(mgr.groups, handles))
    assert all(isinstance(s, torch.cuda.ExternalStream) for s in streams.streams)
    assert [s.cuda_stream for s in streams.streams] == handles
    # thread k (in start order) on group k mod 2: threads 0 and 2 share a stream, 1 and 3 the other
    assert [seen[k] for k in range(4)] == [handles[0], handles[1], handles[0], handles[1]]
    assert torch.cuda.default_stream().cuda_stream not in handles


def test_streams_only_manager_has_its_streams_alone():
    pytest.importorskip("torch")
    from recsys_doctor.errors import RuntimeCudaError
    from recsys_doctor.runtime import StreamManager

    mgr = StreamManager(2, streams_only=True)
    assert all(not g.slots and g.mr is None for g in mgr.groups) and mgr.pool_stats() == []
    with pytest.raises(RuntimeCudaError, match="no slots"):
        with mgr.acquire_slot():
            pass
    with pytest.raises(RuntimeCudaError, match="no memory pool"):
        mgr.groups[0].allocate(16)
    with mgr.acquire() as g:
        assert g in mgr.groups
    side = mgr.side_stream()
    assert side not in {g.stream_handles[0] for g in mgr.groups}
    mgr.close()
    mgr.close()  # idempotent
    with pytest.raises(RuntimeCudaError, match="closed"):
        mgr.side_stream()
