"""What the hook did: groups, threads placed, graphs captured and replayed, fallback reasons;
printed at exit where ``RECSYS_DOCTOR_AUTOAPPLY_LOG`` is set."""

from __future__ import annotations

import json
import os
from typing import Any

from ._common import _log, _state
from .accounting import sites


def stats() -> dict[str, Any]:
    """Groups created, threads placed, graphs captured, replays, fallback reasons, and per call
    site of the script (:func:`.accounting.sites`) the calls taken over and left to PyTorch."""
    per_site = sites()
    return {"active": _state.get("active", False), "groups": _state.get("n_groups"),
            "graphs": _state.get("graphs"), "threads": _state.get("started", 0),
            "captured": _state.get("captured", 0), "replays": _state.get("replays", 0),
            "thread_graphs": _state.get("thread_captured", 0), "thread_replays": _state.get("thread_replays", 0),
            "materialized": _state.get("materialized", 0), "staged_copies": sum(r["taken_over"] for r in per_site if r["kind"] == "h2d"),
            "fallbacks": list(_state.get("fallbacks", [])),
            "sites": per_site}


def _at_exit() -> None:
    if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_LOG"):
        _log(json.dumps(stats()))
