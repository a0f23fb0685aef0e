"""``recsys-doctor whatif``: every candidate plan priced from one trace, nothing run.

The library behind the command: load the trace, restrict it to a window (as ``advise``),
reduce it to per-query (per-step) numbers and rank every candidate plan by the what-if
estimate (:mod:`recsys_doctor.planning.whatif`). ``profile --apply`` does the same from
its baseline trace, then measures the best few; this answers "what would each plan do"
for a trace already in hand, on a machine without a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..planning.search import candidates
from ..planning.whatif import Prediction, TraceStats, WhatIfCosts, rank, trace_stats
from .advise import restrict

__all__ = ["WhatIfResult", "whatif_trace"]


@dataclass
class WhatIfResult:
    """The trace's per-unit numbers, the clients priced for, and every candidate, best first."""

    path: str
    clients: int
    stats: TraceStats
    predictions: list[Prediction]
    bucket_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.path, "clients": self.clients, "bucket_costs": self.bucket_source,
                "what_if_stats": self.stats.to_dict(), "predictions": [p.to_dict() for p in self.predictions]}


def whatif_trace(path: str | os.PathLike[str], *, kind: str = "serve", clients: int | None = None,
                 units: int | None = None, nvtx: str | None = None, start_ns: int | None = None,
                 end_ns: int | None = None, costs: WhatIfCosts = WhatIfCosts()) -> WhatIfResult:
    """Price every candidate plan (:func:`~recsys_doctor.planning.search.candidates` of
    ``kind``: ``serve`` or ``train``) for the trace at ``path``. ``clients``: concurrent
    clients (default: the trace's threads that call CUDA); ``units``: queries (steps) in the
    window (default: the ``query``/``step`` NVTX ranges, else the device-to-host copies).
    The trace tells no latency tail: p99 is priced as p50. Raises
    :class:`~recsys_doctor.errors.BadInputError` on an unusable trace or option."""
    from ..loaders import load

    trace = restrict(load(path), nvtx=nvtx, start_ns=start_ns, end_ns=end_ns)
    stats = trace_stats(trace, units=units, kind=kind, unit_range="step" if kind == "train" else "query")
    q = clients if clients is not None else stats.threads
    preds = rank(stats, candidates(kind), clients=q, costs=costs)
    return WhatIfResult(str(path), q, stats, preds, costs.bucket_source if costs.bucket_gpu_ns else None)
