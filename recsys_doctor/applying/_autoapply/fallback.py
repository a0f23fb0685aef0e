"""Fallback accounting: what the hook does when a capture or a replay fails - the reason is
logged once and counted in ``stats()['fallbacks']``, and the call runs eagerly from then on."""

from __future__ import annotations

import os
from typing import Any

from ._common import _log, _state


def _end_broken_capture(stream: Any) -> None:
    try:
        from cuda.bindings import runtime as cudart

        err, status = cudart.cudaStreamIsCapturing(stream.cuda_stream)
        if int(err) == 0 and int(status) != int(cudart.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone):
            cudart.cudaStreamEndCapture(stream.cuda_stream)
        cudart.cudaGetLastError()
    except Exception:  # noqa: BLE001 - best effort: the capture failed already, eager follows
        pass


def _fall_back(message: str, reason: str) -> None:
    """One line on stderr, and the reason among ``stats()["fallbacks"]``."""
    _log(message)
    _state["fallbacks"].append(reason)


def _debug_traceback() -> None:
    """The failure's traceback too, where ``RECSYS_DOCTOR_AUTOAPPLY_DEBUG`` asks for it."""
    if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_DEBUG"):
        import traceback

        traceback.print_exc()


def _synchronize_quietly(torch: Any) -> None:
    """Let the failed work drain before eager runs follow (a failure here changes nothing)."""
    try:
        torch.cuda.synchronize()
    except RuntimeError:  # a sticky CUDA error (torch.AcceleratorError is one): eager says it
        pass
