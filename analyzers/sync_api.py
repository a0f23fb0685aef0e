"""Synchronizing API calls: CPU threads blocked waiting for the GPU.

Counts device/stream/event/context ``*Synchronize`` calls and blocking copies (``cudaMemcpy``
and friends without ``Async``: synchronous with respect to the host) and the CPU time they
block, by thread and by code region (innermost NVTX / ``record_function`` range).

Severity follows the blocked share: blocked time summed over the threads that block,
divided by the sum of those threads' API spans (first to last CUDA API call of each
thread). A serving thread that spends most of its time inside ``cudaStreamSynchronize``
cannot launch the next request's work.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import AnalysisResult, Finding, severity_for_share
from ..model import Trace
from ..options import Options
from ._attribution import attribute, where_shares
from ._util import BLOCKING_COPY_RE, SYNC_RE, r, str_contains, thread_label, thread_labels

__all__ = ["analyze"]


def _kind(name: str) -> str:
    for k in ("Device", "Stream", "Event", "Ctx", "Context"):
        if k + "Synchronize" in name:
            return {"Ctx": "context", "Context": "context"}.get(k, k.lower())
    return "blocking_copy" if BLOCKING_COPY_RE.search(name) else "other"


def analyze(trace: Trace, options: Options) -> AnalysisResult:
    res = AnalysisResult(name="sync-api")
    api = trace.api
    if len(api) == 0:
        res.data = {"calls": 0}
        return res
    m = (str_contains(api["name"], SYNC_RE) | str_contains(api["name"], BLOCKING_COPY_RE)).to_numpy()
    sy = api[m]
    if len(sy) == 0:
        res.data = {"calls": 0, "blocked_us": 0.0}
        return res
    dur = (sy["end"] - sy["start"]).to_numpy(np.int64)
    kinds = sy["name"].astype(str).map(_kind)
    spans = api.groupby(["pid", "tid"]).agg(lo=("start", "min"), hi=("end", "max"))
    spans["span"] = spans["hi"] - spans["lo"]
    by_thread = pd.DataFrame({"pid": sy["pid"].to_numpy(), "tid": sy["tid"].to_numpy(), "dur": dur}) \
        .groupby(["pid", "tid"])["dur"].agg(["count", "sum"])
    by_thread = by_thread.join(spans["span"])
    blocked = int(dur.sum())
    span_sum = int(by_thread["span"].sum())
    blocked_share = blocked / span_sum if span_sum > 0 else None
    threads = []
    for (p, t), row in by_thread.sort_values("sum", ascending=False).iterrows():
        threads.append({"thread": thread_label(trace, p, t), "calls": int(row["count"]),
                        "blocked_us": r(row["sum"] / 1000, 3),
                        "blocked_share": r(row["sum"] / row["span"]) if row["span"] > 0 else None})
    by_kind = {k: {"calls": int(c), "blocked_us": r(s / 1000, 3)}
               for k, (c, s) in pd.DataFrame({"k": kinds.to_numpy(), "d": dur}).groupby("k")["d"]
               .agg(["count", "sum"]).iterrows()}
    by_name = sy.assign(d=dur).groupby("name")["d"].agg(["count", "sum"]).sort_values("sum", ascending=False)
    data = {
        "calls": int(len(sy)), "blocked_us": r(blocked / 1000, 3), "blocked_share": r(blocked_share),
        "by_kind": by_kind,
        "by_name": [{"name": str(n), "calls": int(c), "blocked_us": r(s / 1000, 3)}
                    for n, (c, s) in by_name.head(options.top_n).iterrows()],
        "threads": threads[: options.top_n],
    }
    res.data = data
    if blocked_share is None or blocked_share < options.report_min_share:
        return res
    sev = severity_for_share(blocked_share, options.high_share, options.medium_share)
    reg = attribute(trace, sy["pid"], sy["tid"], sy["start"])
    where: list[dict] = []
    if any(x is not None for x in reg):
        where = where_shares(reg, dur, key="nvtx", top=options.top_n)
    where += where_shares(thread_labels(trace, sy["pid"], sy["tid"]), dur,
                          key="thread", top=options.top_n)
    res.findings.append(Finding(
        id="sync-api", severity=sev,
        title=(f"{len(sy)} synchronizing calls block CPU threads for {blocked / 1e6:.2f} ms "
               f"({blocked_share:.0%} of those threads' API time)"),
        evidence=data,
        recommendation=(
            "Remove the syncs from the hot path: replace cudaDeviceSynchronize/cudaStreamSynchronize "
            "and blocking cudaMemcpy (.cpu(), .item()) with an event recorded on the group's stream and "
            "waited on only where the result is consumed; copy results into pinned buffers "
            "asynchronously."),
        where=where))
    return res
