"""The what-if of dynamic batching (serving): :func:`estimate_batched`.

With ``q`` closed-loop clients the runtime's driver starts a batch on any free group, so
the mean batch grows with the load: ``k = clamp(batch_fill * q, 1, max_batch)`` (measured,
:class:`~recsys_doctor.planning.whatif.WhatIfCosts`). One batch of ``k`` is one graph
replay whose GPU time ``D(k)`` is priced one of two ways, with ``D`` one query's graphed
GPU time (kernels, graph node gaps, packed copies: as
:func:`~recsys_doctor.planning.whatif.estimate` prices it):

* **measured bucket costs** (``WhatIfCosts.bucket_gpu_ns``: ``{bucket: ns}``, what
  ``ServedModel.bucket_gpu_us()`` reports): the runtime runs a batch of ``k`` in the graph
  of the smallest bucket ``b >= k`` (``runtime._batched.bucket_table``), and never makes a
  batch larger than its largest bucket, so ``k`` is capped there as well. Then
  ``D(k) = D * cost(b) / cost(1)``: the measured costs give how a batch's GPU time grows
  with its size, the trace gives the level, so batched plans stand on the same footing as
  the unbatched ones, which are priced from ``D`` too. Costs measured on the trace's own
  model and GPU leave ``D / cost(1)`` at the estimate's own error on one query (about 1
  when it is right; the notes print both numbers, so a gap shows); costs measured on
  another model carry over by their shape only, which is the most they can honestly say
  about this one. Bucket 1 must be among them.
* otherwise the constant fit on the H100: ``D(k) = D * (1 + (k - 1) * batch_marginal_share)``.

The host costs ``batch_host_ns`` per query (the GIL is held for that long per query, as
measured on the batched path). Then as for unbatched serving, with
``n = min(groups, ceil(q / k))`` groups busy and their overlap ``n / (1 + s (n - 1))``:
``X = min(1 / H, overlap * k / D(k), q / (H + D(k)))``, ``p50 = q / X`` (Little's law),
``p99 = p50 * tail``. Training is not batched.

A plain script's batching (the script hook combines its threads' concurrent model calls,
``docs/profile.md``) is not priced (:func:`unpriced_script`): ``batch_host_ns`` is the
runtime's batched path, and the hook's host cost per batched call has not been measured; the
candidate is measured instead, and kept only when faster.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import BadInputError

__all__ = ["estimate_batched", "mean_batch", "batch_gpu_ns", "unpriced_script", "UNPRICED"]

#: the ``bound`` of a candidate the estimate does not price (no q/s, no latency: measured only)
UNPRICED = "unpriced"


def mean_batch(clients: int, max_batch: int, fill: float) -> int:
    """The mean batch the driver makes for ``clients`` closed-loop clients."""
    return max(1, min(max_batch, round(fill * clients)))


def batch_gpu_ns(k: int, one: float, costs: Any) -> tuple[int, float, str]:
    """``(k, D(k), how)``: the batch size the runtime runs for a mean batch of ``k`` (capped
    at the largest measured bucket), the GPU ns of one such batch, and a note saying how it
    was priced (see the module docstring). ``one``: one query's graphed GPU time."""
    measured = costs.bucket_gpu_ns
    if not measured:
        d = one * (1 + (k - 1) * costs.batch_marginal_share)
        return k, d, (f"{d / 1e3:.0f} us of GPU a batch (each query more adds "
                      f"{costs.batch_marginal_share:g} of one: the H100 fit)")
    if 1 not in measured:
        raise BadInputError(f"the measured bucket costs have no bucket 1 (sizes {sorted(measured)}): "
                            "a batch's cost is scaled to the trace by the cost of one query alone")
    top = max(measured)
    capped = f", capped at the largest measured bucket {top}" if k > top else ""
    k = min(k, top)
    b = min(s for s in measured if s >= k)
    d = one * measured[b] / measured[1]
    src = f" ({costs.bucket_source})" if costs.bucket_source else ""
    return k, d, (f"bucket {b}{capped}: {measured[b] / 1e3:.0f} us measured{src} x {one / 1e3:.0f} / "
                  f"{measured[1] / 1e3:.0f} us (this trace's query / measured bucket 1) = "
                  f"{d / 1e3:.0f} us of GPU a batch")


def estimate_batched(stats: Any, cand: Any, q: int, costs: Any, one: float) -> dict[str, Any]:
    """The numbers of a batching candidate's
    :class:`~recsys_doctor.planning.whatif.Prediction` (its keyword arguments but the
    candidate): host and GPU ns per query, overlap, bound, q/s, p50, p99, notes. ``one``:
    one query's graphed GPU time, as the unbatched estimate prices it."""
    k, batch_gpu, how = batch_gpu_ns(mean_batch(q, cand.max_batch, costs.batch_fill), one, costs)
    host = costs.batch_host_ns
    n = max(1, min(cand.groups, math.ceil(q / k)))
    ov = n / (1 + costs.serial_share * (n - 1)) if costs.serial_share is not None else 1.0
    limits = {"host": 1e9 / host if host > 0 else math.inf,
              "gpu": 1e9 * ov * k / batch_gpu if batch_gpu > 0 else math.inf,
              "clients": 1e9 * q / (host + batch_gpu) if host + batch_gpu > 0 else math.inf}
    bound = min(limits, key=lambda b: limits[b])
    x = limits[bound]
    p50 = q / x * 1e3 if x > 0 else math.inf
    notes = [f"mean batch {k} of {q} clients, {how}"]
    return {"host_ns": host, "gpu_ns": batch_gpu / k, "overlap": ov, "bound": bound, "qps": x, "p50_ms": p50,
            "p99_ms": p50 * stats.p99_over_p50, "score": x, "notes": notes}


def unpriced_script() -> dict[str, Any]:
    """The numbers of a plain script's batching candidate's
    :class:`~recsys_doctor.planning.whatif.Prediction`: none (``bound`` :data:`UNPRICED`, no
    q/s, score 0: it ranks after every priced candidate), and a note saying why."""
    return {"host_ns": 0.0, "gpu_ns": 0.0, "overlap": 1.0, "bound": UNPRICED, "score": 0.0,
            "notes": ["not priced: the script hook's host cost per batched call is not measured "
                      "(the batching estimate's is the runtime's); measured, kept only when faster"]}
