"""A stand-in for ``recsys_doctor.runtime._branches.branched`` whose capture on several streams
always fails (the GPU tests of the one-stream fallback patch it into the module that captures)."""

from __future__ import annotations

import contextlib

REASON = "RuntimeError: branch capture broke"


class _Broken:
    def __enter__(self):
        import torch

        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("branch capture broke")

    def __exit__(self, *exc):
        return False


def broken_branched(side):
    """What ``branched(side)`` returns, except that a capture with branch streams raises."""
    return _Broken() if side else contextlib.nullcontext()
