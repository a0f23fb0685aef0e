"""The PyTorch adapter of the stream-group runtime, by its historical name: serving lives
in :mod:`.serving` (with :mod:`._serve_entry` and :mod:`._request`), training branches in
:mod:`.training`. This module re-exports both, so ``recsys_doctor.runtime.torch_adapter``
keeps working for code that imports it."""

from __future__ import annotations

from .serving import Request, ServedModel, serve
from .training import BranchStreams, default_branch_streams, parallel_branches, stream_scope

__all__ = ["serve", "ServedModel", "Request", "BranchStreams", "stream_scope", "parallel_branches",
           "default_branch_streams"]
