"""Embedding-bound: embedding lookups take most of the GPU's time or launches.

In a recommender the embedding tables are looked up one by one (one ``EmbeddingBag``
kernel per table and query) unless they are fused into one table-batched lookup. The
evidence: the share of kernel time and of kernel launches in embedding kernels
(PyTorch ``EmbeddingBag_*``/``embedding_*``, FBGEMM TBE ``split_embedding_*``/
``batched_embedding_*``), per iteration where the trace shows iterations, the worst
kernels, and the aten/fbgemm embedding ops. Reported when either share reaches
``Options.report_min_share``.

Recoverable time, conservatively: over the steady-state GPU idle gaps between two
consecutive embedding kernels on a device, each gap up to the median launch call of the
embedding kernels (``Options.short_gap_us`` where the trace has no launch calls) - the
launch cost that one fused lookup (all tables in one kernel) no longer pays per table.
The rest of such a gap (Python, the GIL, other threads) is left to launch-bound and
stream-contention, and the lookups' own GPU time is not counted: deduplicating indices or
caching hot rows shortens it by an amount the trace cannot tell.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..findings import AnalysisResult
from ..model import Trace
from ..options import Options
from ._kernel_classes import EMBEDDING, iterations, kernel_classes, kernel_durations, kernel_where, offenders
from ._ops import launches, op_table, what_is
from ._recoverable import device_gaps, examples, finish, report, steady_starts, steady_window
from ._util import r, str_contains

__all__ = ["analyze"]


#: the unit of each evidence value this analyzer reports (how the reports print it;
#: the JSON keeps raw numbers): ns, us, ms, share (0..1), bytes or number
EVIDENCE_UNITS: dict[str, dict[str, str]] = {
    "embedding-bound": {
        "count": "number", "count_share": "share", "embedding_cpu_ops": "number",
        "embedding_kernels": "number", "embedding_launches_per_iteration": "number", "embedding_time_us": "us",
        "gaps_between_lookups": "number", "idle_between_lookups_ns": "ns", "iterations": "number",
        "kernel_time_us": "us", "kernels": "number", "launch_cost_between_lookups_ns": "ns",
        "launch_cost_per_lookup_us": "us", "launches_per_iteration": "number", "median_us": "us",
        "time_share": "share", "total_us": "us",
    },
}


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    if not len(trace.kernels):
        return AnalysisResult(name="embedding-bound", data={"kernels": 0})
    res = AnalysisResult(name="embedding-bound")
    emb = kernel_classes(trace) == EMBEDDING
    dur = kernel_durations(trace)
    data = res.data = _evidence(trace, emb, dur, options)
    if not data["embedding_kernels"] or max(data["time_share"] or 0, data["count_share"]) < options.report_min_share:
        return res
    g = _gaps_between_lookups(trace, emb, options)
    idle = g["ns"].to_numpy(np.int64)
    j = launches(trace, ("kernel",))
    calls = (j["api_end"] - j["api_start"]).to_numpy(np.int64)[emb[j["row"].to_numpy(np.int64)]] if len(j) else []
    cap = float(np.median(calls)) if len(calls) else options.short_gap_us * 1000
    rec = int(np.minimum(idle, cap).sum())
    data.update(gaps_between_lookups=int(idle.size), idle_between_lookups_ns=int(idle.sum()),
                launch_cost_per_lookup_us=r(cap / 1000, 3), launch_cost_between_lookups_ns=rec)
    per = (f", {data['embedding_launches_per_iteration']:g} of {data['launches_per_iteration']:g} launches "
           f"an iteration" if data.get("launches_per_iteration") else "")
    rows = np.flatnonzero(emb)
    f = report(
        res, "embedding-bound",
        title=f"Embedding kernels take {data['time_share']:.0%} of kernel time ({data['count_share']:.0%} of kernels{per})",
        evidence=data, where=kernel_where(trace, rows, options.top_n, dur[rows]),
        recommendation=(
            "Look up all tables in one kernel: fuse them into one table-batched embedding (FBGEMM "
            "SplitTableBatchedEmbeddingBagsCodegen, TorchRec EmbeddingBagCollection with fused tables, "
            "HugeCTR's fused/grouped embedding); deduplicate indices within a batch before the lookup "
            "(TorchRec/HugeCTR unique-id dedup); cache hot rows in GPU memory (FBGEMM UVM caching, "
            "HugeCTR embedding cache) when tables live in host memory."),
        action="fuse the embedding tables into one table-batched lookup (FBGEMM TBE / TorchRec EmbeddingBagCollection)")
    if len(g):
        f.examples = examples(trace, start=g["start"], end=g["end"], pid=g["pid"], device=g["device"],
                              stream=g["stream"], what="GPU idle between two embedding lookups",
                              n=options.examples_per_finding)
    finish(f, rec, steady_window(trace, options), options, claims=g.assign(claim_ns=np.minimum(idle, int(cap))))
    return res


def _evidence(trace: Trace, emb: np.ndarray, dur: np.ndarray, options: Options) -> dict[str, Any]:
    n, n_emb = len(emb), int(emb.sum())
    total, t_emb = int(dur.sum()), int(dur[emb].sum())
    data: dict[str, Any] = {
        "kernels": n, "embedding_kernels": n_emb, "count_share": r(n_emb / n),
        "time_share": r(t_emb / total) if total else None,
        "embedding_time_us": r(t_emb / 1000, 3), "kernel_time_us": r(total / 1000, 3),
    }
    iters, how = iterations(trace)
    if iters:
        data.update(iterations=iters, iterations_from=how, launches_per_iteration=r(n / iters, 1),
                    embedding_launches_per_iteration=r(n_emb / iters, 1))
    rg = trace.ranges
    if len(rg):
        ops = str_contains(rg["name"], r"(?i)embedding").to_numpy() & (rg["source"] == "cpu_op").to_numpy()
        if ops.any():
            data["embedding_cpu_ops"] = int(ops.sum())
    data["offenders"] = offenders(trace, np.flatnonzero(emb), dur, options.top_n)
    return data


def _gaps_between_lookups(trace: Trace, emb: np.ndarray, options: Options) -> pd.DataFrame:
    """The steady-state idle gaps that lie between two embedding kernels (the operations
    just before and just after the gap): ``start, end, ns, pid, device, stream``."""
    ops = op_table(trace)
    parts = device_gaps(trace)
    cols = ("start", "end", "ns", "pid", "device", "stream")
    if not parts or not len(ops):
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in cols})
    is_emb = np.zeros(len(ops), dtype=bool)
    kern = what_is(ops, "kernel")
    is_emb[kern] = emb[ops["row"].to_numpy(np.int64)[kern]]
    st = steady_starts(trace, options)
    after = np.concatenate([g.order[g.ends_gap] for g in parts])
    before = np.concatenate([g.order[g.ends_gap - 1] for g in parts])
    start = np.concatenate([g.gap_start for g in parts])
    steady = start >= np.concatenate([np.full(g.ends_gap.size, st.get(g.device, 0), np.int64) for g in parts])
    sel = np.flatnonzero(is_emb[after] & is_emb[before] & steady)
    at = after[sel]
    return pd.DataFrame({"start": start[sel], "end": ops["start"].to_numpy(np.int64)[at],
                         "ns": np.concatenate([g.gap for g in parts])[sel], "pid": ops["pid"].to_numpy(np.int64)[at],
                         "device": ops["device"].to_numpy(np.int64)[at], "stream": ops["stream"].to_numpy(np.int64)[at]})
