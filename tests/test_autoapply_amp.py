"""The hook's autocast calls (``recsys_doctor/applying/_autoapply/amp.py``) on the CPU: the
precision read from the thread's autocast state, kept apart in the graph key, and the
autocast cache off only while a graph captures the call. The GPU test that the outputs equal
eager in both precisions: tests/test_autoapply_gpu.py (``..._per_precision_...``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recsys_doctor.applying._autoapply import amp  # noqa: E402


@pytest.fixture
def cuda_autocast():
    """CUDA autocast flags set by hand (a CPU-only PyTorch's ``torch.autocast("cuda")`` turns
    itself off), restored afterwards."""
    was, dt = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")

    def set_(on: bool, dtype=torch.float16):
        torch.set_autocast_enabled("cuda", on)
        torch.set_autocast_dtype("cuda", dtype)

    yield set_
    set_(was, dt)


def test_autocast_dtype_follows_the_threads_cuda_autocast(cuda_autocast):
    cuda_autocast(False)
    assert amp.autocast_dtype(torch) is None
    cuda_autocast(True, torch.bfloat16)
    assert amp.autocast_dtype(torch) is torch.bfloat16
    cuda_autocast(True, torch.float16)
    assert amp.autocast_dtype(torch) is torch.float16
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU autocast does not touch CUDA calls
        cuda_autocast(False)
        assert amp.autocast_dtype(torch) is None


def test_key_tags_keep_precisions_and_the_inner_call_apart():
    def plain(module, *a):
        return a

    def tagged(module, *a):
        return a

    tagged.key_tag = "host-args"
    tags = {amp.AmpCall(plain, torch.bfloat16).key_tag, amp.AmpCall(plain, torch.float16).key_tag,
            amp.AmpCall(tagged, torch.bfloat16).key_tag, None, "host-args"}
    assert len(tags) == 5
    assert amp.AmpCall(tagged, torch.bfloat16).key_tag == ("autocast", "torch.bfloat16", "host-args")


def test_the_autocast_cache_is_off_only_inside_a_capture(monkeypatch):
    seen = []

    def orig(module, x, *, scale=1):
        seen.append((torch.is_autocast_cache_enabled(), module, x, scale))
        return x * scale

    call = amp.AmpCall(orig, torch.bfloat16)
    assert torch.is_autocast_cache_enabled()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # (a CPU-only PyTorch raises)
    assert call("m", 3, scale=2) == 6
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.warns(UserWarning):  # (a CPU-only PyTorch turns CUDA autocast off, saying so)
        assert call("m", 4) == 4
    assert seen == [(True, "m", 3, 2), (False, "m", 4, 1)]
    assert torch.is_autocast_cache_enabled()  # restored
