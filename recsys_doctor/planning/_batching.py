"""The what-if of dynamic batching (serving): :func:`estimate_batched`.

With ``q`` closed-loop clients the runtime's driver starts a batch on any free group, so
the mean batch grows with the load: ``k = clamp(batch_fill * q, 1, max_batch)`` (measured,
:class:`~recsys_doctor.planning.whatif.WhatIfCosts`). One batch of ``k`` is one graph
replay whose GPU time is one query's graphed GPU time ``D`` (kernels, graph node gaps,
packed copies: as :func:`~recsys_doctor.planning.whatif.estimate` prices it) times
``1 + (k - 1) * batch_marginal_share``; the host costs ``batch_host_ns`` per query (the
GIL is held for that long per query, as measured on the batched path). Then as for
unbatched serving: ``X = min(1 / H, overlap * k / D(k), q / (H + D(k)))``, ``p50 = q / X``
(Little's law), ``p99 = p50 * tail``. Training is not batched.

A plain script's batching (the script hook combines its threads' concurrent model calls,
``docs/profile.md``) is not priced (:func:`unpriced_script`): ``batch_host_ns`` is the
runtime's batched path, and the hook's host cost per batched call has not been measured; the
candidate is measured instead, and kept only when faster.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["estimate_batched", "mean_batch", "unpriced_script", "UNPRICED"]

#: the ``bound`` of a candidate the estimate does not price (no q/s, no latency: measured only)
UNPRICED = "unpriced"


def mean_batch(clients: int, max_batch: int, fill: float) -> int:
    """The mean batch the driver makes for ``clients`` closed-loop clients."""
    return max(1, min(max_batch, round(fill * clients)))


def estimate_batched(stats: Any, cand: Any, q: int, costs: Any, one: float) -> dict[str, Any]:
    """The numbers of a batching candidate's
    :class:`~recsys_doctor.planning.whatif.Prediction` (its keyword arguments but the
    candidate): host and GPU ns per query, overlap, bound, q/s, p50, p99, notes. ``one``:
    one query's graphed GPU time, as the unbatched estimate prices it."""
    k = mean_batch(q, cand.max_batch, costs.batch_fill)
    batch_gpu = one * (1 + (k - 1) * costs.batch_marginal_share)
    host = costs.batch_host_ns
    n = max(1, min(cand.groups, math.ceil(q / k)))
    ov = n / (1 + costs.serial_share * (n - 1)) if costs.serial_share is not None else 1.0
    limits = {"host": 1e9 / host if host > 0 else math.inf,
              "gpu": 1e9 * ov * k / batch_gpu if batch_gpu > 0 else math.inf,
              "clients": 1e9 * q / (host + batch_gpu) if host + batch_gpu > 0 else math.inf}
    bound = min(limits, key=lambda b: limits[b])
    x = limits[bound]
    p50 = q / x * 1e3 if x > 0 else math.inf
    notes = [f"mean batch {k} of {q} clients: {batch_gpu / 1e3:.0f} us of GPU a batch"]
    return {"host_ns": host, "gpu_ns": batch_gpu / k, "overlap": ov, "bound": bound, "qps": x, "p50_ms": p50,
            "p99_ms": p50 * stats.p99_over_p50, "score": x, "notes": notes}


def unpriced_script() -> dict[str, Any]:
    """The numbers of a plain script's batching candidate's
    :class:`~recsys_doctor.planning.whatif.Prediction`: none (``bound`` :data:`UNPRICED`, no
    q/s, score 0: it ranks after every priced candidate), and a note saying why."""
    return {"host_ns": 0.0, "gpu_ns": 0.0, "overlap": 1.0, "bound": UNPRICED, "score": 0.0,
            "notes": ["not priced: the script hook's host cost per batched call is not measured "
                      "(the batching estimate's is the runtime's); measured, kept only when faster"]}
