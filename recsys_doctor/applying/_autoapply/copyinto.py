"""``Tensor.copy_`` from host memory into a GPU tensor of the script's own
(``gpu_buf[:n].copy_(torch.from_numpy(a), non_blocking=True)``, the preallocated-input pattern):
the hook never takes such a copy over (its destination is the script's memory, which whatever the
script does next reads), but counts it at the script's line, as PyTorch's, so that the report lists
every host-to-GPU copy of a query. Only the script's own calls count: a ``copy_`` made by PyTorch's
code, the hook's or the runtime's (a deferred copy made late, a staging buffer) is not the script's
line. Standard library only (loaded at interpreter start)."""

from __future__ import annotations

import sys
from typing import Any

from ._common import _tls
from .accounting import _skipped, fell_back, script_site
from .unplaced import BEFORE_PLACED, _deferred

#: why a host-to-GPU ``Tensor.copy_`` of the script's is PyTorch's
COPY_INTO = "a copy from host memory into an existing GPU tensor (Tensor.copy_), left to PyTorch"


def counted(torch: Any, orig: Any) -> Any:
    """``Tensor.copy_`` that counts a hooked thread's top-level host-to-GPU copies at its line (a
    thread not placed yet: as made before its first model call, :mod:`.unplaced`)."""
    T = torch.Tensor

    def copy_(self: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
        if self.is_cuda and type(src) is T and src.is_cpu and not getattr(_tls, "depth", 0):
            placed = getattr(_tls, "group", None) is not None
            if (placed or _deferred()) and not _skipped(sys._getframe(1).f_code.co_filename):
                fell_back("h2d", script_site(2), COPY_INTO if placed else BEFORE_PLACED)
        return orig(self, src, *args, **kwargs)

    copy_.__name__ = "copy_"
    copy_.__wrapped__ = orig  # type: ignore[attr-defined]
    return copy_

